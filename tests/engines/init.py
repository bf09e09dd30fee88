"""init.py COMMAND...: run COMMAND as a node's init would hold it: a child
subreaper that reaps every process orphaned below it at once, as PID 1
does on a real node. Under pytest (a subreaper that reaps only at a test's
end) an orphan's zombie would linger, and an engine that polls for its
processes to be gone (Ray's job supervisor: psutil counts a zombie that is
not its child as running) would wait on it. SIGTERM, SIGINT and SIGHUP are
passed to COMMAND; it exits with COMMAND's status once every process below
it is gone."""
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv):
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("init.py: cannot become a subreaper")
    child = subprocess.Popen(argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda sig, _: child.poll() is None and child.send_signal(sig))
    status = None
    while True:
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break  # nothing left below us
        except InterruptedError:
            continue
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(code)
            child.returncode = status
    sys.exit(128 - status if status is not None and status < 0 else status or 0)


if __name__ == "__main__":
    main(sys.argv[1:])
