"""A hostile command still cannot make the receipt lie, round 2: mounts
inside /proc and inside the run's cgroup, symlinks on the receipt path,
shared uids, a process stuck in D state, huge argv, a self-stopping --user
command, signal floods, a receipt path that is not a file, a bind-mounted
workdir, and a temporary file left by a SIGKILL.

Mounts happen in a private mount namespace (unshare --mount), so nothing
reaches the host's; what a test mounts, freezes or starts, it undoes."""
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import (
    CGROUP_ROOT, HAS_CGROUP, HELPERS, IS_ROOT, PY, ROOT, alive, proc_stat, descendants, finish, heavy, kill_all, kill_pinned,
    read_lines_until, read_receipt, run, run_supervisor, running, spawn, start_supervisor,
    supervisor_below, supervisor_cmd, wait_until,
)
from test_trust import AS_NOBODY, NOBODY, user_run

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (mounts, --user, loop devices)")


def in_private_mounts(argv):
    return ["unshare", "--mount", "--propagation", "private"] + argv


def containments():
    return ["proc"] + (["cgroup"] if HAS_CGROUP else [])


# --- A proof never crosses a mount the command made ------------------------------------------------

def stop_a_run_that_mounts(paths, kind, script, pid_file):
    """Run script (it mounts something, says "mounted", and writes the pid of
    a process the mount hides in pid_file) in a private mount namespace;
    stop it; (status, receipt, that pid)."""
    proc = spawn(in_private_mounts(supervisor_cmd(*paths.options(cleanup=0.5, stop=True) + [
        "--containment", kind, "--", "sh", "-c", script])))
    read_lines_until(proc.stdout, "mounted")
    hidden = int((paths.work / pid_file).read_text())
    paths.stop.write_text("")
    status, _, _ = finish(proc)
    return status, read_receipt(paths.receipt), hidden


# A tool in a session of its own, deaf to SIGTERM, its pid in `tool`.
TOOL = ("setsid -f sh -c 'echo $$ > tool; trap \"\" TERM; exec sleep 300'; "
        "while [ ! -s tool ]; do sleep 0.01; done; ")


@needs_root
@pytest.mark.parametrize("kind", containments())
def test_a_file_mounted_over_our_own_children_list_is_never_believed(paths, tmp_path, kind):
    """A root command bind-mounts an empty file over the supervisor's
    /proc/SUP/task/SUP/children: the look the confirmation rests on would
    see no children. It must fail, not come back empty: a setsid sleep that
    lives on is never covered by a confirmed receipt."""
    (tmp_path / "empty").write_text("")
    script = TOOL + ("mount --bind %s /proc/$PPID/task/$PPID/children && echo mounted; "
                     "exec sleep 300" % (tmp_path / "empty"))
    status, receipt, tool = stop_a_run_that_mounts(paths, kind, script, "tool")
    try:
        assert not (receipt["cleanup_confirmed"] and alive(tool)), receipt
        if kind == "proc":  # the walk cannot read its own list: it says so
            assert status == 125 and receipt["cleanup_confirmed"] is False
            assert "mount made inside /proc" in receipt["error"]
            # and what is alive cannot be counted: null, never 0
            assert receipt["survivors_count"] is None, receipt["survivors"]
    finally:
        kill_all([tool])


@needs_root
def test_a_fake_stat_over_a_process_is_never_believed(paths):
    """A root command bind-mounts a stat saying "zombie" over a live tool's
    /proc/PID/stat: the walk must not take the tool for dead."""
    script = TOOL + ("t=$(cat tool); sed 's/) S /) Z /' /proc/$t/stat > fake; "
                     "mount --bind fake /proc/$t/stat && echo mounted; exec sleep 300")
    status, receipt, tool = stop_a_run_that_mounts(paths, "proc", script, "tool")
    try:
        assert status == 125 and receipt["cleanup_confirmed"] is False
        assert "mount made inside /proc" in receipt["error"]
    finally:
        kill_all([tool])


@needs_root
@pytest.mark.skipif(not HAS_CGROUP, reason="needs a writable cgroup v2 hierarchy")
def test_a_fake_cgroup_events_is_never_believed(paths, tmp_path):
    """A root command bind-mounts "populated 0" over its cgroup's
    cgroup.events: the empty cgroup it claims is never taken on its word."""
    (tmp_path / "events").write_text("populated 0\nfrozen 0\n")
    script = ("cg=%s$(grep ^0:: /proc/self/cgroup | cut -d: -f3); "
              "(trap '' TERM; exec sleep 300) & echo $! > member; "
              "mount --bind %s $cg/cgroup.events && echo mounted; exec sleep 300"
              % (CGROUP_ROOT, tmp_path / "events"))
    status, receipt, member = stop_a_run_that_mounts(paths, "cgroup", script, "member")
    try:
        assert not (receipt["cleanup_confirmed"] and alive(member)), receipt
    finally:
        kill_all([member])


# --- The receipt path, as given -----------------------------------------------------------------------

@needs_root
@pytest.mark.parametrize("where", ["owned", "sticky"])
def test_user_refuses_a_symlink_on_the_receipt_path_the_user_controls(open_dir, where):
    """The path as given is judged, every component: a symlink the user owns
    (here in a directory it owns; or its own link in the sticky /tmp) lets it
    re-point the path the controller reads at a receipt of its own."""
    top = open_dir["top"]
    if where == "owned":
        home = os.path.join(top, "home")
        os.mkdir(home)
        os.chown(home, NOBODY, NOBODY)
        link = os.path.join(home, "ctl")
    else:
        sticky = os.path.join(top, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        link = os.path.join(sticky, "ctl")
    os.symlink(open_dir["ctl"], link)
    os.lchown(link, NOBODY, NOBODY)
    result = user_run(dict(open_dir, receipt=os.path.join(link, "receipt.json")),
                      "--user", "nobody", command=("true",))
    assert result.returncode == 125
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and link in lines[0] and "symlink" in lines[0], result.stderr


@needs_root
def test_user_refuses_a_path_through_a_directory_the_user_can_rename(open_dir):
    """Every component is judged, not only the symlinks and the directory the
    path resolves to: home/sub/link -> ctl, with sub and link root's, but in
    a home that nobody may write. The command renames sub away, makes its
    own sub/link to a directory of its own, and the controller reads the
    command's receipt there. Refused, naming the way through sub (a
    symlink on the path is refused under --user, wherever it is)."""
    home = os.path.join(open_dir["top"], "home")
    os.mkdir(home)
    os.chmod(home, 0o777)
    sub = os.path.join(home, "sub")
    os.mkdir(sub)
    os.symlink(open_dir["ctl"], os.path.join(sub, "link"))
    receipt = os.path.join(sub, "link", "receipt.json")
    result = user_run(dict(open_dir, receipt=receipt), "--user", "nobody", command=("true",))
    assert result.returncode == 125, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and sub in lines[0], result.stderr


@needs_root
def test_user_refuses_a_dotdot_on_the_receipt_path(open_dir):
    """home/sub/../../ctl/receipt.json, home writable by nobody: the kernel
    passes through sub, which nobody may rename and replace with a symlink
    of its own, and no rule judges a directory the path only passes. Under
    --user a `..` on the receipt path is refused."""
    home = os.path.join(open_dir["top"], "home")
    os.makedirs(os.path.join(home, "sub"))
    os.chmod(home, 0o777)
    receipt = os.path.join(home, "sub", "..", "..", "ctl", "receipt.json")
    result = user_run(dict(open_dir, receipt=receipt), "--user", "nobody", command=("true",))
    assert result.returncode == 125, result.stderr
    assert result.stderr.count("\n") == 1 and "'..'" in result.stderr, result.stderr


# --- Shared uids ------------------------------------------------------------------------------------

@needs_root
def test_a_process_of_the_runs_uid_outside_the_run_keeps_it_from_being_confirmed(open_dir):
    """nobody is shared by daemons and by every sandbox that uses it: a
    process of that uid started during the run outside its tree (here by the
    test; a ptrace of an unrelated process does the same) cannot be told
    from one the command had started that way. Listed, not confirmed."""
    go = os.path.join(open_dir["work"], "go")
    script = "echo started; while [ ! -e %s ]; do sleep 0.01; done" % go
    proc = spawn(supervisor_cmd("--timeout", 60, "--workdir", open_dir["work"], "--receipt",
                                open_dir["receipt"], "--user", "nobody", "--",
                                "sh", "-c", script), cwd=open_dir["work"])
    read_lines_until(proc.stdout, "started")
    outsider = spawn(AS_NOBODY + ["sleep", "300"], stdout=None, stderr=None)
    try:
        # Counted once it runs as nobody: wait for setpriv's switch and exec.
        assert wait_until(lambda: runs_as_nobody(outsider.pid))
        open(go, "w").close()
        status, _, err = finish(proc)
        receipt = read_receipt(open_dir["receipt"])
        assert status == 125 and receipt["cleanup_confirmed"] is False
        assert [(p["pid"], p["why"]) for p in receipt["unattributed"]] == [
            (outsider.pid, "uid %d, outside the run" % NOBODY)]
        assert "a uid of its own" in err
    finally:
        outsider.kill()
        outsider.wait()


def runs_as_nobody(pid):
    """Has pid switched to nobody and exec'd its program (setpriv's work done)?"""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return os.stat("/proc/%d" % pid).st_uid == NOBODY and f.read().startswith(b"sleep")
    except OSError:
        return False


# A container's /proc as Docker, containerd and CRI-O leave it before its
# command starts (their default spec; `runc spec` prints it): these bound
# read-only over themselves, these masked (/dev/null over a file, an empty
# read-only tmpfs over a directory).
OCI_READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
OCI_MASKED_PATHS = ["/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys",
                    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
                    "/proc/sched_debug", "/proc/scsi", "/sys/firmware"]


def in_a_containers_proc(argv):
    script = (
        'for p in %s; do [ -e "$p" ] || continue; mount -i --bind "$p" "$p" && '
        'mount -i -o remount,bind,ro "$p" || exit 1; done; '
        'for p in %s; do if [ -d "$p" ]; then mount -i -t tmpfs -o ro tmpfs "$p" || exit 1; '
        'elif [ -e "$p" ]; then mount -i --bind /dev/null "$p" || exit 1; fi; done; '
        'grep -q " /proc/sys ro," /proc/self/mountinfo || exit 1; exec "$@"') % (
        " ".join(OCI_READONLY_PATHS), " ".join(OCI_MASKED_PATHS))
    return in_private_mounts(["sh", "-c", script, "sh"] + list(argv))


@needs_root
def test_user_confirms_in_a_containers_default_proc(open_dir):
    """In a container's default /proc (/proc/sys a read-only bind mount of
    itself, files masked), --user never confirmed: the end's look at Yama's
    ptrace_scope refused to cross the mount ("covered by a mount made inside
    /proc"), 125 every time. Those mounts were there before the command
    started: the scope is read then. (The guest's runc and crun bundles and
    tests/test_docker.py run it in real containers.)"""
    result = run(in_a_containers_proc(supervisor_cmd(
        "--timeout", 60, "--workdir", open_dir["work"], "--receipt", open_dir["receipt"],
        "--user", "nobody", "--", "sh", "-c", "id -u")), cwd=open_dir["work"])
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(open_dir["receipt"])
    assert receipt["cleanup_confirmed"] is True and receipt["error"] is None, receipt
    assert result.stdout.strip() == str(NOBODY)


def ptrace_is_open():
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip() == "0"
    except FileNotFoundError:
        return True  # no Yama: a process may trace another of its uid


@needs_root
@pytest.mark.skipif(not ptrace_is_open(), reason="needs ptrace open (no Yama, or ptrace_scope 0)")
def test_where_ptrace_is_open_any_process_of_the_runs_uid_keeps_it_from_being_confirmed(
        open_dir):
    """A process of nobody started before the run: the command could make it
    exec its payload in place (ptrace), same pid, same start time, and a look
    at what started during the run would miss it. Where ptrace is open, every
    live process of the uid outside the run counts: listed, not confirmed."""
    outsider = spawn(AS_NOBODY + ["sleep", "300"], stdout=None, stderr=None)
    try:
        assert wait_until(lambda: proc_stat(outsider.pid) and open(
            "/proc/%d/cmdline" % outsider.pid, "rb").read().startswith(b"sleep"))
        result = run_supervisor("--timeout", 60, "--workdir", open_dir["work"], "--receipt",
                                open_dir["receipt"], "--user", "nobody", "--", "true",
                                cwd=open_dir["work"])
        receipt = read_receipt(open_dir["receipt"])
        assert result.returncode == 125 and receipt["cleanup_confirmed"] is False
        assert outsider.pid in [p["pid"] for p in receipt["unattributed"]]
    finally:
        outsider.kill()
        outsider.wait()


# --- No read hangs the supervisor -------------------------------------------------------------------

D_STATE = r"""
import mmap, os, sys, threading, time
f = open(sys.argv[1] + "/data", "w+b")
f.truncate(4096 * 16)
m = mmap.mmap(f.fileno(), 4096 * 16, mmap.MAP_SHARED)
print("mapped", flush=True)
while not os.path.exists("go"):
    time.sleep(0.01)
def write():
    m[8192:8193] = b"x"  # a write fault on a frozen filesystem: D state until thawed
threading.Thread(target=write).start()
time.sleep(300)
"""


@pytest.fixture
def frozen_filesystem(tmp_path):
    """A filesystem of the test's own (ext4 on a loop device) and a function
    that freezes it, as a hung NFS or FUSE mount holds whatever touches it;
    thawed THAW_AFTER seconds later (a supervisor that blocks on it then
    comes back, past its bound, and the test fails instead of hanging), and
    unmounted at the end, whatever happened."""
    if not IS_ROOT or not all(os.path.exists(p) for p in ("/usr/sbin/fsfreeze",
                                                          "/usr/sbin/mkfs.ext4")):
        pytest.skip("needs root, fsfreeze and mkfs.ext4")
    image, mount = tmp_path / "image", tmp_path / "mnt"
    subprocess.check_call(["dd", "if=/dev/zero", "of=%s" % image, "bs=1M", "count=16",
                           "status=none"])
    subprocess.check_call(["mkfs.ext4", "-q", str(image)])
    mount.mkdir()
    subprocess.check_call(["mount", "-o", "loop", str(image), str(mount)])
    thaws = []

    def freeze():
        subprocess.check_call(["fsfreeze", "-f", str(mount)])
        thaws.append(threading.Timer(THAW_AFTER, thaw))
        thaws[-1].start()

    def thaw():
        subprocess.call(["fsfreeze", "-u", str(mount)], stderr=subprocess.DEVNULL)
    try:
        yield mount, freeze
    finally:
        if thaws:
            thaws[-1].cancel()
            thaw()
        time.sleep(0.1)  # what was stuck on it dies before the unmount
        subprocess.call(["umount", "-l", str(mount)])


# Far past the bound of the runs below (about 4.5 s from their stop).
THAW_AFTER = 20.0


def stop_while_stuck(paths, command, freeze, stuck=1, containment="auto"):
    """Run command (it prints "mapped"), freeze its filesystem, let it touch
    it ("go"), wait until `stuck` of its tasks are in D state, stop the run:
    the receipt."""
    proc = start_supervisor(*paths.options(cleanup=0.5, stop=True) + [
        "--containment", containment, "--"] + command)
    read_lines_until(proc.stdout, "mapped")
    freeze()
    (paths.work / "go").write_text("")
    assert wait_until(lambda: thread_states(proc.pid).count("D") >= stuck)
    paths.stop.write_text("")
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    assert status == 125 and receipt["cleanup_confirmed"] is False, err
    assert receipt["duration_s"] <= receipt["ladder"][0]["start_s"] + 3 * 0.5 + 3
    return receipt


def test_a_process_stuck_in_d_state_cannot_stretch_the_bound(paths, frozen_filesystem):
    """A thread blocked on a frozen filesystem (as on a hung NFS or FUSE
    mount): SIGKILL cannot end it until the filesystem thaws. The run still
    ends within its bound, not confirmed, the process listed by its name."""
    mount, freeze = frozen_filesystem
    receipt = stop_while_stuck(paths, [PY, "-c", D_STATE, str(mount)], freeze)
    assert receipt["survivors_count"] >= 1, receipt["survivors"]
    assert all(s["name"] for s in receipt["survivors"]), receipt["survivors"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
@pytest.mark.parametrize("containment", containments())
def test_a_process_sharing_memory_with_one_in_d_state_cannot_stretch_the_bound(
        paths, tmp_path, frozen_filesystem, containment):
    """Processes that share one memory map (clone CLONE_VM): one stuck in D
    state on a frozen filesystem holds the map's lock, another queues for
    it, and the third, in state S, looks harmless; reading its argv blocked
    the supervisor until the thaw (20 s against a bound of 4.5 s), and the
    run was then confirmed. No argv is read any more (a name from stat
    takes no lock): the run ends within its bound, not confirmed."""
    mount, freeze = frozen_filesystem
    helper = tmp_path / "shared_memory"
    subprocess.check_call(["cc", "-o", str(helper), os.path.join(HELPERS, "shared_memory.c")])
    # Both in D state: the fault, and the change of mapping queued behind it.
    receipt = stop_while_stuck(paths, [str(helper), str(mount)], freeze, stuck=2,
                               containment=containment)
    assert receipt["survivors_count"] >= 1, receipt["survivors"]


HUNG_FUSE = r"""
import os, signal, subprocess, sys
fd = os.open("/dev/fuse", os.O_RDWR)
subprocess.check_call(["mount", "-i", "-t", "fuse", "-o", "fd=%d,rootmode=40000,user_id=0,group_id=0"
                       % fd, "hung", sys.argv[1]], pass_fds=[fd])
if sys.argv[2:] == ["init"]:  # its INIT answered (7.22's reply): a server that stopped later
    import struct
    unique = struct.unpack_from("<IIQ", os.read(fd, 1 << 17))[2]
    init = struct.pack("<IIIIHHI", 7, 22, 0, 0, 0, 0, 4096)
    os.write(fd, struct.pack("<IiQ", 16 + len(init), 0, unique) + init)
print("mounted", flush=True)
signal.pause()  # it never answers; its exit closes the connection (ENOTCONN for all)
"""


@contextlib.contextmanager
def fuse_server(tmp_path, *args):
    """A FUSE mount whose server never answers, as an NFS or FUSE server that
    stopped answering: any look at a path in it blocks; the server's exit
    aborts the mount. Before its INIT is answered a look waits in D state
    (killable); after, a request waits interruptibly first (S state)."""
    if not IS_ROOT or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse")
    mount = tmp_path / "hung"
    mount.mkdir()
    server = spawn([PY, "-c", HUNG_FUSE, str(mount)] + list(args), stderr=None)
    try:
        read_lines_until(server.stdout, "mounted")
        yield mount
    finally:
        server.kill()
        server.wait()
        subprocess.call(["umount", "-l", str(mount)])


@pytest.fixture
def hung_filesystem(tmp_path):
    with fuse_server(tmp_path) as mount:
        yield mount


def test_a_stop_file_that_does_not_answer_at_the_start_is_refused(paths, hung_filesystem):
    """A look at the stop file blocks in D state, where SIGKILL cannot reach:
    the looks are a child's (the lookout), and a first look that does not
    answer within 5 s is refused, one line, nothing run."""
    paths.stop = hung_filesystem / "stop"
    result = run_supervisor(*paths.options(stop=True) + ["--", "touch", paths.work / "ran"],
                            timeout=30)
    assert result.returncode == 125 and result.stderr.count("\n") == 1, result.stderr
    assert "--stop-file" in result.stderr and "no answer" in result.stderr
    assert not (paths.work / "ran").exists()


def test_a_first_look_asleep_in_the_kernel_is_refused_as_one_in_d_state(paths, tmp_path):
    """A FUSE server that answered its INIT, then stopped: the look waits
    in S state (interruptibly, until a signal), not D. Refused within the
    5 s of the first look, not waited for until the deadline (a supervisor
    deaf to SIGTERM for the whole --timeout, refusing only then)."""
    with fuse_server(tmp_path, "init") as mount:
        paths.stop = mount / "stop"
        started = time.monotonic()
        result = run_supervisor(*paths.options(timeout=60, stop=True) + [
            "--", "touch", paths.work / "ran"], timeout=120)
        took = time.monotonic() - started
    assert result.returncode == 125 and "no answer within 5s" in result.stderr, result.stderr
    assert took < 30, took  # 5 s and a loaded machine's start-up; the deadline is 60 s
    assert not (paths.work / "ran").exists()


def test_a_starved_lookout_is_waited_for(paths):
    """The lookout, the child that looks at the stop file, is not let run
    its first look for 7 s (held here by strace at its first system call of
    the look, as a machine at load 150 held it): it is not blocked in the
    kernel, so it is waited for, and the 5 s count from its first word. It
    was refused: no answer within 5 s of its fork."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace (apt-get install strace)")
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=inotify_add_watch",
            "-e", "inject=inotify_add_watch:delay_enter=7000000"] + supervisor_cmd(
                *paths.options(stop=True) + ["--", "touch", paths.work / "ran"])
    result = run(argv, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (paths.work / "ran").exists()


def test_a_stop_files_directory_mounted_over_by_one_that_does_not_answer(paths, tmp_path,
                                                                        hung_filesystem):
    """A root command bind-mounts a filesystem that does not answer over the
    stop file's directory: the lookout hangs, the supervisor does not. The
    deadline stops the run within its bound, and the receipt is written (it
    blocked in lstat: no deadline, no receipt, SIGKILL of no avail)."""
    control = tmp_path / "control"
    control.mkdir()
    paths.stop = control / "stop"
    mounted = paths.work / "mounted"
    # The deadline comes after two looks by path (every 2 s): each one blocked.
    script = "mount --bind %s %s && touch %s; exec sleep 30" % (hung_filesystem, control, mounted)
    inner = " ".join(shlex.quote(str(a)) for a in supervisor_cmd(*paths.options(
        timeout=5, cleanup=1, stop=True) + ["--", "sh", "-c", script]))
    result = run(in_private_mounts(["sh", "-c", inner]), timeout=60)
    assert result.returncode == 124, result.stderr
    assert mounted.exists()
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "timeout" and receipt["cleanup_confirmed"] is True
    assert receipt["duration_s"] < 5 + 3 * 1 + 3


def test_a_last_look_at_the_stop_file_that_does_not_answer_counts_as_a_stop(paths, tmp_path,
                                                                           hung_filesystem):
    """The command (root) starts a service, mounts a filesystem that does not
    answer over the stop file's directory and exits 0, under
    --preserve-descendants-on-success: the last look (is there a stop file
    that came with the exit?) gets no answer within 5 s, and that counts as
    a stop: nothing is kept, the service is drained."""
    control = tmp_path / "control"
    control.mkdir()
    paths.stop = control / "stop"
    service = paths.work / "service.pid"
    script = ("setsid -f sh -c 'echo $$ > %s; exec sleep 300'; while [ ! -s %s ]; do sleep 0.01; "
              "done; mount --bind %s %s && exit 0; exit 3" % (service, service, hung_filesystem,
                                                              control))
    inner = " ".join(shlex.quote(str(a)) for a in supervisor_cmd(*paths.options(stop=True) + [
        "--preserve-descendants-on-success", "--", "sh", "-c", script]))
    result = run(in_private_mounts(["sh", "-c", inner]), timeout=60)
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "exit" and receipt["preserved"] == []
    assert receipt["cleanup_confirmed"] is True and receipt["duration_s"] >= 5
    assert not alive(int(service.read_text()))


PIDS_V1 = "/sys/fs/cgroup/pids"


@pytest.mark.skipif(not IS_ROOT or not os.path.isdir(PIDS_V1),
                    reason="needs root and a cgroup v1 pids hierarchy (for pids.max)")
def test_a_full_process_table_leaves_the_run_confirmed(paths):
    """The command fills its pids.max (a fork bomb against the limit): the
    supervisor needs no new thread or process for its cleanup, and the run
    is drained and confirmed as ever."""
    limited = os.path.join(PIDS_V1, "test-full-%d" % os.getpid())
    os.mkdir(limited)
    try:
        with open(os.path.join(limited, "pids.max"), "w") as f:
            f.write("60")
        bomb = ("import os, time\n"
                "for _ in range(200):\n"
                "    try:\n"
                "        if os.fork() == 0:\n"
                "            time.sleep(300)\n"
                "            os._exit(0)\n"
                "    except OSError:\n"
                "        break\n"
                "print('full', flush=True)\n"
                "time.sleep(300)\n")
        script = "echo $$ > %s/cgroup.procs && exec %s" % (limited, " ".join(
            shlex.quote(str(a)) for a in supervisor_cmd(*paths.options(
                timeout=60, cleanup=2, stop=True) + ["--", PY, "-c", bomb])))
        proc = spawn(["sh", "-c", script])
        read_lines_until(proc.stdout, "full")
        paths.stop.write_text("")
        status, _, err = finish(proc)
        receipt = read_receipt(paths.receipt)
        assert status in (124, 137) and receipt["error"] is None, err
        assert receipt["cleanup_confirmed"] is True and receipt["drained_count"] >= 50
    finally:
        assert wait_until(lambda: not open(os.path.join(limited, "cgroup.procs")).read().split())
        os.rmdir(limited)


def thread_states(pid):
    """The states of pid's threads, the command's only child below the supervisor."""
    states = []
    for child in descendants(pid):
        try:
            for tid in os.listdir("/proc/%d/task" % child):
                with open("/proc/%d/task/%s/stat" % (child, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
    return states


# --- The receipt has a bounded size -----------------------------------------------------------------

@heavy
def test_a_thousand_huge_argvs_cannot_swell_the_receipt(paths):
    """1,000 processes with 70 KB of argv each made a 310 MiB receipt that took
    longer to write than exec_timeout() leaves. A receipt names a process by
    its name in /proc/PID/stat (15 bytes at most), and lists at most 1,000
    drained: its size is bounded by construction."""
    # sh keeps its argv while it waits for its sleep (no exec of the last command).
    script = ("import os, sys, time\n"
              "big = ['x' * 7000] * 10\n"
              "for i in range(1000):\n"
              "    if os.fork() == 0:\n"
              "        os.execvp('sh', ['sh', '-c', 'sleep 300; :'] + big)\n"
              "print('READY', flush=True)\n"
              "time.sleep(300)\n")
    proc = start_supervisor(*paths.options(cleanup=2, stop=True) + ["--", PY, "-c", script])
    read_lines_until(proc.stdout, "READY", timeout=60)
    huge = [b"sh", b"-c", b"sleep 300; :"] + [b"x" * 7000] * 10
    assert wait_until(lambda: len(running(proc.pid, huge)) == 1000, timeout=60)
    assert wait_until(lambda: len(running(proc.pid, [b"sleep", b"300"])) == 1000, timeout=60)
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    size = paths.receipt.stat().st_size
    receipt = read_receipt(paths.receipt)
    assert size <= 1 << 17
    assert receipt["drained_count"] == 2001 and len(receipt["drained"]) == 1000
    assert all(set(d) == {"pid", "name"} and len(d["name"].encode()) <= 15
               for d in receipt["drained"])


@heavy
def test_two_hundred_kept_services_are_all_listed_and_ended(paths, containment):
    """200 kept services whose argvs are many short words: the fitting loop
    that cut receipts to 1 MiB dropped `preserved` entries from a 5 KiB
    receipt (it miscounted their size), and --end-kept then said all gone
    while all 200 ran. Every kept root is listed, and all are ended (with a
    cgroup: without one, --end-kept refuses)."""
    kind, options = containment
    words = " ".join(["w"] * 2000)
    script = ("for i in $(seq 200); do setsid -f sh -c 'sleep 300; :' sh %s >/dev/null 2>&1; "
              "done; exit 0" % words)
    result = run_supervisor(*paths.options(cleanup=5) + options + [
        "--preserve-descendants-on-success", "--", "sh", "-c", script])
    receipt = read_receipt(paths.receipt)
    kept = [p["pid"] for p in receipt["preserved"]]
    try:
        assert result.returncode == 0, result.stderr
        assert receipt["containment"] == kind and len(kept) == 200, len(kept)
        ended = run_supervisor("--end-kept", paths.receipt, "-k", "10")
        if kind == "children":  # kept without a cgroup: refused, nothing ended (the owner's)
            assert ended.returncode == 125 and "without a cgroup" in ended.stderr, ended.stderr
            return
        assert ended.returncode == 0 and "all kept processes are gone" in ended.stderr, ended.stderr
        assert not any(alive(pid) for pid in kept)
    finally:
        kill_all([p for pid in kept for p in descendants(pid) + [pid] if alive(p)])


# --- An untrusted command cannot suspend the deadline -----------------------------------------------

@needs_root
def test_a_user_command_that_stops_itself_does_not_stop_the_supervisor(open_dir):
    """At a terminal, a command that has the terminal and stops (Ctrl-Z, or
    kill -STOP itself) takes the supervisor along, as a shell would; under
    --user the supervisor does not follow it: the deadline holds."""
    from test_unix import run_in_pty_until
    argv = supervisor_cmd("--timeout", 1, "--cleanup-timeout", 1, "--workdir", open_dir["work"],
                          "--receipt", open_dir["receipt"], "--user", "nobody", "--",
                          "sh", "-c", "echo stopping; kill -STOP $$; sleep 300")
    assert run_in_pty_until(argv, "stopping") == 124
    receipt = read_receipt(open_dir["receipt"])
    assert receipt["timed_out"] is True and receipt["cleanup_confirmed"] is True


# --- A signal flood cannot delay the exit -----------------------------------------------------------

FLOOD = r"""
import os, signal, sys
fd = os.pidfd_open(int(sys.argv[1]))
print("flooding", flush=True)
while True:  # as fast as it can: the queue fills, and it goes on
    try:
        signal.pidfd_send_signal(fd, signal.SIGRTMIN + 5)
    except ProcessLookupError:
        break
    except OSError:
        pass
"""


@heavy
def test_a_flood_of_real_time_signals_cannot_delay_the_exit(paths):
    """A process of the same uid outside the run queues real-time signals at
    the supervisor as fast as it can, from before the stop to after the
    supervisor exits. Each would run a handler; once the receipt is decided
    they are held, so the exit comes within the bound, not when the flood
    ends."""
    proc = start_supervisor(*paths.options(timeout=60, cleanup=0.5) + [
        "--", "sh", "-c", "echo started; exec sleep 300"])
    read_lines_until(proc.stdout, "started")
    flooder = spawn([PY, "-c", FLOOD, str(proc.pid)])
    try:
        read_lines_until(flooder.stdout, "flooding")
        started = time.monotonic()
        status, _, err = finish(proc)
        elapsed = time.monotonic() - started
    finally:
        flooder.wait(timeout=120)  # it ends when the supervisor is gone
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGRTMIN+5"
    assert receipt["cleanup_confirmed"] is True, err
    assert elapsed <= 3 * 0.5 + 3 + 5, elapsed  # the bound, and start-up's margin


# --- What is at the receipt path ----------------------------------------------------------------------

@needs_root
@pytest.mark.parametrize("stdout", ["pipe", "log file"])
def test_the_receipt_path_is_never_dev_stdout(paths, tmp_path, stdout):
    """/dev/stdout is a symlink to /proc/self/fd/1: replacing it with a file
    would break the machine's /dev. Refused (a symlink at the receipt's path
    is never a receipt), and the link is as it was, also when stdout is a
    log file. (In a private mount namespace, over a /dev of the test's own: a
    supervisor that got it wrong cannot hurt the host's.)"""
    log = tmp_path / "controller.log"
    redirect = " > %s" % log if stdout == "log file" else ""
    check = ('mount -t tmpfs tmpfs /dev && ln -s /proc/self/fd/1 /dev/stdout && '
             '{ %s%s; echo status=$?; readlink /dev/stdout; }' % (shlex.join(supervisor_cmd(
                 "--timeout", 5, "--receipt", "/dev/stdout", "--", "true")), redirect))
    result = run(in_private_mounts(["sh", "-c", check]), cwd="/")
    assert "status=125" in result.stdout, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "/proc/self/fd/1"
    assert result.stderr.count("\n") == 1 and "a symlink is there" in result.stderr


def test_a_dotdot_after_a_symlink_means_what_the_kernel_says(paths, tmp_path):
    """link/../receipt.json: the kernel's `..` is the parent of where the link
    leads, the text's the directory holding the link. Paths are never
    cleaned as text: the receipt is judged and written where the kernel
    resolves the path, which is where a controller that opens it reads."""
    elsewhere = tmp_path / "elsewhere" / "deep"
    elsewhere.mkdir(parents=True)
    (tmp_path / "link").symlink_to(elsewhere)
    given = tmp_path / "link" / ".." / "receipt.json"
    result = run_supervisor("--timeout", 5, "--workdir", paths.work, "--receipt", given,
                            "--", "true")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "elsewhere" / "receipt.json").exists()
    assert read_receipt(given)["cleanup_confirmed"] is True
    assert not (tmp_path / "receipt.json").exists()


def test_a_symlink_at_the_receipt_path_to_a_fifo_is_refused(paths, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    paths.receipt.parent.mkdir()
    paths.receipt.symlink_to(fifo)
    result = run_supervisor(*paths.options() + ["--", "true"])
    assert result.returncode == 125 and "a symlink is there" in result.stderr
    assert paths.receipt.is_symlink() and os.path.exists(str(fifo))


def test_an_empty_command_is_not_found(paths):
    result = run_supervisor(*paths.options() + ["--", ""])
    assert result.returncode == 127, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["error"].startswith("cannot run ''") and "ValueError" not in receipt["error"]


def test_writing_receipts_leaks_no_descriptor(tmp_path):
    """Each write proves first that a temporary can be made: its descriptor
    is closed too, and nothing but the receipt is left."""
    code = ("import os, supervisor as s\n"
            "before = len(os.listdir('/proc/self/fd'))\n"
            "for i in range(5):\n"
            "    s.write_receipt({'cleanup_confirmed': False}, %r)\n"
            "print(len(os.listdir('/proc/self/fd')) - before)\n" % str(tmp_path / "r.json"))
    result = run([PY, "-c", code], cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    assert sorted(os.listdir(str(tmp_path))) == ["r.json"]


def test_an_earlier_receipt_goes_whatever_the_refusal(paths):
    """A refusal removes the receipt already at the path, whatever refuses:
    a bad duration, a bad signal, a receipt inside the workdir."""
    earlier = json.dumps({"cleanup_confirmed": True})
    inside = paths.work / "receipt.json"
    for args, receipt in ((["--timeout", "0"], paths.receipt),
                          (["-s", "BOGUS", "--timeout", "5"], paths.receipt),
                          (["--timeout", "5"], inside)):
        receipt.parent.mkdir(exist_ok=True)
        receipt.write_text(earlier)
        result = run_supervisor(*args + ["--workdir", paths.work, "--receipt", receipt,
                                         "--", "true"])
        assert result.returncode == 125, (args, result.stderr)
        assert not receipt.exists(), args


@pytest.mark.parametrize("command", [["mytool", "--receipt"], ["--", "cp", "--receipt"],
                                     ["-k", "--receipt", "--", "cp"]],
                         ids=["first-non-option", "after-dashes", "an-option-value"])
def test_a_refusal_removes_no_receipt_named_by_the_command(paths, command):
    """The command's own --receipt (from its first non-option, or after --,
    or the value of one of our options) names a file of the command's: a
    refusal removes only the receipt of this run."""
    paths.receipt.parent.mkdir()
    paths.receipt.write_text("{}")
    victim = paths.receipt.parent / "victim"
    victim.write_text("keep me")
    argv = command + [str(victim)] if command[0] != "-k" else (
        command[:2] + [str(victim)] + command[2:])
    result = run_supervisor("--timeout", "0", "--receipt", paths.receipt, *argv)
    assert result.returncode == 125, result.stderr
    assert victim.read_text() == "keep me"
    assert not paths.receipt.exists()


def test_what_is_not_a_file_at_the_receipt_path_is_left_and_said(paths):
    paths.receipt.parent.mkdir()
    os.mkfifo(str(paths.receipt))
    result = run_supervisor("--timeout", "0", "--workdir", paths.work, "--receipt",
                            paths.receipt, "--", "true")
    assert result.returncode == 125
    assert "FIFO" in result.stderr and "left alone" in result.stderr
    assert paths.receipt.exists()


@heavy
def test_after_an_unconfirmed_run_survivors_lists_what_is_alive(paths, tmp_path):
    """A look cut short said nothing; now a census lists what is alive, with
    the count beside it. 200 processes frozen by a cgroup v1 freezer survive
    SIGKILL (state D) until thawed."""
    freezer = "/sys/fs/cgroup/freezer"
    if not IS_ROOT or not os.path.isdir(freezer):
        pytest.skip("needs root and a cgroup v1 freezer")
    cgroup = os.path.join(freezer, "hostile-test-%d" % os.getpid())
    os.mkdir(cgroup)
    script = ("for i in $(seq 200); do setsid sleep 300 & done; echo READY; exec sleep 300")
    try:
        proc = start_supervisor(*paths.options(cleanup=0.3, stop=True) + [
            "--", "sh", "-c", script])
        read_lines_until(proc.stdout, "READY")
        assert wait_until(lambda: len(running(proc.pid, [b"sleep", b"300"])) == 201)
        for pid in running(proc.pid, [b"sleep", b"300"]):
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        with open(os.path.join(cgroup, "freezer.state"), "w") as f:
            f.write("FROZEN")
        paths.stop.write_text("")
        status, _, err = finish(proc)
        receipt = read_receipt(paths.receipt)
        assert status == 125
        assert receipt["survivors_count"] >= 200 and len(receipt["survivors"]) >= 200
        assert all(s["state"] == "D" for s in receipt["survivors"])
    finally:
        with open(os.path.join(cgroup, "freezer.state"), "w") as f:
            f.write("THAWED")
        wait_until(lambda: not open(os.path.join(cgroup, "cgroup.procs")).read().strip())
        os.rmdir(cgroup)


# --- Big trees within the budget ---------------------------------------------------------------------

FIVE_THOUSAND = r"""
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the drain's SIGKILL ends them
for i in range(5000):
    if os.fork() == 0:
        os.setsid()
        while True:
            signal.pause()
signal.signal(signal.SIGTERM, signal.SIG_DFL)
print("READY", flush=True)
time.sleep(600)
"""


@heavy
@needs_root
def test_five_thousand_sessions_are_drained_within_the_default_budget(paths):
    """5,000 processes in sessions of their own, deaf to SIGTERM: the /proc
    walk drains and confirms them within the default budget (10 s). In a PID
    namespace of its own."""
    argv = ["unshare", "--pid", "--fork", "--mount-proc"] + supervisor_cmd(
        "--timeout", 600, "--workdir", paths.work, "--receipt", paths.receipt,
        "--stop-file", paths.stop, "--containment", "proc", "--", PY, "-c", FIVE_THOUSAND)
    proc = spawn(argv)
    read_lines_until(proc.stdout, "READY", timeout=120)
    paths.stop.write_text("")
    supervisor = supervisor_below(proc.pid)
    # The grace would last its 10 s (they ignore SIGTERM): two stop signals
    # hurry it (after the stop file's stop, the first is that stop again).
    kill_pinned(supervisor, signal.SIGTERM)
    kill_pinned(supervisor, signal.SIGINT)
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    assert receipt["containment"] == "children"
    assert receipt["cleanup_confirmed"] is True, err
    assert receipt["drained_count"] >= 5001
    draining = [s for s in receipt["ladder"] if s["step"] == "draining"][0]
    assert draining["duration_s"] <= 10.0, receipt["ladder"]
