"""The supervisor under a real Docker engine (issue 36, items 3 and 5): the
Docker blocks of docs/recipes.md's "In a container", read from the
document and run as written, and the cases around them: the supervisor as
PID 1 and under `--init`, `docker exec` at once and later, `docker stop`
(SIGTERM to PID 1, its grace, SIGKILL) with and without `--stop-timeout`,
`docker kill`, `--memory`, `--pids-limit`, `--read-only`, Docker's `--user`
and ours, `docker stop` of a box whose supervisor was exec'd, and
`--prepare-cgroup` with limits where containers get cgroup v2.

The engine is this machine's dockerd (Debian's docker.io), started once for
the session and privately: its socket, data root, exec root, pidfile, key
and configuration below a temporary directory, no network set up
(`--iptables=false --ip6tables=false --bridge=none`; containers run with
`--network none`), then stopped, and everything it made removed (its
mounts, its directories, the shims' socket directory in /run when it made
it). No image registry is reachable: the recipe's `FROM python:3.12-slim`
is a local image of that name, made with `docker import` from this
machine's files: a static busybox for /bin, /usr/bin/python3 with its
standard library, its `lib-dynload` modules and the shared libraries `ldd`
lists for them. The client may be newer than the engine: it negotiates the
engine's API version by itself (28.x against 20.10's 1.41).

On this hybrid host Docker gives containers cgroup v1 (no cgroup2 mount at
all); in the tests' pure cgroup v2 guest (tests/test_guest.py) cgroup2 is
the container's own, read-only unless privileged. The guest runs only what
needs cgroup v2 or says something different there (its time is short).

Needs root, dockerd, the docker client, a static busybox and
/usr/bin/python3; skipped elsewhere with the reason, unless
SUPERVISOR_REQUIRE_ENGINES names docker (as in CI): then that is a failure.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import IS_ROOT, ROOT, SOURCE, wait_until

IN_GUEST = os.environ.get("TREEREAP_IN_GUEST") == "1"
REQUIRED = "docker" in os.environ.get("SUPERVISOR_REQUIRE_ENGINES", "").split(",")
RECIPE = os.path.join(ROOT, "docs", "recipes.md")
# The image the recipe's Dockerfile starts FROM, made here (no registry).
BASE = "python:3.12-slim"
IMAGE = "task-image"
PYTHON = "/usr/bin/python3"
# Whatever the recipe and the tests name: removed after each test.
NAMES = ("job", "box", "limits", "init", "killed", "oom", "pids", "user", "v1")
HOST_ONLY = "the host runs it; the guest runs only what needs cgroup v2 (its time is short)"

# One engine per session, on one worker: the tests share it and its image.
pytestmark = pytest.mark.xdist_group("docker")


def why_no_docker():
    if not IS_ROOT:
        return "needs root (dockerd)"
    for tool in ("dockerd", "docker", "busybox"):
        if shutil.which(tool) is None:
            return "no %s (apt-get install docker.io busybox-static)" % tool
    if subprocess.run(["ldd", shutil.which("busybox")], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode == 0:
        return "busybox is not static (apt-get install busybox-static)"
    if not os.path.exists(PYTHON):
        return "no %s for the image" % PYTHON
    return None


# --- The engine -------------------------------------------------------------------------

class Engine(object):
    """A private dockerd and the client's environment to reach it."""

    def __init__(self, top):
        self.top = top
        self.sock = os.path.join(top, "docker.sock")
        self.log = os.path.join(top, "dockerd.log")
        self.env = dict(os.environ, DOCKER_HOST="unix://" + self.sock,
                        DOCKER_CONFIG=os.path.join(top, "client"), DOCKER_BUILDKIT="0")
        self.proc = None
        self.cgroup_version = None

    def start(self):
        # The key and the configuration of its own: the defaults are
        # /etc/docker's (dockerd 20.10 writes /etc/docker/key.json).
        config = os.path.join(self.top, "daemon.json")
        with open(config, "w") as f:
            json.dump({"deprecated-key-path": os.path.join(self.top, "key.json")}, f)
        argv = ["dockerd", "--config-file", config, "--host", "unix://" + self.sock,
                "--data-root", os.path.join(self.top, "data"),
                "--exec-root", os.path.join(self.top, "exec"),
                "--pidfile", os.path.join(self.top, "dockerd.pid"),
                "--iptables=false", "--ip6tables=false", "--bridge=none"]
        with open(self.log, "w") as log:
            # SIGTERM when pytest dies: dockerd then stops its containers.
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_pdeathsig)
        up = lambda: self.proc.poll() is not None or self.docker(
            "info", "--format", "{{.CgroupVersion}}", check=False).returncode == 0
        assert wait_until(up, timeout=120, interval=0.1) and self.proc.poll() is None, \
            self.tail()
        self.cgroup_version = self.docker("info", "--format", "{{.CgroupVersion}}").strip()

    def docker(self, *args, check=True, timeout=120, **kwargs):
        """The client's output (stdout), or the CompletedProcess when not
        check."""
        result = subprocess.run(["docker"] + list(args), env=self.env, timeout=timeout,
                                universal_newlines=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, **kwargs)
        if not check:
            return result
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    def remove_containers(self):
        ids = self.docker("ps", "-aq", check=False).stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, check=False)

    def stop(self):
        if self.proc.poll() is None:
            self.remove_containers()
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Its containerd, should dockerd have died before it.
        pidfile = os.path.join(self.top, "exec", "containerd", "containerd.pid")
        if os.path.exists(pidfile):
            with open(pidfile) as f:
                pid = int(f.read().strip() or 0)
            if pid and "containerd" in _cmdline(pid):
                os.kill(pid, signal.SIGKILL)
        for where in reversed(_mounts_below(self.top)):
            subprocess.run(["umount", "-l", where], stderr=subprocess.DEVNULL)

    def tail(self):
        try:
            with open(self.log) as f:
                return f.read()[-3000:]
        except OSError as e:
            return str(e)


def _pdeathsig():
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _mounts_below(top):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(top + "/")]


# Directories dockerd 20.10 and its shims make wherever the roots are: the
# plugins' sockets, the shims' sockets. Removed at the end if we made them
# and they are empty.
RUN_DIRS = ["/run/docker/plugins", "/run/docker", "/run/containerd/s", "/run/containerd"]

TIMES = {}


@pytest.fixture(scope="session")
def engine():
    why = why_no_docker()
    if why is not None:
        if REQUIRED:
            pytest.fail("SUPERVISOR_REQUIRE_ENGINES names docker, and it cannot run: " + why)
        pytest.skip(why)
    TIMES["start"] = time.monotonic()
    before = [d for d in RUN_DIRS if os.path.exists(d)]
    top = tempfile.mkdtemp(prefix="treereap-docker-")
    made = Engine(top)
    try:
        made.start()
        TIMES["engine"] = time.monotonic() - TIMES["start"]
        yield made
    finally:
        made.stop()
        shutil.rmtree(top, ignore_errors=True)
        for directory in RUN_DIRS:
            if directory not in before:
                try:
                    os.rmdir(directory)
                except OSError:
                    pass
        report()


def report():
    """The session's figures, on stdout (pytest -s shows them)."""
    if TIMES:
        print("\ndocker: " + ", ".join("%s %.2f s" % item for item in sorted(TIMES.items())
                                       if item[0] != "start"))


# --- The image: this machine's python3 and a static busybox -------------------------------

IMAGE_SCRIPT = os.path.join(ROOT, "tests", "engines", "docker_image.py")


def import_base(engine, name, tarball=None, changes=("ENV PATH=/usr/bin:/bin",)):
    """`docker import` of tests/engines/docker_image.py's root filesystem
    as `name`: made now, or the tarball given."""
    source = open(tarball, "rb") if tarball else subprocess.Popen(
        [PYTHON, IMAGE_SCRIPT, "-"], stdout=subprocess.PIPE).stdout
    with source:
        engine.docker("import", *[arg for change in changes for arg in ("-c", change)],
                      "-", name, stdin=source, timeout=300)


def dockerfile_settings(dockerfile):
    """The Dockerfile's ENV, ENTRYPOINT and CMD lines, as `docker import
    -c` takes them."""
    joined = dockerfile.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.split(" ", 1)[0] in (
        "ENV", "ENTRYPOINT", "CMD")]


# --- The recipe ---------------------------------------------------------------------------

MARKER = re.compile(r"<!-- (not run: here; tests/test_docker\.py[^>]*) -->\n```(\w+)\n(.*?)```",
                    re.S)


def recipe_blocks():
    """The blocks of "In a container" that this file runs: (marker,
    language, code), in the document's order."""
    with open(RECIPE) as f:
        text = f.read()
    section = text.split("\n## In a container\n", 1)[1].split("\n## ", 1)[0]
    return MARKER.findall(section)


BLOCKS = recipe_blocks()


def block(word):
    """The one block whose code holds `word`."""
    found = [code for _, _, code in BLOCKS if word in code]
    assert len(found) == 1, (word, found)
    return found[0]


class Recipe(object):
    """The reader's directory: the checkout's scripts/build_pyz.py and
    supervisor.py, the Dockerfile, receipts/ and ctl/ once built."""

    def __init__(self, engine):
        self.engine = engine
        self.work = os.path.join(engine.top, "work")
        self.receipts = os.path.join(self.work, "receipts")
        os.makedirs(os.path.join(self.work, "scripts"))
        shutil.copy(os.path.join(ROOT, "scripts", "build_pyz.py"),
                    os.path.join(self.work, "scripts"))
        shutil.copy(SOURCE, os.path.join(self.work, "supervisor.py"))
        # python3 on PATH is the system's, and pyenv has none to offer:
        # build_pyz.py takes python3.X on PATH.
        pyenv = os.path.join(engine.top, "pyenv")
        os.makedirs(pyenv)
        self.env = dict(engine.env, PYENV_ROOT=pyenv,
                        PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")

    def run(self, code, timeout=300):
        """A block, as written, under bash -e, in the directory: its stdout."""
        result = subprocess.run(["bash", "-c", "set -e\n" + code], cwd=self.work, env=self.env,
                                universal_newlines=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, timeout=timeout)
        assert result.returncode == 0, (code, result.stdout, result.stderr)
        return result.stdout

    def receipt(self, name="receipt.json", directory=None):
        path = os.path.join(directory or self.receipts, name)
        assert os.path.exists(path), "no receipt %s" % path
        with open(path) as f:
            return json.load(f)

    def clear(self):
        for name in os.listdir(self.receipts):
            os.unlink(os.path.join(self.receipts, name))


@pytest.fixture(scope="session")
def recipe(engine):
    """The recipe's first two blocks: its Dockerfile, FROM a local image of
    that name, and the build line, as written."""
    kinds = [language for _, language, _ in BLOCKS]
    assert kinds[0] == "dockerfile" and kinds[1:] == ["sh"] * (len(kinds) - 1), kinds
    made = Recipe(engine)
    with open(os.path.join(made.work, "Dockerfile"), "w") as f:
        f.write(BLOCKS[0][2])
    started = time.monotonic()
    prebuilt = os.environ.get("TREEREAP_DOCKER_IMAGE")
    if prebuilt:
        # The guest: the image's files, the pyz at /opt/treereap.pyz
        # included, made on the host (50 s here), and the Dockerfile's
        # settings; the host runs the build line (20 s here).
        import_base(engine, IMAGE, prebuilt,
                    ["ENV PATH=/usr/bin:/bin"] + dockerfile_settings(BLOCKS[0][2]))
        TIMES["import"] = time.monotonic() - started
        return made
    import_base(engine, BASE)
    TIMES["import"] = time.monotonic() - started
    started = time.monotonic()
    made.run(block("docker build"))
    TIMES["build"] = time.monotonic() - started
    return made


@pytest.fixture(autouse=True)
def no_container_left(request):
    """After each test, the engine holds no container of it (the recipe
    removes its own; a failed test may not have)."""
    yield
    if "engine" in request.fixturenames:
        request.getfixturevalue("engine").remove_containers()


def host_only():
    if IN_GUEST:
        pytest.skip(HOST_ONLY)


def container_pid(engine, name):
    return int(engine.docker("inspect", "--format", "{{.State.Pid}}", name))


def pid_namespace(pid):
    return os.readlink("/proc/%d/ns/pid" % pid)


def in_namespace(namespace):
    """Every live process on the machine in that PID namespace."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink("/proc/%s/ns/pid" % entry) == namespace:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def unavailable(engine):
    """What a receipt's cgroup_unavailable says in a container that is not
    privileged."""
    return ("no cgroup v2 hierarchy is mounted" if engine.cgroup_version == "1" else
            "the cgroup v2 hierarchy at /sys/fs/cgroup is mounted read-only")


def started(engine, name, word="started", timeout=120):
    """Wait until the container's log says `word`."""
    assert wait_until(lambda: word in engine.docker("logs", name, check=False).stdout,
                      timeout=timeout, interval=0.1), engine.docker("logs", name, check=False)


# --- The recipe's blocks, as written --------------------------------------------------------

def test_the_recipes_image_as_pid_1(engine, recipe):
    """The Dockerfile and the build line, then the supervisor as the
    container's PID 1 (the image's ENTRYPOINT): the task's orphan drained,
    the receipt confirmed; the /proc walk, and cgroup_unavailable says why
    (cgroup v1 in the container on this hybrid host, cgroup2 read-only on
    a cgroup v2 one). Measured: from nothing (no engine) to this receipt."""
    said = recipe.run(block("the task ran"))
    TIMES["first receipt"] = time.monotonic() - TIMES["start"]
    assert said == "the task ran\n"
    receipt = recipe.receipt()
    assert receipt["cleanup_confirmed"] is True and receipt["exit_status"] == 0, receipt
    assert receipt["supervisor_pid"] == 1 and receipt["containment"] == "children", receipt
    assert unavailable(engine) in receipt["cgroup_unavailable"], receipt
    assert receipt["drained_count"] == 1 and receipt["timeout_s"] == 600, receipt


def test_a_rootfs_for_podman_from_the_recipes_image(engine, recipe):
    """The block that makes rootfs/ for Podman's --rootfs from the image:
    the supervisor runs in it (chroot, as the runtime would enter it) and
    no container is left."""
    try:
        recipe.run(block("docker export"))
        rootfs = os.path.join(recipe.work, "rootfs")
        result = subprocess.run(["chroot", rootfs, "python3", "/opt/treereap.pyz", "--version"],
                                stdout=subprocess.PIPE, universal_newlines=True, timeout=120)
        assert result.returncode == 0 and result.stdout.startswith("treereap "), result
        assert engine.docker("ps", "-aq").strip() == ""
    finally:
        shutil.rmtree(os.path.join(recipe.work, "rootfs"), ignore_errors=True)


def test_the_containers_own_limits_and_our_user(engine, recipe):
    """--read-only, --memory, --pids-limit and our --user nobody, in
    Docker's default /proc (/proc/sys read-only, /proc/keys masked, as the
    same image shows): the command runs as nobody, and the receipt is
    confirmed (it was 125 every time before 9ce1332)."""
    host_only()
    mounts = engine.docker("run", "--rm", "--network", "none", "--entrypoint", "cat", IMAGE,
                           "/proc/self/mountinfo")
    assert re.search(r" /proc/sys ro,", mounts) and re.search(r" /proc/keys ", mounts), mounts
    recipe.clear()
    assert recipe.run(block("id -un")) == "nobody\n"
    receipt = recipe.receipt()
    assert receipt["cleanup_confirmed"] is True and receipt["exit_status"] == 0, receipt
    assert receipt["user"] == {"uid": 65534, "gid": 65534} and receipt["drained_count"] == 1


def test_the_box_its_execs_and_their_stop_file(engine, recipe):
    """The box: an exec at once after `docker run -d`, another later, each
    with its receipt; then a run that watches a stop file in a directory
    mounted read-only, the stop file made, the run's receipt (stop_file,
    124), and the box removed: nothing of it left."""
    host_only()
    recipe.clear()
    said = recipe.run(block("exec-1.json"))  # the box's id, then what the execs said
    assert said.splitlines()[1:] == ["one", "two"], said
    namespace = pid_namespace(container_pid(engine, "box"))
    for name, drained in (("exec-1.json", 1), ("exec-2.json", 0)):
        receipt = recipe.receipt(name)
        assert receipt["cleanup_confirmed"] is True and receipt["exit_status"] == 0, receipt
        assert receipt["drained_count"] == drained and receipt["supervisor_pid"] != 1
    assert recipe.run(block("exec-3.json")).splitlines() == ["exit status 124", "box"]
    receipt = recipe.receipt("exec-3.json")
    assert receipt["stop_reason"] == "stop_file" and receipt["exit_status"] == 124, receipt
    assert receipt["cleanup_confirmed"] is True, receipt
    assert engine.docker("ps", "-aq") == ""
    assert wait_until(lambda: in_namespace(namespace) == [], timeout=30)


def test_prepare_cgroup_and_limits_in_an_exec(engine, recipe):
    """On cgroup v2, a privileged box (cgroup2 read-write), --prepare-cgroup
    as the first exec, then a run with --memory-max and --pids-max in a
    cgroup of its own, below treereap.init's parent."""
    if engine.cgroup_version != "2":
        pytest.skip("Docker gives containers cgroup v1 on this host: runs where it gives "
                    "cgroup v2 (the tests' guest); test_prepare_cgroup_on_cgroup_v1 is "
                    "this host's")
    recipe.clear()
    said = recipe.run(block("--prepare-cgroup"))  # the box's id, the run's word, rm's
    assert said.splitlines()[1:] == ["limited", "limits"], said
    receipt = recipe.receipt("limits.json")
    assert receipt["cleanup_confirmed"] is True and receipt["containment"] == "cgroup", receipt
    assert receipt["limits"]["set"]["memory.max"] == str(256 << 20), receipt
    assert receipt["limits"]["set"]["pids.max"] == "64", receipt
    # Its run's cgroup beside treereap.init, at the container's root: the
    # later exec started in treereap.init (else: 125, naming --prepare-cgroup).
    assert re.match(r"/treereap-\d+-[0-9a-f]+$", receipt["cgroup"]), receipt


def test_docker_stop_within_its_grace(engine, recipe):
    """`docker stop` with its default 10 s, the command ignoring SIGTERM:
    the image's --stop-timeout 10 ends the grace at 8 s, SIGKILLs, drains,
    and writes the receipt before Docker's SIGKILL: 137, signal SIGTERM,
    confirmed (a receipt at all says the supervisor finished)."""
    host_only()
    recipe.clear()
    code = block("docker stop job")
    said = recipe.run(code)
    assert said.split()[1:] == ["job", "137", "job"], said  # id, stop, exit status, rm
    receipt = recipe.receipt()
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM", receipt
    assert receipt["exit_status"] == 137 and receipt["return_code"] == -9, receipt
    assert receipt["cleanup_confirmed"] is True, receipt
    assert [s["step"] for s in receipt["ladder"]] == ["terminating", "killing", "draining"]
    # Ended within docker stop's grace, by the supervisor's own clock.
    last = receipt["ladder"][-1]
    assert last["start_s"] + last["duration_s"] - receipt["ladder"][0]["start_s"] < 10, receipt


# --- Around the recipe ------------------------------------------------------------------------

def test_docker_stop_without_stop_timeout_kills_the_supervisor_first(engine, recipe):
    """The PID-1 example as it was (-k 10, no --stop-timeout) under a grace
    shorter than its stop (docker stop -t 3; the same with -k 10 under the
    default 10 s): Docker's SIGKILL comes before the receipt. 137, no
    receipt, and nothing of the container left: what --stop-timeout
    cures."""
    host_only()
    recipe.clear()
    engine.docker("run", "-d", "--name", "job", "--network", "none", "-v",
                  recipe.receipts + ":/receipts", "--entrypoint", "python3", IMAGE,
                  "/opt/treereap.pyz", "--timeout", "10m", "-k", "10", "--receipt",
                  "/receipts/old.json", "--", "sh", "-c", "trap '' TERM; echo started; "
                  "exec sleep 600")
    started(engine, "job")
    namespace = pid_namespace(container_pid(engine, "job"))
    engine.docker("stop", "-t", "3", "job")
    assert engine.docker("inspect", "--format", "{{.State.ExitCode}}", "job").strip() == "137"
    assert not os.path.exists(os.path.join(recipe.receipts, "old.json"))
    assert in_namespace(namespace) == []


def test_under_docker_init(engine, recipe):
    """`docker run --init`: docker-init (tini) is PID 1 and passes `docker
    stop`'s SIGTERM to the supervisor, which stops the run: 143, the
    receipt confirmed, the supervisor not PID 1."""
    host_only()
    recipe.clear()
    engine.docker("run", "-d", "--init", "--name", "init", "--network", "none", "-v",
                  recipe.receipts + ":/receipts", IMAGE, "sh", "-c",
                  "setsid sleep 600 & echo started; exec sleep 600")
    started(engine, "init")
    engine.docker("stop", "init")
    assert engine.docker("inspect", "--format", "{{.State.ExitCode}}", "init").strip() == "143"
    receipt = recipe.receipt()
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM", receipt
    assert receipt["exit_status"] == 143 and receipt["supervisor_pid"] != 1, receipt
    assert receipt["cleanup_confirmed"] is True and receipt["drained_count"] == 2, receipt


@pytest.mark.parametrize("sig", ["KILL", "TERM"])
def test_docker_kill(engine, recipe, sig):
    """`docker kill` (SIGKILL to PID 1): the supervisor dies at once, no
    receipt, and the kernel ends the rest of the container with it.
    `docker kill -s TERM`: a stop with no SIGKILL after it, the receipt
    (143, confirmed)."""
    host_only()
    recipe.clear()
    engine.docker("run", "-d", "--name", "killed", "--network", "none", "-v",
                  recipe.receipts + ":/receipts", IMAGE, "sh", "-c",
                  "setsid sleep 600 & echo started; exec sleep 600")
    started(engine, "killed")
    namespace = pid_namespace(container_pid(engine, "killed"))
    engine.docker("kill", "-s", sig, "killed")
    assert engine.docker("wait", "killed").strip() == ("137" if sig == "KILL" else "143")
    assert in_namespace(namespace) == []
    if sig == "KILL":
        assert not os.path.exists(os.path.join(recipe.receipts, "receipt.json"))
    else:
        receipt = recipe.receipt()
        assert receipt["stop_reason"] == "signal" and receipt["exit_status"] == 143, receipt
        assert receipt["cleanup_confirmed"] is True and receipt["drained_count"] == 2


def test_the_containers_oom_kill_of_the_command_without_a_run_cgroup(engine, recipe):
    """--memory 64m, a command that touches 200 MiB: the container's OOM
    killer takes it (Docker's OOMKilled is true); the run has no cgroup of
    its own, so no memory.events of the run to read: oom_killed_by null
    (not observed), 137, return_code -9, confirmed."""
    host_only()
    recipe.clear()
    result = engine.docker(
        "run", "--name", "oom", "--network", "none", "--memory", "64m", "--memory-swap", "64m",
        "-v", recipe.receipts + ":/receipts", IMAGE, "python3", "-c",
        "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])", check=False)
    assert result.returncode == 137, (result.stdout, result.stderr)
    assert engine.docker("inspect", "--format", "{{.State.OOMKilled}}", "oom").strip() == "true"
    receipt = recipe.receipt()
    assert receipt["containment"] == "children" and receipt["oom_killed_by"] is None, receipt
    assert receipt["return_code"] == -9 and receipt["exit_status"] == 137, receipt
    assert receipt["stop_reason"] == "exit" and receipt["cleanup_confirmed"] is True, receipt


def test_a_command_that_forks_past_the_pids_limit(engine, recipe):
    """--pids-limit 16, a command that starts 40 sleeps: the fork past the
    limit fails in the command (sh: can't fork); the supervisor forks
    nothing after the start, drains the sleeps that did start, confirms."""
    host_only()
    recipe.clear()
    result = engine.docker("run", "--name", "pids", "--network", "none", "--pids-limit", "16",
                           "-v", recipe.receipts + ":/receipts", IMAGE, "sh", "-c",
                           "for i in $(seq 40); do sleep 600 & done; wait", check=False)
    assert "can't fork" in result.stderr, result.stderr
    receipt = recipe.receipt()
    assert receipt["cleanup_confirmed"] is True and receipt["error"] is None, receipt
    assert 5 <= receipt["drained_count"] < 16, receipt


def test_dockers_own_user(engine, recipe, tmp_path):
    """Docker's --user 65534: the supervisor itself runs as nobody (a
    receipts directory that uid may write), the /proc walk, confirmed."""
    host_only()
    receipts = str(tmp_path / "nobody")
    os.mkdir(receipts)
    os.chown(receipts, 65534, 65534)
    engine.docker("run", "--rm", "--name", "user", "--network", "none", "--user", "65534",
                  "-v", receipts + ":/receipts", IMAGE, "sh", "-c", "setsid sleep 600 & id -u")
    receipt = recipe.receipt(directory=receipts)
    assert receipt["cleanup_confirmed"] is True and receipt["user"] is None, receipt
    assert receipt["containment"] == "children" and receipt["drained_count"] == 1, receipt
    assert os.stat(os.path.join(receipts, "receipt.json")).st_uid == 65534


def test_docker_stop_of_a_box_whose_supervisor_was_execd(engine, recipe):
    """An exec'd supervisor never gets `docker stop`'s SIGTERM: PID 1 dies
    (here tini, under --init, passes SIGTERM to its sleep at once; a bare
    `sleep infinity` ignores it and dies of SIGKILL 10 s later, to the same
    end), and the kernel SIGKILLs every other process of the container: no
    receipt, `docker exec` gives 137, nothing of the run left."""
    host_only()
    recipe.clear()
    engine.docker("run", "-d", "--init", "--name", "box", "--network", "none", "-v",
                  recipe.receipts + ":/receipts", "--entrypoint", "sleep", IMAGE, "infinity")
    namespace = pid_namespace(container_pid(engine, "box"))
    execd = subprocess.Popen(
        ["docker", "exec", "box", "python3", "/opt/treereap.pyz", "-v", "--timeout", "10m",
         "--receipt", "/receipts/exec.json", "--", "sh", "-c", "setsid sleep 600 & sleep 600"],
        env=engine.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        universal_newlines=True)
    try:
        assert wait_until(lambda: len(in_namespace(namespace)) >= 5, timeout=60)
        engine.docker("stop", "box")
        out, err = execd.communicate(timeout=60)
    finally:
        if execd.poll() is None:
            execd.kill()
            execd.wait()
    assert execd.returncode == 137 and "started:" in err, err
    assert not os.path.exists(os.path.join(recipe.receipts, "exec.json"))
    assert in_namespace(namespace) == []


def test_prepare_cgroup_on_cgroup_v1(engine, recipe):
    """Where Docker gives containers cgroup v1 (this hybrid host), there is
    no cgroup2 in the container: --prepare-cgroup and a limit are refused
    (125, saying so), a run without one is held by the /proc walk."""
    if engine.cgroup_version != "1":
        pytest.skip("Docker gives containers cgroup v2 here: "
                    "test_prepare_cgroup_and_limits_in_an_exec is this engine's")
    engine.docker("run", "-d", "--name", "v1", "--network", "none", "--entrypoint", "sleep",
                  IMAGE, "infinity")
    for args in (["--prepare-cgroup"],
                 ["--timeout", "60", "--memory-max", "256M", "--", "true"]):
        result = engine.docker("exec", "v1", "python3", "/opt/treereap.pyz", *args,
                               check=False)
        assert result.returncode == 125, result.stderr
        assert "no cgroup v2 hierarchy is mounted" in result.stderr, result.stderr
