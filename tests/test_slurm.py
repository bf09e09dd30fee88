"""Under Slurm: the blocks of docs/recipes.md's "Under Slurm", read from the
document and run as written, against a one-node Slurm cluster on localhost
that this file starts for the session (each xdist worker its own) and stops
at its end: munged on a socket of its own with a key made for it, slurmctld
and slurmd on private ports, their state, spool and logs in a scratch
directory, ProctrackType=proctrack/cgroup and KillWait=5.

Slurm's stop, as seen here (Debian's 22.05): SIGTERM to every process of the
job, KillWait, SIGKILL; when the batch script's own process ends, SIGKILL to
whatever the job still runs. Each test checks the receipt the recipe
promises (or its absence where the recipe says none comes), the job's state
and exit code as Slurm reports them (`scontrol show job`: no slurmdbd here),
and that nothing is left: no slurmstepd, no process of the job, no cgroup of
the job's or of the run's.

Host only: on a hybrid host Slurm holds jobs in cgroup v1 (the freezer);
22.05's cgroup v2 plugin needs systemd over D-Bus (cgroup_v2.so links
libdbus-1 to start a scope), which the pure v2 guest has not. Missing Slurm
skips, unless SUPERVISOR_REQUIRE_ENGINES names slurm: then it fails.
"""
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import (CGROUP_ROOT, ENTRY, IS_ROOT, PY, ROOT, alive, descendants,
                      finish, read_lines_until, read_receipt, start_supervisor, wait_until)

RECIPE = os.path.join(ROOT, "docs", "recipes.md")
RUN_HERE = "<!-- not run: here; tests/test_slurm.py runs it under a one-node Slurm -->"
REQUIRED = "slurm" in os.environ.get("SUPERVISOR_REQUIRE_ENGINES", "").split(",")
KILL_WAIT = 5
FREEZER = "/sys/fs/cgroup/freezer"
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin:" + os.environ.get("PATH", "/usr/bin:/bin")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "scontrol", "squeue",
            "sinfo")
# A job is over when Slurm says so and its slurmstepd has gone.
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE")


def recipe_blocks():
    """The sh blocks of "Under Slurm" marked to run here: the batch script,
    its submission, and srun."""
    with open(RECIPE) as f:
        text = f.read()
    section = text.split("\n## Under Slurm\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(re.escape(RUN_HERE) + r"\n```sh\n(.*?)```", section, re.S)


def why_no_slurm():
    if not IS_ROOT:
        return "needs root (slurmctld and slurmd run as root here, munged as munge)"
    missing = [name for name in PROGRAMS if not shutil.which(name, path=SBIN_PATH)]
    if missing:
        return "needs Debian's slurm-wlm and munge (missing: %s)" % ", ".join(missing)
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "needs the munge user (Debian's munge package)"
    if not os.path.isdir(FREEZER):
        return ("needs the cgroup v1 freezer for proctrack/cgroup: Slurm 22.05's cgroup v2 "
                "plugin needs systemd over D-Bus, which a pure cgroup v2 guest has not")
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=treereap
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={top}/sock/munge.socket
StateSaveLocation={top}/state
SlurmdSpoolDir={top}/spool
SlurmctldPidFile={top}/slurmctld.pid
SlurmdPidFile={top}/slurmd.pid
SlurmctldLogFile={top}/log/slurmctld.log
SlurmdLogFile={top}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={top}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
KillWait={kill_wait}
MpiDefault=none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
# cgroup v1 named: autodetect picks it on this hybrid host anyway; nothing
# constrained, so only the freezer (proctrack) is used.
CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
"""


class Cluster(object):
    """munged, slurmctld and slurmd, children of this process, in a scratch
    directory; the node's name is this process's, so that its cgroups
    (FREEZER/slurm_NODE, Debian builds with multiple-slurmd) are its own."""

    def __init__(self):
        self.top = tempfile.mkdtemp(prefix="slurm-", dir="/tmp")
        os.chmod(self.top, 0o755)  # munged (as munge) must reach its socket's directory
        self.node = "treereap%d" % os.getpid()
        self.conf = os.path.join(self.top, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.daemons = []
        self.started_in = None

    def start(self):
        began = time.monotonic()
        self._start_munged()
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(top=self.top, host=socket.gethostname().split(".")[0],
                                      ctld_port=free_port(), slurmd_port=free_port(),
                                      node=self.node, cpus=os.cpu_count(), kill_wait=KILL_WAIT))
        with open(os.path.join(self.top, "cgroup.conf"), "w") as f:
            f.write(CGROUP_CONF)
        for name in ("state", "spool", "log"):
            os.mkdir(os.path.join(self.top, name))
        self._daemon([shutil.which("slurmctld", path=SBIN_PATH), "-D", "-f", self.conf],
                     "slurmctld.out")
        self._daemon([shutil.which("slurmd", path=SBIN_PATH), "-D", "-f", self.conf,
                      "-N", self.node], "slurmd.out")
        if not wait_until(lambda: self.sinfo() == "idle", timeout=60, interval=0.1):
            raise AssertionError("the node never came up: %s\n%s" % (self.sinfo(), self.logs()))
        self.started_in = time.monotonic() - began

    def _start_munged(self):
        munge = pwd.getpwnam("munge")
        keys, sock = os.path.join(self.top, "munge"), os.path.join(self.top, "sock")
        os.mkdir(keys, 0o700)
        os.mkdir(sock, 0o755)
        key = os.path.join(keys, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(os.urandom(1024))
        for path in (keys, sock, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self.munge_socket = os.path.join(sock, "munge.socket")
        self._daemon([shutil.which("munged", path=SBIN_PATH), "--foreground",
                      "--socket=" + self.munge_socket, "--key-file=" + key,
                      "--pid-file=" + os.path.join(keys, "munged.pid"),
                      "--log-file=" + os.path.join(keys, "munged.log"),
                      "--seed-file=" + os.path.join(keys, "munged.seed")], "munged.out",
                     user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
        assert wait_until(lambda: os.path.exists(self.munge_socket), timeout=30), self.logs()

    def _daemon(self, argv, out, **kwargs):
        with open(os.path.join(self.top, out), "wb") as f:
            self.daemons.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f,
                                                 stderr=subprocess.STDOUT, **kwargs))

    def sinfo(self):
        result = self.run(["sinfo", "-h", "-n", self.node, "-o", "%t"], check=False)
        return result.stdout.strip()

    def run(self, argv, check=True, **kwargs):
        result = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True, timeout=120, **kwargs)
        if check:
            assert result.returncode == 0, (argv, result.stdout, result.stderr)
        return result

    def job(self, job_id):
        """The job's fields, as `scontrol show job -o` gives them."""
        line = self.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", line))

    def stepds(self):
        return [pid for pid in descendants(os.getpid())
                if comm(pid) == "slurmstepd" and alive(pid)]

    def leftovers(self, before=()):
        """Our live descendants but the daemons (and slurmctld's own
        slurmscriptd) and those `before` the job (another test file's
        daemons in this worker: a dockerd): a job's processes, a slurmstepd
        (slurmd's children leave it, re-parented to us, a subreaper), a
        supervisor."""
        daemons = set(p.pid for p in self.daemons) | set(before)
        for daemon in self.daemons[:2]:  # munged, slurmctld (its slurmscriptd)
            daemons.update(descendants(daemon.pid))
        return [pid for pid in descendants(os.getpid()) if pid not in daemons and alive(pid)]

    def logs(self):
        said = []
        for name in ("munged.out", "slurmctld.out", "slurmd.out", "log/slurmctld.log",
                     "log/slurmd.log"):
            try:
                with open(os.path.join(self.top, name)) as f:
                    said.append("== %s\n%s" % (name, f.read()[-3000:]))
            except OSError:
                pass
        return "\n".join(said)

    def stop(self):
        for daemon in reversed(self.daemons):  # slurmd, slurmctld, then munged
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self._remove_cgroups()
        shutil.rmtree(self.top, ignore_errors=True)

    def _remove_cgroups(self):
        """The node's cgroups that Slurm left (its top one, in every v1
        hierarchy it used): empty by now, removed deepest first."""
        for hierarchy in os.listdir("/sys/fs/cgroup"):
            top = os.path.join("/sys/fs/cgroup", hierarchy, "slurm_" + self.node)
            if os.path.isdir(top):
                for path, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
                    os.rmdir(path)


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return None


@pytest.fixture(scope="session")
def slurm():
    reason = why_no_slurm()
    if reason:
        if REQUIRED:
            pytest.fail("SUPERVISOR_REQUIRE_ENGINES names slurm: " + reason)
        pytest.skip(reason)
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pyz(tmp_path_factory):
    """treereap.pyz, as the recipe's directory holds it: SUPERVISOR_ENTRY's
    when that is one, else built from supervisor.py once a session."""
    if ENTRY and ENTRY.endswith(".pyz"):
        return ENTRY
    path = str(tmp_path_factory.mktemp("pyz") / "treereap.pyz")
    # Compiled only for the python3 the jobs run (the recipe's), not for
    # every CPython found: 8 compilers on each worker cost seconds.
    subprocess.run([PY, os.path.join(ROOT, "scripts", "build_pyz.py"), "-q", "-o", path,
                    "--python", shutil.which("python3")],
                   check=True, stdin=subprocess.DEVNULL, timeout=300)
    return path


# The task, task/run.sh: it notes its cgroup (to find the run's, should its
# supervisor be killed) and that it started. IGNORES_TERM needs SIGKILL: a
# stop takes its whole grace; it notes each SIGTERM it gets (task/term).
IGNORES_TERM = """#!/bin/sh
trap 'touch term' TERM
trap '' INT
grep '^0::' /proc/self/cgroup > cgroup
touch started
while :; do sleep 0.2; done
"""
ENDS_ON_TERM = """#!/bin/sh
grep '^0::' /proc/self/cgroup > cgroup
touch started
exec sleep 600
"""


class Submission(object):
    """A directory as the recipe's reader has it: treereap.pyz and task/run.sh."""

    def __init__(self, cluster, top, pyz, task):
        self.cluster, self.top = cluster, str(top)
        self.before = set(descendants(os.getpid()))  # (none of the job's yet)
        os.makedirs(os.path.join(self.top, "task"))
        shutil.copy(pyz, os.path.join(self.top, "treereap.pyz"))
        run_sh = os.path.join(self.top, "task", "run.sh")
        with open(run_sh, "w") as f:
            f.write(task)
        os.chmod(run_sh, 0o755)

    def path(self, *parts):
        return os.path.join(self.top, *parts)

    def sh(self, code):
        """Run a block as written (with bash -e) in the directory."""
        result = subprocess.run(["bash", "-e", "-c", code], cwd=self.top, env=self.cluster.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        assert result.returncode == 0, (code, result.stdout, result.stderr)
        return result.stdout

    def submit(self, code):
        """Run a block that submits a batch job; the job's id."""
        said = self.sh(code)
        found = re.search(r"Submitted batch job (\d+)", said)
        assert found, said
        return int(found.group(1))

    def wait_started(self, job_id=None):
        started = wait_until(lambda: os.path.exists(self.path("task", "started")), timeout=120)
        assert started, (self.cluster.job(job_id) if job_id else None, self.output(job_id),
                         self.cluster.logs())

    def output(self, job_id):
        try:
            with open(self.path("slurm-%d.out" % job_id)) as f:
                return f.read()
        except (OSError, TypeError):
            return None

    def receipt(self, name):
        path = self.path("receipts", name)
        return read_receipt(path) if os.path.exists(path) else None

    def wait_ended(self, job_id, timeout=120):
        """Until Slurm says the job is over and its slurmstepd is gone;
        (its fields, seconds waited)."""
        began = time.monotonic()
        cluster = self.cluster
        ended = wait_until(lambda: cluster.job(job_id).get("JobState") in ENDED
                           and not cluster.stepds(), timeout=timeout, interval=0.1)
        assert ended, (cluster.job(job_id), self.output(job_id), cluster.logs())
        return cluster.job(job_id), time.monotonic() - began

    def assert_nothing_left(self, job_id=None, receipt=None):
        """No process of the job, no slurmstepd, no cgroup of the job's; the
        run's cgroup gone (removed here when a killed supervisor left it)."""
        cluster = self.cluster
        assert wait_until(lambda: not cluster.leftovers(self.before), timeout=30), \
            [(pid, comm(pid)) for pid in cluster.leftovers(self.before)]
        if job_id is not None:
            job_cgroup = os.path.join(FREEZER, "slurm_" + cluster.node, "uid_0",
                                      "job_%d" % job_id)
            assert wait_until(lambda: not os.path.exists(job_cgroup), timeout=30), job_cgroup
        if receipt is not None and receipt.get("cgroup"):
            assert not os.path.exists(CGROUP_ROOT + receipt["cgroup"]), receipt["cgroup"]
        left = self._runs_cgroup()
        if left and os.path.isdir(left):  # a SIGKILLed supervisor's: empty, since Slurm
            with open(os.path.join(left, "cgroup.procs")) as f:  # killed all it held
                assert f.read().split() == [], left
            os.rmdir(left)

    def _runs_cgroup(self):
        try:
            with open(self.path("task", "cgroup")) as f:
                relative = f.read().strip().partition("::")[2]
        except OSError:
            return None
        return CGROUP_ROOT + relative if relative.startswith("/treereap-") else None


@pytest.fixture
def blocks():
    found = recipe_blocks()
    assert len(found) == 3, found  # the batch script, its submission, srun
    return found


def confirmed(receipt, reason, sig=None):
    assert receipt is not None, "no receipt"
    assert receipt["cleanup_confirmed"] is True, receipt
    assert receipt["stop_reason"] == reason and receipt["signal"] == sig, receipt
    assert receipt["survivors"] == [] and receipt["drained_count"] >= 1, receipt
    return receipt


@pytest.mark.parametrize("task", ["ignores-term", "ends-on-term"])
def test_the_batch_script_under_scancel(slurm, pyz, tmp_path, blocks, task):
    """The script and its submission as written; scancel: Slurm's SIGTERM
    to every process of the job, KillWait, SIGKILL. A command that ignores
    SIGTERM: the supervisor's stop takes its --stop-timeout (KillWait, read
    by the script), needs SIGKILL (137), and its receipt is on disk before
    Slurm's SIGKILL. One that ends on it: 143 (Slurm signals it too, so its
    death may be seen before the supervisor's SIGTERM is read: `exit`)."""
    script, submit, _ = blocks
    job = Submission(slurm, tmp_path, pyz, IGNORES_TERM if task == "ignores-term" else ENDS_ON_TERM)
    job.sh(script)
    job_id = job.submit(submit)
    job.wait_started(job_id)
    slurm.run(["scancel", str(job_id)])
    fields, _ = job.wait_ended(job_id)
    receipt = job.receipt("%d.json" % job_id)
    if task == "ignores-term":
        assert (fields["JobState"], fields["ExitCode"]) == ("CANCELLED", "137:0"), fields
        confirmed(receipt, "signal", "SIGTERM")
        assert receipt["exit_status"] == 137 and receipt["timeout_s"] == 55 * 60, receipt
        # --stop-timeout 5: SIGKILL and the drain ended by 4.5 s after the signal.
        assert receipt["cleanup_s"] <= KILL_WAIT - 0.5, receipt
        assert os.path.exists(job.path("task", "term"))  # the command got SIGTERM
    else:
        assert (fields["JobState"], fields["ExitCode"]) == ("CANCELLED", "143:0"), fields
        assert receipt is not None and receipt["cleanup_confirmed"] is True, receipt
        assert receipt["exit_status"] == 143 and receipt["return_code"] == -15, receipt
        assert (receipt["stop_reason"], receipt["signal"]) in (
            ("signal", "SIGTERM"), ("exit", None)), receipt
    job.assert_nothing_left(job_id, receipt)


def test_slurms_time_limit_and_its_warning(slurm, pyz, tmp_path, blocks):
    """Two jobs as written (sbatch --time=60 ... 55m), whose time limits an
    administrator brings forward (scontrol update EndTime), so that Slurm
    acts at its next periodic check, within 30 s, rather than in an hour:
    one to now (the time limit: Slurm's SIGTERM to all, KillWait), one to
    100 s from now, inside the script's --signal=B:TERM@120 (SIGTERM to the
    supervisor alone, before the limit). Both receipts confirmed, each stop
    within --stop-timeout."""
    script, submit, _ = blocks
    jobs = {}
    try:
        for name in ("limit", "warning"):
            job = Submission(slurm, tmp_path / name, pyz, IGNORES_TERM)
            job.sh(script)
            jobs[name] = (job, job.submit(submit))
            job.wait_started(jobs[name][1])
        bring_forward(slurm, jobs["limit"][1], 0)
        bring_forward(slurm, jobs["warning"][1], 100)
        check_the_limit_and_its_warning(jobs)
    finally:  # (a job left running would hold the node for the next tests)
        for _, job_id in jobs.values():
            slurm.run(["scancel", str(job_id)], check=False)


def bring_forward(slurm, job_id, seconds):
    """scontrol update EndTime=now+SECONDS: Slurm refuses an end time that
    its own clock has passed ("Invalid time specified"), which a loaded
    controller's may have by the time it reads the request: a second more
    each time, five times at most."""
    for extra in range(5):
        result = slurm.run(["scontrol", "update", "JobId=%d" % job_id,
                            "EndTime=now+%d" % (seconds + extra)], check=False)
        if result.returncode == 0 or "Invalid time" not in result.stderr:
            break
    assert result.returncode == 0, result


def check_the_limit_and_its_warning(jobs):
    job, job_id = jobs["limit"]
    fields, _ = job.wait_ended(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("TIMEOUT", "137:0"), fields
    receipt = confirmed(job.receipt("%d.json" % job_id), "signal", "SIGTERM")
    assert receipt["cleanup_s"] <= KILL_WAIT - 0.5, receipt
    job.assert_nothing_left(job_id, receipt)

    job, job_id = jobs["warning"]
    fields, _ = job.wait_ended(job_id)
    # Ended by the supervisor's stop, before the limit: its status, not TIMEOUT.
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "137:0"), fields
    receipt = confirmed(job.receipt("%d.json" % job_id), "signal", "SIGTERM")
    assert receipt["cleanup_s"] <= KILL_WAIT - 0.5, receipt  # --stop-timeout's, not -k's
    job.assert_nothing_left(job_id, receipt)


def test_the_tools_deadline_first(slurm, pyz, tmp_path, blocks):
    """The script as written, given a deadline of 2 s under a time limit of
    a minute: the deadline's stop, 124, and the job FAILED with 124."""
    script = blocks[0]
    job = Submission(slurm, tmp_path, pyz, ENDS_ON_TERM)
    job.sh(script)
    job_id = job.submit("sbatch --time=1 task.sbatch 2")
    fields, _ = job.wait_ended(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "124:0"), fields
    receipt = confirmed(job.receipt("%d.json" % job_id), "timeout")
    assert receipt["exit_status"] == 124 and receipt["timed_out"] is True, receipt
    job.assert_nothing_left(job_id, receipt)


def test_a_slurm_stop_cuts_the_deadlines_long_grace(slurm, pyz, tmp_path, blocks):
    """The deadline's stop gives a command that ignores SIGTERM -k 60; a
    scancel during that grace cuts it to --stop-timeout (KillWait): the
    receipt, still the deadline's, is on disk before Slurm's SIGKILL."""
    script = blocks[0]
    job = Submission(slurm, tmp_path, pyz, IGNORES_TERM)
    job.sh(script)
    job_id = job.submit("sbatch --time=1 task.sbatch 2")
    job.wait_started(job_id)
    assert wait_until(lambda: os.path.exists(job.path("task", "term")), timeout=60)
    slurm.run(["scancel", str(job_id)])
    fields, _ = job.wait_ended(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("CANCELLED", "137:0"), fields
    receipt = confirmed(job.receipt("%d.json" % job_id), "timeout")
    assert receipt["exit_status"] == 137 and receipt["cleanup_timeout_s"] == 60, receipt
    assert receipt["cleanup_s"] < 30, receipt  # -k 60's grace was cut
    job.assert_nothing_left(job_id, receipt)


def test_without_exec_there_is_no_receipt(slurm, pyz, tmp_path, blocks):
    """The failure the recipe's exec avoids: the same script with the
    supervisor as the batch shell's child. scancel's SIGTERM kills the
    shell at once; Slurm then SIGKILLs the rest, the supervisor mid-stop:
    no receipt, and the job's ExitCode is the shell's death (0:15). Slurm's
    cgroup still ends every process; the run's cgroup, empty, is left (the
    next supervisor there would remove it; this test does)."""
    script, submit, _ = blocks
    assert script.count("exec python3 ") == 1
    job = Submission(slurm, tmp_path, pyz, IGNORES_TERM)
    job.sh(script.replace("exec python3 ", "python3 "))
    job_id = job.submit(submit)
    job.wait_started(job_id)
    slurm.run(["scancel", str(job_id)])
    fields, _ = job.wait_ended(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("CANCELLED", "0:15"), fields
    assert job.receipt("%d.json" % job_id) is None
    job.assert_nothing_left(job_id)


def start_srun(job, code):
    """The srun block as written, in the background, and its srun's pid
    once the task has started."""
    proc = subprocess.Popen(["bash", "-e", "-c", code], cwd=job.top, env=job.cluster.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        job.wait_started()
        # The topmost srun (bash execs it, as its last command; srun 22.05
        # forks a child srun of its own: a user's Ctrl-C reaches the first).
        sruns = [pid for pid in [proc.pid] + descendants(proc.pid) if comm(pid) == "srun"]
        assert sruns, [(pid, comm(pid)) for pid in [proc.pid] + descendants(proc.pid)]
    except AssertionError:
        proc.kill()
        finish(proc)
        raise
    return proc, sruns[0]


def srun_job_id(cluster):
    listed = cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    assert len(listed) == 1, listed
    return int(listed[0])


@pytest.mark.parametrize("stop", ["scancel", "ctrl-c"])
def test_srun(slurm, pyz, tmp_path, blocks, stop):
    """The srun block as written: the supervisor is the step's task. scancel
    stops the step as a batch job's (SIGTERM, KillWait, SIGKILL); with -X,
    one Ctrl-C (SIGINT to srun) reaches the supervisor as SIGINT. Either
    way: the receipt, within --stop-timeout, and srun's status is the
    supervisor's."""
    job = Submission(slurm, tmp_path, pyz, IGNORES_TERM)
    proc, srun = start_srun(job, blocks[2])
    job_id = srun_job_id(slurm)
    if stop == "scancel":
        slurm.run(["scancel", str(job_id)])
    else:
        os.kill(srun, signal.SIGINT)
    status, out, err = finish(proc, timeout=120)
    assert status == 137, (status, out, err)
    fields, _ = job.wait_ended(job_id)
    assert fields["ExitCode"] == "137:0", fields
    receipt = confirmed(job.receipt("srun.json"), "signal",
                        "SIGTERM" if stop == "scancel" else "SIGINT")
    assert receipt["cleanup_s"] <= KILL_WAIT - 0.5, receipt
    job.assert_nothing_left(job_id, receipt)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGQUIT"])
def test_srun_stopped_by_a_signal_kills_the_supervisor(slurm, pyz, tmp_path, blocks, sig):
    """What the recipe warns of: srun takes SIGTERM, SIGHUP or SIGQUIT as
    "forcing job termination" and SIGKILLs the tasks, the supervisor with
    them: no receipt (Slurm's cgroup still ends every process)."""
    job = Submission(slurm, tmp_path, pyz, IGNORES_TERM)
    proc, srun = start_srun(job, blocks[2])
    job_id = srun_job_id(slurm)
    os.kill(srun, getattr(signal, sig))
    status, out, err = finish(proc, timeout=120)
    assert "forcing job termination" in err, err
    job.wait_ended(job_id)
    assert job.receipt("srun.json") is None
    job.assert_nothing_left(job_id)


def test_sigalrm_is_a_stop_by_signal_within_the_stop_timeout(paths):
    """SIGALRM is not timeout(1)'s "deadline now" here (a deliberate difference,
    docs/reference.md): it is a stop from outside like the others, so
    #SBATCH --signal=B:ALRM@N gets --stop-timeout's grace, not -k's. A long
    grace before Slurm's limit comes from --timeout set before --time (the
    recipe's arithmetic), which this keeps true."""
    proc = start_supervisor(*paths.options(timeout=600, cleanup=30) + [
        "--stop-timeout", "5", "--", "sh", "-c", "trap '' TERM; echo ready; exec sleep 600"])
    read_lines_until(proc.stdout, "ready")
    proc.send_signal(signal.SIGALRM)
    status, out, err = finish(proc, timeout=60)
    receipt = read_receipt(paths.receipt)
    assert (status, receipt["stop_reason"], receipt["signal"]) == (137, "signal", "SIGALRM"), \
        (status, receipt, err)
    # -k's grace alone would be 30 s of SIGTERM ignored: --stop-timeout cut it
    assert receipt["cleanup_confirmed"] and receipt["cleanup_s"] < 30, receipt
