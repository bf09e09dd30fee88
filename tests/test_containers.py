"""The supervisor in containers as they are really run (issue 32): under runc
and under crun, each test once per runtime, with bundles made as Docker and
containerd make them on cgroup v2: a cgroup namespace of the container's own,
`linux.cgroupsPath` set (/docker/ID, as Docker's cgroupfs driver), cgroup2
mounted at /sys/fs/cgroup read-only (Docker's default) or read-write (what
`--privileged` or Podman's `--security-opt unmask=/sys/fs/cgroup` give),
Docker's default capabilities, their default /proc and /sys (the masked and
read-only paths of moby's, containerd's and Kubernetes' default spec: the
tests run in what users run), a root directory that bind-mounts the guest's
/usr and /etc read-only, a writable /receipts (read here from the bind
mount's other side) and the checkout read-only at /opt/treereap. Then the
Kubernetes recipe's task container under the kubelet's stop, emulated; then
Podman (`podman run --rootfs`), and the lines of docs/recipes.md's "In a
container" that run here.

The test plays the part of containerd's shim: `run -d` and `exec -d` with
--pid-file, the process then reaped here (pytest is a child subreaper, see
conftest.py), which gives its exit status as Docker reports it. Each test
ends with its containers deleted, and checks that no cgroup of ours is left
below the container's (no treereap-* directory; treereap.init, which
--prepare-cgroup makes on purpose, is expected where it ran).

These run in the pure cgroup v2 guest that tests/test_guest.py boots, and
are skipped elsewhere with that reason. In the guest, a runtime that is not
installed is a skip, or a failure under SUPERVISOR_REQUIRE_GUEST=1 (as in
CI, which installs runc, crun and podman).
"""
import glob
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import CGROUP_ROOT, IS_ROOT, ROOT, SOURCE, SUPERVISOR, alive, wait_until

IN_GUEST = os.environ.get("TREEREAP_IN_GUEST") == "1"
REQUIRED = os.environ.get("SUPERVISOR_REQUIRE_GUEST") == "1"
GUEST_ONLY = ("runs in the pure cgroup v2 guest that tests/test_guest.py boots (root, "
              "runc, crun, podman, and the memory and pids controllers in cgroup v2)")

# Docker's default capabilities (moby's oci/caps/defaults.go, and
# containerd 1.x's oci/spec.go defaultUnixCaps; containerd 2.0 drops MKNOD,
# NET_RAW, SETFCAP, SYS_CHROOT and AUDIT_WRITE): no CAP_SYS_ADMIN (trusted
# extended attributes, mounts) and no CAP_SYS_RESOURCE (an oom_score_adj
# below the one inherited).
DOCKER_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
               "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
               "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
# What every container's /proc and /sys look like under Docker, containerd
# and Kubernetes (the kubelet sends its own lists through the CRI): masked
# (/dev/null bound over a file, an empty read-only tmpfs over a directory;
# a path that does not exist is skipped) and bound read-only over
# themselves. The union of moby's oci/defaults.go (defaultLinuxMaskedPaths:
# /proc/interrupts and each CPU's thermal_throttle since GHSA-6fw5-f8r9-fgfm,
# /sys/devices/virtual/powercap since GHSA-jq35-85cj-fj4p), containerd's
# pkg/oci/spec.go (populateDefaultUnixSpec) and Kubernetes'
# pkg/securitycontext/util.go (defaultMaskedPaths, defaultReadonlyPaths);
# the read-only ones are the same in all three.
MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
                "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                "/sys/devices/virtual/powercap"] + sorted(
                    glob.glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle"))
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
# Where the supervisor is seen in a container, read-only: the checkout's
# supervisor.py, or the pyz the guest batch runs (SUPERVISOR_ENTRY: no
# compile at each start, 0.4 s of emulated CPU saved each time).
INSIDE = "/opt/treereap"
SUPERVISOR_INSIDE = ["python3", INSIDE + "/" + os.path.basename(SUPERVISOR)]
ALLOCATE = ("import time; b = bytearray(%d << 20); b[::4096] = b'x' * len(b[::4096]); "
            "time.sleep(60)")
# A run of many processes, each smaller than the supervisor (its RSS is
# about 22 MiB): 16 of about 14 MiB, 220 MiB together.
SMALL_ONES = ("for i in $(seq 16); do python3 -c \"%s\" & done; wait" % ALLOCATE % 6)


def need(tool):
    """Skip outside the guest; in it, a missing tool is a skip, or a
    failure when the guest is required (CI)."""
    if not IN_GUEST:
        pytest.skip(GUEST_ONLY)
    if not IS_ROOT:
        pytest.skip("needs root")
    if shutil.which(tool) is None:
        why = "no %s in the guest (apt-get install runc crun podman)" % tool
        if REQUIRED:
            pytest.fail("SUPERVISOR_REQUIRE_GUEST=1, and " + why)
        pytest.skip(why)


@pytest.fixture(params=["runc", "crun"])
def runtime(request):
    need(request.param)
    return request.param


@pytest.fixture
def containers(runtime, tmp_path):
    """Make containers with the runtime; every one is deleted at the end."""
    made = []

    def make(command, **options):
        made.append(Container(runtime, tmp_path, command, **options))
        return made[-1]
    yield make
    for container in made:
        container.delete()


def waited(pid, timeout):
    """The exit status of our child pid as os.waitstatus_to_exitcode gives
    it (-N for signal N), or None when it runs on past timeout."""
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            return None
        time.sleep(0.02)


class Proc(object):
    """A process a runtime started detached (--pid-file), now our child:
    its pid (as seen here), its stdout and stderr (files)."""

    def __init__(self, pid, out, err):
        self.pid, self.out, self.err, self.status = pid, out, err, None

    def wait(self, timeout=120):
        if self.status is None:
            self.status = waited(self.pid, timeout)
            assert self.status is not None, "pid %d still runs after %ss: %s" % (
                self.pid, timeout, self.stderr())
        return self.status

    def stderr(self):
        return read(self.err) + read(self.out)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return str(e)


class Container(object):
    """A bundle, and the container a runtime makes of it (not yet started)."""

    def __init__(self, runtime, top, command, cgroup="ro", caps=DOCKER_CAPS, memory=None,
                 volumes=None, env=()):
        self.runtime = runtime
        self.id = "ctr-%s-%s" % (runtime, os.urandom(4).hex())
        self.bundle = os.path.join(str(top), self.id)
        self.receipts = os.path.join(self.bundle, "receipts")
        self.cgroup = CGROUP_ROOT + "/docker/" + self.id
        self.procs, self.init, self.count = [], None, 0
        os.makedirs(self.receipts)
        if volumes is None:  # the checkout (or the pyz) read-only
            volumes = [(os.path.dirname(SUPERVISOR), INSIDE, "ro")]
        write_bundle(self.bundle, self.id, command, cgroup, caps, memory, volumes, env)

    def _detached(self, verb, options, argv):
        self.count += 1
        base = os.path.join(self.bundle, "%s-%d" % (verb, self.count))
        with open(base + ".out", "w") as out, open(base + ".err", "w") as err:
            result = subprocess.run([self.runtime, verb, "-d", "--pid-file", base + ".pid"] +
                                    list(options) + [self.id] + list(argv), stdout=out,
                                    stderr=err, stdin=subprocess.DEVNULL, timeout=120)
        assert result.returncode == 0, (verb, argv, read(base + ".err"))
        with open(base + ".pid") as f:
            proc = Proc(int(f.read()), base + ".out", base + ".err")
        # Ours to reap (as a shim's) once the runtime has exited (crun's
        # child may exit just after it): we are the nearest child subreaper.
        assert wait_until(lambda: parent_of(proc.pid) == os.getpid(), timeout=30), (
            verb, proc.pid, parent_of(proc.pid))
        self.procs.append(proc)
        return proc

    def start(self):
        self.init = self._detached("run", ["--bundle", self.bundle], [])
        return self.init

    def exec(self, *argv, **kwargs):
        """`runtime exec -d ID ARGV`: the exec'd process, our child."""
        return self._detached("exec", kwargs.get("options", ()), argv)

    def run(self, *argv, **kwargs):
        """An exec to its end: (exit status, its stderr and stdout)."""
        proc = self.exec(*argv, **kwargs)
        return proc.wait(kwargs.get("timeout", 120)), proc.stderr()

    def cli(self, verb, *args):
        """`runtime VERB ID ARGS`: (its status, what it said)."""
        result = subprocess.run([self.runtime, verb, self.id] + list(args), timeout=60,
                                universal_newlines=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        return result.returncode, result.stdout

    def status(self):
        code, said = self.cli("state")
        return json.loads(said)["status"] if code == 0 else None

    def receipt(self, name="receipt.json"):
        path = os.path.join(self.receipts, name)
        assert os.path.exists(path), "no receipt %s; %s" % (name, self.log())
        with open(path) as f:
            return json.load(f)

    def leftovers(self):
        """The cgroups below the container's."""
        return sorted(name for name in os.listdir(self.cgroup)
                      if os.path.isdir(os.path.join(self.cgroup, name)))

    def members(self, below=""):
        """Every process in the container's cgroup (or the one below it) and
        in the cgroups below that."""
        found = []
        for directory, _, _ in os.walk(os.path.join(self.cgroup, below)):
            with open(os.path.join(directory, "cgroup.procs")) as f:
                found.extend(int(word) for word in f.read().split())
        return found

    def runs(self):
        """The runs' cgroups below the container's (treereap-*, not a
        supervisor's own leaf)."""
        return [name for name in self.leftovers()
                if name.startswith("treereap-") and not name.endswith(".supervisor")]

    def log(self):
        return " | ".join("%d: %s" % (p.pid, p.stderr().strip()) for p in self.procs)

    def delete(self):
        subprocess.run([self.runtime, "delete", "--force", self.id], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)
        for proc in self.procs:
            if proc.status is None:
                proc.status = waited(proc.pid, 30)
        if os.path.isdir(self.cgroup):  # (the runtimes remove it; a failed start may not)
            for directory, _, _ in sorted(os.walk(self.cgroup), reverse=True):
                try:
                    os.rmdir(directory)
                except OSError:
                    pass


def parent_of(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def write_bundle(bundle, name, command, cgroup, caps, memory, volumes, env):
    """config.json and an empty root: /usr and /etc of the guest read-only,
    the top directories of a merged /usr as its symlinks (bound where they
    are directories), /receipts read-write, and the volumes, (outside,
    inside, "ro" or "rw") each; env, "NAME=value" each, beside PATH."""
    rootfs = os.path.join(bundle, "rootfs")
    binds = [("/usr", "/usr", "ro"), ("/etc", "/etc", "ro"),
             (bundle + "/receipts", "/receipts", "rw")] + list(volumes)
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + top):
            os.makedirs(rootfs, exist_ok=True)
            os.symlink(os.readlink("/" + top), os.path.join(rootfs, top))
        elif os.path.isdir("/" + top):
            binds.append(("/" + top, "/" + top, "ro"))
    for where in ["proc", "dev", "sys", "tmp", "run"] + [
            b[1].lstrip("/") for b in binds if not b[1].startswith("/dev/")]:
        os.makedirs(os.path.join(rootfs, where), exist_ok=True)
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        # Docker's: cgroup2 of the container's cgroup namespace, read-only
        # unless privileged.
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": [cgroup, "nosuid", "noexec", "nodev", "relatime"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]},
    ] + [{"destination": inside, "type": "bind", "source": outside, "options": ["rbind", mode]}
         for outside, inside, mode in binds]
    resources = {"devices": [{"allow": False, "access": "rwm"}]}
    if memory:  # docker run --memory: no swap beyond it
        resources["memory"] = {"limit": memory, "swap": memory}
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False, "user": {"uid": 0, "gid": 0}, "args": command, "cwd": "/",
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "PYTHONDONTWRITEBYTECODE=1"] + list(env),
            "capabilities": {kind: list(caps) for kind in ("bounding", "effective", "permitted")},
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": name,
        "mounts": mounts,
        "linux": {
            "cgroupsPath": "/docker/" + name,
            "resources": resources,
            "namespaces": [{"type": kind} for kind in
                           ("pid", "network", "ipc", "uts", "mount", "cgroup")],
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
        },
    }
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def supervise(*args):
    """The supervisor's command line in a container."""
    return SUPERVISOR_INSIDE + [str(a) for a in args]


def sh_line(argv):
    return " ".join(shlex.quote(a) for a in argv)


def check_nothing_left(container, kept=()):
    """No cgroup of ours below the container's but those named, and no
    process in it but its init (if it still runs)."""
    assert container.leftovers() == sorted(kept), container.log()
    members = container.members()
    assert set(members) <= {container.init.pid}, members


# --- 1-3: the supervisor as the container's command -------------------------------------------

@pytest.mark.parametrize("pid_1, mount", [("sh", "rw"), ("sh", "ro"), ("supervisor", "rw")])
def test_the_supervisor_as_the_containers_command(containers, pid_1, mount):
    """`sh -c` as PID 1 running the supervisor, or the supervisor itself as
    PID 1: with cgroup2 mounted read-write the run has a cgroup of its own
    below the container's; read-only (Docker's default), the /proc walk, and
    the receipt says why. Either way the deadline gives 124, confirmed, and
    nothing of ours is left."""
    argv = supervise("--timeout", "1", "--receipt", "/receipts/receipt.json", "--", "sleep", "30")
    command = ["sh", "-c", sh_line(argv) + "; exit $?"] if pid_1 == "sh" else argv
    container = containers(command, cgroup=mount)
    assert container.start().wait() == 124, container.log()
    receipt = container.receipt()
    assert receipt["exit_status"] == 124 and receipt["stop_reason"] == "timeout", receipt
    assert receipt["cleanup_confirmed"] is True and receipt["drained_count"] == 1
    assert (receipt["supervisor_pid"] == 1) == (pid_1 == "supervisor"), receipt
    if mount == "rw":
        assert receipt["containment"] == "cgroup" and receipt["cgroup_unavailable"] is None
        assert re.match(r"/treereap-\d+-[0-9a-f]+$", receipt["cgroup"]), receipt
    else:
        assert receipt["containment"] == "children" and receipt["cgroup"] is None
        assert receipt["cgroup_unavailable"] == \
            "the cgroup v2 hierarchy at /sys/fs/cgroup is mounted read-only", receipt
    assert container.status() == "stopped"
    check_nothing_left(container)


# --- 3b: --user in the default /proc ------------------------------------------------------------

def test_user_confirms_in_the_default_proc(containers):
    """--user nobody, the threat model's advice for untrusted code, as the
    container's command in a bundle with the default spec's /proc (/proc/sys
    bound read-only over itself, the masked paths): it never confirmed there
    before 9ce1332 (125, "covered by a mount made inside /proc": the end's
    look at Yama's ptrace_scope refused the runtime's own mounts, #36 item
    1). The scope is read at the start now, through them. The command runs
    as nobody, sees the read-only /proc/sys, and the run confirms."""
    container = containers(supervise(
        "--timeout", "60", "--user", "nobody", "--workdir", "/tmp", "--receipt",
        "/receipts/receipt.json", "--", "sh", "-c",
        "id -u; grep -c ' /proc/sys ro,' /proc/self/mountinfo"))
    assert container.start().wait() == 0, container.log()
    receipt = container.receipt()
    assert receipt["cleanup_confirmed"] is True and receipt["error"] is None, receipt
    assert read(container.init.out).split() == [str(pwd.getpwnam("nobody").pw_uid), "1"], \
        container.log()
    check_nothing_left(container)


# --- 4: one long-lived container, many execs ----------------------------------------------------

def test_two_execs_at_once_and_a_third_later_each_in_a_cgroup_of_its_own(containers):
    """PID 1 `sleep infinity`; two supervisors exec'd at once, each run
    waiting until the other has started (so they overlap, whatever the
    load), each leaving a process in a session of its own; then a third."""
    container = containers(["sleep", "infinity"], cgroup="rw")
    container.start()
    runs = []
    for me, other in (("a", "b"), ("b", "a")):
        script = ("touch /receipts/{0}.here; until [ -e /receipts/{1}.here ]; do sleep 0.1; done; "
                  "setsid sleep 300 & exec sleep 1").format(me, other)
        runs.append(container.exec(*supervise("--timeout", "120", "--receipt",
                                              "/receipts/%s.json" % me, "--", "sh", "-c", script)))
    for proc in runs:
        assert proc.wait() == 0, container.log()
    first, second = container.receipt("a.json"), container.receipt("b.json")
    for receipt in (first, second):
        assert receipt["containment"] == "cgroup" and receipt["cleanup_confirmed"] is True, receipt
        assert receipt["stop_reason"] == "exit" and receipt["drained_count"] == 1, receipt
    assert first["cgroup"] != second["cgroup"]
    assert first["started_at"] < second["ended_at"] and second["started_at"] < first["ended_at"]
    status, said = container.run(*supervise("--timeout", "60", "--receipt", "/receipts/c.json",
                                            "--", "true"))
    assert status == 0 and container.receipt("c.json")["cleanup_confirmed"] is True, said
    check_nothing_left(container)


# --- 5: limits: --prepare-cgroup, then execs or PID 1 -------------------------------------------

def test_limits_in_execs_after_prepare_cgroup(containers):
    """Before the step, a --memory-max exec'd beside the init is refused (125),
    naming --prepare-cgroup. After it (once, by exec), the runtime starts each
    exec in the init's leaf, treereap.init, by itself (refused by the
    container's cgroup, EBUSY, runc and crun fall back to the init's: runc
    PR 2416, crun PR 365; `exec --cgroup treereap.init` says the same), and
    --memory-max and --pids-max hold the run."""
    container = containers(["sleep", "infinity"], cgroup="rw")
    container.start()
    limited = supervise("--timeout", "60", "--memory-max", "64M", "--receipt",
                        "/receipts/memory.json", "--", "python3", "-c", ALLOCATE % 256)
    status, said = container.run(*limited)
    assert status == 125 and "--prepare-cgroup" in said, said
    assert not os.path.exists(os.path.join(container.receipts, "memory.json"))
    status, said = container.run(*supervise("--prepare-cgroup"))
    assert status == 0 and "moved into treereap.init; memory, pids on" in said, said
    assert container.leftovers() == ["treereap.init"]
    for options in ((), ("--cgroup", "treereap.init")):
        status, said = container.run("cat", "/proc/self/cgroup", options=options)
        assert status == 0 and said == "0::/treereap.init\n", (options, said)

    status, said = container.run(*limited)
    receipt = container.receipt("memory.json")
    assert status == 137 and receipt["stop_reason"] == "memory", said
    assert receipt["oom_killed_by"] == "run" and receipt["cleanup_confirmed"] is True, receipt
    assert receipt["limits"]["set"]["memory.max"] == str(64 << 20)

    status, said = container.run(*supervise(
        "--timeout", "60", "--pids-max", "5", "--receipt", "/receipts/pids.json", "--", "sh", "-c",
        "for i in 1 2 3 4 5 6 7 8; do sleep 2 & done; wait"))
    receipt = container.receipt("pids.json")
    assert receipt["cleanup_confirmed"] is True and receipt["limits"]["set"]["pids.max"] == "5"
    assert receipt["usage"]["pids_events_max"] >= 1 and receipt["usage"]["pids_peak"] <= 5, said
    check_nothing_left(container, kept=["treereap.init"])


# Each entrypoint under one runtime (the guest's time is the suite's: TCG).
@pytest.mark.parametrize("runtime, entrypoint", [("runc", "prepare-then-exec"),
                                                 ("crun", "supervisor-alone")],
                         indirect=["runtime"])
def test_limits_from_pid_1(containers, entrypoint):
    """The entrypoint runs --prepare-cgroup, then execs the supervisor (PID 1
    in treereap.init); or the supervisor is PID 1 alone in the container's
    cgroup, and moves itself into a leaf of its own, which it leaves behind,
    empty. Either way --memory-max holds the run: 137, stop_reason memory,
    confirmed."""
    limited = supervise("--timeout", "60", "--memory-max", "64M", "--receipt",
                        "/receipts/receipt.json", "--", "python3", "-c", ALLOCATE % 256)
    if entrypoint == "prepare-then-exec":
        command = ["sh", "-c", "%s && exec %s" % (sh_line(supervise("--prepare-cgroup")),
                                                  sh_line(limited))]
    else:
        command = limited
    container = containers(command, cgroup="rw")
    assert container.start().wait() == 137, container.log()
    receipt = container.receipt()
    assert receipt["stop_reason"] == "memory" and receipt["oom_killed_by"] == "run", receipt
    assert receipt["cleanup_confirmed"] is True and receipt["supervisor_pid"] == 1
    if entrypoint == "prepare-then-exec":
        check_nothing_left(container, kept=["treereap.init"])
    else:
        # The leaf it moved into stays, empty, until the container's cgroup
        # goes (docs/reference.md, Limits: "It stays in that leaf"; as PID 1
        # it cannot move back: its parent now enables controllers).
        leaves = container.leftovers()
        assert len(leaves) == 1 and re.match(r"treereap-1-[0-9a-f]+\.supervisor$", leaves[0]), \
            leaves
        assert container.members() == []


# --- 6: stopped by the runtime ------------------------------------------------------------------

DOCKER_STOP_TIMEOUT = 10  # docker stop's default grace (Kubernetes': 30 s)


def test_stopped_by_the_runtime_within_its_grace(containers):
    """`docker stop`, as the runtime does it: SIGTERM to PID 1 (the
    supervisor), and SIGKILL when the grace (10 s) has run out. The command
    ignores SIGTERM: the supervisor passes it on, waits -k 2, SIGKILLs the
    run, drains, writes the receipt and exits 137, well before the
    runtime's SIGKILL, which then finds nothing."""
    container = containers(supervise("-v", "--timeout", "600", "-k", "2", "--receipt",
                                     "/receipts/receipt.json", "--", "sh", "-c",
                                     "trap '' TERM; sleep 300"), cgroup="rw")
    init = container.start()
    assert wait_until(lambda: "started:" in init.stderr(), timeout=60), init.stderr()
    assert wait_until(lambda: len(container.runs()) == 1 and len(
        container.members(container.runs()[0])) == 2, timeout=30)  # sh, and its sleep
    assert container.cli("kill", "TERM")[0] == 0
    status = waited(init.pid, DOCKER_STOP_TIMEOUT)
    if status is None:
        container.cli("kill", "KILL")
    init.status = status if status is not None else init.wait(30)
    assert status == 137, "PID 1 ran past docker stop's %d s (%s): %s" % (
        DOCKER_STOP_TIMEOUT, init.status, init.stderr())
    receipt = container.receipt()
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM", receipt
    assert receipt["exit_status"] == 137 and receipt["return_code"] == -9, receipt
    assert receipt["cleanup_confirmed"] is True and receipt["drained_count"] == 2, receipt
    assert [s["step"] for s in receipt["ladder"]] == ["terminating", "killing", "draining"]
    assert container.status() == "stopped"
    # The runtime's SIGKILL after its grace: nothing is left to get it.
    assert container.cli("kill", "KILL")[0] != 0
    check_nothing_left(container)


# --- 7: a supervisor killed with SIGKILL, and the next one --------------------------------------

def test_the_next_exec_and_the_run_of_a_supervisor_killed_with_sigkill(containers):
    """An exec'd supervisor whose command left `setsid sleep 300` is
    SIGKILLed (its pid, as the host sees it, from --pid-file), then another
    is exec'd, both with Docker's default capabilities, which lack
    CAP_SYS_ADMIN: the first marked its run's cgroup in user.treereap (the
    trusted.* mark is tested on the host, with both sets:
    test_containment.py), and the next one ends that run at once, says so
    with -v, and nothing of it is left."""
    container = containers(["sleep", "infinity"], cgroup="rw", caps=DOCKER_CAPS)
    container.start()
    first = container.exec(*supervise("--timeout", "300", "--receipt", "/receipts/first.json",
                                      "--", "sh", "-c", "setsid sleep 300 & exec sleep 300"))
    assert wait_until(lambda: len(container.runs()) == 1 and len(
        container.members(container.runs()[0])) == 2, timeout=60), first.stderr()
    dead_run = container.runs()[0]
    orphans = container.members(dead_run)  # the command, and its sleep
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    status, said = container.run(*supervise("-v", "--timeout", "60", "--receipt",
                                            "/receipts/second.json", "--", "true"))
    assert status == 0 and container.receipt("second.json")["cleanup_confirmed"] is True, said
    assert not os.path.exists(os.path.join(container.receipts, "first.json"))
    assert re.search(r"ended /%s, a run whose supervisor was killed: [12] process\(es\)"
                     % dead_run, said), said
    assert not any(alive(pid) for pid in orphans)
    check_nothing_left(container)


# --- 8: a container's memory limit below --memory-max ------------------------------------------

OOM_CASES = [
    pytest.param(DOCKER_CAPS, "", id="docker-default-caps"),
    pytest.param(DOCKER_CAPS + ["CAP_SYS_RESOURCE"], "", id="cap-add-sys-resource"),
    pytest.param(DOCKER_CAPS, "echo 1000 > /proc/self/oom_score_adj && ",
                 id="command-at-oom-score-adj-1000"),
]


def limited_container(containers, caps):
    """A container of 128 MiB (docker run --memory 128m) whose cgroup is
    prepared for limits; PID 1 sleeps."""
    container = containers(["sleep", "infinity"], cgroup="rw", caps=caps, memory=128 << 20)
    container.start()
    status, said = container.run(*supervise("--prepare-cgroup"))
    assert status == 0, said
    return container


# What the capabilities change is the kernel's, not the runtime's: runc alone.
@pytest.mark.parametrize("runtime", ["runc"], indirect=True)
@pytest.mark.parametrize("caps, before", OOM_CASES)
def test_a_container_limit_below_memory_max_kills_the_run_from_outside(containers, caps, before):
    """--memory-max 300M in a container of 128M, a command that allocates
    400M: the supervisor warns at the start that a cgroup above allows less;
    the container's OOM kill takes the command (by far the largest process),
    the receipt says stop_reason exit, oom_killed_by outside, -9, 137. The
    supervisor's own oom_score_adj is -1000 only with CAP_SYS_RESOURCE, which
    Docker's default set lacks: there it stays at the container's 0."""
    container = limited_container(containers, caps)
    gate = "until [ -e /receipts/go ]; do sleep 0.1; done; %sexec python3 -c \"%s\"" % (
        before, ALLOCATE % 400)
    proc = container.exec(*supervise("-v", "--timeout", "120", "--memory-max", "300M",
                                     "--receipt", "/receipts/receipt.json", "--",
                                     "sh", "-c", gate))
    assert wait_until(lambda: "started:" in proc.stderr(), timeout=60), proc.stderr()
    own, containers_own = (read("/proc/%d/oom_score_adj" % pid).strip()
                           for pid in (proc.pid, container.init.pid))
    assert own == ("-1000" if "CAP_SYS_RESOURCE" in caps else containers_own), own
    open(os.path.join(container.receipts, "go"), "w").close()
    assert proc.wait() == 137, proc.stderr()
    receipt = container.receipt()
    assert receipt["stop_reason"] == "exit" and receipt["oom_killed_by"] == "outside", receipt
    assert receipt["return_code"] == -9 and receipt["exit_status"] == 137, receipt
    assert receipt["cleanup_confirmed"] is True, receipt
    assert "a cgroup above the run allows 128 MiB (memory.max)" in proc.stderr(), proc.stderr()
    check_nothing_left(container, kept=["treereap.init"])


@pytest.mark.parametrize("runtime", ["runc"], indirect=True)
@pytest.mark.parametrize("caps, before", OOM_CASES)
def test_an_oom_kill_at_the_containers_limit_of_a_run_of_small_processes(containers, caps,
                                                                         before):
    """The same container's limit reached by a run of 16 processes of about
    14 MiB: the OOM killer takes the largest process of the container.
    Without CAP_SYS_RESOURCE (Docker's default) the supervisor cannot set
    its oom_score_adj to -1000 and keeps the container's 0, as its command
    does: where it is the largest (run as supervisor.py, ~22 MiB; as the pyz
    it is ~12 MiB, smaller than each of these) it is killed and no receipt
    comes (as docs/reference.md says: "may choose the supervisor"), never a
    wrong one. With CAP_SYS_RESOURCE, or with the command started at
    oom_score_adj 1000 (which needs no capability), the run is always taken
    and the receipt says so."""
    container = limited_container(containers, caps)
    proc = container.exec(*supervise("--timeout", "120", "--memory-max", "300M", "--receipt",
                                     "/receipts/receipt.json", "--", "sh", "-c",
                                     before + SMALL_ONES))
    status = proc.wait()
    with open(os.path.join(container.cgroup, "memory.events")) as f:
        assert int(dict(line.split() for line in f)["oom_kill"]) >= 1
    if caps == DOCKER_CAPS and not before and status == -signal.SIGKILL:
        assert not os.path.exists(os.path.join(container.receipts, "receipt.json"))
        assert SUPERVISOR.endswith(".py"), "the pyz (~12 MiB) is not the largest process"
        return
    assert status == 137, proc.stderr()
    receipt = container.receipt()
    assert receipt["oom_killed_by"] == "outside" and receipt["cleanup_confirmed"] is True, receipt
    check_nothing_left(container, kept=["treereap.init"])


# --- 9: the kubelet's stop, against the Kubernetes recipe's task container -------------------

RECIPE = os.path.join(ROOT, "docs", "recipes.md")


def kubernetes_job():
    """The Job manifest of docs/recipes.md's "Under Kubernetes", parsed."""
    import yaml
    with open(RECIPE) as f:
        text = f.read()
    section = text.split("\n## Under Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    return yaml.safe_load(re.search(r"<!-- checked: [^>]*-->\n```yaml\n(.*?)```", section,
                                    re.S).group(1))


def expand(word, env):
    """The kubelet's expansion of a container's command: $(NAME) is NAME's
    value where the container's env defines it, $$ is $, the rest as
    written (kubernetes third_party/forked/golang/expansion)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$"
                  else env.get(m.group(1), m.group(0)), word)


def termination_message(path, policy, exit_code, log):
    """What the kubelet reads once the container has exited (kuberuntime_
    container.go: getTerminationMessage, convertToKubeContainerStatus): the
    last 4 KiB of the file it bound at terminationMessagePath
    (MaxContainerTerminationMessageLength, tail.ReadAtMost); under
    FallbackToLogsOnError, when that is empty and the exit code is not 0,
    the last 80 lines of the container's log, at most 2 KiB."""
    with open(path, "rb") as f:
        message = f.read()[-4096:]
    if not message and policy == "FallbackToLogsOnError" and exit_code != 0:
        message = b"".join(log.splitlines(True)[-80:])[-2048:]
    return message.decode("utf-8", "replace")


# The task's image: run.sh leaves a server in a session of its own that
# ignores SIGTERM (only SIGKILL ends it), then works until stopped.
RUN_SH = ("setsid sh -c 'trap \"\" TERM; touch /task/server.ready; exec sleep 600' &\n"
          "exec sleep 600\n")


@pytest.mark.parametrize("runtime", ["runc"], indirect=True)  # (the guest's time: one runtime)
def test_the_kubelets_stop_of_the_kubernetes_recipes_task(containers, tmp_path):
    """The Job's task container as a runc bundle, its command read from
    docs/recipes.md's manifest and expanded as the kubelet does ($(POD_NAME)
    from the downward API), with what the kubelet gives it: the init
    container's copy of the pyz at /opt/treereap, the receipts volume, an
    empty /dev/termination-log bound from outside (mode 0666, as makeMounts
    makes it), the default /proc. Then the kubelet's stop, as killContainer
    asks the runtime for it (CRI StopContainer with the pod's
    terminationGracePeriodSeconds; containerd: the stop signal, SIGTERM, to
    the container's init alone, the grace, then SIGKILL), and the
    termination message read as the kubelet reads it. The supervisor
    (--stop-timeout) ends the run within the grace: the server that ignores
    SIGTERM needs SIGKILL, the receipt of this attempt and the message say
    so, and nothing is left for the kubelet's SIGKILL."""
    job = kubernetes_job()
    pod = job["spec"]["template"]["spec"]
    task = [c for c in pod["containers"] if c["name"] == "task"][0]
    grace = pod["terminationGracePeriodSeconds"]
    pod_name = "%s-%s" % (job["metadata"]["name"], os.urandom(3).hex()[:5])
    fields = {"metadata.name": pod_name}
    env = dict((e["name"], fields[e["valueFrom"]["fieldRef"]["fieldPath"]])
               for e in task.get("env", ()))
    command = [expand(word, env) for word in task["command"]]
    # The init container's work (cp the pyz into the shared emptyDir), the
    # task image's /task, and the kubelet's termination-log file.
    pyz, work = tmp_path / "treereap-volume", tmp_path / "task"
    pyz.mkdir(), work.mkdir()
    shutil.copy(SUPERVISOR, str(pyz / "treereap.pyz"))
    (work / "run.sh").write_text(RUN_SH)
    log_file = tmp_path / "termination-log"
    log_file.write_text("")
    os.chmod(str(log_file), 0o666)
    mounts = dict((m["name"], m["mountPath"]) for m in task["volumeMounts"])
    assert command[:2] == ["python3", mounts["treereap"] + "/treereap.pyz"], command
    message_path = task.get("terminationMessagePath", "/dev/termination-log")
    container = containers(command, volumes=[
        (str(pyz), mounts["treereap"], "ro"), (str(work), "/task", "rw"),
        (str(log_file), message_path, "rw")], env=["%s=%s" % kv for kv in env.items()])
    assert mounts["receipts"] == "/receipts"  # (the bundle's own: container.receipts outside)
    init = container.start()
    assert wait_until(lambda: (work / "server.ready").exists(), timeout=120), container.log()

    assert container.cli("kill", "TERM")[0] == 0  # task.Kill(SIGTERM): the init alone
    status = waited(init.pid, grace)
    if status is None:  # the grace ran out: the kubelet's SIGKILL
        container.cli("kill", "KILL")
    init.status = status if status is not None else init.wait(60)
    assert status is not None, "PID 1 ran past the kubelet's %d s grace: %s" % (
        grace, init.stderr())
    exit_code = 128 - status if status < 0 else status  # as the runtime reports a signal
    message = termination_message(str(log_file), task.get("terminationMessagePolicy", "File"),
                                  exit_code, read(init.out) + read(init.err))

    receipt = container.receipt(os.path.basename(command[command.index("--receipt") + 1]))
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM", receipt
    assert receipt["cleanup_confirmed"] is True and receipt["exit_status"] == exit_code, receipt
    assert "sleep" in [p["name"] for p in receipt["drained"]], receipt
    assert message.startswith("done: SIGTERM, exit status %d" % exit_code), message
    assert "SIGKILL was needed" in message and "cleanup confirmed" in message, message
    assert "receipt: /receipts/%s.json" % pod_name in message, message
    assert container.status() == "stopped"
    check_nothing_left(container)


# --- Podman, and the recipe ---------------------------------------------------------------------

# The blocks of the recipe's "In a container" that run here: marked so.
RUN_HERE = "<!-- not run: here; tests/test_containers.py runs it in the pure cgroup v2 guest -->"


def recipe_blocks():
    with open(RECIPE) as f:
        text = f.read()
    section = text.split("\n## In a container\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(re.escape(RUN_HERE) + r"\n```sh\n(.*?)```", section, re.S)


def podman_setup(top):
    """A directory as the recipe's reader has it: the checkout's
    scripts/build_pyz.py and supervisor.py, and rootfs/, a root holding
    python3 (Podman binds the guest's /usr and /etc into it, read-only, by
    containers.conf: the lines run as written). Podman's own settings for a
    guest without systemd or network: cgroupfs, events to a file, no
    network namespace but an empty one, its storage below top."""
    work = os.path.join(top, "work")
    os.makedirs(os.path.join(work, "scripts"))
    shutil.copy(os.path.join(ROOT, "scripts", "build_pyz.py"), os.path.join(work, "scripts"))
    shutil.copy(SOURCE, os.path.join(work, "supervisor.py"))
    rootfs = os.path.join(work, "rootfs")
    volumes = ["/usr:/usr:ro", "/etc:/etc:ro"]
    for where in ("usr", "etc", "proc", "dev", "sys", "tmp", "run", "opt", "receipts"):
        os.makedirs(os.path.join(rootfs, where))
    for top_dir in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink("/" + top_dir):
            os.symlink(os.readlink("/" + top_dir), os.path.join(rootfs, top_dir))
        elif os.path.isdir("/" + top_dir):
            os.makedirs(os.path.join(rootfs, top_dir))
            volumes.append("/%s:/%s:ro" % (top_dir, top_dir))
    conf, storage = os.path.join(top, "containers.conf"), os.path.join(top, "storage.conf")
    with open(conf, "w") as f:
        f.write('[containers]\nnetns = "none"\nvolumes = [%s]\n[engine]\ncgroup_manager = '
                '"cgroupfs"\nevents_logger = "file"\n' % ", ".join('"%s"' % v for v in volumes))
    # The runroot on a short path: Podman's exit command refuses one over 50
    # characters ("the specified runroot is longer than 50 characters"), and
    # `podman run` then waits 20 s for an exit code that never comes.
    runroot = tempfile.mkdtemp(prefix="podman-")
    with open(storage, "w") as f:
        f.write('[storage]\ndriver = "vfs"\ngraphroot = "%s/graph"\nrunroot = "%s"\n'
                % (top, runroot))
    os.makedirs(os.path.join(top, "pyenv"))  # none: build_pyz.py takes python3.X on PATH
    env = dict(os.environ, CONTAINERS_CONF=conf, CONTAINERS_STORAGE_CONF=storage,
               PYENV_ROOT=os.path.join(top, "pyenv"),
               PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return work, env, runroot


def test_the_container_recipe_runs_as_written_with_podman(tmp_path):
    """Every block of the recipe's "In a container" marked to run here, in
    order, in one directory, with Podman: the pyz built and copied in; the
    supervisor as PID 1 with the default read-only cgroup2 (the /proc walk)
    and with it unmasked (a cgroup, limits); one container and several
    execs after --prepare-cgroup; `podman stop` within its grace."""
    need("podman")
    blocks = recipe_blocks()
    assert len(blocks) == 5, blocks
    work, env, runroot = podman_setup(str(tmp_path))
    receipts = os.path.join(work, "receipts")
    try:
        said = []
        for code in blocks:
            result = subprocess.run(["bash", "-c", "set -e\n" + code], cwd=work, env=env,
                                    universal_newlines=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, timeout=600)
            assert result.returncode == 0, (code, result.stdout, result.stderr)
            said.append(result.stdout)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", "box", "job"], cwd=work, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        shutil.rmtree(runroot, ignore_errors=True)

    def receipt(name):
        with open(os.path.join(receipts, name)) as f:
            found = json.load(f)
        assert found["cleanup_confirmed"] is True, found
        return found
    pid1 = receipt("pid1.json")
    assert pid1["containment"] == "children" and pid1["supervisor_pid"] == 1, pid1
    assert "mounted read-only" in pid1["cgroup_unavailable"] and pid1["drained_count"] == 1
    assert "the task ran" in said[1]
    limits = receipt("limits.json")
    assert limits["containment"] == "cgroup" and limits["drained_count"] == 1, limits
    assert limits["limits"]["set"]["memory.max"] == str(256 << 20)
    assert limits["limits"]["set"]["pids.max"] == "64"
    for name in ("exec-1.json", "exec-2.json"):
        each = receipt(name)
        assert each["containment"] == "cgroup" and each["exit_status"] == 0, each
        assert each["limits"]["set"]["memory.max"] == str(256 << 20)
    assert "one" in said[3] and "two" in said[3]
    stopped = receipt("stopped.json")
    assert stopped["stop_reason"] == "signal" and stopped["signal"] == "SIGTERM", stopped
    assert stopped["exit_status"] == 137 and "137" in said[4].split(), (stopped, said[4])
