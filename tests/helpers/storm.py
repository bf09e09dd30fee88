"""A bounded fork storm that is still forking when the drain starts.

    python storm.py N

N processes in all, bounded by construction: a pipe holds N tokens and every
fork takes one. Every process forks a child every few milliseconds while
tokens last, then pauses. Every third new process starts a session of its
own, every fifth ignores SIGTERM. Each process prints "P pid starttime" as it
starts; the first line comes at once, so a stop can land mid-storm.
"""
import os
import signal
import sys
import time


def start_time(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[19])


def live(tokens, index):
    if index % 3 == 1:
        os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN if index % 5 == 2 else signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the storm reaps itself
    os.write(1, ("P %d %d\n" % (os.getpid(), start_time(os.getpid()))).encode())
    while True:
        try:
            if not os.read(tokens, 1):  # EOF: no writer and no token left
                break
        except BlockingIOError:
            break
        if os.fork() == 0:
            live(tokens, index * 7 + 1)
            os._exit(0)
        index += 1
        time.sleep(0.005)
    while True:
        signal.pause()


if __name__ == "__main__":
    count = int(sys.argv[1])
    read_end, write_end = os.pipe()
    os.write(write_end, b"t" * (count - 1))  # the first process is this one
    os.close(write_end)
    os.set_blocking(read_end, False)
    live(read_end, 0)
