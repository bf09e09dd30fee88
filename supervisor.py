#!/usr/bin/env python3
"""supervisor.py: run a command tree under a deadline, drain what it leaves, prove it.

    python3 supervisor.py --timeout SECONDS [OPTIONS] -- COMMAND [ARG...]

COMMAND runs in a process group of its own, under this process as a child
subreaper. When it exits by itself, what is left of its group is drained. When
the deadline passes, the stop file appears or a stop signal arrives, the group
is stopped (SIGTERM, a grace, SIGKILL) and every child adopted after that
decision is drained with it, in any group or session; detached services adopted
before the decision keep running. The receipt, a JSON file, says what happened
and whether /proc confirmed that nothing of the run is left alive.

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

__version__ = "1.0.0"
__all__ = [
    "CLEANUP_PHASE_COUNT", "DEFAULT_CLEANUP_TIMEOUT", "CleanupReceipt",
    "SupervisorError", "UsageError", "exec_timeout", "main", "parse_duration",
    "supervise", "write_receipt",
]

# --- Constants -----------------------------------------------------------------

# A forced stop has three bounded phases: the SIGTERM grace, the command's own
# process after SIGKILL, and the group with the newly adopted children.
CLEANUP_PHASE_COUNT = 3
DEFAULT_CLEANUP_TIMEOUT = 10.0
# What exec_timeout() adds for start-up, /proc scans and receipt I/O.
EXEC_TIMEOUT_SLACK = 30.0
RECEIPT_SCHEMA_VERSION = 1

EXIT_TIMED_OUT = 124
EXIT_FAILURE = 125
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

# inotify sees the stop file at once; this slow check covers what it cannot
# (a mount over the directory after the watch was set).
STOP_FILE_SAFETY_INTERVAL = 2.0
# Where inotify cannot see (network and FUSE filesystems, no inotify at all).
STOP_FILE_POLL_INTERVAL = 0.05
# Waiting for a process the kernel cannot wake us for (no pidfd): 1 ms doubling.
EXIT_POLL_FIRST, EXIT_POLL_MAX = 0.001, 0.1
# poll() takes an int of milliseconds; longer waits loop. select() is limited
# to fds below FD_SETSIZE; beyond a day we let poll() wait.
MAX_POLL_MS = 2 ** 31 - 1
SELECT_FD_LIMIT = 1024
MAX_SELECT_SECONDS = 86400.0

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

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
STOP_SIGNALS = tuple([signal.SIGTERM, signal.SIGINT, signal.SIGHUP] + [
    sig for sig in _VALID_SIGNALS
    if sig not in _NOT_STOPPING and sig not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)])
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)
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
DEFAULTED_FOR_COMMAND = (signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# The generic syscall table numbers them alike on every architecture but alpha.
SYS_PIDFD_SEND_SIGNAL = 424
SYS_PIDFD_OPEN = 434

# Filesystems whose remote changes inotify never reports (statfs f_type).
INOTIFY_BLIND_FILESYSTEMS = frozenset((
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
IN_CREATE, IN_MOVED_TO = 0x100, 0x80
IN_DELETE_SELF, IN_MOVE_SELF, IN_ONLYDIR = 0x400, 0x800, 0x01000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


# --- Errors and the receipt type --------------------------------------------------

class SupervisorError(Exception):
    """The supervisor cannot do its job here; the CLI exits 125."""


class UsageError(SupervisorError):
    """A bad option or path: nothing was started."""


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
        "cleanup_s": float, "ladder": list, "preserved": list, "survivors": list,
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


def _libc():
    if not _LIBC:
        _LIBC.append(_Libc())
    return _LIBC[0]


def set_subreaper(enabled):
    """Set or clear PR_SET_CHILD_SUBREAPER; return the previous value, read back."""
    libc = _libc()
    previous = libc.ctypes.c_int(0)
    libc.call("prctl", PR_GET_CHILD_SUBREAPER, libc.ctypes.byref(previous), 0, 0, 0)
    libc.call("prctl", PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)
    now = libc.ctypes.c_int(0)
    libc.call("prctl", PR_GET_CHILD_SUBREAPER, libc.ctypes.byref(now), 0, 0, 0)
    if bool(now.value) != bool(enabled):
        raise OSError(errno.EINVAL, "prctl: the subreaper bit did not stick")
    return bool(previous.value)


def _set_parent_death_signal(sig):
    _libc().call("prctl", PR_SET_PDEATHSIG, sig, 0, 0, 0)


def pidfd_open(pid):
    """A pidfd pinning pid, or None where the kernel has none (before 5.3).

    Raises ProcessLookupError when pid no longer exists."""
    if hasattr(os, "pidfd_open"):
        try:
            return _high_fd(os.pidfd_open(pid))
        except OSError as e:
            if e.errno in (errno.ENOSYS, errno.EPERM):  # old kernel, or seccomp
                return None
            raise
    try:
        return _high_fd(_libc().call("syscall", SYS_PIDFD_OPEN, pid, 0))
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.EPERM):
            return None
        if e.errno == errno.ESRCH:
            raise ProcessLookupError(e.errno, "pidfd_open: no such process")
        raise


def pidfd_send_signal(fd, sig):
    if hasattr(signal, "pidfd_send_signal"):
        signal.pidfd_send_signal(fd, sig)
    else:
        _libc().call("syscall", SYS_PIDFD_SEND_SIGNAL, fd, sig, None, 0)


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


def _discard_pending(fd):
    """Read a non-blocking fd until it is empty (wake-up bytes, inotify events)."""
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


def signal_name(number):
    """SIGTERM, SIGRTMIN+3, ...: the name a signal number goes by."""
    if signal.SIGRTMIN < number < signal.SIGRTMAX:
        return "SIGRTMIN+%d" % (number - signal.SIGRTMIN)
    return _SIGNAL_NAMES.get(number, "SIG%d" % number)


def _return_code(waitid_result):
    """The status as subprocess reports it: the exit code, or -N for signal N."""
    if waitid_result.si_code == os.CLD_EXITED:
        return waitid_result.si_status
    return -waitid_result.si_status


def _kill_group(pgid, sig):
    """killpg, for the group whose leader we hold unreaped (so the id is ours)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # nobody left, or only members we may not signal


def _kill_child(pid, sig):
    """kill, for our own child that we have not reaped (so the pid is ours)."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Proc(object):
    """One line of /proc/PID/stat: the fields a drain needs."""
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
        return (self.pid, self.start)


def read_proc(pid):
    """The process as /proc shows it now, or None when it is gone."""
    try:
        fd = os.open("/proc/%d/stat" % pid, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 1024)
    except OSError:  # ESRCH: it went between open and read
        return None
    finally:
        os.close(fd)
    # The command name may hold spaces and parentheses: split after the last ')'.
    end = data.rfind(b")")
    return Proc(pid, data[end + 2:].split(None, 21)) if end > 0 else None


def scan_proc():
    """Every process in this PID namespace: {pid: Proc}. Costs ~9 us a process."""
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None:
                procs[proc.pid] = proc
    return procs


def read_cmdline(pid):
    """argv of pid as a list of str; its name in brackets when it has no argv
    (a zombie, a kernel thread), as ps shows it; [] when it is gone."""
    argv = _read_small("/proc/%d/cmdline" % pid)
    if argv:
        return [arg.decode("utf-8", "replace") for arg in argv.rstrip(b"\0").split(b"\0")]
    name = _read_small("/proc/%d/comm" % pid).strip()
    return ["[%s]" % name.decode("utf-8", "replace")] if name else []


def _read_small(path):
    try:
        with open(path, "rb") as f:
            return f.read(65536)
    except OSError:
        return b""


class Snapshot(object):
    """One scan of /proc, with the parent -> children index built on demand."""

    def __init__(self, procs):
        self.procs = procs
        self._children = None

    def children(self, pid):
        if self._children is None:
            self._children = {}
            for proc in self.procs.values():
                self._children.setdefault(proc.ppid, []).append(proc)
        return self._children.get(pid, ())

    def subtree(self, roots):
        """roots and all their descendants, parents before children."""
        order, seen = list(roots), set(p.pid for p in roots)
        for proc in order:
            for child in self.children(proc.pid):
                if child.pid not in seen:
                    seen.add(child.pid)
                    order.append(child)
        return order

    def group(self, pgid):
        return [p for p in self.procs.values() if p.pgid == pgid]


# --- Containment: the run's processes as /proc shows them ------------------------------

class _Pin(object):
    """A process we wait for: its pidfd where there is one, else (pid, start)."""
    __slots__ = ("proc", "fd")

    def __init__(self, proc, fd):
        self.proc, self.fd = proc, fd

    def exited(self):
        if self.fd is not None:
            return _readable(self.fd)
        now = read_proc(self.proc.pid)
        return now is None or now.start != self.proc.start or not now.live

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class ProcessTree(object):
    """Find, freeze and kill the run's processes through /proc and signals.

    Only what is provably ours is signalled: the command's process group while
    its leader is held unreaped, our own unreaped children, and other
    descendants pinned by a pidfd after /proc showed, around the pin, that
    their parent is still one of ours. Membership is observed in /proc, never
    inferred from a signal sent. A cgroup v2 containment would offer the same
    methods (snapshot, targets, freeze, kill, pins) over cgroup.procs,
    cgroup.freeze, cgroup.kill and cgroup.events.
    """

    def __init__(self, pgid, foreign):
        self.me = os.getpid()
        self.pgid = pgid            # the command's group: its pid
        self.preserved = set()      # identities of detached services kept
        self.foreign = set(foreign)  # what we inherited from the caller, and theirs
        self.frozen = set()         # identities we sent SIGSTOP
        self.pidfds = True          # until the kernel says otherwise
        self.saved_fd_limit = None  # our RLIMIT_NOFILE, while raised

    def snapshot(self):
        snap = Snapshot(scan_proc())
        if self.foreign:
            roots = [p for p in snap.procs.values() if p.identity in self.foreign]
            self.foreign.update(p.identity for p in snap.subtree(roots))
        return snap

    def note_detached(self, snap):
        """At a forced stop: our children outside the group are kept running."""
        kept = self.left_running(snap)
        self.preserved.update(p.identity for p in kept)
        return kept

    def left_running(self, snap):
        """Our live children outside the group, but never the command itself,
        which may have moved to another group."""
        return [p for p in snap.children(self.me)
                if p.live and p.pgid != self.pgid and p.pid != self.pgid
                and p.identity not in self.foreign]

    def group_and_command(self, snap):
        """Live members of the group, and the command if it left the group."""
        members = [p for p in snap.group(self.pgid) if p.live]
        command = snap.procs.get(self.pgid)
        if self._left_group(command):
            members.append(command)
        return members

    def _left_group(self, command):
        """Is the command (as /proc showed it) alive, in another group?"""
        return command is not None and command.live and command.pgid != self.pgid

    def targets(self, snap, forced):
        """Live processes the drain must end, parents before children.

        Natural exit: the group. Forced stop: the group, and every child we
        adopted that is not a preserved service, with its descendants."""
        members = [p for p in snap.group(self.pgid) if p.live]
        if not forced:
            return members
        roots = [p for p in snap.children(self.me)
                 if p.identity not in self.preserved and p.identity not in self.foreign]
        tree = [p for p in snap.subtree(roots) if p.live and p.identity not in self.foreign]
        seen = set(p.pid for p in tree)
        return tree + [p for p in members if p.pid not in seen]

    def freeze(self, snap, targets):
        """SIGSTOP the group and each target outside it that is provably ours,
        parents first, so none forks again. Returns how many were new."""
        self.signal_group(signal.SIGSTOP)
        outside = [p for p in targets if p.pgid != self.pgid and p.identity not in self.frozen]
        proven = self._prove(snap, outside)
        try:
            for pin in proven:
                self._send(pin, signal.SIGSTOP)
                self.frozen.add(pin.proc.identity)
        finally:
            _close_pins(proven)
        return len(proven)

    def kill(self, snap, targets):
        """SIGKILL the group and each target outside it that is provably ours;
        return pins to wait on for what was signalled. Children die before
        their parents, so no parent's death re-parents a child between its
        proof and its signal. What cannot be proven is adopted, and ours, once
        its parent dies: the next round kills it."""
        outside = [p for p in targets if p.pgid != self.pgid]
        proven = self._prove(snap, outside)
        try:
            self.signal_group(signal.SIGKILL)
            for pin in reversed(proven):
                self._send(pin, signal.SIGKILL)
            return proven + self.pins([p for p in targets if p.pgid == self.pgid])
        except BaseException:
            _close_pins(proven)
            raise

    def signal_group(self, sig):
        """Signal the group, and the command itself if it left the group (our
        unreaped child: its pid is ours)."""
        _kill_group(self.pgid, sig)
        if self._left_group(read_proc(self.pgid)):
            _kill_child(self.pgid, sig)

    def pins(self, procs):
        """Pins for waiting only. A pid reused in the instant between the scan
        and the pin would cost a longer wait, never a wrong signal."""
        self._make_fd_room(len(procs))
        pins = []
        try:
            for proc in procs:
                try:
                    pins.append(_Pin(proc, self._pidfd(proc.pid)))
                except ProcessLookupError:
                    pass  # already gone
        except BaseException:
            _close_pins(pins)
            raise
        return pins

    def reap_zombies(self, snap):
        """Reap adopted children that exited; the command waits for the end."""
        for proc in snap.children(self.me):
            if not proc.live and proc.pid != self.pgid:
                try:
                    os.waitpid(proc.pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def _prove(self, snap, procs):
        """Pins on the processes (parents first) that are provably ours now:
        our own unreaped children, and processes whose parent is proven or a
        current member of the group. The rest are skipped."""
        self._make_fd_room(len(procs))
        trusted, proven = {self.me}, []
        try:
            for proc in procs:
                if proc.ppid == self.me:
                    pin = (self.pins([proc]) or [None])[0]
                elif proc.ppid in trusted or self._still_member(snap, proc.ppid):
                    pin = self._pin_verified(snap, proc)
                else:
                    continue
                if pin is not None:
                    trusted.add(proc.pid)
                    proven.append(pin)
        except BaseException:
            _close_pins(proven)
            raise
        return proven

    def _send(self, pin, sig):
        """Through the pin's pidfd; by pid only for our own unreaped children,
        the only pins that may lack a pidfd."""
        if pin.fd is None:
            _kill_child(pin.proc.pid, sig)
            return
        try:
            pidfd_send_signal(pin.fd, sig)
        except (ProcessLookupError, PermissionError):
            pass  # exited since the proof, or setuid: it stays a survivor

    def _still_member(self, snap, pid):
        """Is pid, now, the same process as in the snapshot and in our group?"""
        then, now = snap.procs.get(pid), read_proc(pid)
        return (then is not None and now is not None and now.start == then.start
                and now.pgid == self.pgid)

    def _pin_verified(self, snap, proc):
        """A pidfd on proc, kept only if /proc shows, after it was taken, the
        same process under the same parent, and the pidfd then shows it alive:
        so the pin holds the process the snapshot saw, and that one is ours."""
        try:
            fd = self._pidfd(proc.pid)
        except ProcessLookupError:
            return None
        if fd is None:
            return None
        now = read_proc(proc.pid)
        if (now is None or now.start != proc.start or now.ppid != proc.ppid
                or _readable(fd)):
            os.close(fd)
            return None
        return _Pin(proc, fd)

    def _pidfd(self, pid):
        """A pidfd, or None: no pidfds here, or no fd left (then a waiting pin
        polls /proc and a process to prove waits for the next round)."""
        if not self.pidfds:
            return None
        try:
            fd = pidfd_open(pid)
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                return None
            raise
        if fd is None:
            self.pidfds = False
        return fd

    def _make_fd_room(self, wanted):
        """Before pinning hundreds at once, lift our soft RLIMIT_NOFILE to the
        hard one, while an fd is still free to load `resource`. The command
        started with the caller's limit; release() puts ours back."""
        if wanted < 200 or self.saved_fd_limit is not None:
            return
        import resource
        self.saved_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard = self.saved_fd_limit[1]
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass  # a hard limit above what the kernel allows: keep ours

    def release(self):
        if self.saved_fd_limit is not None:
            import resource
            resource.setrlimit(resource.RLIMIT_NOFILE, self.saved_fd_limit)
            self.saved_fd_limit = None


def _close_pins(pins):
    for pin in pins:
        pin.close()


# --- Signals, the stop file, and waiting ----------------------------------------------------

class _SignalCatcher(object):
    """This run's signal dispositions: handlers only record and wake the loop
    (through set_wakeup_fd); everything is restored by close()."""

    def __init__(self):
        self.pending = []
        self.saved = {}
        self.ignored_by_caller = set()
        self.caller_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        read_end, write_end = os.pipe()
        self.read_end, self.write_end = _high_fd(read_end), _high_fd(write_end)
        for fd in (self.read_end, self.write_end):
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
            self._install()
        except BaseException:
            self.close()
            raise

    def _install(self):
        for sig in STOP_SIGNALS + FORWARDED_SIGNALS + (signal.SIGTSTP,):
            # nohup and background shells: a signal the caller ignored stays
            # ignored. Not SIGXFSZ: CPython itself ignores it at start.
            if sig != signal.SIGXFSZ and signal.getsignal(sig) == signal.SIG_IGN:
                self.ignored_by_caller.add(sig)
                continue
            try:
                self.saved[sig] = signal.signal(sig, self._record)
            except OSError:  # EINVAL: one the C library keeps for itself
                pass
        # Always ours, whatever the caller left: SIGCHLD wakes us, SIGPIPE must
        # not kill us when stderr is a closed pipe.
        self.saved[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._record)
        self.saved[signal.SIGPIPE] = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        handled = [s for s in self.saved if s != signal.SIGPIPE]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)

    def _record(self, signum, frame):
        self.pending.append(signum)

    def handles(self, sig):
        return sig in self.saved

    def always_handle(self, sig):
        """Handle sig even if the caller ignored it; the command still gets it
        ignored, as the caller meant."""
        if sig not in self.saved:
            self.saved[sig] = signal.signal(sig, self._record)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])

    def take(self):
        """Signals received since the last call, oldest first."""
        _discard_pending(self.read_end)
        taken, self.pending = self.pending, []
        return taken

    def reset_for_command(self):
        """In the forked child, before exec: the caller's dispositions and mask,
        but SIGCHLD, SIGPIPE and SIGXFSZ at their defaults."""
        for sig in set(self.saved) | set(DEFAULTED_FOR_COMMAND):
            ignored = sig in self.ignored_by_caller and sig not in DEFAULTED_FOR_COMMAND
            signal.signal(sig, signal.SIG_IGN if ignored else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK,
                               set(self.caller_mask) - set(DEFAULTED_FOR_COMMAND))

    def close(self):
        signal.set_wakeup_fd(self.saved_wakeup)
        for sig, handler in self.saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.caller_mask)
        self._close_pipe()

    def _close_pipe(self):
        os.close(self.read_end)
        os.close(self.write_end)


class _StopFileWatch(object):
    """Notices the stop file: inotify on the deepest existing directory of its
    path, a slow safety check beside it, and polling where inotify is blind."""

    def __init__(self, path):
        self.path = path
        self.fd = None
        self.watched = None         # (directory, st_dev, st_ino)
        self.wd = None
        self.retired = False        # waiting is over: no more events wanted
        self.interval = STOP_FILE_POLL_INTERVAL
        try:
            libc = _libc()
            self.fd = _high_fd(libc.call("inotify_init1", IN_NONBLOCK | IN_CLOEXEC))
        except (OSError, AttributeError):
            return  # no inotify here (ENOSYS, EMFILE): poll
        self._rewatch()

    def exists(self):
        try:
            os.lstat(self.path)  # a dangling symlink counts
            return True
        except OSError:
            return False

    def due(self, now):
        """When the next check by time is due (inotify wakes us otherwise)."""
        return now + self.interval

    def fileno(self):
        return None if self.retired else self.fd

    def drain_events(self):
        _discard_pending(self.fd)  # which event it was does not matter: look again
        self._rewatch()

    def _rewatch(self):
        """Watch the deepest existing directory: the file's own once it exists.
        A watch follows its inode, so a directory renamed or replaced is
        watched anew."""
        directory = os.path.dirname(self.path)
        while True:
            try:
                st = os.stat(directory)
                if st.st_mode & 0o170000 == 0o040000:  # a directory
                    break
            except OSError:
                pass
            if directory == os.path.dirname(directory):
                return
            directory = os.path.dirname(directory)
        if (directory, st.st_dev, st.st_ino) == self.watched:
            return
        self.stop()
        mask = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
        try:
            self.wd = _libc().call("inotify_add_watch", self.fd, os.fsencode(directory), mask)
        except OSError:  # ENOSPC (watch limit), EACCES: poll instead
            self.interval = STOP_FILE_POLL_INTERVAL
            return
        self.watched = (directory, st.st_dev, st.st_ino)
        self.interval = (STOP_FILE_POLL_INTERVAL if _inotify_blind(directory)
                         else STOP_FILE_SAFETY_INTERVAL)

    def stop(self):
        """Remove the watch. Closing an inotify fd that still watches waits for
        the kernel to reap the watch (up to 16 ms measured); removed early, the
        watch is reaped in the background and the close is instant."""
        if self.wd is not None:
            try:
                _libc().call("inotify_rm_watch", self.fd, self.wd)
            except OSError:
                pass  # EINVAL: the kernel dropped it already (directory deleted)
            self.wd, self.watched = None, None

    def retire(self):
        """Waiting is over: remove the watch now, close the fd at the end (see
        stop()), and offer no fd to wait on meanwhile."""
        self.stop()
        self.retired = True

    def close(self):
        if self.fd is not None:
            self.stop()
            os.close(self.fd)
            self.fd = None


def _inotify_blind(directory):
    """Is directory on a filesystem whose remote changes inotify never sees?"""
    libc = _libc()
    buf = libc.ctypes.create_string_buffer(256)  # struct statfs; f_type first
    try:
        libc.call("statfs", os.fsencode(directory), buf)
    except OSError:
        return True
    f_type = int.from_bytes(buf.raw[:libc.ctypes.sizeof(libc.ctypes.c_long)], sys.byteorder)
    return f_type & 0xFFFFFFFF in INOTIFY_BLIND_FILESYSTEMS


def _wait_readable(fds, seconds):
    """The fds that became readable within `seconds`. select() keeps the
    deadline to the microsecond; poll() (whole milliseconds, rounded up, so
    up to 1 ms late) serves fds above select's limit and waits beyond a day."""
    seconds = max(seconds, 0.0)
    if max(fds) < SELECT_FD_LIMIT and seconds < MAX_SELECT_SECONDS:
        return select.select(fds, (), (), seconds)[0]
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(min(MAX_POLL_MS, int(seconds * 1000) + 1))]


# --- The run ----------------------------------------------------------------------------------

class _Run(object):
    """Everything one supervise() call knows and decides."""

    def __init__(self, command, timeout, cleanup_timeout, stop_path, workdir):
        self.command = list(command)
        self.timeout, self.cleanup_timeout = timeout, cleanup_timeout
        self.stop_path, self.workdir = stop_path, workdir
        self.pid = None             # the command; its pid is its group id
        self.exit_info = None       # its waitid() result, once it exited
        self.reaped = False
        self.stop_reason = None
        self.stop_signal = None
        self.hurry = False          # a second stop signal: skip the grace
        self.error, self.error_exit = None, None
        self.ladder = []
        self.preserved, self.survivors = [], []
        self.tree = None
        self.inherited = set()
        self.catcher = None
        self.watch = None
        self.exec_report = None     # read end of the pipe the child reports on
        self.exec_report_data = b""
        self.failed = False         # an internal error: cleanup unconfirmed
        self.terminal = None        # fd 0 when we hand the terminal to the command
        self.subreaper_before = None
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.ended_running = None

    # Waiting: one place blocks in the kernel.
    def wait(self, until, fd=None):
        """Block until a signal, the stop file's watch, fd, or the time `until`."""
        watch_fd = self.watch.fileno() if self.watch else None
        fds = [f for f in (self.catcher.read_end, watch_fd, self.exec_report, fd)
               if f is not None]
        if watch_fd in _wait_readable(fds, until - time.monotonic()):
            self.watch.drain_events()

    def handle_signals(self):
        """Act on what arrived: forward, suspend, note a stop. Returns whether a
        stop signal came."""
        stopped = False
        for sig in self.catcher.take():
            if sig in FORWARDED_SIGNALS:
                if not self.reaped and self.pid is not None:
                    self.tree.signal_group(sig)
            elif sig == signal.SIGTSTP:
                if self.ended_running is None:
                    _suspend(self)
            elif sig in STOP_SIGNALS:
                stopped = True
                if self.ended_running is None and self.stop_signal is None:
                    self.stop_signal = sig  # the first decides
                else:
                    self.hurry = True  # a second one skips the grace
        return stopped

    def begin_step(self, name):
        now = time.monotonic()
        if self.ladder:
            self.ladder[-1][2] = now
        self.ladder.append([name, now, now])
        return now + self.cleanup_timeout

    def end_steps(self):
        if self.ladder:
            self.ladder[-1][2] = time.monotonic()

    def command_exited(self):
        """Has the command exited? Looks without reaping: its zombie keeps its
        pid, and so its group id, from being reused until the group is drained."""
        if self.exit_info is None and self.pid is not None:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is not None:
                self.exit_info = info
        return self.exit_info is not None

    def reap_if_child(self, pid):
        """Reap pid if it is an exited child of ours, but never the command
        before the end. Safe for any other pid: whatever zombie child holds
        it is ours to reap. Signals by pid come from a later look at /proc."""
        if pid != self.pid:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    @property
    def return_code(self):
        return _return_code(self.exit_info) if self.exit_info is not None else None


def _prepare(run):
    """Refuse what cannot work; become a subreaper; take over signals."""
    if not sys.platform.startswith("linux"):
        raise SupervisorError("supervisor.py needs Linux (prctl, /proc); this is %s" % sys.platform)
    try:
        proc_self = os.readlink("/proc/self")
    except OSError:
        raise SupervisorError("/proc is not mounted; mount it (mount -t proc proc /proc)")
    if proc_self != str(os.getpid()):
        raise SupervisorError("/proc belongs to another PID namespace; mount this one's "
                              "(unshare --mount-proc, or mount -t proc proc /proc)")
    try:
        run.subreaper_before = set_subreaper(True)
    except OSError as e:
        raise SupervisorError("cannot become a child subreaper (%s); Linux >= 3.4 needed" % e)
    run.catcher = _SignalCatcher()


def _inherited_children():
    """Identities of the children we had before the command (a shell's
    background jobs, before its exec) and their descendants: the caller's,
    never signalled, and their exits never pass for the command's."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WCONTINUED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return set()  # no children at all: the usual case, and no /proc scan
    snap = Snapshot(scan_proc())
    return set(p.identity for p in snap.subtree(snap.children(os.getpid())))


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
    if run.terminal is None or run.tree is None:
        return
    try:
        foreground = os.tcgetpgrp(run.terminal)
    except OSError:
        return
    if foreground != os.getpgrp() and (foreground == run.tree.pgid
                                       or not _group_exists(foreground)):
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
    terminal again if we were resumed in the foreground."""
    if run.pid is None or run.reaped:
        return
    run.tree.signal_group(signal.SIGSTOP)
    _take_back_terminal(run)
    if run.catcher.handles(signal.SIGTSTP):
        handler = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, handler)
    else:
        os.kill(os.getpid(), signal.SIGSTOP)
    if run.terminal is not None and _caller_terminal() is not None:
        _give_terminal(run.terminal, run.pid)
    run.tree.signal_group(signal.SIGCONT)


def _start_command(run):
    """Fork, and exec COMMAND in a process group of its own with the caller's
    stdio, environment, signal mask and ignored signals. A CLOEXEC pipe reports
    a failed exec; EOF on it means the exec happened."""
    read_end, write_end = os.pipe()
    read_end, write_end = _high_fd(read_end), _high_fd(write_end)
    # All signals blocked across fork: the child must not run our handlers.
    own_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _VALID_SIGNALS)
    try:
        run.started_wall, run.started = time.time(), time.monotonic()
        run.deadline = run.started + run.timeout
        pid = os.fork()
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
    run.pid = pid
    run.tree = ProcessTree(pid, run.inherited)
    os.set_blocking(read_end, False)
    run.exec_report = read_end  # read by the wait loop, bounded by the deadline
    if run.terminal is not None:
        _give_terminal(run.terminal, pid)


def _exec_command(run, report_fd):
    step = "setpgid"
    try:
        os.setpgid(0, 0)
        if run.terminal is not None:
            step = "tcsetpgrp"
            os.tcsetpgrp(run.terminal, os.getpid())  # SIGTTOU is blocked here
        step = "chdir"
        os.chdir(run.workdir)
        run.catcher.reset_for_command()
        step = "exec"
        os.execvp(run.command[0], run.command)
    except (OSError, ValueError, TypeError) as e:
        code = getattr(e, "errno", None) or errno.EINVAL
        os.write(report_fd, ("%s %d" % (step, code)).encode())
    finally:
        os._exit(EXIT_NOT_FOUND)


def _check_exec_report(run):
    """Read what the child said about its exec: nothing (EOF: it exec'd, or
    died before), or the step and errno that failed."""
    try:
        while True:
            chunk = os.read(run.exec_report, 512)
            if not chunk:
                break
            run.exec_report_data += chunk
    except BlockingIOError:
        return  # not yet: the child is still on its way to exec
    os.close(run.exec_report)
    run.exec_report = None
    if run.exec_report_data:
        _note_exec_failure(run, run.exec_report_data)


def _note_exec_failure(run, report):
    step, _, code = report.decode().partition(" ")
    code = int(code)
    os.waitpid(run.pid, 0)  # the child exited without running COMMAND
    run.pid, run.reaped = None, True
    reason = os.strerror(code)
    if step == "exec":
        run.error = "cannot run %r: %s" % (run.command[0], reason)
        run.error_exit = (EXIT_NOT_FOUND if code in (errno.ENOENT, errno.ENOTDIR)
                          else EXIT_CANNOT_EXECUTE)
    else:
        run.error = "cannot start the command (%s): %s" % (step, reason)
        run.error_exit = EXIT_FAILURE


def _reap_orphans(run):
    """While the command runs: reap every adopted orphan that exited, so zombies
    never pile up. waitid(WNOWAIT) looks first, so the command is never reaped."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == run.pid:
            return
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass


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


def _wait_for_end(run):
    """Block until the command exits (or fails to start), the deadline passes,
    the stop file appears or a stop signal arrives; the first of them decides."""
    while True:
        stop_signalled = run.handle_signals()
        if run.exec_report is not None:
            _check_exec_report(run)
            if run.reaped:
                return  # it never ran
        _reap_orphans(run)
        if run.command_exited():
            if run.stop_signal is not None:  # it came with the exit: hurry the drain
                run.stop_signal, run.hurry = None, True
            return
        _check_job_control(run)
        now = time.monotonic()
        if stop_signalled:
            run.stop_reason = "signal"
        elif now >= run.deadline:
            run.stop_reason = "timeout"
        elif run.watch is not None and run.watch.exists():
            run.stop_reason = "stop_file"
        if run.stop_reason:
            return
        until = run.deadline if run.watch is None else min(run.deadline, run.watch.due(now))
        run.wait(until)


def _await_exits(run, pins, deadline, interruptible=False):
    """Block until every pinned process has exited, reaping each one that was
    our child as it goes (the next look at /proc is shorter for it). False at
    the deadline, or, when interruptible, as soon as a second stop signal asks
    to hurry."""
    delay = EXIT_POLL_FIRST
    for pin in pins:
        while not pin.exited():
            run.handle_signals()
            if time.monotonic() >= deadline or (interruptible and run.hurry):
                return False
            if pin.fd is None:  # no pidfd: nothing will wake us, so poll
                run.wait(min(deadline, time.monotonic() + delay))
                delay = min(delay * 2, EXIT_POLL_MAX)
            else:
                run.wait(deadline, pin.fd)
        run.reap_if_child(pin.proc.pid)
    return True


def _await_command(run, deadline):
    """After SIGKILL: wait, bounded, for the command's own process to exit
    (SIGCHLD wakes us); it may sit in uninterruptible sleep."""
    while not run.command_exited() and time.monotonic() < deadline:
        run.handle_signals()
        run.wait(deadline)


def _drain(run, forced, deadline, snap=None):
    """Freeze, kill and wait until /proc shows none of the targets alive, or the
    deadline. Returns the survivors. Targets outside the group are frozen
    first, so a tree that keeps forking cannot outrun the drain."""
    tree = run.tree
    while True:
        snap = snap or tree.snapshot()
        tree.reap_zombies(snap)
        targets = tree.targets(snap, forced)
        if not targets or time.monotonic() >= deadline:
            return targets, snap
        unfrozen = [p for p in targets if p.pgid != tree.pgid and p.identity not in tree.frozen]
        if unfrozen and tree.freeze(snap, targets):
            snap = None  # rescan: catch children forked before their parent froze
            continue
        pins = tree.kill(snap, targets)
        try:
            if pins:
                _await_exits(run, pins, deadline)
            else:  # nothing provable yet: wait for an adoption (SIGCHLD) or a moment
                run.wait(min(deadline, time.monotonic() + EXIT_POLL_MAX))
        finally:
            _close_pins(pins)
        snap = None


def _finish_natural(run):
    """The command exited by itself: drain what is left of its group (SIGTERM,
    grace, SIGKILL). Children in other groups or sessions keep running."""
    _take_back_terminal(run)
    tree = run.tree
    # Frozen, no member can fork while we look: one look is then the truth.
    tree.signal_group(signal.SIGSTOP)
    snap = tree.snapshot()
    members = tree.targets(snap, forced=False)
    if members:
        grace_end = run.begin_step("terminating")
        tree.signal_group(signal.SIGTERM)
        tree.signal_group(signal.SIGCONT)
        pins = tree.pins(members)
        try:
            _await_exits(run, pins, grace_end, interruptible=True)
        finally:
            _close_pins(pins)
        snap = None
    deadline = run.begin_step("draining")
    run.survivors, snap = _drain(run, False, deadline, snap)
    run.end_steps()
    run.preserved = tree.left_running(snap)


def _stop_forced(run):
    """Deadline, stop file or signal: note the detached services to keep, then
    SIGTERM the group, grace, SIGKILL, and drain the group with every child
    adopted after the decision, in any group or session."""
    tree = run.tree
    grace_end = run.begin_step("terminating")
    # Frozen while we look, no member can die and hand us its children before
    # we have noted which children were adopted before the decision. SIGTERM
    # comes after the look: a stopped process still dies at once of a SIGTERM
    # it does not handle (the kernel's fatal-signal shortcut).
    tree.signal_group(signal.SIGSTOP)
    snap = tree.snapshot()
    run.preserved = tree.note_detached(snap)
    tree.signal_group(signal.SIGTERM)
    tree.signal_group(signal.SIGCONT)
    pins = tree.pins(tree.group_and_command(snap))
    try:
        _await_exits(run, pins, grace_end, interruptible=True)
    finally:
        _close_pins(pins)
    kill_end = run.begin_step("killing")
    # Even when all seemed gone: a member forked during the grace may not
    # fork again while the drain looks.
    tree.signal_group(signal.SIGKILL)
    _await_command(run, kill_end)
    deadline = run.begin_step("draining")
    run.survivors, _ = _drain(run, True, deadline)
    run.end_steps()


def _reap_command(run):
    """The group is drained: now the command's zombie may go."""
    if run.command_exited() and not run.reaped:
        os.waitid(os.P_PID, run.pid, os.WEXITED)
        run.reaped = True
    while True:  # and any orphan that exited after the last look
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _release(run):
    """Give back what the run took: terminal, signals, subreaper bit, fds."""
    _take_back_terminal(run)
    if run.watch is not None:
        run.watch.close()
    if run.exec_report is not None:
        os.close(run.exec_report)
        run.exec_report = None
    if run.tree is not None:
        run.tree.release()
    if run.catcher is not None:
        run.catcher.close()
    if run.subreaper_before is False:
        set_subreaper(False)


# --- The receipt --------------------------------------------------------------------------------

def _iso_utc(timestamp):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp)) + (
        ".%06dZ" % int(timestamp % 1 * 1e6))


def _describe(proc, detailed):
    entry = {"pid": proc.pid, "command": read_cmdline(proc.pid)}
    if detailed:
        entry.update(ppid=proc.ppid, pgid=proc.pgid, sid=proc.sid, state=proc.state)
    return entry


def _exit_status(run, confirmed):
    if not confirmed:
        return EXIT_FAILURE
    if run.error_exit is not None:
        return run.error_exit
    if run.stop_reason in ("timeout", "stop_file"):
        return EXIT_TIMED_OUT
    if run.stop_reason == "signal":
        return 128 + run.stop_signal
    code = run.return_code
    return code if code >= 0 else 128 - code


def _build_receipt(run, ended_wall, ended):
    confirmed = not run.survivors and not run.failed
    started_at = run.started_wall
    ladder = [{"step": name, "start_s": round(begin - run.started, 6),
               "duration_s": round(end - begin, 6)} for name, begin, end in run.ladder]
    cleanup_s = ended - run.ended_running if run.ended_running is not None else 0.0
    return {
        "schema_version": RECEIPT_SCHEMA_VERSION,
        "supervisor_version": __version__,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "command": [_text(arg) for arg in run.command],
        "workdir": _text(run.workdir),
        "pid": run.pid,
        "supervisor_pid": os.getpid(),
        "started_at": _iso_utc(started_at),
        "ended_at": _iso_utc(ended_wall),
        "duration_s": round(ended - run.started, 6),
        "timeout_s": run.timeout,
        "cleanup_timeout_s": run.cleanup_timeout,
        "stop_reason": run.stop_reason or "exit",
        "signal": signal_name(run.stop_signal) if run.stop_signal else None,
        "timed_out": run.stop_reason == "timeout",
        "return_code": run.return_code,
        "exit_status": _exit_status(run, confirmed),
        "cleanup_confirmed": confirmed,
        "cleanup_s": round(cleanup_s, 6),
        "ladder": ladder,
        "preserved": [_describe(p, False) for p in run.preserved],
        "survivors": [_describe(p, True) for p in run.survivors],
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


def _json(value, indent=""):
    """JSON as json.dumps(indent=2, ensure_ascii=True) writes it, without its
    import (json pulls in re: ms on every run that writes a receipt)."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "null"
    if isinstance(value, str):
        return '"%s"' % "".join(
            c if " " <= c <= "~" else _json_char(c) for c in value.translate(_JSON_ESCAPES))
    inner = indent + "  "
    if isinstance(value, dict):
        items = ["%s%s: %s" % (inner, _json(str(k)), _json(v, inner)) for k, v in value.items()]
        return "{\n%s\n%s}" % (",\n".join(items), indent) if items else "{}"
    items = [inner + _json(v, inner) for v in value]
    return "[\n%s\n%s]" % (",\n".join(items), indent) if items else "[]"


def _json_char(c):
    code = ord(c)
    if code < 0x10000:
        return "\\u%04x" % code
    code -= 0x10000  # outside the BMP: a surrogate pair
    return "\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF))


def write_receipt(receipt, path):
    """Write receipt to path atomically: a temporary file in the same
    directory, flushed and fsynced, renamed over path, the directory fsynced.
    A reader sees no file or a whole receipt; no temporary file is left."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, ".%s.%d.tmp" % (name, os.getpid()))
    data = (_json(receipt) + "\n").encode("ascii")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        _unlink_quietly(temporary)
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


# --- The API -----------------------------------------------------------------------------------

def exec_timeout(timeout, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT):
    """The bound a controller gives the exec that runs the supervisor: the
    deadline, each bounded cleanup phase, and slack for start-up and I/O."""
    return timeout + CLEANUP_PHASE_COUNT * cleanup_timeout + EXEC_TIMEOUT_SLACK


def _check_seconds(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise UsageError("%s: must be a positive, finite number of seconds, not %r" % (name, value))
    return float(value)


def supervise(command, timeout, cleanup_timeout=DEFAULT_CLEANUP_TIMEOUT, stop_path=None,
              *, workdir=None, stop_with_parent=None):
    """Run command under a deadline, drain what it leaves, return the receipt.

    command is an argv list of str (or bytes); timeout and cleanup_timeout
    are seconds; the run is stopped when anything exists at stop_path;
    workdir is the command's current directory. stop_with_parent, the pid of
    this process's parent, stops the run as SIGTERM would when that parent
    dies (even if the caller ignored SIGTERM; the command still starts with it
    ignored). Must run in the main thread of a single-threaded process on
    Linux. Raises SupervisorError (UsageError for bad arguments) before
    anything starts. Once the command started, a receipt always comes back: a
    command that cannot be executed, or a failure of the supervisor itself,
    is in its error and exit_status.
    """
    command = _check_command(command)
    timeout = _check_seconds(timeout, "timeout")
    cleanup_timeout = _check_seconds(cleanup_timeout, "cleanup_timeout")
    workdir = os.path.abspath(workdir if workdir is not None else os.getcwd())
    stop_path = os.path.abspath(stop_path) if stop_path is not None else None
    run = _Run(command, timeout, cleanup_timeout, stop_path, workdir)
    try:
        _prepare(run)
        if stop_with_parent is not None:
            _stop_with_parent(run, stop_with_parent)
        run.inherited = _inherited_children()
        if stop_path is not None:
            run.watch = _StopFileWatch(stop_path)
        if run.handle_signals():
            run.stop_reason = "signal"
        elif run.watch is not None and run.watch.exists():
            run.stop_reason = "stop_file"  # before the start: never started
        else:
            run.terminal = _caller_terminal()
            _start_command(run)
            _supervise_started(run)
    except BaseException:
        _abandon(run)
        raise
    finally:
        ended_wall, ended = time.time(), time.monotonic()
        _release(run)
    return _build_receipt(run, ended_wall, ended)


def _supervise_started(run):
    """The command is started: wait, then drain; a failure of ours from here
    on still ends in a receipt, one that does not confirm the cleanup."""
    try:
        _wait_for_end(run)
        run.ended_running = time.monotonic()
        if run.watch is not None:
            run.watch.retire()
        if run.reaped:
            return  # the exec failed: nothing ran
        if run.stop_reason is None:
            _finish_natural(run)
        else:
            _stop_forced(run)
        _reap_command(run)
    except Exception as e:
        run.failed = True
        run.error = "supervisor failed: %s: %s" % (type(e).__name__, e)
        _abandon(run)


def _check_command(command):
    if isinstance(command, (str, bytes)) or not command:
        raise UsageError("no command given: put it after -- (an argv list)")
    command = list(command)
    for arg in command:
        if not isinstance(arg, (str, bytes)):
            raise UsageError("command: arguments must be strings, not %r" % (arg,))
        if ("\0" if isinstance(arg, str) else b"\0") in arg:
            raise UsageError("command: %r holds a NUL byte" % (arg,))
    return command


def _stop_with_parent(run, parent):
    """The parent's death arrives as SIGTERM (PR_SET_PDEATHSIG); a parent that
    died before we asked shows as a new parent pid."""
    run.catcher.always_handle(signal.SIGTERM)
    _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:
        run.catcher.pending.append(signal.SIGTERM)


def _abandon(run):
    """The supervisor itself failed mid-run: kill the group rather than leave
    it running unsupervised (its leader is still held, so the id is ours)."""
    if run.pid is not None and not run.reaped and run.tree is not None:
        run.tree.signal_group(signal.SIGKILL)


# --- The command line ------------------------------------------------------------------------

USAGE = """\
usage: supervisor.py --timeout SECONDS [OPTIONS] -- COMMAND [ARG...]

Run COMMAND under a deadline, drain every process it leaves behind, and
write a JSON receipt that says what happened.

options:
  --timeout SECONDS          the deadline, from the command's start (required);
                             a number with an optional unit: 90, 1.5, 10m, 2h, 1d
  --cleanup-timeout SECONDS  bound of each cleanup phase (default 10)
  --stop-file PATH           stop the run as soon as anything exists at PATH
  --receipt PATH             write the receipt there (outside the workdir)
  --workdir DIR              the command's current directory (default: this one)
  --new-session              leave the caller's session first, so that a kill of
                             the caller's process group cannot stop the drain
  -h, --help                 show this help and exit
  --version                  show the version and exit

exit status: COMMAND's own; 124 deadline or stop file; 125 supervisor failure
or cleanup not confirmed; 126 cannot execute; 127 not found; 128+N signal N.
"""

_VALUE_OPTIONS = ("--timeout", "--cleanup-timeout", "--stop-file", "--receipt", "--workdir")


def parse_duration(text, option="--timeout"):
    """Seconds from '90', '1.5', '10m', '2h', '1d', as timeout(1) reads them.
    Refuses zero, negatives, nan, inf, what rounds to zero, and garbage."""
    number, unit = text.strip(), 1
    if number[-1:] in DURATION_UNITS:
        number, unit = number[:-1], DURATION_UNITS[number[-1]]
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
        self.stop_file = self.receipt = self.workdir = None
        self.new_session = False
        self.command = []
        self.show = None  # "help" or "version"


def parse_args(argv):
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
        name, has_value, value = arg.partition("=")
        if name in ("-h", "--help", "--version") and not has_value:
            options.show = "version" if name == "--version" else "help"
            return options
        if name == "--new-session" and not has_value:
            options.new_session = True
        elif name in _VALUE_OPTIONS:
            if not has_value:
                i += 1
                if i == len(argv):
                    raise UsageError("%s needs a value" % name)
                value = argv[i]
            _set_option(options, name, value)
        else:
            raise UsageError("unknown option %s (see --help)" % arg)
        i += 1
    if options.timeout is None:
        raise UsageError("--timeout is required (seconds, e.g. --timeout 600)")
    if not options.command:
        raise UsageError("no command given: put it after --")
    return options


def _set_option(options, name, value):
    if name in ("--timeout", "--cleanup-timeout"):
        setattr(options, name[2:].replace("-", "_"), parse_duration(value, name))
    elif not value:
        raise UsageError("%s: the path is empty" % name)
    else:
        setattr(options, name[2:].replace("-", "_"), value)


def _check_workdir(options):
    workdir = os.path.abspath(options.workdir or os.getcwd())
    if not os.path.isdir(workdir):
        what = "is not a directory" if os.path.exists(workdir) else "does not exist"
        raise UsageError("--workdir: %s %s" % (workdir, what))
    if not os.access(workdir, os.X_OK):
        raise UsageError("--workdir: cannot enter %s (permission denied)" % workdir)
    return workdir


def _check_receipt_path(path, workdir):
    """Refuse a receipt inside the workdir (through symlinks and .. too), then
    create its missing directories and prove one can write there. On failure
    nothing is left behind."""
    real, real_workdir = os.path.realpath(path), os.path.realpath(workdir)
    if real == real_workdir or real.startswith(real_workdir.rstrip("/") + "/"):
        raise UsageError("--receipt: %s resolves to %s, inside the workdir %s; "
                         "put the receipt outside it" % (path, real, real_workdir))
    if os.path.isdir(real):
        raise UsageError("--receipt: %s is a directory; name a file" % path)
    directory = os.path.dirname(real)
    created = _make_directories(directory)
    probe = os.path.join(directory, ".%s.%d.probe" % (os.path.basename(real), os.getpid()))
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
    except OSError as e:
        _remove_directories(created)
        raise UsageError("--receipt: cannot write in %s: %s" % (directory, e.strerror))
    return real


def _make_directories(directory):
    """os.makedirs that remembers what it made, and undoes it on failure."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    created = []
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except OSError as e:
            _remove_directories(created)
            raise UsageError("--receipt: cannot create %s: %s" % (path, e.strerror))
        created.append(path)
    return created


def _remove_directories(created):
    for path in reversed(created):
        try:
            os.rmdir(path)
        except OSError:
            pass


def _complain(message):
    """One line on stderr; dropped when stderr is closed or a broken pipe."""
    try:
        os.write(2, ("supervisor.py: %s\n" % message).encode("utf-8", "replace"))
    except OSError:
        pass


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
    (PR_SET_PDEATHSIG, set by supervise) and stops the run. Returns the
    relay's pid, in the child only."""
    relay = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        return relay
    for sig in STOP_SIGNALS + FORWARDED_SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            # The relay's only work: one kill() to its child, still unreaped.
            signal.signal(sig, lambda signum, frame: _kill_child(pid, signum))
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
              "unconfirmed" % signal_name(os.WTERMSIG(status)))
    _exit(EXIT_FAILURE)


def main(argv=None):
    """The command line: parse, check, supervise, write the receipt. Returns
    the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        options = parse_args(argv)
        if options.show == "help":
            _print(USAGE)
            return 0
        if options.show == "version":
            _print("supervisor.py %s\n" % __version__)
            return 0
        if not sys.platform.startswith("linux"):
            raise SupervisorError("supervisor.py needs Linux (prctl, /proc); this is %s"
                                  % sys.platform)
        workdir = _check_workdir(options)
        receipt_path = None
        if options.receipt is not None:
            receipt_path = _check_receipt_path(options.receipt, workdir)
        relay = _relay_into_new_session() if options.new_session else None
        receipt = supervise(options.command, options.timeout, options.cleanup_timeout,
                            options.stop_file, workdir=workdir, stop_with_parent=relay)
    except SupervisorError as e:
        _complain(str(e))
        return EXIT_FAILURE
    except Exception as e:  # a bug: still one line, and the sandbox is suspect
        _complain("internal error: %s: %s" % (type(e).__name__, e))
        return EXIT_FAILURE
    if receipt["error"]:
        _complain(receipt["error"])
    if not receipt["cleanup_confirmed"]:
        _complain("cleanup not confirmed: %d process(es) still alive (%s); do not "
                  "reuse this sandbox" % (len(receipt["survivors"]), ", ".join(
                      str(s["pid"]) for s in receipt["survivors"][:10])))
    if receipt_path is not None:
        try:
            write_receipt(receipt, receipt_path)
        except OSError as e:
            _complain("--receipt: cannot write %s: %s" % (receipt_path, e.strerror or e))
            return EXIT_FAILURE
    return receipt["exit_status"]


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
