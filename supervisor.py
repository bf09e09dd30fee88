#!/usr/bin/env python3
"""supervisor.py: run a command tree under a deadline, drain what it leaves, prove it.

    python3 supervisor.py --timeout DURATION [OPTIONS] -- COMMAND [ARG...]

COMMAND runs in a process group of its own, below this process as a child
subreaper, so that every process of the run descends from it. A run goes
through the states

    starting -> running -> terminating -> killing -> draining -> done

(a natural exit skips killing). When COMMAND exits by itself, what is left of
its group is drained. When the deadline passes, the stop file appears or a
stop signal arrives, the group is stopped (SIGTERM, a grace, SIGKILL) and every
process adopted after that decision is drained with it, in any group or
session; detached services adopted before the decision keep running. The
receipt, a JSON file, says what happened and whether /proc confirmed that
nothing of the run is left alive.

Exit status (the conventions of timeout(1)):
    N       COMMAND exited with N
    128+N   COMMAND died of signal N, or signal N sent to the supervisor stopped it
    124     the deadline or the stop file stopped the run
    125     the supervisor failed, or cleanup could not be confirmed (overrides all)
    126     COMMAND was found but could not be executed
    127     COMMAND was not found

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

__version__ = "1.1.0"
__all__ = [
    "CLEANUP_PHASE_COUNT", "DEFAULT_CLEANUP_TIMEOUT", "EXEC_TIMEOUT_SLACK", "EXIT_CANNOT_EXECUTE",
    "EXIT_FAILURE", "EXIT_NOT_FOUND", "EXIT_TIMED_OUT", "RECEIPT_SCHEMA_VERSION", "STATES",
    "CleanupReceipt", "ObservationError", "SupervisorError", "UsageError", "exec_timeout",
    "main", "parse_duration", "supervise", "write_receipt",
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
# _ProcTree._stop_own_children).
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
RECEIPT_SCHEMA_VERSION = 2
# The receipt lists at most this many drained processes (drained_count has all).
_DRAINED_LIMIT = 1000

EXIT_TIMED_OUT = 124
EXIT_FAILURE = 125
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

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
_CAP_SETGID, _CAP_SETUID, _CAP_SYS_PTRACE, _CAP_SYS_NICE = 6, 7, 19, 23
# The autogroup priority a cleanup takes: its session's, shared with every
# supervisor in that session, so this value also marks it as taken by one.
_CLEANUP_AUTOGROUP_NICE = -19
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
# The generic syscall table numbers them alike on every architecture but alpha.
_SYS_PIDFD_SEND_SIGNAL = 424
_SYS_PIDFD_OPEN = 434

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
        "cleanup_s": float, "ladder": list, "containment": str, "user": Optional[dict],
        "preserved": list, "survivors": list, "unattributed": list, "drained": list,
        "drained_count": int,
        "usage": dict,
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
    return bool(_wait_readable([fd], 0))


def _wait_readable(fds, seconds):
    """The fds that became readable within `seconds`. select() keeps the
    deadline to the microsecond; poll() (whole milliseconds, rounded up, so
    up to 1 ms late) serves fds above select's limit and waits beyond a day."""
    seconds = max(seconds, 0.0)
    if max(fds) < _SELECT_FD_LIMIT and seconds < _MAX_SELECT_SECONDS:
        return select.select(fds, (), (), seconds)[0]
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(min(_MAX_POLL_MS, int(seconds * 1000) + 1))]


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


class _ProcFS(object):
    """/proc, opened once and read relative to that descriptor, so that a
    mount over /proc during the run changes nothing. Only ENOENT and ESRCH
    mean a process is gone; any other error raises ObservationError."""

    def __init__(self):
        try:
            self.fd = _high_fd(os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except OSError as e:
            raise SupervisorError("/proc: %s; mount it (mount -t proc proc /proc)" % e.strerror)
        try:
            self._check_procfs()
            self._check_namespace()
            self._check_visibility()
        except BaseException:
            self.close()
            raise
        # CONFIG_PROC_CHILDREN: where the kernel lists each thread's children,
        # a look walks the run's tree; elsewhere it reads every process.
        me = os.getpid()
        self.has_children_files = self.read("%d/task/%d/children" % (me, me)) is not None

    def _check_procfs(self):
        try:
            kind = _filesystem_type(self.fd)
        except OSError as e:
            raise SupervisorError("/proc: fstatfs: %s" % e.strerror)
        if kind != _PROC_SUPER_MAGIC:
            raise SupervisorError("/proc is not procfs (filesystem type 0x%x); mount it "
                                  "(mount -t proc proc /proc)" % kind)

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

    def _mount_options(self):
        """The super options of the mount our /proc descriptor is on (mountinfo)."""
        st = os.fstat(self.fd)
        device = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
        options = {}
        for line in (self.read("self/mountinfo") or b"").decode("utf-8", "replace").splitlines():
            fields = line.split(" - ")
            if len(fields) == 2 and line.split()[2] == device:
                for option in fields[1].split()[-1].split(","):
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

    def read(self, path, one_record=False, first_page=False, endtime=None):
        """The bytes of /proc/path, or None when what it describes is gone.
        Read to EOF: a seq_file answers a read with at most a page of whole
        records, so a short read is not the end (a list of 700 children is
        two pages). one_record: a file whose short read is its end (stat,
        one record; cmdline, no seq_file), read once unless it fills 4 KiB.
        first_page: only what one read gives (a seq_file's first records).
        endtime: no page more once it has passed (the caller is out of time)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            return self._gone_or_raise(e, path)
        try:
            chunks = [os.read(fd, 4096)]
            while (not first_page and chunks[-1]
                   and (not one_record or len(chunks[-1]) == 4096)
                   and (endtime is None or _now() < endtime)):
                chunks.append(os.read(fd, 65536))
            return b"".join(chunks)
        except OSError as e:
            return self._gone_or_raise(e, path)
        finally:
            os.close(fd)

    @staticmethod
    def _gone_or_raise(e, path):
        if e.errno in (errno.ENOENT, errno.ESRCH):
            return None
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

    def threads_of(self, pid):
        path = "%d/task" % pid
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as e:
            return self._gone_or_raise(e, path) or []
        try:
            return [int(tid) for tid in os.listdir(fd)]
        except OSError as e:
            return self._gone_or_raise(e, path) or []
        finally:
            os.close(fd)

    def scan(self):
        """Every process in this PID namespace: {pid: _Proc}. Costs ~9 us a process."""
        try:
            names = os.listdir(self.fd)
        except OSError as e:
            raise ObservationError("cannot list /proc: %s" % e.strerror)
        procs = {}
        for name in names:
            if name.isdigit():
                proc = self.stat(int(name))
                if proc is not None:
                    procs[proc.pid] = proc
        return procs

    def autogroup_nice(self):
        """The nice value of our session's autogroup, or None (no autogroups)."""
        data = self.read("self/autogroup")
        return int(data.split()[-1]) if data else None

    def open_autogroup(self):
        """Held open while it matters: giving the priority back must not need
        a descriptor that a starved supervisor may not get."""
        return _high_fd(os.open("self/autogroup", os.O_WRONLY | os.O_CLOEXEC, dir_fd=self.fd))

    def open_fd_count(self):
        try:
            fd = os.open("self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
            try:
                return len(os.listdir(fd))
            finally:
                os.close(fd)
        except OSError as e:
            raise ObservationError("cannot list /proc/self/fd: %s" % e.strerror)

    def cmdline(self, pid):
        """argv of pid as a list of str; its name in brackets when it has no
        argv (a zombie), as ps shows it; [] when it is gone or unreadable:
        a name is for people, never evidence."""
        try:
            argv = self.read("%d/cmdline" % pid, one_record=True)
            if argv:
                return [arg.decode("utf-8", "replace") for arg in argv.rstrip(b"\0").split(b"\0")]
            name = (self.read("%d/comm" % pid) or b"").strip()
        except ObservationError:
            return []
        return ["[%s]" % name.decode("utf-8", "replace")] if name else []

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# --- Containment: the run's processes ----------------------------------------------------

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


class _Walk(object):
    """The result of one look at the run: the live processes in scope
    (parents first), pins on them when asked for, every process it saw
    outside kept subtrees, and whether nothing it read changed under it."""
    __slots__ = ("found", "pins", "seen", "stable", "wait_budget")

    def __init__(self):
        self.found, self.pins, self.seen, self.stable = [], [], set(), True
        self.wait_budget = _PIN_FD_HEADROOM


class _ProcTree(object):
    """The run's processes, found in /proc from this process down.

    This is the containment seam: what a stop needs from whatever holds the
    run. A cgroup v2 containment would offer the same methods (README,
    Development):

        join_in_child()     in the forked child, before exec
        started(pid)        the command's pid, which is also its group id
        detached()          our live children outside the group: services
        keep(procs)         these are services: out of every scope from now on
        members(scope)      the live processes in scope, parents first
        signal(scope, sig)  every process in scope that is provably ours
        kill(scope)         freeze and SIGKILL the scope; pins to wait on
        confirm(scope, t)   the observation behind cleanup_confirmed
        pins(procs)         pidfds to wait on, which wake the loop at exit
        own_children()      for the reaper, which lives outside: the hooks
                            reap() and reap_child(pid) are all a look knows
                            of it
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
    Where the kernel has no children files (CONFIG_PROC_CHILDREN unset), one
    scan of every process gives the same tree, and a process whose parent
    vanished from the scan makes the scan unstable.

    Only what is provably ours is signalled: the command's process group
    while its leader is held unreaped, our own unreaped children, and
    processes pinned by a pidfd after /proc showed that their parent, alive
    and proven, is their parent still.
    """

    def __init__(self, fs, kind):
        self.fs = fs
        self.kind = kind            # "children" or "scan": the receipt's containment
        self.me = os.getpid()
        self.pid = self.pgid = None
        self.kept = set()           # identities of the services kept running
        self.inherited = set()      # identities of the caller's processes
        self.inherited_groups = set()  # their process groups: the caller's jobs
        self.callers_children = set()  # pids of our children before the command: never reaped
        self.unattributed = {}      # identity -> _Proc adopted in the caller's jobs' groups
        self.recording = False      # from the cleanup on: what each look finds may be ended
        self.ended = {}             # identity -> argv (None past _DRAINED_LIMIT) of those
        self.gone = set()           # identities whose pin showed them exit
        self.pidfds = True          # until the kernel says otherwise
        self.saved_fd_limit = None  # our RLIMIT_NOFILE, while raised
        # The run's reaper lives outside: reap() what is due, during a long
        # look (_reap_when_due); reap_child(pid), a zombie a look came upon.
        self.reap, self.reap_child = (lambda: None), (lambda pid: False)
        self.next_reap = 0.0

    # The seam.

    def join_in_child(self):
        """The process group made in the child is all the /proc walk needs."""

    def started(self, pid):
        self.pid = self.pgid = pid

    def note_inherited(self):
        """Children we had before the command (a shell's jobs, before its exec),
        their descendants, and whatever is later adopted in their process
        groups are the caller's: never signalled, never kept, and our own
        children among them never reaped (an API caller waits for them; unreaped,
        each pid stays theirs). waitid() first, so that the usual case costs no
        look at all."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WCONTINUED
                      | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        self.callers_children = set(self.own_children())
        walk = self._walk(_RUN, everything=True)
        self.inherited = set(p.identity for p in walk.found)
        self.inherited_groups = set(p.pgid for p in walk.found if p.ppid == self.me)

    def is_inherited(self, proc):
        """For our own children: the caller's (known at start), or adopted
        since in one of the caller's jobs' groups, which a process of the run
        can join too (or a reused group id can match): then it is
        unattributed, left alone, and it keeps the run from being confirmed."""
        if proc.identity in self.inherited or proc.pid in self.callers_children:
            return True
        if proc.pgid in self.inherited_groups and not self._in_group(proc):
            self.unattributed[proc.identity] = proc
            return True
        return False

    def detached(self, endtime=None):
        """Our live children outside the command's group, but never the
        command itself (it may have moved to another group)."""
        return [proc for proc in self.live_children(endtime)
                if proc.pgid != self.pgid and proc.pid != self.pid
                and not self.is_inherited(proc)]

    def reapable(self, pid):
        return pid not in self.callers_children

    def keep(self, procs):
        self.kept.update(p.identity for p in procs)

    def live_children(self, endtime=None):
        found = []
        for pid in self.own_children(endtime):
            if endtime is not None and _now() >= endtime:
                break
            self._reap_when_due()
            proc = self.fs.stat(pid)
            # Still our child: the reaper may have run since the list was
            # read, and a pid it freed can be another process's by now.
            if proc is not None and proc.live and proc.ppid == self.me:
                found.append(proc)
        return found

    def begin_cleanup(self):
        """From now on, every live process a look finds in scope is one the
        cleanup will end; drained() is those of them not among survivors."""
        self.recording = True

    def drained(self, survivors):
        """What the cleanup ended: those it recorded that were seen to exit, or
        are gone now (one that left the scope, below a kept service, lives on
        and is not listed)."""
        left = set(p.identity for p in survivors)
        return [(identity, argv) for identity, argv in self.ended.items()
                if identity not in left and (identity in self.gone or not self._alive_now(identity))]

    def _alive_now(self, identity):
        """Alive, or not known to be gone: a look that fails claims nothing."""
        try:
            proc = self.fs.stat(identity[0])
        except ObservationError:
            return True
        return proc is not None and proc.live and proc.start == identity[1]

    def note_gone(self, proc):
        self.gone.add(proc.identity)

    def members(self, scope, endtime=None):
        """Live processes in scope, for waiting on and for the record: a look
        whose stability nobody uses, so it skips the checks that give it."""
        return self._walk(scope, endtime=endtime, careful=False).found

    def signal(self, scope, sig, endtime=None):
        """Signal the group (and the command if it left the group), and in the
        run's scope every other process that is provably ours."""
        _signal_group(self.fs, self.pid, self.pgid, sig)
        if scope == _RUN:
            _close_pins(self._walk(_RUN, sig=sig, careful=False, endtime=endtime).pins)

    def kill(self, scope, endtime):
        """SIGKILL the scope. The walk freezes each process as it finds it
        (SIGSTOP: none forks while the walk reads on) and kills it once its
        children are done, children before parents, so that only the path
        being walked is pinned. Returns the walk; its pins are for waiting,
        and the caller closes them."""
        _signal_group(self.fs, self.pid, self.pgid, signal.SIGSTOP)
        if scope == _RUN:
            self._stop_own_children(endtime)
        walk = self._walk(scope, sig=signal.SIGSTOP, kill=True, endtime=endtime)
        _signal_group(self.fs, self.pid, self.pgid, signal.SIGKILL)
        return walk

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
        spared = set(pid for pid, _ in self.kept | self.inherited) | self.callers_children
        spared.add(self.pid)
        seen = set()
        for _ in range(_STOP_PASSES):
            if _now() >= endtime:
                return
            fresh = [pid for pid in reversed(self.own_children(endtime))
                     if pid not in seen and pid not in spared]
            if not fresh:
                return
            seen.update(fresh)
            if self.inherited_groups:  # the caller's jobs are known by group: look first
                fresh = [pid for pid in fresh if not self.is_inherited(self.fs.stat(pid) or _GONE)]
            # Thousands of them, each kill() slower for the storm: mind the time.
            for pid in fresh:
                if _now() >= endtime:
                    return
                _quietly_signal(pid, signal.SIGSTOP)
            for pid in fresh:
                if _now() >= endtime:
                    return
                self.reap_child(pid)

    def confirm(self, scope, endtime, previous=None):
        """The observation behind cleanup_confirmed: ([], True) once two looks
        in a row found nothing alive in scope, each undisturbed, and saw the
        same processes (a process that died during the first look handed its
        children to a list read before: the second sees them). Else the live
        processes found, or ([], False) when the looks kept being disturbed
        (a few tries: the caller waits before it asks again) or time ran out."""
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

    def alive(self, proc):
        now = self.fs.stat(proc.pid)
        return now is not None and now.live and now.start == proc.start

    def pins(self, procs):
        """Pins for waiting only, never signalled: a pid reused between the
        look and the pin costs a longer wait, never a wrong signal. Beyond
        what the fd limit allows, a pin polls /proc instead."""
        budget = self._pin_budget(len(procs))
        pins = []
        try:
            for proc in procs:
                fd = self._pidfd(proc.pid) if len(pins) < budget else None
                if fd is not False:
                    pins.append(_Pin(proc, fd))
        except BaseException:
            _close_pins(pins)
            raise
        return pins

    def oldest_children(self):
        """The first page of our list of children (~600), one read however
        long the list is. Adoption appends to it, so the processes adopted
        first, and dead first, are there. A whole list costs a pass over it
        each page, and under a fork storm every entry waits for the task-list
        lock: 30,000 zombies took 3 s to list (one page: milliseconds)."""
        if self.kind == "scan":
            return self.own_children()
        data = self.fs.read("%d/task/%d/children" % (self.me, self.me), first_page=True)
        if data is None:
            raise ObservationError("cannot read our own children in /proc")
        return [int(word) for word in data.split()]

    def own_children(self, endtime=None):
        """Our children; past `endtime` perhaps only some (see _ProcFS.read)."""
        if self.kind == "scan":
            return [p.pid for p in self.fs.scan().values() if p.ppid == self.me]
        found = []
        for tid in self.fs.threads_of(self.me):
            data = self.fs.read("%d/task/%d/children" % (self.me, tid), endtime=endtime)
            if data is None:
                raise ObservationError("cannot read our own children in /proc")
            found.extend(int(word) for word in data.split())
        return found

    def close(self):
        if self.saved_fd_limit is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, self.saved_fd_limit)
            self.saved_fd_limit = None

    # The walk.

    def _in_group(self, proc):
        return proc.pgid == self.pgid or proc.pid == self.pid

    def _reap_when_due(self):
        """A look at a storm takes seconds, and the zombies it makes meanwhile
        would lengthen every list we read: let the reaper run every
        _REAP_LIST_INTERVAL."""
        now = _now()
        if now >= self.next_reap:
            self.next_reap = now + _REAP_LIST_INTERVAL
            self.reap()

    def _walk(self, scope, sig=None, kill=False, endtime=None, everything=False, careful=True):
        """One look from this process down (see the class docstring): the live
        processes in scope, parents first. With sig, each of them is proven
        and pinned, and those outside the group are sent sig as they are
        found; with kill, SIGKILL too once their children are done.
        `everything` ignores scopes and what is inherited: the look at
        start-up."""
        walk = _Walk()
        index = self._scan_index(walk) if self.kind == "scan" else None
        # Items are (parent node, pid) to visit, or (node, None) to leave.
        stack = [(None, pid) for pid in reversed(self._children_of(None, index, endtime))]
        try:
            while stack:
                out_of_time = endtime is not None and _now() >= endtime
                if not out_of_time:
                    self._reap_when_due()
                parent, pid = stack.pop()
                if pid is None:
                    self._leave(parent, kill, walk)
                elif out_of_time:
                    walk.stable = False  # the look is partial
                else:
                    node = self._visit(parent, pid, scope, sig, walk, index, everything)
                    if node is not None:
                        stack.append((node, None))  # left, and its pin closed, whatever happens
                        children = self._children_of(node, index)
                        if careful and not self._still_there(node):
                            walk.stable = False  # it died: its children moved to a list read before
                        stack.extend((node, child) for child in reversed(children))
        finally:
            for node, pid in stack:
                if pid is None:
                    _closed(node[1])
            if not kill:  # only a kill walk hands its pins on, for waiting
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
        if len(walk.pins) == _PIN_FD_HEADROOM:
            walk.wait_budget = self._pin_budget(len(walk.pins) + 1)
        if len(walk.pins) < walk.wait_budget:
            walk.pins.append(pin)
        else:
            pin.close()

    def _visit(self, parent, pid, scope, sig, walk, index, everything):
        """Look at one process. None when it is gone, moved, inherited or one of
        our zombies (reaped here, never carried); else (proc, pin, kept) to
        descend into, pin proving it ours for its children's sake."""
        parent_proc, _, parent_kept = parent or (None, None, False)
        # Below a kept service only group members are in scope, and killpg
        # reaches those: nothing there needs a proof.
        pin = self._prove(parent, pid) if sig is not None and not parent_kept else None
        proc = pin.proc if pin is not None else self._look(pid, index)
        if proc is None or proc.ppid != (parent_proc.pid if parent_proc else self.me):
            # Gone since its parent's list was read, or re-parented: it may
            # have handed its children to a list read before. Below a kept
            # service, which runs on, only group members are at stake.
            if proc is not None or not parent_kept:
                walk.stable = False
            return _closed(pin)
        if parent is None and not everything:
            if self.is_inherited(proc):
                return _closed(pin)
            if not proc.live and self.reap_child(pid):
                # Gone for good: the next look will not see it either; but it
                # may have died after our list was read.
                walk.stable = False
                return _closed(pin)
        if not parent_kept:
            walk.seen.add(proc.identity)
        kept = parent_kept or proc.identity in self.kept
        if proc.live and (everything or self._in_group(proc) or (scope == _RUN and not kept)):
            walk.found.append(proc)
            if self.recording and proc.identity not in self.ended:
                self.ended[proc.identity] = (self.fs.cmdline(pid) if len(self.ended) < _DRAINED_LIMIT
                                             else None)
            if pin is not None and not self._in_group(proc):
                pin.send(sig)
            return (proc, pin, kept)
        return (proc, _closed(pin), kept)

    def _look(self, pid, index):
        return index[1].get(pid) if index is not None else self.fs.stat(pid)

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
        fd = self._pidfd(pid)
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

    def _pidfd(self, pid):
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
                self._make_fd_room()
                return None
            raise
        if fd is None:
            self.pidfds = False
        return fd

    def _children_of(self, node, index, endtime=None):
        if node is None:
            return index[0].get(self.me, []) if index is not None else self.own_children(endtime)
        proc = node[0]
        if index is not None:
            return index[0].get(proc.pid, [])
        return self.fs.children(proc.pid, proc.threads)

    def _still_there(self, node):
        """Was the process alive after its children were read? (Then nothing
        left its list unseen.) Pinned processes are checked by their pidfd,
        the rest by /proc; a scan is one snapshot, which _scan_index checks."""
        proc, pin, _ = node
        if not proc.live or self.kind == "scan":
            return True  # a zombie has no children: they left at its exit
        if pin is not None and pin.fd is not None:
            return not _readable(pin.fd)
        return self.alive(proc)

    def _scan_index(self, walk):
        """({ppid: [pid, ...]}, {pid: _Proc}) from one scan. A process whose
        parent is missing from the scan saw that parent die mid-scan."""
        procs = self.fs.scan()
        children = {}
        for proc in sorted(procs.values(), key=lambda p: p.pid):
            children.setdefault(proc.ppid, []).append(proc.pid)
            if proc.ppid not in procs and proc.ppid != 0:
                walk.stable = False
        return children, procs

    def _pin_budget(self, wanted):
        """How many pidfds may be held at once: all that is wanted when that is
        few; else what our fd limit (lifted to the hard one) leaves, less a
        reserve for reading /proc and for our own pipes."""
        if wanted <= _PIN_FD_HEADROOM:
            return wanted
        import resource
        self._make_fd_room()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return max(0, soft - self.fs.open_fd_count() - _FD_RESERVE)

    def _make_fd_room(self):
        """Lift our soft RLIMIT_NOFILE to the hard one, once. The command
        started with the caller's limit; close() puts ours back."""
        if self.saved_fd_limit is not None:
            return
        import resource
        self.saved_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard = self.saved_fd_limit[1]
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # a hard limit above what the kernel allows: keep ours


class _Gone(object):
    """Stands for a process that is gone: nobody's, in no group."""
    identity, pgid = None, None


_GONE = _Gone()


def _closed(pin):
    if pin is not None:
        pin.close()
    return None


def _reap_pid(pid):
    """Reap pid if it is an exited child of ours; nothing otherwise. Did it?"""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return False


def _signal_group(fs, pid, pgid, sig):
    """Signal the command's group, and the command itself if it left the
    group (our unreaped child: its pid is ours). The group id is ours while
    the command's zombie, its first leader, is held unreaped."""
    _quietly_signal(pgid, sig, group=True)
    command = fs.stat(pid)
    if command is not None and command.live and command.pgid != pgid:
        _quietly_signal(pid, sig)


# --- Signals and the stop file ---------------------------------------------------------

class _SignalCatcher(object):
    """This run's signal dispositions: handlers only record what arrived and
    when, and wake the loop through set_wakeup_fd. close() restores the
    caller's."""

    def __init__(self, always=(), stop_signal=signal.SIGTERM):
        self.stop_signal = stop_signal
        self.pending = []
        self.saved = {}
        self.ignored_by_caller = set()
        self.caller_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.fd, self.write_end = _pipe()
        for fd in (self.fd, self.write_end):
            os.set_blocking(fd, False)
        try:
            if sys.version_info >= (3, 7):  # a burst of SIGCHLD must not print warnings
                self.saved_wakeup = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
            else:
                self.saved_wakeup = signal.set_wakeup_fd(self.write_end)
        except ValueError:
            self._close_pipe()
            raise SupervisorError("supervise() must run in the main thread")
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
            try:
                self.saved[sig] = signal.signal(sig, self._record)
            except OSError:  # EINVAL: one the C library keeps for itself
                pass
        # Always ours, whatever the caller left: SIGCHLD wakes us, SIGPIPE must
        # not kill us when stderr is a closed pipe.
        self.saved[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._record)
        self.saved[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in self.saved if s != signal.SIGPIPE])

    def _record(self, signum, frame):
        self.pending.append((signum, _now()))

    def take(self):
        """(signal, monotonic time) received since the last call, oldest first."""
        _discard_pending(self.fd)
        taken, self.pending = self.pending, []
        return taken

    def reset_for_command(self):
        """In the forked child, before exec: the caller's dispositions and mask,
        but SIGCHLD, SIGPIPE, SIGXFSZ and the stop signal at their default
        dispositions (a stop must be able to end the command gracefully;
        a launcher's `trap '' TERM` only fenced its own start-up), and the
        first three unblocked."""
        defaulted = set(_DEFAULTED_FOR_COMMAND)
        if self.stop_signal not in (signal.SIGKILL, signal.SIGSTOP):
            defaulted.add(self.stop_signal)
        for sig in set(self.saved) | defaulted:
            ignored = sig in self.ignored_by_caller and sig not in defaulted
            signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK,
                               set(self.caller_mask) - set(_DEFAULTED_FOR_COMMAND))

    def close(self):
        signal.set_wakeup_fd(self.saved_wakeup)
        for sig, handler in self.saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.caller_mask)
        self._close_pipe()

    def _close_pipe(self):
        os.close(self.fd)
        os.close(self.write_end)


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
    it); above it, a directory the user owns, or can write unless it is
    sticky (as /tmp is), or, below a sticky one, an entry that the user
    owns."""
    directories = [target.directory]
    while directories[-1] != "/":
        directories.append(os.path.dirname(directories[-1]))
    writable = user.can([(d, "write") for d in directories])
    below = None
    for directory, can_write in zip(directories, writable):
        st = os.stat(directory)
        owned_below = below is not None and os.lstat(below).st_uid == user.uid
        own_directory = below is None
        if st.st_uid == user.uid or (can_write and (
                own_directory or not st.st_mode & 0o1000 or owned_below)):
            raise UsageError("--user: %s could replace the receipt through %s (%s); put the "
                             "receipt in a directory that user cannot write" % (
                                 user.shown, directory,
                                 "its owner" if st.st_uid == user.uid else "writable"))
        below = directory


# --- The run: its state, its one wait, what signals do, and the reaper -------------------

class _Plan(object):
    """What the caller asked for, checked, before anything starts."""

    def __init__(self, command, timeout, cleanup_timeout, stop_path, workdir, stop_with_parent,
                 user=None, stop_signal=None, drain_all=False,
                 preserve_status=False, verbose=False):
        self.command = command
        self.timeout, self.cleanup_timeout = timeout, cleanup_timeout
        self.stop_path, self.workdir = stop_path, workdir
        self.stop_with_parent = stop_with_parent
        self.user = user            # --user: a _User, or None
        self.stop_signal = stop_signal or signal.SIGTERM  # the first signal of a stop
        self.drain_all = drain_all  # nothing is kept: every process of the run is drained
        self.preserve_status = preserve_status
        self.verbose = verbose      # -v: say when the run is stopped


class _Run(object):
    """One supervised run: the plan, the state it is in, and what it saw.
    The state changes only through _enter()."""

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
        self.unattributed = []          # live processes adopted in the caller's jobs' groups
        self.fs = self.tree = self.catcher = self.watch = None
        self.terminal = None            # fd 0, when the command was given the terminal
        self.subreaper_before = None
        self.next_list_reap, self.reap_pending = 0.0, False  # see _reap_exited()
        self.saved_priority = None      # (nice, autogroup nice, its fd) while the cleanup has the CPU
        self.usage_before = None        # getrusage(RUSAGE_CHILDREN) at the command's start


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


def _wait(run, endtime, fds=()):
    """The one place a run blocks: until a signal arrives, one of fds is
    readable (pidfds), the stop file's watch or the exec report speaks (while
    running only), or the monotonic time `endtime`. Then act on the signals."""
    running = run.state == "running"
    watch_fd = run.watch.fileno() if running and run.watch is not None else None
    report_fd = run.report.fileno() if running else None
    wanted = [fd for fd in (run.catcher.fd, watch_fd, report_fd) if fd is not None]
    if run.reap_pending:
        endtime = min(endtime, run.next_list_reap)
    ready = _wait_readable(wanted + list(fds), endtime - _now())
    if watch_fd is not None and watch_fd in ready:
        run.watch.read_events()
    _act_on_signals(run)


def _act_on_signals(run):
    """Dispatch what arrived on (state, kind of signal); SIGCHLD reaps."""
    child_exited = False
    for sig, when in run.catcher.take():
        if sig == signal.SIGCHLD:
            child_exited = True
        else:
            _SIGNAL_ACTIONS[run.state][_signal_kind(sig)](run, sig, when)
    # While a list reap is pending, the zombie that made it so still hides the
    # others from waitid(): a SIGCHLD (a storm sends thousands) changes nothing.
    if run.reap_pending:
        if _now() >= run.next_list_reap:
            _reap_exited(run)
    elif child_exited:
        _reap_exited(run)


def _signal_kind(sig):
    if sig in _FORWARDED_SIGNALS:
        return 1
    return 2 if sig == signal.SIGTSTP else 0


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


def _forward(run, sig, when):
    if not run.reaped:
        _signal_group(run.fs, run.pid, run.pgid, sig)


def _suspend_on_signal(run, sig, when):
    _suspend(run)


def _ignore_signal(run, sig, when):
    pass


# What a signal does, by the state of the run: (stop, forward, suspend).
_SIGNAL_ACTIONS = {
    "starting": (_request_stop, _ignore_signal, _ignore_signal),
    "running": (_request_stop, _forward, _suspend_on_signal),
    "terminating": (_hurry, _forward, _ignore_signal),
    "killing": (_hurry, _ignore_signal, _ignore_signal),
    "draining": (_hurry, _ignore_signal, _ignore_signal),
    "done": (_ignore_signal, _ignore_signal, _ignore_signal),
}


def _reap_exited(run):
    """The reaper: every exited child of ours that _reap_child() may reap.
    Runs whenever SIGCHLD wakes a wait, in every state, so zombies never pile
    up (and during a long look, by the tree's reap hook). A call reaps at most
    _REAP_BATCH, or a page of the list of our children (see below): a storm
    can make zombies faster than a starved supervisor reaps them, and the
    caller's deadlines must be looked at in between; _wait() comes straight
    back for the rest."""
    run.reap_pending = False  # until this call finds that more is to be done
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
        if _reap_child(run, info.si_pid):
            continue
        # The command's zombie (or the caller's) is the one waitid() shows, and
        # it hides the others behind it: reap them by pid, from the oldest of
        # our children, where those that died first are. That costs a syscall
        # a child, so at most every _REAP_LIST_INTERVAL while it finds some;
        # _wait() wakes up for the next round.
        now = _now()
        if now < run.next_list_reap:
            run.reap_pending = True
            return
        oldest = run.tree.oldest_children()
        reaped = [pid for pid in oldest if _reap_child(run, pid)]
        if not reaped and len(oldest) > _REAP_BATCH:  # a page of live ones: look past it
            reaped = [pid for pid in run.tree.own_children(_now() + _REAP_SLICE)[len(oldest):]
                      if _reap_child(run, pid)]
        run.next_list_reap, run.reap_pending = now + _REAP_LIST_INTERVAL, bool(reaped)
        return
    run.reap_pending, run.next_list_reap = True, _now()  # more to reap: right after a look


def _reap_child(run, pid):
    """The one rule of reaping: pid, if it is an exited child of ours, but
    never the command before done (its zombie keeps its group id from being
    reused while the group is signalled), nor a child the caller had before
    the run (the caller waits for it). Did it reap?"""
    if (pid == run.pid and not run.reaped) or not run.tree.reapable(pid):
        return False
    return _reap_pid(pid)


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
    if signal.SIGTSTP in run.catcher.saved:
        handler = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, handler)
    else:
        os.kill(os.getpid(), signal.SIGSTOP)
    if run.terminal is not None and _caller_terminal() is not None:
        _give_terminal(run.terminal, run.pgid)
    _signal_group(run.fs, run.pid, run.pgid, signal.SIGCONT)


def _check_job_control(run):
    """With the terminal handed over, Ctrl-Z stops the command: suspend with it."""
    if run.terminal is None:
        return
    try:
        info = os.waitid(os.P_PID, run.pid, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:
        return
    if info is not None and info.si_code == os.CLD_STOPPED:
        _suspend(run)


# --- The phases of a run ---------------------------------------------------------------------

def _prepare(run):
    """starting: refuse what cannot work; become a subreaper; take over signals."""
    _require_linux()
    try:
        import resource  # noqa: F401  now: lifting the fd limit must not need an fd
    except ImportError as e:
        raise SupervisorError("cannot load the resource module (ulimit -n?): %s" % e)
    run.fs = _ProcFS()
    run.tree = _ProcTree(run.fs, _containment_kind(run.fs))
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
    run.tree.note_inherited()
    run.tree.reap = lambda: _reap_exited(run)
    run.tree.reap_child = lambda pid: _reap_child(run, pid)
    if run.plan.stop_path is not None:
        run.watch = _StopFileWatch(run.plan.stop_path)


def _containment_kind(fs):
    """"children" where the kernel lists children, else "scan". The variable
    SUPERVISOR_CONTAINMENT=scan forces the fallback (it is how the tests
    prove it on a kernel that has both)."""
    wanted = os.environ.get("SUPERVISOR_CONTAINMENT", "")
    if wanted == "scan" or not fs.has_children_files:
        return "scan"
    return "children"


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
    """Fork, and exec COMMAND in a process group of its own with the caller's
    stdio, environment, signal mask and ignored signals. -> running"""
    read_end, write_end = _pipe()
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
    run.pid = run.pgid = pid
    run.tree.started(pid)
    run.report = _ExecReport(read_end)
    _enter(run, "running")
    if run.terminal is not None:
        _give_terminal(run.terminal, pid)


def _exec_command(run, report_fd):
    step = "setpgid"
    try:
        os.setpgid(0, 0)
        run.tree.join_in_child()
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
    runs, and a tree that keeps forking in sessions of its own gets as much
    as we do per session (autogroups) or per task (cgroups): enough to
    starve the drain. Where we may (CAP_SYS_NICE), the cleanup runs at the
    highest priority, given back once the run is done. Best effort.

    The session's autogroup is shared: another supervisor of the session
    (nested, or running beside us) may have taken it already, and its value
    then is not one to give back. Found at _CLEANUP_AUTOGROUP_NICE, it is
    left to that supervisor, which gives it back when it is done."""
    if not _has_capability(_CAP_SYS_NICE, run.fs):
        return
    try:
        nice, group_nice = os.getpriority(os.PRIO_PROCESS, 0), run.fs.autogroup_nice()
        taken = group_nice is not None and group_nice != _CLEANUP_AUTOGROUP_NICE
        group_fd = run.fs.open_autogroup() if taken else None
        run.saved_priority = (nice, group_nice, group_fd)
        os.setpriority(os.PRIO_PROCESS, 0, -20)
        if group_fd is not None:
            # The file cannot seek: pwrite() is ESPIPE.
            os.write(group_fd, str(_CLEANUP_AUTOGROUP_NICE).encode())
    except (OSError, ValueError):
        pass


def _set_autogroup_nice(fd, nice):
    """Without CAP_SYS_ADMIN the kernel takes one autogroup change per 100 ms
    on the whole host (EAGAIN otherwise): then wait for the next."""
    try:
        os.write(fd, str(nice).encode())
    except BlockingIOError:
        time.sleep(0.1)
        os.write(fd, str(nice).encode())


def _give_back_the_cpu(run):
    """Our session's autogroup outlives us (the caller's shell is in it):
    its priority goes back before the receipt, in the CLI too."""
    saved, run.saved_priority = run.saved_priority, None
    if saved is None:
        return
    nice, group_nice, group_fd = saved
    try:
        if group_fd is not None:
            _set_autogroup_nice(group_fd, group_nice)
    except (OSError, ValueError):
        pass
    finally:
        if group_fd is not None:
            os.close(group_fd)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except (OSError, ValueError):
        pass


def _stop_forced(run):
    """Deadline, stop file or signal: keep the detached services, stop the
    group (the stop signal, a grace, SIGKILL), then drain the whole run."""
    tree, plan = run.tree, run.plan
    _take_the_cpu(run)
    _say(run, "stopping the run: %s; %s to the command's group" % (
        _why_stopped(run), _signal_name(plan.stop_signal)))
    grace_endtime = _enter(run, "terminating")
    # Frozen while we look, no member can die and hand us its children before
    # the services adopted before the decision are noted. The stop signal
    # comes after the look: a stopped process still dies at once of a
    # SIGTERM it does not handle (the kernel's fatal-signal shortcut).
    tree.signal(_GROUP, signal.SIGSTOP)
    scope = _RUN if plan.drain_all else _GROUP  # --drain-all: services get the stop signal too
    if not plan.drain_all:
        tree.keep(tree.detached(grace_endtime))
    tree.begin_cleanup()
    members = tree.members(scope, grace_endtime)  # while frozen: each one the stop may end is seen
    tree.signal(scope, plan.stop_signal, grace_endtime)
    tree.signal(_GROUP, signal.SIGCONT)
    _await_gone(run, members, grace_endtime)
    kill_endtime = _enter(run, "killing")
    # Even when all seemed gone: a member forked during the grace must not
    # fork again while the drain looks.
    tree.signal(_GROUP, signal.SIGKILL)
    while not _command_exited(run) and _now() < kill_endtime:
        _wait(run, kill_endtime)  # SIGCHLD wakes us; it may sit in D state
    _drain(run, _RUN)
    _drain_strays(run)


def _finish_natural(run):
    """The command exited by itself: stop what is left of its group (the
    stop signal, a grace, SIGKILL); what lives outside it keeps running."""
    _take_back_terminal(run)
    tree, plan = run.tree, run.plan
    scope = _RUN if plan.drain_all else _GROUP  # --drain-all: nothing is kept
    # Frozen, no member can fork while we look: one look is then the truth.
    tree.signal(_GROUP, signal.SIGSTOP)
    tree.begin_cleanup()
    members = tree.members(scope, _now() + plan.cleanup_timeout)
    if members:
        grace_endtime = _enter(run, "terminating")
        tree.signal(scope, plan.stop_signal, grace_endtime)
        tree.signal(_GROUP, signal.SIGCONT)
        _await_gone(run, members, grace_endtime)
    _drain(run, scope)
    if plan.drain_all:
        _drain_strays(run)


def _await_gone(run, procs, endtime):
    """The grace: wait until each process has exited, `endtime`, or a later stop
    signal asks to hurry."""
    pins = run.tree.pins(procs)
    try:
        _await_exits(run, pins, endtime, interruptible=True)
    finally:
        _close_pins(pins)


def _await_exits(run, pins, endtime, interruptible=False):
    """Block until every pinned process has exited: False at `endtime`, or, when
    interruptible, as soon as a later stop signal asks to hurry."""
    delay = _EXIT_POLL_FIRST
    for pin in _still_running(run, pins):
        while not pin.exited(run.fs):
            if _now() >= endtime or (interruptible and run.hurry):
                return False
            if pin.fd is None:  # no pidfd: nothing will wake us, so poll
                _wait(run, min(endtime, _now() + delay))
                delay = min(delay * 2, _EXIT_POLL_MAX)
            else:
                _wait(run, endtime, (pin.fd,))
        run.tree.note_gone(pin.proc)
    return True


def _still_running(run, pins):
    """The pins whose process has not exited, found with one poll() for all
    that have a pidfd: after a stop signal most have exited already, and
    looking at a thousand one select() at a time costs milliseconds."""
    polled = [pin for pin in pins if pin.fd is not None]
    exited = set()
    if polled:
        poller = select.poll()
        for pin in polled:
            poller.register(pin.fd, select.POLLIN)
        exited = set(fd for fd, _ in poller.poll(0))
    running = []
    for pin in pins:
        if pin.fd in exited:
            run.tree.note_gone(pin.proc)
        else:
            running.append(pin)
    return running


def _drain(run, scope):
    """draining: freeze and SIGKILL everything in scope, round after round,
    until a stable look finds nothing alive, within one budget; then a last
    SIGKILL pass and the confirming look, within _FINAL_PASS_LIMIT."""
    endtime = _enter(run, "draining")
    tree = run.tree
    while _now() < endtime:
        walk = tree.kill(scope, endtime)
        try:
            if not walk.found and walk.stable:
                run.survivors, run.stable = tree.confirm(scope, endtime, previous=walk)
                if run.stable and not run.survivors:
                    return
            if walk.pins:
                _await_exits(run, walk.pins, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
            elif walk.found:  # nothing provable yet: an adoption (SIGCHLD) or a moment
                _wait(run, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
            else:  # nothing alive, but the look was disturbed (a zombie reaped): soon again
                _wait(run, min(endtime, _now() + _UNSETTLED_RETRY))
        finally:
            _close_pins(walk.pins)
    final_endtime = _now() + _FINAL_PASS_LIMIT
    _close_pins(tree.kill(scope, final_endtime).pins)
    run.survivors, run.stable = tree.confirm(scope, final_endtime)


def _drain_strays(run):
    """After a forced stop's confirmation: a kept service that died since then
    handed its children (left alone while it lived) to us. Adopted after the
    decision, they are the run's: drain them too, and look again, within
    _FINAL_PASS_LIMIT, so that what the receipt keeps and what it confirms
    cover every process of the run."""
    tree = run.tree
    endtime = _now() + _FINAL_PASS_LIMIT
    while not run.survivors and run.stable:
        strays = [p for p in tree.detached(endtime) if p.identity not in tree.kept]
        if _now() >= endtime:  # out of time, perhaps before the look was whole
            run.survivors, run.stable = strays, False
            return
        if not strays:
            return
        walk = tree.kill(_RUN, endtime)
        try:
            _await_exits(run, walk.pins, min(endtime, _now() + _DRAIN_ROUND_LIMIT))
        finally:
            _close_pins(walk.pins)
        run.survivors, run.stable = tree.confirm(_RUN, endtime)


def _finish(run):
    """done: the run is drained; now the command's zombie may go. The
    services kept are those alive now."""
    _enter(run, "done")
    _give_back_the_cpu(run)
    if _command_exited(run) and not run.reaped:
        run.report.read(block=True)
        if run.report.failure:
            _note_exec_failure(run)
        else:
            os.waitid(os.P_PID, run.pid, os.WEXITED)
            run.reaped = True
    run.next_list_reap = 0  # the last reap: a zombie of the caller's hides none of ours
    _reap_exited(run)
    tree = run.tree
    forced = run.stop_reason is not None
    endtime = _now() + _FINISH_LIMIT
    if not run.plan.drain_all:
        run.preserved = [p for p in tree.detached(endtime)
                         if not forced or p.identity in tree.kept]
    # The services were free to run since the confirming look: one that died
    # meanwhile handed its children to us, and one could have put a process
    # in the command's group. A live child of ours that is neither the
    # command, a service kept above, nor the caller's, is the run's, alive.
    if not run.survivors and run.stable:
        kept = set(p.identity for p in run.preserved)
        run.survivors = [p for p in tree.live_children(endtime)
                         if p.pid != run.pid and p.identity not in kept
                         and not tree.is_inherited(p)]
    if _now() >= endtime:  # a look cut short claims nothing
        run.stable = False
    run.unattributed = [p for p in tree.unattributed.values() if tree.alive(p)]


def _abandon(run):
    """The supervisor itself failed mid-run: kill the group rather than leave
    it running unsupervised (its leader is still held, so the id is ours),
    and give back the CPU priority the cleanup took."""
    if run.pid is not None and not run.reaped:
        _quietly_signal(run.pgid, signal.SIGKILL, group=True)
        _quietly_signal(run.pid, signal.SIGKILL)
    _give_back_the_cpu(run)


def _release(run):
    """Give back what the run took: terminal, fds, signals, subreaper bit.
    Each step is best effort: the receipt no longer depends on it."""
    steps = [lambda: _take_back_terminal(run), lambda: _give_back_the_cpu(run)]
    for part in (run.watch, run.report, run.tree, run.fs, run.catcher):
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
    if run.plan.preserve_status and run.exit_info is not None:
        code = _return_code(run.exit_info)
        return code if code >= 0 else 128 - code
    if run.stop_reason in ("timeout", "stop_file"):
        return EXIT_TIMED_OUT
    if run.stop_reason == "signal":
        return 128 + run.stop_signal
    code = _return_code(run.exit_info)
    return code if code >= 0 else 128 - code


def _children_usage():
    import resource
    return resource.getrusage(resource.RUSAGE_CHILDREN)


def _usage(run):
    """CPU of every process of the run that was reaped, directly or below
    one that was (RUSAGE_CHILDREN as the subreaper sees it), and the largest
    single process's peak RSS: the kernel keeps a maximum, not a sum."""
    if run.usage_before is None:
        return {"cpu_user_s": 0.0, "cpu_system_s": 0.0, "max_rss_kib": 0}
    now, before = _children_usage(), run.usage_before
    return {"cpu_user_s": round(now.ru_utime - before.ru_utime, 6),
            "cpu_system_s": round(now.ru_stime - before.ru_stime, 6),
            "max_rss_kib": now.ru_maxrss}


def _build_receipt(run, ended_wall, ended):
    confirmed = not run.survivors and run.stable and not run.failed and not run.unattributed
    ladder = [{"step": name, "start_s": round(begin - run.started, 6),
               "duration_s": round((end or ended) - begin, 6)} for name, begin, end in run.ladder]
    cleanup_s = ended - run.ended_running if run.ended_running is not None else 0.0
    fs = run.fs
    drained = run.tree.drained(run.survivors)
    return {
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
        "stop_reason": run.stop_reason or "exit",
        "signal": _signal_name(run.stop_signal) if run.stop_signal else None,
        "timed_out": run.stop_reason == "timeout",
        "return_code": _return_code(run.exit_info) if run.exit_info is not None else None,
        "exit_status": _exit_status(run, confirmed),
        "cleanup_confirmed": confirmed,
        "cleanup_s": round(cleanup_s, 6),
        "ladder": ladder,
        "containment": run.tree.kind,
        "user": ({"uid": run.plan.user.uid, "gid": run.plan.user.gid}
                 if run.plan.user is not None else None),
        "preserved": [{"pid": p.pid, "start_time": p.start, "command": fs.cmdline(p.pid)}
                      for p in run.preserved],
        "survivors": [{"pid": p.pid, "ppid": p.ppid, "pgid": p.pgid, "sid": p.sid,
                       "state": p.state, "command": fs.cmdline(p.pid)} for p in run.survivors],
        "unattributed": [{"pid": p.pid, "start_time": p.start, "command": fs.cmdline(p.pid)}
                         for p in run.unattributed],
        "drained": [{"pid": identity[0], "command": argv}
                    for identity, argv in drained[:_DRAINED_LIMIT]],
        "drained_count": len(drained),
        "usage": _usage(run),
        "error": _text(run.error) if run.error is not None else None,
    }


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
        escaped = value.translate(_JSON_ESCAPES)
        try:
            if b"\x7f" not in escaped.encode("ascii"):  # the usual case: nothing more to do
                return '"%s"' % escaped
        except UnicodeEncodeError:
            pass
        return '"%s"' % "".join(c if " " <= c <= "~" else _json_char(c) for c in escaped)
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


def _json_char(c):
    code = ord(c)
    if code < 0x10000:
        return "\\u%04x" % code
    code -= 0x10000  # outside the BMP: a surrogate pair
    return "\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))


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
        self.dir_fd = self.proc_fd = self.file_fd = None
        self.created = _make_directories(directory, self.path)
        try:
            self.dir_fd, self.can_sync = _open_directory(directory, self.path)
            self.check_name()
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
        replaced by the rename); anything else is refused."""
        try:
            st = os.lstat(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _path_error(e, self.path)
        kind = st.st_mode & 0o170000
        if kind == 0o040000:
            raise IsADirectoryError(errno.EISDIR, "a directory is there; name a file", self.path)
        if kind not in (0o100000, 0o120000):
            raise OSError(errno.EEXIST, "a device, FIFO or socket is there; name a regular "
                          "file", self.path)

    def _open_unnamed(self):
        try:
            return _high_fd(os.open(".", os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, 0o644,
                                    dir_fd=self.dir_fd))
        except (AttributeError, OSError) as e:
            if getattr(e, "errno", None) not in (None, errno.EOPNOTSUPP, errno.EISDIR,
                                                 errno.EINVAL, errno.ENOENT):
                raise _path_error(e, self.path)
        # No O_TMPFILE here: prove now that a named temporary can be made.
        self._unlink(self._create_named()[0])
        return None

    def _temporary_names(self):
        """Names beside the receipt that nobody can guess, a few tries' worth."""
        for _ in range(16):
            yield ".%s.%s.tmp" % (self.name, os.urandom(8).hex())

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
              *, workdir=None, stop_with_parent=None, user=None):
    """Run command under a deadline, drain what it leaves, return the receipt.

    command is an argv list of str (or bytes); timeout and cleanup_timeout
    are seconds; the run is stopped when anything exists at stop_path;
    workdir is the command's current directory; user ("name", "uid",
    "name:group") the user it runs as, with no way back to root.
    stop_with_parent, the pid of this process's parent, stops the run as
    SIGTERM would when that parent dies (even if the caller ignored SIGTERM;
    the command starts with SIGTERM at its default). Must run in the main
    thread of a single-threaded process on Linux; the children it already
    has stay its own (never signalled, never reaped). Raises SupervisorError
    (UsageError for bad arguments) before anything starts. Once the command
    started, a receipt always comes back: a command that cannot be executed,
    or a failure of the supervisor itself, is in its error and exit_status.
    The caller's signal handlers, mask and subreaper bit are restored when it
    returns.
    """
    plan = _make_plan(command, timeout, cleanup_timeout, stop_path, workdir, stop_with_parent)
    if user is not None:
        plan.user = _check_user(user, plan.workdir)
    run = _Run(plan)
    try:
        return _execute(run)
    finally:
        _release(run)


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
    deleted current directory."""
    if os.path.isabs(path):
        return os.path.normpath(path)
    try:
        return os.path.abspath(path)
    except FileNotFoundError:
        raise UsageError("%s: %s is relative and the current directory was deleted; give "
                         "an absolute path" % (option, path))


def _execute(run):
    """The phases, in order; returns the receipt. Raises SupervisorError
    before the command starts. Once it started, a failure of ours still ends
    in a receipt, one that does not confirm the cleanup."""
    try:
        _prepare(run)
        if _stopped_before_start(run):
            _enter(run, "done")
        else:
            run.terminal = _caller_terminal()
            _start_command(run)
            _supervise_started(run)
    except BaseException:
        _abandon(run)
        raise
    ended_wall, ended = time.time(), _now()
    _take_back_terminal(run)
    return _build_receipt(run, ended_wall, ended)


def _supervise_started(run):
    try:
        _run_until_stop(run)
        if run.watch is not None:
            run.watch.retire()  # now, so that closing it at exit costs nothing
        if run.report.failure:
            _note_exec_failure(run)
            _enter(run, "done")
            return
        if run.stop_reason is None:
            _finish_natural(run)
        else:
            _stop_forced(run)
        _finish(run)
    except Exception as e:
        run.failed = True
        run.error = ("supervisor failed: %s" % e if isinstance(e, SupervisorError)
                     else "supervisor failed: %s: %s" % (type(e).__name__, e))
        _abandon(run)
        if run.state != "done":
            _enter(run, "done")


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


# --- The command line ------------------------------------------------------------------------

_USAGE = """\
usage: %(prog)s --timeout DURATION [OPTIONS] -- COMMAND [ARG...]

Run COMMAND under a deadline, drain every process it leaves behind, and write
a JSON receipt that says what happened and whether /proc confirmed it.

options:
  --timeout DURATION         the deadline, from the command's start (required);
                             a number with an optional unit: 90, 1.5, 10m, 2h, 1d
  -k, --kill-after DURATION, --cleanup-timeout DURATION
                             bound of EACH of the three cleanup phases (default
                             10): the grace after the stop signal, the command's
                             own process after SIGKILL, and the drain
  -s, --signal SIG           the first signal of a forced stop (default TERM): a
                             name (TERM, SIGINT, int) or a number; the command
                             starts with it at its default
  --stop-file PATH           stop the run as soon as anything exists at PATH; if
                             something is there already, COMMAND never starts
  --receipt PATH             write the receipt there (outside the workdir)
  --workdir DIR              the command's current directory (default: this one;
                             from /, there is no workdir to keep the receipt out of)
  --drain-all                drain every process of the run, detached services
                             too, at a natural exit as at a forced stop (CI)
  --user USER[:GROUP]        run the command as that user (a name or a uid) and
                             group, with no way back to root: then it cannot
                             signal, stop or trace the supervisor, nor write
                             its receipt
  --preserve-status          exit with the command's status even when the run
                             was stopped (125 still wins)
  -v, --verbose              say on stderr when the run is stopped, and how it ended
  --new-session              leave the caller's session first, so that a kill of
                             the caller's process group cannot stop the drain
  -h, --help                 show this help and exit
  --version                  show the version and exit

what is kept and what is drained:
  COMMAND runs in a process group of its own. When it exits by itself, what is
  left of its group is stopped (the stop signal, a grace, SIGKILL); processes
  in other groups or sessions are kept, as detached services. When the
  deadline passes, the stop file appears or a stop signal arrives, the group
  is stopped the same way and every process adopted after that decision is
  drained, in any group or session; services detached before it are kept.
  With --drain-all nothing is kept. A forced stop ends within the timeout
  plus 3 x the cleanup timeout, plus up to 2.5 s.

signals: TERM, INT, HUP and every other signal that would end a process stop
the run (one that the caller ignored stays ignored, TERM excepted); a second
one later than 0.25 s skips the rest of the grace; USR1, USR2 and WINCH are
forwarded to the command's group; TSTP suspends the run.

the receipt (JSON): cleanup_confirmed (do not reuse the sandbox when false),
exit_status, return_code, stop_reason (exit, timeout, stop_file, signal),
timed_out, preserved (the services kept, with pid and start_time), drained,
survivors, error. A missing receipt means the cleanup was not confirmed.

exit status: COMMAND's own; 124 deadline or stop file; 125 supervisor failure
or cleanup not confirmed; 126 cannot execute; 127 not found; 128+N signal N.
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
    "--drain-all": ("drain_all", "flag"),
    "--preserve-status": ("preserve_status", "flag"),
    "--verbose": ("verbose", "flag"),
    "-v": ("verbose", "flag"),
    "--new-session": ("new_session", "flag"),
}


def parse_duration(text, option="--timeout"):
    """Seconds from '90', '1.5', '10m', '2h', '1d', as timeout(1) reads them.
    Refuses zero, negatives, nan, inf, what rounds to zero, and garbage."""
    number, unit = text.strip(), 1
    if number[-1:] in _DURATION_UNITS:
        number, unit = number[:-1], _DURATION_UNITS[number[-1]]
    if not number or any(c not in "0123456789.eE+-" for c in number):
        value = None
    else:
        try:
            value = float(number) * unit
        except ValueError:
            value = None
    if value is None or not 0 < value < float("inf"):
        raise UsageError("%s: %r is not a positive duration (seconds, or a number "
                         "with s, m, h or d: 90, 1.5, 10m)" % (option, text))
    return value


class _Options(object):
    def __init__(self):
        self.timeout = None
        self.cleanup_timeout = DEFAULT_CLEANUP_TIMEOUT
        self.signal = signal.SIGTERM
        self.stop_file = self.receipt = self.workdir = self.user = None
        self.drain_all = self.preserve_status = self.verbose = self.new_session = False
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
        name, has_value, value = arg.partition("=")
        if not name.startswith("--") and len(arg) > 2:  # -kVALUE, -sKILL
            name, has_value, value = arg[:2], True, arg[2:]
        if name not in _OPTIONS:
            raise UsageError("unknown option %s (see --help)" % arg)
        attribute, kind = _OPTIONS[name]
        if kind == "flag":
            if has_value:
                raise UsageError("%s takes no value" % name)
            setattr(options, attribute, True)
        else:
            if not has_value:
                i += 1
                if i == len(argv):
                    raise UsageError("%s needs a value" % name)
                value = argv[i]
            setattr(options, attribute, _option_value(name, kind, value))
        i += 1
    if options.timeout is None:
        raise UsageError("--timeout is required (seconds, e.g. --timeout 600)")
    if not options.command:
        raise UsageError("no command given: put it after --")
    return options


def _option_value(name, kind, value):
    if kind == "duration":
        return parse_duration(value, name)
    if kind == "signal":
        return _parse_signal(value, name)
    if not value:
        raise UsageError("%s: the value is empty" % name)
    return value


def _parse_signal(text, option="--signal"):
    """A signal as timeout(1) -s takes it: TERM, SIGTERM, term, 15, and the
    real-time ones as RTMIN+3 or SIGRTMAX-1."""
    name = text.strip().upper()
    if name.isdigit():
        number = int(name)
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
    if number not in _VALID_SIGNALS:
        raise UsageError("%s: unknown signal %r (a name such as TERM or INT, or a number)"
                         % (option, text))
    return number


def _workdir_of(options):
    """(the command's directory, the directory the receipt must stay out of).
    Without --workdir, the current directory is both, except /: the default
    of docker exec and kubectl exec is nobody's workdir."""
    workdir = (_absolute(options.workdir, "--workdir") if options.workdir
               else _current_directory())
    return workdir, None if workdir == "/" and not options.workdir else workdir


def _remove_stale(target):
    try:
        target.remove_stale()
    except OSError as e:
        target.discard()
        raise UsageError("--receipt: %s: %s" % (e.filename, _os_error_text(e)))


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
    through `..` from the directory itself, comparing device and inode."""
    try:
        top = os.stat(workdir)
    except OSError:
        return False
    wanted = (top.st_dev, top.st_ino)
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
        if options.show == "help":
            _print(_USAGE % {"prog": _PROG})
            return 0
        if options.show == "version":
            _print("%s %s\n" % (_PROG, __version__))
            return 0
        _require_linux()
        workdir, fence = _workdir_of(options)
        if options.receipt is not None:
            # First: from here on, any refusal leaves no receipt at the path,
            # so no receipt always means "not confirmed" for this run.
            target = _check_receipt_target(options.receipt, fence)
            _remove_stale(target)
        _check_workdir(workdir)
        user = _check_user(options.user, workdir) if options.user is not None else None
        if user is not None and target is not None:
            _check_user_may_not_replace(user, target)
        stop_path = _check_stop_file(options.stop_file, target)
        relay = _relay_into_new_session() if options.new_session else None
        run = _Run(_make_plan(options.command, options.timeout, options.cleanup_timeout,
                              stop_path, workdir, relay, user=user,
                              stop_signal=options.signal, drain_all=options.drain_all,
                              preserve_status=options.preserve_status,
                              verbose=options.verbose))
        receipt = _execute(run)
    except SupervisorError as e:
        _discard(target)
        _complain(str(e))
        return EXIT_FAILURE
    except Exception as e:  # a bug: still one line, and the sandbox is suspect
        _discard(target)
        _complain("internal error: %s: %s" % (type(e).__name__, e))
        return EXIT_FAILURE
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
        _complain(_outcome(receipt, status))
    return status


def _outcome(receipt, status):
    """-v's closing line: how the run ended, what the cleanup did."""
    kept = ", ".join("%d %s" % (p["pid"], " ".join(p["command"])[:60])
                     for p in receipt["preserved"][:5])
    return "done: %s, exit status %d, %d drained, %d kept%s, cleanup %s" % (
        receipt["stop_reason"] if receipt["signal"] is None else receipt["signal"], status,
        receipt["drained_count"], len(receipt["preserved"]), " (%s)" % kept if kept else "",
        "confirmed" if receipt["cleanup_confirmed"] else "NOT confirmed")


def _unconfirmed_message(receipt):
    survivors, unattributed = receipt["survivors"], receipt["unattributed"]
    if unattributed and not survivors:
        return ("cleanup not confirmed: %d process(es) adopted in the process groups of the "
                "caller's jobs (%s) cannot be told from the run's, and were left alone; start "
                "the supervisor without background jobs, or with --new-session" % (
                    len(unattributed), ", ".join(str(p["pid"]) for p in unattributed[:10])))
    if not survivors:
        return ("cleanup not confirmed: the processes kept changing while /proc was read; "
                "do not reuse this sandbox")
    return ("cleanup not confirmed: %d process(es) still alive (%s); do not reuse this "
            "sandbox" % (len(survivors), ", ".join(str(s["pid"]) for s in survivors[:10])))


def _discard(target):
    if target is not None:
        target.discard()


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


if __name__ == "__main__":
    _exit(main())
