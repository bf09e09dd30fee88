"""Processes that keep replacing themselves, bounded by construction.

    python respawner.py tree DEPTH INTERVAL GENERATIONS
    python respawner.py daemon INTERVAL GENERATIONS [HOLD]

tree: a binary tree of 2**DEPTH - 1 processes, each in a session of its own;
once all are up the root prints "READY", and each leaf then replaces itself
every INTERVAL seconds (it forks its successor and exits), at most
GENERATIONS times. Live processes: always 2**DEPTH - 1 at most.

daemon: the command forks a daemon in a session of its own, prints "READY",
and reports "TERM" for each SIGTERM it gets, living on; the daemon ignores
SIGTERM and re-forks
every INTERVAL seconds (the parent exits, the child goes on) at most
GENERATIONS times, so each generation is adopted by the nearest subreaper and
exits there as a zombie to reap. While a file HOLD exists, the daemon waits
before its next fork (it holds still: a test can then count what is left).

Every exit leaves a zombie for the nearest subreaper; one that loses the
race for the CPU lets them pile up. So that a storm can never fill the PID
space of the host (and make a fork elsewhere fail), a process about to fork
first waits while the host has more than MAX_TASKS tasks (/proc/loadavg).

Stdlib only, Python 3.6+.
"""
import os
import signal
import sys
import time

MAX_TASKS = 12000


def host_tasks():
    with open("/proc/loadavg", "rb") as f:
        return int(f.read().split()[3].split(b"/")[1])


def replace_itself(interval, generations, hold=None):
    """Fork a successor and exit, again and again: every exit leaves the
    successor an orphan for the nearest subreaper, and a zombie behind."""
    for _ in range(generations):
        time.sleep(interval)
        while host_tasks() > MAX_TASKS or (hold is not None and os.path.exists(hold)):
            time.sleep(0.01)
        if os.fork():
            os._exit(0)
    os._exit(0)


def tree(depth, interval, generations, report_fd):
    os.setsid()
    if depth == 1:
        os.write(report_fd, b"x")
        replace_itself(interval, generations)
    for _ in range(2):
        if os.fork() == 0:
            tree(depth - 1, interval, generations, report_fd)
    os.write(report_fd, b"x")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its children never linger as zombies
    while True:
        signal.pause()


def main(argv):
    kind = argv[1]
    if kind == "tree":
        depth, interval, generations = int(argv[2]), float(argv[3]), int(argv[4])
        read_end, write_end = os.pipe()
        if os.fork() == 0:
            os.close(read_end)
            tree(depth, interval, generations, write_end)
        os.close(write_end)
        wanted, got = 2 ** depth - 1, 0
        while got < wanted:
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            got += len(chunk)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, b"READY %d\n" % got)
    else:
        interval, generations = float(argv[2]), int(argv[3])
        hold = os.path.abspath(argv[4]) if len(argv) > 4 else None
        signal.signal(signal.SIGTERM, lambda signum, frame: os.write(1, b"TERM\n"))
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the first daemon never lingers
        if os.fork() == 0:
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # it floods through the grace
            replace_itself(interval, generations, hold)
        os.write(1, b"READY\n")
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv)
