"""Shared test machinery: run the CLI as users do, and prove no test leaks.

The pytest process makes itself a child subreaper, so whatever a test starts
and leaves behind (a preserved service, an escaped orphan) is re-parented to
it. The autouse fixture `no_leaks` then finds every descendant the test added,
kills them by pid (they are provably ours: our descendants, pinned by
pidfd), and fails the test.
"""
import calendar
import ctypes
import glob
import json
import os
import select
import signal
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

if os.environ.get("TREEREAP_IN_GUEST") != "1":  # (the guest's batch has no use for it:
    # there, its 80 modules' assertion rewriting costs 12 s of the emulated CPU)
    from hypothesis import HealthCheck, settings
    # Hypothesis times each example (200 ms by default): on a loaded machine
    # that is a race against the CPU, never what a test checks.
    settings.register_profile("loaded", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("loaded")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUPERVISOR = os.path.join(ROOT, "supervisor.py")
# SUPERVISOR_ENTRY=PATH, a treereap.pyz (scripts/build_pyz.py): every command
# line the tests build runs it instead of supervisor.py (SUPERVISOR names it;
# SOURCE is always supervisor.py). For the CLI tests: test_cli, test_timeout,
# test_run, test_pythons; _ENTRY_SKIPS lists what cannot go through it.
SOURCE = SUPERVISOR
ENTRY = os.environ.get("SUPERVISOR_ENTRY") or None
if ENTRY:
    SUPERVISOR = ENTRY = os.path.abspath(ENTRY)
HELPERS = os.path.join(ROOT, "tests", "helpers")
PY = sys.executable
IS_ROOT = os.geteuid() == 0
PR_SET_CHILD_SUBREAPER = 36

# CPU- and PID-heavy tests (storms, floods, trees of a thousand) run in one
# xdist group, on one worker, one at a time (pyproject.toml: --dist loadgroup),
# so that two never compete with each other for the machine.
heavy = pytest.mark.xdist_group("heavy")


# --- Interpreters -----------------------------------------------------------------

def _version_of(python):
    try:
        out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode().strip() if out.returncode == 0 else None


def discover_pythons():
    """{"3.6": path, ...}: SUPERVISOR_TEST_PYTHONS (paths separated by ':'),
    else every pyenv CPython 3.x, always with the one running the tests."""
    listed = os.environ.get("SUPERVISOR_TEST_PYTHONS")
    if listed:
        candidates = listed.split(os.pathsep)
    else:
        pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
        candidates = sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.*", "bin", "python")))
    found = {}
    for python in dict.fromkeys(candidates + [PY]):
        version = _version_of(python)
        if version and version.startswith("3."):
            found.setdefault(version, python)
    return dict(sorted(found.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("."))))


PYTHONS = discover_pythons()


def _cgroup_containment_works():
    """Can this machine give a run a cgroup of its own (a writable cgroup v2
    hierarchy, as here when root: grep cgroup2 /proc/self/mountinfo)?"""
    try:
        result = subprocess.run([PY, SUPERVISOR, "--timeout", "10", "--containment", "cgroup",
                                 "--", "true"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd="/", timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


HAS_CGROUP = _cgroup_containment_works()


def _cgroup2_mount():
    """Where the cgroup v2 hierarchy's root is mounted: found, never assumed
    (/sys/fs/cgroup/unified on a hybrid host like this one, /sys/fs/cgroup on
    a pure v2 one); a non-existent path where there is none."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, _, after = line.partition(" - ")
            fields = before.split()
            if after.split()[:1] == ["cgroup2"] and fields[3] == "/":
                return fields[4]
    return "/nonexistent/cgroup2"


CGROUP_ROOT = _cgroup2_mount()
needs_cgroup = pytest.mark.skipif(not HAS_CGROUP, reason="needs a writable cgroup v2 hierarchy "
                                  "(root, and grep cgroup2 /proc/self/mountinfo)")
# What the default containment (auto) is here.
DEFAULT_CONTAINMENT = "cgroup" if HAS_CGROUP else "children"


@pytest.fixture(params=["cgroup", "children"])
def containment(request):
    """Each containment in turn: (its name, the options that choose it)."""
    kind = request.param
    if kind == "cgroup" and not HAS_CGROUP:
        pytest.skip("needs a writable cgroup v2 hierarchy (root)")
    return kind, ["--containment", "cgroup" if kind == "cgroup" else "proc"]
REQUIRED = [v for v in os.environ.get("SUPERVISOR_REQUIRE_PYTHONS", "").split(",") if v]
THIS_PYTHON = "%d.%d" % sys.version_info[:2]
# The whole suite runs under the interpreter that runs pytest; every other
# CPython runs the smoke subset in test_pythons.py.
OTHER_PYTHONS = [v for v in PYTHONS if v != THIS_PYTHON]


def pytest_configure(config):
    if ENTRY and not os.path.isfile(ENTRY):
        raise pytest.UsageError("SUPERVISOR_ENTRY=%s: no such file (build one: "
                                "python3 scripts/build_pyz.py -o PATH)" % ENTRY)
    missing = [v for v in REQUIRED if v not in PYTHONS]
    if missing:
        raise pytest.UsageError("SUPERVISOR_REQUIRE_PYTHONS wants CPython %s, not found here "
                                "(found %s)" % (", ".join(missing), ", ".join(PYTHONS)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise pytest.UsageError("tests need Linux >= 3.4 (PR_SET_CHILD_SUBREAPER)")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests that run processes as nobody (those that take open_dir) share a
    uid: a supervisor with --user nobody counts every other process of that
    uid that started during its run against its confirmation, as it must. So
    they run in one xdist group, one at a time, never beside each other."""
    if ENTRY:
        _mark_what_the_entry_cannot_run(items)
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if "open_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("nobody"))


# Under SUPERVISOR_ENTRY, the tests of the CLI files that never run the entry
# (they import supervisor.py or read it, or run it by its own path): skipped,
# as they prove nothing about the pyz (the plain suite runs them).
_IMPORTS = "imports supervisor.py in-process: not a command line"
_ENTRY_SKIPS = dict(
    [("test_cli.py::" + name, _IMPORTS) for name in (
        "test_parse_duration_accepts_every_positive_number",
        "test_parse_duration_accepts_only_positive_finite_values",
        "test_exec_timeout_stays_finite_for_the_largest_duration", "test_refuses_outside_linux")]
    + [("test_run.py::" + name, _IMPORTS) for name in (
        "test_api_exec_timeout_and_constants", "test_api_supervise_returns_the_receipt",
        "test_api_refuses_a_bad_argv_before_starting", "test_api_import_has_no_side_effects",
        "test_api_cleanup_receipt_type",
        "test_api_leaves_the_callers_children_for_the_caller_to_wait_for")]
    + [("test_pythons.py::test_the_api", _IMPORTS),
       ("test_pythons.py::test_the_file_compiles", "compiles supervisor.py's source (a pyz "
        "holds bytecode compiled by each CPython: tests/test_pyz.py)"),
       ("test_cli.py::test_version", "a pyz's --version names the sha256 it was built from "
        "(tests/test_pyz.py checks it)"),
       ("test_cli.py::test_refuses_a_proc_of_another_pid_namespace",
        "runs ROOT/supervisor.py by its own path, not SUPERVISOR")])


def _mark_what_the_entry_cannot_run(items):
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        key = "%s::%s" % (os.path.basename(item.nodeid.split("::")[0]), name)
        if key in _ENTRY_SKIPS:
            item.add_marker(pytest.mark.skip(reason="SUPERVISOR_ENTRY: " + _ENTRY_SKIPS[key]))


@pytest.fixture(params=OTHER_PYTHONS, ids=lambda v: "py" + v)
def other_python(request):
    """Each CPython on the machine but the one running pytest."""
    return PYTHONS[request.param]


# --- /proc ------------------------------------------------------------------------------

def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (the state is
    [0]), or None when pid is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()


def proc_stat(pid):
    """(state, ppid, pgid, sid, start) of pid, or None when it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return (fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19]))


def alive(pid, start=None):
    """Is pid alive (not a zombie), and the same process when start is given?"""
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in "ZX" and (start is None or stat[4] == start)


def children_of(pid):
    """pid's children, from the children files of its threads (this kernel
    has them: CONFIG_PROC_CHILDREN); [] when it is gone."""
    found = []
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                found.extend(int(word) for word in f.read().split())
        except OSError:
            pass
    return found


def descendants(pid):
    """pid's descendants, by the children files: a walk of our own tree,
    which costs what the tree costs, not what the host's processes do (a
    heavy test beside this one may have thousands)."""
    found, todo = [], children_of(pid)
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children_of(p))
    return found


def supervisor_below(pid, missing_ok=False):
    """The supervisor's pid among pid and its descendants (as the host sees
    it): `PY supervisor.py ...`, not unshare or a shell, whose arguments may
    name it too."""
    for candidate in [pid] + descendants(pid):
        try:
            with open("/proc/%d/cmdline" % candidate, "rb") as f:
                if f.read().split(b"\0")[1:2] == [SUPERVISOR.encode()]:
                    return candidate
        except OSError:
            pass
    if missing_ok:
        return None
    raise AssertionError("no supervisor below %d" % pid)


def running(pid, argv):
    """The live descendants of pid running argv (a list of bytes; a zombie
    has no argv)."""
    found = []
    for candidate in descendants(pid):
        try:
            with open("/proc/%d/cmdline" % candidate, "rb") as f:
                if f.read().split(b"\0")[:-1] == argv:
                    found.append(candidate)
        except OSError:
            pass
    return found


def inotify_watches(pid):
    """Inode numbers that pid's inotify descriptors watch (/proc/PID/fdinfo)."""
    inodes = set()
    for name in os.listdir("/proc/%d/fdinfo" % pid):
        try:
            with open("/proc/%d/fdinfo/%s" % (pid, name)) as f:
                for line in f:
                    if line.startswith("inotify wd:"):
                        inodes.add(int(line.split("ino:")[1].split()[0], 16))
        except OSError:
            pass
    return inodes


def wait_until(predicate, timeout=30.0, interval=0.01):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def reap_adopted_zombies():
    """Reap zombies re-parented to us (we are a subreaper)."""
    for pid in children_of(os.getpid()):
        if (proc_stat(pid) or ("?",))[0] == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def descends_from_us(pid):
    """Is pid a descendant of this process? Walked up from pid, not down
    from us: a walk down misses a process whose parent dies between two
    reads (it moves to a list already read), which is how a test's command
    ends when its supervisor is killed. A link that dies under the walk up
    has handed its children on: the walk starts again."""
    me = os.getpid()
    for _ in range(100):
        current = pid
        while True:
            stat = proc_stat(current)
            if stat is None or (stat[0] in "ZX" and current != pid):
                break  # gone or dead under us: its children moved; again
            if stat[1] == me:
                return True
            if stat[1] in (0, 1):
                return False
            current = stat[1]
        if proc_stat(pid) is None:
            return False
    return False


def kill_pinned(pid, sig=signal.SIGKILL):
    """Signal pid through a pidfd, so a pid reused meanwhile is never hit;
    and only if it descends from us, checked after the pidfd was taken."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if descends_from_us(pid):
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def kill_all(pids):
    """End what a test deliberately left running (preserved services), by pid
    and pidfd, and wait until they are gone."""
    for pid in pids:
        kill_pinned(pid)
    assert wait_until(lambda: not any(alive(pid) for pid in pids))


# A storm's sessions each get an autogroup, as much CPU as the whole of any
# other session: beside 255 of them, the other worker's tests would wait
# seconds for a process to start or to die. So a heavy test runs with its
# worker moved into a cgroup of the (v1) cpu hierarchy, whose tasks are not
# autogrouped: all of it weighs as one session, and the other worker gets
# its share. No quota: alone, it has both CPUs. The v2 cgroup, where a
# supervisor makes the run's, is not touched. Where there is no v1 cpu
# hierarchy (or no root), nothing changes.
CPU_V1 = "/sys/fs/cgroup/cpu"


@pytest.fixture(autouse=True)
def heavy_tests_weigh_as_one_session(request):
    marker = request.node.get_closest_marker("xdist_group")
    if (marker is None or marker.args[:1] != ("heavy",) or not IS_ROOT
            or not os.path.exists(os.path.join(CPU_V1, "cpu.shares"))):
        yield
        return
    group = os.path.join(CPU_V1, "supervisor-tests-heavy-%d" % os.getpid())
    os.mkdir(group)
    try:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        yield
    finally:
        with open(os.path.join(CPU_V1, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        assert wait_until(lambda: _empty(group), timeout=10)
        os.rmdir(group)


def _empty(cgroup):
    with open(os.path.join(cgroup, "cgroup.procs")) as f:
        return not f.read().split()


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail any test that leaves a process behind, after killing it by pid."""
    before = set(descendants(os.getpid()))
    yield
    reap_adopted_zombies()

    def leaked():
        return [p for p in descendants(os.getpid())
                if p not in before and (proc_stat(p) or ("Z",))[0] not in "ZX"]

    wait_until(lambda: not leaked(), timeout=3.0)
    left = leaked()
    described = [describe(pid) for pid in left]
    for pid in left:
        kill_pinned(pid)
    wait_until(lambda: not leaked(), timeout=5.0)
    reap_adopted_zombies()
    assert not left, "the test left processes alive: %s" % described


def describe(pid):
    """pid, /proc stat fields and argv: what a leaked process was."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        argv = "?"
    return "%d %s %r" % (pid, proc_stat(pid), argv)


# --- Running the CLI ------------------------------------------------------------------------

def supervisor_cmd(*args, python=PY):
    """python: an interpreter, or a list that ends with one (a wrapper first)."""
    prefix = list(python) if isinstance(python, (list, tuple)) else [python]
    return prefix + [SUPERVISOR] + [str(a) for a in args]


# Every catchable signal Python can set, for plain_signals(); 32 and 33 are the
# C library's, which Python refuses, yet a parent can leave them ignored (an
# xdist worker on 3.13 does): those are reset by the raw syscall.
_CATCHABLE = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
_RT_SIGACTION = {"x86_64": 13, "aarch64": 134}.get(os.uname().machine)


def _default_libc_signals():
    if _RT_SIGACTION is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    default = (ctypes.c_ulong * 4)()  # handler SIG_DFL, flags, restorer, mask: all 0
    for sig in range(32, signal.SIGRTMIN):
        libc.syscall(_RT_SIGACTION, sig, default, None, 8)


def plain_signals(blocked=(), ignored=(), then=None):
    """A preexec_fn that gives the child a known signal state: every signal at
    its default and none blocked, then `ignored` ignored and `blocked`
    blocked, then `then()`. Without it, a child inherits whatever pytest was
    started with (an xdist worker ignores signal 32 on 3.13; nohup ignores
    SIGHUP)."""
    def prepare():
        for sig in _CATCHABLE:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # one the C library keeps for itself
        _default_libc_signals()
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if then is not None:
            then()
    return prepare


def _child_defaults(kwargs):
    """What every supervisor a test starts gets unless the test says otherwise:
    pipes for its output, no terminal on stdin, a plain signal state."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    kwargs.setdefault("preexec_fn", plain_signals())
    return kwargs


def spawn(argv, **kwargs):
    """subprocess.Popen with the defaults of _child_defaults()."""
    return subprocess.Popen([str(a) for a in argv], **_child_defaults(kwargs))


def run(argv, timeout=120, **kwargs):
    """subprocess.run, text mode, with the defaults of _child_defaults()."""
    if "input" in kwargs:
        kwargs.setdefault("stdin", None)
    return subprocess.run([str(a) for a in argv], timeout=timeout, universal_newlines=True,
                          **_child_defaults(kwargs))


def run_supervisor(*args, python=PY, timeout=120, **kwargs):
    """Run the CLI to its end; stdout and stderr captured as text."""
    if "input" in kwargs:
        kwargs.setdefault("stdin", None)
    return subprocess.run(supervisor_cmd(*args, python=python), timeout=timeout,
                          universal_newlines=True, **_child_defaults(kwargs))


def start_supervisor(*args, python=PY, **kwargs):
    return subprocess.Popen(supervisor_cmd(*args, python=python), **_child_defaults(kwargs))


def finish(proc, timeout=120):
    """Wait for a started supervisor to exit; (returncode, stdout, stderr) as
    text. Reads what is in the pipes, not to EOF: a preserved service may hold
    them open."""
    chunks = {proc.stdout: [_LEFTOVER.pop(proc.stdout, b"")],
              proc.stderr: [_LEFTOVER.pop(proc.stderr, b"")]}
    streams = [s for s in chunks if s is not None]
    end = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > end:
            proc.kill()
            proc.wait()
            raise AssertionError("the supervisor did not exit within %ss" % timeout)
        for stream in select.select(streams, [], [], 0.05)[0]:
            chunks[stream].append(os.read(stream.fileno(), 65536))
    for stream in streams:
        os.set_blocking(stream.fileno(), False)
        try:
            while True:
                data = os.read(stream.fileno(), 65536)
                if not data:
                    break
                chunks[stream].append(data)
        except BlockingIOError:
            pass
        stream.close()
    text = lambda stream: b"".join(chunks[stream]).decode("utf-8", "replace")
    return proc.returncode, text(proc.stdout), text(proc.stderr)


# What read_lines_until() read from a stream past the line it waited for: the
# next call, and finish(), start with it (two lines can come in one read).
_LEFTOVER = {}


def read_lines_until(stream, last, timeout=20.0):
    """Lines from a pipe up to and including `last`; fails on EOF or timeout."""
    return _read_lines(stream, lambda lines: lines[-1] == last,
                       "no %r within %ss" % (last, timeout), timeout)


def read_lines(stream, count, timeout=20.0):
    """The next `count` lines from a pipe; fails on EOF or timeout."""
    return _read_lines(stream, lambda lines: len(lines) == count,
                       "not %d lines within %ss" % (count, timeout), timeout)


def _read_lines(stream, done, failure, timeout):
    lines, buf, fd = [], _LEFTOVER.pop(stream, b""), stream.fileno()
    end = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines.append(line.decode())
            if done(lines):
                _LEFTOVER[stream] = buf
                return lines
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise AssertionError("%s; got %r" % (failure, lines))
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError("EOF: %s; got %r" % (failure, lines))
            buf += chunk


def tree_cmd(spec, python=PY):
    return [python, os.path.join(HELPERS, "tree.py"), json.dumps(spec)]


def start_tree(spec, *options, python=PY, tree_python=PY, **kwargs):
    """Start the supervisor on a tree helper and wait until the tree is built.
    Returns (process, {node name: pid})."""
    proc = start_supervisor(*(list(options) + ["--"] + tree_cmd(spec, tree_python)),
                            python=python, **kwargs)
    try:
        lines = read_lines_until(proc.stdout, "READY")
    except AssertionError:
        proc.kill()
        proc.wait()
        raise
    nodes = {}
    for line in lines:
        if line.startswith("NODE "):
            _, name, pid = line.split()
            nodes[name] = int(pid)
    return proc, nodes


class Paths(object):
    """A workdir, a receipt path outside it (its directory not yet made), and
    a stop-file path: the usual layout of one supervised run."""

    def __init__(self, tmp_path):
        self.work = tmp_path / "work"
        self.work.mkdir()
        self.receipt = tmp_path / "out" / "receipt.json"
        self.stop = tmp_path / "stop"

    def options(self, timeout=30, cleanup=2, stop=False):
        opts = ["--timeout", timeout, "--cleanup-timeout", cleanup,
                "--workdir", self.work, "--receipt", self.receipt]
        return opts + (["--stop-file", self.stop] if stop else [])


@pytest.fixture
def paths(tmp_path):
    return Paths(tmp_path)


def stop_noticed_after(receipt, created):
    """Seconds from `created` (time.time()) to the stop decision, by the
    receipt's own clock: the start of its first cleanup step."""
    started = calendar.timegm(time.strptime(receipt["started_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    started += float("0." + receipt["started_at"][20:26])
    return started + receipt["ladder"][0]["start_s"] - created


@pytest.fixture
def open_dir():
    """A directory everyone can reach (pytest's tmp_path is 0700): a world
    workdir `work`, and `ctl`, only root's, for the receipt."""
    top = tempfile.mkdtemp(prefix="trust-", dir="/tmp")
    os.chmod(top, 0o755)
    work = os.path.join(top, "work")
    ctl = os.path.join(top, "ctl")
    os.mkdir(work, 0o777)
    os.chmod(work, 0o777)
    os.mkdir(ctl, 0o755)
    yield {"top": top, "work": work, "ctl": ctl, "receipt": os.path.join(ctl, "receipt.json")}
    shutil.rmtree(top, ignore_errors=True)


def read_receipt(path):
    with open(str(path)) as f:
        return json.load(f)
