#!/usr/bin/env python3
"""supervisor.py: run a command tree under a deadline, drain what it leaves, prove it.

    python3 supervisor.py --timeout DURATION [OPTIONS] -- COMMAND [ARG...]
    python3 supervisor.py --end-kept RECEIPT [-k DURATION]

COMMAND runs in a process group of its own, in a cgroup of its own where one
can be made, below this process as a child subreaper, so that every process
of the run descends from it. The run ends when COMMAND exits by itself, the
deadline passes, the stop file appears, its CPU time is spent or a stop
signal arrives: then what is left is stopped (the stop signal, a grace,
SIGKILL) and drained; the states it goes through are _drive()'s. What is
kept: nothing by default; with --preserve-descendants-on-success everything,
after an exit 0 that nothing stopped. The receipt, a JSON file, says what happened and
whether it was observed that nothing of the run is left alive.

Exit status (the conventions of timeout(1)):
    N       COMMAND exited with N
    128+N   COMMAND died of signal N, or signal N sent to the supervisor stopped it
    124     the deadline or the stop file stopped the run
    125     the supervisor failed, or cleanup could not be confirmed (overrides all)
    126     COMMAND was found but could not be executed
    127     COMMAND was not found
    137     a stop had to end COMMAND with SIGKILL

Standard library only; Linux; CPython 3.6 to 3.13. Importing it has no side
effects: supervise() is the API, main() the command line. Why a confirmation
can be trusted is argued once, in docs/design.md ("Why a confirmation can be
trusted"); the code points there.

The file, top to bottom: each section (its banner, `# --- TITLE ---`) and
its entry points, in the order they stand (tests/test_docs.py checks it):

    Constants                        RECEIPT_SCHEMA_VERSION, POLICIES, CONTAINMENTS, STATES
    Errors and the receipt type      SupervisorError, UsageError, ObservationError, CleanupReceipt
    Linux primitives                 _libc, _pidfd_open, _openat2, _wait_ready, _signalfd
    /proc                            _Proc, _ProcFS (opened once, read without crossing a mount)
    Beside the containment           _Children, _CallersJobs, _Reaper, _FdBudget, _Record
    Waiting for processes to go      _Pin, _PinWaiter, _EventWaiter, _Pause, _Round
    The walk: the run's tree         _Scope, _Walk, _Walker (from us down, each pid proven)
    The seam, and the walk alone     _Look, _ProcContainment
    The containment by a cgroup      _Cgroup, _find_cgroup_home, _cgroup_for_run, _CgroupContainment
    Signals and the stop file        _SignalCatcher (a signalfd), _StopFileWatch, _lookout
    --user                           _User, _check_user_may_not_replace
    The plan and its checks          _Plan, _checked, _checked_plan, _parse_size, _parse_signal
    The run and its outcome          _Outcome, _Run, _enter (the state), _wait, _SIGNAL_ACTIONS
    Job control                      _CtrlC, _suspend
    The exec report and the output   _ExecReport, _Output
    The phases: starting, running    _execute, _drive (the driver), _prepare, _decide_stop,
                                     _start_command, _run_until_stop
    The phases: the stop, the drain  _keeps_everything, _stop_and_wait, _drain
    The phases: done, the account    _finish, _note_survivors, _account
    When the supervisor fails        _fail, _abandon, _release
    The receipt                      _receipt (the projection), _ReceiptTarget
    The API                          exec_timeout, supervise, write_receipt, parse_duration
    The owner's teardown             end_kept, _kept_alive, _end_kept_cgroups
    The command line                 _OPTIONS (the one table of options), _parse_args, main
"""
import errno
import os
import select
import sys
import time

if sys.version_info < (3, 6):  # one line, not the traceback of the import below
    sys.stderr.write("treereap: needs Python 3.6 or later; this is %s\n" % sys.version.split()[0])
    sys.exit(125)

# The C module behind `signal` (every CPython 3.6 to 3.13 has it): the same
# calls, without the enum wrappers whose import costs ~3 ms on every run.
import _signal as signal
# json's C escaper without json (its re and enum cost ~3.4 ms), loaded now:
# at the receipt's writing the descriptors may have run out (dlopen needs one).
# test_trust.py::test_a_look_that_fails_is_never_an_empty_one
from _json import encode_basestring_ascii as _quoted

__version__ = "3.3.0"
__all__ = [
    "CLEANUP_PHASE_COUNT", "CONTAINMENTS", "DEFAULT_CLEANUP_TIMEOUT", "EXEC_TIMEOUT_SLACK",
    "EXIT_CANNOT_EXECUTE", "EXIT_FAILURE", "EXIT_KILLED", "EXIT_NOT_FOUND", "EXIT_TIMED_OUT",
    "POLICIES", "RECEIPT_SCHEMA_VERSION", "STATES", "CleanupReceipt", "ObservationError",
    "SupervisorError", "UsageError", "end_kept", "exec_timeout", "main", "parse_duration",
    "supervise", "write_receipt"]

# --- Constants ------------------------------------------------------------------------------------

# A forced stop has three bounded phases: the grace after the stop signal, the
# command's own process after SIGKILL, and the drain of the whole run.
CLEANUP_PHASE_COUNT = 3
DEFAULT_CLEANUP_TIMEOUT = 10.0
# What exec_timeout() adds for start-up, the last pass and receipt I/O.
EXEC_TIMEOUT_SLACK = 30.0
# What a run may take beyond timeout + CLEANUP_PHASE_COUNT * cleanup_timeout:
# the last SIGKILL pass and the confirming look, once the drain's budget is
# spent; then the look at what is kept and left.
_FINAL_PASS_LIMIT, _FINISH_LIMIT = 1.0, 0.5
# The same stop signal again within this is the same request.
_STOP_BURST = 0.25
# --stop-timeout T, from the first stop signal taken: the grace ends by T
# less _STOP_TAIL (at most half of T) for SIGKILL and the drain, which end
# by T less _STOP_MARGIN (at most a quarter of T) for the receipt.
_STOP_TAIL, _STOP_MARGIN = 2.0, 0.5
# How long a command killed by SIGINT or SIGQUIT at a terminal waits for the
# word of the Ctrl-C listener, which the terminal signalled at the same time.
_CTRL_C_WAIT = 0.5
# Passes over our own children that a kill walk makes first (see
# _Walker._stop_own_children).
_STOP_PASSES = 8
# Once the command's zombie hides the others from waitid(), they are reaped
# by the list of our children, a syscall each: at most this often. At most
# _REAP_BATCH zombies, for at most _REAP_SLICE, are reaped in one go before
# the caller's deadlines are looked at again.
_REAP_LIST_INTERVAL, _REAP_BATCH, _REAP_SLICE = 0.01, 256, 0.005
# A confirmation tries this many looks before it lets the drain wait; a look
# that found nothing alive but was disturbed is taken again this soon.
_CONFIRM_TRIES, _UNSETTLED_RETRY = 4, 0.002
# A drain round waits this long at most for what it killed before it walks the
# tree again, so a process stuck in D state cannot hide new adoptions.
_DRAIN_ROUND_LIMIT = 0.05
RECEIPT_SCHEMA_VERSION = 6
# Every list of the receipt but `preserved` holds at most this many entries
# (their counts beside them), and an entry is a few numbers and a process
# name of at most 15 bytes: its size is bounded by construction. `preserved`
# is never cut: the owner ends what was kept by it.
_LIST_LIMIT = 1000
# The room a receipt's lists take at most (an entry is at most 234 bytes as
# written), its other keys, and the summary's 4 KiB: reserved at the start.
_RECEIPT_ROOM = 3 * _LIST_LIMIT * 256 + (16 << 10) + (4 << 10)
# A census of what is alive, for `survivors` when the run is not confirmed.
_CENSUS_LIMIT = 0.5
# Signals left pending for a finished run that supervise() discards before
# it gives the caller's handlers back.
_DISCARD_LIMIT = 100000
# A signalfd read: struct signalfd_siginfo is 128 bytes; a batch at a time.
_SIGINFO_SIZE, _SIGNAL_BATCH = 128, 64

EXIT_TIMED_OUT = 124
EXIT_FAILURE = 125
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
# As timeout(1): a forced stop whose command had to be SIGKILLed.
EXIT_KILLED = 128 + 9

# What a run keeps running when it ends: the drain policies.
POLICIES = ("drain-all", "preserve-descendants-on-success")
# How the run is held: --containment.
CONTAINMENTS = ("auto", "cgroup", "proc")

# The states of a run, in order; the middle three are the timed cleanup steps.
STATES = ("starting", "running", "terminating", "killing", "draining", "done")
_CLEANUP_STEPS = STATES[2:5]
# What the drain covers: the command's process group (and the command, if
# it left it), or every process of the run that is not kept.
_GROUP, _RUN = "group", "run"

# inotify sees the stop file at once in its directory; this check by path
# covers what inotify cannot see (a renamed ancestor, a re-pointed symlink, a
# mount, a network filesystem's remote changes).
_STOP_FILE_CHECK_INTERVAL = 2.0
# The lookout's answer to a look we ask for (see _StopFileWatch): at the
# start, a stop file that does not answer within this is refused; at a
# natural exit, it counts as a stop.
_STOP_FILE_ANSWER = 5.0
# cgroup.freeze takes effect when every task has stopped in the kernel; a
# task in D state delays it: the look waits this long at most, then goes on.
_FREEZE_LIMIT = 0.5
# A cgroup's maker flocks it right after mkdir, and marks it soon after; an
# unlocked one without a mark, younger than this, may be a maker's that did
# not get that far yet (starved): left alone.
_LEFTOVER_MIN_AGE = 60.0
# The leaf --prepare-cgroup moves a container's processes into, so that its
# cgroup can enable controllers for the runs' cgroups, made beside the leaf.
_PREPARED_LEAF = "treereap.init"
# --summary: at most this much, as a Kubernetes termination message.
_SUMMARY_LIMIT = 4096
# The cgroups a supervisor makes are marked (an extended attribute: trusted.,
# which only CAP_SYS_ADMIN may write, else user.; see _mark): "run" (one left
# by a dead supervisor is ended by the next one) or "kept"; its maker locks
# its cgroup.kill while it lives (see _maker_alive).
_RUN_MARKS = ("trusted.treereap", "user.treereap")
# A process that started this long before a leftover run's cgroup changed
# last (st_ctime: its mark) may be the run's still: ticks and clocks differ.
_LEFTOVER_SLACK = 0.05
# Waiting for a process the kernel cannot wake us for (no pidfd): 1 ms doubling.
_EXIT_POLL_FIRST, _EXIT_POLL_MAX = 0.001, 0.1
# select() keeps deadlines to the microsecond but only for fds below
# FD_SETSIZE and waits of sane length; poll() takes the rest.
_MAX_POLL_MS, _SELECT_FD_LIMIT, _MAX_SELECT_SECONDS = 2 ** 31 - 1, 1024, 86400.0
# A walk that holds pidfds first lifts our soft fd limit and counts what it
# leaves, less this reserve for reading /proc and our own pipes.
_FD_RESERVE = 16
# The stop signal to a cgroup's members: this many pidfds at a time (and one
# read of cgroup.procs a batch), within the descriptors the budget allows.
_MEMBER_BATCH = 256

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Sizes in binary units, as systemd's MemoryMax= and nsjail read them.
_SIZE_UNITS = dict((unit, 1 << 10 * i) for i, unit in enumerate(("", "K", "M", "G", "T", "P", "E")))
# The limits on the run's cgroup: the plan's keyword, the controller it
# needs (cpu.stat, which --cpu-time reads, needs none), its option.
_LIMIT_CONTROLLERS = (("memory_max", "memory", "--memory-max"), ("pids_max", "pids", "--pids-max"),
                      ("cpu_time", None, "--cpu-time"))
# --cpu-time: the run's CPU is read again when it could be spent at the
# earliest (every CPU busy), but no sooner than this after the last read.
_CPU_TIME_MIN_WAKE = 0.05
# --max-output: the least cap (room for a head, a tail and the marker), and
# the most read from the output at one wake-up (a signal waits no longer).
_MIN_OUTPUT_CAP, _OUTPUT_READS = 1024, 16
# A read of the output smaller than this lets the pipe wait that long before
# it is watched again: a writer of a byte every 200 us woke the supervisor
# 5,000 times a second; a 1 MiB pipe holds far more than a slow writer
# writes meanwhile, and a fast one's reads stay back to back.
_OUTPUT_BURST, _OUTPUT_PAUSE = 1 << 16, 0.01
_F_SETPIPE_SZ = 1031
# The largest duration (the largest time_t, as timeout(1) clamps to).
_MAX_DURATION = float(2 ** 63 - 1)

# Signals that stop the run: SIGTERM, SIGINT and SIGHUP, then every other
# catchable signal whose default action would end the supervisor (SIGQUIT,
# SIGALRM, SIGXCPU, SIGPWR, SIGSYS, SIGSTKFLT, the real-time ones...), so no
# signal kills it silently. Found by exclusion, as old Pythons do not name
# them all. Left out: what stops, continues or is ignored by default; what we
# forward; SIGPIPE (ignored); and faults raised by the CPU (SIGSEGV, SIGBUS,
# SIGILL, SIGFPE, SIGTRAP) and SIGABRT, where a handler that returns re-runs
# the faulting instruction.
_NOT_STOPPING = frozenset(
    getattr(signal, name) for name in (
        "SIGKILL", "SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGCONT", "SIGCHLD",
        "SIGURG", "SIGWINCH", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGSEGV", "SIGBUS",
        "SIGILL", "SIGFPE", "SIGTRAP", "SIGABRT"))
_VALID_SIGNALS = sorted(
    signal.valid_signals() if hasattr(signal, "valid_signals")
    # The C library keeps the numbers below SIGRTMIN for its threads (32 and
    # 33 in glibc, also 34 in musl).
    else set(range(1, 32)) | set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1)))
_FIRST_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# A stop by one of these passes it on to the run as itself, as timeout(1)
# does (a Ctrl-C is a SIGINT for the command too); any other stop sends -s.
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_STOP_SIGNALS = _FIRST_STOP_SIGNALS + tuple(
    sig for sig in _VALID_SIGNALS
    if sig not in _NOT_STOPPING and sig not in _FIRST_STOP_SIGNALS)
_FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)
# Names for receipts, as signal.Signals gives them: the Linux aliases SIGCLD,
# SIGIOT and SIGPOLL give way to SIGCHLD, SIGABRT and SIGIO, and 16 is
# SIGSTKFLT (unnamed before Python 3.11).
_SIGNAL_NAMES = dict(
    (number, name) for name, number in sorted(vars(signal).items())
    if name.startswith("SIG") and not name.startswith("SIG_")
    and name not in ("SIGCLD", "SIGIOT", "SIGPOLL"))
_SIGNAL_NAMES.setdefault(16, "SIGSTKFLT")
# The command gets these at their defaults whatever the caller had: CPython
# ignores SIGPIPE and SIGXFSZ at start, and an ignored SIGCHLD breaks waits.
_DEFAULTED_FOR_COMMAND = (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)

_PR_SET_PDEATHSIG, _PR_GET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 2, 38
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_PROC_SUPER_MAGIC, _CGROUP2_SUPER_MAGIC = 0x9FA0, 0x63677270
_CAP_SETGID, _CAP_SETUID, _CAP_SYS_PTRACE = 6, 7, 19
# The generic syscall table numbers them alike on every architecture but alpha.
_SYS_PIDFD_SEND_SIGNAL, _SYS_PIDFD_OPEN, _SYS_OPENAT2 = 424, 434, 437
# openat2() RESOLVE_NO_XDEV: the path may cross no mount point, so a mount the
# command made inside /proc (or inside the run's cgroup) is refused, not read.
_RESOLVE_NO_XDEV = 0x01
_IN_MOVED_TO, _IN_CREATE, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x80, 0x100, 0x400, 0x800
_IN_ONLYDIR = 0x01000000
_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# --- Errors and the receipt type ------------------------------------------------------------------

class SupervisorError(Exception):
    """The supervisor cannot do its job here; the CLI exits 125."""


class UsageError(SupervisorError):
    """A bad option or path: nothing was started."""


class ObservationError(SupervisorError):
    """/proc could not be read (EMFILE, ENFILE, ENOMEM, EACCES...): a failed
    look is never an empty one, so the cleanup cannot be confirmed."""


# The receipt: a dict, its keys in the order of _receipt() (every key and its
# type: docs/reference.md, "The receipt"; tests/test_docs.py holds them to it),
# declared as a TypedDict for type checkers. typing costs milliseconds at each
# start: at run time the TypedDict is made when first asked for (__getattr__).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, TypedDict  # noqa: F401
else:
    def TypedDict(name, fields):  # (its fields alone, until asked for)
        return fields
CleanupReceipt = TypedDict("CleanupReceipt", {
    "schema_version": "int", "supervisor_version": "str", "python_version": "str",
    "command": "List[str]", "workdir": "str", "pid": "Optional[int]", "supervisor_pid": "int",
    "namespaces": "Dict[str, str]", "started_at": "str", "ended_at": "str",
    "duration_s": "float", "timeout_s": "float", "cleanup_timeout_s": "float", "policy": "str",
    "stop_signal": "Optional[str]", "stop_reason": "str", "signal": "Optional[str]",
    "oom_killed_by": "Optional[str]", "timed_out": "bool", "return_code": "Optional[int]",
    "exit_status": "int", "cleanup_confirmed": "bool", "cleanup_s": "float",
    "ladder": "List[Dict[str, Any]]", "containment": "str", "cgroup": "Optional[str]",
    "kept_cgroup": "Optional[str]", "cgroup_unavailable": "Optional[str]",
    "user": "Optional[Dict[str, int]]", "preserved": "List[Dict[str, Any]]",
    "survivors": "List[Dict[str, Any]]", "survivors_count": "Optional[int]",
    "unattributed": "List[Dict[str, Any]]", "drained": "List[Dict[str, Any]]",
    "drained_count": "int", "usage": "Dict[str, Any]", "limits": "Optional[Dict[str, Any]]",
    "output": "Optional[Dict[str, Any]]", "error": "Optional[str]"})
if not TYPE_CHECKING:  # (3.6 has no module __getattr__: a dict there)
    _RECEIPT_FIELDS, CleanupReceipt = CleanupReceipt, dict
    if sys.version_info >= (3, 7):
        del CleanupReceipt, TypedDict

    # (hidden from type checkers: a misspelt name must stay an error to them)
    def __getattr__(name):
        """CleanupReceipt, made when first asked for (PEP 562): a TypedDict
        whose types are typing's names, as strings; a dict on 3.7, which has
        none."""
        if name != "CleanupReceipt":
            raise AttributeError("module %r has no attribute %r" % (__name__, name))
        import typing
        made = globals()[name] = getattr(typing, "TypedDict", lambda *_: dict)(name,
                                                                           _RECEIPT_FIELDS)
        return made


# --- Linux primitives -----------------------------------------------------------------------------

class _Libc(object):
    """libc through ctypes, loaded on first use (ctypes costs ms to import)."""

    def __init__(self):
        # test_trust.py::test_every_fd_limit_is_a_clean_run_or_one_line_naming_it
        self.ctypes = ctypes = _acquire("import ctypes", lambda: __import__("ctypes"))
        self.lib = ctypes.CDLL(None, use_errno=True)

    def call(self, name, *args):
        result = getattr(self.lib, name)(*args)
        if result == -1:
            code = self.ctypes.get_errno()
            raise OSError(code, "%s: %s" % (name, os.strerror(code)))
        return result


_LIBC = []
# What messages, --help and --version call the program, however it was
# started (supervisor.py, python -m treereap, the console script, a pyz).
_PROG = "treereap"
# The sha256 of the supervisor.py a treereap.pyz was built from, which its
# __main__.py sets (scripts/build_pyz.py): --version shows it.
_BUILT_FROM = None


def _libc():
    if not _LIBC:
        _LIBC.append(_Libc())
    return _LIBC[0]


def _require_linux():
    if not sys.platform.startswith("linux"):
        raise SupervisorError("%s needs Linux (prctl, /proc); this is %s" % (_PROG, sys.platform))


def _set_subreaper(enabled):
    """Set or clear PR_SET_CHILD_SUBREAPER; return the previous value, read back."""
    libc = _libc()
    previous, now = libc.ctypes.c_int(0), libc.ctypes.c_int(0)
    libc.call("prctl", _PR_GET_CHILD_SUBREAPER, libc.ctypes.byref(previous), 0, 0, 0)
    libc.call("prctl", _PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)
    libc.call("prctl", _PR_GET_CHILD_SUBREAPER, libc.ctypes.byref(now), 0, 0, 0)
    if bool(now.value) != bool(enabled):
        raise OSError(errno.EINVAL, "prctl: the subreaper bit did not stick")
    return bool(previous.value)


def _set_parent_death_signal(sig):
    """Set PR_SET_PDEATHSIG; return the signal it was (an API caller's own)."""
    libc = _libc()
    previous = libc.ctypes.c_int(0)
    libc.call("prctl", _PR_GET_PDEATHSIG, libc.ctypes.byref(previous), 0, 0, 0)
    libc.call("prctl", _PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return previous.value


def _pidfd_open(pid):
    """A pidfd pinning pid, or None where the kernel has none (before 5.3).

    Raises ProcessLookupError when pid no longer exists."""
    try:  # (os's own since 3.9: a ctypes call costs ~30 us, ten times the syscall)
        return _high_fd(os.pidfd_open(pid) if hasattr(os, "pidfd_open") else _libc().call(
            "syscall", _SYS_PIDFD_OPEN, pid, 0))
    except OSError as e:
        # test_drain.py::test_without_pidfds_the_walk_still_drains_and_confirms
        if e.errno in (errno.ENOSYS, errno.EPERM):  # old kernel, or seccomp
            return None
        if e.errno == errno.ESRCH:
            raise ProcessLookupError(e.errno, "pidfd_open: no such process")
        raise


def _openat2(dir_fd, path, flags, resolve):
    """openat2(2): open path below dir_fd under the RESOLVE_* rules. OSError
    as os.open raises it; ENOSYS before Linux 5.6, EPERM under some seccomp
    filters."""
    libc = _libc()
    how = (libc.ctypes.c_uint64 * 3)(flags, 0, resolve)  # struct open_how
    fd = libc.lib.syscall(_SYS_OPENAT2, dir_fd, os.fsencode(path), how, 24)
    if fd < 0:
        code = libc.ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _open_beneath(dir_fd, device, openat2, path, flags, shown):
    """Open path below dir_fd without crossing a mount: openat2 with
    RESOLVE_NO_XDEV (EXDEV otherwise), or, without openat2, open it and
    refuse a file on another device (a bind mount from elsewhere; one of the
    same filesystem, which this cannot see, needs openat2)."""
    flags |= os.O_CLOEXEC
    if openat2:
        return _openat2(dir_fd, path, flags, _RESOLVE_NO_XDEV)
    fd = os.open(path, flags, dir_fd=dir_fd)
    if os.fstat(fd).st_dev != device:
        os.close(fd)
        raise OSError(errno.EXDEV, "%s/%s is on another filesystem" % (shown, path), path)
    return fd


def _ignoring(errors, call, *args, **kwargs):
    """call(*args, **kwargs), or None when it raises one of `errors`: what
    it would have done is done already, or not needed, or not possible."""
    try:
        return call(*args, **kwargs)
    except errors:
        return None


def _quietly_signal(pid, sig, group=False):
    """kill or killpg, for a pid or group id we hold: an unreaped child of
    ours, or the group its leader keeps reserved. Gone, or members we may not
    signal (setuid), is not an error here: /proc decides what is left."""
    _ignoring((ProcessLookupError, PermissionError), os.killpg if group else os.kill, pid, sig)


def _high_fd(fd):
    """Move fd above 2: a caller may have closed stdin, stdout or stderr, and
    our pipes and pidfds must never pose as them."""
    if fd > 2:
        return fd
    import fcntl
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _readable(fd):
    return bool(_wait_ready([fd], (), 0))


def _wait_ready(fds, priority_fds, seconds):
    """The fds that became ready within `seconds`: readable, or for
    priority_fds (cgroup.events: kernfs files always read as readable) a
    change notified as POLLPRI. select() keeps the deadline to the
    microsecond; poll() (whole milliseconds, rounded up, so up to 1 ms late;
    0 stays 0) serves fds above select's limit and waits beyond a day."""
    seconds = max(seconds, 0.0)
    every = list(fds) + list(priority_fds)
    # test_cli.py::test_huge_timeout_does_not_overflow_a_wait
    if max(every + [-1]) < _SELECT_FD_LIMIT and seconds < _MAX_SELECT_SECONDS:
        readable, _, changed = select.select(fds, (), priority_fds, seconds)
        return readable + changed
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    for fd in priority_fds:
        poller.register(fd, select.POLLPRI)
    # test_cli.py::test_huge_timeout_does_not_overflow_a_wait
    timeout = 0 if seconds == 0 else min(_MAX_POLL_MS, int(seconds * 1000) + 1)
    return [fd for fd, _ in poller.poll(timeout)]


def _filesystem_type(fd):
    """fstatfs(2) f_type of the filesystem holding an open fd."""
    libc = _libc()
    buf = libc.ctypes.create_string_buffer(256)  # struct statfs; f_type first
    libc.call("fstatfs", fd, buf)
    return int.from_bytes(buf.raw[:libc.ctypes.sizeof(libc.ctypes.c_long)], sys.byteorder)


def _has_capability(bit):
    """Is capability `bit` in our effective set (CapEff in /proc/self/status,
    read at the start, before the command could mount over /proc)? No when
    it cannot be read."""
    for line in (_ignoring(OSError, _read_path, "/proc/self/status") or b"").splitlines():
        if line.startswith(b"CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def _signal_name(number):
    """SIGTERM, SIGRTMIN+3, ...: the name a signal number goes by."""
    if signal.SIGRTMIN < number < signal.SIGRTMAX:
        return "SIGRTMIN+%d" % (number - signal.SIGRTMIN)
    return _SIGNAL_NAMES.get(number, "SIG%d" % number)


def _return_code(waitid_result):
    """The status as subprocess reports it: the exit code, or -N for signal N."""
    status = waitid_result.si_status
    return status if waitid_result.si_code == os.CLD_EXITED else -status


_now = time.monotonic


# A resource that ran out, and the limit behind it.
_LIMIT_HINTS = {errno.EMFILE: "ulimit -n", errno.ENFILE: "fs.file-max", errno.ENOMEM: "memory",
                errno.ENOSPC: "disk space or inotify watches"}


def _os_error_text(e, call=None):
    """strerror, with the limit that ran out: 'Resource temporarily
    unavailable (ulimit -u, pids.max)' for fork."""
    hint = "ulimit -u, pids.max" if call == "fork" and e.errno == errno.EAGAIN else \
        _LIMIT_HINTS.get(e.errno)
    text = e.strerror or str(e)
    return "%s (%s)" % (text, hint) if hint else text


def _acquire(call, make):
    """make() (a fork, a pipe): a limit that ran out is one line naming the
    call and the limit, never an internal error."""
    try:
        return make()
    except OSError as e:
        raise SupervisorError("%s: %s" % (call, _os_error_text(e, call)))


def _pipe():
    """A pipe with both ends above 2 (see _high_fd). Out of descriptors, it
    is one line naming the call, and no end is left open."""
    ends, high = _acquire("pipe", os.pipe), []
    try:
        for fd in ends:
            high.append(_acquire("pipe", lambda: _high_fd(fd)))
    except SupervisorError:
        for fd in high + list(ends[len(high) + 1:]):  # _high_fd closed the one it failed on
            os.close(fd)
        raise
    return tuple(high)


def _fork(*ends):
    """os.fork(); out of processes, one line naming the limit (see _acquire),
    and the descriptors `ends` closed first: the caller of supervise() keeps
    none of ours."""
    try:
        return _acquire("fork", os.fork)
    except BaseException:
        for fd in ends:
            os.close(fd)
        raise


def _signalfd(signals, fd=-1):
    """A non-blocking signalfd(2) for signals (which the caller blocks); with
    fd, that one's signals changed."""
    libc = _libc()
    mask = libc.ctypes.create_string_buffer(128)  # sigset_t
    libc.call("sigemptyset", mask)
    for sig in signals:
        libc.call("sigaddset", mask, sig)
    made = libc.lib.signalfd(fd, mask, os.O_NONBLOCK | os.O_CLOEXEC)
    if made < 0:
        code = libc.ctypes.get_errno()
        raise SupervisorError("signalfd: %s" % _os_error_text(OSError(code, os.strerror(code))))
    return made if fd != -1 else _acquire("signalfd", lambda: _high_fd(made))


def _complain(message, patient=True):
    """One line on stderr, whatever the message holds: a newline or another
    control character in a path is escaped, so a second line can never be
    someone else's text. SIGTTOU is blocked meanwhile (a background write to
    a TOSTOP terminal then goes through instead of stopping us), and a line
    stderr cannot take within a second (at once, unless patient: during a
    stop) is dropped, as it is when stderr is closed or a broken pipe."""
    text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in message)
    data = ("%s: %s\n" % (_PROG, text)).encode("utf-8", "replace")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTTOU])
    try:
        poller = select.poll()
        poller.register(2, select.POLLOUT)
        if poller.poll(1000 if patient else 0):
            os.write(2, data)
    # test_unix.py::test_a_broken_stderr_pipe_does_not_change_the_outcome
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _read_to_end(fd, close=False):
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        if close:
            os.close(fd)


def _read_path(path, dir_fd=None):
    """The bytes of the file at path (below dir_fd), read to the end."""
    return _read_to_end(os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd), close=True)


class _HoldsFd(object):
    """close() for an object holding one descriptor in `fd` (None once closed)."""
    __slots__ = ()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --- /proc ----------------------------------------------------------------------------------------

class _Proc(object):
    """A process as one read of /proc/PID/stat showed it. Its `name` there
    (comm, at most 15 bytes) is what the receipt shows of it: its argv is
    never read, as that read takes the process's memory-map lock, which a
    process in D state (or sharing its memory with one) may hold for good."""
    __slots__ = ("pid", "name", "state", "ppid", "pgid", "sid", "threads", "start")

    def __init__(self, pid, name, fields):
        self.pid, self.name = pid, name
        self.state = fields[0].decode()
        self.ppid, self.pgid, self.sid = int(fields[1]), int(fields[2]), int(fields[3])
        self.threads, self.start = int(fields[17]), int(fields[19])

    @property
    def live(self):
        # A zombie leader whose other threads still run is alive.
        # test_hostile.py::test_a_process_stuck_in_d_state_cannot_stretch_the_bound
        return self.state not in "ZX" or self.threads > 1

    @property
    def identity(self):
        """pid and start time (clock ticks since boot): one process, never a reused pid."""
        return (self.pid, self.start)


class _ProcFS(_HoldsFd):
    """/proc, opened once and read relative to that descriptor, so that a
    mount over /proc during the run changes nothing, and never through a
    mount made inside it (openat2 RESOLVE_NO_XDEV, or else a device check):
    a root command that bind-mounts a file over /proc/PID/stat makes the
    look fail, never lie. Only ENOENT and ESRCH mean a process is gone; any
    other error raises ObservationError."""

    def __init__(self):
        try:
            self.fd = _high_fd(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as e:
            raise SupervisorError("/proc: %s; mount it (mount -t proc proc /proc)" % e.strerror)
        try:
            self.device = os.fstat(self.fd).st_dev
            kind = _filesystem_type(self.fd)
            # test_trust.py::test_a_proc_that_is_not_procfs_is_refused
            if kind != _PROC_SUPER_MAGIC:
                raise SupervisorError("/proc is not procfs (filesystem type 0x%x); mount it "
                                      "(mount -t proc proc /proc)" % kind)
            self.openat2 = self._has_openat2()
            self._check_namespace()
            self._check_visibility()
            me = os.getpid()
            if self.read("%d/task/%d/children" % (me, me)) is None:
                raise SupervisorError(
                    "/proc/%d/task/%d/children is missing: this kernel was built without "
                    "CONFIG_PROC_CHILDREN, which %s needs to find the run's processes" % (
                        me, me, _PROG))
        except BaseException:
            self.close()
            raise

    def _has_openat2(self):
        """openat2() exists here (Linux 5.6+, and no seccomp filter refuses it)."""
        try:
            os.close(_openat2(self.fd, "self/stat", os.O_RDONLY | os.O_CLOEXEC, _RESOLVE_NO_XDEV))
            return True
        except OSError:
            return False

    def _check_namespace(self):
        try:
            proc_self = os.readlink("self", dir_fd=self.fd)
        except OSError as e:
            raise SupervisorError("/proc/self: %s; mount /proc (mount -t proc proc /proc)"
                                  % e.strerror)
        # test_trust.py::test_a_proc_of_another_pid_namespace_leaves_no_directories
        if proc_self != str(os.getpid()):
            raise SupervisorError("/proc belongs to another PID namespace; mount this one's "
                                  "(unshare --mount-proc, or mount -t proc proc /proc)")

    def _check_visibility(self):
        """hidepid hides other users' processes (a setuid one of the run's,
        say) from a supervisor that may not ptrace them, nor is in its gid:
        it would never see them to drain them. (subset=pid hides none.)"""
        device, options = "%d:%d" % (os.major(self.device), os.minor(self.device)), {}
        for before, after in self.mountinfo():
            if before[2:3] == [device] and after:
                options.update(option.partition("=")[::2] for option in after[-1].split(","))
        # test_trust.py::test_a_proc_with_hidepid_is_refused_when_it_hides_processes
        if options.get("hidepid", "0") in ("0", "off") or _has_capability(
                _CAP_SYS_PTRACE) or int(options.get("gid", -1)) in os.getgroups() + [
                    os.getegid()]:
            return
        raise SupervisorError(
            "/proc is mounted with hidepid=%s, which hides other users' processes from "
            "this supervisor; mount it without hidepid, or run the supervisor as root"
            % options["hidepid"])

    def mountinfo(self):
        """[(fields before ' - ', fields after)] of our mount namespace."""
        lines = (self.read("self/mountinfo") or b"").decode("utf-8", "replace").splitlines()
        return [(before.split(), after.split())
                for before, _, after in (line.partition(" - ") for line in lines)]

    def open(self, path, flags=os.O_RDONLY):
        """A descriptor on /proc/path, opened without crossing a mount."""
        return _open_beneath(self.fd, self.device, self.openat2, path, flags, "/proc")

    def read(self, path, one_record=False, first_page=False, endtime=None):
        """The bytes of /proc/path, or None when what it describes is gone.
        Read to EOF: a seq_file answers a read with at most a page of whole
        records, so a short read is not the end (a list of 700 children is
        two pages). one_record: a file whose short read is its end (stat),
        read once unless it fills 4 KiB. first_page: only what one read
        gives (a seq_file's first records). endtime: no page more once it
        has passed (the caller is out of time)."""
        def read_all(fd):
            chunks = [os.read(fd, 4096)]
            while (not first_page and chunks[-1]
                   and (not one_record or len(chunks[-1]) == 4096)
                   and (endtime is None or _now() < endtime)):
                chunks.append(os.read(fd, 65536))
            return b"".join(chunks)
        return self._opened(path, os.O_RDONLY, read_all)

    def _opened(self, path, flags, use):
        """use(a descriptor on /proc/path), or None when what it describes is
        gone: the open, or the use, failed with ENOENT or ESRCH."""
        try:
            fd = self.open(path, flags)
            try:
                return use(fd)
            finally:
                os.close(fd)
        except OSError as e:
            return self._gone_or_raise(e, path)

    @staticmethod
    def _gone_or_raise(e, path):
        if e.errno in (errno.ENOENT, errno.ESRCH):
            return None
        # test_hostile.py::test_a_file_mounted_over_our_own_children_list_is_never_believed
        if e.errno == errno.EXDEV:
            raise ObservationError("/proc/%s is covered by a mount made inside /proc; nothing "
                                   "read through it can be trusted" % path)
        raise ObservationError("cannot read /proc/%s: %s" % (path, _os_error_text(e)))

    def stat(self, pid):
        """The process as /proc shows it now, or None when it is gone."""
        data = self.read("%d/stat" % pid, one_record=True)
        if data is None:
            return None
        # The command name may hold spaces and parentheses: split after the last ')'.
        start, end = data.find(b"("), data.rfind(b")")
        if start < 0 or end < 0:
            raise ObservationError("cannot parse /proc/%d/stat" % pid)
        return _Proc(pid, data[start + 1:end].decode("utf-8", "replace"),
                     data[end + 2:].split(None, 21))

    def children(self, pid, threads=1):
        """Pids of pid's children, from the lists of all its threads."""
        tids = [pid] if threads == 1 else self.threads_of(pid)
        return [int(word) for tid in tids
                for word in (self.read("%d/task/%d/children" % (pid, tid)) or b"").split()]

    def listing(self, path):
        """The names in the directory /proc/path, or None when it is gone."""
        return self._opened(path, os.O_RDONLY | os.O_DIRECTORY, os.listdir)

    def threads_of(self, pid):
        return [int(tid) for tid in self.listing("%d/task" % pid) or ()]

    def owner(self, pid):
        """The effective uid pid runs as (the owner of /proc/PID), or None."""
        try:
            return os.stat(str(pid), dir_fd=self.fd, follow_symlinks=False).st_uid
        except OSError as e:
            return self._gone_or_raise(e, str(pid))

    def cgroup_of(self, pid):
        """pid's cgroup v2 path ('0::' in /proc/PID/cgroup), or None when gone."""
        data = self.read("%d/cgroup" % pid)
        if data is None:
            return None
        return next((line[3:] for line in data.decode("utf-8", "replace").splitlines()
                     if line.startswith("0::")), "")

    def alive(self, proc):
        """Is proc (pid and start time) still alive? A look that fails claims
        nothing: it is taken as alive."""
        try:
            now = self.stat(proc.pid)
        except ObservationError:
            return True
        return now is not None and now.live and now.start == proc.start


# --- Beside the containment -----------------------------------------------------------------------

class _Children(object):
    """Our own children, as the kernel lists them in the children files of
    our threads."""

    def __init__(self, fs):
        self.fs, self.me = fs, os.getpid()

    def all(self, endtime=None):
        """Our children; past `endtime` perhaps only some (see _ProcFS.read)."""
        return [pid for tid in self.fs.threads_of(self.me)
                for pid in self._list(tid, endtime=endtime)]

    def oldest(self):
        """The first page of our list of children (~600), one read however
        long the list is. Adoption appends to it, so the processes adopted
        first, and dead first, are there. A whole list costs a pass over it
        each page, and under a fork storm every entry waits for the task-list
        lock: 30,000 zombies took 3 s to list (one page: milliseconds)."""
        return self._list(self.me, first_page=True)

    def _list(self, tid, **how):
        data = self.fs.read("%d/task/%d/children" % (self.me, tid), **how)
        if data is None:
            raise ObservationError("cannot read our own children in /proc")
        return [int(word) for word in data.split()]

    def live(self, endtime, reaper):
        """Our live children now: each still our child (the reaper may have
        run since the list was read, and a pid it freed can be another
        process's by now)."""
        found = []
        for pid in self.all(endtime):
            if endtime is not None and _now() >= endtime:
                break
            reaper.reap_when_due()
            proc = self.fs.stat(pid)
            if proc is not None and proc.live and proc.ppid == self.me:
                found.append(proc)
        return found


class _CallersJobs(object):
    """What the caller had before the command: its children (a shell's jobs,
    before its exec) and their descendants at that moment, and whatever is
    later adopted in their process groups. Never signalled, never kept, and
    our own children among them never reaped (an API caller waits for them;
    unreaped, each pid stays theirs)."""

    def __init__(self):
        self.processes = set()      # identities at start
        self.groups = set()         # their process groups: the caller's jobs
        self.children = set()       # pids of our children at start: never reaped
        self.unattributed = {}      # identity -> _Proc adopted in those groups

    def note(self, fs, children):
        """waitid() first, so that the usual case (no children) costs no look."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WCONTINUED
                      | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        self.children = set(children.all())
        todo = [p for p in (fs.stat(pid) for pid in self.children) if p is not None]
        self.groups = set(p.pgid for p in todo)
        while todo:
            proc = todo.pop()
            self.processes.add(proc.identity)
            todo.extend(p for p in (fs.stat(pid) for pid in fs.children(proc.pid, proc.threads))
                        if p is not None)

    def spare(self, pid):
        """A child of ours that is none of the run's (the lookout, the
        listener): never signalled, kept or reaped with it."""
        self.children.add(pid)

    def claims(self, proc, in_group):
        """For our own children: the caller's (known at start), or adopted
        since in one of the caller's jobs' groups, which a process of the run
        can join too (or a reused group id can match): then it is
        unattributed, left alone, and it keeps the run from being confirmed."""
        if proc.identity in self.processes or proc.pid in self.children:
            return True
        # test_trust.py::test_orphans_of_the_callers_jobs_are_neither_kept_nor_killed
        if proc.pgid in self.groups and not in_group:
            self.unattributed[proc.identity] = proc
            return True
        return False


class _Reaper(object):
    """The one rule of reaping: an exited child of ours, but never the command
    before done (its zombie keeps its group id from being reused while the
    group is signalled), nor a child the caller had before the run (the
    caller waits for it), nor one a walk holds by its pid (`spared`). Runs
    whenever SIGCHLD wakes a wait, in every state, so zombies never pile
    up, and during a long look (reap_when_due)."""

    def __init__(self, children, callers):
        self.children, self.callers = children, callers
        self.command = None         # the command's pid, while it must stay unreaped
        self.next_list_reap, self.pending, self.next_due = 0.0, False, 0.0

    def release_command(self):
        """From now on the command may be reaped; reap what is due, the list
        too (a zombie of the caller's hides none of ours)."""
        self.command, self.next_list_reap = None, 0.0
        self.reap_exited()

    def reap(self, pid, spared=()):
        """Reap pid if the rule allows and it has exited. Did it?"""
        # test_run.py::test_api_leaves_the_callers_children_for_the_caller_to_wait_for
        if pid == self.command or pid in self.callers.children or pid in spared:
            return False
        try:
            return os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return False

    def reap_when_due(self, spared=()):
        """A look at a storm takes seconds, and the zombies it makes meanwhile
        would lengthen every list we read: reap every _REAP_LIST_INTERVAL."""
        now = _now()
        if now >= self.next_due:
            self.next_due = now + _REAP_LIST_INTERVAL
            self.reap_exited(spared)

    def reap_exited(self, spared=()):
        """Every exited child the rule allows, at most _REAP_BATCH or a page of
        our list of children a call (see below): a storm can make zombies
        faster than a starved supervisor reaps them, and the caller's
        deadlines must be looked at in between; `pending` brings _wait()
        straight back for the rest."""
        self.pending = False  # until this call finds that more is to be done
        end = _now() + _REAP_SLICE
        for _ in range(_REAP_BATCH):
            if _now() >= end:
                break
            info = _ignoring(ChildProcessError, os.waitid, os.P_ALL, 0,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is None:  # (no child, or none exited)
                return
            if self.reap(info.si_pid, spared):
                continue
            # The command's zombie (or the caller's) is the one waitid() shows,
            # and it hides the others behind it: reap them by pid, from the
            # oldest of our children, where those that died first are. That
            # costs a syscall a child, so at most every _REAP_LIST_INTERVAL
            # while it finds some; _wait() wakes up for the next round.
            now = _now()
            if now < self.next_list_reap:
                self.pending = True
                return
            oldest = self.children.oldest()
            reaped = [pid for pid in oldest if self.reap(pid, spared)]
            if not reaped and len(oldest) > _REAP_BATCH:  # a page of live ones: look past it
                reaped = [pid for pid in self.children.all(_now() + _REAP_SLICE)[len(oldest):]
                          if self.reap(pid, spared)]
            self.next_list_reap, self.pending = now + _REAP_LIST_INTERVAL, bool(reaped)
            return
        self.pending, self.next_list_reap = True, _now()  # more to reap: right after a look


class _FdBudget(object):
    """Descriptors for pidfds: a walk that holds them first lifts our soft
    RLIMIT_NOFILE to the hard one (the command started with the caller's
    limit; close() puts ours back), and counts what it leaves, less a
    reserve for reading /proc and our own pipes (a soft limit of 64, and 60
    processes to hold, failed the run with EMFILE)."""

    def __init__(self, fs):
        self.fs = fs
        self.pidfds = True          # until the kernel says otherwise
        self.saved_limit = None

    def allowed(self):
        import resource
        self.make_room()
        soft, names = resource.getrlimit(resource.RLIMIT_NOFILE)[0], self.fs.listing("self/fd")
        if names is None:
            raise ObservationError("cannot list /proc/self/fd")
        return max(0, soft - len(names) - _FD_RESERVE)

    def make_room(self):
        if self.saved_limit is not None:
            return
        import resource
        self.saved_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard = self.saved_limit[1]
        # A hard limit above what the kernel allows: keep ours.
        _ignoring((ValueError, OSError), resource.setrlimit, resource.RLIMIT_NOFILE, (hard, hard))

    def pidfd(self, pid):
        """A pidfd on pid; None where there are none or no fd is left (then
        waiting polls /proc, and proving waits for a later look); False when
        the process is gone."""
        if not self.pidfds:
            return None
        try:
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                self.make_room()
                return None
            raise
        if fd is None:
            self.pidfds = False
        return fd

    def close(self):
        if self.saved_limit is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, self.saved_limit)
            self.saved_limit = None


class _Record(object):
    """What the cleanup ended, for the receipt's `drained`: every live
    process a look finds in its scope (the looks begin with the cleanup),
    and those seen to exit."""

    def __init__(self, fs):
        self.fs = fs
        self.ended = {}             # identity -> _Proc
        self.gone = set()           # identities whose pin showed them exit

    def saw(self, proc):
        """Each as last seen: a name read between fork and exec ("sh" for a
        `sleep` to come) gives way to the one a later look reads."""
        self.ended[proc.identity] = proc

    def exited(self, proc):
        self.gone.add(proc.identity)

    def drained(self, survivors, confirmed):
        """Those recorded that were seen to exit, or are gone now. A confirmed
        run has nothing of its own alive but what it kept, and what it keeps
        it never records: all of them, with no look at each (a thousand
        members cost a thousand reads of /proc at the end)."""
        left = set(p.identity for p in survivors)
        return [proc for identity, proc in self.ended.items() if confirmed or (
            identity not in left and (identity in self.gone or not self.fs.alive(proc)))]


# --- Waiting for processes to go ------------------------------------------------------------------

class _Pin(_HoldsFd):
    """A process held for signalling or waiting: by its pidfd where the kernel
    has them. The only pins without one that may be signalled are our own
    unreaped children, whose pid stays theirs until we reap them."""
    __slots__ = ("proc", "fd")

    def __init__(self, proc, fd):
        self.proc, self.fd = proc, fd

    def exited(self, fs):
        return _readable(self.fd) if self.fd is not None else not fs.alive(self.proc)

    def send(self, sig):
        if self.fd is None:
            _quietly_signal(self.proc.pid, sig)
            return
        # Exited since the proof, or setuid: /proc decides what is left.
        send = getattr(signal, "pidfd_send_signal", None) or (  # (3.9+: see _pidfd_open)
            lambda fd, sig: _libc().call("syscall", _SYS_PIDFD_SEND_SIGNAL, fd, sig, None, 0))
        _ignoring((ProcessLookupError, PermissionError), send, self.fd, sig)


def _closed(*holders):
    """Close each that holds a descriptor (pins, cgroups...), leaving out
    None; None (a `return` value)."""
    for holder in holders:
        if holder is not None:
            holder.close()


class _PinWaiter(object):
    """Waits for pinned processes to exit, one at a time after one poll() for
    all: a pidfd wakes the wait, a pin without one is polled (1 ms
    doubling). What exits is noted in the record. Closing it closes the pins."""

    def __init__(self, fs, record, pins):
        self.fs, self.record, self.all_pins = fs, record, pins
        exited = set(_wait_ready([p.fd for p in pins if p.fd is not None], (), 0))
        self.pins = [pin for pin in pins if pin.fd not in exited]
        for pin in pins:
            if pin.fd in exited:
                record.exited(pin.proc)
        self.delay = _EXIT_POLL_FIRST

    def done(self):
        while self.pins and self.pins[0].exited(self.fs):
            self.record.exited(self.pins.pop(0).proc)
            self.delay = _EXIT_POLL_FIRST
        return not self.pins

    def wake(self):
        """(readable fds, priority fds, when to look again without an event)."""
        pin = self.pins[0]
        if pin.fd is not None:
            return (pin.fd,), (), None
        poll_at, self.delay = _now() + self.delay, min(self.delay * 2, _EXIT_POLL_MAX)
        return (), (), poll_at

    def close(self):
        _closed(*self.all_pins)


class _EventWaiter(object):
    """Waits for a line of cgroup.events to read a value (`populated 0`,
    `frozen 1`): the kernel notifies each change (POLLPRI), nothing polls."""

    def __init__(self, cgroup, key, value):
        self.cgroup, self.key, self.value = cgroup, key, value

    def done(self):
        return self.cgroup.events().get(self.key) == self.value

    def wake(self):
        return (), (self.cgroup.events_fd,), None

    def close(self):
        pass


class _Pause(object):
    """A waiter that is done after a while (or at the first wake-up: a
    SIGCHLD, a signal): a drain round with nothing to pin."""

    def __init__(self, seconds):
        self.until, self.woken = _now() + seconds, False

    def done(self):
        if self.woken or _now() >= self.until:
            return True
        self.woken = True  # the next done() follows a wake-up
        return False

    def wake(self):
        return (), (), self.until

    def close(self):
        pass


class _Round(object):
    """One round of the drain: the walk it made (None: it waited for the
    kernel instead), and what to wait on before the next."""

    def __init__(self, walk, waiter):
        self.walk, self.waiter = walk, waiter

    @property
    def clear(self):
        """Its walk found nothing alive, and nothing changed under it."""
        return self.walk is not None and not self.walk.found and self.walk.stable

    def close(self):
        self.waiter.close()


# --- The walk: the run's tree ---------------------------------------------------------------------

def _signal_group(fs, pid, sig):
    """Signal the command's group, and the command itself if it left the
    group (our unreaped child: its pid is ours). The group id, the command's
    first pid, is ours while the command's zombie is held unreaped."""
    if pid is None:
        return
    _quietly_signal(pid, sig, group=True)
    command = fs.stat(pid)
    if command is not None and command.live and command.pgid != pid:
        _quietly_signal(pid, sig)


class _Scope(object):
    """Whom a drain ends, given to every walk: the command's group (the
    command's pid, which is the group id, ours while its zombie is held;
    None for --end-kept), and how far it reaches: _RUN (every process of
    the run), _GROUP (the group alone: a failure of ours after everything
    was kept) or None (nothing: everything is kept)."""
    __slots__ = ("group", "reach")

    def __init__(self, group, reach=_RUN):
        self.group, self.reach = group, reach

    def in_group(self, proc):
        return proc.pgid == self.group or proc.pid == self.group


class _Walk(object):
    """The result of one look: the live processes in scope (parents first),
    pins on them when asked for, every process seen,
    whether nothing it read changed under it, and whether it was whole (not
    cut short by its endtime). `held`: our children it holds by their pid
    alone (no pidfd), which the reaper must leave until the walk has left
    them (their pid must stay their own)."""
    __slots__ = ("found", "pins", "seen", "stable", "whole", "wait_budget", "held")

    def __init__(self):
        self.found, self.pins, self.seen, self.held = [], [], set(), set()
        self.stable = self.whole = True
        self.wait_budget = None     # how many pins it may keep: counted at the first


class _Walker(object):
    """The run's processes, found by walking /proc from this process, a child
    subreaper, down through the children files (for --end-kept: from the
    kept processes down), within the _Scope each call is given. Why a look
    finds every process of the run, and when two looks confirm:
    docs/design.md, "The /proc walk".

    Only what is provably ours is signalled: the command's process group
    while its leader is held unreaped, our own unreaped children, and
    processes pinned by a pidfd after /proc showed that their parent, alive
    and proven, is their parent still."""

    def __init__(self, fs, children, callers, reaper, budget, record):
        self.fs, self.children, self.callers = fs, children, callers
        self.reaper, self.budget, self.record = reaper, budget, record
        self.me = children.me

    def claimed(self, proc, scope):
        """The caller's, or unattributed (see _CallersJobs.claims)."""
        return self.callers.claims(proc, scope.in_group(proc))

    def kill_round(self, scope, endtime):
        """SIGKILL the scope: one round of the drain. The walk stops each
        process as it finds it (none forks, or dies and hands its children
        to a list read before, while it reads on) and kills it once its
        children are done, children first, so that only the path walked is
        pinned. Then wait for its pins; or, when it found only what it could
        not yet prove ours, a moment (an adoption's SIGCHLD wakes it sooner);
        or, when it found nothing but was disturbed, a shorter one."""
        reach = scope.reach or _GROUP
        _signal_group(self.fs, scope.group, signal.SIGSTOP)
        if reach == _RUN:
            self._stop_own_children(scope, endtime)
        walk = self.walk(scope, hold=True, kill=True, endtime=endtime, reach=reach)
        _signal_group(self.fs, scope.group, signal.SIGKILL)
        return _Round(walk, _PinWaiter(self.fs, self.record, walk.pins) if walk.pins
                      else _Pause(_DRAIN_ROUND_LIMIT if walk.found else _UNSETTLED_RETRY))

    def confirm(self, scope, endtime, previous):
        """([], True) once two looks in a row found nothing alive in scope,
        each undisturbed, and saw the same processes (a process that died
        during the first look handed its children to a list read before: the
        second sees them); previous is the last round's walk, or None. Else
        the live processes found, or ([], False) when the looks kept being
        disturbed (a few tries: the caller waits before it asks again) or
        time ran out."""
        for _ in range(_CONFIRM_TRIES):
            walk = self.walk(scope, endtime=endtime, reach=scope.reach or _GROUP)
            if walk.found:
                return walk.found, walk.stable
            if walk.stable and previous is not None and walk.seen == previous.seen:
                return [], True
            if _now() >= endtime:
                break
            previous = walk if walk.stable else None
        return [], False

    def census(self, scope, endtime):
        """(What of the run is alive, whether the look saw all of it): one
        look that needs no stability; nothing when everything is kept."""
        if scope.reach is None:
            return [], True
        walk = self.walk(scope, endtime=endtime, careful=False)
        return walk.found, walk.whole and walk.stable

    def walk(self, scope, hold=False, kill=False, endtime=None, careful=True, reach=None):
        """One look from the roots down: the live processes in scope (reach:
        the scope's, unless given), parents first. With hold, each one in
        scope is proven ours, pinned, and stopped (SIGSTOP) as it is found,
        and the walk keeps the pins it can; with kill, it is SIGKILLed too
        once its children are done. careful: a process whose children were
        read must still be alive after the read, else the walk is unstable
        (its children may have moved to a list read before)."""
        reach = scope.reach if reach is None else reach
        walk = _Walk()
        # Items are (parent node, pid) to visit, or (node, None) to leave.
        stack = [(None, pid) for pid in reversed(self.children.all(endtime))]
        try:
            while stack:
                out_of_time = endtime is not None and _now() >= endtime
                if not out_of_time:
                    self.reaper.reap_when_due(walk.held)
                parent, pid = stack.pop()
                if pid is None:
                    self._leave(parent, kill, walk, scope)
                elif out_of_time:
                    walk.stable = walk.whole = False  # the look is partial
                else:
                    node = self._visit(parent, pid, scope, reach, hold, walk)
                    if node is None:
                        continue
                    if parent is None and node[1] is not None and node[1].fd is None:
                        walk.held.add(pid)  # our child, proven by its pid alone
                    stack.append((node, None))  # left, and its pin closed, whatever happens
                    children = self.fs.children(node[0].pid, node[0].threads)
                    if careful and not self._still_there(node):
                        walk.stable = False
                    stack.extend((node, child) for child in reversed(children))
        except BaseException:
            hold = False  # a failed look: nobody will use its pins
            raise
        finally:
            walk.held.clear()
            for node, pid in stack:
                if pid is None:
                    _closed(node[1])
            if not hold:
                _closed(*walk.pins)
                walk.pins = []
        return walk

    def _leave(self, node, kill, walk, scope):
        """Its children are done: kill it (with kill), and keep its pin, for
        the stop signal (a look) or for waiting (a kill walk), while the fd
        limit allows; past it, a process the look stopped runs on (SIGCONT):
        it gets SIGKILL in the drain."""
        proc, pin = node
        if pin is None:
            return
        walk.held.discard(proc.pid)
        if kill and not scope.in_group(proc):
            pin.send(signal.SIGKILL)
        if walk.wait_budget is None:
            walk.wait_budget = self.budget.allowed()
        # test_run.py::test_many_members_with_a_low_fd_limit_are_still_drained
        if len(walk.pins) < walk.wait_budget:
            walk.pins.append(pin)
            return
        if not kill and not scope.in_group(proc):
            pin.send(signal.SIGCONT)
        pin.close()

    def _visit(self, parent, pid, scope, reach, hold, walk):
        """Look at one process. None when it is gone, moved, the caller's, or
        one of our zombies (reaped here, never carried); else (proc, pin) to
        descend into, pin proving it ours for its children's sake."""
        parent_proc = parent[0] if parent else None
        pin = self._prove(parent, pid) if hold else None
        proc = pin.proc if pin is not None else self.fs.stat(pid)
        if proc is None or proc.ppid != (parent_proc.pid if parent_proc is not None else self.me):
            # Gone since its parent's list was read, or re-parented (no longer
            # its parent's child, or ours at the top): it may have handed its
            # children to a list read before.
            walk.stable = False
            return _closed(pin)
        if parent is None:
            # test_trust.py::test_orphans_of_the_callers_jobs_are_neither_kept_nor_killed
            if self.claimed(proc, scope):
                return _closed(pin)
            if not proc.live and self.reaper.reap(pid, walk.held):
                # Gone for good: the next look will not see it either; but it
                # may have died after our list was read.
                walk.stable = False
                return _closed(pin)
        walk.seen.add(proc.identity)
        if proc.live and (scope.in_group(proc) or reach == _RUN):
            walk.found.append(proc)
            self.record.saw(proc)
            if pin is not None and not scope.in_group(proc):
                pin.send(signal.SIGSTOP)  # the group was stopped before the walk
            return (proc, pin)
        return (proc, _closed(pin))

    def _prove(self, parent, pid):
        """A pin on pid if it is provably ours, else None. Our own child is
        ours: unreaped, its pid stays its own. Any other process is ours when /proc shows, after its pidfd was taken, that its
        parent is a process we proved: if the pidfd still shows it alive, the
        stat read was its own; if the parent's pin (or the parent being our
        unreaped child) still holds the parent, the ppid read was that
        parent's."""
        parent_proc, parent_pin = parent or (None, None)
        parent_fd = parent_pin.fd if parent_pin is not None else None
        parent_is_ours = parent_proc is None or parent_proc.ppid == self.me
        if not parent_is_ours and parent_fd is None:
            return None  # an unproven parent: its children wait to be adopted
        fd = self.budget.pidfd(pid)
        # test_drain.py::test_without_pidfds_the_walk_still_drains_and_confirms
        if fd is False or (fd is None and parent_proc is not None):
            return None
        pin = _Pin(None, fd)
        try:
            pin.proc = self.fs.stat(pid)
        except BaseException:
            pin.close()
            raise
        if pin.proc is None or (parent_proc is not None and (
                pin.proc.ppid != parent_proc.pid or _readable(fd)
                or (not parent_is_ours and _readable(parent_fd)))):
            return _closed(pin)
        return pin

    def _still_there(self, node):
        """Was the process alive after its children were read? (Then nothing
        left its list unseen.) Pinned processes are checked by their pidfd,
        the rest by /proc."""
        proc, pin = node
        # test_drain.py::test_signals_until_the_end_never_cost_the_receipt
        if not proc.live:
            return True  # a zombie has no children: they left at its exit
        return not _readable(pin.fd) if pin is not None and pin.fd is not None else (
            self.fs.alive(proc))

    def _stop_own_children(self, scope, endtime):
        """SIGSTOP every child of ours that is not the caller's, before the
        walk looks at anything, then reap the zombies among them. Orphans of a
        tree that keeps forking are adopted by us, and each of their sessions
        gets as much CPU as we do (autogroups): a starved supervisor reading
        /proc process by process would only ever find the zombies of processes
        that already replaced themselves. So each pass costs one kill() a
        child, newest first (the live end of each lineage was adopted last),
        and there are at most _STOP_PASSES, so the walk always gets its turn.
        By pid: an unreaped child's pid is its own."""
        spared = set(pid for pid, _ in self.callers.processes) | self.callers.children
        spared.add(scope.group)
        seen = set()
        for _ in range(_STOP_PASSES):
            fresh = [pid for pid in reversed(self.children.all(endtime))
                     if pid not in seen and pid not in spared]
            if not fresh or _now() >= endtime:
                return
            seen.update(fresh)
            # test_trust.py::test_orphans_of_the_callers_jobs_are_neither_kept_nor_killed
            if self.callers.groups:  # the caller's jobs are known by group: look first
                procs = [(pid, self.fs.stat(pid)) for pid in fresh]
                fresh = [pid for pid, proc in procs
                         if proc is None or not self.claimed(proc, scope)]
            # Thousands of them, each kill() slower for the storm: mind the time.
            for each in (lambda pid: _quietly_signal(pid, signal.SIGSTOP), self.reaper.reap):
                for pid in fresh:
                    if _now() >= endtime:
                        return
                    each(pid)

# --- The seam, and the walk alone -----------------------------------------------------------------

class _Look(object):
    """What a look found and took, which the driver passes to the verbs
    after it (no containment keeps it): the scope of the drain (reach None:
    everything is kept), the live processes the stop will end (recorded),
    the pins the walk took on them (/proc), and the pids seen stopped
    (cgroup). close() lets go of its pins."""
    __slots__ = ("scope", "found", "pins", "stopped")

    def __init__(self, scope, found=(), pins=(), stopped=()):
        self.scope, self.found, self.pins = scope, list(found), list(pins)
        self.stopped = frozenset(stopped)

    def close(self):
        _closed(*self.pins)


class _ProcContainment(object):
    """The run held by its process group and the /proc walk (no cgroup of
    its own). One of the two implementations of the seam, whose verbs and
    what each does are in docs/design.md ("The containment seam"); the
    phases call nothing else of either. Each verb is a function of its
    arguments and of what it looks at: what a look found is the _Look it
    returns, which the driver hands to the verbs after it."""

    def __init__(self, walker):
        self.walker, self.where = walker, "the /proc walk (no cgroup)"

    def join(self, pid):
        """The process group, made on both sides of the fork, is all the walk needs."""

    def look(self, keep_all, group, endtime):
        """SIGSTOP the group, then walk: the walk stops every other process of
        the run as it finds it, so that none dies and hands its children to a
        list read before, nor forks, until the stop signal has reached them
        all. Everything kept: nothing to look at."""
        walker = self.walker
        _signal_group(walker.fs, group, signal.SIGSTOP)
        scope = _Scope(group, None if keep_all else _RUN)
        if keep_all:
            return _Look(scope)
        walk = walker.walk(scope, hold=True, endtime=endtime)
        return _Look(scope, walk.found, walk.pins)

    def stop(self, look, sig, endtime):
        """sig, then SIGCONT, to the group (by killpg) and to every process
        the look stopped (by its pin); a waiter on those pins."""
        scope, fs = look.scope, self.walker.fs
        # A pin without a pidfd is a child of ours, signalled by its pid: the
        # reaper may have freed that pid since the look; nothing reaps from
        # this check to the signals.
        pins = [pin for pin in look.pins if pin.fd is not None or self._our_child(pin.proc)]
        for each in (sig, signal.SIGCONT):
            if each:
                _signal_group(fs, scope.group, each)
                for pin in pins:
                    if not scope.in_group(pin.proc):
                        pin.send(each)
        return _PinWaiter(fs, self.walker.record, pins)

    def _our_child(self, proc):
        now = self.walker.fs.stat(proc.pid)
        return now is not None and now.start == proc.start and now.ppid == self.walker.me

    def kill(self, group):
        _signal_group(self.walker.fs, group, signal.SIGKILL)

    def stay_out(self):
        """No cgroup of the run's to stay out of."""

    def drain_round(self, scope, endtime):
        return self.walker.kill_round(scope, endtime)

    def confirm(self, scope, endtime, walk):
        return self.walker.confirm(scope, endtime, walk)

    def preserved(self, look, endtime):
        """What is kept, alive now: when everything is, every live child of
        ours but the command, and the caller's."""
        walker, scope = self.walker, look.scope
        if scope.reach is not None:
            return []
        return [p for p in walker.children.live(endtime, walker.reaper)
                if p.pid != scope.group and not walker.claimed(p, scope)]

    def census(self, scope, endtime):
        return self.walker.census(scope, endtime)

    def usage(self):
        return None

    def finish(self, look):
        return {"containment": "children", "cgroup": None, "kept_cgroup": None, "usage": None,
                "limits_set": {}}

    def close(self):
        """Nothing of its own: the look's pins are the look's."""


# --- The containment by a cgroup ------------------------------------------------------------------

class _Cgroup(object):
    """One cgroup v2 directory, held open from the moment it is made: its
    files are opened through that descriptor and never across a mount
    (openat2 RESOLVE_NO_XDEV, as /proc), so a root command that mounts over
    cgroup.events or the directory itself cannot feed us its own view."""

    def __init__(self, mount_point, path, dir_fd, openat2):
        self.mount_point, self.path = mount_point, path  # path: from the hierarchy's root
        self.shown = mount_point.rstrip("/") + path
        self.fd, self.openat2 = dir_fd, openat2
        self.device = os.fstat(dir_fd).st_dev
        self.events_fd = self.procs_fd = self.kill_fd = None

    def open(self, name, flags):
        return _open_beneath(self.fd, self.device, self.openat2, name, flags, self.shown)

    def write(self, name, text):
        fd = self.open(name, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read(self, name):
        return _read_to_end(self.open(name, os.O_RDONLY), close=True)

    def procs(self):
        """The pids of every process in it and in the cgroups below it (a
        nested supervisor's), each directory read through its own held
        descriptor."""
        pids = [int(word) for word in self.read("cgroup.procs").split()]
        for name in _subdirectories(self.fd):
            below = _ignoring(FileNotFoundError, self.child, name)
            if below is None:
                continue  # removed meanwhile (the nested supervisor is done)
            try:
                pids.extend(below.procs())
            except OSError as e:
                # test_containment.py::test_a_threaded_cgroup_below_the_runs_changes_nothing
                if e.errno != errno.EOPNOTSUPP:
                    raise  # (threaded: its processes are the domain's above, listed)
            finally:
                below.close()
        return pids

    def events(self):
        """cgroup.events as a dict ({"populated": "0", "frozen": "1"}), read
        through the descriptor held for waiting: reading it re-arms the
        kernel's notification (POLLPRI) of the next change."""
        if self.events_fd is None:
            self.events_fd = _high_fd(self.open("cgroup.events", os.O_RDONLY))
        os.lseek(self.events_fd, 0, os.SEEK_SET)
        words = _read_to_end(self.events_fd).split()
        return dict((words[i].decode(), words[i + 1].decode()) for i in range(0, len(words) - 1, 2))

    def populated(self):
        return self.events().get("populated") != "0"

    def is_root(self):
        """The hierarchy's own root (not a cgroup namespace's): it alone has
        no cgroup.events."""
        return _ignoring(FileNotFoundError, os.stat, "cgroup.events", dir_fd=self.fd) is None

    def holds(self, path):
        """Is the cgroup path (as /proc/PID/cgroup gives it) this one or below it?"""
        return path == self.path or (path or "").startswith(self.path.rstrip("/") + "/")

    def end(self, endtime):
        """cgroup.kill, and wait until it is empty (True) or endtime (False)."""
        self.write("cgroup.kill", "1")
        return _wait_for(None, _EventWaiter(self, "populated", "0"), endtime)

    def child(self, name):
        """The cgroup `name` below this one, held open."""
        fd = _high_fd(self.open(name, os.O_RDONLY | os.O_DIRECTORY))
        return _Cgroup(self.mount_point, self.path.rstrip("/") + "/" + name, fd, self.openat2)

    def make_child(self, name=None):
        """A new cgroup below this one, under a name no other run can have: our
        pid and random bytes (mkdir refuses a name that exists), or `name`;
        flocked while we live (see remove_leftovers)."""
        import fcntl
        name = name or "treereap-%d-%s" % (os.getpid(), os.urandom(4).hex())
        os.mkdir(name, 0o755, dir_fd=self.fd)
        try:
            cgroup = self.child(name)
        except BaseException:
            os.rmdir(name, dir_fd=self.fd)
            raise
        fcntl.flock(cgroup.fd, fcntl.LOCK_EX)
        return cgroup

    def remove_child(self, cgroup):
        """rmdir the cgroup below this one, and first the empty ones below it.
        False when it still holds a process (EBUSY): it stays, and the
        receipt names it."""
        try:
            _remove_below(self.fd, cgroup.path.rsplit("/", 1)[-1])
            return True
        except OSError:
            return False

    def remove_leftovers(self, fs):
        """Cgroups below this one of supervisors that died (SIGKILL) before
        removing them: a run's (marked so) is ended first, as nobody else
        would end it; then rmdir, which takes only an empty one, so a kept
        cgroup that still holds what it keeps stays. Whether its maker is
        alive is _maker_alive's to say, at once (an unmarked one, unlocked,
        is left a minute: its maker may not have marked it yet). Returns
        [(the path of a run ended, how many processes it held)]."""
        ended = []
        for name in _subdirectories(self.fd):
            if not name.startswith("treereap-"):
                continue
            fd = _ignoring(OSError, os.open, name, _DIR_NOFOLLOW, dir_fd=self.fd)
            if fd is None:
                continue  # removed meanwhile
            try:
                mark = _mark(fd)
                # test_containment.py::test_a_dead_supervisors_cgroup_is_removed_a_live_ones_never
                if not _maker_alive(fd, mark) and (
                        mark or time.time() - os.fstat(fd).st_mtime >= _LEFTOVER_MIN_AGE):
                    # test_containment.py::test_what_a_policy_kept_is_never_taken_for_a_
                    # killed_supervisors_run; ..._is_ended_by_the_next_one_at_once
                    if mark and mark.split()[:1] == [b"run"]:
                        ended += self._end_leftover(fs, name, mark)
                    _remove_below(self.fd, name)
            except OSError:
                pass  # not a run's (no mark), not empty, or taken meanwhile
            finally:
                os.close(fd)
        return ended

    def _end_leftover(self, fs, name, mark):
        """End a dead supervisor's run, unless it holds a process that started
        before the cgroup last changed (st_ctime, which the kernel sets and
        only moves forward: at the latest when its mark was set, before the
        command's fork), which is none of its run's (a root command moved it
        in, or forged the mark; test_containment.py::test_a_forged_leftover_
        holding_an_older_process_is_left_alone). Ages, not start times: a
        start time is read in the reader's time namespace, as is
        CLOCK_BOOTTIME. [(path, processes)] or []."""
        run = self.child(name)
        try:
            procs = [p for p in (fs.stat(pid) for pid in run.procs()) if p is not None]
            changed = time.time() - os.fstat(run.fd).st_ctime + _LEFTOVER_SLACK  # seconds ago
            booted = time.clock_gettime(7)  # CLOCK_BOOTTIME (unnamed before Python 3.7)
            ticks = os.sysconf("SC_CLK_TCK")
            if not procs or any(booted - p.start / ticks > changed for p in procs):
                return []
            return [(run.path, len(procs))] if run.end(_now() + _FINAL_PASS_LIMIT) else []
        finally:
            run.close()

    def lock(self):
        """Take the lock its maker holds while it lives (see _maker_alive)."""
        import fcntl
        self.kill_fd = _high_fd(self.open("cgroup.kill", os.O_WRONLY))
        fcntl.flock(self.kill_fd, fcntl.LOCK_EX)

    def close(self):
        for name in ("events_fd", "procs_fd", "kill_fd", "fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)


def _mark(fd, value=None):
    """Set a cgroup's mark to value, or read it: None when unmarked. The mark
    is trusted.treereap, which only CAP_SYS_ADMIN may write; without it (a
    container's default capabilities) user.treereap, which whoever may write
    the cgroup's files may write too, as it may write cgroup.kill (test_
    containers.py::test_the_next_exec_and_the_run_of_a_supervisor_killed_
    with_sigkill). Where neither can be set, a leftover run is not ended,
    never one kept."""
    for name in _RUN_MARKS:
        try:
            return os.setxattr(fd, name, value) or value if value else os.getxattr(fd, name)
        except OSError:
            pass
    return None


def _maker_alive(fd, mark):
    """Is the supervisor that made the cgroup at fd (its mark read) alive?
    It holds a flock on the cgroup's cgroup.kill while it lives, in any PID
    or time namespace, which no process of its run takes: cgroup.kill is
    its owner's alone to open (0200), and a --user command is not that
    (test_containment.py::test_a_flock_on_a_killed_supervisors_run_does_
    not_keep_it_alive). A lock we cannot try (EACCES) says alive. Unmarked,
    or marked by 3.2 (four words), the directory's flock, which 3.2 held
    (and we hold too, for 3.2's sake)."""
    import fcntl
    try:
        kill = os.open("cgroup.kill", os.O_WRONLY | os.O_CLOEXEC, dir_fd=fd) if (
            mark and len(mark.split()) == 1) else None
    except OSError:
        return True
    try:
        fcntl.flock(fd if kill is None else kill, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        _ignoring(TypeError, os.close, kill)
    return False


def _subdirectories(dir_fd):
    """The directories in dir_fd: the cgroups below one (a nested supervisor's),
    less those removed between the listing and their stat."""
    found = []
    for name in os.listdir(dir_fd):
        st = _ignoring(FileNotFoundError, os.stat, name, dir_fd=dir_fd, follow_symlinks=False)
        if st is not None and st.st_mode & 0o170000 == 0o040000:
            found.append(name)
    return found


def _remove_below(parent_fd, name):
    """rmdir the cgroup name and, first, the cgroups below it."""
    fd = os.open(name, _DIR_NOFOLLOW, dir_fd=parent_fd)
    try:
        for child in _subdirectories(fd):
            _remove_below(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


class _NoCgroup(Exception):
    """Why the run cannot have a cgroup here (one line)."""


# systemd names the cgroups of its units after them.
_SYSTEMD_UNIT_SUFFIXES = (".service", ".scope", ".slice")


def _cgroup2_mounts(fs):
    """(root in the hierarchy, mount point, read-only) of each cgroup2 mount."""
    return [(_unescape(before[3]), _unescape(before[4]), "ro" in before[5].split(","))
            for before, after in fs.mountinfo()
            if after and after[0] == "cgroup2" and len(before) > 5]


def _find_cgroup_home(fs):
    """Our cgroup in the cgroup v2 hierarchy, if it is ours to use: a cgroup2
    mount (never a v1 hierarchy), writable, holding our cgroup ('0::' in
    /proc/self/cgroup); not a systemd unit's unless delegated (Delegate=yes,
    the trusted.delegate or user.delegate extended attribute); no controllers
    enabled below it unless it is the root (a cgroup with processes cannot
    have children with controllers). Raises _NoCgroup with the reason."""
    ours = fs.cgroup_of(os.getpid())
    if not ours:
        raise _NoCgroup("this process is in no cgroup v2 hierarchy (cgroup v1 only)")
    mounts = [(mount_point, read_only, "/" + ours[len(root):].strip("/") if root != "/" else ours)
              for root, mount_point, read_only in _cgroup2_mounts(fs)
              if ours == root or ours.startswith(root.rstrip("/") + "/")]
    # test_containment.py::test_a_writable_cgroup_mount_listed_after_a_read_only_one_is_taken
    for mount_point, read_only, path in sorted(mounts, key=lambda m: m[1]):  # writable first
        if read_only:
            raise _NoCgroup("the cgroup v2 hierarchy at %s is mounted read-only" % mount_point)
        return _open_home(fs, mount_point, path, judge=True)
    raise _NoCgroup("no cgroup v2 hierarchy is mounted (grep cgroup2 /proc/self/mountinfo)")


def _open_home(fs, mount_point, path, judge):
    """The cgroup at path, held open; with judge, judged ours to use."""
    directory = mount_point.rstrip("/") + path
    try:
        fd = _high_fd(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError as e:
        raise _NoCgroup("cannot open the cgroup %s: %s" % (directory, e.strerror))
    try:
        if _filesystem_type(fd) != _CGROUP2_SUPER_MAGIC:
            raise _NoCgroup("%s is not a cgroup v2 directory" % directory)
        if judge:
            _judge_home(fd, directory, path)
    except BaseException:
        os.close(fd)
        raise
    return _Cgroup(mount_point, path, fd, fs.openat2)


def _judge_home(fd, directory, path):
    """Is this cgroup ours to make children in (see _find_cgroup_home)?"""
    _check_not_managed(directory, path)
    controllers = _read_path("cgroup.subtree_control", dir_fd=fd).split()
    if controllers and path != "/":
        raise _NoCgroup("our cgroup %s enables controllers below it (%s), so it cannot have "
                        "a child that holds processes" % (path, " ".join(
                            c.decode() for c in controllers)))
    if not os.access("cgroup.procs", os.W_OK, dir_fd=fd):
        raise _NoCgroup("cannot write %s/cgroup.procs (no permission)" % directory.rstrip("/"))


def _check_not_managed(directory, path):
    """systemd owns its units' cgroups: making ours in one, or moving a
    process out of it, fights systemd, unless the unit was delegated."""
    if not os.path.isdir("/run/systemd/system"):
        return
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), 0, -1):
        # test_containment.py::test_auto_leaves_a_systemd_units_cgroup_alone_unless_it_is_delegated
        if parts[depth - 1].endswith(_SYSTEMD_UNIT_SUFFIXES):
            unit_dir = directory[:len(directory) - len("/".join(parts[depth:]))].rstrip("/")
            # test_containment.py::test_auto_leaves_a_systemd_units_cgroup_alone_unless_it_is_delegated
            if _delegated(unit_dir):
                return
            raise _NoCgroup("systemd manages our cgroup %s (unit %s, not delegated); run under "
                            "systemd-run --scope -p Delegate=yes" % (path, parts[depth - 1]))


def _delegated(directory):
    return any(_ignoring((OSError, AttributeError), lambda: os.getxattr(directory, name)) == b"1"
               for name in ("trusted.delegate", "user.delegate"))


def _unescape(field):
    """mountinfo writes space, tab, newline and backslash as \\ooo (octal):
    every backslash in it starts one."""
    parts = field.split("\\")
    return parts[0] + "".join(chr(int(part[:3], 8)) + part[3:] for part in parts[1:])


def _cgroup_for_run(fs, plan):
    """(the cgroup the run's is made in, the one we stay in, the run's, the
    limits set, the leftover runs ended), or _NoCgroup saying why not: it
    needs pidfds (Linux 5.3, and no seccomp filter that refuses them: every
    member is signalled through one), cgroup.freeze (5.2) and cgroup.kill
    (5.14)."""
    try:
        pidfd = _pidfd_open(os.getpid())
    except OSError as e:
        raise _cgroup_error(e, "pidfd_open")
    # test_drain.py::test_without_pidfds_the_walk_still_drains_and_confirms
    if pidfd is None:
        raise _NoCgroup("pidfd_open is refused here (Linux 5.3, or a seccomp filter)")
    os.close(pidfd)
    try:
        home = _find_cgroup_home(fs)
    except OSError as e:
        raise _cgroup_error(e, e.filename or "cgroup")
    own = cgroup = None
    try:
        if home.path.rsplit("/", 1)[-1] == _PREPARED_LEAF:  # the run's goes beside the leaf
            own, home = home, _open_home(fs, home.mount_point,
                                         home.path.rsplit("/", 1)[0] or "/", False)
        home, own = _enable_controllers(fs, home, own or home, plan)
        ended = home.remove_leftovers(fs)
        cgroup = home.make_child()
        os.stat("cgroup.freeze", dir_fd=cgroup.fd)
        cgroup.lock()
        cgroup.procs_fd = _high_fd(cgroup.open("cgroup.procs", os.O_WRONLY))
        cgroup.events()
        limits_set = _set_limits(cgroup, plan)
        _mark(cgroup.fd, b"run")
    except (OSError, SupervisorError) as e:
        if cgroup is not None:
            home.remove_child(cgroup)
        _closed(cgroup, own, home)
        if isinstance(e, SupervisorError):
            raise
        raise _cgroup_error(e, "cannot make a cgroup in %s" % home.shown if cgroup is None else
                            "cannot use the cgroup %s (cgroup.kill needs Linux 5.14)"
                            % cgroup.shown)
    return home, own, cgroup, limits_set, ended


def _limits_asked(plan):
    """(option, controller) of each limit asked for the run's cgroup."""
    return [(option, controller) for key, controller, option in _LIMIT_CONTROLLERS
            if getattr(plan, key) is not None]


def _controllers_refused(fs, unavailable, home):
    """One line for every limit whose controller the run's cgroup cannot
    have, each with its cause as /proc/self/cgroup shows it (a controller
    mounted on a cgroup v1 hierarchy is not on v2 at all; else the cgroup
    above ours did not delegate it) and a way out."""
    v1 = set()
    for line in (fs.read("self/cgroup") or b"").decode().splitlines():
        v1.update(line.split(":")[1].split(",") if line.count(":") >= 2 else ())
    causes = []
    for on_v1, cause in ((True, "on cgroup v1 here (/proc/self/cgroup), not v2: run on a host or "
                          "VM with cgroup v2 only (booted with systemd.unified_cgroup_hierarchy"
                          "=1)"), (False, "not delegated to %s (not in its cgroup.controllers): "
                                   "run under systemd-run --scope -p Delegate=yes, or in a "
                                   "container with a cgroup namespace of its own" % home.shown)):
        those = ["%s (%s)" % (o, c) for o, c in unavailable if (c in v1) == on_v1]
        if those:
            causes.append("%s: controller %s" % (", ".join(those), cause))
    return "cannot enforce the limits: " + "; ".join(causes)


def _enable_controllers(fs, home, own, plan):
    """The controllers the limits need, enabled for the cgroups below ours.
    Below the root, a cgroup that enables controllers for its children must
    hold no process (for memory the kernel refuses it; for pids and cpu,
    threaded controllers, it would make the run's cgroup unusable): so we
    move first into a leaf of our own below it (as nsjail and BenchExec
    do), outside the run's cgroup, where its OOM kill cannot reach us; and
    stay there. Refused, naming the option, where it cannot be done: never
    a limit silently unenforced.
    Returns (the cgroup the run's is made in, the one we stay in): a leaf an
    earlier run left us in (a supervise() caller's) serves again; in the
    leaf --prepare-cgroup made (with a container's init and execs), the
    run's cgroup is made beside it."""
    enabled, available = (home.read(name).decode().split() for name in (
        "cgroup.subtree_control", "cgroup.controllers"))
    missing = [(o, c) for o, c in _limits_asked(plan) if c and c not in enabled]
    if any(c not in available for _, c in missing):
        raise SupervisorError(_controllers_refused(
            fs, [m for m in missing if m[1] not in available], home))
    if not missing:
        return home, own
    if home.path.endswith(".supervisor") and home.procs() == [os.getpid()]:
        return _open_home(fs, home.mount_point, home.path.rsplit("/", 1)[0] or "/", False), home
    text = " ".join("+" + c for _, c in missing)
    # We move, and the relay --new-session left in the caller's session (ours).
    movers = [os.getpid()] + [plan.stop_with_parent] * bool(getattr(plan, "relay", False))
    try:
        if not home.is_root():  # (--prepare-cgroup's leaf, if we were in it, closed)
            _closed(*[own] * (own is not home))
            own = home.make_child("treereap-%d-%s.supervisor" % (os.getpid(), os.urandom(4).hex()))
            for pid in movers:
                own.write("cgroup.procs", str(pid))
            if home.read("cgroup.procs").split():
                raise OSError(errno.EBUSY, "busy")
        home.write("cgroup.subtree_control", text)
    except OSError as e:
        if own is not home:
            try:
                for pid in movers:
                    home.write("cgroup.procs", str(pid))
            finally:
                home.remove_child(own)
                own.close()
        raise SupervisorError("%s: cannot enable the %s controller below the cgroup %s: %s" % (
            missing[0][0], missing[0][1], home.shown, "it holds processes other than this one; "
            "start the supervisor in a cgroup of its own, or run treereap --prepare-cgroup "
            "there once first (a container's entrypoint or first exec)"
            if e.errno == errno.EBUSY else e.strerror))
    return home, own


def _set_limits(cgroup, plan):
    """Each limit into the run's cgroup, before anything joins it; returns
    what the kernel set ({file: its text read back}). memory: swap none (the
    limit is all the run may have), and an OOM kill takes the whole run."""
    limits_set = {}
    for name, value in [("memory.max", plan.memory_max), ("memory.swap.max", 0),
                        ("memory.oom.group", 1)] * (plan.memory_max is not None) + [
                            ("pids.max", plan.pids_max)] * (plan.pids_max is not None):
        try:
            cgroup.write(name, str(value))
            limits_set[name] = cgroup.read(name).decode().strip()
        except OSError as e:  # memory.swap.max missing: a kernel without swap accounting
            raise SupervisorError("%s: cannot set %s/%s: %s" % (
                _LIMIT_CONTROLLERS[name.startswith("pids")][2], cgroup.shown, name, e.strerror))
    return limits_set


def prepare_cgroup():
    """--prepare-cgroup: make our cgroup ready for limits beside the
    processes in it (a container's init and its execs share one): each of
    them moved into the leaf _PREPARED_LEAF, then the memory and pids
    controllers enabled for the cgroups below; a supervisor started later,
    in that leaf (an exec) or below it, makes its own beside it. Right when
    run again, or by two at once; refused where the cgroup is not ours to
    change (SupervisorError, naming the cause). Returns one line."""
    fs, home, leaf = _ProcFS(), None, None
    try:
        home = _find_cgroup_home(fs)
        if home.path.rsplit("/", 1)[-1] == _PREPARED_LEAF:  # done before: we are in the leaf
            home, _ = _open_home(fs, home.mount_point, home.path.rsplit("/", 1)[0] or "/",
                                 False), home.close()
        # test_containment.py::test_prepare_cgroup_refuses_the_hierarchys_root
        if home.is_root():  # (its processes may stay: the kernel lets the root enable them)
            raise SupervisorError("--prepare-cgroup: %s is the hierarchy's root: nothing to "
                                  "prepare, runs there can have limits as it is" % home.shown)
        _ignoring(FileExistsError, os.mkdir, _PREPARED_LEAF, 0o755, dir_fd=home.fd)
        leaf, moved = home.child(_PREPARED_LEAF), 0
        for _ in range(_STOP_PASSES):  # an exec may join meanwhile
            pids = home.read("cgroup.procs").split()
            for pid in pids:
                try:
                    leaf.write("cgroup.procs", pid.decode())
                    moved += 1
                except ProcessLookupError:
                    pass
            if not pids:
                break
        available = home.read("cgroup.controllers").decode().split()
        wanted = [c for c in ("memory", "pids") if c in available]
        home.write("cgroup.subtree_control", " ".join("+" + c for c in wanted))
        return "%s: %d process(es) moved into %s; %s on for the cgroups beside it" % (
            home.shown, moved, _PREPARED_LEAF, ", ".join(wanted) or "no controller")
    except _NoCgroup as e:
        raise SupervisorError("--prepare-cgroup: %s; give the container a cgroup namespace of its "
                              "own and mount cgroup2 read-write there (docs/recipes.md)" % e)
    except OSError as e:
        raise SupervisorError("--prepare-cgroup: %s: %s" % (getattr(home, "shown", "cgroup"),
                                                           _os_error_text(e)))
    finally:
        _closed(leaf, home, fs)


def _cgroup_error(e, what):
    """A cgroup that cannot be had is a _NoCgroup; but a limit that ran out
    (descriptors, memory) is no reason to fall back: the same line as
    anywhere else."""
    if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return SupervisorError("cgroup: %s" % _os_error_text(e))
    return _NoCgroup("%s: %s" % (what, e.strerror))


class _CgroupContainment(object):
    """The run in a cgroup v2 of its own: the command joins it before exec,
    and everything it starts inherits it, whatever session or group it moves
    to. A stop freezes it (cgroup.freeze) to look, signals, thaws, and ends
    it with cgroup.kill (when everything is kept, it stays as it is, and an
    owner can end all of it at once later: --end-kept);
    the kernel says when it is empty (`populated 0` in cgroup.events, which
    wakes the wait: nothing polls). A root command can move a process out of
    the cgroup: so the confirmation is `populated 0` and a /proc walk from us
    down that finds nothing else of the run alive (docs/design.md, "The
    cgroup"). The verbs are _ProcContainment's."""

    def __init__(self, home, own, cgroup, limits_set, walker, budget, record):
        self.home, self.own, self.cgroup, self.limits_set = home, own, cgroup, limits_set
        self.walker, self.budget, self.record = walker, budget, record
        self.fs, self.me = walker.fs, os.getpid()
        self.where = "the cgroup %s" % cgroup.shown
        self.removed = False        # the run's cgroup, once empty

    def join(self, pid):
        """Write pid into cgroup.procs: 0, the child itself, before its exec,
        so that nothing it starts is ever outside. The parent writes it too
        only when a stop comes before the exec report (it has not exec'd, or
        joined already): each move waits for an RCU grace period (~5 ms)."""
        # Gone already: its exit says why.
        _ignoring(ProcessLookupError, os.write, self.cgroup.procs_fd, str(pid).encode())

    def look(self, keep_all, group, endtime):
        """Freeze the cgroup; the members, recorded, and those seen stopped.
        When everything is kept, the run's cgroup is the kept one, the
        cgroups below it (a nested supervisor's, a root command's) with it."""
        self.stay_out()
        self.cgroup.write("cgroup.freeze", "1")
        _wait_for(None, _EventWaiter(self.cgroup, "frozen", "1"),
                  min(endtime, _now() + _FREEZE_LIMIT))
        if keep_all:
            return _Look(_Scope(group, None))
        found = list(self._members(endtime).values())
        for proc in found:
            self.record.saw(proc)
        return _Look(_Scope(group), found, stopped=(p.pid for p in found if p.state == "T"))

    def _members(self, endtime=None):
        """{pid: _Proc} of the live processes in the run's cgroup now."""
        found = {}
        for pid in self.cgroup.procs():
            if endtime is not None and _now() >= endtime:
                break
            proc = self.fs.stat(pid)
            if proc is not None and proc.live:
                found[pid] = proc
        return found

    def stop(self, look, sig, endtime):
        """sig to every process in the cgroup, and SIGCONT after it to those
        the look saw stopped (so that they act on it once thawed), each
        through a pidfd taken before /proc showed it in the cgroup: never a
        reused pid; but the command's group, which a look saw (frozen, none
        can leave it), by one killpg (a pidfd each costs ~50 us a member: a
        third of a big stop). Then thaw; the waiter is `populated 0`."""
        if sig:
            _signal_group(self.fs, look.scope.group, sig)
        done = set(p.pid for p in look.found if look.scope.in_group(p)) if sig else set()
        pids = [pid for pid in self.cgroup.procs() if pid not in done or pid in look.stopped]
        batch = max(1, min(_MEMBER_BATCH, self.budget.allowed()))
        for first in range(0, len(pids), batch):
            if _now() >= endtime:
                break
            self._signal_batch(pids[first:first + batch], sig, look.stopped, done)
        self.cgroup.write("cgroup.freeze", "0")
        return _EventWaiter(self.cgroup, "populated", "0")

    def _signal_batch(self, pids, sig, stopped, done):
        """A pidfd on each, then cgroup.procs read again: a pid listed there
        whose pidfd still shows its process alive was that process's when
        read, so it is a member. One read and one poll() for the batch, not
        a read of /proc/PID/cgroup each; up to _MEMBER_BATCH descriptors. A
        pid with no pidfd (no descriptor left) gets cgroup.kill after the
        grace."""
        pinned = [(pid, fd) for pid, fd in ((pid, self.budget.pidfd(pid)) for pid in pids) if fd]
        try:
            if not pinned:
                return
            members = set(self.cgroup.procs())
            exited = set(_wait_ready([fd for _, fd in pinned], (), 0))
            for pid, fd in pinned:
                if pid in members and fd not in exited:
                    pin = _Pin(None, fd)
                    # test_drain.py::test_every_containment_continues_a_stopped_process_after_the_stop_signal
                    for each in (0 if pid in done else sig, signal.SIGCONT if pid in stopped
                                 else 0):
                        if each:
                            pin.send(each)
        finally:
            for _, fd in pinned:
                os.close(fd)

    def kill(self, group):
        self.stay_out()
        self.cgroup.write("cgroup.kill", "1")

    def stay_out(self):
        """A root command can write our own pid into the run's cgroup: the
        freeze would stop us, cgroup.kill kill us, and the run's memory
        would count ours. So we move back to our own cgroup (ours to write:
        we made the run's beside it) at every wake-up while the run runs,
        and before a freeze or a kill."""
        # test_containment.py::test_the_supervisor_written_into_the_runs_cgroup_moves_back_out
        if self.cgroup.holds(self.fs.cgroup_of(self.me)):
            self.own.write("cgroup.procs", str(self.me))

    def drain_round(self, scope, endtime):
        """cgroup.kill (again: cheap, and a storm is over at once); once the
        cgroup is empty, a kill walk for what left it."""
        self.kill(scope.group)
        if self.cgroup.populated():
            return _Round(None, _EventWaiter(self.cgroup, "populated", "0"))
        return self.walker.kill_round(scope, endtime)

    def confirm(self, scope, endtime, walk):
        return ([], False) if self.cgroup.populated() else self.walker.confirm(scope, endtime, walk)

    def preserved(self, look, endtime):
        """The roots of what is kept (everything: the run's cgroup, then the
        kept one): its live members whose parent is none of them (our
        children, and the children of one that is dying this moment, not yet
        handed to us)."""
        if look.scope.reach is not None:
            return []
        members = self._members()
        return [p for p in members.values() if p.ppid not in members]

    def census(self, scope, endtime):
        """What is alive in the cgroup, and what the walk finds outside it."""
        if scope.reach is None:
            return [], True  # all of it kept, what a nested supervisor holds too
        found = list(self._members(endtime).values())
        escaped, whole = self.walker.census(scope, endtime)
        inside = set(p.pid for p in found)
        return found + [p for p in escaped if p.pid not in inside], whole and _now() < endtime

    def usage(self):
        return _cgroup_usage(self.cgroup)

    def finish(self, look):
        """What the run cost, read before the run's cgroup is removed (once
        empty); when everything was kept, it is marked kept (no leftover of
        a dead run for the next supervisor to end) and named."""
        usage = self.usage()
        if not self.removed and not self.cgroup.populated():
            self.removed = self.home.remove_child(self.cgroup)
        kept = look is not None and look.scope.reach is None
        if kept:  # test_containment.py::test_what_a_policy_kept_is_never_taken_for_a_killed_...
            _mark(self.cgroup.fd, b"kept")
        return {"containment": "cgroup", "cgroup": self.cgroup.path, "usage": usage,
                "kept_cgroup": self.cgroup.path if kept and not self.removed else None,
                "limits_set": self.limits_set}

    def close(self):
        if self.home.fd is None:
            return  # closed already
        try:
            if not self.removed and not self.cgroup.populated():
                self.removed = self.home.remove_child(self.cgroup)
        finally:
            _closed(self.cgroup, self.own, self.home)


def _cgroup_usage(cgroup):
    """What the kernel counted for the run (every process the cgroup ever
    held, reaped or not): its CPU from cpu.stat, with the throttling where
    the cpu controller is on; where the memory and pids controllers are on,
    their peaks and events (memory.events: max, oom, oom_kill)."""
    stat, memory, pids, memory_peak, pids_peak = (_cgroup_counters(cgroup, name) for name in (
        "cpu.stat", "memory.events", "pids.events", "memory.peak", "pids.peak"))
    if stat is None:
        return None
    throttled = stat.get("throttled_usec")
    return {"source": "cgroup", "cpu_user_s": stat.get("user_usec", 0) / 1e6,
            "cpu_system_s": stat.get("system_usec", 0) / 1e6,
            "cpu_usage_s": stat.get("usage_usec", 0) / 1e6,
            "cpu_nr_throttled": stat.get("nr_throttled"),
            "cpu_throttled_s": throttled / 1e6 if throttled is not None else None,
            "memory_peak_kib": memory_peak // 1024 if memory_peak is not None else None,
            "memory_events": dict((key, memory.get(key, 0)) for key in ("max", "oom", "oom_kill"))
            if memory is not None else None,
            "pids_peak": pids_peak, "pids_events_max": pids.get("max") if pids else None}


def _cgroup_counters(cgroup, name):
    """A cgroup file of counters as {key: int} ("key value" lines), or its
    one number; None where there is no such file (no controller)."""
    try:
        words = cgroup.read(name).split()
        return int(words[0]) if len(words) == 1 else dict(
            (words[i].decode(), int(words[i + 1])) for i in range(0, len(words) - 1, 2))
    except (OSError, ValueError):
        return None


# --- Signals and the stop file --------------------------------------------------------------------

class _SignalCatcher(object):
    """This run's signals, blocked and read from a signalfd: the kernel
    queues them and the loop takes them at its own pace, so no handler ever
    runs, and a flood of queued real-time signals (each would run one) waits
    in the kernel instead of starving the cleanup. close() restores the
    caller's dispositions and mask."""

    def __init__(self, always=(), stop_signal=signal.SIGTERM):
        self.stop_signal = stop_signal
        self.held = None              # the signals no longer taken (hold())
        self.pending = []             # ones noted by hand (a parent already dead)
        self.saved = {}               # dispositions changed, to give back
        self.ignored_by_caller = set()
        self.handled = []
        self.caller_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.fd = None
        try:
            self._install(always)
        except BaseException:
            self.close()
            raise

    def _install(self, always):
        for sig in _STOP_SIGNALS + _FORWARDED_SIGNALS + (signal.SIGTSTP,):
            # nohup and background shells: a signal the caller ignored stays
            # ignored, for the command always, for us unless we need it.
            # Not SIGXFSZ: CPython itself ignores it at start.
            # test_unix.py::test_a_stop_signal_ignored_by_the_caller_stays_ignored
            # test_unix.py::test_every_other_fatal_signal_is_a_forced_stop
            if sig != signal.SIGXFSZ and signal.getsignal(sig) == signal.SIG_IGN:
                self.ignored_by_caller.add(sig)
                if sig not in always:
                    continue
                self._default(sig)  # an ignored signal is dropped, blocked or not
            self.handled.append(sig)
        # Always ours, whatever the caller left: SIGCHLD (ignored, children
        # would reap themselves), and SIGPIPE ignored (a closed stderr must not
        # kill us).
        self._default(signal.SIGCHLD)
        self.handled.append(signal.SIGCHLD)
        self.saved.setdefault(signal.SIGPIPE, signal.signal(signal.SIGPIPE, signal.SIG_IGN))
        signal.pthread_sigmask(signal.SIG_BLOCK, self.handled)
        self.fd = _signalfd(self.handled)

    def _default(self, sig):
        """SIG_DFL (signal.signal() also refuses outside the main thread, where
        a blocked mask would not hold a process-wide signal)."""
        try:
            self.saved.setdefault(sig, signal.signal(sig, signal.SIG_DFL))
        except ValueError:
            raise SupervisorError("supervise() must run in the main thread")

    def take(self):
        """(signal, monotonic time) received since the last call, oldest
        first: at most a batch, so that a flood cannot keep the loop reading."""
        taken, self.pending = self.pending, []
        data = _ignoring(BlockingIOError, os.read, self.fd, _SIGINFO_SIZE * _SIGNAL_BATCH) or b""
        now = _now()
        for i in range(0, len(data) - _SIGINFO_SIZE + 1, _SIGINFO_SIZE):
            sig = int.from_bytes(data[i:i + 4], sys.byteorder)
            if self.held is None or sig not in self.held:
                taken.append((sig, now))
        return taken

    def note(self, signals):
        """Take these as received now (a parent already dead, a Ctrl-C heard
        for us): the next take() returns them first."""
        self.pending.extend((sig, _now()) for sig in signals)

    def reset_for_command(self):
        """In the forked child, before exec: the caller's dispositions and mask,
        but SIGCHLD, SIGPIPE, SIGXFSZ and the stop signal at their default
        dispositions (a stop must be able to end the command gracefully;
        a launcher's `trap '' TERM` only fenced its own start-up), and the
        first three unblocked."""
        defaulted = set(_DEFAULTED_FOR_COMMAND)
        # test_clients.py::test_the_stop_signal_starts_at_its_default_in_the_command
        if self.stop_signal not in (0, signal.SIGKILL, signal.SIGSTOP):
            defaulted.add(self.stop_signal)
        for sig in set(self.handled) | set(self.saved) | defaulted:
            ignored = sig in self.ignored_by_caller and sig not in defaulted
            signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK,
                               set(self.caller_mask) - set(_DEFAULTED_FOR_COMMAND))

    def hold(self, signals=None):
        """Take no more of these signals (default: every one): they stay
        queued in the kernel, discarded at close(), and no longer wake the
        loop (the signalfd's mask leaves them out)."""
        self.held = frozenset(self.handled if signals is None else signals)
        _signalfd([s for s in self.handled if s not in self.held], self.fd)

    def suspend_ourselves(self):
        """Ctrl-Z for ourselves: SIGTSTP at its default, unblocked, sent to
        us; on SIGCONT, blocked and ours again. (No SIGTSTP for us when the
        caller ignored it: SIGSTOP.)"""
        if signal.SIGTSTP not in self.handled:
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        handler = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # pending, blocked
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTSTP])  # delivered: we stop
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTSTP])
        signal.signal(signal.SIGTSTP, handler)

    def close(self):
        """The caller's dispositions and mask back. What is still queued for
        this run is discarded first (at most _DISCARD_LIMIT signals), rather
        than delivered to the caller's handlers."""
        if self.fd is not None:
            _signalfd(self.handled, self.fd)  # the held ones too: all are this run's
            for _ in range(_DISCARD_LIMIT // _SIGNAL_BATCH):  # (None: nothing left)
                if not _ignoring(BlockingIOError, os.read, self.fd, _SIGINFO_SIZE * _SIGNAL_BATCH):
                    break
            os.close(self.fd)
            self.fd = None
        for sig, handler in self.saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.caller_mask)


class _StopFileWatch(object):
    """Notices the stop file, through a child of ours, the lookout: a look at
    a path on a filesystem whose server stopped answering (NFS, FUSE), or
    that a root command mounted such a one over, blocks in D state, where
    SIGKILL cannot reach. The lookout may hang; the supervisor never does.

    The lookout answers on a pipe, a word a line: its first look ("0"
    nothing there, "1" something, "E why" it cannot look), then "1" as soon
    as anything is at the path, and the answer to each question we ask on a
    second pipe. inotify on the stop file's directory wakes it at once; a
    look by path every _STOP_FILE_CHECK_INTERVAL covers the rest, and
    watches the directory the path leads to now (an ancestor renamed, a
    symlink re-pointed, a mount, a network filesystem's remote changes). It
    is none of the run's (never signalled, kept or reaped with it) and
    lives until close(), or until we exit: its questions then end."""

    def __init__(self, path):
        self.path, self.seen, self.said = path, False, b""
        ends = []
        try:
            ends.extend(_pipe())  # its answers
            ends.extend(_pipe())  # our questions
            self.pid = _acquire("fork", os.fork)
        except BaseException:
            for fd in ends:
                os.close(fd)
            raise
        if self.pid == 0:
            try:
                os.dup2(ends[2], 0)
                os.dup2(ends[1], 1)
                os.closerange(2, os.sysconf("SC_OPEN_MAX"))  # none of the run's or the caller's
                _lookout(path)
            finally:
                os._exit(0)
        os.close(ends[1])
        os.close(ends[2])
        self.fd, self.ask = ends[0], ends[3]

    def first_look(self, seconds, fs, endtime):
        """Is the stop file there at the start? The lookout first says that it
        runs ("S"), then looks: `seconds` count from then, not from its fork,
        which a loaded machine may not schedule for long (test_hostile.py::
        test_a_starved_lookout_is_waited_for). Past them, a lookout waiting
        for the CPU (R) or held by a tracer (t) is waited for, until endtime;
        one asleep in the kernel (D, or S: a FUSE request waits interruptibly
        first; test_hostile.py::test_a_first_look_asleep_in_the_kernel_is_
        refused_as_one_in_d_state) is not. Refused (UsageError) if the path
        cannot be looked at, or the look does not answer."""
        word = self._answer(endtime - _now())
        if word == b"S":
            word = self._patient_answer(seconds, fs, endtime)
        # test_hostile.py::test_a_stop_file_that_does_not_answer_at_the_start_is_refused
        if word is None:
            raise UsageError("--stop-file: %s: no answer within %gs (a network filesystem that "
                             "does not answer, or a machine too loaded to run the look?)"
                             % (self.path, seconds))
        if word.startswith(b"E"):
            raise UsageError("--stop-file: cannot look at %s: %s"
                             % (self.path, word[2:].decode("utf-8", "replace")))
        return self.seen

    def stopped(self):
        """Has the lookout seen anything at the path (or gone away: then
        nothing looks any more, and that is taken as a stop)?"""
        if not self.seen and _readable(self.fd):
            self._answer(0)
        return self.seen

    def last_look(self, seconds, fs, unanswered, until):
        """One more look, asked for: a stop file that came with the exit, or
        with a stop signal. No answer within `seconds` (more while the
        lookout waits for the CPU, up to _STOP_FILE_ANSWER, never past `until`:
        --stop-timeout's end) is `unanswered`: at an exit a stop, as a look
        that fails is; with a signal, none."""
        if not self.seen:
            _ignoring(OSError, os.write, self.ask, b"?")  # EPIPE: gone, as its answers say
            # test_hostile.py::test_a_last_look_at_the_stop_file_that_does_not_answer_counts_as_a_stop
            if self._patient_answer(seconds, fs, min(_now() + _STOP_FILE_ANSWER, until)) is None:
                self.seen = unanswered
        return self.seen

    def _patient_answer(self, seconds, fs, endtime):
        """The next word within `seconds`, or past them, until endtime, while
        the lookout waits for the CPU (R) or a tracer holds it (t)."""
        word = self._answer(seconds)
        while word is None and _now() < endtime and getattr(fs.stat(self.pid), "state",
                                                            "D") in ("R", "t"):
            word = self._answer(min(seconds, endtime - _now()))
        return word

    def _answer(self, seconds):
        """The lookout's next word, within `seconds` (None: no word)."""
        endtime = _now() + seconds
        while b"\n" not in self.said:
            if not _wait_ready([self.fd], (), endtime - _now()):
                return None
            self.said += os.read(self.fd, 512) or b"E the lookout is gone\n"
        word, self.said = self.said.split(b"\n", 1)
        self.seen = self.seen or word not in (b"0", b"S")
        return word

    def close(self):
        """End the lookout (its questions end) and reap it, within
        _FINISH_LIMIT: one stuck in a look is left to exit when it can."""
        if self.ask is None:
            return
        os.close(self.ask)
        self.ask, endtime = None, _now() + _FINISH_LIMIT
        while _wait_ready([self.fd], (), endtime - _now()):
            if not os.read(self.fd, 512):
                os.waitpid(self.pid, 0)
                break
        os.close(self.fd)


def _lookout(path):
    """The lookout's life (see _StopFileWatch): questions on fd 0, answers
    on fd 1, in a process group of its own (a terminal's signals are not
    for it)."""
    os.write(1, b"S\n")  # it runs: the first look's time counts from here
    os.setpgid(0, 0)
    # None: no inotify here (ENOSYS, EMFILE), the look by path alone.
    # test_run.py::test_stop_file_in_a_directory_created_later
    watch = _ignoring(OSError, _libc().call, "inotify_init1", os.O_CLOEXEC)
    first = asked = True
    while True:
        # The directory the path leads to now; one watched already keeps its one watch. Not
        # there (yet), the watch limit (ENOSPC), EACCES: the look by path alone.
        if watch is not None:
            _ignoring(OSError, _libc().call, "inotify_add_watch", watch, os.fsencode(
                os.path.dirname(path)), _IN_CREATE | _IN_MOVED_TO | _IN_DELETE_SELF
                | _IN_MOVE_SELF | _IN_ONLYDIR)
        try:
            os.lstat(path)
            word = b"1"
        except OSError as e:
            # test_trust.py::test_a_stop_path_that_cannot_be_looked_at_is_refused
            word = b"0" if e.errno in (errno.ENOENT, errno.ENOTDIR) else b"1"
            if first and word == b"1":
                word = ("E %s" % e.strerror).encode()  # refused; later, a stop
        if asked or word != b"0":
            os.write(1, word + b"\n")
        if word != b"0" or (asked and not first):
            break  # looked for the last time
        first = False
        ready = _wait_ready([0] + [watch] * (watch is not None), (), _STOP_FILE_CHECK_INTERVAL)
        if watch in ready:
            os.read(watch, 65536)
        asked = 0 in ready and os.read(0, 1) == b"?"
        # test_nemo.py::test_with_the_flag_any_other_ending_drains_everything
        if 0 in ready and not asked:
            return  # our questions ended: the supervisor is done, or gone
    if watch is not None:
        os.close(watch)  # now, not as the supervisor waits for us to exit (up to 15 ms)
    while os.read(0, 1):
        pass


# --- --user ---------------------------------------------------------------------------------------

class _User(object):
    """--user USER[:GROUP], resolved: uid and gid (by default the user's
    primary group; a uid without a passwd entry gets gid = uid), the user's
    supplementary groups (none without an entry), and the environment with
    HOME, USER and LOGNAME set from the entry (the caller's without one)."""

    def __init__(self, spec):
        import grp
        import pwd
        name, _, group = spec.partition(":")
        entry = _lookup(pwd.getpwnam, pwd.getpwuid, name, "user")
        self.uid = entry.pw_uid if entry is not None else _id_number(name, "user")
        if group:
            found = _lookup(grp.getgrnam, grp.getgrgid, group, "group")
            self.gid = found.gr_gid if found is not None else _id_number(group, "group")
        else:
            self.gid = entry.pw_gid if entry is not None else self.uid
        self.groups = os.getgrouplist(entry.pw_name, self.gid) if entry is not None else []
        self.environment = dict(os.environ, HOME=entry.pw_dir, USER=entry.pw_name,
                                LOGNAME=entry.pw_name) if entry is not None else None
        self.shown = entry.pw_name if entry is not None else str(self.uid)
        self.ptrace_open = _ptrace_is_open()
        # Already that user, and no privilege to change groups: nothing to switch.
        self.switching = (self.uid, self.gid) != (os.geteuid(), os.getegid()) or (
            _has_capability(_CAP_SETGID) and sorted(self.groups) != sorted(os.getgroups()))

    def can(self, checks):
        """[bool] for (path, "enter" or "write") checks, tried as the user, in
        a child that switches first: ACLs, groups and all, as the command
        would find them."""
        read_end, write_end = _pipe()
        pid = _fork(read_end, write_end)
        if pid == 0:
            try:
                os.close(read_end)
                self._answer(checks, write_end)
            finally:
                os._exit(0)
        os.close(write_end)
        try:
            answers = os.read(read_end, 65536).decode()
        finally:
            os.close(read_end)
            os.waitpid(pid, 0)
        if len(answers) != len(checks):
            raise UsageError("--user: cannot check what %s may do (the check failed)" % self.shown)
        return [answer == "1" for answer in answers]

    def _answer(self, checks, fd):
        """In the child of can(): become the user, try each check, say."""
        if self.switching:
            os.setgroups(self.groups)
            os.setresgid(self.gid, self.gid, self.gid)
            os.setresuid(self.uid, self.uid, self.uid)
        os.write(fd, "".join(_try_as_user(path, how) for path, how in checks).encode())


def _ptrace_is_open():
    """Can a process trace another of its uid here (no Yama, or its
    ptrace_scope 0)? Read at the start, through the mounts the caller or a
    container's runtime left (they bind /proc/sys read-only over itself): a
    look during the run would refuse any mount inside /proc. Unreadable:
    open, the stricter answer (test_hostile.py::test_user_confirms_in_a_
    containers_default_proc)."""
    scope = _ignoring(OSError, _read_path, "/proc/sys/kernel/yama/ptrace_scope")
    return scope is None or scope.strip() not in (b"1", b"2", b"3")  # (empty: masked)


def _try_as_user(path, how):
    try:
        if how == "enter":
            os.chdir(path)
            return "1"
        return "1" if os.access(path, os.W_OK) else "0"
    except OSError:
        return "0"


def _lookup(by_name, by_number, text, what):
    """The passwd or group entry for a name or a number; None for a number
    without an entry; UsageError for an unknown name."""
    if text.isdigit():
        return _ignoring(KeyError, by_number, _id_number(text, what))
    try:
        return by_name(text)
    except KeyError:
        raise UsageError("--user: no %s named %r on this system" % (what, text))


def _id_number(text, what):
    if not text.isdigit() or int(text) > 2 ** 32 - 2:
        raise UsageError("--user: %r is neither a %s name nor a number" % (text, what))
    return int(text)


def _directory_of(path, option):
    """Under --user, a descriptor on the directory that holds path's last
    component, reached from / one component at a time, none of them
    followed if it is a symlink: a directory the run's uid replaced with a
    symlink (to a root-only one) is refused, never followed (test_trust.py::
    test_a_swapped_directory_cannot_redirect_output_or_summary)."""
    fd, parts, i = os.open("/", _DIR_NOFOLLOW), path.split("/")[1:-1], 0
    try:
        for i, part in enumerate(parts):
            below = os.open(part, _DIR_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        return _high_fd(fd)
    except OSError as e:
        os.close(fd)
        raise UsageError("%s: cannot reach %s without a symlink (%s): under --user no symlink on "
                         "the path is followed; give the path it leads to" % (
                             option, "/" + "/".join(parts[:i + 1]), e.strerror))


def _open_to_write(path, directory, anew=False):
    """A descriptor on path, made anew; never through a symlink, never held
    up by a FIFO (ENXIO). With directory (_directory_of), opened there, and
    only a regular file of one link is truncated: one the run's uid linked
    to a file of ours would be that file. With anew, what is there is
    removed and a file of ours made: one the run's uid left there (its own)
    it could write itself, past --max-output."""
    # test_clients.py::test_a_symlink_at_the_summary_path_is_not_followed (O_NOFOLLOW)
    # test_clients.py::test_a_fifo_at_the_summary_path_never_blocks (O_NONBLOCK)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if directory is None:
        return os.open(path, flags | os.O_TRUNC, 0o644)
    if anew:  # test_limits.py::test_under_user_the_cap_holds_on_a_file_the_uid_left
        _ignoring(FileNotFoundError, os.unlink, os.path.basename(path), dir_fd=directory)
        flags |= os.O_EXCL
    fd = os.open(os.path.basename(path), flags, 0o644, dir_fd=directory)
    st = os.fstat(fd)
    if st.st_mode & 0o170000 != 0o100000 or st.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, "not a regular file of one link", path)
    os.ftruncate(fd, 0)
    return fd


def _check_user_may_not_replace(user, target):
    """Under --user the command must not be able to put a receipt of its own
    at the path, nor replace ours (nor may a kept service of it). Refused: a
    symlink anywhere on the path as given (whoever may write where it is can
    re-point it), and a `..` (the directories passed before it would not be
    judged); the receipt's directory (or the deepest one of its path
    that exists) when that user may write it, sticky or not (between the
    earlier receipt's removal and ours, the name is free for anyone who may
    create it); a directory on the way that the user owns (it can make it
    writable), or may write unless it is sticky, as /tmp is, or in which, if
    sticky, the user owns the next directory on the way (it could rename it
    away and put its own there)."""
    parts = target.path.split("/")
    # test_hostile.py::test_user_refuses_a_dotdot_on_the_receipt_path
    if ".." in parts:  # the directories passed before it are judged by no rule below
        _refuse_receipt_path(user, target.path, "a '..' on it")
    for i in range(2, len(parts)):
        here = "/".join(parts[:i])
        try:
            # test_hostile.py::test_user_refuses_a_symlink_on_the_receipt_path_the_user_controls
            if os.lstat(here).st_mode & 0o170000 == 0o120000:
                _refuse_receipt_path(user, here, "a symlink")
        except FileNotFoundError:
            break  # made at the end, below a directory the user may not write
    chain = [target.directory]
    while chain[-1] != "/":
        chain.append(os.path.dirname(chain[-1]))
    writable = dict(zip(chain, user.can([(d, "write") for d in chain])))
    for directory, below in zip(chain, [None] + chain[:-1]):
        st = os.stat(directory)
        if st.st_uid == user.uid:
            _refuse_receipt_path(user, directory, "its owner")
        # test_trust.py::test_user_accepts_a_receipt_below_a_sticky_directory
        if writable[directory] and (below is None or not st.st_mode & 0o1000
                                    or os.lstat(below).st_uid == user.uid):
            _refuse_receipt_path(user, below or directory, "in a directory it may write"
                                 if below else "writable")


def _refuse_receipt_path(user, path, why):
    raise UsageError("--user: %s could replace the receipt through %s (%s); put the receipt in "
                     "a directory that user cannot write, reached by no symlink" % (
                         user.shown, path, why))


# --- The plan and its checks ----------------------------------------------------------------------


class _Plan(object):
    """What the caller asked for, checked before anything starts: the
    command, and an attribute for each keyword of _OPTIONS (durations in
    seconds, the stop signal a number, paths absolute, user a _User)."""

    def __init__(self, command, values):
        self.command = command
        self.__dict__.update(values)


def _checked(kind, value, name):
    """An option's value, checked: from the command line a string, from the
    API a string or the value itself. None stays None (not given)."""
    value = _fspath(value) if kind == "path" else value
    if kind in ("path", "text", "pid", "size", "count", "seconds") and value is None:
        return value
    if value is None:
        raise UsageError("%s: give a value, not None" % name)
    if kind in ("size", "count"):
        return _parse_size(value, name, kind)
    if kind == "grace" and (value == 0 and not isinstance(value, bool) if not isinstance(
            value, str) else "0" in value and not value.strip().rstrip("smhd").strip("0.")):
        return 0  # GNU timeout's -k 0: no end to the grace
    if kind in ("duration", "seconds", "grace"):
        return parse_duration(value, name) if isinstance(value, str) else _check_seconds(
            value, name)
    if kind == "signal":
        return _parse_signal(str(value), name)
    if kind == "flag":
        return bool(value)
    if isinstance(kind, tuple):
        if value not in kind:
            raise UsageError("%s: %r is not one of %s" % (name, value, ", ".join(kind)))
        return value
    if kind == "pid":  # the API's alone: the command line sets it after the checks
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError("%s: give a pid (an int above 0), not %r" % (name, value))
        return value
    if not isinstance(value, str) or not value:
        raise UsageError("%s: give a non-empty string, not %r" % (name, value))
    if kind == "path" and value == "-":
        raise UsageError("%s: '-' is no path here (nothing goes to stdin or stdout): name a "
                         "file" % name)
    return value


def _checked_plan(command, values):
    """The plan, every part checked, and the receipt's target, made first: it
    removes the earlier receipt, so that from then on a refusal leaves no
    receipt at the path. Without --workdir the current directory is the
    workdir, which the receipt must stay out of, but for /: the default of
    docker exec and kubectl exec is nobody's workdir."""
    given = values["workdir"]
    values["workdir"] = _absolute(given, "--workdir") if given else _current_directory()
    for key in ("stop_file", "output", "summary"):
        if values[key] is not None:
            values[key] = _absolute(values[key], "--" + key.replace("_", "-"))
    plan = _Plan(_check_command(command), dict(values, summary_dir=None))
    _check_limits(plan)
    # test_clients.py::test_from_the_root_directory_any_receipt_path_is_accepted
    fence = None if plan.workdir == "/" and not given else plan.workdir
    room = _RECEIPT_ROOM + 2 * len(_json([_text(a) for a in plan.command + [
        plan.workdir, plan.output or "", plan.receipt or ""]]))
    target = _receipt_target(plan.receipt, fence, room) if plan.receipt is not None else None
    try:
        _check_workdir(plan.workdir)
        if plan.user is not None:
            plan.user = _check_user(plan.user, plan.workdir)
            if target is not None:
                _check_user_may_not_replace(plan.user, target)
            if plan.summary is not None:  # held from now: see _directory_of
                plan.summary_dir = _directory_of(plan.summary, "--summary")
        _check_stop_file(plan.stop_file, target)
    except BaseException:
        _closed(target)
        _close_summary_dir(plan)
        raise
    return plan, target


def _close_summary_dir(plan):
    if plan.summary_dir is not None:
        os.close(plan.summary_dir)
        plan.summary_dir = None


def _check_limits(plan):
    """What the limits need that the plan alone can tell."""
    for wrong, why in (
            (plan.max_output and plan.output is None, "--max-output: needs --output FILE"),
            ((plan.max_output or _MIN_OUTPUT_CAP) < _MIN_OUTPUT_CAP, "--max-output: at least "
             "1K (room for a head, a tail and the marker between)"),
            (plan.max_output and plan.policy != "drain-all", "--max-output: not with --%s: "
             "what is kept would write to a pipe nobody reads once the run is over; use "
             "--output alone" % plan.policy),
            ((plan.memory_max or 1 << 20) < 1 << 20, "--memory-max: at least 1M")):
        if wrong:
            raise UsageError(why)
    if _limits_asked(plan) and plan.containment == "proc":
        raise UsageError("%s: needs a cgroup of the run's own; drop --containment proc"
                         % ", ".join(o for o, _ in _limits_asked(plan)))


def _check_seconds(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise UsageError("%s: must be a positive, finite number of seconds, not %r" % (name, value))
    return float(value)


def _check_command(command):
    if isinstance(command, (str, bytes)):
        raise UsageError("command: give an argv list, such as ['make', 'test'], not %r"
                         % (command,))
    if not command:
        raise UsageError("command: the argv list is empty")
    command = [_fspath(arg) for arg in command]
    for arg in command:
        if not isinstance(arg, (str, bytes)):
            raise UsageError("command: arguments must be strings, not %r" % (arg,))
        if ("\0" if isinstance(arg, str) else b"\0") in arg:
            raise UsageError("command: %r holds a NUL byte" % (arg,))
    return command


def _fspath(value):
    """A path as the standard library takes one: a str, or an os.PathLike's."""
    return os.fspath(value) if hasattr(value, "__fspath__") else value


def _current_directory():
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory was deleted; give --workdir (or cd somewhere)")


def _absolute(path, option):
    """path made absolute against the current directory, otherwise as given
    (but for `.` and empty components): the kernel resolves its symlinks
    and `..`, for us as for whoever reads the receipt there."""
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.getcwd(), path)
        except FileNotFoundError:
            raise UsageError("%s: %s is relative and the current directory was deleted; "
                             "give an absolute path" % (option, path))
    return "/" + "/".join(part for part in path.split("/") if part not in ("", "."))


def _check_workdir(workdir):
    if not os.path.isdir(workdir):
        what = "is not a directory" if os.path.exists(workdir) else "does not exist"
        raise UsageError("--workdir: %s %s" % (workdir, what))
    if not os.access(workdir, os.X_OK):
        raise UsageError("--workdir: cannot enter %s (permission denied)" % workdir)


def _receipt_target(path, fence, room=0):
    """The receipt's target (the earlier receipt removed), refused when it
    cannot be written, or when it would land in the workdir `fence` or below
    it: the directory held open, as the kernel names it, against the
    workdir's real path (symlinks and `..` as the kernel resolves them; a
    bind mount of the workdir elsewhere is not seen)."""
    try:
        target = _ReceiptTarget(path, room)
    except OSError as e:
        raise UsageError("--receipt: %s: %s" % (e.filename or path, _os_error_text(e)))
    if fence is not None and (target.directory.rstrip("/") + "/").startswith(
            os.path.realpath(fence).rstrip("/") + "/"):
        target.close()
        raise UsageError("--receipt: %s lands in %s, inside the workdir %s (--workdir DIR; "
                         "without it, the current directory); put the receipt outside it"
                         % (path, target.directory, fence))
    return target


def _check_user(spec, workdir):
    user = _User(spec)
    if user.switching and not (_has_capability(_CAP_SETUID) and _has_capability(_CAP_SETGID)):
        raise UsageError("--user: switching to %s (uid %d) needs root (CAP_SETUID and "
                         "CAP_SETGID); run the supervisor as root" % (user.shown, user.uid))
    if not user.can([(workdir, "enter")])[0]:
        raise UsageError("--user: %s cannot enter the workdir %s" % (user.shown, workdir))
    return user


def _check_stop_file(path, target):
    """The receipt's own path is no stop file (the receipt would stop the
    next run). Whether the path can be looked at is the lookout's to say,
    at the start (see _StopFileWatch): a look here could hang."""
    # test_trust.py::test_a_stop_path_equal_to_the_receipt_path_is_refused
    if target is not None and path in (target.path, os.path.join(target.directory,
                                                                 *target.missing + [target.name])):
        raise UsageError("--stop-file: %s is the receipt's path; give them different paths" % path)


def _remove_stale_at(path):
    """A refusal leaves no receipt at the path: the regular file there is
    removed (never followed, no directory made). What else is there is left,
    and said (None when nothing is to be said)."""
    if not isinstance(path, str):
        return None
    try:
        path = _absolute(path, "--receipt")
        why = _not_a_receipt(os.lstat(path))
    except (OSError, UsageError, ValueError):
        return None  # nothing there (or no path to speak of)
    # test_hostile.py::test_what_is_not_a_file_at_the_receipt_path_is_left_and_said
    if why:
        return "--receipt %s: %s: left alone" % (path, why)
    try:
        os.unlink(path)
    except OSError as e:
        return "cannot remove the earlier receipt %s: %s" % (path, e.strerror)
    return None


def _parse_size(value, option, kind="size"):
    """A positive number of bytes ('512M', '1.5G', '1GiB', '4096': the
    binary units systemd's MemoryMax= takes, K to E, and a fraction), or of
    processes (kind "count", a whole number); ASCII digits; an int from the
    API."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    number, unit = (value.strip() if isinstance(value, str) else "").upper(), ""
    if kind == "size":
        number = number[:-2] if number[-3:-2] in "KMGTPE" and number.endswith("IB") else (
            number[:-1] if number.endswith("B") else number)
        unit = number[-1:] if number[-1:] in _SIZE_UNITS else ""
    number = number[:len(number) - len(unit)]
    digits = number.replace(".", "", kind == "size")  # ASCII digits: float() takes others too
    size = int(float(number) * _SIZE_UNITS[unit]) if digits and all(
        c in "0123456789" for c in digits) else 0
    if not 0 < size < 2 ** 63:
        # test_cli.py::test_every_example_a_message_gives_is_taken
        raise UsageError("%s: %r is not %s" % (option, value, "a whole number (100)" if kind ==
                         "count" else "a size (512M, 1.5G)" if option == "--memory-max" else
                         "a size in bytes (4096, 512K, 1.5G)"))
    return size


def _parse_signal(text, option="--signal"):
    """A signal as timeout(1) -s takes it: TERM, SIGTERM, term, 15, the
    real-time ones as RTMIN+3 or SIGRTMAX-1, and EXIT for 0 (none)."""
    name = text.strip(" \t\n\v\f\r").upper()
    # test_clients.py::test_signal_forms_and_refusals
    if name and all(c in "0123456789" for c in name):  # ASCII digits: int() takes others too
        number = int(name)
    elif name in ("EXIT", "SIGEXIT"):  # the shell's name for 0, which timeout(1) takes
        number = 0
    else:
        name = name if name.startswith("SIG") else "SIG" + name
        base, sign, offset = name.replace("-", "+-").partition("+")
        number = 16 if base == "SIGSTKFLT" else getattr(signal, base, None)  # unnamed before 3.11
        if base.startswith("SIG_") or (sign and base not in ("SIGRTMIN", "SIGRTMAX")):
            number = None
        if number is not None and sign:
            offset = _ignoring(ValueError, int, offset)
            number = None if offset is None else number + offset
    if number != 0 and number not in _VALID_SIGNALS:
        raise UsageError("%s: unknown signal %r (a name such as TERM or INT, a number, or 0 "
                         "for none)" % (option, text))
    return number


# --- The run and its outcome ----------------------------------------------------------------------


class _Outcome(object):
    """What the run came to: written only by the phases that the driver
    calls, in the order it calls them; the receipt (_receipt) is its
    projection, with the plan's, and decides nothing (docs/design.md, "The
    outcome"). Its parts, by the phase that writes them:

        started_wall, started       _start_command (until then, when the run
                                    was made): time.time() and monotonic
        usage_before, fork_rss_kib  _start_command: RUSAGE_CHILDREN, our RSS
        cgroup_unavailable          _prepare: why `auto` took no cgroup
        ladder, cleanup_started     _enter: [step, start, end] of each cleanup
                                    step; when the run left running
        stop_reason, stop_signal,   _decide_stop, the one writer: why the run
        run_signal                  stopped (None: the command's own exit),
                                    the signal that stopped it, the signal the
                                    run gets first
        error, error_exit, failed   _note_exec_failure, _fail
        killed                      _stop_and_wait, _drain: SIGKILL was needed
        survivors, stable           _drain, then _finish and _note_survivors:
        survivors_count             what was alive, whether the looks were
                                    undisturbed, how many (None: unseen)
        preserved, unattributed,    _finish: the kept roots; the live ones
        foreign                     adopted in the caller's jobs' groups; the
                                    --user uid's outside the run
        ended_wall, ended, pid,     _account: the end; the command's pid and
        return_code, held, output,  return code; the containment's fields;
        usage, namespaces, drained, the output's; the cost; the namespaces;
        oom_killed_by, confirmed,   what was ended; which OOM killer killed in
        exit_status                 the run; the verdict
    """
    __slots__ = (
        "started_wall", "started", "usage_before", "fork_rss_kib", "cgroup_unavailable", "ladder",
        "cleanup_started", "stop_reason", "stop_signal", "run_signal", "error", "error_exit",
        "failed", "killed", "survivors", "stable", "survivors_count", "preserved",
        "unattributed", "foreign", "ended_wall", "ended", "pid", "return_code", "held", "output",
        "usage", "namespaces", "drained", "confirmed", "exit_status", "supervisor_pid",
        "oom_killed_by")

    def __init__(self, plan):
        for name in self.__slots__:
            setattr(self, name, None)
        self.started_wall, self.started, self.supervisor_pid = time.time(), _now(), os.getpid()
        self.ladder, self.survivors, self.preserved, self.unattributed, self.foreign, \
            self.drained = [], [], [], [], [], []
        self.failed = self.killed = False
        self.stable, self.run_signal = True, plan.stop_signal
        self.held = {"containment": None, "cgroup": None, "kept_cgroup": None, "usage": None,
                     "limits_set": {}}


class _Run(object):
    """One supervised run: the plan, the state it is in (only _enter()
    changes it, and only the driver calls that), the outcome, and what the
    run holds while it lasts (each part closed by _release())."""

    def __init__(self, plan):
        self.plan, self.state, self.outcome = plan, "starting", _Outcome(plan)
        # The command: its pid (also its group id), its exec report, its
        # waitid() once it exited (it stays unreaped until done).
        self.pid = self.report = self.exit_info = None
        self.reaped = False
        # The deadline (the command's start + timeout); --cpu-time's next read;
        # with --stop-timeout, once a stop signal came, the end of the grace
        # and of everything but the receipt (see _note_outside_stop).
        self.endtime, self.cpu_check_at = None, 0.0 if plan.cpu_time else float("inf")
        self.grace_end = self.hard_end = float("inf")
        # The stop signals taken: the last request, (signal, when); whether a
        # later one asked to hurry (skip the rest of the grace).
        self.last_stop, self.hurry = (None, 0.0), False
        self.fs = self.containment = self.look = self.catcher = self.watch = None
        self.callers = self.reaper = self.budget = self.record = None
        self.output = self.terminal = self.ctrl_c = self.subreaper_before = None
        self.oom_score_adj = None       # the caller's, which ours was before it was -1000
        self.death_signal_before = None  # the caller's, before --stop-with-parent's


def _cleanup_budget(plan, state=None):
    """The seconds of a cleanup step: cleanup_timeout; with 0 (GNU timeout's
    -k 0, no SIGKILL) the grace has no end but a second stop signal, and the
    steps after it, which wait for what SIGKILL ends, the default."""
    return plan.cleanup_timeout or (_MAX_DURATION if state == "terminating" else
                                    DEFAULT_CLEANUP_TIMEOUT)


def _enter(run, state):
    """Move the run to `state`. Cleanup steps are timed for the receipt's
    ladder; entering one returns its endtime (a budget of cleanup_timeout)."""
    now, ladder = _now(), run.outcome.ladder
    if ladder and ladder[-1][2] is None:
        ladder[-1][2] = now
    if run.state == "running":
        run.outcome.cleanup_started = now
    run.state = state
    if state in _CLEANUP_STEPS:
        ladder.append([state, now, None])
        return min(now + _cleanup_budget(run.plan, state),
                   run.grace_end if state == "terminating" else run.hard_end)
    return None


def _by(run, seconds):
    """The endtime of a bounded step that many seconds long, within the
    stop's hard end (--stop-timeout)."""
    return min(_now() + seconds, run.hard_end)


def _wait(run, endtime, fds=(), priority_fds=()):
    """The one place a run blocks: until a signal arrives, one of fds is
    readable (pidfds), one of priority_fds changes (cgroup.events), the stop
    file's watch or the exec report speaks (while running only), or the
    monotonic time `endtime`. Then act on the signals."""
    running = run.state == "running"
    watch_fd = run.watch.fd if running and run.watch is not None else None
    report_fd = run.report.fd if running else None
    output_fd = run.output.fd if run.output is not None else None
    if output_fd is not None and _now() < run.output.due:
        output_fd, endtime = None, min(endtime, run.output.due)
    ctrl_c_fd = run.ctrl_c.fd if run.ctrl_c is not None else None
    wanted = [fd for fd in (run.catcher.fd, watch_fd, report_fd, output_fd, ctrl_c_fd)
              if fd is not None]
    if run.reaper.pending:
        endtime = min(endtime, run.reaper.next_list_reap)
    ready = _wait_ready(wanted + list(fds), priority_fds, endtime - _now())
    if output_fd in ready:  # (not at every wake-up: a read that finds nothing is a syscall)
        run.output.pump()
    if ctrl_c_fd in ready:  # (a SIGINT the caller ignored stays ignored, here too)
        run.catcher.note([sig for sig in run.ctrl_c.heard()
                          if sig not in run.catcher.ignored_by_caller])
    _act_on_signals(run)


def _wait_for(run, waiter, endtime, interruptible=False):
    """Block until waiter says done (processes gone, a cgroup empty or
    frozen): True; False at `endtime`, or, when interruptible, as soon as a
    later stop signal asks to hurry. run None: taking no signal meanwhile
    (they wait in the signalfd for the run's next _wait(), or there is no
    run: --end-kept)."""
    while not waiter.done():
        if run is not None:  # (a stop signal meanwhile may bring the stop's end closer)
            endtime = min(endtime, run.grace_end if interruptible else run.hard_end)
        # test_limits.py::test_cpu_time_holds_in_every_grace
        if _now() >= endtime or (interruptible and (run.hurry or _cpu_time_spent(run))):
            return False
        fds, priority_fds, poll_at = waiter.wake()
        until = min(endtime, endtime if poll_at is None else poll_at,
                    run.cpu_check_at if interruptible else endtime)
        if run is None:
            _wait_ready(fds, priority_fds, until - _now())
        else:
            _wait(run, until, fds, priority_fds)
    return True


def _act_on_signals(run):
    """Dispatch what arrived on (state, kind of signal); SIGCHLD reaps."""
    child_exited = False
    for sig, when in run.catcher.take():
        if sig == signal.SIGCHLD:
            child_exited = True
        else:
            kind = 1 if sig in _FORWARDED_SIGNALS else 2 if sig == signal.SIGTSTP else 0
            action = _SIGNAL_ACTIONS[run.state][kind]
            if action is not None:
                if kind == 0:
                    _note_outside_stop(run, when)
                action(run, sig, when)
    # While a list reap is pending, the zombie that made it so still hides the
    # others from waitid(): a SIGCHLD (a storm sends thousands) changes nothing.
    # test_drain.py::test_more_zombies_than_one_reaping_takes_do_not_make_the_grace_spin
    if run.reaper.pending:
        if _now() >= run.reaper.next_list_reap:
            run.reaper.reap_exited()
    elif child_exited:
        run.reaper.reap_exited()


def _note_outside_stop(run, when):
    """--stop-timeout: the first stop signal taken (an engine's stop, the
    parent's death) sets when the grace ends, and when the stop must be done
    but for the receipt, so that the receipt is on disk within the engine's
    grace, before its SIGKILL: confirmed or not, never missing."""
    limit = run.plan.stop_timeout
    if limit and run.hard_end == float("inf"):
        run.grace_end = when + limit - min(_STOP_TAIL, limit / 2)
        run.hard_end = when + limit - min(_STOP_MARGIN, limit / 4)


def _request_stop(run, sig, when):
    """The first stop request is the one; the phase that is waiting decides
    what it means (_stopped_before_start, _why_stop)."""
    if run.last_stop[0] is None:
        run.last_stop = (sig, when)


def _hurry(run, sig, when):
    """A second stop signal skips the rest of the grace. The first one after
    a stop by the deadline or the stop file is that stop again (a controller
    touches the stop file, then sends SIGTERM); the same signal again within
    _STOP_BURST is the same request (GNU timeout signals its child, then its
    own process group, which holds the child too). After a natural exit
    there is no request yet: any stop signal hurries the drain."""
    last_signal, last_when = run.last_stop
    # test_clients.py::test_with_k_0_one_stop_signal_ends_any_stops_grace
    if last_signal is None and run.outcome.stop_reason is not None and (
            run.plan.cleanup_timeout or when - run.outcome.cleanup_started < _STOP_BURST):
        run.last_stop = (sig, when)
        return
    if sig == last_signal and when - last_when < _STOP_BURST:
        return
    run.hurry, run.last_stop = True, (sig, when)
    # Nothing a stop signal can do is left: hold them all, so that a flood of
    # queued real-time ones (each would run a handler) waits in the kernel
    # instead of slowing the cleanup down.
    run.catcher.hold(_STOP_SIGNALS)


def _forward(run, sig, when):
    if not run.reaped:
        _signal_group(run.fs, run.pid, sig)


# What a signal does, by the state of the run: a stop signal (TERM, INT, HUP
# and every other that would end us), a forwarded one (USR1, USR2, WINCH),
# and SIGTSTP; None ignores it. SIGCHLD reaps in every state (_act_on_signals).
_SIGNAL_ACTIONS = {
    #              stop           forwarded  suspend
    "starting":    (_request_stop, None, None),
    "running":     (_request_stop, _forward, lambda run, sig, when: _suspend(run)),
    "terminating": (_hurry, _forward, None),
    "killing":     (_hurry, None, None),
    "draining":    (_hurry, None, None),
    "done":        (None, None, None),
}


def _command_exited(run):
    """Has the command exited? Looks without reaping (WNOWAIT)."""
    if run.exit_info is None and run.pid is not None and not run.reaped:  # (None while it runs)
        run.exit_info = _ignoring(ChildProcessError, os.waitid, os.P_PID, run.pid,
                                  os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return run.exit_info is not None


# --- Job control ----------------------------------------------------------------------------------


class _CtrlC(_HoldsFd):
    """At a terminal the command's group is the foreground one: Ctrl-C and
    Ctrl-\\ signal it, not us, and a command that catches SIGINT would run
    on. So while the run runs a child of ours joins that group to hear them
    for us: each SIGINT or SIGQUIT it gets is a byte on a pipe, a stop by
    that signal (passed on, the grace, then SIGKILL: as timeout -k). It
    ignores every other signal, and is none of the run's."""

    def __init__(self, pgid):
        self.fd, write_end = _pipe()
        parent, self.pid = os.getpid(), _fork(write_end, self.fd)
        if self.pid == 0:
            try:
                os.setpgid(0, pgid)
                _set_parent_death_signal(signal.SIGKILL)
                os.dup2(write_end, 0)
                os.closerange(1, os.sysconf("SC_OPEN_MAX"))
                heard = (signal.SIGINT, signal.SIGQUIT)
                for sig in set(_VALID_SIGNALS) - set(heard + (signal.SIGKILL, signal.SIGSTOP)):
                    signal.signal(sig, signal.SIG_IGN)
                signal.pthread_sigmask(signal.SIG_SETMASK, heard)
                while os.getppid() == parent:  # (it died before PR_SET_PDEATHSIG: we end)
                    info = signal.sigwaitinfo(heard)  # the terminal's (SI_KERNEL), not a kill()
                    # test_unix.py::test_the_commands_own_sigint_to_its_group_is_not_a_ctrl_c
                    os.write(0, bytes([info.si_signo] * (info.si_code == 0x80)))
            finally:
                os._exit(0)
        os.close(write_end)

    def heard(self):
        said = os.read(self.fd, 64)
        if not said:  # gone: Ctrl-C is the command's alone again
            _HoldsFd.close(self)
        return list(said)

    def close(self):
        if self.pid is not None:
            _quietly_signal(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None
        _HoldsFd.close(self)


def _caller_terminal():
    """fd 0 when it is a terminal and we are in its foreground group."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


def _give_terminal(fd, pgid):
    """tcsetpgrp with SIGTTOU blocked, so a background caller is not stopped."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTTOU])
    try:
        _ignoring(OSError, os.tcsetpgrp, fd, pgid)  # the terminal went away (hangup)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _take_back_terminal(run):
    """Take the terminal back from the command's group, or from whatever group
    of the run held it last and is now empty (a job the command gave it to),
    never from a live group that is not the run's."""
    if run.terminal is None or run.pid is None:
        return
    foreground = _ignoring(OSError, os.tcgetpgrp, run.terminal)
    if foreground is not None and foreground != os.getpgrp() and (
            foreground == run.pid or not _group_exists(foreground)):
        _give_terminal(run.terminal, os.getpgrp())


def _group_exists(pgid):
    try:
        _ignoring(PermissionError, os.killpg, pgid, 0)  # (members we may not signal: it exists)
    except ProcessLookupError:
        return False
    return True


def _suspend(run):
    """Ctrl-Z or SIGTSTP: stop the command's group, give the terminal back,
    stop ourselves; on SIGCONT (fg, bg) resume the group, and give it the
    terminal again if we were resumed in the foreground. In an orphaned
    process group the kernel drops SIGTSTP: we do not stop, and the group
    resumes at once."""
    if run.reaped:
        return
    _signal_group(run.fs, run.pid, signal.SIGSTOP)
    _take_back_terminal(run)
    run.catcher.suspend_ourselves()
    if run.terminal is not None and _caller_terminal() is not None:
        _give_terminal(run.terminal, run.pid)
    _signal_group(run.fs, run.pid, signal.SIGCONT)


def _check_job_control(run):
    """With the terminal handed over, Ctrl-Z stops the command: suspend with
    it. Not under --user: an untrusted command that stops itself must not
    suspend the supervisor, and with it the deadline (at the stop it gets
    SIGCONT with the stop signal, as any stopped member does)."""
    if run.terminal is None or run.plan.user is not None:
        return
    info = _ignoring(ChildProcessError, os.waitid, os.P_PID, run.pid, os.WSTOPPED | os.WNOHANG)
    if info is not None and info.si_code == os.CLD_STOPPED:
        _suspend(run)


# --- The exec report and the output ---------------------------------------------------------------


class _ExecReport(_HoldsFd):
    """The child's word on its exec, through a CLOEXEC pipe: EOF with nothing
    said means the exec happened (or the child died first); "step errno" means
    it failed. Pending until EOF is read."""

    def __init__(self, fd):
        self.fd, self.data, self.failure = fd, b"", None

    def read(self, block):
        """Read what is there; with block, to EOF (the caller knows the child is
        gone, so the only write end is closed)."""
        if self.fd is None:
            return
        os.set_blocking(self.fd, block)
        try:
            chunk = os.read(self.fd, 512)
            while chunk:
                self.data += chunk
                chunk = os.read(self.fd, 512)
        except BlockingIOError:
            return
        self.close()
        if self.data:
            step, code, detail = (self.data.decode("utf-8", "replace").split(" ", 2) + [""])[:3]
            self.failure = (step, int(code), detail)


class _Output(object):
    """--output FILE: the command's stdout and stderr. With --max-output,
    through a pipe we read at every wait (the command never blocks on it,
    and never gets SIGPIPE while the run lasts): FILE gets the first half of
    the cap as it comes, a ring (an unlinked file beside FILE) the last
    bytes; at the end, a marker where bytes were cut, then the tail. FILE
    never grows past the cap. A regular file only (a FIFO would block us)."""

    def __init__(self, path, cap, user):
        self.path, self.cap, self.seen, self.error, self.due = path, cap, 0, None, 0.0
        self.fd = self.ring = self.file = self.for_command = self.directory = None
        try:
            if user is not None:  # (see _directory_of; refused with its own line)
                self.directory = _directory_of(path, "--output")
            self.file = self.for_command = _high_fd(_open_to_write(path, self.directory, True))
            # test_limits.py::test_output_to_anything_but_a_regular_file_is_refused
            if os.fstat(self.file).st_mode & 0o170000 != 0o100000:
                raise OSError(errno.EINVAL, "not a regular file", path)
            os.set_blocking(self.file, True)
            if cap is not None:
                import fcntl
                import tempfile
                self.ring = tempfile.TemporaryFile(dir=os.path.dirname(path) if user is None
                                                   else "/proc/self/fd/%d" % self.directory)
                self.head_size, self.ring_size = cap // 2, cap - cap // 2
                self.fd, self.for_command = _pipe()
                os.set_blocking(self.fd, False)
                # Fewer, larger reads; over /proc/sys/fs/pipe-max-size the default will do.
                _ignoring(OSError, fcntl.fcntl, self.fd, _F_SETPIPE_SZ, 1 << 20)
        except BaseException as e:
            self.close()
            if isinstance(e, OSError):
                raise SupervisorError("--output: cannot write %s: %s" % (
                    e.filename or path, _os_error_text(e)))
            raise

    def pump(self):
        """Keep what the command wrote since (a bounded amount: the wait goes
        on); after a small read, the pipe is not watched for _OUTPUT_PAUSE."""
        start, self.due = self.seen, _now() + _OUTPUT_PAUSE
        for _ in range(_OUTPUT_READS if self.fd is not None else 0):
            if self.seen - start >= _OUTPUT_BURST:
                self.due = 0.0
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                return
            if not chunk:  # every writer is gone
                os.close(self.fd)
                self.fd = None
                return
            try:
                if self.error is None:
                    self._keep(chunk)
            # test_limits.py::test_a_full_disk_costs_the_output_never_the_receipt
            except OSError as e:
                self.error = "%s: %s" % (self.path, e.strerror)  # (a full disk) counted on
            self.seen += len(chunk)

    def _keep(self, chunk):
        head = max(0, min(len(chunk), self.head_size - self.seen))
        _write_all(self.file, chunk[:head])
        rest = chunk[head:][-self.ring_size:]
        at = (self.seen + len(chunk) - len(rest) - self.head_size) % self.ring_size
        first = rest[:self.ring_size - at]
        _write_all(self.ring.fileno(), first, at)
        _write_all(self.ring.fileno(), rest[len(first):], 0)

    def finish(self):
        """The tail after the head, with the marker where bytes were cut;
        the receipt's output. Anything still writing gets SIGPIPE from now.
        Without a cap, the bytes were the command's to write: not seen."""
        if self.cap is not None:
            self.pump()
            beyond = max(0, self.seen - self.head_size)
            tail, marker = min(beyond, self.ring_size), b""
            if beyond > self.ring_size:
                tail = self.ring_size - len(b"\n[treereap: %d bytes cut here]\n" % beyond)
                marker = b"\n[treereap: %d bytes cut here]\n" % (beyond - tail)
            start = (beyond - tail) % self.ring_size
            try:
                _write_all(self.file, marker if self.error is None else b"")
                while tail and self.error is None:
                    data = os.pread(self.ring.fileno(), min(tail, self.ring_size - start, 1 << 20),
                                    start)
                    if not data:
                        raise OSError(errno.EIO, "the ring is short")
                    _write_all(self.file, data)
                    tail, start = tail - len(data), (start + len(data)) % self.ring_size
            except OSError as e:
                self.error = "%s: %s" % (self.path, e.strerror)
        kept = os.fstat(self.file).st_size
        self.close()
        return {"path": _text(self.path), "max_bytes": self.cap,
                "bytes_seen": self.seen if self.cap is not None else None,
                "bytes_kept": kept, "cut": kept < self.seen, "error": self.error}

    def close(self):
        for fd in set((self.fd, self.for_command, self.file, self.directory)) - set([None]):
            os.close(fd)
        self.fd = self.for_command = self.file = self.directory = None
        _closed(self.ring)


def _write_all(fd, data, at=None):
    """All of data, where fd is or at `at`: a short write (a disk filling up)
    goes on, and one that writes nothing is ENOSPC."""
    while data:
        done = os.write(fd, data) if at is None else os.pwrite(fd, data, at)
        if not done:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        data, at = data[done:], None if at is None else at + done


# --- The phases: starting, running ----------------------------------------------------------------


def _execute(run):
    """The run, from its plan to its receipt: the driver, then the receipt,
    the projection of the plan and the outcome. Raises SupervisorError before
    the command starts. Once it started, a failure of ours still ends in a
    receipt, one that does not confirm the cleanup."""
    try:
        _drive(run)
    except BaseException:
        _abandon(run)
        if run.containment is not None and run.pid is None:
            run.containment.close()  # nothing started: the cgroup made for it goes
        raise
    return _receipt(run.plan, run.outcome)


def _drive(run):
    """The driver: the states of a run, in order, and the phase each one
    runs. It alone moves the state (_enter), and only the phases it calls
    write the outcome, in this order:

        starting     prepare (refuse what cannot work, hold the run, take the
                     signals); a stop asked for already: done, and the
                     command never starts
        running      until the command exits, the deadline, the stop file,
                     the CPU time or a stop signal
        terminating  look (freeze, keep what the policy keeps, the rest
                     recorded); the stop signal; thaw; the grace
        killing      (a forced stop) SIGKILL what can be killed at once;
                     the command's own process
        draining     drain rounds (kill, wait) until a confirming look,
                     within one budget
        done         reap the command; what is kept; one last look; then
                     the account: the containment's, the output's, the
                     cost, the verdict

    A natural exit skips killing, and draining when everything is kept. A
    failure of ours after the fork: the run is ended, drained as far as it
    can be, and not confirmed."""
    _prepare(run)
    if _stopped_before_start(run):
        _enter(run, "done")
    else:
        _run_and_end(run)
    _account(run)


def _run_and_end(run):
    """running to done: the command, its stop, the drain, the last looks."""
    run.terminal = _caller_terminal() if run.plan.user is None else None
    try:
        _start_command(run)
        _say(run, "started: pid %d, in %s, deadline %gs" % (
            run.pid, run.containment.where, run.plan.timeout))
        _enter(run, "running")
        _run_until_stop(run)
        _leave_running(run)
        if run.report.failure:
            _note_exec_failure(run)
            _enter(run, "done")
            return
        containment = run.containment
        if run.outcome.stop_reason is not None:
            # test_drain.py::test_a_stop_during_the_exec_does_not_spin_through_the_grace
            if run.report.fd is not None:  # not read to EOF: it may not have exec'd yet
                containment.join(run.pid)
            _say(run, "stopping the run: %s; %s" % (_why_stopped(run), _first_signal(run)))
            endtime = _enter(run, "terminating")
            run.look = containment.look(False, run.pid, endtime)  # a stop keeps nothing
            if run.outcome.stop_reason == "cpu_time":  # no grace: it would spend CPU -k long
                run.outcome.killed = True  # (test_limits.py::test_cpu_time_holds_its_bound_...)
            else:
                _stop_and_wait(run, run.look, endtime)
            _kill_command(run, _enter(run, "killing"))
        else:
            run.look = containment.look(_keeps_everything(run), run.pid,
                                        _now() + _cleanup_budget(run.plan))
            if run.look.found:
                _stop_and_wait(run, run.look, _enter(run, "terminating"))
            else:
                # test_containment.py::test_what_a_nested_supervisor_holds_stays_in_its_cgroup_when_the_outer_keeps_all
                containment.stop(run.look, 0, _now()).close()  # nothing to end: let the kept run on
        if run.look.scope.reach is not None:
            _drain(run, _enter(run, "draining"))
        _enter(run, "done")
        _finish(run)
    except Exception as e:
        # test_trust.py::test_a_refused_fork_names_the_limit_and_leaves_no_directories
        if run.pid is None:
            raise  # the fork itself failed: nothing started, nothing to end
        _fail(run, e)
        if run.state not in ("draining", "done"):
            # What failed may fail again: the receipt already says not confirmed.
            # test_hostile.py::test_a_file_mounted_over_our_own_children_list_is_never_believed
            _ignoring(Exception, _drain, run, _enter(run, "draining"))
        if run.state != "done":
            _enter(run, "done")
        _ignoring(Exception, _reap_after_failure, run)  # best effort, as the drain above
        _note_survivors(run)


def _prepare(run):
    """starting: refuse what cannot work; become a subreaper; hold the run
    (its containment); take over signals."""
    _require_linux()
    try:  # now: lifting the fd limit, or locking a cgroup, must not need an fd
        import fcntl, resource  # noqa: F401
    except ImportError as e:
        raise SupervisorError("cannot load the fcntl or resource module (ulimit -n?): %s" % e)
    run.fs = _ProcFS()
    run.oom_score_adj = _oom_score_adj(run.fs, b"-1000")
    _choose_containment(run)
    try:
        run.subreaper_before = _set_subreaper(True)
    except OSError as e:
        raise SupervisorError("cannot become a child subreaper (%s); Linux >= 3.4 needed" % e)
    parent = run.plan.stop_with_parent
    # SIGTERM is always ours: a launcher may ignore it only to fence its own
    # start-up (trap '' TERM; exec supervisor.py ...).
    run.catcher = _SignalCatcher(always=(signal.SIGTERM,), stop_signal=run.plan.stop_signal)
    if parent is not None:
        # The parent's death arrives as SIGTERM; a parent that died before we
        # asked shows as a new parent pid.
        run.death_signal_before = _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:
            run.catcher.note([signal.SIGTERM])
    run.callers.note(run.fs, run.reaper.children)
    if run.plan.stop_file is not None:
        run.watch = _StopFileWatch(run.plan.stop_file)
        run.callers.spare(run.watch.pid)
    if run.plan.output:
        run.output = _Output(run.plan.output, run.plan.max_output, run.plan.user)


def _oom_score_adj(fs, value):
    """Set our oom_score_adj (to -1000: the OOM killer then never chooses
    us while the run lives, not even a group kill in the run's cgroup; it
    chose us first at a container's limit, and no receipt came:
    test_limits.py::test_an_oom_kill_above_the_run_never_takes_the_supervisor);
    what it was, or None when it could not be set (unprivileged: only
    CAP_SYS_RESOURCE may lower it), or read."""
    try:
        fd = fs.open("self/oom_score_adj", os.O_RDWR)
    except (OSError, ObservationError):
        return None
    try:
        before = os.read(fd, 32).strip()
        os.write(fd, value)
        return before
    except OSError:
        return None
    finally:
        os.close(fd)


def _choose_containment(run):
    """The run's containment, chosen once: a cgroup of its own where one can
    be made and is ours to use (--containment auto, the default; cgroup
    insists), else the /proc walk alone. Reaping, the caller's jobs,
    descriptors and the record of what was drained live beside it; the
    walk serves both."""
    fs, plan = run.fs, run.plan
    children = _Children(fs)
    run.callers = _CallersJobs()
    run.reaper = _Reaper(children, run.callers)
    run.budget, run.record = _FdBudget(fs), _Record(fs)
    walker = _Walker(fs, children, run.callers, run.reaper, run.budget, run.record)
    if plan.containment != "proc":
        try:
            home, own, cgroup, limits_set, ended = _cgroup_for_run(fs, plan)
        except _NoCgroup as e:
            if plan.containment == "cgroup":
                raise SupervisorError("--containment cgroup: %s; use --containment auto or proc"
                                      % e)
            if _limits_asked(plan):
                raise SupervisorError(
                    "%s: needs a cgroup of the run's own, and there is none here: %s; run where "
                    "one can be had (systemd-run --scope -p Delegate=yes, a container with a "
                    "cgroup namespace of its own, cgroup v2), or drop the limit" % (
                        ", ".join(o for o, _ in _limits_asked(plan)), e))
            run.outcome.cgroup_unavailable = str(e)
        else:
            run.containment = _CgroupContainment(home, own, cgroup, limits_set, walker,
                                                 run.budget, run.record)
            _warn_of_memory_above(plan, home, _own_rss_kib(fs))
            for path, count in ended:
                _say(run, "ended %s, a run whose supervisor was killed: %d process(es)" % (
                    path, count))
            return
    run.containment = _ProcContainment(walker)


def _warn_of_memory_above(plan, home, rss_kib):
    """--memory-max at or over the least memory.max of the cgroups above the
    run (a container's, a pod's), less what we use ourselves: the OOM kill
    there comes first, and is no limit of the run's (its receipt says
    oom_killed_by: outside). Said on stderr: the run goes on."""
    least, path = None, home.path
    while plan.memory_max is not None:
        try:
            with open(home.mount_point.rstrip("/") + path.rstrip("/") + "/memory.max", "rb") as f:
                least = min(least or float("inf"), int(f.read()))
        except (OSError, ValueError):
            pass  # "max", no memory controller there, or not ours to see
        if path == "/":
            break
        path = path.rsplit("/", 1)[0] or "/"
    if least is not None and plan.memory_max >= least - (rss_kib or 0) * 1024:
        _complain("--memory-max %d MiB: a cgroup above the run allows %d MiB (memory.max), less "
                  "%d MiB the supervisor uses: an OOM kill there would come first; give less"
                  % (plan.memory_max >> 20, least >> 20, (rss_kib or 0) >> 10))


def _stopped_before_start(run):
    """starting: a stop signal already received, or a stop file already
    there: the command never starts."""
    _act_on_signals(run)
    there = run.watch is not None and run.watch.first_look(
        _STOP_FILE_ANSWER, run.fs, _now() + run.plan.timeout)
    sig = run.last_stop[0]
    if sig is not None or there:  # (both: one request, the stop file's)
        _decide_stop(run, "stop_file" if there else "signal", None if there else sig)
    return run.outcome.stop_reason is not None


def _decide_stop(run, reason, sig=None):
    """The one place the run's stop is decided, once, by the phase that saw
    why (docs/design.md, "The outcome"): the receipt's stop_reason, the
    signal that stopped it, and the signal the run gets first: that one if
    it is one of _PASSED_ON, else -s (none for --cpu-time). A signal the
    caller ignored is not passed on (the command ignores it too)."""
    outcome, passed_on = run.outcome, set(_PASSED_ON) - run.catcher.ignored_by_caller
    outcome.stop_reason, outcome.stop_signal = reason, sig
    outcome.run_signal = sig if sig in passed_on else run.plan.stop_signal
    if reason == "cpu_time":
        outcome.run_signal = 0  # its CPU is spent: SIGKILL at once, no grace


def _start_command(run):
    """Fork, and exec COMMAND in a process group of its own (and the run's
    cgroup) with the caller's stdio, environment, signal mask and ignored
    signals."""
    read_end, write_end = _pipe()
    outcome = run.outcome
    outcome.fork_rss_kib = _own_rss_kib(run.fs)
    # All signals blocked across fork: the child must not run our handlers.
    own_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _VALID_SIGNALS)
    try:
        outcome.started_wall, outcome.started = time.time(), _now()
        run.endtime = outcome.started + run.plan.timeout
        outcome.usage_before = _children_usage()
        pid = _acquire("fork", os.fork)
        if pid == 0:
            _exec_command(run, write_end)  # never returns
    except BaseException:
        os.close(read_end)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, own_mask)
        os.close(write_end)
        if run.output is not None and run.output.fd is not None:
            os.close(run.output.for_command)  # the command's alone: its exit is our EOF
            run.output.for_command = None
    if run.plan.user is None:  # (under --user the child makes a session: see _exec_command)
        # Also in the parent, so the group exists either way; EACCES: the child
        # has already done it and exec'd.
        _ignoring(OSError, os.setpgid, pid, pid)
    run.pid = pid
    run.reaper.command = pid  # unreaped until done (see _Reaper)
    run.report = _ExecReport(read_end)
    if run.terminal is not None:
        _give_terminal(run.terminal, pid)
        run.ctrl_c = _CtrlC(pid)
        run.callers.spare(run.ctrl_c.pid)


def _own_rss_kib(fs):
    """Our resident set now (/proc/self/statm): the image the command starts
    as, before its exec, whose peak the kernel keeps in its ru_maxrss."""
    try:
        pages = int((fs.read("self/statm") or b"0 0").split()[1])
    except (ObservationError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def _exec_command(run, report_fd):
    step = "setpgid"
    try:
        # Under --user, a session of its own, and so an autogroup and no
        # controlling terminal: in the caller's session an untrusted command
        # could renice the session's autogroup for good (19, after the run),
        # or push input into the caller's terminal (TIOCSTI).
        # test_trust.py::test_a_user_command_cannot_renice_the_callers_session
        if run.plan.user is not None:
            os.setsid()
        else:
            os.setpgid(0, 0)
        step = "cgroup"
        run.containment.join(0)
        if run.oom_score_adj is not None:  # the caller's (ours is -1000), at least 0 with
            step = "oom_score_adj"  # --memory-max: at -1000 no OOM kill would come
            adj = int(run.oom_score_adj)
            _write_all(os.open("/proc/self/oom_score_adj", os.O_WRONLY), str(
                max(adj, 0) if run.plan.memory_max is not None else adj).encode())
        if run.output is not None:
            step = "output"
            for fd in (1, 2):
                os.dup2(run.output.for_command, fd)
        if run.terminal is not None:
            step = "tcsetpgrp"
            os.tcsetpgrp(run.terminal, os.getpid())  # SIGTTOU is blocked here
        user = run.plan.user
        if user is not None and user.switching:
            step = "setgroups"
            os.setgroups(user.groups)
            step = "setgid"
            os.setresgid(user.gid, user.gid, user.gid)
            step = "setuid"
            os.setresuid(user.uid, user.uid, user.uid)
        if user is not None:
            step = "prctl(PR_SET_NO_NEW_PRIVS)"  # no setuid binary brings root back
            # test_trust.py::test_user_runs_the_command_as_that_user_with_no_way_back
            _libc().call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if run.plan.stop_signal:
            # As timeout(1): should the supervisor be killed, the command gets
            # the stop signal (after the uid switch, which would clear it).
            step = "prctl(PR_SET_PDEATHSIG)"
            # test_timeout.py::test_the_command_gets_the_stop_signal_when_the_supervisor_is_killed
            _set_parent_death_signal(run.plan.stop_signal)
            if os.getppid() != run.outcome.supervisor_pid:
                os.kill(os.getpid(), run.plan.stop_signal)
        step = "chdir"
        os.chdir(run.plan.workdir)
        run.catcher.reset_for_command()
        step = "exec"
        environment = user.environment if user is not None and user.environment else os.environ
        _exec_from_path(run.plan.command[0], run.plan.command, environment)
    except BaseException as e:  # whatever it is, the parent must hear of it
        code = getattr(e, "errno", None) or errno.EINVAL
        detail = "" if getattr(e, "errno", None) else " %s: %s" % (type(e).__name__, e)
        os.write(report_fd, ("%s %d%s" % (step, code, detail)).encode("utf-8", "replace"))
    finally:
        os._exit(EXIT_NOT_FOUND)


def _exec_from_path(name, argv, environment):
    """os.execvpe, without its imports: after a switch to --user, the
    interpreter's own library may be out of that user's reach (os.execvpe
    imports warnings). The same search: each PATH entry in turn, the first
    error that is not "not there" reported."""
    # test_hostile.py::test_an_empty_command_is_not_found
    if not name:  # as execvp(""): nothing by that name (os.execve refuses it: ValueError)
        raise FileNotFoundError(errno.ENOENT, "not found")
    if (b"/" if isinstance(name, bytes) else "/") in name:
        os.execve(name, argv, environment)
    first = last = None
    for directory in environment.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(os.fsencode(directory or "."), os.fsencode(name)),
                      argv, environment)
        except OSError as e:
            last = e
            if first is None and e.errno not in (errno.ENOENT, errno.ENOTDIR):
                first = e
    raise first or last or FileNotFoundError(errno.ENOENT, "not found")


def _run_until_stop(run):
    """running: block until the command exits (or its exec fails), or there
    is a reason to stop it (_why_stop), which is then decided."""
    while True:
        run.report.read(block=False)
        if run.report.failure:
            return
        if _command_exited(run):
            run.report.read(block=True)  # the exec report first: a failed exec is no exit
            sig = _heard_what_killed_it(run)
            if sig is not None and _return_code(run.exit_info) == -sig:
                _decide_stop(run, "signal", sig)  # a Ctrl-C: the run is stopped by it
                return
            # Another stop asked for as it exited is no stop: it hurries the drain.
            run.hurry = run.hurry or sig is not None
            return
        reason, sig = _why_stop(run)
        if reason is not None:
            _decide_stop(run, reason, sig)
            return
        _check_job_control(run)
        run.containment.stay_out()
        _wait(run, min(run.endtime, run.cpu_check_at))


def _heard_what_killed_it(run):
    """The stop signal taken, if any. At a terminal, a Ctrl-C (Ctrl-\\)
    that killed the command reached our listener at the same moment: its
    word is waited for, up to _CTRL_C_WAIT (test_unix.py::test_ctrl_c_on_
    the_terminal_ends_the_command)."""
    # test_unix.py::test_a_command_that_killed_the_listener_may_die_of_sigint_later
    listener = run.ctrl_c.fd if run.ctrl_c is not None else None
    if listener is not None and run.last_stop[0] is None and -_return_code(run.exit_info) in (
            signal.SIGINT, signal.SIGQUIT) and _wait_ready([listener], (), _CTRL_C_WAIT):
        _wait(run, _now())
    return run.last_stop[0]


def _why_stop(run):
    """(reason, signal) to stop the running command now, or (None, None): a
    stop signal taken (past the deadline, it is the deadline's), the
    deadline, the stop file, the CPU time (--cpu-time)."""
    sig, when = run.last_stop
    now = _now()
    if sig is not None:
        # test_trust.py::test_a_supervisor_stopped_past_its_deadline_stops_the_run_as_timeout
        if when >= run.endtime:
            return "timeout", None
        # The stop file, then a stop signal (NeMo Gym's stop), read in either
        # order: one request, the stop file's. test_nemo.py::test_the_
        # controllers_stop_keeps_the_commands_grace
        stop_file = run.watch is not None and run.watch.last_look(_STOP_BURST, run.fs, False,
                                                                  run.hard_end)
        return ("stop_file", None) if stop_file else ("signal", sig)
    if now >= run.endtime:
        return "timeout", None
    if run.watch is not None and run.watch.stopped():
        return "stop_file", None
    return ("cpu_time", None) if _cpu_time_spent(run) else (None, None)


def _cpu_time_spent(run):
    """--cpu-time: is the run's CPU spent (the cgroup's cpu.stat: every
    process it held, reaped or not)? Read when it could be at the earliest,
    every CPU busy (BenchExec's way): nothing reads it more often than the
    run could spend it. Watched while the command runs and in any grace."""
    if _now() < run.cpu_check_at:
        return False
    usage = run.containment.usage()  # None: cpu.stat unreadable (a mount over it): spent
    left = run.plan.cpu_time - (usage["cpu_usage_s"] if usage else float("inf"))
    run.cpu_check_at = 0.0 if left <= 0 else _now() + max(  # (spent: it stays so)
        left / (os.cpu_count() or 1), _CPU_TIME_MIN_WAKE)
    return left <= 0


def _note_exec_failure(run):
    """The child exited without running COMMAND: nothing else ran."""
    step, code, detail = run.report.failure
    if not run.reaped:
        os.waitpid(run.pid, 0)
        run.reaped = True
    # The receipt's pid and return code are the command's, and it never ran
    # (the exit _command_exited() may have seen first is the child's).
    run.pid, run.exit_info = None, None
    reason, outcome = detail or os.strerror(code), run.outcome
    if step == "exec" and not detail:
        outcome.error = "cannot run %r: %s" % (run.plan.command[0], reason)
        outcome.error_exit = (EXIT_NOT_FOUND if code in (errno.ENOENT, errno.ENOTDIR)
                              else EXIT_CANNOT_EXECUTE)
    else:
        outcome.error = "cannot start the command (%s): %s" % (step, reason)
        outcome.error_exit = EXIT_FAILURE


def _say(run, text):
    """-v: one line on stderr now, if stderr takes it at once (a full pipe
    must not hold up the stop)."""
    if run.plan.verbose:
        _complain(text, patient=False)


def _why_stopped(run):
    reason = run.outcome.stop_reason
    if reason == "timeout":
        return "the deadline passed (%gs)" % run.plan.timeout
    if reason == "stop_file":
        return "the stop file %s appeared" % run.plan.stop_file
    if reason == "cpu_time":
        return "the run spent its CPU time (--cpu-time %gs)" % run.plan.cpu_time
    return "%s received" % _signal_name(run.outcome.stop_signal)


def _leave_running(run):
    if run.ctrl_c is not None:  # (reaped at _release: until then its pid stays its own)
        _quietly_signal(run.ctrl_c.pid, signal.SIGKILL)
    if run.outcome.stop_reason is None:
        if run.watch is not None:
            run.watch.last_look(_STOP_FILE_ANSWER, run.fs, True, run.hard_end)
        _take_back_terminal(run)


def _first_signal(run):
    sig = run.outcome.run_signal
    if run.outcome.stop_reason == "cpu_time":
        return "SIGKILL at once (no grace: the CPU time is spent)"
    return "%s to the run" % _signal_name(sig) if sig else \
        "no signal first (-s 0): the grace, then SIGKILL"


# --- The phases: the stop, the drain --------------------------------------------------------------

def _keeps_everything(run):
    """Does the policy keep every process of the run out of the drain, for
    this ending? Only preserve-descendants-on-success, when the command
    exited by itself with status 0 and nothing stopped the run; anything
    else drains everything (drain-all, the default, always does). Exited
    by itself with 0 means: with no stop asked for (not even one that came
    with the exit), and no stop file there now."""
    return (run.plan.policy == "preserve-descendants-on-success"
            and run.outcome.stop_reason is None and run.exit_info is not None
            and _return_code(run.exit_info) == 0
            # test_hostile.py::test_a_last_look_at_the_stop_file_that_does_not_answer_counts_as_a_stop
            and not run.hurry and not (run.watch is not None and run.watch.seen))


def _stop_and_wait(run, look, endtime):
    """The stop signal to what the look found (a stopped process still dies
    at once of a SIGTERM it does not handle: the kernel's fatal-signal
    shortcut), the run let go on, and the grace: until each has exited,
    `endtime`, or a later stop signal asks to hurry."""
    waiter = run.containment.stop(look, run.outcome.run_signal, endtime)
    try:
        if not _wait_for(run, waiter, endtime, interruptible=True):
            run.outcome.killed, spent = True, _cpu_time_spent(run)  # (a read due is not spent)
            if spent and run.outcome.stop_reason is None:
                _decide_stop(run, "cpu_time")  # a natural exit's grace spent it
            _say(run, "the run spent its CPU time: SIGKILL" if spent else
                 "a second stop signal cut the grace short: SIGKILL" if run.hurry else
                 "--stop-timeout %gs: SIGKILL" % run.plan.stop_timeout if _now() >= run.grace_end
                 else "the grace ran out (%gs): SIGKILL" % run.plan.cleanup_timeout)
    finally:
        waiter.close()


def _kill_command(run, endtime):
    """SIGKILL what can be killed at once (the group; with a cgroup, the
    whole run), even when all seemed gone: a member forked during the grace
    must not fork again while the drain looks. Then up to cleanup_timeout
    for the command's own process (it may sit in D state)."""
    run.containment.kill(run.pid)
    while not _command_exited(run) and _now() < min(endtime, run.hard_end):
        _wait(run, min(endtime, run.hard_end))  # SIGCHLD wakes us


def _drain(run, endtime):
    """draining: SIGKILL everything in scope, round after round, until a
    stable look finds nothing alive, within one budget; then a last SIGKILL
    pass and the confirming look, within _FINAL_PASS_LIMIT."""
    outcome, containment, scope = run.outcome, run.containment, _scope(run)
    outcome.survivors, outcome.stable = _drain_rounds(run, scope, endtime)
    if outcome.stable and not outcome.survivors:
        return
    outcome.killed = True
    final_endtime = _by(run, _FINAL_PASS_LIMIT)
    containment.drain_round(scope, final_endtime).close()
    outcome.survivors, outcome.stable = containment.confirm(scope, final_endtime, None)


def _drain_rounds(run, scope, endtime):
    """Drain rounds until one is confirmed, or endtime: (alive, stable) of
    the last confirmation tried."""
    containment, outcome = run.containment, ([], False)
    while _now() < min(endtime, run.hard_end):
        endtime = min(endtime, run.hard_end)
        round_ = containment.drain_round(scope, endtime)
        try:
            if round_.clear:
                outcome = containment.confirm(scope, endtime, round_.walk)
                if outcome[1] and not outcome[0]:
                    return outcome
            _wait_for(run, round_.waiter, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
        finally:
            round_.close()
    return outcome


def _scope(run):
    """What the drain covers: the look's scope; before any look (a failure
    of ours), all of the run."""
    return run.look.scope if run.look is not None else _Scope(run.pid)


# --- The phases: done, the account ----------------------------------------------------------------

def _finish(run):
    """done: the run is drained (or all of it kept); now the command's
    zombie may go. What is kept is what is alive now; what the caller's
    jobs' groups adopted, and the --user uid's processes outside the run,
    are looked at last."""
    _reap_command(run)
    outcome = run.outcome
    outcome.preserved = run.containment.preserved(run.look, _by(run, _FINISH_LIMIT))
    outcome.unattributed = [p for p in run.callers.unattributed.values() if run.fs.alive(p)]
    # test_hostile.py::test_a_process_of_the_runs_uid_outside_the_run_keeps_it_from_being_confirmed
    if run.plan.user is not None and run.plan.user.switching:
        outcome.foreign = _foreign_processes(run, _by(run, _FINISH_LIMIT))
    _note_survivors(run)


def _reap_command(run):
    """The command's zombie goes (its exec report read first), and from now
    on the reaper may reap it."""
    if _command_exited(run) and not run.reaped:
        if run.report is not None:
            run.report.read(block=True)
        # test_drain.py::test_an_exec_that_fails_after_the_stop_is_still_reported
        if run.report is not None and run.report.failure:
            _note_exec_failure(run)
        else:
            os.waitid(os.P_PID, run.pid, os.WEXITED)
            run.reaped = True
    run.reaper.release_command()


def _foreign_processes(run, endtime):
    """--user: live processes of that uid outside the run's tree (one scan of
    /proc, by the owner of each entry). Another sandbox of the same uid, or a
    process the command took over, cannot be told from the run's: they keep
    it from being confirmed. Where ptrace is open (no Yama, or its
    ptrace_scope 0), the command could make any of them exec its payload in
    place, same pid and start time: every one counts. Where it is not, only
    those started since the run began. Give each sandbox a uid of its own."""
    uid, me = run.plan.user.uid, os.getpid()
    # test_hostile.py::test_where_ptrace_is_open_any_process_of_the_runs_uid_keeps_it_from_being_confirmed
    started = 0 if run.plan.user.ptrace_open else _boot_ticks(run.fs, run.outcome.started_wall)
    found, ours = [], set()
    for name in run.fs.listing(".") or ():
        if _now() >= endtime:
            run.outcome.stable = False
            break
        if not name.isdigit() or run.fs.owner(int(name)) != uid:
            continue
        proc = run.fs.stat(int(name))
        if proc is None or not proc.live or proc.start < started:
            continue
        if not _descends_from(run.fs, proc, me, ours):
            found.append(proc)
    return found


def _boot_ticks(fs, wall):
    """A time.time() as /proc/PID/stat's start time counts it (clock ticks
    since boot), one tick early: what started after the run began is later."""
    try:
        uptime = float((fs.read("uptime") or b"0").split()[0])
    except (ValueError, IndexError):
        return 0
    booted = time.time() - uptime
    return max(0, int((wall - booted) * os.sysconf("SC_CLK_TCK")) - 1)


def _descends_from(fs, proc, ancestor, ours):
    """Is proc below ancestor? By the ppid chain (the pids found ours are
    remembered)."""
    chain = []
    while proc is not None and proc.pid not in ours:
        if proc.ppid == ancestor:
            break
        if proc.ppid <= 1:
            return False
        chain.append(proc.pid)
        proc = fs.stat(proc.ppid)
    if proc is None:
        return False
    ours.update(chain)
    return True


def _note_survivors(run):
    """When the run is not confirmed, `survivors` lists what is alive: the
    look's finding, or, if that is empty (the look was cut short, or kept
    being disturbed, or failed), a census of the run, capped, with the count
    beside: null when the census could not see everything (it failed, or
    ran out of time), so that [] never stands for "nothing alive" unseen."""
    outcome, whole = run.outcome, True
    if not outcome.survivors and not _confirmed(outcome):
        try:
            endtime = _by(run, _CENSUS_LIMIT)
            outcome.survivors, whole = run.containment.census(_scope(run), endtime)
        # test_trust.py::test_a_look_that_fails_is_never_an_empty_one
        except Exception:  # a look that failed (or what failed the run): count unknown
            whole = False
    outcome.survivors_count = len(outcome.survivors) if whole else None


def _confirmed(outcome):
    return (not outcome.survivors and outcome.stable and not outcome.failed
            and not outcome.unattributed and not outcome.foreign)


def _account(run):
    """done, the driver's last phase: the run's end; the lookout reaped;
    what the containment says (a cgroup: its usage, read before it is
    removed); an OOM kill at the run's own --memory-max; the output's end;
    what the run cost; what was drained; the verdict. From here on no
    signal is taken (a flood of queued ones cannot delay the receipt):
    they stay pending until we exit (the CLI), or are discarded when the
    caller's handlers come back (the API)."""
    outcome = run.outcome
    outcome.ended_wall, outcome.ended = time.time(), _now()
    _take_back_terminal(run)
    _closed(run.watch)  # the lookout, reaped
    # A cgroup that cannot be read or removed: it stays, and is named.
    outcome.held = _ignoring(OSError, run.containment.finish, run.look) or outcome.held
    events = (outcome.held["usage"] or {}).get("memory_events") or {}
    if events.get("oom_kill"):  # the run's own limit counts an oom; another OOM killer, none
        outcome.oom_killed_by = "run" if events.get("oom") else "outside"
    if outcome.stop_reason is None and run.plan.memory_max is not None and (
            outcome.oom_killed_by == "run"):
        _decide_stop(run, "memory")  # the kernel's OOM killer ended the run at --memory-max
    if run.output is not None:
        outcome.output = run.output.finish()
    run.catcher.hold()
    outcome.pid = run.pid
    outcome.return_code = _return_code(run.exit_info) if run.exit_info is not None else None
    outcome.usage = _usage(outcome)
    outcome.namespaces = _namespaces(run.fs)
    outcome.confirmed = _confirmed(outcome)
    outcome.drained = run.record.drained(outcome.survivors, outcome.confirmed)
    outcome.exit_status = _exit_status(outcome, run.plan)


def _usage(outcome):
    """What the run cost. With a cgroup, its CPU from cpu.stat (every process
    it held, reaped or not) and memory.peak where the memory controller is
    on; else the CPU of every process of the run that was reaped, directly or
    below one that was (RUSAGE_CHILDREN as the subreaper sees it). Either
    way max_rss_kib is the largest peak RSS of one reaped process (the
    kernel keeps a maximum, not a sum), which for the command's own process
    starts at fork_rss_kib: it begins as a copy of the supervisor, and the
    kernel keeps that peak through its exec."""
    usage = {"source": "rusage", "cpu_user_s": 0.0, "cpu_system_s": 0.0, "max_rss_kib": 0,
             "memory_peak_kib": None, "fork_rss_kib": outcome.fork_rss_kib,
             "cpu_usage_s": None, "cpu_nr_throttled": None, "cpu_throttled_s": None,
             "memory_events": None, "pids_peak": None, "pids_events_max": None}
    if outcome.usage_before is not None:
        now, before = _children_usage(), outcome.usage_before
        usage.update(cpu_user_s=now.ru_utime - before.ru_utime,
                     cpu_system_s=now.ru_stime - before.ru_stime, max_rss_kib=now.ru_maxrss)
    usage.update(outcome.held["usage"] or {})
    usage["cpu_user_s"] = round(usage["cpu_user_s"], 6)
    usage["cpu_system_s"] = round(usage["cpu_system_s"], 6)
    usage["supervisor_cpu_s"] = round(sum(os.times()[:2]), 6)  # ours, beside the run's
    return usage


def _children_usage():
    import resource
    return resource.getrusage(resource.RUSAGE_CHILDREN)


def _namespaces(fs):
    """The PID and cgroup namespaces the receipt's pids and cgroup paths
    belong to ({"pid": "pid:[4026531836]", "cgroup": ...}): a pid, or a
    path, means another process, or none, in another namespace."""
    # TypeError: /proc was never opened (no run).
    return dict((kind, _ignoring((OSError, TypeError), os.readlink, "self/ns/" + kind,
                                 dir_fd=fs.fd)) for kind in ("pid", "cgroup"))


def _exit_status(outcome, plan):
    """The verdict, as timeout(1) gives it (see the module docstring)."""
    if not outcome.confirmed:
        return EXIT_FAILURE
    if outcome.error_exit is not None:
        return outcome.error_exit
    code = outcome.return_code
    if outcome.stop_reason in (None, "memory") or (plan.preserve_status and code is not None):
        return code if code >= 0 else 128 - code
    # test_timeout.py::test_exit_statuses_are_timeouts
    if code == -signal.SIGKILL:
        return EXIT_KILLED  # as timeout(1): the stop had to end it with SIGKILL
    if outcome.stop_reason in ("timeout", "stop_file", "cpu_time"):
        return EXIT_TIMED_OUT
    return 128 + outcome.stop_signal  # stopped by a signal


# --- When the supervisor fails --------------------------------------------------------------------


def _fail(run, error):
    """The supervisor itself failed once the command had started (a bug, a
    resource it cannot get): end what it started rather than leave it
    unsupervised (SIGKILL the group, whose leader is still held; with a
    cgroup, all of the run); the drain that follows is best effort, and the
    receipt says so: not confirmed, whatever the drain saw."""
    if isinstance(error, OSError):  # what ran out, as anywhere else (ulimit -n...)
        error = "%s%s" % (error.filename + ": " if error.filename else "", _os_error_text(error))
    elif not isinstance(error, SupervisorError):
        error = "%s: %s" % (type(error).__name__, error)
    run.outcome.failed, run.outcome.error = True, "supervisor failed: %s" % error
    _abandon(run)


def _reap_after_failure(run):
    """The command was SIGKILLed: wait for it (within cleanup_timeout), then
    reap it, so that an API caller is left no zombie. Best effort: its
    caller ignores what fails here (what failed the run may fail again)."""
    endtime = _by(run, _cleanup_budget(run.plan))
    while not _command_exited(run) and _now() < endtime:
        _wait(run, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
    _reap_command(run)


def _abandon(run):
    """Kill the command's group (its leader is still held, so the id is
    ours) and, with a cgroup, the whole run."""
    if run.pid is not None and not run.reaped:
        _quietly_signal(run.pid, signal.SIGKILL, group=True)
        _quietly_signal(run.pid, signal.SIGKILL)
        _ignoring(Exception, run.containment.kill, run.pid)  # it is what failed, perhaps


def _release(run):
    """Give back what the run took: terminal, fds, signals, subreaper bit.
    Each step is best effort: the receipt no longer depends on it."""
    steps = [lambda: _take_back_terminal(run)]
    if run.oom_score_adj is not None:  # (an API caller gets its own back)
        steps.append(lambda: _oom_score_adj(run.fs, run.oom_score_adj))
    steps += [part.close for part in (run.watch, run.report, run.output, run.ctrl_c, run.look,
                                      run.containment, run.budget, run.fs, run.catcher)
              if part is not None]
    if run.subreaper_before is False:
        steps.append(lambda: _set_subreaper(False))
    # test_api.py::test_stop_with_parent_gives_the_caller_its_death_signal_back
    if run.death_signal_before is not None:
        steps.append(lambda: _set_parent_death_signal(run.death_signal_before))
    for step in steps:
        _ignoring(Exception, step)


# --- The receipt ----------------------------------------------------------------------------------


def _receipt(plan, outcome):
    """The receipt: the plan and the outcome, projected in schema 6's order
    (docs/reference.md, "The receipt"). It reads, and decides nothing."""
    user, held, ended = plan.user, outcome.held, outcome.ended
    cleanup_s = ended - outcome.cleanup_started if outcome.cleanup_started is not None else 0.0
    return {
        "schema_version": RECEIPT_SCHEMA_VERSION, "supervisor_version": __version__,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "command": [_text(arg) for arg in plan.command], "workdir": _text(plan.workdir),
        "pid": outcome.pid, "supervisor_pid": outcome.supervisor_pid,
        "namespaces": outcome.namespaces,
        "started_at": _iso_utc(outcome.started_wall), "ended_at": _iso_utc(outcome.ended_wall),
        "duration_s": round(ended - outcome.started, 6),
        "timeout_s": plan.timeout, "cleanup_timeout_s": plan.cleanup_timeout,
        "policy": plan.policy,
        "stop_signal": _signal_name(outcome.run_signal) if outcome.run_signal else None,
        "stop_reason": outcome.stop_reason or "exit",
        "signal": _signal_name(outcome.stop_signal) if outcome.stop_signal else None,
        "oom_killed_by": outcome.oom_killed_by, "timed_out": outcome.stop_reason == "timeout",
        "return_code": outcome.return_code, "exit_status": outcome.exit_status,
        "cleanup_confirmed": outcome.confirmed, "cleanup_s": round(cleanup_s, 6),
        "ladder": [{"step": name, "start_s": round(begin - outcome.started, 6),
                    "duration_s": round((end or ended) - begin, 6)}
                   for name, begin, end in outcome.ladder],
        "containment": held["containment"], "cgroup": held["cgroup"],
        "kept_cgroup": held["kept_cgroup"], "cgroup_unavailable": outcome.cgroup_unavailable,
        "user": {"uid": user.uid, "gid": user.gid} if user is not None else None,
        "preserved": [_entry(p, start_time=p.start) for p in outcome.preserved],
        "survivors": [_entry(p, ppid=p.ppid, pgid=p.pgid, sid=p.sid, state=p.state)
                      for p in outcome.survivors[:_LIST_LIMIT]],
        "survivors_count": outcome.survivors_count,
        "unattributed": [_entry(p, start_time=p.start, why=why) for p, why in (
            [(p, "a caller's job's group") for p in outcome.unattributed]
            + [(p, "uid %d, outside the run" % user.uid) for p in outcome.foreign])[:_LIST_LIMIT]],
        "drained": [_entry(p) for p in outcome.drained[:_LIST_LIMIT]],
        "drained_count": len(outcome.drained),
        "usage": outcome.usage, "limits": _limits(plan, held["limits_set"]),
        "output": outcome.output,
        "error": _text(outcome.error) if outcome.error is not None else None,
    }


def _limits(plan, limits_set):
    """The limits asked, and what the kernel set (its files, read back)."""
    asked = dict((key, getattr(plan, key)) for key in ("memory_max", "pids_max", "max_output"))
    asked.update(cpu_time_s=plan.cpu_time, set=limits_set or {})
    return asked if _limits_asked(plan) or plan.max_output else None


def _iso_utc(timestamp):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp)) + (
        ".%06dZ" % int(timestamp % 1 * 1e6))


def _entry(proc, **fields):
    """A process in the receipt: its pid and name (see _Proc), and fields."""
    fields.update(pid=proc.pid, name=_text(proc.name))
    return fields


def _text(value):
    """Valid Unicode for the receipt: bytes decoded, and the lone surrogates of
    undecodable bytes (surrogateescape) replaced, as strict JSON readers want."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)


class _ReceiptTarget(_HoldsFd):
    """Where a receipt will land, settled at the start: the deepest directory
    of its path that exists, resolved once and held open (a directory
    swapped later cannot move the receipt), the directories still to make
    below it (made at the write: a refusal leaves none behind), and the
    name. The write: a temporary file under a name nobody can guess (made
    with O_EXCL, so a name planted there cannot be it), written, fsynced,
    renamed over the name, the directory fsynced: a reader sees no receipt
    or a whole one. A writer killed mid-write leaves its temporary file, a
    hidden name that is never read as a receipt."""

    def __init__(self, path, room=0):
        self.path, self.room = _absolute(path, "--receipt"), None
        directory, self.name = os.path.split(self.path)
        self.missing = []
        while True:
            try:
                self.fd, self.can_sync = _open_directory(directory)
                break
            except FileNotFoundError as e:
                # test_trust.py::test_a_dangling_symlink_on_the_receipts_directory_path_is_refused
                if os.path.lexists(directory):  # a dangling symlink: never made, never followed
                    raise _path_error(OSError(errno.ENOENT, "a dangling symlink"), directory)
                directory, name = os.path.split(directory)
                # test_cli.py::test_receipt_inside_the_workdir_through_dotdot_is_refused
                if name == "..":  # below a missing directory: no such path
                    raise _path_error(e, self.path)
                self.missing.insert(0, name)
            except OSError as e:
                raise _path_error(e, self.path)
        self.directory = _ignoring(OSError, os.readlink, "/proc/self/fd/%d" % self.fd) or (
            os.path.realpath(directory))
        try:
            self.remove_stale()
            # test_hostile.py::test_writing_receipts_leaks_no_descriptor
            os.close(self._temporary())  # now: a directory we may not write is refused
            _ignoring(OSError, os.unlink, self.temporary, dir_fd=self.fd)
            if room:
                self._reserve(room)
        except BaseException as e:
            self.close()
            raise _path_error(e, self.path) if isinstance(e, OSError) else e

    def _reserve(self, size):
        """Room for the receipt (and a summary beside it), taken at the start:
        an unnamed file (O_TMPFILE: the kernel frees it however we end) of
        that size in its directory, given back just before the receipt is
        written, once the run is over: a command that fills the disk cannot
        cost the receipt (test_run.py::test_a_command_that_fills_the_disk_
        cannot_cost_the_receipt). None where the filesystem makes no unnamed
        file (NFS, 9p; overlayfs before Linux 6.6)."""
        try:
            self.room = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600,
                                dir_fd=self.fd)
        except OSError:
            return
        os.posix_fallocate(self.room, 0, size)  # (ENOSPC: refused, naming the receipt)

    def remove_stale(self):
        """Remove an earlier receipt: from now on, no receipt at the path means
        this run's cleanup was not confirmed. What is there and is not a
        regular file is no receipt of ours: refused, and left alone."""
        if self.missing:
            return
        try:
            st = os.lstat(self.name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _path_error(e, self.path)
        why = _not_a_receipt(st)
        # test_trust.py::test_a_symlink_at_the_receipt_path_is_refused_and_left_as_it_is
        if why:
            raise OSError(errno.EEXIST, why + ": left alone; name a regular file", self.path)
        try:  # (gone meanwhile: nothing to remove)
            _ignoring(FileNotFoundError, os.unlink, self.name, dir_fd=self.fd)
        except OSError as e:
            raise _path_error(e, self.path, "cannot remove the earlier receipt")

    def write(self, receipt):
        data = (_json(receipt) + "\n").encode("ascii")
        self.close(room_only=True)
        try:
            self._make_missing()
            fd, temporary = self._temporary(), self.temporary
            try:
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(temporary, self.name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            # test_run.py::test_a_failed_receipt_write_is_125_and_leaves_no_temporary_file
            except BaseException:
                _ignoring(OSError, os.unlink, temporary, dir_fd=self.fd)
                raise
            # test_trust.py::test_a_receipt_directory_writable_but_not_readable_works
            if self.can_sync:
                os.fsync(self.fd)
        except OSError as e:
            raise _path_error(e, self.path)

    def close(self, room_only=False):
        if self.room is not None:
            os.close(self.room)
            self.room = None
        if not room_only:
            _HoldsFd.close(self)

    def _temporary(self):
        """A new file under a name nobody can guess, beside the receipt."""
        for _ in range(16):
            self.temporary = ".%s.%s.tmp" % (self.name, os.urandom(8).hex())
            try:
                return os.open(self.temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                               | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.fd)
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, "no free temporary name")

    def _make_missing(self):
        """The directories of the path that were missing at the start, made
        now below the directory held, none of them followed if a symlink."""
        while self.missing:
            name = self.missing[0]
            _ignoring(FileExistsError, os.mkdir, name, 0o755, dir_fd=self.fd)
            fd = _high_fd(os.open(name, _DIR_NOFOLLOW, dir_fd=self.fd))
            os.close(self.fd)
            self.fd, self.can_sync = fd, True
            self.missing.pop(0)


def _json(value, indent="\n"):
    """json.dumps(value, indent=2), the same text, for the receipt's types
    (str, int, finite float, bool, None, list, dict), without importing json."""
    if isinstance(value, str):
        return _quoted(value)
    if not isinstance(value, (dict, list, tuple)):
        return "null" if value is None else "true" if value is True else "false" if (
            value is False) else repr(value)
    inner, ends = indent + "  ", "{}" if isinstance(value, dict) else "[]"
    items = [_quoted(k) + ": " + _json(v, inner) for k, v in value.items()] if (
        ends == "{}") else [_json(v, inner) for v in value]
    return ends[0] + inner + ("," + inner).join(items) + indent + ends[1] if items else ends


def _not_a_receipt(st):
    """Why what is at the receipt's path (lstat st) is no receipt to replace,
    or None: only a regular file is. A symlink there is no receipt either:
    the rename would destroy the link (/dev/stdout, a link into /proc)."""
    kinds = {0o100000: None, 0o040000: "a directory", 0o120000: "a symlink"}
    why = kinds.get(st.st_mode & 0o170000, "a device, FIFO or socket")
    return why and why + " is there"


def _open_directory(directory):
    """(fd, whether it can be fsynced): readable when we may, else by O_PATH,
    which still serves every *at() call we make."""
    flags = os.O_DIRECTORY | os.O_CLOEXEC
    try:
        return _high_fd(os.open(directory, os.O_RDONLY | flags)), True
    # test_trust.py::test_a_receipt_directory_writable_but_not_readable_works
    except PermissionError:
        return _high_fd(os.open(directory, os.O_PATH | flags)), False


def _path_error(e, path, what=None):
    """The OSError e, naming path (and what was being done)."""
    reason = e.strerror or str(e)
    return OSError(e.errno, "%s: %s" % (what, reason) if what else reason, path)


def _deliver(run, receipt, target):
    """The receipt to its path (when that fails, the returned one says so:
    125, and the error), then the summary (--summary)."""
    plan, lost = run.plan, None
    if target is not None:
        try:
            target.write(receipt)
        except OSError as e:
            lost, receipt["exit_status"] = e, EXIT_FAILURE
            receipt["error"] = _text("%s--receipt: cannot write %s: %s" % (
                receipt["error"] + "; " if receipt["error"] else "", e.filename,
                _os_error_text(e)))
        finally:
            target.close()
    _write_summary(plan.summary, (
        _outcome(run, receipt), receipt["error"], None if receipt["cleanup_confirmed"]
        else _unconfirmed_message(receipt), "receipt: %s" % (
            "none: " + _os_error_text(lost) if lost else plan.receipt or "none")), plan.summary_dir)
    return receipt


def _write_summary(path, lines, directory=None):
    """--summary: the lines given (None: left out), each made printable (a
    process name cannot add a line), cut to 4 KiB (a Kubernetes termination
    message), in place: an atomic rename cannot replace a bind-mounted file.
    Opened as _open_to_write opens it (under --user, in the directory held
    since the start); a failure is one line, and changes no status."""
    if path is None:
        return
    try:
        with os.fdopen(_open_to_write(path, directory), "wb") as f:
            f.write("".join("".join(c if c.isprintable() else ascii(c)[1:-1] for c in line) + "\n"
                            for line in lines if line).encode("utf-8", "replace")[:_SUMMARY_LIMIT])
    except OSError as e:
        _complain("--summary: cannot write %s: %s" % (path, _os_error_text(e)))
    finally:
        if directory is not None:
            os.close(directory)


def _outcome(run, receipt):
    """-v's closing line: how the run ended, what it cost (CPU; the memory
    peak where a cgroup counts it), what the cleanup did."""
    def some(entries, count):  # the first five, named
        return " (%s%s)" % (", ".join("%d %s" % (p["pid"], p["name"]) for p in entries[:5]),
                            ", ..." if count > 5 else "") if entries else ""
    usage = receipt["usage"]
    peak = usage["memory_peak_kib"]
    return "done: %s, exit status %d in %.1fs (cleanup %.1fs), CPU %.2fs%s, %d drained%s%s, " \
        "%d kept%s, cleanup %s%s" % (
            receipt["stop_reason"] if receipt["signal"] is None else receipt["signal"],
            receipt["exit_status"], receipt["duration_s"], receipt["cleanup_s"],
            usage["cpu_user_s"] + usage["cpu_system_s"],
            "" if peak is None else ", memory peak %.1f MiB" % (peak / 1024.0),
            receipt["drained_count"], some(receipt["drained"], receipt["drained_count"]),
            " (SIGKILL was needed)" if run.outcome.killed else "", len(receipt["preserved"]),
            some(receipt["preserved"], len(receipt["preserved"])),
            "confirmed" if receipt["cleanup_confirmed"] else "NOT confirmed",
            "".join("; " + hit for hit in _limits_hit(receipt)))


def _limits_hit(receipt):
    """-v: each limit the run reached, named."""
    usage, output, asked = receipt["usage"], receipt["output"] or {}, receipt["limits"] or {}
    return [text for hit, text in (
        (asked.get("memory_max") and receipt["stop_reason"] == "memory", "--memory-max "
         "reached: the kernel's OOM killer ended the run"),
        (receipt["oom_killed_by"] == "outside", "an OOM killer outside the run (the "
         "machine's, or a cgroup's above it) killed in it"),
        (asked.get("pids_max") and usage["pids_events_max"], "--pids-max reached: %s fork(s) "
         "failed" % usage["pids_events_max"]),
        (output.get("cut"), "--max-output: %s of %s bytes kept" % (
            output.get("bytes_kept"), output.get("bytes_seen")))) if hit]


def _unconfirmed_message(receipt):
    survivors, unattributed = receipt["survivors"], receipt["unattributed"]
    if unattributed and not survivors:
        foreign = [p for p in unattributed if p["why"].startswith("uid")]
        return "cleanup not confirmed: %d process(es) %s (%s) cannot be told from the run's%s" % (
            len(foreign or unattributed), "of the run's uid outside the run" if foreign else
            "adopted in the process groups of the caller's jobs", ", ".join(
                str(p["pid"]) for p in (foreign or unattributed)[:10]),
            "; give each sandbox a uid of its own" if foreign else ", and were left alone; "
            "start the supervisor without background jobs, or with --new-session")
    count = receipt["survivors_count"]
    if not survivors:
        return ("cleanup not confirmed: %s; do not reuse this sandbox" % (
            "the processes kept changing while /proc was read" if count == 0
            else "what is still alive could not be observed"))
    return ("cleanup not confirmed: %s process(es) still alive (%s); do not reuse this "
            "sandbox" % (count if count is not None else "at least %d" % len(survivors),
                         ", ".join(str(s["pid"]) for s in survivors[:10])))


# --- The API --------------------------------------------------------------------------------------


def exec_timeout(timeout, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT):
    """The bound a controller gives the exec that runs the supervisor: the
    deadline, each bounded cleanup phase, and slack for start-up and I/O;
    with cleanup_timeout 0 (no end to the grace), none: inf."""
    return timeout + CLEANUP_PHASE_COUNT * (cleanup_timeout or float("inf")) + EXEC_TIMEOUT_SLACK


def supervise(command, timeout, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT, **options):
    """Run command under a deadline, drain what it leaves, return the receipt.

    command is an argv list of str (or bytes); timeout and cleanup_timeout
    are seconds. The other options are keywords, as the command line's
    (see _OPTIONS; docs/reference.md lists them): stop_file (stop_path is
    its old name), workdir, user ("name", "uid", "name:group"), policy (one
    of POLICIES), stop_signal (a name, a number, or 0), receipt and summary
    (paths, written as --receipt and --summary write them), containment (one
    of CONTAINMENTS), memory_max, pids_max, cpu_time, output, max_output,
    preserve_status, verbose; and stop_with_parent, the pid of this process's parent: its death stops
    the run as SIGTERM would. Must run in the main thread of a
    single-threaded process on Linux; the children it already has stay its
    own (never signalled, never reaped). Raises SupervisorError (UsageError
    for bad arguments) before anything starts. Once the command started, a
    receipt always comes back: a command that cannot be executed, a failure
    of the supervisor itself (the run is then ended and drained as far as
    it can be), or a receipt that could not be written, is in its error and
    exit_status. The caller's signal handlers, mask and subreaper bit are
    restored when it returns.
    """
    path = _fspath(options.get("receipt"))
    try:
        plan, target = _checked_plan(command, _api_values(timeout, cleanup_timeout, options))
    except BaseException:
        _remove_stale_at(path)
        raise
    run = _Run(plan)
    try:
        receipt = _execute(run)
    except BaseException:
        _closed(target)
        _close_summary_dir(plan)
        raise
    finally:
        _release(run)
    return _deliver(run, receipt, target)


def _api_values(timeout, cleanup_timeout, options):
    """The API's options, checked, with the defaults of the rest. Each long
    option is a keyword too (kill_after=, signal=, preserve_descendants_on_success=True
    as NeMo Gym's _supervise() takes it), and stop_path is stop_file's old name."""
    values, names = {"cleanup_timeout": cleanup_timeout}, {"stop_path": "stop_file"}
    for flags, keyword, kind, default, api, _ in _OPTIONS:
        if api:
            values.setdefault(keyword, default)
            names.update((flag[2:].replace("-", "_"), keyword) for flag in flags + (
                "--" + keyword,) if flag[:2] == "--")
    given = {}
    for name, value in options.items():
        if name not in names:
            import difflib  # (a mistake's cost alone)
            raise UsageError("supervise() has no option %r%s" % (name, "".join(
                "; did you mean %s?" % n for n in difflib.get_close_matches(name, names, 1))))
        keyword = names[name]
        if keyword == "policy" and name != keyword:  # drain_all, preserve_..._success: flags
            if not value:
                continue
            value = name.replace("_", "-")
        if given.get(keyword, value) != value or keyword == "cleanup_timeout" and (
                cleanup_timeout != DEFAULT_CLEANUP_TIMEOUT):
            raise UsageError("supervise(): %s given twice (as %s)" % (keyword, name))
        given[keyword] = value
    values.update(given, timeout=timeout)
    kinds = dict((row[1], row[2]) for row in _OPTIONS)
    return dict((keyword, _checked(kinds[keyword], value, keyword))
                for keyword, value in values.items())


def write_receipt(receipt, path):
    """Write receipt to path atomically (see _ReceiptTarget), creating missing
    directories; what is at path must be a regular file (replaced) or
    nothing. Errors are OSErrors that name path."""
    target = _ReceiptTarget(path)
    try:
        target.write(receipt)
    finally:
        target.close()


def parse_duration(text, option="--timeout"):
    """Seconds from '90', '1.5', '10m', '2h', '1d', as timeout(1) reads them:
    ASCII digits, an optional fraction and exponent, leading white space.
    Refuses zero, negatives, nan, inf and other text; clamps to the largest
    time_t."""
    number, unit = text.lstrip(" \t\n\v\f\r"), 1
    if number[-1:] in _DURATION_UNITS:
        number, unit = number[:-1], _DURATION_UNITS[number[-1]]
    value = None
    if number and all(c in "0123456789.eE+-" for c in number):
        value = _ignoring(ValueError, float, number)
    # A number too large or too small to represent (1e400, 1e-10000): as
    # timeout(1), the largest time_t, or a nanosecond, unless it is zero.
    # test_cli.py::test_durations_read_as_timeout_reads_them
    if value in (0, float("inf")) and not number.startswith("-") and any(
            c in "123456789" for c in number.lower().partition("e")[0]):
        value = _MAX_DURATION if value else 1e-9
    if value is None or not 0 < value < float("inf"):
        raise UsageError("%s: %r is not a positive duration (seconds, or a number "
                         "with s, m, h or d: 90, 1.5, 10m)" % (option, text))
    return min(value * unit, _MAX_DURATION)


# --- The owner's teardown -------------------------------------------------------------------------


def end_kept(receipt, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT):
    """End what a receipt (a dict, as written) kept, with all it started
    since: its kept cgroup, at once (cgroup.kill), as a run's drain ends it.
    A run that kept processes without a cgroup is refused: nothing holds all
    of what they started (a kept process that exits hands its children to
    init, where no pid leads), so nothing could say "all gone"; their owner
    ends them. Returns (all gone: bool, one line saying what was done)."""
    endtime = _now() + _check_seconds(cleanup_timeout, "cleanup_timeout")
    kept = receipt.get("preserved") or []
    if kept and not receipt.get("kept_cgroup"):
        raise UsageError("--end-kept: the run kept %d process(es) without a cgroup (containment "
                         "%s): nothing holds all they started; end them as their owner, or "
                         "keep with a cgroup" % (len(kept), receipt.get("containment")))
    fs = _ProcFS()
    try:
        here = _namespaces(fs)
        # test_api.py::test_end_kept_refuses_a_receipt_of_other_namespaces
        if receipt.get("namespaces") != here or None in here.values():
            raise UsageError("--end-kept: the receipt's pids and cgroups are another namespace's "
                             "(%s, here %s); run --end-kept where the run ran" % (
                                 receipt.get("namespaces"), here))
        done, ended, note = _end_kept_cgroups(fs, receipt, endtime) if receipt.get(
            "kept_cgroup") else (True, 0, None)
    finally:
        fs.close()
    return done, ("all kept processes are gone: " if done else "NOT all gone: ") + "; ".join(
        ["ended %d process(es)" % ended] + [note] * bool(note))


def _kept_alive(fs, entries):
    """The pids of the receipt's kept processes that are alive and still
    those processes (the start time the receipt's: a pid reused since is
    another's)."""
    alive = []
    for entry in entries:
        pid = entry.get("pid") if isinstance(entry, dict) else None
        proc = fs.stat(pid) if isinstance(pid, int) and pid > 1 else None
        if proc is not None and proc.live and proc.start == entry.get("start_time"):
            alive.append(pid)
    return alive


def _end_kept_cgroups(fs, receipt, endtime):
    """cgroup.kill on the receipt's kept cgroup, then its removal, if it is
    one this supervisor makes (named after the run's cgroup: that one, when
    everything was kept, or RUN.kept-RANDOM), if the receipt kept anything,
    if the supervisor that made it is gone (_maker_alive: a live run's is
    left alone), and if it holds every kept process the receipt names that is
    alive (a receipt naming another run's cgroup is then caught). A kept
    cgroup whose listed processes all died holds what descends from them:
    no pid chain leads there any more, and it is ended too. (done, how many
    it held, a note)."""
    alive = _kept_alive(fs, receipt.get("preserved") or [])
    path, run_path = receipt["kept_cgroup"], str(receipt.get("cgroup") or "")
    name, run_name = path.rsplit("/", 1)[-1], run_path.rsplit("/", 1)[-1]
    # test_containment.py::test_a_forged_kept_cgroup_is_left_alone
    if not (name.startswith("treereap-") and name.partition(".kept-")[0] == run_name
            and receipt.get("preserved")):
        return False, 0, "kept_cgroup %s is not a cgroup this supervisor makes: left alone" % path
    mount_point = next((m for root, m, _ in _cgroup2_mounts(fs) if root == "/"), None)
    if mount_point is None:
        return False, 0, "kept_cgroup %s: no cgroup v2 hierarchy is mounted here" % path
    home = cgroup = None
    try:
        home = _open_home(fs, mount_point, path.rsplit("/", 1)[0] or "/", judge=False)
        cgroup = home.child(name)
        if _maker_alive(cgroup.fd, _mark(cgroup.fd)):
            return False, 0, "kept_cgroup %s is its run's still: left alone" % cgroup.path
        # test_containment.py::test_a_forged_kept_cgroup_is_left_alone
        if any(not cgroup.holds(fs.cgroup_of(pid)) for pid in alive):
            return False, 0, ("kept_cgroup %s does not hold the processes the receipt kept: "
                              "left alone" % cgroup.path)
        count = len(cgroup.procs())
        if not cgroup.end(endtime):
            return False, count, "kept_cgroup %s is not empty" % cgroup.path
        home.remove_child(cgroup)
        return True, count, None
    except (OSError, _NoCgroup) as e:
        # test_api.py::test_end_kept_never_says_all_gone_of_a_kept_process_outside_its_removed_cgroup
        if cgroup is None and getattr(e, "errno", None) == errno.ENOENT and not alive:
            return True, 0, None  # removed already: nothing in it
        return False, 0, "kept_cgroup %s: %s" % (path, getattr(e, "strerror", None) or e)
    finally:
        _closed(cgroup, home)


# --- The command line -----------------------------------------------------------------------------


# Every option, once, for the API, the command line and --help: its flags,
# the API's keyword, its kind (a policy flag: the policy it sets is its
# default), its default, whether the API takes it, and its help ("METAVAR
# text" when it takes a value).
_OPTIONS = (
    (("--timeout",), "timeout", "duration", None, True,
     "DURATION the deadline, from COMMAND's start (required): 90, 1.5, 10m, 2h, 1d"),
    (("-k", "--kill-after", "--cleanup-timeout"), "cleanup_timeout", "grace",
     DEFAULT_CLEANUP_TIMEOUT, True, "DURATION the time EACH cleanup step may take: the grace "
     "after the stop signal, the wait after SIGKILL, the drain (10); 0, as in timeout -k 0: "
     "the grace has no end"),
    (("--stop-timeout",), "stop_timeout", "seconds", None, True, "DURATION a stop signal from "
     "outside (an engine's stop, the parent's death) ends the run, the receipt written, "
     "within DURATION in all, whatever -k: give the engine's grace (docker stop's 10)"),
    (("--stop-with-parent",), "stop_with_parent", "pid", None, True, "stop the run, as "
     "SIGTERM would, when the process that started the supervisor dies (tini's -p)"),
    (("-s", "--signal"), "stop_signal", "signal", "TERM", True,
     "SIG the signal a stop sends first (TERM; 0: none, only the grace, then SIGKILL)"),
    (("--stop-file",), "stop_file", "path", None, True,
     "PATH stop the run when PATH appears (if it is there already, COMMAND never starts)"),
    (("--receipt",), "receipt", "path", None, True, "PATH write the JSON receipt there, outside "
     "the workdir (an older one there is removed first)"),
    (("--workdir",), "workdir", "path", None, True,
     "DIR run COMMAND in DIR (default: the current directory, which the receipt must then "
     "be outside of, unless it is /)"),
    (("--user",), "user", "text", None, True,
     "USER[:GROUP] run COMMAND as that user, who cannot touch the supervisor or the receipt"),
    (("--memory-max",), "memory_max", "size", None, True, "SIZE the memory of all the run's "
     "processes together, swap included (512M, 1.5G); past it, the run is killed"),
    (("--pids-max",), "pids_max", "count", None, True,
     "N at most N processes and threads in the run at once (a fork past it fails)"),
    (("--cpu-time",), "cpu_time", "seconds", None, True,
     "DURATION the CPU time of all the run's processes; once spent, the run is killed at once"),
    (("--output",), "output", "path", None, True,
     "FILE send COMMAND's stdout and stderr to FILE (made anew)"),
    (("--max-output",), "max_output", "size", None, True, "SIZE keep at most SIZE bytes in "
     "FILE: the head and the tail (with --output)"),
    (("--containment",), "containment", CONTAINMENTS, "auto", True,
     "auto|cgroup|proc give the run a cgroup of its own where one can be made (auto), "
     "insist on one (cgroup), or use none (proc)"),
    (("--drain-all",), "policy", POLICIES, "drain-all", True,
     "end every process of the run when it ends (the default)"),
    (("--preserve-descendants-on-success",), "policy", POLICIES,
     "preserve-descendants-on-success", True, "when COMMAND exits 0 by itself, leave every "
     "process it started running; otherwise end them all"),
    (("--preserve-status",), "preserve_status", "flag", False, True,
     "exit with COMMAND's status even when the run was stopped (125 still wins)"),
    (("-v", "--verbose"), "verbose", "flag", False, True,
     "say on stderr when the run starts and stops, what it ended and kept, what it cost"),
    (("--summary",), "summary", "path", None, True, "PATH also write a short account of how "
     "the run ended to PATH, 4 KiB at most (/dev/termination-log)"),
    (("--new-session",), "new_session", "flag", False, False, "leave the caller's session, so "
     "that a kill of the caller's process group cannot stop the cleanup"),
    (("--end-kept",), "end_kept", "path", None, False, "RECEIPT end what an earlier run kept "
     "(its receipt), within -k; exit 0 when all of it is gone"),
    (("--prepare-cgroup",), "prepare_cgroup", "flag", False, False, "move every process of "
     "this cgroup into a leaf, so that later runs can have limits (a container's entrypoint)"),
)


_USAGE = """\
usage: %(prog)s --timeout DURATION [OPTIONS] -- COMMAND [ARG...]
       %(prog)s --end-kept RECEIPT [-k DURATION]

Run COMMAND under a deadline, drain every process it leaves behind, and write
a JSON receipt that says what happened and whether that was observed.

what is kept: nothing by default (every process of the run is drained).

options:
%(options)s
  -h, --help; -V, --version

signals: TERM, INT, HUP and every other signal that would end a process stop
the run (TERM, INT, HUP and QUIT reach it as themselves; the rest send -s); a
second one skips the rest of the grace; USR1, USR2 and WINCH are forwarded to
COMMAND's group; TSTP suspends the run. At a terminal, Ctrl-C stops it too.

the receipt: cleanup_confirmed (do not reuse the sandbox when false),
exit_status, return_code, stop_reason, preserved (what was kept), drained,
survivors, error. No receipt: the cleanup was not confirmed.

exit status: COMMAND's own; 124 deadline or stop file; 125 supervisor failure
or cleanup not confirmed; 126 cannot execute; 127 not found; 128+N stopped by
signal N (130: Ctrl-C); 137 a stop had to SIGKILL COMMAND (or the OOM killer
did). Every option, signal and receipt key: docs/reference.md, beside this
file in the treereap source tree it was copied from.
"""


# timeout(1)'s options that have no honest meaning here: refused, saying why.
_REFUSED = {"--foreground": "--foreground is not supported: the command gets the terminal "
            "whenever the supervisor is in the terminal's foreground, and a stop ends every "
            "process of the run, its children too; drop the option"}
_REFUSED["-f"] = _REFUSED["--foreground"]
_REFUSED["--keep-services"] = ("--keep-services is gone (3.2.0): a stop ends every process of "
                               "the run; --preserve-descendants-on-success keeps all of a run "
                               "whose command exited 0 by itself")


def _help():
    import textwrap
    lines = []
    for flags, _, kind, _, _, text in _OPTIONS:
        if flags:
            metavar, _, what = text.partition(" ") if _takes_value((0, 0, kind)) else ("", "", text)
            lines += ["  " + " ".join([", ".join(flags), metavar]).rstrip(),
                      textwrap.fill(what, 79, initial_indent=" " * 6, subsequent_indent=" " * 6)]
    return _USAGE % {"prog": _PROG, "options": "\n".join(lines)}


def _option(name):
    """The row of _OPTIONS for a flag, or None."""
    return next((row for row in _OPTIONS if name in row[0]), None)


def _takes_value(row):
    return row[2] not in ("flag", "pid", POLICIES)


def _parse_args(argv):
    """(what to show, or None; the values by keyword, each checked, the
    defaults for the rest; the command). Options as timeout(1) takes them:
    --name VALUE, --name=VALUE, -k VALUE, -kVALUE; the command after -- or
    from the first argument that is not an option."""
    values, policy_flag, command, i, argv = {}, None, [], 0, list(argv)
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            command = argv[i + 1:] if arg == "--" else argv[i:]
            break
        if arg in ("-h", "--help", "--version", "-V"):
            return ("help" if arg in ("-h", "--help") else "version"), None, None
        name, has_value, value = _split_option(arg)
        if name in _REFUSED:
            raise UsageError(_REFUSED[name])
        row = _option(name)
        if row is None:
            raise UsageError("unknown option %s (see --help)" % arg)
        flags, keyword, kind, default, _, _ = row
        if keyword in values and kind is not POLICIES:
            raise UsageError("%s: given twice%s; give it once" % (
                name, " (%s are one option)" % ", ".join(flags) if len(flags) > 1 else ""))
        if not _takes_value(row):
            if has_value and name.startswith("--"):
                raise UsageError("%s takes no value" % name)
            if has_value:  # short options bundled as getopt takes them: -vs INT, -vk5
                argv[i:i + 1] = [name, "-" + value]
            if kind is POLICIES:
                if policy_flag is not None and values["policy"] != default:
                    raise UsageError("%s and %s: choose one policy" % (policy_flag, name))
                policy_flag = name
            # --stop-with-parent: the parent now, before a late start could lose it
            values[keyword] = default if kind is POLICIES else os.getppid() if (
                kind == "pid") else True
        else:
            if not has_value:
                i += 1
                if i == len(argv):
                    raise UsageError("%s needs a value" % name)
                value = argv[i]
            values[keyword] = _checked(kind, value, name)
        i += 1
    for _, keyword, kind, default, _, _ in _OPTIONS:
        if keyword not in values:
            values[keyword] = default if default is None else _checked(kind, default, keyword)
    alone = "--end-kept" if values["end_kept"] is not None else "--prepare-cgroup" * bool(
        values["prepare_cgroup"])
    if alone and command:
        raise UsageError("%s runs no command: drop %s" % (alone, command[0]))
    if not alone and (values["timeout"] is None or not command):
        raise UsageError(_what_to_write(argv, command, values["timeout"]))
    return None, values, command


def _what_to_write(argv, command, timeout):
    """The one line for a call with no deadline or no command: what to write
    instead, for the mistakes seen (timeout(1)'s order, --timeout after the
    command, an option that took the command's name as its value)."""
    # test_cli.py::test_a_misplaced_deadline_says_what_to_write
    if not argv:
        return "give a deadline and a command: --timeout DURATION -- COMMAND (see --help)"
    if timeout is not None:
        return "no command given: put it after --"
    if any(arg.partition("=")[0] == "--timeout" for arg in command):
        return ("--timeout after the command is the command's own argument: put it before, "
                "as in --timeout 600 -- COMMAND")
    # [option, value] before a command that no -- began: a path's or a name's value
    taken = argv[-len(command) - 2:-len(command)] if command and "--" not in argv else []
    kind = (_option(taken[0]) or (None,) * 3)[2] if len(taken) == 2 else None
    if kind in ("path", "text") and not taken[1].startswith("-"):
        return ("--timeout is required (seconds, e.g. --timeout 600 -- COMMAND); if %r was the "
                "command, %s took it as its value: put the command after --" % tuple(taken[::-1]))
    if command and _ignoring(UsageError, parse_duration, command[0]) is not None:
        import shlex
        return ("the deadline is an option here, not timeout(1)'s first argument: write "
                "--timeout %s -- %s" % (command[0], " ".join(map(shlex.quote, command[1:])) or
                                        "COMMAND"))
    return "--timeout is required (seconds, e.g. --timeout 600 -- COMMAND)"


def _split_option(arg):
    """--name=VALUE, --name, -kVALUE, -k: (name, has_value, value)."""
    name, has_value, value = arg.partition("=")
    short = not name.startswith("--") and len(arg) > 2  # -kVALUE, -sKILL
    return (arg[:2], True, arg[2:]) if short else (name, bool(has_value), value)


def _path_in(argv, option="--receipt"):
    """The path given to option in argv, found however the rest is
    malformed (a refusal must remove the earlier receipt too, and write the
    summary: see main), and only among the supervisor's own options: the
    command's arguments start where _parse_args starts them, and a
    --receipt there belongs to the command."""
    found, i = None, 0
    while i < len(argv) and argv[i] != "--" and argv[i].startswith("-") and argv[i] != "-":
        name, has_value, value = _split_option(argv[i])
        row = _option(name)
        # test_cli.py::test_a_refusal_after_a_bundle_still_removes_the_earlier_receipt
        if row is not None and not _takes_value(row) and has_value and name[1] != "-":
            argv, i = argv[:i] + ["-" + value] + argv[i + 1:], i - 1  # -vs INT: -s INT
        elif row is not None and _takes_value(row) and not has_value:
            i += 1
            value = argv[i] if i < len(argv) else None
        if name == option:
            found = value
        i += 1
    return found or None


def _print(text):
    # test_cli.py::test_help_with_stdout_closed_still_exits_0
    _ignoring(OSError, os.write, 1, text.encode())


def _relay_into_new_session(parent=None):
    """--new-session: fork. The child leaves the caller's session and
    supervises; the parent stays in the caller's process group as a relay that
    forwards signals and exits with the child's status. When the relay is
    killed (the caller killed its group), the child gets SIGTERM
    (_PR_SET_PDEATHSIG, set by supervise) and stops the run; with
    --stop-with-parent (parent, its pid), the relay dies with that parent.
    Returns the relay's pid, in the child only."""
    relay = os.getpid()
    if parent is not None:
        _set_parent_death_signal(signal.SIGKILL)  # (the relay's alone: a fork clears it)
    pid = _acquire("fork", os.fork)
    if pid == 0:
        os.setsid()
        return relay
    if parent is not None and os.getppid() != parent:
        os.kill(relay, signal.SIGKILL)  # the parent died before we asked
    for sig in _STOP_SIGNALS + _FORWARDED_SIGNALS:
        if sig == signal.SIGTERM or signal.getsignal(sig) != signal.SIG_IGN:
            # The relay's only work: one kill() to its child, still unreaped.
            signal.signal(sig, lambda signum, frame: _quietly_signal(pid, signum))
    # Ctrl-Z cannot suspend a run in another session (its group is orphaned,
    # and the kernel drops SIGTSTP there): ignore it rather than stop alone.
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    # Reap with every signal blocked: no forwarder may run after the pid is free.
    signal.pthread_sigmask(signal.SIG_BLOCK, _VALID_SIGNALS)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status):
        _exit(os.WEXITSTATUS(status))
    _complain("the supervising process died of %s; no receipt: treat cleanup as "
              "unconfirmed" % _signal_name(os.WTERMSIG(status)))
    _exit(EXIT_FAILURE)


def main(argv=None):
    """The command line: parse, check, supervise, write the receipt, then
    speak. Returns the exit status. The supervisor's signal handlers stay in
    place until the process exits: a late stop signal cannot cost the
    receipt."""
    argv = sys.argv[1:] if argv is None else list(argv)
    target = summary_dir = None
    try:
        show, values, command = _parse_args(argv)
        if show is not None:
            _print(_help() if show == "help" else "%s %s%s\n" % (_PROG, __version__, (
                " (treereap.pyz, built from supervisor.py sha256 %s)" % _BUILT_FROM) * bool(
                    _BUILT_FROM)))
            return 0
        _require_linux()
        new_session, kept = values.pop("new_session"), values.pop("end_kept")
        if kept is not None:
            return _end_kept(kept, values["cleanup_timeout"])
        if values.pop("prepare_cgroup"):
            _complain(prepare_cgroup())
            return 0
        plan, target = _checked_plan(command, values)
        summary_dir = plan.summary_dir
        if new_session:
            plan.stop_with_parent, plan.relay = _relay_into_new_session(plan.stop_with_parent), True
        run = _Run(plan)
        receipt = _execute(run)
    except SupervisorError as e:
        return _refuse(str(e), target, argv, summary_dir)
    except Exception as e:  # a bug: still one line, and the sandbox is suspect
        return _refuse("internal error: %s: %s" % (type(e).__name__, e), target, argv, summary_dir)
    # The receipt goes to disk before anything goes to stderr: a full pipe or
    # a terminal with TOSTOP must not hold it back.
    receipt = _deliver(run, receipt, target)
    if receipt["error"]:
        _complain(receipt["error"])
    if not receipt["cleanup_confirmed"] and not run.outcome.failed:
        _complain(_unconfirmed_message(receipt))
    if (receipt["output"] or {}).get("error"):
        _complain("--output: cannot keep the output: %s" % receipt["output"]["error"])
    if receipt["stop_reason"] == "stop_file" and receipt["pid"] is None:
        _complain("the stop file %s is there: the command was not started; remove it to run "
                  "again" % plan.stop_file)
    elif plan.verbose:
        _complain(_outcome(run, receipt))
    return receipt["exit_status"]


def _refuse(message, target, argv, summary_dir):
    """One line on stderr, exit 125, and no receipt at the path: not an
    earlier run's (the path is found in argv even when parsing failed), and
    not a partial one. Under --user, the summary as _directory_of reaches
    it, or none."""
    _closed(target)
    left = _remove_stale_at(_path_in(argv))
    if left and not message.startswith("--receipt"):
        message += "; " + left
    _complain(message)
    summary = _path_in(argv, "--summary")
    if summary and summary_dir is None and _path_in(argv, "--user"):
        try:
            summary_dir = _directory_of(_absolute(summary, "--summary"), "--summary")
        except UsageError as e:
            _complain(str(e))
            return EXIT_FAILURE
    _write_summary(summary, ["refused, exit status 125: %s" % message], summary_dir)
    return EXIT_FAILURE


def _end_kept(path, cleanup_timeout):
    """--end-kept RECEIPT: one line, and 0 when all it kept is gone."""
    if not cleanup_timeout:  # (-k 0: no end to the grace, which a teardown has not)
        raise UsageError("--end-kept: -k 0 gives it no end; give -k seconds (10 by default)")
    try:
        with open(path, "rb") as f:
            import json  # the owner's teardown only: no run pays for its import
            receipt = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError("--end-kept: cannot read the receipt %s: %s" % (
            path, getattr(e, "strerror", None) or e))
    if not isinstance(receipt, dict) or not isinstance(receipt.get("preserved", []), list):
        raise UsageError("--end-kept: %s is not a receipt of this supervisor" % path)
    done, line = end_kept(receipt, cleanup_timeout)
    _complain(line)
    return 0 if done else EXIT_FAILURE


def _exit(status):
    """Exit at once: the interpreter's teardown costs ~5 ms that a controller
    would wait for, and all we print went out through os.write already."""
    for stream in (sys.stdout, sys.stderr):
        # A stream closed, or None (its fd was closed at start): nothing to flush.
        # test_cli.py::test_help_with_stdout_closed_still_exits_0
        _ignoring((AttributeError, OSError, ValueError), lambda: stream.flush())
    os._exit(status)


if __name__ == "__main__":
    _exit(main())
