#!/usr/bin/env python3
"""supervisor.py: run a command tree under a deadline, drain what it leaves, prove it.

    python3 supervisor.py --timeout DURATION [OPTIONS] -- COMMAND [ARG...]
    python3 supervisor.py --end-kept RECEIPT

COMMAND runs in a process group of its own, in a cgroup of its own where one
can be made, below this process as a child subreaper, so that every process
of the run descends from it. A run goes through the states

    starting -> running -> terminating -> killing -> draining -> done

(a natural exit skips killing). It ends when COMMAND exits by itself, the
deadline passes, the stop file appears or a stop signal arrives: then what is
left is stopped (the stop signal, a grace, SIGKILL) and drained. What is
kept: nothing by default; with --preserve-descendants-on-success everything,
after an exit 0 that nothing stopped; with --keep-services the services
detached before a stop. The receipt, a JSON file, says what happened and
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
effects: supervise() is the API, main() the command line.
"""
import errno
import os
import select
import sys
import time

try:
    # The C module behind `signal`: the same calls, without the enum wrappers
    # whose import costs ~3 ms on every run.
    import _signal as signal
except ImportError:  # every CPython 3.6 to 3.13 has it
    import signal

__version__ = "2.0.0"
__all__ = [
    "CLEANUP_PHASE_COUNT", "CONTAINMENTS", "DEFAULT_CLEANUP_TIMEOUT", "EXEC_TIMEOUT_SLACK",
    "EXIT_CANNOT_EXECUTE", "EXIT_FAILURE", "EXIT_KILLED", "EXIT_NOT_FOUND", "EXIT_TIMED_OUT",
    "POLICIES", "RECEIPT_SCHEMA_VERSION", "STATES", "CleanupReceipt", "ObservationError",
    "SupervisorError", "UsageError", "end_kept", "exec_timeout", "main", "parse_duration",
    "supervise", "write_receipt",
]

# --- Constants -----------------------------------------------------------------

# A forced stop has three bounded phases: the grace after the stop signal, the
# command's own process after SIGKILL, and the drain of the whole run.
CLEANUP_PHASE_COUNT = 3
DEFAULT_CLEANUP_TIMEOUT = 10.0
# What exec_timeout() adds for start-up, the last pass and receipt I/O.
EXEC_TIMEOUT_SLACK = 30.0
# What a run may take beyond timeout + CLEANUP_PHASE_COUNT * cleanup_timeout:
# the last SIGKILL pass and the confirming look, once the drain's budget is
# spent; then the look at the services kept.
_FINAL_PASS_LIMIT = 1.0
_FINISH_LIMIT = 0.5
# The same stop signal again within this is the same request.
_STOP_BURST = 0.25
# Passes over our own children that a kill walk makes first (see
# _ProcContainment._stop_own_children).
_STOP_PASSES = 8
# Once the command's zombie hides the others from waitid(), they are reaped
# by the list of our children, a syscall each: at most this often.
_REAP_LIST_INTERVAL = 0.01
# At most this many zombies, and for at most this long, are reaped in one go
# before the caller's deadlines are looked at again.
_REAP_BATCH = 256
_REAP_SLICE = 0.005
# A confirmation tries this many looks before it lets the drain wait; a look
# that found nothing alive but was disturbed is taken again this soon.
_CONFIRM_TRIES = 4
_UNSETTLED_RETRY = 0.002
# A drain round waits this long at most for what it killed before it walks the
# tree again, so a process stuck in D state cannot hide new adoptions.
_DRAIN_ROUND_LIMIT = 0.05
RECEIPT_SCHEMA_VERSION = 3
# The receipt lists at most this many drained processes (drained_count has
# all), and as many survivors (survivors_count); an argv is cut at _ARGV_LIMIT
# bytes, and a receipt that would pass _RECEIPT_LIMIT bytes drops entries from
# its longest lists (counted in `omitted`), so that writing it stays a small
# part of exec_timeout()'s slack whatever the command did.
_DRAINED_LIMIT = 1000
_SURVIVORS_LIMIT = 1000
_ARGV_LIMIT = 4096
_RECEIPT_LIMIT = 1 << 20
# Reading a process's argv takes its memory-map lock, which a process that
# shares its memory with one stuck in D state may never get: the read is
# done by a thread of its own, waited for this long, then abandoned; after
# this many abandoned readers no argv is read any more.
_ARGV_READ_LIMIT = 0.25
_STUCK_READERS = 4
# A census of what is alive, for `survivors` when the run is not confirmed.
_CENSUS_LIMIT = 0.5
# Signals left pending for a finished run that supervise() discards before
# it gives the caller's handlers back.
_DISCARD_LIMIT = 100000
# A signalfd read: struct signalfd_siginfo is 128 bytes; a batch at a time.
_SIGINFO_SIZE, _SIGNAL_BATCH = 128, 64
# In scan mode (no children files) the reaper reuses a scan this old.
_SCAN_REUSE = 0.5

EXIT_TIMED_OUT = 124
EXIT_FAILURE = 125
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
# As timeout(1): a forced stop whose command had to be SIGKILLed.
EXIT_KILLED = 128 + 9

# What a run keeps running when it ends: the drain policies.
POLICIES = ("drain-all", "preserve-descendants-on-success", "keep-services")
# What a containment is asked to keep out of the drain (see _keep_what()).
_KEEP_NOTHING, _KEEP_DETACHED, _KEEP_OUTSIDE_GROUP, _KEEP_EVERYTHING = (
    "nothing", "detached", "outside group", "everything")
# How the run is held: --containment.
CONTAINMENTS = ("auto", "cgroup", "proc")

# The states of a run, in order; the last three are the timed cleanup steps.
STATES = ("starting", "running", "terminating", "killing", "draining", "done")
_CLEANUP_STEPS = ("terminating", "killing", "draining")
# What a look at the run covers: the command's process group (and the command,
# if it left it), or every process of the run that is not a kept service.
_GROUP, _RUN = "group", "run"

# inotify sees the stop file at once; this slow check covers what it cannot
# (a mount over the directory after the watch was set).
_STOP_FILE_SAFETY_INTERVAL = 2.0
# Where inotify cannot see (network and FUSE filesystems, no inotify at all).
_STOP_FILE_POLL_INTERVAL = 0.05
# cgroup.freeze takes effect when every task has stopped in the kernel; a
# task in D state delays it: the look waits this long at most, then goes on.
_FREEZE_LIMIT = 0.5
# A cgroup's maker flocks it right after mkdir; an unlocked one younger than
# this may be a maker's that did not get that far yet (starved): left alone.
_LEFTOVER_MIN_AGE = 60.0
# Waiting for a process the kernel cannot wake us for (no pidfd): 1 ms doubling.
_EXIT_POLL_FIRST, _EXIT_POLL_MAX = 0.001, 0.1
# select() keeps deadlines to the microsecond but only for fds below
# FD_SETSIZE and waits of sane length; poll() takes the rest.
_MAX_POLL_MS = 2 ** 31 - 1
_SELECT_FD_LIMIT = 1024
_MAX_SELECT_SECONDS = 86400.0
# Holding more pidfds than this at once first lifts our soft fd limit and
# counts what it leaves, less a reserve for reading /proc and our own pipes.
_PIN_FD_HEADROOM = 64
# The stop signal to a cgroup's members: this many pidfds at a time.
_MEMBER_BATCH = 32
_FD_RESERVE = 16

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

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
_STOP_SIGNALS = tuple([signal.SIGTERM, signal.SIGINT, signal.SIGHUP] + [
    sig for sig in _VALID_SIGNALS
    if sig not in _NOT_STOPPING and sig not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
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

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PROC_SUPER_MAGIC = 0x9FA0
_CGROUP2_SUPER_MAGIC = 0x63677270
_CAP_SETGID, _CAP_SETUID, _CAP_SYS_PTRACE, _CAP_SYS_NICE = 6, 7, 19, 23
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
# The generic syscall table numbers them alike on every architecture but alpha.
_SYS_PIDFD_SEND_SIGNAL = 424
_SYS_PIDFD_OPEN = 434
_SYS_OPENAT2 = 437
# openat2() RESOLVE_NO_XDEV: the path may cross no mount point, so a mount the
# command made inside /proc (or inside the run's cgroup) is refused, not read.
_RESOLVE_NO_XDEV = 0x01

# Filesystems whose remote changes inotify never reports (statfs f_type).
_INOTIFY_BLIND_FILESYSTEMS = frozenset((
    0x6969,      # NFS
    0x517B,      # SMB
    0xFF534D42,  # CIFS
    0xFE534D42,  # SMB2
    0x65735546,  # FUSE (sshfs, virtiofs, ...)
    0x01021997,  # 9P
    0x00C36400,  # Ceph
    0x5346414F,  # AFS
    0x73757245,  # Coda
    0x01161970,  # GFS2
    0x7461636F,  # OCFS2
))
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_ONLYDIR = 0x400, 0x800, 0x01000000
_IN_Q_OVERFLOW, _IN_IGNORED = 0x4000, 0x8000
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


# --- Errors and the receipt type --------------------------------------------------

class SupervisorError(Exception):
    """The supervisor cannot do its job here; the CLI exits 125."""


class UsageError(SupervisorError):
    """A bad option or path: nothing was started."""


class ObservationError(SupervisorError):
    """/proc could not be read (EMFILE, ENFILE, ENOMEM, EACCES...): a failed
    look is never an empty one, so the cleanup cannot be confirmed."""


def _define_receipt_type():
    """The receipt as a TypedDict, built on first use: typing costs ms to import."""
    from typing import List, Optional, TypedDict  # noqa: F401 (3.8+)
    fields = {
        "cleanup_confirmed": bool, "error": Optional[str],
        "return_code": Optional[int], "timed_out": bool,
        "schema_version": int, "supervisor_version": str, "python_version": str,
        "command": List[str], "workdir": str, "pid": Optional[int],
        "supervisor_pid": int, "started_at": str, "ended_at": str,
        "duration_s": float, "timeout_s": float, "cleanup_timeout_s": float,
        "stop_reason": str, "signal": Optional[str], "exit_status": int,
        "policy": str, "stop_signal": Optional[str],
        "cleanup_s": float, "ladder": list, "containment": str, "cgroup": Optional[str],
        "kept_cgroup": Optional[str], "cgroup_unavailable": Optional[str],
        "user": Optional[dict], "preserved": list, "survivors": list,
        "survivors_count": Optional[int], "unattributed": list, "drained": list,
        "drained_count": int, "omitted": dict, "usage": Optional[dict],
    }
    return TypedDict("CleanupReceipt", fields)


def __getattr__(name):
    # PEP 562 (3.7+): CleanupReceipt is built when first asked for.
    if name == "CleanupReceipt":
        try:
            receipt_type = _define_receipt_type()
        except ImportError:  # no TypedDict before 3.8: a receipt is a dict
            receipt_type = dict
        globals()[name] = receipt_type
        return receipt_type
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


if sys.version_info < (3, 7):  # no module __getattr__ on 3.6
    CleanupReceipt = dict


# --- Linux primitives ---------------------------------------------------------------

class _Libc(object):
    """libc through ctypes, loaded on first use (ctypes costs ms to import)."""

    def __init__(self):
        import ctypes
        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def call(self, name, *args):
        result = getattr(self.lib, name)(*args)
        if result == -1:
            code = self.ctypes.get_errno()
            raise OSError(code, "%s: %s" % (name, os.strerror(code)))
        return result


_LIBC = []
# What messages start with: the installed command's name, or this file's.
_PROG = "treereap" if __name__ == "treereap" else os.path.basename(__file__)


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
    previous = libc.ctypes.c_int(0)
    libc.call("prctl", _PR_GET_CHILD_SUBREAPER, libc.ctypes.byref(previous), 0, 0, 0)
    libc.call("prctl", _PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)
    now = libc.ctypes.c_int(0)
    libc.call("prctl", _PR_GET_CHILD_SUBREAPER, libc.ctypes.byref(now), 0, 0, 0)
    if bool(now.value) != bool(enabled):
        raise OSError(errno.EINVAL, "prctl: the subreaper bit did not stick")
    return bool(previous.value)


def _set_parent_death_signal(sig):
    _libc().call("prctl", _PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _pidfd_open(pid):
    """A pidfd pinning pid, or None where the kernel has none (before 5.3).

    Raises ProcessLookupError when pid no longer exists."""
    try:
        if hasattr(os, "pidfd_open"):
            return _high_fd(os.pidfd_open(pid))
        return _high_fd(_libc().call("syscall", _SYS_PIDFD_OPEN, pid, 0))
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM):  # old kernel, or seccomp
            return None
        if e.errno == errno.ESRCH:
            raise ProcessLookupError(e.errno, "pidfd_open: no such process")
        raise


def _pidfd_send_signal(fd, sig):
    if hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal(fd, sig)
    else:
        _libc().call("syscall", _SYS_PIDFD_SEND_SIGNAL, fd, sig, None, 0)


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


def _give_memory_back():
    """malloc_trim(0): compiling this file leaves the allocator ~5 MiB of
    garbage it keeps; glibc gives it back to the system. Nothing elsewhere.
    Run as a script, CPython keeps the script's parse tree alive for as long
    as the script runs (~9 MiB, not garbage): `python3 -m supervisor` and the
    installed command import the module instead (cached bytecode, no tree)."""
    try:
        _libc().lib.malloc_trim(0)
    except (AttributeError, OSError):
        pass  # not glibc (musl has no malloc_trim)


def _quietly_signal(pid, sig, group=False):
    """kill or killpg, for a pid or group id we hold: an unreaped child of
    ours, or the group its leader keeps reserved. Gone, or members we may not
    signal (setuid), is not an error here: /proc decides what is left."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
    if max(every) < _SELECT_FD_LIMIT and seconds < _MAX_SELECT_SECONDS:
        readable, _, changed = select.select(fds, (), priority_fds, seconds)
        return readable + changed
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    for fd in priority_fds:
        poller.register(fd, select.POLLPRI)
    timeout = 0 if seconds == 0 else min(_MAX_POLL_MS, int(seconds * 1000) + 1)
    return [fd for fd, _ in poller.poll(timeout)]


def _exited_pidfds(fds):
    """Those of fds (pidfds) whose process has exited, by one poll() for all:
    after a stop signal most have, and one select() each would cost ms."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return set(fd for fd, _ in poller.poll(0))


def _discard_pending(fd):
    """Read a non-blocking fd until it is empty (wake-up bytes, inotify events)."""
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


def _filesystem_type(path_or_fd):
    """statfs(2) f_type of the filesystem holding a path, or an open fd."""
    libc = _libc()
    buf = libc.ctypes.create_string_buffer(256)  # struct statfs; f_type first
    if isinstance(path_or_fd, int):
        libc.call("fstatfs", path_or_fd, buf)
    else:
        libc.call("statfs", os.fsencode(path_or_fd), buf)
    return int.from_bytes(buf.raw[:libc.ctypes.sizeof(libc.ctypes.c_long)], sys.byteorder)


def _has_capability(bit, fs=None):
    """Is capability `bit` in our effective set (CapEff in /proc/self/status,
    read through fs, our /proc descriptor, once there is one)? No when it
    cannot be read."""
    try:
        if fs is not None:
            status = fs.read("self/status") or b""
        else:
            with open("/proc/self/status", "rb") as f:
                status = f.read()
    except (OSError, ObservationError):
        return False
    for line in status.splitlines():
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
    if waitid_result.si_code == os.CLD_EXITED:
        return waitid_result.si_status
    return -waitid_result.si_status


def _now():
    return time.monotonic()


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


# --- /proc ------------------------------------------------------------------------------

class _Proc(object):
    """A process as one read of /proc/PID/stat showed it."""
    __slots__ = ("pid", "state", "ppid", "pgid", "sid", "threads", "start")

    def __init__(self, pid, fields):
        self.pid = pid
        self.state = fields[0].decode()
        self.ppid, self.pgid, self.sid = int(fields[1]), int(fields[2]), int(fields[3])
        self.threads, self.start = int(fields[17]), int(fields[19])

    @property
    def live(self):
        # A zombie leader whose other threads still run is alive.
        return self.state not in "ZX" or self.threads > 1

    @property
    def identity(self):
        """pid and start time (clock ticks since boot): one process, never a reused pid."""
        return (self.pid, self.start)


class _Argv(object):
    """A process's argv as the receipt shows it: a list of str, cut at
    _ARGV_LIMIT bytes (truncated), or None when it was not read: reading it
    takes the process's memory-map lock, which a process in state D (a hung
    NFS or FUSE mount) may hold for good."""
    __slots__ = ("words", "truncated")

    def __init__(self, words, truncated=False):
        self.words, self.truncated = words, truncated


_UNREAD = _Argv(None)


class _ProcFS(object):
    """/proc, opened once and read relative to that descriptor, so that a
    mount over /proc during the run changes nothing, and never through a
    mount made inside it (openat2 RESOLVE_NO_XDEV, or else a device check):
    a root command that bind-mounts a file over /proc/PID/stat makes the
    look fail, never lie. Only ENOENT and ESRCH mean a process is gone; any
    other error raises ObservationError."""

    def __init__(self):
        self.side_reads = None      # _AbandonableReads, once an argv is read
        try:
            self.fd = _high_fd(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as e:
            raise SupervisorError("/proc: %s; mount it (mount -t proc proc /proc)" % e.strerror)
        try:
            self.device = os.fstat(self.fd).st_dev
            self._check_procfs()
            self.openat2 = self._has_openat2()
            self._check_namespace()
            self._check_visibility()
            # CONFIG_PROC_CHILDREN: where the kernel lists each thread's children,
            # a look walks the run's tree; elsewhere it reads every process.
            me = os.getpid()
            self.has_children_files = self.read("%d/task/%d/children" % (me, me)) is not None
        except BaseException:
            self.close()
            raise

    def _check_procfs(self):
        try:
            kind = _filesystem_type(self.fd)
        except OSError as e:
            raise SupervisorError("/proc: fstatfs: %s" % e.strerror)
        if kind != _PROC_SUPER_MAGIC:
            raise SupervisorError("/proc is not procfs (filesystem type 0x%x); mount it "
                                  "(mount -t proc proc /proc)" % kind)

    def _has_openat2(self):
        """openat2() exists here (Linux 5.6+, and no seccomp filter refuses it)."""
        try:
            os.close(_openat2(self.fd, "self/stat", os.O_RDONLY | os.O_CLOEXEC, _RESOLVE_NO_XDEV))
            return True
        except OSError:
            return False

    def _check_visibility(self):
        """hidepid hides other users' processes from a supervisor that may not
        ptrace them: it would never see them to drain them. (subset=pid hides
        no process.)"""
        options = self._mount_options()
        hidden = options.get("hidepid", "0")
        if hidden in ("0", "off") or _has_capability(_CAP_SYS_PTRACE, self):
            return
        group = options.get("gid")
        if hidden in ("1", "2", "noaccess", "invisible") and group is not None and (
                int(group) == os.getegid() or int(group) in os.getgroups()):
            return
        raise SupervisorError(
            "/proc is mounted with hidepid=%s, which hides other users' processes from "
            "this supervisor; mount it without hidepid, or run the supervisor as root"
            % hidden)

    def mountinfo(self):
        """[(fields before ' - ', fields after)] of our mount namespace."""
        table = []
        for line in (self.read("self/mountinfo") or b"").decode("utf-8", "replace").splitlines():
            before, _, after = line.partition(" - ")
            table.append((before.split(), after.split()))
        return table

    def _mount_options(self):
        """The super options of the mount our /proc descriptor is on."""
        device = "%d:%d" % (os.major(self.device), os.minor(self.device))
        options = {}
        for before, after in self.mountinfo():
            if len(before) > 2 and before[2] == device and after:
                for option in after[-1].split(","):
                    name, _, value = option.partition("=")
                    options[name] = value
        return options

    def _check_namespace(self):
        try:
            proc_self = os.readlink("self", dir_fd=self.fd)
        except OSError as e:
            raise SupervisorError("/proc/self: %s; mount /proc (mount -t proc proc /proc)"
                                  % e.strerror)
        if proc_self != str(os.getpid()):
            raise SupervisorError("/proc belongs to another PID namespace; mount this one's "
                                  "(unshare --mount-proc, or mount -t proc proc /proc)")

    def open(self, path, flags=os.O_RDONLY, at=None):
        """A descriptor on /proc/path, opened without crossing a mount (below
        `at`, a copy of our /proc descriptor, where given)."""
        return _open_beneath(self.fd if at is None else at, self.device, self.openat2, path,
                             flags, "/proc")

    def read(self, path, one_record=False, first_page=False, endtime=None, limit=None,
             at=None):
        """The bytes of /proc/path, or None when what it describes is gone.
        Read to EOF: a seq_file answers a read with at most a page of whole
        records, so a short read is not the end (a list of 700 children is
        two pages). one_record: a file whose short read is its end (stat,
        one record; cmdline, no seq_file), read once unless it fills 4 KiB.
        first_page: only what one read gives (a seq_file's first records).
        endtime: no page more once it has passed (the caller is out of time).
        limit: no more than that many bytes. at: see open()."""
        try:
            fd = self.open(path, at=at)
        except OSError as e:
            return self._gone_or_raise(e, path)
        try:
            chunks = [os.read(fd, 4096)]
            total = len(chunks[0])
            while (not first_page and chunks[-1]
                   and (not one_record or len(chunks[-1]) == 4096)
                   and (endtime is None or _now() < endtime)
                   and (limit is None or total < limit)):
                chunks.append(os.read(fd, 65536))
                total += len(chunks[-1])
            return b"".join(chunks)
        except OSError as e:
            return self._gone_or_raise(e, path)
        finally:
            os.close(fd)

    @staticmethod
    def _gone_or_raise(e, path):
        if e.errno in (errno.ENOENT, errno.ESRCH):
            return None
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
        end = data.rfind(b")")
        if end < 0:
            raise ObservationError("cannot parse /proc/%d/stat" % pid)
        return _Proc(pid, data[end + 2:].split(None, 21))

    def children(self, pid, threads=1):
        """Pids of pid's children, from the lists of all its threads."""
        tids = [pid] if threads == 1 else self.threads_of(pid)
        found = []
        for tid in tids:
            data = self.read("%d/task/%d/children" % (pid, tid))
            if data:
                found.extend(int(word) for word in data.split())
        return found

    def listing(self, path):
        """The names in the directory /proc/path, or None when it is gone."""
        try:
            fd = self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            return self._gone_or_raise(e, path)
        try:
            return os.listdir(fd)
        except OSError as e:
            return self._gone_or_raise(e, path)
        finally:
            os.close(fd)

    def threads_of(self, pid):
        return [int(tid) for tid in self.listing("%d/task" % pid) or ()]

    def scan(self, endtime=None):
        """Every process in this PID namespace: {pid: _Proc}, ~9 us a process;
        and whether the scan was whole (it stops at endtime)."""
        procs = {}
        for name in self.listing(".") or ():
            if endtime is not None and _now() >= endtime:
                return procs, False
            if name.isdigit():
                proc = self.stat(int(name))
                if proc is not None:
                    procs[proc.pid] = proc
        return procs, True

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
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith("0::"):
                return line[3:]
        return ""

    def open_fd_count(self):
        names = self.listing("self/fd")
        if names is None:
            raise ObservationError("cannot list /proc/self/fd")
        return len(names)

    def argv(self, proc):
        """proc's argv (see _Argv); its name in brackets when it has none (a
        zombie), as ps shows it; [] when it is gone or unreadable: a name is
        for people, never evidence. Never blocks for more than
        _ARGV_READ_LIMIT (see _AbandonableReads): unread, it is _UNREAD."""
        try:
            if self._may_hang(proc):
                return _UNREAD
            if self.side_reads is None:
                self.side_reads = _AbandonableReads(self.fd)
            data = self.side_reads.run(lambda at: self.read(
                "%d/cmdline" % proc.pid, one_record=True, limit=_ARGV_LIMIT + 1, at=at))
            if data is _ABANDONED:
                return _UNREAD
            if data:
                truncated = len(data) > _ARGV_LIMIT
                words = data[:_ARGV_LIMIT].rstrip(b"\0").split(b"\0")
                return _Argv([w.decode("utf-8", "replace") for w in words], truncated)
            name = (self.read("%d/comm" % proc.pid) or b"").strip()
        except ObservationError:
            return _Argv([])
        return _Argv(["[%s]" % name.decode("utf-8", "replace")] if name else [])

    def _may_hang(self, proc):
        """Could reading proc's cmdline block? When one of its threads is in D
        state it may hold (or wait for) the lock that read takes: then it is
        not even tried. (A process sharing its memory with another, clone
        CLONE_VM, can block it too unseen: hence _AbandonableReads.)"""
        if proc.state == "D":
            return True
        if proc.threads == 1:
            return False
        for tid in self.threads_of(proc.pid):
            data = self.read("%d/task/%d/stat" % (proc.pid, tid), one_record=True) or b""
            if data[data.rfind(b")") + 2:][:1] == b"D":
                return True
        return False

    def close(self):
        if self.side_reads is not None:
            self.side_reads.close()
            self.side_reads = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_ABANDONED = object()


class _AbandonableReads(object):
    """Reads that may block in the kernel for good, done by a thread of their
    own while the caller waits at most _ARGV_READ_LIMIT. A read that takes
    longer is abandoned: its thread stays blocked (a killable wait: our exit
    ends it) and exits if it ever wakes; the next read gets a new thread.
    Once _STUCK_READERS threads were abandoned in this process (or could not
    be started: pids.max, a fork bomb), nothing more is read. One handoff
    costs ~13 us; a thread is made only when an argv is first read (a
    cleanup that ends something)."""

    abandoned = 0  # in this process, all runs together: each such thread may live on

    def __init__(self, proc_fd):
        self.proc_fd, self.reader = proc_fd, None

    def run(self, job):
        """job(fd), fd a /proc descriptor of the reader thread's own, run in
        that thread: its result (or its exception, raised here), or
        _ABANDONED."""
        if _AbandonableReads.abandoned >= _STUCK_READERS:
            return _ABANDONED
        if self.reader is None:
            self.reader = _ReaderThread.start(self.proc_fd)
        outcome = _ABANDONED if self.reader is None else self.reader.ask(job, _ARGV_READ_LIMIT)
        if outcome is _ABANDONED:
            self.close()
            _AbandonableReads.abandoned += 1
            return _ABANDONED
        value, error = outcome
        if error is not None:
            raise error
        return value

    def close(self):
        if self.reader is not None:
            self.reader.close()
            self.reader = None


class _ReaderThread(object):
    """One thread that runs a job when asked, and exits when closed (at once
    if idle; else once its job returns). It reads /proc through a descriptor
    of its own, closed as it exits: an abandoned one that wakes late cannot
    use a number reused since. Its signals stay blocked, as the thread that
    made it had them: every signal is ours to read from the signalfd. Only
    _thread: the threading module costs ms to import."""

    @classmethod
    def start(cls, proc_fd):
        """A running reader, or None when none could be started (no thread
        left, no descriptor, or it did not get going within the limit)."""
        import _thread
        reader = cls()
        try:
            reader.fd = _high_fd(os.dup(proc_fd))
        except OSError:
            return None
        try:
            _thread.start_new_thread(reader._serve, ())
        except RuntimeError:  # can't start new thread
            os.close(reader.fd)
            return None
        if not reader.answered.acquire(True, _ARGV_READ_LIMIT):  # its hello
            reader.close()
            return None
        return reader

    def __init__(self):
        import _thread
        self.asked, self.answered = _thread.allocate_lock(), _thread.allocate_lock()
        self.asked.acquire()
        self.answered.acquire()
        self.job = self.outcome = None
        self.closed = False
        self.fd = None

    def _serve(self):
        try:
            self.answered.release()  # hello: running
            while True:
                self.asked.acquire()
                job = self.job
                if self.closed or job is None:
                    return
                try:
                    outcome = (job(self.fd), None)
                except Exception as e:
                    outcome = (None, e)
                if self.closed:
                    return  # abandoned while it read: nobody waits for it any more
                self.outcome = outcome
                self.answered.release()
        finally:
            os.close(self.fd)

    def ask(self, job, seconds):
        self.job = job
        self.asked.release()
        if not self.answered.acquire(True, seconds):
            return _ABANDONED
        outcome, self.outcome, self.job = self.outcome, None, None
        return outcome

    def close(self):
        """Exit: now if idle, or as soon as the job it is blocked in returns."""
        self.closed, self.job = True, None
        try:
            self.asked.release()
        except RuntimeError:
            pass  # released already: it will see `closed` when it wakes


def _open_beneath(dir_fd, device, openat2, path, flags, shown):
    """Open path below dir_fd without crossing a mount: openat2 with
    RESOLVE_NO_XDEV (EXDEV otherwise), or, without openat2, open it and
    refuse a file on another device (a bind mount from elsewhere; one of the
    same filesystem, which this cannot see, needs openat2)."""
    flags |= os.O_CLOEXEC
    if openat2:
        return _openat2(dir_fd, path, flags, _RESOLVE_NO_XDEV)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if st.st_dev != device:
        os.close(fd)
        raise OSError(errno.EXDEV, "%s/%s is on another filesystem" % (shown, path), path)
    return fd
# --- Beside the containment: our children, the caller's jobs, descriptors, the record ---

class _Children(object):
    """Our own children, as the kernel lists them: the children files of our
    threads, or, where the kernel has none, one scan of every process. The
    reaper's lists in scan mode reuse a scan up to _SCAN_REUSE old, so that
    reaping never rescans /proc each time (5,000 processes cost ~45 ms)."""

    def __init__(self, fs, scan):
        self.fs, self.scan, self.me = fs, scan, os.getpid()
        self.scanned, self.scanned_at = [], None

    def all(self, endtime=None):
        """Our children; past `endtime` perhaps only some (see _ProcFS.read)."""
        if self.scan:
            return self.note_scan(self.fs.scan(endtime)[0])
        found = []
        for tid in self.fs.threads_of(self.me):
            data = self.fs.read("%d/task/%d/children" % (self.me, tid), endtime=endtime)
            if data is None:
                raise ObservationError("cannot read our own children in /proc")
            found.extend(int(word) for word in data.split())
        return found

    def oldest(self):
        """The first page of our list of children (~600), one read however
        long the list is. Adoption appends to it, so the processes adopted
        first, and dead first, are there. A whole list costs a pass over it
        each page, and under a fork storm every entry waits for the task-list
        lock: 30,000 zombies took 3 s to list (one page: milliseconds)."""
        if self.scan:
            if self.scanned_at is not None and _now() - self.scanned_at < _SCAN_REUSE:
                return self.scanned
            return self.all()
        data = self.fs.read("%d/task/%d/children" % (self.me, self.me), first_page=True)
        if data is None:
            raise ObservationError("cannot read our own children in /proc")
        return [int(word) for word in data.split()]

    def note_scan(self, procs):
        """A scan someone made (a look at the run): our children in it, kept."""
        self.scanned = [p.pid for p in procs.values() if p.ppid == self.me]
        self.scanned_at = _now()
        return self.scanned

    def live(self, endtime=None, reaper=None):
        """Our live children now: each still our child (the reaper may have
        run since the list was read, and a pid it freed can be another
        process's by now)."""
        found = []
        for pid in self.all(endtime):
            if endtime is not None and _now() >= endtime:
                break
            if reaper is not None:
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
        index = None
        if children.scan:  # one scan for the whole tree
            index = {}
            for proc in fs.scan()[0].values():
                index.setdefault(proc.ppid, []).append(proc.pid)
        while todo:
            proc = todo.pop()
            self.processes.add(proc.identity)
            kids = index.get(proc.pid, []) if index is not None else fs.children(
                proc.pid, proc.threads)
            todo.extend(p for p in (fs.stat(pid) for pid in kids) if p is not None)

    def claims(self, proc, in_group):
        """For our own children: the caller's (known at start), or adopted
        since in one of the caller's jobs' groups, which a process of the run
        can join too (or a reused group id can match): then it is
        unattributed, left alone, and it keeps the run from being confirmed."""
        if proc.identity in self.processes or proc.pid in self.children:
            return True
        if proc.pgid in self.groups and not in_group:
            self.unattributed[proc.identity] = proc
            return True
        return False

    def spared(self):
        return set(pid for pid, _ in self.processes) | self.children


class _Reaper(object):
    """The one rule of reaping: an exited child of ours, but never the command
    before done (its zombie keeps its group id from being reused while the
    group is signalled), nor a child the caller had before the run (the
    caller waits for it). Runs whenever SIGCHLD wakes a wait, in every state,
    so zombies never pile up, and during a long look (reap_when_due)."""

    def __init__(self, children, callers):
        self.children, self.callers = children, callers
        self.command = None         # the command's pid, while it must stay unreaped
        self.held = set()           # children a walk signals by pid (no pidfd): not yet
        self.next_list_reap, self.pending, self.next_due = 0.0, False, 0.0

    def reap(self, pid):
        """Reap pid if the rule allows and it has exited. Did it?"""
        if pid == self.command or pid in self.callers.children or pid in self.held:
            return False
        try:
            return os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return False

    def reap_when_due(self):
        """A look at a storm takes seconds, and the zombies it makes meanwhile
        would lengthen every list we read: reap every _REAP_LIST_INTERVAL."""
        now = _now()
        if now >= self.next_due:
            self.next_due = now + _REAP_LIST_INTERVAL
            self.reap_exited()

    def reap_exited(self):
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
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if self.reap(info.si_pid):
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
            reaped = [pid for pid in oldest if self.reap(pid)]
            if not reaped and len(oldest) > _REAP_BATCH:  # a page of live ones: look past it
                reaped = [pid for pid in self.children.all(_now() + _REAP_SLICE)[len(oldest):]
                          if self.reap(pid)]
            self.next_list_reap, self.pending = now + _REAP_LIST_INTERVAL, bool(reaped)
            return
        self.pending, self.next_list_reap = True, _now()  # more to reap: right after a look


class _FdBudget(object):
    """Descriptors for pidfds: holding more than _PIN_FD_HEADROOM at once first
    lifts our soft RLIMIT_NOFILE to the hard one (the command started with
    the caller's limit; close() puts ours back), and counts what it leaves,
    less a reserve for reading /proc and our own pipes."""

    def __init__(self, fs):
        self.fs = fs
        self.pidfds = True          # until the kernel says otherwise
        self.saved_limit = None

    def allowed(self, wanted):
        if wanted <= _PIN_FD_HEADROOM:
            return wanted
        import resource
        self.make_room()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return max(0, soft - self.fs.open_fd_count() - _FD_RESERVE)

    def make_room(self):
        if self.saved_limit is not None:
            return
        import resource
        self.saved_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard = self.saved_limit[1]
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # a hard limit above what the kernel allows: keep ours

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
    """What the cleanup ended, for the receipt's `drained`: from the cleanup
    on, every live process a look finds in its scope (with its argv, read
    then, while it has one), and those seen to exit."""

    def __init__(self, fs):
        self.fs = fs
        self.on = False
        self.ended = {}             # identity -> _Argv (None past _DRAINED_LIMIT)
        self.gone = set()           # identities whose pin showed them exit

    def saw(self, proc):
        if self.on and proc.identity not in self.ended:
            self.ended[proc.identity] = (self.fs.argv(proc) if len(self.ended) < _DRAINED_LIMIT
                                         else None)

    def exited(self, proc):
        self.gone.add(proc.identity)

    def drained(self, survivors):
        """Those recorded that were seen to exit, or are gone now (one that
        left the scope, below a kept service, lives on and is not listed)."""
        left = set(p.identity for p in survivors)
        return [(identity, argv) for identity, argv in self.ended.items()
                if identity not in left and (identity in self.gone or not self._alive(identity))]

    def _alive(self, identity):
        """Alive, or not known to be gone: a look that fails claims nothing."""
        try:
            proc = self.fs.stat(identity[0])
        except ObservationError:
            return True
        return proc is not None and proc.live and proc.start == identity[1]


# --- Waiting for processes to go ------------------------------------------------------------

class _Pin(object):
    """A process held for signalling or waiting: by its pidfd where the kernel
    has them. The only pins without one that may be signalled are our own
    unreaped children, whose pid stays theirs until we reap them."""
    __slots__ = ("proc", "fd")

    def __init__(self, proc, fd):
        self.proc, self.fd = proc, fd

    def exited(self, fs):
        if self.fd is not None:
            return _readable(self.fd)
        now = fs.stat(self.proc.pid)
        return now is None or now.start != self.proc.start or not now.live

    def send(self, sig):
        if self.fd is None:
            _quietly_signal(self.proc.pid, sig)
            return
        try:
            _pidfd_send_signal(self.fd, sig)
        except (ProcessLookupError, PermissionError):
            pass  # exited since the proof, or setuid: /proc decides what is left

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _close_pins(pins):
    for pin in pins:
        pin.close()


class _PinWaiter(object):
    """Waits for pinned processes to exit, one at a time after one poll() for
    all: a pidfd wakes the wait, a pin without one is polled (1 ms
    doubling). What exits is noted in the record."""

    def __init__(self, fs, record, pins, owned=True):
        self.fs, self.record, self.owned = fs, record, owned
        exited = _exited_pidfds([p.fd for p in pins if p.fd is not None]) if pins else set()
        self.pins = []
        for pin in pins:
            if pin.fd in exited:
                record.exited(pin.proc)
            else:
                self.pins.append(pin)
        self.all_pins = pins
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
        if self.owned:
            _close_pins(self.all_pins)


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


class _BothWaiter(object):
    """Done when both are: the run's cgroup empty and escapees gone."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def done(self):
        return self.first.done() and self.second.done()

    def wake(self):
        return (self.first if not self.first.done() else self.second).wake()

    def close(self):
        self.first.close()
        self.second.close()


class _Round(object):
    """One round of the drain: what it found alive (None: unknown), whether
    its look was undisturbed, and what to wait on before the next."""

    def __init__(self, walk, waiter):
        self.walk, self.waiter = walk, waiter

    @property
    def clear(self):
        """It found nothing alive, and nothing changed under it."""
        return not self.walk.found and self.walk.stable

    def close(self):
        self.waiter.close()


# --- Containment, by walking /proc -----------------------------------------------------------

class _Walk(object):
    """The result of one look at the run: the live processes in scope
    (parents first), pins on them when asked for, every process it saw
    outside kept subtrees, and whether nothing it read changed under it."""
    __slots__ = ("found", "pins", "seen", "stable", "whole", "wait_budget")

    def __init__(self):
        self.found, self.pins, self.seen, self.stable = [], [], set(), True
        self.whole = True           # not cut short by its endtime
        self.wait_budget = _PIN_FD_HEADROOM


class _LiveLook(object):
    """How a look enumerates where the kernel lists each thread's children
    (CONFIG_PROC_CHILDREN): every list is read from /proc as the walk
    reaches it, and a process whose list was read must still be alive
    after the read (_still_there)."""
    snapshot = False

    def __init__(self, fs, children):
        self.fs, self.children = fs, children

    def own(self, endtime):
        return self.children.all(endtime)

    def children_of(self, proc):
        return self.fs.children(proc.pid, proc.threads)

    def stat(self, pid):
        return self.fs.stat(pid)


class _ScanLook(object):
    """How a look enumerates without children files: one scan of every
    process, taken as the tree. A process whose parent is missing from the
    scan saw that parent die mid-scan, and was re-parented since: read
    again, it hangs below its new parent, the dead one's nearest subreaper
    ancestor (us, or one of ours, if the dead one was ours; else not ours).
    Only where that cannot be read is the look unstable: on a busy host,
    processes die mid-scan all the time, and nearly none of them are ours."""
    snapshot = True

    def __init__(self, fs, children, walk, endtime):
        self.procs, whole = fs.scan(endtime)
        walk.stable, walk.whole = walk.stable and whole, walk.whole and whole
        children.note_scan(self.procs)
        self.index, self.me = {}, children.me
        for proc in sorted(self.procs.values(), key=lambda p: p.pid):
            if proc.ppid not in self.procs and proc.ppid not in (0, self.me):
                proc = self._reparented(fs, proc)
                if proc is None:
                    walk.stable = False
                    continue
                self.procs[proc.pid] = proc
            self.index.setdefault(proc.ppid, []).append(proc.pid)

    def _reparented(self, fs, proc):
        """proc read again, if it is the same process and its parent now is
        one the scan saw; else None."""
        now = fs.stat(proc.pid)
        if (now is None or now.start != proc.start
                or (now.ppid not in self.procs and now.ppid != self.me)):
            return None
        return now

    def own(self, endtime):
        return self.index.get(self.me, [])

    def children_of(self, proc):
        return self.index.get(proc.pid, [])

    def stat(self, pid):
        return self.procs.get(pid)


class _ProcContainment(object):
    """The run, found by walking /proc from this process down.

    One of the two implementations of the containment (the other is
    _CgroupContainment). Its verbs, as the phases use them:

        join_in_child()     in the forked child, before exec
        started(pid)        the command's pid, which is also its group id
        freeze()            stop what a look must see still (a waiter or None)
        keep(what, endtime) take the processes the policy keeps out of the
                            drain; the kept roots
        members(endtime)    the live processes the cleanup will end (recorded)
        signal(sig)         send sig to them
        thaw()              let them run again, to act on the stop signal
        waiter(procs)       what to wait on for them to exit (the grace)
        kill(endtime)       SIGKILL at once what can be
        kill_round(endtime) freeze and SIGKILL everything, one round of the drain
        confirm(endtime, r) the observation behind cleanup_confirmed
        strays(endtime)     children a dying kept service handed us since
        preserved(endtime)  the kept processes alive now: the receipt's preserved
        last_look(endtime, preserved)  any other live child of ours: a survivor
        census(endtime)     what of the run is alive, when it was not confirmed
        fields(), usage()   for the receipt
        close()

    Why a look finds every process of the run: each one descends from this
    process, a child subreaper (an orphan is re-parented to its nearest
    subreaper ancestor, which is us or a subreaper below us). A thread's
    /proc/PID/task/TID/children lists its children exactly, unless a child
    is removed from that list (reaped) while the list is read. A walk reads
    our own list at once (the reaper may run between visits, never during a
    read, and a zombie it reaps has no children) and the list of each process
    it visits; a process can only leave a list unread by re-parenting, when
    its parent dies. The walk checks that each process whose list it read was
    still alive after the read, and confirmation takes two walks in a row
    that saw the same processes: a process that died before the walk looked
    at it handed its children to a list read earlier, and the second walk
    finds them there. When cleanup is confirmed the run's processes are
    frozen or dead, so their lists do not change; the lists of kept
    services, which run on, are read for group members below them only.
    Where the kernel has no children files, one scan of every process gives
    the same tree (_ScanLook).

    Only what is provably ours is signalled: the command's process group
    while its leader is held unreaped, our own unreaped children, and
    processes pinned by a pidfd after /proc showed that their parent, alive
    and proven, is their parent still.
    """

    def __init__(self, fs, children, callers, reaper, budget, record):
        self.fs, self.children, self.callers = fs, children, callers
        self.reaper, self.budget, self.record = reaper, budget, record
        self.kind = "scan" if children.scan else "children"
        self.me = children.me
        self.pid = self.pgid = None
        self.kept = set()           # identities of the kept roots
        self.scope = _RUN           # what the drain covers: _GROUP, _RUN, or None
        self.keeping = _KEEP_NOTHING

    # The seam.

    def join_in_child(self):
        """The process group made in the child is all the /proc walk needs."""

    def started(self, pid):
        self.pid = self.pgid = pid

    def join_before_stop(self, pid):
        """The group made on both sides of the fork is all the walk needs."""

    def freeze(self):
        """SIGSTOP the group: no member can die and hand us its children, nor
        fork, while we look."""
        self.signal_group(signal.SIGSTOP)
        return None

    def keep(self, what, endtime):
        """What is kept decides the drain's scope: the detached services are
        out of it; 'outside group' leaves only the group in it; 'everything'
        empties it."""
        self.keeping = what
        if what == _KEEP_DETACHED:
            kept = self.detached(endtime)
            self.kept.update(p.identity for p in kept)
            return kept
        self.scope = {_KEEP_OUTSIDE_GROUP: _GROUP, _KEEP_EVERYTHING: None}.get(what, _RUN)
        return []

    def members(self, endtime):
        if self.scope is None:
            return []
        return self._walk(self.scope, endtime=endtime, careful=False).found

    def signal(self, sig, endtime=None):
        """Signal the group (and the command if it left the group), and in the
        run's scope every other process that is provably ours."""
        if self.scope is None or sig == 0:
            return
        self.signal_group(sig)
        if self.scope == _RUN:
            _close_pins(self._walk(_RUN, sig=sig, careful=False, endtime=endtime).pins)

    def thaw(self):
        self.signal_group(signal.SIGCONT)

    def waiter(self, procs):
        return _PinWaiter(self.fs, self.record, self.pins(procs))

    def kill(self, endtime):
        self.signal_group(signal.SIGKILL)

    def kill_round(self, endtime):
        """SIGKILL the scope. The walk freezes each process as it finds it
        (SIGSTOP: none forks while the walk reads on) and kills it once its
        children are done, children before parents, so that only the path
        being walked is pinned."""
        walk = self._kill_walk(self.scope or _GROUP, endtime)
        return _Round(walk, self._round_waiter(walk))

    def _kill_walk(self, scope, endtime):
        self.signal_group(signal.SIGSTOP)
        if scope == _RUN:
            self._stop_own_children(endtime)
        walk = self._walk(scope, sig=signal.SIGSTOP, kill=True, endtime=endtime)
        self.signal_group(signal.SIGKILL)
        return walk

    def _round_waiter(self, walk):
        """After a kill walk: its pins; or, when it found only what it could
        not yet prove ours, a moment (an adoption's SIGCHLD wakes it sooner);
        or, when it found nothing but was disturbed, a shorter one."""
        if walk.pins:
            return _PinWaiter(self.fs, self.record, walk.pins)
        return _Pause(_DRAIN_ROUND_LIMIT if walk.found else _UNSETTLED_RETRY)

    def confirm(self, endtime, previous=None):
        """([], True) once two looks in a row found nothing alive in scope,
        each undisturbed, and saw the same processes (a process that died
        during the first look handed its children to a list read before: the
        second sees them). Else the live processes found, or ([], False) when
        the looks kept being disturbed (a few tries: the caller waits before
        it asks again) or time ran out."""
        scope = self.scope or _GROUP
        previous = previous.walk if previous is not None else None
        for _ in range(_CONFIRM_TRIES):
            walk = self._walk(scope, endtime=endtime)
            if walk.found:
                return walk.found, walk.stable
            if walk.stable and previous is not None and walk.seen == previous.seen:
                return [], True
            if _now() >= endtime:
                break
            previous = walk if walk.stable else None
        return [], False

    def strays(self, endtime):
        """Our live children adopted since the confirmation, outside the group,
        that are neither kept nor the caller's: a kept service that died
        handed them over (they were left alone while it lived)."""
        return [p for p in self.detached(endtime) if p.identity not in self.kept]

    def drain_strays(self, endtime):
        walk = self._kill_walk(_RUN, endtime)
        return _Round(walk, self._round_waiter(walk))

    def preserved(self, endtime):
        """The kept roots alive now: after a forced stop the services kept; at
        a natural exit every live child outside the group ('everything': every
        live child, the group's too)."""
        if self.keeping == _KEEP_NOTHING:
            return []
        if self.keeping == _KEEP_EVERYTHING:
            return [p for p in self.children.live(endtime, self.reaper)
                    if p.pid != self.pid and not self._claimed(p)]
        return [p for p in self.detached(endtime)
                if self.keeping != _KEEP_DETACHED or p.identity in self.kept]

    def last_look(self, endtime, preserved):
        """Kept services were free to run since the confirming look: one that
        died meanwhile handed its children to us, and one could have put a
        process in the command's group. A live child of ours that is neither
        the command, a service kept, nor the caller's, is the run's, alive."""
        if self.keeping == _KEEP_EVERYTHING:
            return []
        kept = set(p.identity for p in preserved)
        return [p for p in self.children.live(endtime, self.reaper)
                if p.pid != self.pid and p.identity not in kept and not self._claimed(p)]

    def census(self, endtime):
        """(What of the run is alive, whether the look was whole), by one look
        that needs no stability: for the receipt's survivors when the run was
        not confirmed. Where the children files fail (a mount over ours),
        one scan of every process instead."""
        scope = self.scope or _GROUP
        try:
            walk = self._walk(scope, endtime=endtime, careful=False)
        except ObservationError:
            walk = self._walk(scope, endtime=endtime, careful=False, scan=True)
        return walk.found, walk.whole and walk.stable  # disturbed: some may have been missed

    def fields(self):
        return {"containment": self.kind}

    def usage(self):
        return None

    def close(self):
        pass

    # Helpers of the verbs.

    def signal_group(self, sig):
        """Signal the command's group, and the command itself if it left the
        group (our unreaped child: its pid is ours). The group id is ours
        while the command's zombie, its first leader, is held unreaped."""
        _signal_group(self.fs, self.pid, self.pgid, sig)

    def detached(self, endtime=None):
        """Our live children outside the command's group, but never the
        command itself (it may have moved to another group), nor the caller's."""
        return [proc for proc in self.children.live(endtime, self.reaper)
                if proc.pgid != self.pgid and proc.pid != self.pid and not self._claimed(proc)]

    def pins(self, procs):
        """Pins for waiting only, never signalled: a pid reused between the
        look and the pin costs a longer wait, never a wrong signal. Beyond
        what the fd limit allows, a pin polls /proc instead."""
        allowed = self.budget.allowed(len(procs))
        pins = []
        try:
            for proc in procs:
                fd = self.budget.pidfd(proc.pid) if len(pins) < allowed else None
                if fd is not False:
                    pins.append(_Pin(proc, fd))
        except BaseException:
            _close_pins(pins)
            raise
        return pins

    def _claimed(self, proc):
        """The caller's, or unattributed (see _CallersJobs.claims)."""
        return self.callers.claims(proc, self._in_group(proc))

    def _in_group(self, proc):
        return proc.pgid == self.pgid or proc.pid == self.pid

    def _stop_own_children(self, endtime):
        """SIGSTOP every child of ours that is not a kept service or the
        caller's, before the walk looks at anything, then reap the zombies
        among them. Orphans of a tree that keeps forking are adopted by us,
        and each of their sessions gets as much CPU as we do (autogroups): a
        starved supervisor reading /proc process by process would only ever
        find the zombies of processes that already replaced themselves. So
        each pass costs one kill() a child, newest first (the live end of each
        lineage was adopted last), and there are at most _STOP_PASSES, so the
        walk always gets its turn. By pid: an unreaped child's pid is its own,
        and a kept service is recognised by its pid (should that pid be
        reused, the process is only left to the walk)."""
        spared = set(pid for pid, _ in self.kept) | self.callers.spared()
        spared.add(self.pid)
        seen = set()
        for _ in range(_STOP_PASSES):
            if _now() >= endtime:
                return
            fresh = [pid for pid in reversed(self.children.all(endtime))
                     if pid not in seen and pid not in spared]
            if not fresh:
                return
            seen.update(fresh)
            if self.callers.groups:  # the caller's jobs are known by group: look first
                fresh = [pid for pid in fresh if not self._claimed(self.fs.stat(pid) or _GONE)]
            # Thousands of them, each kill() slower for the storm: mind the time.
            for pid in fresh:
                if _now() >= endtime:
                    return
                _quietly_signal(pid, signal.SIGSTOP)
            for pid in fresh:
                if _now() >= endtime:
                    return
                self.reaper.reap(pid)

    # The walk.

    def _look(self, walk, endtime, scan=False):
        if scan or self.children.scan:
            return _ScanLook(self.fs, self.children, walk, endtime)
        return _LiveLook(self.fs, self.children)

    def _walk(self, scope, sig=None, kill=False, endtime=None, careful=True, scan=False):
        """One look from this process down (see the class docstring): the live
        processes in scope, parents first. With sig, each of them is proven
        and pinned, and those outside the group are sent sig as they are
        found; with kill, SIGKILL too once their children are done. With
        scan, one scan of /proc instead of the children files (the census,
        where those failed: the reaper, which reads them too, waits)."""
        walk = _Walk()
        look = self._look(walk, endtime, scan)
        # Items are (parent node, pid) to visit, or (node, None) to leave.
        stack = [(None, pid) for pid in reversed(look.own(endtime))]
        handed_on = False
        try:
            while stack:
                out_of_time = endtime is not None and _now() >= endtime
                if not out_of_time and not scan:  # scan: the reaper's lists failed
                    self.reaper.reap_when_due()
                parent, pid = stack.pop()
                if pid is None:
                    self._leave(parent, kill, walk)
                elif out_of_time:
                    walk.stable = walk.whole = False  # the look is partial
                else:
                    node = self._visit(parent, pid, scope, sig, walk, look)
                    if node is not None and parent is None and node[1] is not None:
                        self._hold_unpinned(node[1])
                    if node is not None:
                        stack.append((node, None))  # left, and its pin closed, whatever happens
                        children = look.children_of(node[0])
                        if careful and not self._still_there(node, look):
                            walk.stable = False  # it died: its children moved to a list read before
                        stack.extend((node, child) for child in reversed(children))
            handed_on = kill  # only a kill walk hands its pins on, for waiting
        finally:
            self.reaper.held.clear()
            for node, pid in stack:
                if pid is None:
                    _closed(node[1])
            if not handed_on:
                _close_pins(walk.pins)
                walk.pins = []
        return walk

    def _leave(self, node, kill, walk):
        """Its children are done: kill it (with kill), and keep its pin for
        waiting while the fd limit allows."""
        proc, pin, _ = node
        if pin is None:
            return
        if kill and not self._in_group(proc):
            pin.send(signal.SIGKILL)
        self.reaper.held.discard(proc.pid)
        if len(walk.pins) == _PIN_FD_HEADROOM:
            walk.wait_budget = self.budget.allowed(len(walk.pins) + 1)
        if len(walk.pins) < walk.wait_budget:
            walk.pins.append(pin)
        else:
            pin.close()

    def _hold_unpinned(self, pin):
        """A child of ours proven without a pidfd (a kernel before 5.3, a
        seccomp filter, no descriptor left) is signalled by its pid, and its
        children are proven by that pid being its parent: neither holds once
        it is reaped. So the reaper leaves it until the walk has left it."""
        if pin.fd is None:
            self.reaper.held.add(pin.proc.pid)

    def _visit(self, parent, pid, scope, sig, walk, look):
        """Look at one process. None when it is gone, moved, inherited or one of
        our zombies (reaped here, never carried); else (proc, pin, kept) to
        descend into, pin proving it ours for its children's sake."""
        parent_proc, _, parent_kept = parent or (None, None, False)
        # Below a kept service only group members are in scope, and killpg
        # reaches those: nothing there needs a proof.
        pin = self._prove(parent, pid) if sig is not None and not parent_kept else None
        proc = pin.proc if pin is not None else look.stat(pid)
        if proc is None or proc.ppid != (parent_proc.pid if parent_proc else self.me):
            # Gone since its parent's list was read, or re-parented: it may
            # have handed its children to a list read before. Below a kept
            # service, which runs on, only group members are at stake.
            if proc is not None or not parent_kept:
                walk.stable = False
            return _closed(pin)
        if parent is None:
            if self._claimed(proc):
                return _closed(pin)
            if not proc.live and self.reaper.reap(pid):
                # Gone for good: the next look will not see it either; but it
                # may have died after our list was read.
                walk.stable = False
                return _closed(pin)
        if not parent_kept:
            walk.seen.add(proc.identity)
        kept = parent_kept or proc.identity in self.kept
        if proc.live and (self._in_group(proc) or (scope == _RUN and not kept)):
            walk.found.append(proc)
            self.record.saw(proc)
            if pin is not None and not self._in_group(proc):
                pin.send(sig)
                if sig != signal.SIGSTOP and proc.state == "T":  # stopped: act on it now
                    pin.send(signal.SIGCONT)
            return (proc, pin, kept)
        return (proc, _closed(pin), kept)

    def _prove(self, parent, pid):
        """A pin on pid if it is provably ours, else None. Our own child is
        ours: unreaped, its pid stays its own. Any other process is ours when
        /proc shows, after its pidfd was taken, that its parent is a process
        we proved: if the pidfd still shows it alive, the stat read was its
        own; if the parent's pin (or the parent being our unreaped child)
        still holds the parent, the ppid read was that parent's."""
        parent_proc, parent_pin, _ = parent or (None, None, False)
        parent_is_ours = parent_proc is None or parent_proc.ppid == self.me
        parent_fd = parent_pin.fd if parent_pin is not None else None
        if not parent_is_ours and parent_fd is None:
            return None  # an unproven parent: its children wait to be adopted
        fd = self.budget.pidfd(pid)
        if fd is False or (fd is None and parent_proc is not None):
            return None
        proc = self.fs.stat(pid)
        if parent_proc is not None and (
                proc is None or proc.ppid != parent_proc.pid or _readable(fd)
                or (not parent_is_ours and _readable(parent_fd))):
            proc = None
        if proc is None:
            if fd is not None:
                os.close(fd)
            return None
        return _Pin(proc, fd)

    def _still_there(self, node, look):
        """Was the process alive after its children were read? (Then nothing
        left its list unseen.) Pinned processes are checked by their pidfd,
        the rest by /proc; a scan is one snapshot, which _ScanLook checks."""
        proc, pin, _ = node
        if not proc.live or look.snapshot:
            return True  # a zombie has no children: they left at its exit
        if pin is not None and pin.fd is not None:
            return not _readable(pin.fd)
        now = self.fs.stat(proc.pid)
        return now is not None and now.live and now.start == proc.start


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


class _Gone(object):
    """Stands for a process that is gone: nobody's, in no group."""
    identity, pgid, pid = None, None, None


_GONE = _Gone()


def _closed(pin):
    if pin is not None:
        pin.close()
    return None


def _signal_group(fs, pid, pgid, sig):
    """Signal the command's group, and the command itself if it left the
    group (our unreaped child: its pid is ours). The group id is ours while
    the command's zombie, its first leader, is held unreaped."""
    if pgid is None:
        return
    _quietly_signal(pgid, sig, group=True)
    command = fs.stat(pid)
    if command is not None and command.live and command.pgid != pgid:
        _quietly_signal(pid, sig)
# --- Containment, by a cgroup of the run's own ------------------------------------------------

class _Cgroup(object):
    """One cgroup v2 directory, held open from the moment it is made: its
    files are opened through that descriptor and never across a mount
    (openat2 RESOLVE_NO_XDEV, as /proc), so a root command that mounts over
    cgroup.events or the directory itself cannot feed us its own view."""

    def __init__(self, path, shown, dir_fd, openat2):
        self.path, self.shown = path, shown   # relative to the hierarchy's root; absolute
        self.fd, self.openat2 = dir_fd, openat2
        self.device = os.fstat(dir_fd).st_dev
        self.events_fd = self.procs_fd = None

    def _open(self, name, flags):
        return _open_beneath(self.fd, self.device, self.openat2, name, flags, self.shown)

    def write(self, name, text):
        fd = self._open(name, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read(self, name):
        fd = self._open(name, os.O_RDONLY)
        try:
            return _read_to_end(fd)
        finally:
            os.close(fd)

    def procs(self):
        """The pids of every process in it and in the cgroups below it (a
        nested supervisor's), each directory read through its own held
        descriptor."""
        pids = [int(word) for word in self.read("cgroup.procs").split()]
        for name in _subdirectories(self.fd):
            try:
                below = _Cgroup(self.path + "/" + name, self.shown + "/" + name,
                                _high_fd(self._open(name, os.O_RDONLY | os.O_DIRECTORY)),
                                self.openat2)
            except FileNotFoundError:
                continue  # removed meanwhile (the nested supervisor is done)
            try:
                pids.extend(below.procs())
            finally:
                below.close()
        return pids

    def holds(self, path):
        """Is the cgroup path (as /proc/PID/cgroup gives it) this one or below it?"""
        return path == self.path or (path or "").startswith(self.path + "/")

    def events(self):
        """cgroup.events as a dict ({"populated": "0", "frozen": "1"}), read
        through the descriptor held for waiting: reading it re-arms the
        kernel's notification (POLLPRI) of the next change."""
        if self.events_fd is None:
            self.events_fd = _high_fd(self._open("cgroup.events", os.O_RDONLY))
        os.lseek(self.events_fd, 0, os.SEEK_SET)
        words = _read_to_end(self.events_fd).split()
        return dict((words[i].decode(), words[i + 1].decode()) for i in range(0, len(words) - 1, 2))

    def populated(self):
        return self.events().get("populated") != "0"

    def close(self):
        for name in ("events_fd", "procs_fd", "fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)


def _subdirectories(dir_fd):
    """The directories in dir_fd: the cgroups below one (a nested supervisor's),
    less those removed between the listing and their stat. A cgroup holds
    some twenty files: their types come with the listing where scandir takes
    a descriptor (3.7+), not by a stat each."""
    if os.scandir in os.supports_fd:
        with os.scandir(dir_fd) as entries:  # on a copy of dir_fd, which it closes
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    found = []
    for name in os.listdir(dir_fd):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue
        if mode & 0o170000 == 0o040000:
            found.append(name)
    return found


def _read_to_end(fd):
    chunks = [os.read(fd, 65536)]
    while chunks[-1]:
        chunks.append(os.read(fd, 65536))
    return b"".join(chunks)


class _CgroupHome(object):
    """The supervisor's own cgroup in the cgroup v2 hierarchy: where the run's
    cgroup and its sibling for what the run keeps are made. Found and judged
    by _find_cgroup_home()."""

    def __init__(self, mount_point, path, dir_fd, openat2):
        self.mount_point, self.path = mount_point, path
        self.fd, self.openat2 = dir_fd, openat2

    def make(self, name=None):
        """A new cgroup below ours, under a name no other run can have: our
        pid and random bytes (mkdir refuses a name that exists), or `name`."""
        for _ in range(16):
            candidate = name or "treereap-%d-%s" % (os.getpid(), os.urandom(4).hex())
            try:
                os.mkdir(candidate, 0o755, dir_fd=self.fd)
                break
            except FileExistsError:
                if name:
                    raise
        else:
            raise OSError(errno.EEXIST, "no free cgroup name")
        try:
            cgroup = self.open_existing(candidate)
        except BaseException:
            os.rmdir(candidate, dir_fd=self.fd)
            raise
        import fcntl
        fcntl.flock(cgroup.fd, fcntl.LOCK_EX)  # ours while we live (see remove_leftovers)
        return cgroup

    def open_existing(self, name):
        """The cgroup `name` below ours, held open."""
        fd = _high_fd(_open_beneath(self.fd, os.fstat(self.fd).st_dev, self.openat2, name,
                                    os.O_RDONLY | os.O_DIRECTORY, self.shown()))
        path = self.path.rstrip("/") + "/" + name
        return _Cgroup(path, self.mount_point.rstrip("/") + path, fd, self.openat2)

    def make_kept(self, run):
        """The sibling of the run's cgroup for what the run keeps."""
        return self.make(run.path.rsplit("/", 1)[-1] + ".kept")

    def remove(self, cgroup):
        """rmdir the cgroup, and first the empty ones below it. False when it
        still holds a process (EBUSY): it stays, and the receipt names it."""
        try:
            for name in _subdirectories(cgroup.fd):
                _remove_below(cgroup.fd, name)
            os.rmdir(cgroup.path.rsplit("/", 1)[-1], dir_fd=self.fd)
            return True
        except OSError:
            return False

    def shown(self):
        return self.mount_point.rstrip("/") + self.path

    def remove_leftovers(self):
        """Empty cgroups of supervisors that died (SIGKILL) before removing
        them: rmdir takes only an empty one, so a kept cgroup that still holds
        what it keeps stays. A live supervisor holds a flock on each cgroup it
        made: that, not the pid in the name (another PID namespace's, or
        reused), says whether its maker is alive."""
        import fcntl
        for name in _subdirectories(self.fd):
            parts = name.split("-")
            if not (len(parts) == 3 and parts[0] == "treereap" and parts[1].isdigit()):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=self.fd)
            except OSError:
                continue  # removed meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if time.time() - os.fstat(fd).st_mtime >= _LEFTOVER_MIN_AGE:
                    _remove_below(self.fd, name)
            except OSError:
                pass  # its maker is alive; or not empty, or taken meanwhile
            finally:
                os.close(fd)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _remove_below(parent_fd, name):
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent_fd)
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
    for before, after in fs.mountinfo():
        if not after or after[0] != "cgroup2" or len(before) < 6:
            continue
        root, mount_point = _unescape(before[3]), _unescape(before[4])
        if ours != root and not ours.startswith(root.rstrip("/") + "/"):
            continue
        if "ro" in before[5].split(","):
            raise _NoCgroup("the cgroup v2 hierarchy at %s is mounted read-only" % mount_point)
        path = "/" + ours[len(root):].strip("/") if root != "/" else ours
        return _open_home(fs, mount_point, path)
    raise _NoCgroup("no cgroup v2 hierarchy is mounted (grep cgroup2 /proc/self/mountinfo)")


def _open_home(fs, mount_point, path, judge=True):
    """Our cgroup (or, with judge false, any), held open; judged ours to use."""
    directory = mount_point.rstrip("/") + path
    try:
        fd = _high_fd(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError as e:
        raise _NoCgroup("cannot open our cgroup %s: %s" % (directory, e.strerror))
    try:
        if _filesystem_type(fd) != _CGROUP2_SUPER_MAGIC:
            raise _NoCgroup("%s is not a cgroup v2 directory" % directory)
        if judge:
            _judge_home(fd, directory, path)
    except BaseException:
        os.close(fd)
        raise
    return _CgroupHome(mount_point, path, fd, fs.openat2)


def _judge_home(fd, directory, path):
    """Is this cgroup ours to make children in (see _find_cgroup_home)?"""
    _check_not_managed(directory, path)
    controllers = _read_at(fd, "cgroup.subtree_control").split()
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
        if parts[depth - 1].endswith(_SYSTEMD_UNIT_SUFFIXES):
            unit_dir = directory[:len(directory) - len("/".join(parts[depth:]))].rstrip("/")
            if _delegated(unit_dir):
                return
            raise _NoCgroup("systemd manages our cgroup %s (unit %s, not delegated); run under "
                            "systemd-run --scope -p Delegate=yes" % (path, parts[depth - 1]))


def _delegated(directory):
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(directory, name) == b"1":
                return True
        except (OSError, AttributeError):
            pass
    return False


def _read_at(dir_fd, name):
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return _read_to_end(fd)
    finally:
        os.close(fd)


def _unescape(field):
    """mountinfo writes space, tab, newline and backslash as \\ooo (octal)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _make_run_cgroup(home):
    """The run's cgroup, with what a stop needs: cgroup.kill (Linux 5.14) and
    cgroup.freeze (5.2)."""
    home.remove_leftovers()
    try:
        cgroup = home.make()
    except OSError as e:
        raise _NoCgroup("cannot make a cgroup in %s: %s" % (home.shown(), e.strerror))
    for name in ("cgroup.kill", "cgroup.freeze", "cgroup.events"):
        try:
            os.stat(name, dir_fd=cgroup.fd)
        except OSError:
            home.remove(cgroup)
            cgroup.close()
            raise _NoCgroup("the kernel's cgroups have no %s (cgroup.kill needs Linux 5.14)"
                            % name)
    try:
        cgroup.procs_fd = _high_fd(cgroup._open("cgroup.procs", os.O_WRONLY))
        cgroup.events()
    except OSError as e:
        home.remove(cgroup)
        cgroup.close()
        raise _NoCgroup("cannot use the cgroup %s: %s" % (cgroup.shown, e.strerror))
    return cgroup


class _EscapeeWalk(_ProcContainment):
    """The /proc walk that backs a cgroup's confirmation: a process that left
    the run's cgroup (root can write its pid into another cgroup.procs) still
    descends from us, a child subreaper, so a walk from us down finds it. The
    kept roots are our children in the cgroup of what the run keeps."""

    def __init__(self, fs, children, callers, reaper, budget, record, kept_path):
        _ProcContainment.__init__(self, fs, children, callers, reaper, budget, record)
        self.kept_path = kept_path

    def refresh_kept(self, kept_path, endtime=None):
        self.kept_path = kept_path
        if kept_path is None:
            self.kept = set()
            return
        self.kept = set(p.identity for p in self.children.live(endtime, self.reaper)
                        if self.fs.cgroup_of(p.pid) == kept_path)


class _CgroupRound(object):
    """One round of a cgroup's drain: cgroup.kill, then, once the cgroup is
    empty, a walk for escapees."""

    def __init__(self, cgroup, walk_round):
        self.cgroup, self.walk_round = cgroup, walk_round
        self.waiter = walk_round.waiter if walk_round is not None else _EventWaiter(
            cgroup, "populated", "0")
        self.walk = walk_round.walk if walk_round is not None else None

    @property
    def clear(self):
        if self.walk_round is None:
            return False
        return not self.cgroup.populated() and self.walk_round.clear

    def close(self):
        self.waiter.close()


class _CgroupContainment(object):
    """The run in a cgroup v2 of its own: the command joins it before exec,
    and everything it starts inherits it, whatever session or group it moves
    to. A stop freezes it (cgroup.freeze) to look, moves what the policy
    keeps to a sibling cgroup (it survives cgroup.kill, and an owner can end
    all of it at once later), signals, thaws, and ends it with cgroup.kill;
    the kernel says when it is empty (`populated 0` in cgroup.events, which
    wakes the wait: nothing polls). That is the observation behind
    cleanup_confirmed, with one more: where the command could leave the
    cgroup (it runs as root), a /proc walk from us down finds what did
    (_EscapeeWalk). The same verbs as _ProcContainment."""

    kind = "cgroup"

    def __init__(self, fs, home, cgroup, walk, record, escapes_possible):
        self.fs, self.home, self.cgroup, self.walk = fs, home, cgroup, walk
        self.record, self.escapes_possible = record, escapes_possible
        self.kept_cgroup = None
        self.keeping = _KEEP_NOTHING
        self.stopped = set()        # pids of the members seen stopped (T) by members()
        self.removed = False
        self.usage_seen = None

    def join_in_child(self):
        os.write(self.cgroup.procs_fd, b"0")  # "0": the writing process

    def started(self, pid):
        """The child joins the cgroup itself before its exec, so that nothing
        it starts is ever outside (see join_before_stop)."""
        self.walk.started(pid)

    def join_before_stop(self, pid):
        """A stop decided before the child's exec report came: it may not have
        joined yet, so the parent moves it (as setpgid is made on both
        sides). It has not exec'd yet, or joined already: nothing of it can
        be left out. Only then: each move waits for an RCU grace period in
        the kernel (~5 ms), at every start."""
        try:
            os.write(self.cgroup.procs_fd, str(pid).encode())
        except ProcessLookupError:
            pass  # gone already: its exit says why

    def freeze(self):
        self.cgroup.write("cgroup.freeze", "1")
        return _EventWaiter(self.cgroup, "frozen", "1")

    def keep(self, what, endtime):
        """Move what is kept, while frozen, to the sibling cgroup: the services
        (our children outside the group) and their subtrees, but not the
        group's members below them ('detached'); every process outside the
        group; or every process."""
        self.keeping = what
        if what == _KEEP_NOTHING:
            return []
        members = self._members(endtime)
        in_group = self.walk._in_group
        if what == _KEEP_DETACHED:
            roots = [p for p in members.values()
                     if p.ppid == self.walk.me and not in_group(p)]
            moving = _subtrees(members, roots, stop=in_group)
        else:
            roots = []
            moving = [p for p in members.values()
                      if what == _KEEP_EVERYTHING or not in_group(p)]
        if moving:
            self._move_to_kept(moving)
        return roots

    def _move_to_kept(self, procs):
        """Leaves first, each proven by a pidfd, and only from the run's own
        cgroup: what a nested supervisor holds stays in its cgroup, below
        ours (ended with ours, unless everything is kept; --end-kept ends it
        then)."""
        if self.kept_cgroup is None:
            self.kept_cgroup = self.home.make_kept(self.cgroup)
        for proc in reversed(procs):  # leaves first
            fd = self.walk.budget.pidfd(proc.pid)
            if fd is False:
                continue
            try:
                # In the run's cgroup itself: a nested supervisor's cgroup is
                # its own to end (moved out, its processes would escape it).
                if self.fs.cgroup_of(proc.pid) == self.cgroup.path:
                    try:
                        self.kept_cgroup.write("cgroup.procs", str(proc.pid))
                    except ProcessLookupError:
                        pass
            finally:
                if fd is not None:
                    os.close(fd)

    def members(self, endtime):
        if self.keeping == _KEEP_EVERYTHING:
            return []  # a nested supervisor's cgroup, not moved, is kept too
        found = list(self._members(endtime).values())
        for proc in found:
            self.record.saw(proc)
        self.stopped = set(p.pid for p in found if p.state == "T")
        return found

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

    def signal(self, sig, endtime=None):
        """sig to every process in the cgroup, and SIGCONT after it to those
        members() saw stopped (so that they act on it once thawed; frozen,
        none can stop meanwhile), each through a pidfd taken before /proc
        showed it in the cgroup: never a reused pid. Where the
        kernel gives no pidfds, only what a pid proves: the group (killpg),
        and our own children (see _signal_unpinned)."""
        by_group = not self._pidfds_work()
        if by_group:
            for each in (sig, signal.SIGCONT):
                if each:
                    self.walk.signal_group(each)
        pids = self.cgroup.procs()
        for first in range(0, len(pids), _MEMBER_BATCH):
            if endtime is not None and _now() >= endtime:
                break
            self._signal_batch(pids[first:first + _MEMBER_BATCH], sig, by_group)

    def _signal_batch(self, pids, sig, by_group):
        """A pidfd on each, then cgroup.procs read again: a pid listed there
        whose pidfd still shows its process alive was that process's when
        read, so it is a member. One read and one poll() for the batch, not
        a read of /proc/PID/cgroup each; a few dozen descriptors at once."""
        pinned = []  # (pid, pidfd)
        try:
            for pid in pids:
                fd = self.walk.budget.pidfd(pid)
                if fd is None:
                    self._signal_unpinned(pid, sig, by_group)
                elif fd is not False:  # False: gone
                    pinned.append((pid, fd))
            if not pinned:
                return
            members = set(self.cgroup.procs())
            exited = _exited_pidfds([fd for _, fd in pinned])
            for pid, fd in pinned:
                if pid in members and fd not in exited:
                    pin = _Pin(None, fd)
                    if sig:
                        pin.send(sig)
                    if pid in self.stopped:
                        pin.send(signal.SIGCONT)
        finally:
            for _, fd in pinned:
                os.close(fd)

    def _pidfds_work(self):
        """Does the kernel give pidfds (asked of the command's unreaped pid)?"""
        fd = self.walk.budget.pidfd(self.walk.pid)
        if fd:
            os.close(fd)
        return self.walk.budget.pidfds

    def _signal_unpinned(self, pid, sig, by_group):
        """No pidfd for pid (none at all, or no descriptor left): signalled by
        its pid only if it is our child, unreaped (nothing reaps during a
        signal), so the pid is its own; the group had killpg already. The
        rest gets cgroup.kill when the grace ends."""
        proc = self.fs.stat(pid)
        if proc is None or proc.ppid != self.walk.me or (by_group and self.walk._in_group(proc)):
            return
        if self.cgroup.holds(self.fs.cgroup_of(pid)):
            for each in (sig, signal.SIGCONT):
                if each:
                    _quietly_signal(pid, each)

    def thaw(self):
        self.cgroup.write("cgroup.freeze", "0")

    def waiter(self, procs):
        return _EventWaiter(self.cgroup, "populated", "0")

    def kill(self, endtime):
        self.cgroup.write("cgroup.kill", "1")

    def kill_round(self, endtime):
        """cgroup.kill (again: cheap, and a storm is over at once); once the
        cgroup is empty, a kill walk for what left it."""
        self.cgroup.write("cgroup.kill", "1")
        if self.cgroup.populated():
            return _CgroupRound(self.cgroup, None)
        if not self.escapes_possible:
            return _CgroupRound(self.cgroup, _EmptyRound())
        self.walk.refresh_kept(self._kept_path(), endtime)
        return _CgroupRound(self.cgroup, self.walk.kill_round(endtime))

    def confirm(self, endtime, previous=None):
        if self.cgroup.populated():
            return [], False
        if not self.escapes_possible:
            return [], True
        self.walk.refresh_kept(self._kept_path(), endtime)
        walk_previous = previous.walk_round if isinstance(previous, _CgroupRound) else None
        return self.walk.confirm(endtime, walk_previous if walk_previous is not None
                                 and not isinstance(walk_previous, _EmptyRound) else None)

    def strays(self, endtime):
        """A kept service that died handed its children to us: they are in the
        kept cgroup, and kept. Only a process that left the cgroups (root
        only) is a stray."""
        if not self.escapes_possible:
            return []
        self.walk.refresh_kept(self._kept_path(), endtime)
        return self.walk.strays(endtime)

    def drain_strays(self, endtime):
        return self.walk.drain_strays(endtime)

    def preserved(self, endtime):
        """Our live children in the kept cgroup: the roots of what is kept."""
        if self.kept_cgroup is None:
            return []
        return [p for p in self.walk.children.live(endtime, self.walk.reaper)
                if p.pid != self.walk.pid and self.fs.cgroup_of(p.pid) == self.kept_cgroup.path]

    def last_look(self, endtime, preserved):
        if self.keeping == _KEEP_EVERYTHING:
            return []  # all of it kept, what a nested supervisor holds too
        left = list(self._members(endtime).values())
        if self.escapes_possible:
            self.walk.refresh_kept(self._kept_path(), endtime)
            left.extend(self.walk.last_look(endtime, preserved))
        return left

    def census(self, endtime):
        found = list(self._members(endtime).values())
        whole = _now() < endtime
        if self.escapes_possible and whole:
            escaped, whole = self.walk.census(endtime)
            found.extend(p for p in escaped if p.pid not in set(q.pid for q in found))
        return found, whole

    def finish(self, confirmed):
        """At done: read what the run cost, then remove the run's cgroup (once
        empty) and the kept one if nothing is in it."""
        self.usage_seen = _cgroup_usage(self.cgroup)
        if not self.removed and not self.cgroup.populated():
            self.removed = self.home.remove(self.cgroup)
        if self.kept_cgroup is not None and not self.kept_cgroup.populated():
            if self.home.remove(self.kept_cgroup):
                self.kept_cgroup.close()
                self.kept_cgroup = None

    def fields(self):
        return {"containment": "cgroup", "cgroup": self.cgroup.path,
                "kept_cgroup": self.kept_cgroup.path if self.kept_cgroup is not None else None}

    def usage(self):
        return self.usage_seen

    def _kept_path(self):
        return self.kept_cgroup.path if self.kept_cgroup is not None else None

    def close(self):
        if self.home.fd is None:
            return  # closed already
        try:
            if not self.removed and not self.cgroup.populated():
                self.removed = self.home.remove(self.cgroup)
        finally:
            self.cgroup.close()
            if self.kept_cgroup is not None:
                self.kept_cgroup.close()
            self.home.close()


class _EmptyRound(object):
    """A walk round that did not need to happen: nothing can have escaped."""
    walk, clear = None, True

    def __init__(self):
        self.waiter = _Pause(0)

    def close(self):
        pass


def _subtrees(members, roots, stop):
    """roots and their descendants among members ({pid: _Proc}), parents
    first, not descending into a process for which stop(proc) is true."""
    children = {}
    for proc in members.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = [], list(roots)
    while todo:
        proc = todo.pop(0)
        found.append(proc)
        todo.extend(p for p in children.get(proc.pid, []) if not stop(p))
    return found


def _cgroup_usage(cgroup):
    """The run's CPU from cpu.stat (every process it ever held, reaped or
    not), and memory.peak where the memory controller is on for it."""
    try:
        stat = dict(line.split() for line in cgroup.read("cpu.stat").decode().splitlines()
                    if len(line.split()) == 2)
    except (OSError, ValueError):
        return None
    usage = {"source": "cgroup",
             "cpu_user_s": int(stat.get("user_usec", 0)) / 1e6,
             "cpu_system_s": int(stat.get("system_usec", 0)) / 1e6}
    try:
        usage["memory_peak_kib"] = int(cgroup.read("memory.peak")) // 1024
    except (OSError, ValueError):
        usage["memory_peak_kib"] = None
    return usage
# --- Signals and the stop file ---------------------------------------------------------

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
        try:
            data = os.read(self.fd, _SIGINFO_SIZE * _SIGNAL_BATCH)
        except BlockingIOError:
            data = b""
        now = _now()
        for i in range(0, len(data) - _SIGINFO_SIZE + 1, _SIGINFO_SIZE):
            sig = int.from_bytes(data[i:i + 4], sys.byteorder)
            if self.held is None or sig not in self.held:
                taken.append((sig, now))
        return taken

    def reset_for_command(self):
        """In the forked child, before exec: the caller's dispositions and mask,
        but SIGCHLD, SIGPIPE, SIGXFSZ and the stop signal at their default
        dispositions (a stop must be able to end the command gracefully;
        a launcher's `trap '' TERM` only fenced its own start-up), and the
        first three unblocked."""
        defaulted = set(_DEFAULTED_FOR_COMMAND)
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
            try:
                for _ in range(_DISCARD_LIMIT // _SIGNAL_BATCH):
                    if not os.read(self.fd, _SIGINFO_SIZE * _SIGNAL_BATCH):
                        break
            except BlockingIOError:
                pass
            os.close(self.fd)
            self.fd = None
        for sig, handler in self.saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.caller_mask)


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


class _StopFileWatch(object):
    """Notices the stop file. inotify watches every directory its path goes
    through, as written and where symlinks lead, so that a renamed or
    replaced ancestor and a re-pointed symlink are noticed at once, like the
    file itself; a slow safety check covers what inotify cannot see (a mount
    over a directory), and polling replaces it where it is blind."""

    def __init__(self, path):
        self.path = path
        self.fd = None
        self.watched = {}           # wd -> (directory, names looked up in it)
        self.resolved = None        # the (directory, name) steps last watched
        self.interval = _STOP_FILE_POLL_INTERVAL
        try:
            self.fd = _high_fd(_libc().call("inotify_init1", _IN_NONBLOCK | _IN_CLOEXEC))
        except (OSError, AttributeError):
            return  # no inotify here (ENOSYS, EMFILE): poll
        self._rewatch()

    def exists(self):
        """Is anything at the path, a dangling symlink included? Only ENOENT
        and ENOTDIR mean no: a path we cannot look at is taken as a stop."""
        try:
            os.lstat(self.path)
            return True
        except OSError as e:
            return e.errno not in (errno.ENOENT, errno.ENOTDIR)

    def due(self, now):
        """When the next check by time is due (inotify wakes us otherwise)."""
        return now + self.interval

    def fileno(self):
        return self.fd

    def read_events(self):
        """Read the events; look at the path again if one touched it."""
        data = b""
        try:
            while True:
                chunk = os.read(self.fd, 65536)
                if not chunk:
                    break
                data += chunk
        except BlockingIOError:
            pass
        if any(self._touches(wd, mask, name) for wd, mask, name in _inotify_events(data)):
            self._rewatch()

    def _touches(self, wd, mask, name):
        if mask & (_IN_Q_OVERFLOW | _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
            return True
        return name in self.watched.get(wd, (None, ()))[1]

    def _rewatch(self):
        """Every directory on the path is watched for its own move or deletion;
        only where an entry decides the path (the stop file's directory, the
        deepest that exists, a symlink's) for entries too: a busy /tmp on the
        way wakes nobody."""
        steps = _path_steps(self.path)
        identity = steps + tuple(_inode_of(directory) for directory, _, _ in steps)
        if identity == self.resolved:
            return  # the same directories (inodes, not only names) as watched now
        self._unwatch()
        names = {}
        for directory, name, entry_matters in steps:
            wanted = names.setdefault(directory, set())
            if entry_matters:
                wanted.add(name.encode())
        blind = False
        for directory, wanted in names.items():
            mask = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
            if wanted:
                mask |= _IN_CREATE | _IN_MOVED_TO | _IN_MOVED_FROM | _IN_DELETE
            try:
                wd = _libc().call("inotify_add_watch", self.fd, os.fsencode(directory), mask)
            except OSError:  # ENOSPC (watch limit), EACCES: poll instead
                self.interval = _STOP_FILE_POLL_INTERVAL
                self.resolved = None
                return
            # One inode seen through two paths is one watch: merge what it looks up.
            self.watched.setdefault(wd, (directory, set()))[1].update(wanted)
            blind = blind or _inotify_blind(directory)
        self.resolved = identity
        self.interval = _STOP_FILE_POLL_INTERVAL if blind else _STOP_FILE_SAFETY_INTERVAL

    def retire(self):
        """The run no longer looks at the stop file: remove the watches now."""
        if self.fd is not None:
            self._unwatch()
            self.resolved = None

    def _unwatch(self):
        """Remove the watches. Closing an inotify fd whose watches were removed
        less than a millisecond before waits for the kernel to reap them
        (~14 ms measured, whether or not they were removed); removed early (by
        retire()), they are reaped in the background and the close is
        instant."""
        for wd in self.watched:
            try:
                _libc().call("inotify_rm_watch", self.fd, wd)
            except OSError:
                pass  # EINVAL: the kernel dropped it already (directory deleted)
        self.watched = {}

    def close(self):
        if self.fd is not None:
            self._unwatch()
            os.close(self.fd)
            self.fd = None


def _inode_of(directory):
    try:
        st = os.stat(directory)
        return (st.st_dev, st.st_ino)
    except OSError:
        return None


def _path_steps(path):
    """The (directory, name, entry matters) lookups that resolving path makes,
    through every existing directory and symlink on the way (at most 40
    links, as the kernel), down to the deepest directory that exists. The
    entry matters where a change to it changes the path: the last lookup
    (the stop file, or what is missing) and a symlink's."""
    steps, directory, parts, links = [], "/", path.strip("/").split("/"), 0
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            directory = os.path.dirname(directory)
            continue
        if not parts:
            steps.append((directory, name, True))
            break  # the stop file itself: its directory is watched for it
        here = os.path.join(directory, name)
        try:
            st = os.lstat(here)
        except OSError:
            steps.append((directory, name, True))
            break  # missing: the deepest existing directory is watched for it
        steps.append((directory, name, st.st_mode & 0o170000 != 0o040000))
        if st.st_mode & 0o170000 == 0o120000 and links < 40:
            links += 1
            try:
                target = os.readlink(here)
            except OSError:
                break
            parts = target.strip("/").split("/") + parts
            if target.startswith("/"):
                directory = "/"
        elif st.st_mode & 0o170000 == 0o040000:
            directory = here
        else:
            break
    return tuple(steps)


def _inotify_events(data):
    """(wd, mask, name) for each struct inotify_event in data."""
    events, i = [], 0
    while i + 16 <= len(data):
        wd = int.from_bytes(data[i:i + 4], sys.byteorder, signed=True)
        mask = int.from_bytes(data[i + 4:i + 8], sys.byteorder)
        length = int.from_bytes(data[i + 12:i + 16], sys.byteorder)
        events.append((wd, mask, data[i + 16:i + 16 + length].rstrip(b"\0")))
        i += 16 + length
    return events


def _inotify_blind(directory):
    """Is directory on a filesystem whose remote changes inotify never sees?"""
    try:
        return _filesystem_type(directory) & 0xFFFFFFFF in _INOTIFY_BLIND_FILESYSTEMS
    except OSError:
        return True


# --- Running the command as another user ------------------------------------------------

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
        self.environment = None
        if entry is not None:
            self.environment = dict(os.environ, HOME=entry.pw_dir, USER=entry.pw_name,
                                    LOGNAME=entry.pw_name)
        self.shown = entry.pw_name if entry is not None else str(self.uid)
        # Already that user, and no privilege to change groups: nothing to switch.
        self.switching = (self.uid, self.gid) != (os.geteuid(), os.getegid()) or (
            _has_capability(_CAP_SETGID) and sorted(self.groups) != sorted(os.getgroups()))

    def check_privilege(self):
        if self.switching and not (_has_capability(_CAP_SETUID) and _has_capability(_CAP_SETGID)):
            raise UsageError("--user: switching to %s (uid %d) needs root (CAP_SETUID and "
                             "CAP_SETGID); run the supervisor as root" % (self.shown, self.uid))

    def can(self, checks):
        """[bool] for (path, "enter" or "write") checks, tried as the user, in
        a child that switches first: ACLs, groups and all, as the command
        would find them."""
        read_end, write_end = _pipe()
        try:
            pid = _acquire("fork", os.fork)
        except SupervisorError:
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:
            try:
                os.close(read_end)
                if self.switching:
                    os.setgroups(self.groups)
                    os.setresgid(self.gid, self.gid, self.gid)
                    os.setresuid(self.uid, self.uid, self.uid)
                answers = "".join(_try_as_user(path, how) for path, how in checks)
                os.write(write_end, answers.encode())
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
        try:
            return by_number(_id_number(text, what))
        except KeyError:
            return None
    try:
        return by_name(text)
    except KeyError:
        raise UsageError("--user: no %s named %r on this system" % (what, text))


def _id_number(text, what):
    if not text.isdigit() or int(text) > 2 ** 32 - 2:
        raise UsageError("--user: %r is neither a %s name nor a number" % (text, what))
    return int(text)


def _check_user_may_not_replace(user, target):
    """Under --user the command must not be able to put a receipt of its own
    at the path, nor replace ours (nor may a kept service of it): refuse a
    receipt directory that user can write, sticky or not (between the stale
    receipt's removal and ours, the name is free for anyone who may create
    it). And every lookup that resolving the path as given makes, through
    each directory and symlink on the way: a directory on the way that the
    user owns (it can make it writable), or can write unless it is sticky
    (as /tmp is), or, in a sticky one, an entry the user owns, lets it swap
    that entry and re-point the path the controller reads; so does a
    symlink it owns. (Judged by the resolved directory alone, home/sub/link
    in a home the user may write passed: the user renames sub away and puts
    its own sub/link there.)"""
    steps = _path_steps(target.path)
    directories = _unique([target.directory] + [d for d, _, _ in steps])
    can_write = dict(zip(directories, user.can([(d, "write") for d in directories])))
    if can_write[target.directory]:
        _refuse_receipt_path(user, target.directory, "writable")
    for directory, name, _ in steps:
        st = os.stat(directory)
        entry_path = os.path.join(directory, name)
        try:
            entry = os.lstat(entry_path)
        except FileNotFoundError:
            entry = None  # the receipt itself, not there yet
        owns_entry = entry is not None and entry.st_uid == user.uid
        if owns_entry and entry.st_mode & 0o170000 == 0o120000:
            _refuse_receipt_path(user, entry_path, "a symlink it owns")
        if st.st_uid == user.uid:
            _refuse_receipt_path(user, directory, "its owner")
        if can_write[directory] and (not st.st_mode & 0o1000 or owns_entry):
            _refuse_receipt_path(user, entry_path, "in a directory it may write")


def _refuse_receipt_path(user, path, why):
    raise UsageError("--user: %s could replace the receipt through %s (%s); put the receipt in "
                     "a directory that user cannot write, reached by no symlink of its" % (
                         user.shown, path, why))


def _unique(items):
    seen, found = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            found.append(item)
    return found


# --- The run: its state, its one wait, what signals do -------------------------------------

class _Plan(object):
    """What the caller asked for, checked, before anything starts."""

    def __init__(self, command, timeout, cleanup_timeout, stop_path, workdir, stop_with_parent,
                 user=None, stop_signal=None, policy="drain-all", containment="auto",
                 preserve_status=False, verbose=False):
        self.command = command
        self.timeout, self.cleanup_timeout = timeout, cleanup_timeout
        self.stop_path, self.workdir = stop_path, workdir
        self.stop_with_parent = stop_with_parent
        self.user = user            # --user: a _User, or None
        # The first signal of a stop; 0 sends none (the grace, then SIGKILL).
        self.stop_signal = signal.SIGTERM if stop_signal is None else stop_signal
        self.policy = policy        # one of POLICIES: what the run keeps when it ends
        self.containment = containment  # one of CONTAINMENTS
        self.preserve_status = preserve_status
        self.verbose = verbose      # -v: say when the run is stopped, and how it ended


class _Run(object):
    """One supervised run: the plan, the state it is in, and what it saw.
    The state changes only through _enter(), which only the driver calls."""

    def __init__(self, plan):
        self.plan = plan
        self.state = "starting"
        self.ladder = []                # [step, start, end] for each cleanup step
        self.started_wall, self.started = time.time(), _now()
        self.endtime = None             # the deadline: the command's start + timeout
        self.ended_running = None
        self.pid = self.pgid = None     # the command; its first pid is its group id
        self.exit_info = None           # its waitid() once it exited, unreaped until done
        self.reaped = False
        self.report = None              # the exec report
        self.stop_reason = self.stop_signal = None
        self.hurry = False              # a later stop signal: skip the rest of the grace
        self.last_stop = (None, 0.0)    # (signal, when) of the last stop request taken
        self.error = self.error_exit = None
        self.failed = False             # the supervisor itself failed: nothing confirmed
        self.preserved, self.survivors, self.stable = [], [], True
        self.survivors_count = 0        # how many were alive, past the receipt's list
        self.unattributed = []          # live processes adopted in the caller's jobs' groups
        self.foreign = []               # --user: that uid's processes outside the run
        self.killed = False             # the grace ran out: SIGKILL was needed
        self.fs = self.containment = self.catcher = self.watch = None
        self.children = self.callers = self.reaper = self.budget = self.record = None
        self.cgroup_unavailable = None  # why auto did not take a cgroup
        self.terminal = None            # fd 0, when the command was given the terminal
        self.subreaper_before = None
        self.saved_nice = None          # our nice value while the cleanup has the CPU
        self.usage_before = None        # getrusage(RUSAGE_CHILDREN) at the command's start
        self.fork_rss_kib = None        # our own RSS when we forked the command
        self.supervisor_pid = os.getpid()


def _enter(run, state):
    """Move the run to `state`. Cleanup steps are timed for the receipt's
    ladder; entering one returns its endtime (a budget of cleanup_timeout)."""
    now = _now()
    if run.ladder and run.ladder[-1][2] is None:
        run.ladder[-1][2] = now
    if run.state == "running":
        run.ended_running = now
    run.state = state
    if state in _CLEANUP_STEPS:
        run.ladder.append([state, now, None])
        return now + run.plan.cleanup_timeout
    return None


def _wait(run, endtime, fds=(), priority_fds=()):
    """The one place a run blocks: until a signal arrives, one of fds is
    readable (pidfds), one of priority_fds changes (cgroup.events), the stop
    file's watch or the exec report speaks (while running only), or the
    monotonic time `endtime`. Then act on the signals."""
    running = run.state == "running"
    watch_fd = run.watch.fileno() if running and run.watch is not None else None
    report_fd = run.report.fileno() if running else None
    wanted = [fd for fd in (run.catcher.fd, watch_fd, report_fd) if fd is not None]
    if run.reaper.pending:
        endtime = min(endtime, run.reaper.next_list_reap)
    ready = _wait_ready(wanted + list(fds), priority_fds, endtime - _now())
    if watch_fd is not None and watch_fd in ready:
        run.watch.read_events()
    _act_on_signals(run)


def _wait_for(run, waiter, endtime, interruptible=False):
    """Block until waiter says done (processes gone, a cgroup empty or
    frozen): True; False at `endtime`, or, when interruptible, as soon as a
    later stop signal asks to hurry."""
    while not waiter.done():
        if _now() >= endtime or (interruptible and run.hurry):
            return False
        fds, priority_fds, poll_at = waiter.wake()
        _wait(run, endtime if poll_at is None else min(endtime, poll_at), fds, priority_fds)
    return True


def _act_on_signals(run):
    """Dispatch what arrived on (state, kind of signal); SIGCHLD reaps."""
    child_exited = False
    for sig, when in run.catcher.take():
        if sig == signal.SIGCHLD:
            child_exited = True
        else:
            _signal_action(run.state, sig)(run, sig, when)
    # While a list reap is pending, the zombie that made it so still hides the
    # others from waitid(): a SIGCHLD (a storm sends thousands) changes nothing.
    if run.reaper.pending:
        if _now() >= run.reaper.next_list_reap:
            run.reaper.reap_exited()
    elif child_exited:
        run.reaper.reap_exited()


def _signal_action(state, sig):
    actions = _SIGNAL_ACTIONS[state]
    if sig in _FORWARDED_SIGNALS:
        return actions.forwarded
    return actions.suspend if sig == signal.SIGTSTP else actions.stop


def _request_stop(run, sig, when):
    """The first stop request decides; one that arrives past the deadline
    (the supervisor was stopped, say) is the deadline's."""
    if run.stop_reason is None:
        if run.endtime is not None and when >= run.endtime:
            run.stop_reason = "timeout"
        else:
            run.stop_reason, run.stop_signal = "signal", sig
        run.last_stop = (sig, when)


def _hurry(run, sig, when):
    """A second stop signal skips the rest of the grace. The first one after
    a stop by the deadline or the stop file is that stop again (a controller
    touches the stop file, then sends SIGTERM); the same signal again within
    _STOP_BURST is the same request (GNU timeout signals its child, then its
    own process group, which holds the child too). After a natural exit
    there is no request yet: any stop signal hurries the drain."""
    last_signal, last_when = run.last_stop
    if last_signal is None and run.stop_reason is not None:
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
        _signal_group(run.fs, run.pid, run.pgid, sig)


def _suspend_on_signal(run, sig, when):
    _suspend(run)


def _ignore_signal(run, sig, when):
    pass


class _Actions(object):
    """What each kind of signal does in one state."""
    __slots__ = ("stop", "forwarded", "suspend")

    def __init__(self, stop, forwarded, suspend):
        self.stop, self.forwarded, self.suspend = stop, forwarded, suspend


# What a signal does, by the state of the run: a stop signal (TERM, INT, HUP
# and every other that would end us), a forwarded one (USR1, USR2, WINCH),
# and SIGTSTP. SIGCHLD reaps in every state (_act_on_signals).
_SIGNAL_ACTIONS = {
    "starting": _Actions(stop=_request_stop, forwarded=_ignore_signal, suspend=_ignore_signal),
    "running": _Actions(stop=_request_stop, forwarded=_forward, suspend=_suspend_on_signal),
    "terminating": _Actions(stop=_hurry, forwarded=_forward, suspend=_ignore_signal),
    "killing": _Actions(stop=_hurry, forwarded=_ignore_signal, suspend=_ignore_signal),
    "draining": _Actions(stop=_hurry, forwarded=_ignore_signal, suspend=_ignore_signal),
    "done": _Actions(stop=_ignore_signal, forwarded=_ignore_signal, suspend=_ignore_signal),
}


def _command_exited(run):
    """Has the command exited? Looks without reaping (WNOWAIT)."""
    if run.exit_info is None and run.pid is not None and not run.reaped:
        try:
            info = os.waitid(os.P_PID, run.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is not None:
            run.exit_info = info
    return run.exit_info is not None
# --- Job control: the terminal, Ctrl-Z, forwarded signals ------------------------------------

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
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass  # the terminal went away (hangup): nothing to hand over
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _take_back_terminal(run):
    """Take the terminal back from the command's group, or from whatever group
    of the run held it last and is now empty (a job the command gave it to),
    never from a live group that is not the run's."""
    if run.terminal is None or run.pgid is None:
        return
    try:
        foreground = os.tcgetpgrp(run.terminal)
    except OSError:
        return
    if foreground != os.getpgrp() and (foreground == run.pgid or not _group_exists(foreground)):
        _give_terminal(run.terminal, os.getpgrp())


def _group_exists(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _suspend(run):
    """Ctrl-Z or SIGTSTP: stop the command's group, give the terminal back,
    stop ourselves; on SIGCONT (fg, bg) resume the group, and give it the
    terminal again if we were resumed in the foreground. In an orphaned
    process group the kernel drops SIGTSTP: we do not stop, and the group
    resumes at once."""
    if run.reaped:
        return
    _signal_group(run.fs, run.pid, run.pgid, signal.SIGSTOP)
    _take_back_terminal(run)
    run.catcher.suspend_ourselves()
    if run.terminal is not None and _caller_terminal() is not None:
        _give_terminal(run.terminal, run.pgid)
    _signal_group(run.fs, run.pid, run.pgid, signal.SIGCONT)


def _check_job_control(run):
    """With the terminal handed over, Ctrl-Z stops the command: suspend with
    it. Not under --user: an untrusted command that stops itself must not
    suspend the supervisor, and with it the deadline (at the stop it gets
    SIGCONT with the stop signal, as any stopped member does)."""
    if run.terminal is None or run.plan.user is not None:
        return
    try:
        info = os.waitid(os.P_PID, run.pid, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:
        return
    if info is not None and info.si_code == os.CLD_STOPPED:
        _suspend(run)


# --- The phases of a run ---------------------------------------------------------------------

def _prepare(run):
    """starting: refuse what cannot work; become a subreaper; hold the run
    (its containment); take over signals."""
    _require_linux()
    try:
        import resource  # noqa: F401  now: lifting the fd limit must not need an fd
    except ImportError as e:
        raise SupervisorError("cannot load the resource module (ulimit -n?): %s" % e)
    run.fs = _ProcFS()
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
        _set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:
            run.catcher.pending.append((signal.SIGTERM, _now()))
    run.callers.note(run.fs, run.children)
    if run.plan.stop_path is not None:
        run.watch = _StopFileWatch(run.plan.stop_path)
    _give_memory_back()  # the compiler's garbage: before the fork, which copies it


def _choose_containment(run):
    """The run's containment, chosen once: a cgroup of its own where one can
    be made and is ours to use (--containment auto, the default; cgroup
    insists), else the /proc walk. How the walk enumerates is a level
    below: the children files, or, without them (or with
    SUPERVISOR_CONTAINMENT=scan, how the tests prove the fallback), a scan
    of every process. Reaping, the caller's jobs, descriptors and the record
    of what was drained live beside it."""
    fs, plan = run.fs, run.plan
    scan = os.environ.get("SUPERVISOR_CONTAINMENT") == "scan" or not fs.has_children_files
    run.children = _Children(fs, scan)
    run.callers = _CallersJobs()
    run.reaper = _Reaper(run.children, run.callers)
    run.budget, run.record = _FdBudget(fs), _Record(fs)
    parts = (fs, run.children, run.callers, run.reaper, run.budget, run.record)
    if plan.containment != "proc":
        try:
            home, cgroup = _cgroup_for_run(fs)
        except _NoCgroup as e:
            if plan.containment == "cgroup":
                raise SupervisorError("--containment cgroup: %s; use --containment auto or proc"
                                      % e)
            run.cgroup_unavailable = str(e)
        else:
            run.containment = _CgroupContainment(fs, home, cgroup, _EscapeeWalk(*parts + (None,)),
                                                 run.record, _can_leave_cgroups(plan, home))
            return
    run.containment = _ProcContainment(*parts)


def _cgroup_for_run(fs):
    """(our cgroup, the run's, made in it), or _NoCgroup saying why not. A
    limit that ran out (descriptors, memory) is no reason to fall back: it
    is one line naming the limit, as anywhere else."""
    try:
        home = _find_cgroup_home(fs)
        try:
            return home, _make_run_cgroup(home)
        except BaseException:
            home.close()
            raise
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            raise SupervisorError("cgroup: %s" % _os_error_text(e))
        raise _NoCgroup("%s: %s" % (getattr(e, "filename", None) or "cgroup", e.strerror))


def _can_leave_cgroups(plan, home):
    """Could the command move a process out of the run's cgroup? Root can
    (it writes the pid into another cgroup.procs); a --user command cannot,
    unless that user owns, or may write, a cgroup.procs from our cgroup up.
    Where it cannot, `populated 0` alone confirms; where it can, a /proc
    walk looks for what left (_EscapeeWalk)."""
    user = plan.user
    if user is None or user.uid == 0 or not user.switching:
        return True
    directory = home.shown()
    while True:
        try:
            st = os.stat(os.path.join(directory, "cgroup.procs"))
        except OSError:
            return True  # cannot tell: assume it can
        if st.st_uid == user.uid or st.st_mode & 0o002 or (
                st.st_mode & 0o020 and (st.st_gid == user.gid or st.st_gid in user.groups)):
            return True
        if directory.rstrip("/") == home.mount_point.rstrip("/"):
            return False
        directory = os.path.dirname(directory.rstrip("/"))


def _stopped_before_start(run):
    """A stop signal already received, or a stop file already there: the
    command never starts."""
    _act_on_signals(run)
    if run.stop_reason is None and run.watch is not None and run.watch.exists():
        run.stop_reason = "stop_file"
    return run.stop_reason is not None


class _ExecReport(object):
    """The child's word on its exec, through a CLOEXEC pipe: EOF with nothing
    said means the exec happened (or the child died first); "step errno" means
    it failed. Pending until EOF is read."""

    def __init__(self, fd):
        self.fd, self.data, self.failure = fd, b"", None

    def fileno(self):
        return self.fd

    @property
    def pending(self):
        """Not read to EOF yet: the child may not have reached its exec."""
        return self.fd is not None

    def read(self, block):
        """Read what is there; with block, to EOF (the caller knows the child is
        gone, so the only write end is closed)."""
        if self.fd is None:
            return
        os.set_blocking(self.fd, block)
        try:
            while True:
                chunk = os.read(self.fd, 512)
                if not chunk:
                    break
                self.data += chunk
        except BlockingIOError:
            return
        self.close()
        if self.data:
            step, code, detail = (self.data.decode("utf-8", "replace").split(" ", 2) + [""])[:3]
            self.failure = (step, int(code), detail)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _start_command(run):
    """Fork, and exec COMMAND in a process group of its own (and the run's
    cgroup) with the caller's stdio, environment, signal mask and ignored
    signals."""
    read_end, write_end = _pipe()
    run.fork_rss_kib = _own_rss_kib(run.fs)
    # All signals blocked across fork: the child must not run our handlers.
    own_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _VALID_SIGNALS)
    try:
        run.started_wall, run.started = time.time(), _now()
        run.endtime = run.started + run.plan.timeout
        run.usage_before = _children_usage()
        pid = _acquire("fork", os.fork)
        if pid == 0:
            _exec_command(run, write_end)  # never returns
    except BaseException:
        os.close(read_end)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, own_mask)
        os.close(write_end)
    try:
        os.setpgid(pid, pid)  # also in the parent, so the group exists either way
    except OSError:
        pass  # EACCES: the child has already done it and exec'd
    run.pid = run.pgid = run.reaper.command = pid
    run.containment.started(pid)
    run.report = _ExecReport(read_end)
    if run.terminal is not None:
        _give_terminal(run.terminal, pid)


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
        os.setpgid(0, 0)
        step = "cgroup"
        run.containment.join_in_child()
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
            _libc().call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if run.plan.stop_signal:
            # As timeout(1): should the supervisor be killed, the command gets
            # the stop signal (after the uid switch, which would clear it).
            step = "prctl(PR_SET_PDEATHSIG)"
            _set_parent_death_signal(run.plan.stop_signal)
            if os.getppid() != run.supervisor_pid:
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
    """running: block until the command exits (or its exec fails), the
    deadline passes, the stop file appears or a stop signal arrives."""
    while True:
        run.report.read(block=False)
        if run.report.failure:
            return
        if _command_exited(run):
            run.report.read(block=True)  # the exec report first: a failed exec is no exit
            if run.stop_reason is not None:  # it came with the exit: hurry the drain
                run.stop_reason, run.stop_signal, run.hurry = None, None, True
            return
        now = _now()
        if run.stop_reason is None and now >= run.endtime:
            run.stop_reason = "timeout"
        if run.stop_reason is None and run.watch is not None and run.watch.exists():
            run.stop_reason = "stop_file"
        if run.stop_reason is not None:
            return
        _check_job_control(run)
        endtime = run.endtime if run.watch is None else min(run.endtime, run.watch.due(now))
        _wait(run, endtime)


def _note_exec_failure(run):
    """The child exited without running COMMAND: nothing else ran."""
    step, code, detail = run.report.failure
    if not run.reaped:
        os.waitpid(run.pid, 0)
        run.reaped = True
    # The receipt's pid and return code are the command's, and it never ran
    # (the exit _command_exited() may have seen first is the child's).
    run.pid, run.exit_info = None, None
    reason = detail or os.strerror(code)
    if step == "exec" and not detail:
        run.error = "cannot run %r: %s" % (run.plan.command[0], reason)
        run.error_exit = (EXIT_NOT_FOUND if code in (errno.ENOENT, errno.ENOTDIR)
                          else EXIT_CANNOT_EXECUTE)
    else:
        run.error = "cannot start the command (%s): %s" % (step, reason)
        run.error_exit = EXIT_FAILURE


def _say(run, text):
    """-v: one line on stderr now, if stderr takes it at once (a full pipe
    must not hold up the stop)."""
    if run.plan.verbose:
        _complain(text, patient=False)


def _why_stopped(run):
    if run.stop_reason == "timeout":
        return "the deadline passed (%gs)" % run.plan.timeout
    if run.stop_reason == "stop_file":
        return "the stop file %s appeared" % run.plan.stop_path
    return "%s received" % _signal_name(run.stop_signal)


def _take_the_cpu(run):
    """A forced stop competes for the CPU with whatever of the run still
    runs in our session (the command's group is in it). Where we may
    (CAP_SYS_NICE) the cleanup runs at nice -20, given back at done. Only our
    own priority: it dies with us. (The session's autogroup, which would
    also outrank processes in sessions of their own, is shared with the
    caller and outlived a SIGKILL of ours: it is left alone. With a cgroup
    of the run's own, a storm ends at once and needs no priority.)"""
    if not _has_capability(_CAP_SYS_NICE, run.fs):
        return
    try:
        run.saved_nice = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, -20)
    except (OSError, ValueError):
        run.saved_nice = None


def _give_back_the_cpu(run):
    saved, run.saved_nice = run.saved_nice, None
    if saved is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, saved)
        except (OSError, ValueError):
            pass


def _drive(run):
    """The driver, once the run is prepared: the states of a run, in order,
    and the phase each one runs. It alone moves the state.

        starting     a stop asked for already: done, the command never starts
        running      until the command exits, the deadline, the stop file
                     or a stop signal
        terminating  freeze; keep what the policy keeps; look; the stop
                     signal; thaw; the grace
        killing      (a forced stop) SIGKILL; the command's own process
        draining     everything else of the run, until confirmed
        done         the receipt's last looks
    """
    if _stopped_before_start(run):
        _enter(run, "done")
        return
    run.terminal = _caller_terminal()
    try:
        _start_command(run)
        _enter(run, "running")
        _run_until_stop(run)
        _leave_running(run)
        if run.report.failure:
            _note_exec_failure(run)
            _enter(run, "done")
            return
        keep = _keep_what(run)
        if run.stop_reason is not None:
            if run.report.pending:
                run.containment.join_before_stop(run.pid)
            _take_the_cpu(run)
            _say(run, "stopping the run: %s; %s" % (_why_stopped(run), _first_signal(run)))
            endtime = _enter(run, "terminating")
            _stop_and_wait(run, _look_frozen(run, keep, endtime), endtime)
            _kill_command(run, _enter(run, "killing"))
        else:
            members = _look_frozen(run, keep, _now() + run.plan.cleanup_timeout)
            if members:
                _stop_and_wait(run, members, _enter(run, "terminating"))
            else:
                run.containment.thaw()
        if keep != _KEEP_EVERYTHING:
            _drain(run, _enter(run, "draining"))
            if keep != _KEEP_OUTSIDE_GROUP:
                _drain_strays(run)
        _enter(run, "done")
        _finish(run)
    except Exception as e:
        if run.pid is None:
            raise  # the fork itself failed: nothing started, nothing to end
        _fail(run, e)
        if run.state not in ("draining", "done"):
            _drain_after_failure(run, _enter(run, "draining"))
        if run.state != "done":
            _enter(run, "done")
        _reap_after_failure(run)
        _note_survivors(run)


def _leave_running(run):
    if run.watch is not None:
        run.watch.retire()  # now, so that closing it at exit costs nothing
    if run.stop_reason is None:
        _take_back_terminal(run)


def _first_signal(run):
    if not run.plan.stop_signal:
        return "no signal first (-s 0): the grace, then SIGKILL"
    return "%s to the run" % _signal_name(run.plan.stop_signal)


def _keep_what(run):
    """What the policy keeps out of the drain, for this ending.
    drain-all: nothing. keep-services: at a forced stop the detached
    services (our children outside the group, adopted before the decision);
    at a natural exit every process outside the group.
    preserve-descendants-on-success: everything, when the command exited by
    itself with status 0 and nothing stopped the run; else nothing."""
    policy, forced = run.plan.policy, run.stop_reason is not None
    if policy == "keep-services":
        return _KEEP_DETACHED if forced else _KEEP_OUTSIDE_GROUP
    if policy == "preserve-descendants-on-success" and not forced and _succeeded(run):
        return _KEEP_EVERYTHING
    return _KEEP_NOTHING


def _succeeded(run):
    """Exited by itself with 0, with no stop asked for (not even one that came
    with the exit), and no stop file there now."""
    return (run.exit_info is not None and _return_code(run.exit_info) == 0
            and not run.hurry and not (run.watch is not None and run.watch.exists()))


def _look_frozen(run, keep, endtime):
    """Frozen, no member can die and hand us its children, nor fork, before
    what is kept is taken out of the drain and the rest is seen: each one
    the stop may end is recorded. Returns the members to end."""
    containment = run.containment
    frozen = containment.freeze()
    if frozen is not None:
        _wait_for(run, frozen, min(endtime, _now() + _FREEZE_LIMIT))
    containment.keep(keep, endtime)
    run.record.on = True
    return containment.members(endtime)


def _stop_and_wait(run, members, endtime):
    """The stop signal (a stopped process still dies at once of a SIGTERM it
    does not handle: the kernel's fatal-signal shortcut), thaw, and the
    grace: until each member has exited, `endtime`, or a later stop signal
    asks to hurry."""
    containment = run.containment
    containment.signal(run.plan.stop_signal, endtime)
    containment.thaw()
    waiter = containment.waiter(members)
    try:
        if not _wait_for(run, waiter, endtime, interruptible=True):
            run.killed = True
            _say(run, "the grace ran out (%gs)%s: SIGKILL" % (
                run.plan.cleanup_timeout, " (hurried)" if run.hurry else ""))
    finally:
        waiter.close()


def _kill_command(run, endtime):
    """SIGKILL what can be killed at once (the group; with a cgroup, the
    whole run), even when all seemed gone: a member forked during the grace
    must not fork again while the drain looks. Then up to cleanup_timeout
    for the command's own process (it may sit in D state)."""
    run.containment.kill(endtime)
    while not _command_exited(run) and _now() < endtime:
        _wait(run, endtime)  # SIGCHLD wakes us


def _drain(run, endtime):
    """draining: SIGKILL everything in scope, round after round, until a
    stable look finds nothing alive, within one budget; then a last SIGKILL
    pass and the confirming look, within _FINAL_PASS_LIMIT."""
    containment = run.containment
    while _now() < endtime:
        round_ = containment.kill_round(endtime)
        try:
            if round_.clear:
                run.survivors, run.stable = containment.confirm(endtime, round_)
                if run.stable and not run.survivors:
                    return
            _wait_for(run, round_.waiter, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
        finally:
            round_.close()
    run.killed = True
    final_endtime = _now() + _FINAL_PASS_LIMIT
    containment.kill_round(final_endtime).close()
    run.survivors, run.stable = containment.confirm(final_endtime)


def _drain_strays(run):
    """After the confirmation: a kept service that died since then handed its
    children (left alone while it lived) to us. Adopted after the decision,
    they are the run's (with a cgroup: only what left the cgroups): drain
    them too, and look again, within _FINAL_PASS_LIMIT, so that what the
    receipt keeps and what it confirms cover every process of the run."""
    containment = run.containment
    endtime = _now() + _FINAL_PASS_LIMIT
    while not run.survivors and run.stable:
        strays = containment.strays(endtime)
        if _now() >= endtime:  # out of time, perhaps before the look was whole
            run.survivors, run.stable = strays, False
            return
        if not strays:
            return
        round_ = containment.drain_strays(endtime)
        try:
            _wait_for(run, round_.waiter, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
        finally:
            round_.close()
        run.survivors, run.stable = containment.confirm(endtime)


def _finish(run):
    """done: the run is drained; now the command's zombie may go. The
    services kept are those alive now; then the last looks."""
    _give_back_the_cpu(run)
    _reap_command(run)
    containment = run.containment
    endtime = _now() + _FINISH_LIMIT
    run.preserved = containment.preserved(endtime)
    if not run.survivors and run.stable:
        run.survivors = containment.last_look(endtime, run.preserved)
    if _now() >= endtime:  # a look cut short claims nothing
        run.stable = False
    run.unattributed = [p for p in run.callers.unattributed.values() if _alive(run.fs, p)]
    if run.plan.user is not None and run.plan.user.switching:
        run.foreign = _foreign_processes(run, _now() + _FINISH_LIMIT)
    _note_survivors(run)


def _reap_command(run):
    run.reaper.command = None  # from now on the command may be reaped
    if _command_exited(run) and not run.reaped:
        if run.report is not None:
            run.report.read(block=True)
        if run.report is not None and run.report.failure:
            _note_exec_failure(run)
        else:
            os.waitid(os.P_PID, run.pid, os.WEXITED)
            run.reaped = True
    run.reaper.next_list_reap = 0  # the last reap: a zombie of the caller's hides none of ours
    run.reaper.reap_exited()


def _alive(fs, proc):
    now = fs.stat(proc.pid)
    return now is not None and now.live and now.start == proc.start


def _foreign_processes(run, endtime):
    """--user: processes of that uid that started after the run began and
    are not of its tree (one scan of /proc, by the owner of each entry).
    Another sandbox of the same uid, or a process the command took over
    (ptrace), cannot be told from the run's: they keep it from being
    confirmed. Give each sandbox a uid of its own."""
    uid, me = run.plan.user.uid, os.getpid()
    started = _boot_ticks(run.fs, run.started_wall)
    found, ours = [], set()
    for name in run.fs.listing(".") or ():
        if _now() >= endtime:
            run.stable = False
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
    whole = True
    if not run.survivors and not _confirmed(run):
        try:
            run.survivors, whole = run.containment.census(_now() + _CENSUS_LIMIT)
        except Exception:  # a look that failed (or what failed the run): count unknown
            whole = False
    run.survivors_count = len(run.survivors) if whole else None
    run.survivors = run.survivors[:_SURVIVORS_LIMIT]


def _finish_containment(run):
    """What the containment reads and removes at the end (a cgroup: its
    usage, then the cgroup itself), whatever way the run ended."""
    finish = getattr(run.containment, "finish", None)
    if finish is not None:
        try:
            finish(_confirmed(run))
        except OSError:
            pass  # it stays, and the receipt names it


def _confirmed(run):
    return (not run.survivors and run.stable and not run.failed and not run.unattributed
            and not run.foreign)


def _fail(run, error):
    """The supervisor itself failed once the command had started (a bug, a
    resource it cannot get): end what it started rather than leave it
    unsupervised (SIGKILL the group, whose leader is still held; with a
    cgroup, all of the run); the drain that follows is best effort, and the
    receipt says so: not confirmed, whatever the drain saw."""
    run.failed = True
    run.error = ("supervisor failed: %s" % error if isinstance(error, SupervisorError)
                 else "supervisor failed: %s: %s" % (type(error).__name__, error))
    _abandon(run)


def _drain_after_failure(run, endtime):
    try:
        _drain(run, endtime)
    except Exception:
        pass  # what failed may fail again: the receipt already says not confirmed


def _reap_after_failure(run):
    """The command was SIGKILLed: wait for it (within cleanup_timeout), then
    reap it, so that an API caller is left no zombie."""
    try:
        endtime = _now() + run.plan.cleanup_timeout
        while not _command_exited(run) and _now() < endtime:
            _wait(run, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
        _reap_command(run)
    except Exception:
        pass


def _abandon(run):
    """Kill the command's group (its leader is still held, so the id is
    ours) and, with a cgroup, the whole run; give back the CPU priority."""
    if run.pid is not None and not run.reaped:
        _quietly_signal(run.pgid, signal.SIGKILL, group=True)
        _quietly_signal(run.pid, signal.SIGKILL)
        try:
            run.containment.kill(_now())
        except Exception:
            pass  # it is what failed, perhaps
    _give_back_the_cpu(run)


def _release(run):
    """Give back what the run took: terminal, fds, signals, subreaper bit.
    Each step is best effort: the receipt no longer depends on it."""
    steps = [lambda: _take_back_terminal(run), lambda: _give_back_the_cpu(run)]
    for part in (run.watch, run.report, run.containment, run.budget, run.fs, run.catcher):
        if part is not None:
            steps.append(part.close)
    if run.subreaper_before is False:
        steps.append(lambda: _set_subreaper(False))
    for step in steps:
        try:
            step()
        except Exception:
            pass
# --- The receipt --------------------------------------------------------------------------------

def _iso_utc(timestamp):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp)) + (
        ".%06dZ" % int(timestamp % 1 * 1e6))


def _exit_status(run, confirmed):
    if not confirmed:
        return EXIT_FAILURE
    if run.error_exit is not None:
        return run.error_exit
    code = _return_code(run.exit_info) if run.exit_info is not None else None
    if run.plan.preserve_status and code is not None:
        return code if code >= 0 else 128 - code
    if run.stop_reason is not None and code == -signal.SIGKILL:
        return EXIT_KILLED  # as timeout(1): the stop had to end it with SIGKILL
    if run.stop_reason in ("timeout", "stop_file"):
        return EXIT_TIMED_OUT
    if run.stop_reason == "signal":
        return 128 + run.stop_signal
    return code if code >= 0 else 128 - code


def _children_usage():
    import resource
    return resource.getrusage(resource.RUSAGE_CHILDREN)


def _usage(run):
    """What the run cost. With a cgroup, its CPU from cpu.stat (every process
    it held, reaped or not) and memory.peak where the memory controller is
    on; else the CPU of every process of the run that was reaped, directly or
    below one that was (RUSAGE_CHILDREN as the subreaper sees it). Either
    way max_rss_kib is the largest peak RSS of one reaped process (the
    kernel keeps a maximum, not a sum), which for the command's own process
    starts at fork_rss_kib: it begins as a copy of the supervisor, and the
    kernel keeps that peak through its exec."""
    usage = {"source": "rusage", "cpu_user_s": 0.0, "cpu_system_s": 0.0, "max_rss_kib": 0,
             "memory_peak_kib": None, "fork_rss_kib": run.fork_rss_kib}
    if run.usage_before is not None:
        now, before = _children_usage(), run.usage_before
        usage.update(cpu_user_s=now.ru_utime - before.ru_utime,
                     cpu_system_s=now.ru_stime - before.ru_stime, max_rss_kib=now.ru_maxrss)
    from_cgroup = run.containment.usage() if run.containment is not None else None
    if from_cgroup is not None:
        usage.update(from_cgroup)
    usage["cpu_user_s"] = round(usage["cpu_user_s"], 6)
    usage["cpu_system_s"] = round(usage["cpu_system_s"], 6)
    return usage


def _build_receipt(run, ended_wall, ended):
    confirmed = _confirmed(run)
    ladder = [{"step": name, "start_s": round(begin - run.started, 6),
               "duration_s": round((end or ended) - begin, 6)} for name, begin, end in run.ladder]
    cleanup_s = ended - run.ended_running if run.ended_running is not None else 0.0
    fs = run.fs
    drained = run.record.drained(run.survivors) if run.record is not None else []
    containment = run.containment.fields() if run.containment is not None else {
        "containment": None}
    receipt = {
        "schema_version": RECEIPT_SCHEMA_VERSION,
        "supervisor_version": __version__,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "command": [_text(arg) for arg in run.plan.command],
        "workdir": _text(run.plan.workdir),
        "pid": run.pid,
        "supervisor_pid": os.getpid(),
        "started_at": _iso_utc(run.started_wall),
        "ended_at": _iso_utc(ended_wall),
        "duration_s": round(ended - run.started, 6),
        "timeout_s": run.plan.timeout,
        "cleanup_timeout_s": run.plan.cleanup_timeout,
        "policy": run.plan.policy,
        "stop_signal": _signal_name(run.plan.stop_signal) if run.plan.stop_signal else None,
        "stop_reason": run.stop_reason or "exit",
        "signal": _signal_name(run.stop_signal) if run.stop_signal else None,
        "timed_out": run.stop_reason == "timeout",
        "return_code": _return_code(run.exit_info) if run.exit_info is not None else None,
        "exit_status": _exit_status(run, confirmed),
        "cleanup_confirmed": confirmed,
        "cleanup_s": round(cleanup_s, 6),
        "ladder": ladder,
        "containment": containment["containment"],
        "cgroup": containment.get("cgroup"),
        "kept_cgroup": containment.get("kept_cgroup"),
        "cgroup_unavailable": run.cgroup_unavailable,
        "user": ({"uid": run.plan.user.uid, "gid": run.plan.user.gid}
                 if run.plan.user is not None else None),
        "preserved": [_entry(fs, p, start_time=p.start) for p in run.preserved],
        "survivors": [_entry(fs, p, ppid=p.ppid, pgid=p.pgid, sid=p.sid, state=p.state)
                      for p in run.survivors],
        "survivors_count": run.survivors_count,
        "unattributed": [_entry(fs, p, start_time=p.start, why="a caller's job's group")
                         for p in run.unattributed] + [
            _entry(fs, p, start_time=p.start, why="uid %d, outside the run" % run.plan.user.uid)
            for p in run.foreign],
        "drained": [_argv_entry({"pid": identity[0]}, argv)
                    for identity, argv in drained[:_DRAINED_LIMIT]],
        "drained_count": len(drained),
        "omitted": {},
        "usage": _usage(run),
        "error": _text(run.error) if run.error is not None else None,
    }
    return _fit(receipt)


def _entry(fs, proc, **fields):
    fields["pid"] = proc.pid
    return _argv_entry(fields, fs.argv(proc))


def _argv_entry(fields, argv):
    """An entry with its command: argv (cut at _ARGV_LIMIT bytes, then
    "command_truncated"), or null when it was not read (see _Argv)."""
    argv = argv if argv is not None else _UNREAD
    fields["command"] = argv.words
    if argv.truncated:
        fields["command_truncated"] = True
    return fields


# What _fit() drops, first to last, when a receipt would pass _RECEIPT_LIMIT:
# the evidence of what was drained, then of what survived, then the commands
# of what was kept (its pids and start times stay: the owner ends them by
# those), and the kept entries themselves last.
_TRIMMED_LISTS = ("drained", "survivors", "unattributed", "preserved")


def _fit(receipt):
    """The receipt within _RECEIPT_LIMIT bytes, whatever the command did:
    entries are dropped from the end of its lists (see _TRIMMED_LISTS), and
    `omitted` says how many of each."""
    size = len(_json(receipt))
    if size <= _RECEIPT_LIMIT:
        return receipt
    omitted = receipt["omitted"]
    for key in _TRIMMED_LISTS:
        if key == "preserved":
            for entry in receipt[key]:
                if size <= _RECEIPT_LIMIT:
                    break
                if entry["command"]:
                    size -= len(_json(entry["command"])) - len("null")
                    entry["command"] = None
                    omitted["preserved_commands"] = omitted.get("preserved_commands", 0) + 1
        entries = receipt[key]
        while entries and size > _RECEIPT_LIMIT:
            size -= len(_json(entries.pop())) + 2
            omitted[key] = omitted.get(key, 0) + 1
    return receipt


def _text(value):
    """Valid Unicode for the receipt: bytes decoded, and the lone surrogates of
    undecodable bytes (surrogateescape) replaced, as strict JSON readers want."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)


_JSON_ESCAPES = dict((i, "\\u%04x" % i) for i in range(0x20))
_JSON_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n",
                      ord("\r"): "\\r", ord("\t"): "\\t", ord("\b"): "\\b",
                      ord("\f"): "\\f"})


def _json(value, indent="", memo=None):
    """JSON as json.dumps(indent=2, ensure_ascii=True) writes it, without its
    import (json pulls in re: ms on every run that writes a receipt). Within
    one call, a list of strings is encoded once: a drain of 1,000 forks of
    one program lists one argv a thousand times."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "null"
    if isinstance(value, str):
        try:
            value.encode("ascii")
        except UnicodeEncodeError:
            return _json_non_ascii(value)
        if "\x7f" in value:
            return _json_non_ascii(value)
        return '"%s"' % value.translate(_JSON_ESCAPES)  # the usual case: ASCII, fast
    memo = {} if memo is None else memo
    inner = indent + "  "
    if isinstance(value, dict):
        items = ["%s%s: %s" % (inner, _json(str(k)), _json(v, inner, memo))
                 for k, v in value.items()]
        return "{\n%s\n%s}" % (",\n".join(items), indent) if items else "{}"
    key = None
    if all(type(v) is str for v in value):
        key = (indent,) + tuple(value)
        if key in memo:
            return memo[key]
    items = [inner + _json(v, inner, memo) for v in value]
    text = "[\n%s\n%s]" % (",\n".join(items), indent) if items else "[]"
    if key is not None:
        memo[key] = text
    return text


def _json_non_ascii(text):
    """json's own C encoder, imported only for such text (an argv of invalid
    UTF-8 is all U+FFFD): by hand, 8 MB of it took 8 s."""
    from json.encoder import encode_basestring_ascii
    return encode_basestring_ascii(text)


def write_receipt(receipt, path):
    """Write receipt to path atomically, creating missing directories: an
    unnamed file in the same directory, written and fsynced, linked under a
    name nobody can guess, renamed over path (a symlink there is replaced,
    never followed), the directory fsynced. A reader sees no file or a whole
    receipt; nothing else is left, whatever fails. Errors are OSErrors that
    name path."""
    target = _ReceiptTarget(path)
    try:
        target.write(receipt)
    finally:
        target.close()


class _ReceiptTarget(object):
    """Where a receipt will land, settled once: its directory (made if
    missing) resolved and held open, so a directory swapped during the run
    cannot move the receipt, and the name in it, never followed. Where the
    filesystem has O_TMPFILE, the unnamed file the receipt is written to is
    opened now, so that writing it later needs no new descriptor."""

    def __init__(self, path):
        self.path = _absolute(path, "--receipt")
        directory, self.name = os.path.split(self.path)
        self.directory_as_given = directory
        self.dir_fd = self.proc_fd = self.file_fd = None
        self.writer = _writer_identity()
        self.created = _make_directories(directory, self.path)
        try:
            self.dir_fd, self.can_sync = _open_directory(directory, self.path)
            self.check_name()
            self._remove_leftovers()
            self.file_fd = self._open_unnamed()
            if self.file_fd is not None:
                # Now, not at the write: by then fds may be starved, or /proc mounted over.
                self.proc_fd = _high_fd(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY
                                                | os.O_CLOEXEC))
            self.directory = _real_directory(self.dir_fd, directory)
        except BaseException:
            self.discard()
            raise

    def check_name(self):
        """What is at the name now: nothing, a regular file or a symlink (both
        replaced by the rename); anything else is refused (see _not_a_receipt)."""
        try:
            st = os.lstat(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _path_error(e, self.path)
        if st.st_mode & 0o170000 == 0o040000:
            raise IsADirectoryError(errno.EISDIR, "a directory is there; name a file", self.path)
        why = _not_a_receipt(os.path.join(self.directory_as_given, self.name), st)
        if why:
            raise OSError(errno.EEXIST, why + "; name a regular file", self.path)

    def _open_unnamed(self):
        try:
            return _high_fd(os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o644,
                                    dir_fd=self.dir_fd))
        except (AttributeError, OSError) as e:
            if getattr(e, "errno", None) not in (None, errno.EOPNOTSUPP, errno.EISDIR,
                                                 errno.EINVAL, errno.ENOENT):
                raise _path_error(e, self.path)
        # No O_TMPFILE here: prove now that a named temporary can be made.
        name, fd = self._create_named()
        os.close(fd)
        self._unlink(name)
        return None

    def _temporary_names(self):
        """Names beside the receipt that nobody can guess, a few tries' worth,
        each naming its writer (pid and start time) so that a later run can
        tell a leftover of a dead writer (a SIGKILL mid-write) from a write
        under way."""
        for _ in range(16):
            yield ".%s.%s-%s.tmp" % (self.name, self.writer, os.urandom(8).hex())

    def _remove_leftovers(self):
        """Temporary files of earlier writers of this receipt that died: regular
        files of ours only (a FIFO or a symlink under such a name was planted,
        not left by a writer)."""
        prefix, suffix = "." + self.name + ".", ".tmp"
        try:
            names = os.listdir(self.dir_fd)
        except OSError:
            return  # a directory we may write but not read: nothing to list
        for name in names:
            if name.startswith(prefix) and name.endswith(suffix):
                writer = name[len(prefix):-len(suffix)].partition("-")[0]
                pid, _, start = writer.partition(".")
                if (pid.isdigit() and start.isdigit() and _start_time(int(pid)) != int(start)
                        and self._ours_and_regular(name)):
                    self._unlink(name)

    def _ours_and_regular(self, name):
        try:
            st = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return st.st_mode & 0o170000 == 0o100000 and st.st_uid == os.geteuid()

    def _create_named(self):
        """A temporary file under a random name (O_EXCL: never one planted)."""
        for name in self._temporary_names():
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=self.dir_fd)
                return name, _high_fd(fd)
            except FileExistsError:
                continue
            except OSError as e:
                raise _path_error(e, self.path)
        raise OSError(errno.EEXIST, "no free temporary name", self.path)

    def remove_stale(self):
        """Remove an earlier receipt: from now on, no receipt at the path means
        this run's cleanup was not confirmed."""
        self.check_name()
        try:
            os.unlink(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise _path_error(e, self.path, "cannot remove the earlier receipt")

    def write(self, receipt):
        data = (_json(receipt) + "\n").encode("ascii")
        temporary = None
        try:
            if self.file_fd is not None:
                fd = self.file_fd
                _write_all(fd, data)
                os.fsync(fd)
                temporary = self._link_unnamed(fd)
            else:
                temporary, fd = self._create_named()
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(temporary, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            temporary = None
            if self.can_sync:
                os.fsync(self.dir_fd)
        except OSError as e:
            raise _path_error(e, self.path)
        finally:
            if temporary is not None:
                self._unlink(temporary)

    def _link_unnamed(self, fd):
        """Give the unnamed file a random name, through /proc/self/fd (linkat
        with AT_SYMLINK_FOLLOW: no privilege needed, unlike AT_EMPTY_PATH)."""
        for name in self._temporary_names():
            try:
                os.link("self/fd/%d" % fd, name, src_dir_fd=self.proc_fd,
                        dst_dir_fd=self.dir_fd, follow_symlinks=True)
                return name
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, "no free temporary name")

    def _unlink(self, name):
        try:
            os.unlink(name, dir_fd=self.dir_fd)
        except OSError:
            pass

    def close(self):
        for name in ("file_fd", "proc_fd", "dir_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def discard(self):
        """A refusal: close, and remove the directories this target made."""
        self.close()
        for directory in reversed(self.created):
            try:
                os.rmdir(directory)
            except OSError:
                pass


def _not_a_receipt(path, st):
    """Why what is at path (lstat st) is no receipt to replace, or None. A
    regular file, or a symlink (replaced, never followed), is one; a device,
    FIFO or socket is not; nor a symlink that leads to one, or into /proc or
    /dev (/dev/stdout: /proc/self/fd/1), which says the caller meant that,
    not a file: the rename would destroy the link."""
    kind = st.st_mode & 0o170000
    if kind == 0o100000:
        return None
    if kind != 0o120000:
        return "a device, FIFO or socket is there"
    for hop in _link_hops(path):
        if hop.split("/")[1:2] in (["proc"], ["dev"]):
            return "a symlink into /proc or /dev is there (to %s)" % hop
    target = os.path.realpath(path)
    try:
        followed = os.stat(path)
    except OSError:
        return None  # dangling (or unreadable): nothing there to mistake
    if followed.st_mode & 0o170000 != 0o100000:
        return "a symlink to what is not a regular file is there (%s)" % target
    return None


def _link_hops(path, limit=40):
    """Where each symlink on the way from path leads, hop by hop: judged by
    its final target alone, /dev/stdout of a process whose stdout is a log
    file would pass for that file (/dev/stdout -> /proc/self/fd/1 -> log)."""
    hops = []
    while len(hops) < limit:
        try:
            text = os.readlink(path)
        except OSError:
            break  # not a link (any more), or gone: the end of the chain
        # Where the kernel goes next: the target's directory as it resolves
        # (itself perhaps through a link into /proc), then the name.
        target = os.path.join(os.path.dirname(path), text)
        path = os.path.join(os.path.realpath(os.path.dirname(target)), os.path.basename(target))
        hops.append(path)
    return hops


def _writer_identity():
    """"pid.starttime" of this process, for temporary names."""
    return "%d.%d" % (os.getpid(), _start_time(os.getpid()) or 0)


def _start_time(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2:].split()[19])


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _path_error(e, path, what=None):
    """The OSError e, naming path (and what was being done)."""
    reason = e.strerror or str(e)
    return OSError(e.errno, "%s: %s" % (what, reason) if what else reason, path)


def _make_directories(directory, path):
    """os.makedirs that remembers what it made, and undoes it on failure."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    created = []
    for name in reversed(missing):
        try:
            os.mkdir(name, 0o755)
        except OSError as e:
            for made in reversed(created):
                os.rmdir(made)
            raise _path_error(e, path, "cannot create %s" % name)
        created.append(name)
    return created


def _open_directory(directory, path):
    """The directory held open: readable when we may (so it can be fsynced),
    else by O_PATH, which still serves every *at() call we make."""
    flags = os.O_DIRECTORY | os.O_CLOEXEC
    try:
        return _high_fd(os.open(directory, os.O_RDONLY | flags)), True
    except PermissionError:
        pass
    except OSError as e:
        raise _path_error(e, path)
    try:
        return _high_fd(os.open(directory, os.O_PATH | flags)), False
    except OSError as e:
        raise _path_error(e, path)


def _real_directory(fd, fallback):
    try:
        return os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return os.path.realpath(fallback)


# --- The API -----------------------------------------------------------------------------------

def exec_timeout(timeout, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT):
    """The bound a controller gives the exec that runs the supervisor: the
    deadline, each bounded cleanup phase, and slack for start-up and I/O."""
    return timeout + CLEANUP_PHASE_COUNT * cleanup_timeout + EXEC_TIMEOUT_SLACK


def supervise(command, timeout, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT, stop_path=None,
              *, workdir=None, stop_with_parent=None, user=None, policy="drain-all",
              stop_signal="TERM", receipt=None, verbose=False, containment="auto"):
    """Run command under a deadline, drain what it leaves, return the receipt.

    command is an argv list of str (or bytes); timeout and cleanup_timeout
    are seconds; the run is stopped when anything exists at stop_path;
    workdir is the command's current directory; user ("name", "uid",
    "name:group") the user it runs as, with no way back to root. policy is
    one of POLICIES (what the run keeps: by default nothing), stop_signal
    the first signal of a stop (a name, a number, or 0 for none), receipt a
    path to write the receipt to, as --receipt does (outside the workdir,
    the earlier one removed first, atomically), verbose as -v, containment
    one of CONTAINMENTS. stop_with_parent, the pid of this process's parent,
    stops the run as SIGTERM would when that parent dies (even if the caller
    ignored SIGTERM; the command starts with SIGTERM at its default). Must
    run in the main thread of a single-threaded process on Linux; the
    children it already has stay its own (never signalled, never reaped).
    Raises SupervisorError (UsageError for bad arguments) before anything
    starts. Once the command started, a receipt always comes back: a command
    that cannot be executed, a failure of the supervisor itself (the run is
    then ended and drained as far as it can be), or a receipt that could not
    be written, is in its error and exit_status. The caller's signal
    handlers, mask and subreaper bit are restored when it returns.
    """
    target = None
    try:
        plan = _make_plan(command, timeout, cleanup_timeout, stop_path, workdir,
                          stop_with_parent, policy=_check_choice(policy, POLICIES, "policy"),
                          containment=_check_choice(containment, CONTAINMENTS, "containment"),
                          stop_signal=_parse_signal(str(stop_signal), "stop_signal"),
                          verbose=bool(verbose))
        if receipt is not None:
            target = _receipt_target(receipt, plan.workdir)
        if user is not None:
            plan.user = _check_user(user, plan.workdir)
            if target is not None:
                _check_user_may_not_replace(plan.user, target)
        if plan.stop_path is not None:
            _check_stop_file(plan.stop_path, target)
    except BaseException:
        _no_receipt_left(target, receipt)
        raise
    run = _Run(plan)
    try:
        result = _execute(run)
    except BaseException:
        _no_receipt_left(target, receipt)
        raise
    finally:
        _release(run)
    if target is not None:
        _write_or_say(target, result)
    return result


def _write_or_say(target, receipt):
    """Write the receipt; if it cannot be, the returned one says so."""
    try:
        target.write(receipt)
    except OSError as e:
        receipt["exit_status"] = EXIT_FAILURE
        receipt["error"] = _text("%s--receipt: cannot write %s: %s" % (
            receipt["error"] + "; " if receipt["error"] else "", e.filename, e.strerror))
    finally:
        target.close()


def _check_choice(value, choices, name):
    if value not in choices:
        raise UsageError("%s: %r is not one of %s" % (name, value, ", ".join(choices)))
    return value


def _make_plan(command, timeout, cleanup_timeout, stop_path, workdir, stop_with_parent,
               **more):
    return _Plan(_check_command(command), _check_seconds(timeout, "timeout"),
                 _check_seconds(cleanup_timeout, "cleanup_timeout"),
                 _absolute(stop_path, "--stop-file") if stop_path is not None else None,
                 _absolute(workdir, "--workdir") if workdir is not None else _current_directory(),
                 stop_with_parent, **more)


def _current_directory():
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError("the current directory was deleted; give --workdir (or cd somewhere)")


def _absolute(path, option):
    """os.path.abspath, with a clear refusal when a relative path meets a
    deleted current directory, or when its `..` would not mean what the
    text says: after a symlink, the kernel's `..` is the parent of where the
    link leads, so link/../x is judged and used as one path and read by a
    controller as another."""
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.getcwd(), path)
        except FileNotFoundError:
            raise UsageError("%s: %s is relative and the current directory was deleted; "
                             "give an absolute path" % (option, path))
    parts = path.split("/")
    for i, part in enumerate(parts):
        upto = "/".join(parts[:i + 1])
        if part == ".." and os.path.realpath(upto) != os.path.realpath(os.path.normpath(upto)):
            raise UsageError("%s: %s has a '..' after a symlink; give the path without it"
                             % (option, path))
    return os.path.normpath(path)


def _execute(run):
    """starting, then the driver; returns the receipt. Raises SupervisorError
    before the command starts. Once it started, a failure of ours still ends
    in a receipt, one that does not confirm the cleanup."""
    try:
        _prepare(run)
        _drive(run)
    except BaseException:
        _abandon(run)
        if run.containment is not None and run.pid is None:
            run.containment.close()  # nothing started: the cgroup made for it goes
        raise
    ended_wall, ended = time.time(), _now()
    _take_back_terminal(run)
    _finish_containment(run)
    # From here on no signal is taken (a flood of queued ones cannot delay the
    # receipt); they stay pending until we exit (the CLI) or are discarded
    # when the caller's handlers come back (the API).
    run.catcher.hold()
    return _build_receipt(run, ended_wall, ended)


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
    command = list(command)
    for arg in command:
        if not isinstance(arg, (str, bytes)):
            raise UsageError("command: arguments must be strings, not %r" % (arg,))
        if ("\0" if isinstance(arg, str) else b"\0") in arg:
            raise UsageError("command: %r holds a NUL byte" % (arg,))
    return command


# --- The owner's teardown: --end-kept -----------------------------------------------------------

def end_kept(receipt, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT):
    """End what a receipt (a dict, as written) kept, and their descendants,
    with SIGKILL: in cgroup mode the whole kept cgroup at once; else each
    kept process whose start time is the receipt's, and what descends from
    it, frozen and killed children first, each proven by a pidfd. A pid
    whose start time differs (reused, or a forged receipt) is left alone.
    Returns (all gone: bool, one line saying what was done)."""
    fs = _ProcFS()
    try:
        roots, exited, left_alone = _kept_roots(fs, receipt.get("preserved") or [])
        try:
            endtime = _now() + _check_seconds(cleanup_timeout, "cleanup_timeout")
            done, ended, note = _end_kept_cgroup(fs, receipt, roots, endtime)
            outside = [pin for pin in roots if not pin.in_cgroup]
            gone, count = _end_trees(fs, outside, endtime)
            done, ended = done and gone, ended + count
        finally:
            _close_pins(roots)
    finally:
        fs.close()
    if not receipt.get("kept_cgroup") and (exited or left_alone):
        # What a kept process that exited started went to init: no cgroup
        # holds it, no pid leads there. Nothing can be said of it.
        done = False
        if exited:
            note = (note + "; " if note else "") + (
                "%s exited before: what it started cannot be found without a cgroup"
                % ", ".join(str(pid) for pid in exited))
    words = ["ended %d process(es)" % ended] + ([note] if note else []) + [
        "left alone: %s" % ", ".join(left_alone)] * bool(left_alone)
    return done, ("all kept processes are gone: " if done else "NOT all gone: ") + "; ".join(words)


class _RootPin(_Pin):
    __slots__ = ("in_cgroup",)

    def __init__(self, proc, fd):
        _Pin.__init__(self, proc, fd)
        self.in_cgroup = False


def _kept_roots(fs, entries):
    """Pins on the receipt's kept processes that are still those processes:
    pinned first, then their start time read (a pid reused since cannot
    pass); the pids of those that exited; and what was left alone."""
    roots, exited, left_alone = [], [], []
    for entry in entries:
        pid, start = entry.get("pid"), entry.get("start_time")
        if not isinstance(pid, int) or not isinstance(start, int) or pid <= 1:
            left_alone.append("%r (not a pid and start time)" % (pid,))
            continue
        try:
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            exited.append(pid)
            continue
        if fd is None:
            raise SupervisorError("--end-kept needs pidfds (Linux 5.3) to prove a pid is the "
                                  "kept process")
        proc = fs.stat(pid)
        if proc is None or not proc.live or _readable(fd):
            os.close(fd)
            exited.append(pid)
            continue
        if proc.start != start:
            os.close(fd)
            left_alone.append("%d (start time %d, not the receipt's %d)" % (pid, proc.start, start))
            continue
        roots.append(_RootPin(proc, fd))
    return roots, exited, left_alone


_KEPT_CGROUP_NAME = "treereap-"


def _end_kept_cgroup(fs, receipt, roots, endtime):
    """cgroup.kill on the receipt's kept cgroup, if it is one this supervisor
    makes (its name: the run's cgroup's, with .kept), and it holds the kept
    processes the receipt names that are alive (a receipt naming another
    run's cgroup is then caught); then wait for it to be empty, and remove
    it. A kept cgroup whose listed processes all died holds what descends
    from them, and is ended too: no pid chain leads there any more. (done,
    how many it held, a note)."""
    path = receipt.get("kept_cgroup")
    if not path:
        return True, 0, None
    name = path.rstrip("/").rsplit("/", 1)[-1]
    run_name = str(receipt.get("cgroup") or "").rstrip("/").rsplit("/", 1)[-1]
    if not (name.startswith(_KEPT_CGROUP_NAME) and name == run_name + ".kept"):
        return False, 0, "kept_cgroup %s is not a cgroup this supervisor makes: left alone" % path
    try:
        home = _find_cgroup_home_for(fs, path)
    except _NoCgroup as e:
        return False, 0, "kept_cgroup %s: %s" % (path, e)
    try:
        cgroup = home.open_existing(name)
    except OSError as e:
        home.close()
        if e.errno == errno.ENOENT:
            return True, 0, None  # removed already: nothing in it
        return False, 0, "kept_cgroup %s: %s" % (path, e.strerror)
    try:
        for pin in roots:
            pin.in_cgroup = fs.cgroup_of(pin.proc.pid) == cgroup.path
        members = cgroup.procs()
        if roots and not all(pin.in_cgroup for pin in roots):
            return False, 0, ("kept_cgroup %s does not hold the processes the receipt kept: "
                              "left alone" % path)
        cgroup.write("cgroup.kill", "1")
        emptied = _wait_events(cgroup, "populated", "0", endtime)
        if emptied:
            home.remove(cgroup)
        done, count = _end_run_cgroup_left(home, run_name, endtime)
        note = None if emptied else "kept_cgroup %s is not empty" % path
        if not done:
            note = (note + "; " if note else "") + "cgroup %s is not empty" % receipt["cgroup"]
        return emptied and done, len(members) + count, note
    finally:
        cgroup.close()
        home.close()


def _end_run_cgroup_left(home, name, endtime):
    """The run's cgroup outlives its supervisor when a nested supervisor's
    cgroup below it still held processes (everything kept): end it too, but
    only once no supervisor holds it (its flock: see remove_leftovers), so
    that a receipt naming a live run's cgroup ends nothing. (done, count)"""
    import fcntl
    try:
        cgroup = home.open_existing(name)
    except OSError as e:
        return e.errno == errno.ENOENT, 0
    try:
        try:
            fcntl.flock(cgroup.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False, 0  # its supervisor is alive
        count = len(cgroup.procs())
        cgroup.write("cgroup.kill", "1")
        emptied = _wait_events(cgroup, "populated", "0", endtime)
        return (home.remove(cgroup) or emptied), count
    finally:
        cgroup.close()


def _wait_events(cgroup, key, value, endtime):
    while cgroup.events().get(key) != value:
        if _now() >= endtime:
            return False
        _wait_ready((), (cgroup.events_fd,), endtime - _now())
    return True


def _find_cgroup_home_for(fs, path):
    """The cgroup v2 directory holding `path` (relative to the hierarchy's
    root), as a home to find it in."""
    parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
    for before, after in fs.mountinfo():
        if after and after[0] == "cgroup2" and len(before) > 4 and _unescape(before[3]) == "/":
            return _open_home(fs, _unescape(before[4]), parent, judge=False)
    raise _NoCgroup("no cgroup v2 hierarchy is mounted here")


def _end_trees(fs, roots, endtime):
    """SIGKILL roots and their descendants, as the drain does: each round
    freezes what it finds (SIGSTOP, so none forks or hands its children on)
    and kills children before parents; each process proven by a pidfd
    taken before /proc showed its parent to be a process already proven.
    (all gone, how many were found)."""
    found = set()
    while True:
        pins = []
        try:
            for root in roots:
                if not _readable(root.fd):
                    _freeze_and_kill(fs, root, pins, found, endtime)
            alive = [pin for pin in pins + roots if not _readable(pin.fd)]
            if not alive:
                return True, len(found)
            if _now() >= endtime:
                return False, len(found)
            _wait_ready([alive[0].fd], (), min(_DRAIN_ROUND_LIMIT, endtime - _now()))
        finally:
            _close_pins(pins)


def _freeze_and_kill(fs, root, pins, found, endtime):
    """One walk below root: each process stopped as it is found, and killed
    once its children are done (children before parents, so none is handed
    on); a depth-first walk with a stack of its own, as deep as trees go."""
    stack = [(root, None)]
    while stack:
        pin, children = stack.pop()
        if children is None:  # first visit: freeze it, then its children
            pin.send(signal.SIGSTOP)
            found.add(pin.proc.identity)
            stack.append((pin, ()))
            for pid in fs.children(pin.proc.pid, pin.proc.threads):
                child = _prove_child(fs, pin, pid) if _now() < endtime else None
                if child is not None:
                    pins.append(child)
                    stack.append((child, None))
        else:
            pin.send(signal.SIGKILL)


def _prove_child(fs, parent, pid):
    """A pin on pid if /proc shows, after the pidfd was taken, that its parent
    is still the proven process parent (both pins still alive), else None."""
    try:
        fd = _pidfd_open(pid)
    except ProcessLookupError:
        return None
    proc = fs.stat(pid)
    if proc is None or proc.ppid != parent.proc.pid or _readable(fd) or _readable(parent.fd):
        os.close(fd)  # not provably its child any more: left to the next round
        return None
    return _Pin(proc, fd)


def _end_kept(options):
    """--end-kept RECEIPT: one line, and 0 when all it kept is gone."""
    import json
    try:
        with open(options.end_kept, "rb") as f:
            receipt = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError("--end-kept: cannot read the receipt %s: %s" % (
            options.end_kept, getattr(e, "strerror", None) or e))
    if not isinstance(receipt, dict) or not isinstance(receipt.get("preserved", []), list):
        raise UsageError("--end-kept: %s is not a receipt of this supervisor" % options.end_kept)
    done, line = end_kept(receipt, options.cleanup_timeout)
    _complain(line)
    return 0 if done else EXIT_FAILURE
# --- The command line ------------------------------------------------------------------------

_USAGE = """\
usage: %(prog)s --timeout DURATION [OPTIONS] -- COMMAND [ARG...]
       %(prog)s --end-kept RECEIPT [-k DURATION]

Run COMMAND under a deadline, drain every process it leaves behind, and write
a JSON receipt that says what happened and whether it was confirmed.

what is kept: nothing by default (every process of the run is drained).

options:
  --timeout DURATION         the deadline, from the command's start (required);
                             a number with an optional unit: 90, 1.5, 10m, 2h, 1d
  -k, --kill-after DURATION, --cleanup-timeout DURATION
                             bound of EACH of the three cleanup phases (default
                             10): the grace after the stop signal, the command's
                             own process after SIGKILL, and the drain
  -s, --signal SIG           the first signal of a stop (default TERM): a name
                             (TERM, SIGINT, int) or a number; 0 sends none (the
                             grace, then SIGKILL); the command starts with it at
                             its default
  --stop-file PATH           stop the run as soon as anything exists at PATH; if
                             something is there already, COMMAND never starts
  --receipt PATH             write the receipt there (outside the workdir)
  --workdir DIR              the command's current directory (default: this one;
                             from /, there is no workdir to keep the receipt out of)
  --drain-all                the default: drain every process of the run
  --preserve-descendants-on-success
                             when COMMAND exits 0 by itself and nothing stopped
                             the run, keep every process of it (NeMo Gym's flag);
                             any other ending drains everything
  --keep-services            keep the services COMMAND detached (adopted outside
                             its group) before a stop; at a natural exit, every
                             process outside its group
  --containment auto|cgroup|proc
                             how the run is held: a cgroup of its own where one
                             can be made (auto, the default; cgroup insists), or
                             the /proc walk
  --user USER[:GROUP]        run the command as that user (a name or a uid) and
                             group, with no way back to root: then it cannot
                             signal, stop or trace the supervisor, nor write
                             its receipt
  --preserve-status          exit with the command's status even when the run
                             was stopped (125 still wins)
  -v, --verbose              say on stderr when the run is stopped, when SIGKILL
                             was needed, and how it ended
  --new-session              leave the caller's session first, so that a kill of
                             the caller's process group cannot stop the drain
  --end-kept RECEIPT         end (SIGKILL) what an earlier run's receipt kept,
                             and their descendants, within -k (a pid whose start
                             time is not the receipt's is left alone); exit 0
                             when all is gone
  -h, --help                 show this help and exit
  --version                  show the version and exit

signals: TERM, INT, HUP and every other signal that would end a process stop
the run (one that the caller ignored stays ignored, TERM excepted); a second
one later than 0.25 s skips the rest of the grace; USR1, USR2 and WINCH are
forwarded to the command's group; TSTP suspends the run. A stop ends within
the timeout plus 3 x the cleanup timeout, plus up to 3 s.

the receipt (JSON): cleanup_confirmed (do not reuse the sandbox when false),
exit_status, return_code, stop_reason (exit, timeout, stop_file, signal),
timed_out, policy, preserved (what was kept, with pid and start_time),
drained, survivors, error. A missing receipt means the cleanup was not
confirmed.

exit status: COMMAND's own; 124 deadline or stop file; 125 supervisor failure
or cleanup not confirmed; 126 cannot execute; 127 not found; 128+N signal N;
137 a stop had to SIGKILL the command.
"""

# Each option: the attribute it sets, and what its value is.
_OPTIONS = {
    "--timeout": ("timeout", "duration"),
    "--cleanup-timeout": ("cleanup_timeout", "duration"),
    "--kill-after": ("cleanup_timeout", "duration"),
    "-k": ("cleanup_timeout", "duration"),
    "--signal": ("signal", "signal"),
    "-s": ("signal", "signal"),
    "--stop-file": ("stop_file", "path"),
    "--receipt": ("receipt", "path"),
    "--workdir": ("workdir", "path"),
    "--user": ("user", "text"),
    "--containment": ("containment", "containment"),
    "--drain-all": ("policy", "drain-all"),
    "--preserve-descendants-on-success": ("policy", "preserve-descendants-on-success"),
    "--keep-services": ("policy", "keep-services"),
    "--preserve-status": ("preserve_status", "flag"),
    "--verbose": ("verbose", "flag"),
    "-v": ("verbose", "flag"),
    "--new-session": ("new_session", "flag"),
    "--end-kept": ("end_kept", "path"),
}
# timeout(1)'s options that have no honest meaning here: refused, saying why.
_REFUSED = {
    "--foreground": "--foreground is not supported: the command gets the terminal whenever the "
                    "supervisor is in the terminal's foreground, and a stop ends every process "
                    "of the run, its children too; drop the option",
    "-f": "-f (--foreground) is not supported: the command gets the terminal whenever the "
          "supervisor is in the terminal's foreground; drop the option",
}

# As timeout(1): a duration too large to represent is clamped (to the largest
# time_t, 292 billion years), one too small to represent but above zero rounds
# up to a nanosecond; zero, which timeout(1) reads as "no deadline", is
# refused here (--timeout is the point).
_MAX_DURATION = float(2 ** 63 - 1)
_MIN_DURATION = 1e-9
_ASCII_SPACE = " \t\n\v\f\r"


def parse_duration(text, option="--timeout"):
    """Seconds from '90', '1.5', '10m', '2h', '1d', as timeout(1) reads them:
    ASCII digits only, leading white space allowed. Refuses zero, negatives,
    nan, inf and garbage; clamps what is too large or too small to represent
    (see _MAX_DURATION)."""
    number, unit = text.lstrip(_ASCII_SPACE), 1
    if number[-1:] in _DURATION_UNITS:
        number, unit = number[:-1], _DURATION_UNITS[number[-1]]
    value = None
    if number and all(c in "0123456789.eE+-" for c in number):
        try:
            value = float(number)
        except ValueError:
            value = None
    if value is not None and (value == 0 or value == float("inf")) and _nonzero_mantissa(number):
        value = _MIN_DURATION if value == 0 else _MAX_DURATION
    if value is None or not 0 < value < float("inf"):
        raise UsageError("%s: %r is not a positive duration (seconds, or a number "
                         "with s, m, h or d: 90, 1.5, 10m)" % (option, text))
    return min(value * unit, _MAX_DURATION)


def _nonzero_mantissa(number):
    """Does a decimal number that float() rounded to 0 or inf have a digit
    other than 0 before its exponent (1e-10000, 1e400: a positive value too
    small or too large to represent, not zero)? Signs are for the caller."""
    mantissa = number.lower().partition("e")[0]
    return not mantissa.startswith("-") and any(c in "123456789" for c in mantissa)


class _Options(object):
    def __init__(self):
        self.timeout = None
        self.cleanup_timeout = DEFAULT_CLEANUP_TIMEOUT
        self.signal = signal.SIGTERM
        self.stop_file = self.receipt = self.workdir = self.user = self.end_kept = None
        self.policy, self.policy_option = "drain-all", None
        self.containment = "auto"
        self.preserve_status = self.verbose = self.new_session = False
        self.command = []
        self.show = None  # "help" or "version"


def _parse_args(argv):
    """Options as timeout(1) takes them: --name VALUE, --name=VALUE, -k VALUE,
    -kVALUE; the command after -- or from the first non-option."""
    options = _Options()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            options.command = argv[i + 1:]
            break
        if not arg.startswith("-") or arg == "-":
            options.command = argv[i:]
            break
        if arg in ("-h", "--help", "--version"):
            options.show = "version" if arg == "--version" else "help"
            return options
        name, has_value, value = _split_option(arg)
        if name in _REFUSED:
            raise UsageError(_REFUSED[name])
        if name not in _OPTIONS:
            raise UsageError("unknown option %s (see --help)" % arg)
        attribute, kind = _OPTIONS[name]
        if kind in ("flag",) + POLICIES:
            if has_value:
                raise UsageError("%s takes no value" % name)
            _set_flag(options, name, attribute, kind)
        else:
            if not has_value:
                i += 1
                if i == len(argv):
                    raise UsageError("%s needs a value" % name)
                value = argv[i]
            setattr(options, attribute, _option_value(name, kind, value))
        i += 1
    if options.end_kept is not None:
        return options
    if options.timeout is None:
        raise UsageError("--timeout is required (seconds, e.g. --timeout 600)")
    if not options.command:
        raise UsageError("no command given: put it after --")
    return options


def _set_flag(options, name, attribute, kind):
    if kind == "flag":
        setattr(options, attribute, True)
        return
    if options.policy_option is not None and options.policy != kind:
        raise UsageError("%s and %s: choose one policy" % (options.policy_option, name))
    options.policy, options.policy_option = kind, name


def _split_option(arg):
    """--name=VALUE, --name, -kVALUE, -k: (name, has_value, value)."""
    name, has_value, value = arg.partition("=")
    if not name.startswith("--") and len(arg) > 2:  # -kVALUE, -sKILL
        return arg[:2], True, arg[2:]
    return name, bool(has_value), value


def _receipt_path_in(argv):
    """The --receipt path in argv, found however the rest is malformed (a
    refusal must remove the earlier receipt too, see main), and only among
    the supervisor's own options: the command's arguments start where
    _parse_args starts them, and a --receipt there belongs to the command."""
    found, i = None, 0
    while i < len(argv) and argv[i] != "--" and argv[i].startswith("-") and argv[i] != "-":
        name, has_value, value = _split_option(argv[i])
        takes_value = name in _OPTIONS and _OPTIONS[name][1] not in ("flag",) + POLICIES
        if takes_value and not has_value:
            i += 1
            value = argv[i] if i < len(argv) else None
        if name == "--receipt":
            found = value
        i += 1
    return found or None


def _option_value(name, kind, value):
    if kind == "duration":
        return parse_duration(value, name)
    if kind == "signal":
        return _parse_signal(value, name)
    if kind == "containment":
        return _check_choice(value, CONTAINMENTS, name)
    if not value:
        raise UsageError("%s: the value is empty" % name)
    return value


def _parse_signal(text, option="--signal"):
    """A signal as timeout(1) -s takes it: TERM, SIGTERM, term, 15, the
    real-time ones as RTMIN+3 or SIGRTMAX-1, and EXIT for 0 (none)."""
    name = text.strip(_ASCII_SPACE).upper()
    if name and all(c in "0123456789" for c in name):  # ASCII digits: int() takes others too
        number = int(name)
    elif name in ("EXIT", "SIGEXIT"):  # the shell's name for 0, which timeout(1) takes
        number = 0
    else:
        name = name if name.startswith("SIG") else "SIG" + name
        base, sign, offset = name.replace("-", "+-").partition("+")
        number = getattr(signal, base, None) if not base.startswith("SIG_") else None
        if base == "SIGSTKFLT":  # unnamed before Python 3.11
            number = 16
        if sign and base not in ("SIGRTMIN", "SIGRTMAX"):
            number = None
        if number is not None and sign:
            try:
                number += int(offset)
            except ValueError:
                number = None
    if number != 0 and number not in _VALID_SIGNALS:
        raise UsageError("%s: unknown signal %r (a name such as TERM or INT, a number, or 0 "
                         "for none)" % (option, text))
    return number


def _workdir_of(options):
    """(the command's directory, the directory the receipt must stay out of).
    Without --workdir, the current directory is both, except /: the default
    of docker exec and kubectl exec is nobody's workdir."""
    workdir = (_absolute(options.workdir, "--workdir") if options.workdir
               else _current_directory())
    return workdir, None if workdir == "/" and not options.workdir else workdir


def _receipt_target(path, fence):
    """The receipt's target, checked, with the earlier receipt removed."""
    target = _check_receipt_target(path, fence)
    try:
        target.remove_stale()
    except OSError as e:
        target.discard()
        raise UsageError("--receipt: %s: %s" % (e.filename, _os_error_text(e)))
    return target


def _check_workdir(workdir):
    if not os.path.isdir(workdir):
        what = "is not a directory" if os.path.exists(workdir) else "does not exist"
        raise UsageError("--workdir: %s %s" % (workdir, what))
    if not os.access(workdir, os.X_OK):
        raise UsageError("--workdir: cannot enter %s (permission denied)" % workdir)


def _check_receipt_target(path, workdir):
    """The receipt's target, refused (UsageError, nothing left behind) when it
    cannot be written, or when it would land inside the workdir: judged by
    the directory actually held open, through every symlink and `..`."""
    try:
        target = _ReceiptTarget(path)
    except OSError as e:
        raise UsageError("--receipt: %s: %s" % (e.filename or path, _os_error_text(e)))
    try:
        inside = workdir is not None and _is_inside(target.dir_fd, workdir)
    except OSError as e:
        target.discard()
        raise UsageError("--receipt: cannot tell whether %s is inside the workdir %s: %s"
                         % (path, workdir, _os_error_text(e)))
    if inside:
        target.discard()
        raise UsageError("--receipt: %s lands in %s, inside the workdir %s; put the "
                         "receipt outside it" % (path, target.directory, workdir))
    return target


def _is_inside(dir_fd, workdir):
    """Is the directory held by dir_fd the workdir or below it? Walks up
    through `..` from the directory itself, comparing device and inode; and,
    since `..` at the root of a bind mount leaves the tree it was taken from
    (a container's volume of workdir/sub mounted elsewhere), compares where
    each lies in its filesystem too (mountinfo's root of their mounts)."""
    try:
        top = os.stat(workdir)
    except OSError:
        return False
    if _walks_up_to(dir_fd, (top.st_dev, top.st_ino)):
        return True
    if os.fstat(dir_fd).st_dev != top.st_dev:
        return False
    inner, outer = _place_in_filesystem(dir_fd), _place_in_filesystem_of(workdir)
    if inner is None or outer is None:
        return False
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _walks_up_to(dir_fd, wanted):
    fd = os.dup(dir_fd)
    try:
        for _ in range(4096):
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == wanted:
                return True
            parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = parent
            up = os.fstat(fd)
            if (up.st_dev, up.st_ino) == (st.st_dev, st.st_ino):
                return False  # the root
    finally:
        os.close(fd)
    return False


def _place_in_filesystem_of(path):
    try:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # not a directory: --workdir refuses it next
    try:
        return _place_in_filesystem(fd)
    finally:
        os.close(fd)


def _place_in_filesystem(fd):
    """The path of the directory held by fd inside its filesystem: its mount's
    root (mountinfo field 4: "/work/sub" for a bind mount of it) joined with
    its path below the mount point. None when it cannot be told."""
    try:
        with open("/proc/self/fdinfo/%d" % fd) as f:
            mount_id = [line.split()[1] for line in f if line.startswith("mnt_id:")][0]
        path = os.readlink("/proc/self/fd/%d" % fd)
        with open("/proc/self/mountinfo") as f:
            entries = [line.split() for line in f]
    except (OSError, IndexError):
        return None
    for fields in entries:
        if fields[0] == mount_id:
            root, point = _unescape(fields[3]), _unescape(fields[4])
            below = path[len(point.rstrip("/")):] if path.startswith(point) else None
            if below is None:
                return None
            return root.rstrip("/") + "/" + below.lstrip("/") if below.strip("/") else root
    return None


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
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _print(text):
    try:
        os.write(1, text.encode())
    except OSError:
        pass


def _relay_into_new_session():
    """--new-session: fork. The child leaves the caller's session and
    supervises; the parent stays in the caller's process group as a relay that
    forwards signals and exits with the child's status. When the relay is
    killed (the caller killed its group), the child gets SIGTERM
    (_PR_SET_PDEATHSIG, set by supervise) and stops the run. Returns the
    relay's pid, in the child only."""
    relay = os.getpid()
    pid = _acquire("fork", os.fork)
    if pid == 0:
        os.setsid()
        return relay
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
    target = None
    try:
        options = _parse_args(argv)
        if options.show is not None:
            _print(_USAGE % {"prog": _PROG} if options.show == "help"
                   else "%s %s\n" % (_PROG, __version__))
            return 0
        _require_linux()
        if options.end_kept is not None:
            return _end_kept(options)
        workdir, fence = _workdir_of(options)
        if options.receipt is not None:
            # First: from here on, any refusal leaves no receipt at the path,
            # so no receipt always means "not confirmed" for this run.
            target = _receipt_target(options.receipt, fence)
        _check_workdir(workdir)
        user = _check_user(options.user, workdir) if options.user is not None else None
        if user is not None and target is not None:
            _check_user_may_not_replace(user, target)
        stop_path = _check_stop_file(options.stop_file, target)
        relay = _relay_into_new_session() if options.new_session else None
        run = _Run(_make_plan(options.command, options.timeout, options.cleanup_timeout,
                              stop_path, workdir, relay, user=user,
                              stop_signal=options.signal, policy=options.policy,
                              containment=options.containment,
                              preserve_status=options.preserve_status,
                              verbose=options.verbose))
        receipt = _execute(run)
    except SupervisorError as e:
        return _refuse(str(e), target, argv)
    except Exception as e:  # a bug: still one line, and the sandbox is suspect
        return _refuse("internal error: %s: %s" % (type(e).__name__, e), target, argv)
    # The receipt goes to disk before anything goes to stderr: a full pipe or
    # a terminal with TOSTOP must not hold it back.
    status, lost = receipt["exit_status"], None
    if target is not None:
        try:
            target.write(receipt)
        except OSError as e:
            status, lost = EXIT_FAILURE, e
    if receipt["error"]:
        _complain(receipt["error"])
    if lost is not None:
        _complain("--receipt: cannot write %s: %s" % (lost.filename, lost.strerror))
    if not receipt["cleanup_confirmed"] and not run.failed:
        _complain(_unconfirmed_message(receipt))
    if receipt["stop_reason"] == "stop_file" and receipt["pid"] is None:
        _complain("the stop file %s is there: the command was not started" % stop_path)
    elif options.verbose:
        _complain(_outcome(run, receipt, status))
    return status


def _refuse(message, target, argv):
    """One line on stderr, exit 125, and no receipt at the path: not an
    earlier run's (the path is found in argv even when parsing failed), not
    a partial one, and no directory made for it."""
    left = _no_receipt_left(target, _receipt_path_in(argv))
    if left and not message.startswith("--receipt"):
        message += "; " + left
    _complain(message)
    return EXIT_FAILURE


def _remove_stale_at(path):
    """Remove the regular file or symlink at path (never following it, never
    making a directory). What else is there is left, and said."""
    if path is None:
        return None
    try:
        path = os.path.abspath(path)
        st = os.lstat(path)
    except (OSError, ValueError):
        return None  # nothing there (or no path to speak of)
    why = "a directory is there" if st.st_mode & 0o170000 == 0o040000 else _not_a_receipt(
        path, st)
    if why:
        return "--receipt %s: %s: left alone" % (path, why)
    try:
        os.unlink(path)
    except OSError as e:
        return "cannot remove the earlier receipt %s: %s" % (path, e.strerror)
    return None


def _outcome(run, receipt, status):
    """-v's closing line: how the run ended, what the cleanup did."""
    kept = ", ".join("%d %s" % (p["pid"], " ".join(p["command"] or ["?"])[:60])
                     for p in receipt["preserved"][:5])
    return "done: %s, exit status %d, %d drained%s, %d kept%s, cleanup %s" % (
        receipt["stop_reason"] if receipt["signal"] is None else receipt["signal"], status,
        receipt["drained_count"], " (SIGKILL was needed)" if run.killed else "",
        len(receipt["preserved"]), " (%s)" % kept if kept else "",
        "confirmed" if receipt["cleanup_confirmed"] else "NOT confirmed")


def _unconfirmed_message(receipt):
    survivors, unattributed = receipt["survivors"], receipt["unattributed"]
    if unattributed and not survivors:
        foreign = [p for p in unattributed if p["why"].startswith("uid")]
        if foreign:
            return ("cleanup not confirmed: %d process(es) of the run's uid started outside the "
                    "run (%s) cannot be told from the run's; give each sandbox a uid of its own"
                    % (len(foreign), ", ".join(str(p["pid"]) for p in foreign[:10])))
        return ("cleanup not confirmed: %d process(es) adopted in the process groups of the "
                "caller's jobs (%s) cannot be told from the run's, and were left alone; start "
                "the supervisor without background jobs, or with --new-session" % (
                    len(unattributed), ", ".join(str(p["pid"]) for p in unattributed[:10])))
    count = receipt["survivors_count"]
    if not survivors:
        return ("cleanup not confirmed: %s; do not reuse this sandbox" % (
            "the processes kept changing while /proc was read" if count == 0
            else "what is still alive could not be observed"))
    return ("cleanup not confirmed: %s process(es) still alive (%s); do not reuse this "
            "sandbox" % (count if count is not None else "at least %d" % len(survivors),
                         ", ".join(str(s["pid"]) for s in survivors[:10])))


def _no_receipt_left(target, path):
    """A refusal leaves no receipt at the path: not a partial one of ours
    (the target, once there is one), and not an earlier run's."""
    if target is not None:
        target.discard()
    elif path is not None:
        return _remove_stale_at(path)
    return None


def _check_user(spec, workdir):
    user = _User(spec)
    user.check_privilege()
    if not user.can([(workdir, "enter")])[0]:
        raise UsageError("--user: %s cannot enter the workdir %s" % (user.shown, workdir))
    return user


def _check_stop_file(path, target):
    """The stop path as given, made absolute. Only ENOENT and ENOTDIR mean
    nothing is there; what we cannot look at is refused, and so is the
    receipt's own path (the receipt would stop the next run)."""
    if path is None:
        return None
    path = _absolute(path, "--stop-file")
    try:
        os.lstat(path)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise UsageError("--stop-file: cannot look at %s: %s" % (path, e.strerror))
    if target is not None and _same_entry(path, target):
        raise UsageError("--stop-file: %s is the receipt's path; give them different paths"
                         % path)
    return path


def _same_entry(path, target):
    directory, name = os.path.split(path)
    if name != target.name:
        return False
    if os.path.abspath(path) == target.path:
        return True
    try:
        here, there = os.stat(directory), os.fstat(target.dir_fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _exit(status):
    """Exit at once: the interpreter's teardown costs ~5 ms that a controller
    would wait for, and all we print went out through os.write already."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass  # closed, or None when the fd was closed at start
    os._exit(status)


def _main_once_parsed():
    """main(), run from atexit when this file runs as a script: CPython keeps
    a script's parse tree (~9 MiB here) until the script's code returns, and
    only then frees it and calls atexit; our code then runs with that memory
    back (malloc_trim in _prepare returns it to the system). The
    interpreter is still whole at that point: imports, signals and fork
    work as before. Whatever happens, this exits with a status of its own:
    CPython would swallow an exception from an atexit function and exit 0."""
    status = EXIT_FAILURE
    try:
        status = main()
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:  # Ctrl-C before the signals were ours: die of it, as Python does
        status = 128 + signal.SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # what main() did not turn into a line: say it, as Python would
        import traceback
        traceback.print_exc()
    finally:
        try:
            _exit(status)
        finally:
            os._exit(status)


def _main_after_the_parse():
    """May main() wait for atexit? Not on CPython 3.12.0 to 3.12.2, which
    refuse fork() and new threads once the main module's code has returned
    (gh-104690; undone in 3.12.3, gh-113964); nor under python -i or
    PYTHONINSPECT, which would open a prompt before the run."""
    return (not (3, 12, 0) <= sys.version_info[:3] < (3, 12, 3)
            and not sys.flags.inspect and not os.environ.get("PYTHONINSPECT"))


if __name__ == "__main__":
    if _main_after_the_parse():
        import atexit
        atexit.register(_main_once_parsed)
    else:
        _main_once_parsed()
