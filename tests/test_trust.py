"""A hostile command, or a hostile neighbour, cannot make the receipt lie:
--user, a receipt path nobody can hijack, no stale receipt, a /proc nobody
can fake, a stop file that is always heard, a deadline that comes first.

Tests that need root (--user, mounts in a private mount namespace, PID
namespaces, mknod) skip elsewhere; CI runs as root. The unprivileged user is
`nobody`; pyenv's interpreters live under /root (0700), so what runs as
nobody runs under an interpreter nobody can execute (NOBODY_PY).
"""
import atexit
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import (
    HAS_CGROUP, IS_ROOT, PY, SUPERVISOR, alive, finish, kill_all, plain_signals,
    proc_stat, read_lines, read_lines_until, read_receipt, run, run_supervisor, spawn,
    start_supervisor, stop_noticed_after, supervisor_cmd, wait_until,
)

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (--user, mounts, mknod)")
NOBODY = 65534
AS_NOBODY = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]


def _python_for_nobody():
    """An interpreter the user nobody can run (pyenv's are under /root)."""
    if not IS_ROOT:
        return None
    for candidate in (PY, "/usr/bin/python3", "/usr/local/bin/python3"):
        # From a shell already running as nobody: setpriv itself may exec what
        # nobody's own processes then cannot.
        if os.path.exists(candidate) and subprocess.call(
                AS_NOBODY + ["sh", "-c", '"$0" -c pass', candidate],
                stderr=subprocess.DEVNULL) == 0:
            return candidate
    raise AssertionError("no Python that the user nobody can run: install python3 outside /root")


NOBODY_PY = _python_for_nobody()


def _supervisor_for_nobody():
    """supervisor.py where nobody can read it: this checkout's, or else a
    copy in a directory of its own, removed when the tests end (a clone
    under /root, or in a 0700 folder from mktemp -d, is out of its reach)."""
    if not IS_ROOT or subprocess.call(AS_NOBODY + ["test", "-r", SUPERVISOR]) == 0:
        return SUPERVISOR
    directory = tempfile.mkdtemp(prefix="treereap-for-nobody-")
    atexit.register(shutil.rmtree, directory, True)
    os.chmod(directory, 0o755)
    copy = shutil.copy(SUPERVISOR, directory)
    os.chmod(copy, 0o644)
    return copy


NOBODY_SUPERVISOR = _supervisor_for_nobody()


def one_line(stderr, *fragments):
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# --- 1, 2. The receipt path: never followed, never a device ------------------------------------

@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
def test_a_symlink_at_the_receipt_path_is_refused_and_left_as_it_is(paths, tmp_path, dangling):
    """A symlink is no receipt: refused, never followed, never replaced (the
    rename would destroy a link such as /dev/stdout), nothing made."""
    victim = tmp_path / "nowhere" / "deeper" / "file" if dangling else tmp_path / "victim"
    if not dangling:
        victim.write_text("precious\n")
    paths.receipt.parent.mkdir()
    paths.receipt.symlink_to(victim)
    result = run_supervisor(*paths.options() + ["--", "touch", paths.work / "ran"])
    assert result.returncode == 125
    one_line(result.stderr, "--receipt", "a symlink is there")
    assert paths.receipt.is_symlink() and not (paths.work / "ran").exists()
    assert dangling or victim.read_text() == "precious\n"
    assert not (tmp_path / "nowhere").exists()


def test_a_fifo_at_the_receipt_path_is_refused(paths):
    paths.receipt.parent.mkdir()
    os.mkfifo(str(paths.receipt))
    result = run_supervisor(*paths.options() + ["--", "touch", paths.work / "ran"])
    assert result.returncode == 125
    one_line(result.stderr, "--receipt", "FIFO")
    assert stat.S_ISFIFO(os.lstat(str(paths.receipt)).st_mode)
    assert not (paths.work / "ran").exists()


@needs_root
def test_a_device_at_the_receipt_path_is_refused(paths):
    paths.receipt.parent.mkdir()
    os.mknod(str(paths.receipt), 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null
    result = run_supervisor(*paths.options() + ["--", "true"])
    assert result.returncode == 125
    one_line(result.stderr, "--receipt", "device")
    assert stat.S_ISCHR(os.lstat(str(paths.receipt)).st_mode)


# --- 3. No stale receipt -------------------------------------------------------------------------

def test_an_earlier_receipt_is_gone_when_this_run_writes_none(paths):
    """The command kills its supervisor: this run writes no receipt, and the
    earlier run's must not pass for this one's."""
    paths.receipt.parent.mkdir()
    paths.receipt.write_text(json.dumps({"cleanup_confirmed": True}))
    proc = start_supervisor(*paths.options() + ["--", "sh", "-c", "echo started; kill -9 $PPID"])
    read_lines_until(proc.stdout, "started")
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not paths.receipt.exists()
    assert [p.name for p in paths.receipt.parent.iterdir()] == []


# --- 4. Never a false confirmation ---------------------------------------------------------------

FLIPPER = r"""
import os, resource, signal, sys, time
supervisor = int(sys.argv[1])
if os.fork():
    os._exit(0)
os.setsid()
said = False
while True:  # a kept service starving its supervisor of descriptors
    try:
        resource.prlimit(supervisor, resource.RLIMIT_NOFILE, (4, 4))
    except OSError:
        break
    if not said:  # once it took: from now on every look of the supervisor fails
        print("service", os.getpid(), flush=True)
        said = True
    time.sleep(0.001)
signal.pause()
"""


def test_a_look_that_fails_is_never_an_empty_one(paths):
    """A kept service (same uid) flips the supervisor's RLIMIT_NOFILE: /proc
    reads fail with EMFILE, and the cleanup of a member that ignores SIGTERM
    must not be confirmed. Writing the receipt needs a descriptor too: no
    receipt (not confirmed), or one that says not confirmed, and why."""
    script = ("sh -c 'trap \"\" TERM; echo $$ > member; exec sleep 300' & "
              "while [ ! -s member ]; do sleep 0.01; done; "
              "%s -c '%s' $PPID > service; trap '' TERM; "
              "while [ ! -s service ]; do sleep 0.01; done; exit 0"
              % (shlex.quote(PY), FLIPPER.replace("'", "'\"'\"'")))
    proc = start_supervisor(*paths.options(cleanup=0.5) + ["--", "sh", "-c", script])
    status, out, err = finish(proc)
    pids = {"member": (paths.work / "member").read_text().split()[0],
            "service": (paths.work / "service").read_text().split()[1]}
    try:
        assert status == 125, err
        assert "Too many open files (ulimit -n)" in err, err
        if paths.receipt.exists():
            receipt = read_receipt(paths.receipt)
            assert receipt["cleanup_confirmed"] is False and receipt["exit_status"] == 125
        assert "0 process(es)" not in err
        # Killed by the stop (its SIGKILL may land after the supervisor's exit, loaded).
        assert wait_until(lambda: not alive(int(pids["member"])), timeout=10)
    finally:
        kill_all([int(pids["service"])])


@needs_root
def test_a_proc_with_hidepid_is_refused_when_it_hides_processes(open_dir):
    script = ("mount -t proc -o hidepid=2 proc /proc && exec %s %s %s --timeout 5 --workdir %s "
              "-- true" % (" ".join(AS_NOBODY), shlex.quote(NOBODY_PY),
                           shlex.quote(NOBODY_SUPERVISOR), open_dir["work"]))
    result = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            cwd=open_dir["work"])
    assert result.returncode == 125
    one_line(result.stderr, "hidepid")


@needs_root
def test_a_proc_that_is_not_procfs_is_refused(open_dir):
    script = "mount -t tmpfs tmpfs /proc && exec %s --timeout 5 -- true" % shlex.join(
        [PY, SUPERVISOR])
    result = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            cwd=open_dir["work"])
    assert result.returncode == 125
    one_line(result.stderr, "not procfs")


@needs_root
@pytest.mark.parametrize("stop", [False, True])
def test_a_tmpfs_mounted_over_proc_by_the_command_changes_nothing(paths, stop):
    """A root command hides the run from /proc: the supervisor reads the
    /proc it opened at start, and drains what was left, natural exit or not."""
    script = ("sh -c 'trap \"\" TERM; echo member $$ >&3; exec sleep 300' & "
              "setsid sh -c 'echo tool $$ >&3; exec sleep 300' & "
              "while [ $(wc -l < pids) -lt 2 ]; do sleep 0.01; done; "
              "mount -t tmpfs tmpfs /proc; echo hidden; "
              + ("exec sleep 300" if stop else "exit 0"))
    options = paths.options(cleanup=0.5, stop=stop)
    pids_file = paths.work / "pids"
    inner = supervisor_cmd(*options + ["--", "sh", "-c", script])
    proc = spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'exec 3>"$0"; exec "$@"', str(pids_file)] + inner)
    read_lines_until(proc.stdout, "hidden")
    if stop:
        paths.stop.write_text("")
    status, _, err = finish(proc)
    pids = dict(line.split() for line in pids_file.read_text().splitlines())
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True, err
    assert not alive(int(pids["member"])) and not alive(int(pids["tool"]))
    assert receipt["preserved"] == []


# --- 7, 8, 9. A receipt nobody can forge or move ---------------------------------------------------

def test_a_planted_temporary_name_cannot_block_the_receipt(paths):
    """The temporary name is unguessable: planting the old predictable one
    (.receipt.json.PID.tmp) and a forged receipt changes nothing."""
    forged = json.dumps({"cleanup_confirmed": True, "exit_status": 0, "forged": True})
    script = ("d=%s; echo '%s' > $d/receipt.json; echo x > $d/.receipt.json.$PPID.tmp; exit 3"
              % (paths.receipt.parent, forged))
    paths.receipt.parent.mkdir()
    result = run_supervisor(*paths.options() + ["--", "sh", "-c", script])
    assert result.returncode == 3, result.stderr
    receipt = read_receipt(paths.receipt)
    assert "forged" not in receipt and receipt["exit_status"] == 3


@needs_root
def test_a_temporary_file_left_by_an_earlier_pid_1_does_not_block_the_receipt(paths):
    """PID 1 of a container always has pid 1: a temporary file left by a
    SIGKILL during an earlier write must not block every later receipt."""
    paths.receipt.parent.mkdir()
    stray = paths.receipt.parent / ".receipt.json.1.tmp"
    stray.write_text("left by an earlier run\n")
    argv = ["unshare", "--pid", "--fork", "--mount-proc"] + supervisor_cmd(
        *paths.options() + ["--", "true"])
    result = run(argv)
    assert result.returncode == 0, result.stderr
    assert read_receipt(paths.receipt)["supervisor_pid"] == 1


def test_a_dangling_symlink_on_the_receipts_directory_path_is_refused(paths, tmp_path):
    """A directory of the receipt's path that is a dangling symlink would be
    made at the end, and fail then: refused at the start, nothing run."""
    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    result = run_supervisor(*paths.options() + ["--", "touch", paths.work / "ran"])
    assert result.returncode == 125
    one_line(result.stderr, "--receipt", "dangling symlink")
    assert not (paths.work / "ran").exists() and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("made", [True, False], ids=["there", "made at the end"])
def test_a_receipt_directory_swapped_for_a_symlink_cannot_move_the_receipt(paths, tmp_path,
                                                                           made):
    """The directory is held open from the start: swapped during the run for
    a symlink into the workdir, the receipt still lands where it was meant to
    (outside the workdir), and nothing lands inside. One the supervisor is
    to make at the end, made as a symlink meanwhile, is not followed: no
    receipt (not confirmed), nothing inside."""
    out = paths.receipt.parent
    if not made:
        result = run_supervisor(*paths.options() + [
            "--", "sh", "-c", "ln -s %s %s && exit 4" % (paths.work, out)])
        assert result.returncode == 125 and "--receipt" in result.stderr
        assert not (paths.work / "receipt.json").exists() and out.is_symlink()
        return
    out.mkdir()
    script = "mv %s %s/moved && ln -s %s %s && exit 4" % (out, tmp_path, paths.work, out)
    result = run_supervisor(*paths.options() + ["--", "sh", "-c", script])
    assert result.returncode == 4, result.stderr
    assert not (paths.work / "receipt.json").exists()
    assert json.loads((tmp_path / "moved" / "receipt.json").read_text())["exit_status"] == 4


def test_the_receipt_goes_through_a_random_name(paths, tmp_path):
    """The receipt is written under a random name (O_EXCL) and renamed: it
    lands, in the directories made for it, and nothing else is left."""
    out = tmp_path / "new" / "dir"
    code = ("import supervisor as s\n"
            "r = s.supervise(['sh', '-c', 'exit 6'], 30, 2, workdir=%r)\n"
            "s.write_receipt(r, %r)\n" % (str(paths.work), str(out / "receipt.json")))
    subprocess.check_call([PY, "-c", code], cwd=SUPERVISOR.rsplit("/", 1)[0], timeout=60)
    assert os.listdir(str(out)) == ["receipt.json"]
    assert read_receipt(out / "receipt.json")["exit_status"] == 6


def test_a_full_stderr_never_holds_the_receipt_back(paths):
    """Nobody reads the supervisor's stderr, which the command filled: with
    -v there is a line to write at the stop and after it, yet the receipt is
    on disk first, and the lines that stderr cannot take are dropped."""
    fill = ("import os, time; os.set_blocking(2, False)\n"
            "try:\n"
            "    while True: os.write(2, b'x' * 4096)\n"
            "except BlockingIOError: pass\n"
            "print('full', flush=True); time.sleep(60)\n")
    proc = start_supervisor(*paths.options(cleanup=1, stop=True) + ["-v", "--", PY, "-c", fill])
    try:
        read_lines_until(proc.stdout, "full")
        paths.stop.write_text("")
        assert wait_until(paths.receipt.exists, timeout=60)  # stderr still unread
        receipt = read_receipt(paths.receipt)
        assert receipt["stop_reason"] == "stop_file" and receipt["cleanup_confirmed"] is True
    finally:
        _, err = proc.communicate(timeout=120)
    if err.startswith(b"treereap: started: "):  # (-v's first line, if stderr took it)
        err = err.split(b"\n", 1)[1]
    assert proc.returncode == 124 and err.startswith(b"x" * 1000)


# --- 10. The caller's jobs stay the caller's -------------------------------------------------------

@pytest.mark.parametrize("forced", [False, True])
def test_orphans_of_the_callers_jobs_are_neither_kept_nor_killed(paths, forced):
    """A job of the caller's shell (same process group as the shell, which
    execs the supervisor) orphans a child during the run: adopted, it is
    never preserved, never signalled, before or after the stop. It cannot be
    told from a process of the run that joined the job's group, so it is
    listed as unattributed and the cleanup is not confirmed."""
    # The command (in the workdir) waits until the orphan is the supervisor's.
    adopted = ('until [ -s orphan ] && [ "$(cut -d" " -f4 /proc/$(cat orphan)/stat)" = $PPID ]; '
               'do sleep 0.01; done; exit 0')
    if forced:  # the orphan is made after the stop decision, during the grace
        command = "trap 'touch term' TERM; touch started; until [ -e term ]; do sleep 0.01; done; "
        wait_for, options = "term", paths.options(cleanup=30, stop=True)
    else:  # while the command runs
        command, wait_for, options = "touch started; ", "started", paths.options()
    inner = supervisor_cmd(*options + ["--", "sh", "-c", command + adopted])
    job = "until [ -e %s/%s ]; do sleep 0.01; done; sleep 300 >/dev/null 2>&1 & echo $! > %s" % (
        paths.work, wait_for, paths.work / "orphan")
    proc = spawn(["sh", "-c", "(%s) & exec %s" % (job, " ".join(shlex.quote(str(a)) for a in inner))])
    if forced:
        assert wait_until((paths.work / "started").exists, timeout=60)
        paths.stop.write_text("")
    status, _, err = finish(proc)
    result = subprocess.CompletedProcess(proc.args, status, "", err)
    orphan = int((paths.work / "orphan").read_text())
    try:
        assert result.returncode == 125, result.stderr
        assert "caller's jobs" in result.stderr and "--new-session" in result.stderr
        receipt = read_receipt(paths.receipt)
        assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is False
        assert [p["pid"] for p in receipt["unattributed"]] == [orphan]
        assert receipt["stop_reason"] == ("stop_file" if forced else "exit")
        assert alive(orphan) and proc_stat(orphan)[0] != "T"
    finally:
        kill_all([orphan])


# --- 11. A directory we may write but not read ----------------------------------------------------

@needs_root
def test_a_receipt_directory_writable_but_not_readable_works(open_dir):
    box = os.path.join(open_dir["top"], "dropbox")
    os.mkdir(box)
    os.chown(box, NOBODY, NOBODY)
    os.chmod(box, 0o333)  # write and search, no read
    receipt = os.path.join(box, "receipt.json")
    argv = AS_NOBODY + [NOBODY_PY, NOBODY_SUPERVISOR, "--timeout", "5", "--workdir", open_dir["work"],
                        "--receipt", receipt, "--", "true"]
    result = run(argv, cwd=open_dir["work"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    with open(receipt) as f:
        assert json.load(f)["cleanup_confirmed"] is True


# --- 12. preserved is true when written -------------------------------------------------------------

def test_preserved_lists_only_services_alive_when_the_receipt_is_written(paths):
    """Everything kept (an exit 0, --preserve-descendants-on-success): the
    receipt lists what is alive when it is written, each with its start
    time and name; a service that ended before is not listed."""
    script = ("setsid -f sh -c 'echo keeps $$; exec sleep 300'; "
              "setsid -f sh -c 'echo quits $$; exec sleep 300'; read line; exit 0")
    proc = start_supervisor(*paths.options() + ["--preserve-descendants-on-success", "--", "sh",
                                                "-c", script], stdin=subprocess.PIPE)
    lines = read_lines(proc.stdout, 2)  # keeps, quits: in any order
    pids = dict(line.split() for line in lines)
    keeps, quits = int(pids["keeps"]), int(pids["quits"])
    os.kill(quits, signal.SIGTERM)
    assert wait_until(lambda: not alive(quits))
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    status, _, err = finish(proc)
    try:
        assert status == 0, err
        receipt = read_receipt(paths.receipt)
        assert [p["pid"] for p in receipt["preserved"]] == [keeps]
        assert receipt["preserved"][0]["start_time"] == proc_stat(keeps)[4]
        assert receipt["preserved"][0]["name"] == "sleep"
    finally:
        kill_all([keeps])


# --- 13. The deadline comes first ------------------------------------------------------------------

def test_a_supervisor_stopped_past_its_deadline_stops_the_run_as_timeout(paths):
    """The command stops its supervisor (same uid): resumed after the deadline
    with a SIGTERM pending, the deadline came first."""
    proc = start_supervisor(*paths.options(timeout=0.5, cleanup=1) + [
        "--", "sh", "-c", "kill -STOP $PPID; exec sleep 30"])
    assert wait_until(lambda: (proc_stat(proc.pid) or ("?",))[0] == "T")
    started = time.monotonic()
    assert wait_until(lambda: time.monotonic() - started > 0.6)  # past the deadline, stopped
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    status, _, err = finish(proc)
    assert status == 124, err
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "timeout" and receipt["signal"] is None


# --- 14. The stop file: always heard, never confused ---------------------------------------------------

# What a loaded machine may add to the 2 s between two looks by path.
LOOK_SLACK = 1.5


def stop_noticed(proc, paths, change):
    """Make `change`, create the stop file, and return how long the
    supervisor took to decide the stop, by the receipt's clock."""
    read_lines_until(proc.stdout, "started")
    change()
    created = time.time()
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "stop_file"
    return stop_noticed_after(receipt, created)


def test_a_stop_path_that_cannot_be_looked_at_during_the_run_is_a_stop(paths, tmp_path):
    """At start only ENOENT and ENOTDIR mean 'no stop file'; during the run
    too: an ancestor replaced by a symlink loop (ELOOP) stops the run rather
    than hiding the stop file for good."""
    (tmp_path / "ctl").mkdir()
    paths.stop = tmp_path / "ctl" / "stop"
    proc = start_supervisor(*paths.options(stop=True) + ["--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    os.rename(str(tmp_path / "ctl"), str(tmp_path / "ctl-old"))
    os.symlink("ctl", str(tmp_path / "ctl"))  # ctl -> ctl: ELOOP
    status, _, err = finish(proc)
    assert status == 124, err
    assert read_receipt(paths.receipt)["stop_reason"] == "stop_file"


def test_the_stop_file_is_noticed_after_an_ancestor_is_renamed(paths, tmp_path):
    (tmp_path / "ctl" / "run").mkdir(parents=True)
    paths.stop = tmp_path / "ctl" / "run" / "stop"
    proc = start_supervisor(*paths.options(stop=True) + ["--", "sh", "-c", "echo started; exec sleep 30"])

    def rename_ancestor():
        os.rename(str(tmp_path / "ctl"), str(tmp_path / "ctl-old"))
        (tmp_path / "ctl" / "run").mkdir(parents=True)
    # Not in the directory watched: the look by path, every 2 s, finds it.
    assert stop_noticed(proc, paths, rename_ancestor) < 2 + LOOK_SLACK


def test_the_stop_file_is_noticed_after_a_symlinked_ancestor_is_re_pointed(paths, tmp_path):
    for name in ("run1", "run2"):
        (tmp_path / name).mkdir()
    (tmp_path / "current").symlink_to("run1")
    paths.stop = tmp_path / "current" / "stop"
    proc = start_supervisor(*paths.options(stop=True) + ["--", "sh", "-c", "echo started; exec sleep 30"])

    def re_point():
        (tmp_path / "next").symlink_to("run2")
        os.rename(str(tmp_path / "next"), str(tmp_path / "current"))  # as ln -sfn does
    assert stop_noticed(proc, paths, re_point) < 2 + LOOK_SLACK
    assert (tmp_path / "run2" / "stop").exists()


def test_a_stop_path_that_cannot_be_looked_at_is_refused(paths, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    paths.stop = loop / "stop"  # ELOOP, for root too
    result = run_supervisor(*paths.options(stop=True) + ["--", "touch", paths.work / "ran"])
    assert result.returncode == 125
    one_line(result.stderr, "--stop-file", "symbolic links")
    assert not (paths.work / "ran").exists() and not paths.receipt.parent.exists()


@needs_root
def test_a_stop_file_the_supervisor_may_not_look_at_is_refused(open_dir):
    locked = os.path.join(open_dir["top"], "locked")
    os.mkdir(locked, 0o700)  # root's: nobody cannot search it
    argv = AS_NOBODY + [NOBODY_PY, NOBODY_SUPERVISOR, "--timeout", "5", "--workdir", open_dir["work"],
                        "--stop-file", os.path.join(locked, "stop"), "--", "true"]
    result = run(argv, cwd=open_dir["work"])
    assert result.returncode == 125
    one_line(result.stderr, "--stop-file", "Permission denied")


def test_a_stop_path_equal_to_the_receipt_path_is_refused(paths):
    result = run_supervisor(*paths.options() + ["--stop-file", paths.receipt, "--", "true"])
    assert result.returncode == 125
    one_line(result.stderr, "--stop-file", "receipt")
    assert not paths.receipt.parent.exists()


# --- 15, 16. Refusals leave nothing; every message is one line ------------------------------------------

@needs_root
def test_a_proc_of_another_pid_namespace_leaves_no_directories(paths):
    argv = ["unshare", "--pid", "--fork"] + supervisor_cmd(*paths.options() + ["--", "true"])
    result = run(argv)
    assert result.returncode == 125
    one_line(result.stderr, "PID namespace")
    assert not paths.receipt.parent.exists()


@needs_root
def test_a_refused_fork_names_the_limit_and_leaves_no_directories(open_dir):
    box = os.path.join(open_dir["top"], "box")
    os.mkdir(box)
    os.chown(box, NOBODY, NOBODY)
    receipt = os.path.join(box, "new", "receipt.json")
    argv = ["prlimit", "--nproc=1:1"] + AS_NOBODY + [
        NOBODY_PY, NOBODY_SUPERVISOR, "--timeout", "5", "--workdir", open_dir["work"],
        "--receipt", receipt, "--", "true"]
    result = run(argv, cwd=open_dir["work"])
    assert result.returncode == 125
    one_line(result.stderr, "fork: Resource temporarily unavailable (ulimit -u, pids.max)")
    assert os.listdir(box) == []


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
@pytest.mark.parametrize("stdin_closed", [False, True])
def test_every_fd_limit_is_a_clean_run_or_one_line_naming_it(paths, stdin_closed):
    """Descriptors starved at each point of the start (the receipt's
    directory, /proc, the signal pipe, the exec report, the resource module),
    also with stdin closed (a pipe then gets fd 0 and must move above 2):
    never 'internal error', always one line naming the call and ulimit -n,
    and nothing left at the receipt path."""
    for limit in range(5, 15):
        close_stdin = plain_signals(then=lambda: os.close(0))
        result = run(["prlimit", "--nofile=%d" % limit, PY, "-I", "-S", SUPERVISOR,
                      "--timeout", "5", "--workdir", str(paths.work),
                      "--receipt", str(paths.receipt), "--", "true"],
                     preexec_fn=close_stdin if stdin_closed else plain_signals())
        if result.returncode == 0:
            assert read_receipt(paths.receipt)["cleanup_confirmed"] is True
            continue
        assert result.returncode == 125, (limit, result.stderr)
        line = one_line(result.stderr, "(ulimit -n")
        assert "internal error" not in line, (limit, line)
        assert not paths.receipt.exists(), limit


def test_a_deleted_current_directory_is_refused_and_leaves_no_directories(paths, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    script = "cd %s && rmdir %s && exec %s" % (gone, gone, " ".join(
        shlex.quote(str(a)) for a in supervisor_cmd("--timeout", 5, "--workdir", paths.work,
                                           "--receipt", paths.receipt, "--stop-file", "stop",
                                           "--", "true")))
    result = run(["sh", "-c", script])
    assert result.returncode == 125
    one_line(result.stderr, "current directory")
    assert not paths.receipt.parent.exists()


def test_a_newline_in_a_path_cannot_add_a_line_to_the_message(paths, tmp_path):
    evil = tmp_path / "x\ntreereap: cleanup confirmed"
    result = run_supervisor("--timeout", 5, "--receipt", paths.receipt, "--workdir", evil,
                            "--", "true")
    assert result.returncode == 125
    one_line(result.stderr, "--workdir", "\\n")


# --- --user ------------------------------------------------------------------------------------

def user_run(open_dir, *args, command=("id",), **kwargs):
    argv = supervisor_cmd("--timeout", 10, "--workdir", open_dir["work"], "--receipt",
                          open_dir["receipt"], *args, "--", *command)
    return run(argv, cwd=open_dir["work"], **kwargs)


@needs_root
@pytest.mark.parametrize("option", ["--output", "--summary"])
def test_a_swapped_directory_cannot_redirect_output_or_summary(open_dir, tmp_path, option):
    """A run of nobody renames the sandbox's logs/ and puts there a symlink
    to a root-only directory (it may: the sandbox is its to write). The
    next supervisor, root, followed it: a root-owned file of FILE's name,
    with the command's words in it, in a stand-in for /etc/cron.d. Now no
    symlink on the path is followed under --user: refused, naming the
    option, and nothing lands there; a real directory there is fine."""
    cron = tmp_path / "cron.d"  # pytest's tmp_path: root's alone
    cron.mkdir(mode=0o700)
    logs = os.path.join(open_dir["work"], "logs")
    os.mkdir(logs)
    os.rename(logs, logs + ".old")
    os.symlink(str(cron), logs)
    words = ("sh", "-c", "echo '* * * * * root evil'")
    result = user_run(open_dir, "--user", "nobody", option, os.path.join(logs, "job"),
                      command=words)
    assert result.returncode == 125, result.stderr
    assert option in result.stderr and "symlink" in result.stderr, result.stderr
    assert os.listdir(str(cron)) == []
    os.unlink(logs)
    os.rename(logs + ".old", logs)
    result = user_run(open_dir, "--user", "nobody", option, os.path.join(logs, "job"),
                      command=words)
    assert result.returncode == 0, result.stderr
    assert os.path.getsize(os.path.join(logs, "job")) > 0


@needs_root
@pytest.mark.parametrize("option", ["--output", "--summary"])
def test_a_hard_link_planted_at_the_output_is_not_truncated(open_dir, tmp_path, option):
    """Where the run's uid may write, it can put at FILE a hard link to a file
    of root's (where fs.protected_hardlinks is off): truncating FILE would
    truncate that file. Under --user the summary (written in place: it may
    be a bind-mounted file) is refused but for a file of one link; FILE is
    made anew, the link removed."""
    precious = os.path.join(open_dir["top"], "precious")
    with open(precious, "w") as f:
        f.write("root's\n")
    job = os.path.join(open_dir["work"], "job")
    os.link(precious, job)
    result = user_run(open_dir, "--user", "nobody", option, job, command=("true",))
    assert open(precious).read() == "root's\n"
    if option == "--summary":
        assert option in result.stderr, result.stderr
    else:
        assert result.returncode == 0 and os.stat(job).st_nlink == 1, result.stderr


@needs_root
def test_under_user_the_cap_holds_on_a_file_the_uid_left(open_dir):
    """FILE left by the run's uid as its own (it may replace what is in a
    directory it writes): opened in place, the command appended to it by
    its path, past the pipe: 1,050,624 bytes against a 4 KiB cap. Under
    --user FILE is made anew, the supervisor's, which the uid cannot open."""
    job = os.path.join(open_dir["work"], "job")
    with open(job, "w") as f:
        f.write("the uid's\n")
    os.chown(job, NOBODY, NOBODY)
    appender = "head -c 1048576 /dev/zero >> %s; echo done" % shlex.quote(job)
    result = user_run(open_dir, "--user", "nobody", "--output", job, "--max-output", "4K",
                      command=("sh", "-c", appender))
    assert result.returncode == 0, result.stderr
    output = read_receipt(open_dir["receipt"])["output"]
    assert os.path.getsize(job) == output["bytes_kept"] <= 4096, output
    assert os.stat(job).st_uid == 0 and b"done" in open(job, "rb").read()


@needs_root
def test_user_runs_the_command_as_that_user_with_no_way_back(open_dir):
    script = ("id -u; id -g; id -G; echo $HOME $USER $LOGNAME; "
              "grep NoNewPrivs /proc/self/status; pwd")
    result = user_run(open_dir, "--user", "nobody", command=("sh", "-c", script),
                      env=dict(os.environ, HOME="/root", USER="root", LOGNAME="root"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0:2] == [str(NOBODY), str(NOBODY)] and lines[2].split() == [str(NOBODY)]
    assert lines[3] == "/nonexistent nobody nobody"
    assert lines[4].split() == ["NoNewPrivs:", "1"] and lines[5] == open_dir["work"]
    receipt = read_receipt(open_dir["receipt"])
    assert receipt["user"] == {"uid": NOBODY, "gid": NOBODY}


@needs_root
def test_user_as_a_uid_without_a_passwd_entry(open_dir):
    result = user_run(open_dir, "--user", "54321", command=("sh", "-c", "id -u; id -g; id -G; echo $HOME"),
                      env=dict(os.environ, HOME="/kept"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["54321", "54321", "54321", "/kept"]
    assert read_receipt(open_dir["receipt"])["user"] == {"uid": 54321, "gid": 54321}


@needs_root
def test_user_with_a_group(open_dir):
    result = user_run(open_dir, "--user", "nobody:daemon", command=("id", "-g"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    assert read_receipt(open_dir["receipt"])["user"] == {"uid": NOBODY, "gid": 1}


@needs_root
@pytest.mark.parametrize("spec, words", [
    ("no-such-user", ["--user", "no user"]),
    ("nobody:no-such-group", ["--user", "no group"]),
    ("", ["--user"]),
])
def test_user_refuses_what_does_not_exist(open_dir, spec, words):
    result = user_run(open_dir, "--user", spec, command=("touch", "ran"))
    assert result.returncode == 125
    one_line(result.stderr, *words)
    assert os.listdir(open_dir["work"]) == [] and os.listdir(open_dir["ctl"]) == []


@needs_root
def test_user_refuses_a_workdir_that_user_cannot_enter(open_dir):
    os.chmod(open_dir["work"], 0o700)
    result = user_run(open_dir, "--user", "nobody", command=("true",))
    assert result.returncode == 125
    one_line(result.stderr, "--user", "cannot enter")


@needs_root
@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_user_refuses_a_receipt_directory_that_user_could_write(open_dir, mode):
    """Sticky or not: once the earlier receipt is gone the name is free, and
    a user who may create files there could put a forged receipt at it."""
    os.chmod(open_dir["ctl"], mode)
    result = user_run(open_dir, "--user", "nobody", command=("true",))
    assert result.returncode == 125
    one_line(result.stderr, "--user", open_dir["ctl"])


@needs_root
def test_user_accepts_a_receipt_below_a_sticky_directory(open_dir):
    """/tmp/ctl, root's, below the sticky /tmp: nobody can neither rename ctl
    nor write in it."""
    os.chmod(open_dir["top"], 0o1777)
    result = user_run(open_dir, "--user", "nobody", command=("true",))
    assert result.returncode == 0, result.stderr


@needs_root
def test_user_needs_the_privilege_to_switch(open_dir):
    argv = AS_NOBODY + [NOBODY_PY, NOBODY_SUPERVISOR, "--timeout", "5", "--workdir", open_dir["work"],
                        "--user", "root", "--", "true"]
    result = run(argv, cwd=open_dir["work"])
    assert result.returncode == 125
    one_line(result.stderr, "--user", "needs root")


HOSTILE = r"""
import ctypes, os, signal, sys
receipt = sys.argv[1]
supervisor = os.getppid()
def attempt(name, action):
    try:
        action()
        print(name, "allowed", flush=True)
    except OSError as e:
        print(name, "denied", e.errno, flush=True)
def ptrace():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, supervisor, 0, 0) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), "ptrace")
attempt("term", lambda: os.kill(supervisor, signal.SIGTERM))
attempt("stop", lambda: os.kill(supervisor, signal.SIGSTOP))
attempt("ptrace", ptrace)
attempt("mem", lambda: open("/proc/%d/mem" % supervisor, "rb"))
attempt("write", lambda: open(receipt, "w"))
attempt("plant", lambda: open(os.path.join(os.path.dirname(receipt), "planted"), "w"))
"""


@needs_root
def test_under_user_the_command_cannot_touch_its_supervisor_or_receipt(open_dir):
    result = user_run(open_dir, "--user", "nobody",
                      command=(NOBODY_PY, "-c", HOSTILE, open_dir["receipt"]))
    assert result.returncode == 0, result.stderr
    outcomes = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert set(outcomes) == {"term", "stop", "ptrace", "mem", "write", "plant"}
    assert all(outcome.startswith("denied") for outcome in outcomes.values()), outcomes
    receipt = read_receipt(open_dir["receipt"])
    assert receipt["cleanup_confirmed"] is True and receipt["exit_status"] == 0
    assert os.listdir(open_dir["ctl"]) == ["receipt.json"]


# --- Found in review: what a hostile command or a dying service could slip past --------------------

def run_to_files(argv, directory, **kwargs):
    """(status, stdout, stderr) of argv, its output to files: processes it
    leaves alive hold them open, and a pipe would never see EOF."""
    proc = spawn_to_files(argv, directory, **kwargs)
    return finish_to_files(proc, directory)


def spawn_to_files(argv, directory, **kwargs):
    """spawn() with stdout and stderr going to files in directory."""
    with open(str(directory / "stdout"), "w") as o, open(str(directory / "stderr"), "w") as e:
        return spawn(argv, stdout=o, stderr=e, **kwargs)


def finish_to_files(proc, directory):
    status = proc.wait(timeout=120)
    return status, (directory / "stdout").read_text(), (directory / "stderr").read_text()


def adopted_by(pid, parent):
    return (proc_stat(pid) or (None, None))[1] == parent


HIDE_IN_CALLERS_GROUP = r"""
import os, signal, time
supervisor = os.getppid()
if os.fork() == 0:
    os.setpgid(0, os.getpgid(supervisor))  # the group of the caller's job (the shell's own)
    if os.fork() == 0:
        open("hidden", "w").write(str(os.getpid()))
        signal.pause()
    os._exit(0)  # the grandchild is adopted by the supervisor, in the caller's group
time.sleep(60)
"""


@needs_root
@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="needs autogroups")
def test_a_user_command_cannot_renice_the_callers_session(open_dir):
    """An untrusted command in the caller's session could set the session's
    autogroup to nice 19, for good (it stays after the run). Under --user it
    runs in a session of its own: its autogroup is its own."""
    argv = [NOBODY_PY, SUPERVISOR, "--timeout", "10", "--user", "nobody", "--workdir",
            open_dir["work"], "--receipt", open_dir["receipt"], "--", "sh", "-c",
            "echo 19 > /proc/self/autogroup"]
    script = "%s; echo status=$?; cat /proc/self/autogroup" % " ".join(
        shlex.quote(str(a)) for a in argv)
    result = run(["setsid", "-w", "sh", "-c", script], cwd=open_dir["work"])
    assert "status=0" in result.stdout, result.stdout + result.stderr
    assert result.stdout.split()[-1] == "0", result.stdout  # the caller's session: nice 0


@pytest.mark.parametrize("kind", ["proc", "cgroup"])
def test_a_process_of_the_run_hiding_in_the_callers_job_group_is_never_confirmed(paths, kind):
    """By the /proc walk it cannot be told from the caller's (unattributed,
    not confirmed); in the run's cgroup it is the run's, and drained."""
    if kind == "cgroup" and not HAS_CGROUP:
        pytest.skip("needs a writable cgroup v2 hierarchy (root)")
    inner = supervisor_cmd(*paths.options(cleanup=1, stop=True) + [
        "--containment", kind, "--", PY, "-c", HIDE_IN_CALLERS_GROUP])
    done = paths.work.parent / "done"  # the caller's job lives until the test is done
    script = "(until [ -e %s ]; do sleep 0.05; done) & exec %s" % (
        done, " ".join(shlex.quote(str(a)) for a in inner))
    proc = spawn_to_files(["sh", "-c", script], paths.work.parent)
    hidden = None
    try:
        assert wait_until(lambda: (paths.work / "hidden").exists()
                          and (paths.work / "hidden").read_text(), timeout=60)
        hidden = int((paths.work / "hidden").read_text())
        assert wait_until(lambda: adopted_by(hidden, proc.pid))
        paths.stop.write_text("")
        status, _, err = finish_to_files(proc, paths.work.parent)
        receipt = read_receipt(paths.receipt)
        if kind == "proc":
            assert status == 125, err
            assert receipt["cleanup_confirmed"] is False
            assert [p["pid"] for p in receipt["unattributed"]] == [hidden]
        else:
            assert status == 124, err
            assert receipt["cleanup_confirmed"] is True and receipt["unattributed"] == []
            assert not alive(hidden) and hidden in [p["pid"] for p in receipt["drained"]]
    finally:
        done.write_text("")
        if hidden is not None:
            kill_all([hidden])
        proc.wait(timeout=120)


LATE_HANDOVER = r"""
import os, signal, sys, time
supervisor, command = int(sys.argv[1]), sys.argv[2].encode()
if os.fork():
    os._exit(0)
os.setsid()  # a detached service, kept with everything
open("service", "w").write("%d\n" % os.getpid())
child = os.fork()
if child == 0:
    open("child", "w").write("%d\n" % os.getpid())
    signal.pause()
def children():
    with open("/proc/%d/task/%d/children" % (supervisor, supervisor), "rb") as f:
        return f.read().split()
while command in children():  # the supervisor reaps the command at done:
    time.sleep(0.0002)
os._exit(0)  # die now, and hand the child over to it
"""


@needs_root
def test_a_kept_service_that_dies_at_the_end_cannot_leave_an_uncounted_child(paths):
    """Everything kept (an exit 0, --preserve-descendants-on-success): the
    service waits for the supervisor to reap the command, at done, then
    dies: its child is adopted after what is kept was listed. Whatever the timing,
    the receipt must keep it (the service listed), or count it (a survivor):
    never confirmed with nothing preserved while it runs on."""
    for _ in range(2):
        script = "%s -c '%s' $PPID $$; while [ ! -s service ]; do sleep 0.01; done; exit 0" % (
            shlex.quote(PY), LATE_HANDOVER.replace("'", "'\"'\"'"))
        proc = spawn_to_files(supervisor_cmd(*paths.options(cleanup=1) + [
            "--preserve-descendants-on-success",
            "--", "sh", "-c", script]), paths.work.parent)
        assert wait_until(lambda: (paths.work / "child").exists()
                          and (paths.work / "child").read_text().endswith("\n"), timeout=60)
        child = int((paths.work / "child").read_text())
        service = int((paths.work / "service").read_text())
        (paths.work / "child").unlink()
        finish_to_files(proc, paths.work.parent)
        receipt = read_receipt(paths.receipt)
        preserved = [p["pid"] for p in receipt["preserved"]]
        try:
            # Every honest outcome, and nothing else: the child is gone, or
            # counted as a survivor (not confirmed), or kept: listed, or below
            # a service listed (its parent when the receipt was written).
            if not alive(child):
                outcome = "gone"
            elif child in [p["pid"] for p in receipt["survivors"]]:
                outcome = "survivor"
                assert receipt["cleanup_confirmed"] is False
            else:
                outcome = "kept"
                assert service in preserved or child in preserved, receipt
            assert outcome in ("gone", "survivor", "kept")
        finally:
            kill_all([child] + preserved)
            (paths.work / "service").unlink()


def test_a_refusal_after_the_receipt_check_leaves_no_earlier_receipt(paths):
    paths.receipt.parent.mkdir()
    paths.receipt.write_text(json.dumps({"cleanup_confirmed": True}))
    result = run_supervisor(*paths.options() + ["--stop-file", paths.receipt, "--", "true"])
    assert result.returncode == 125
    assert not paths.receipt.exists()
