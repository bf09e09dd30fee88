"""Report what reaches this process: signals and lines of stdin.

    python catcher.py [--read]

Prints "GOT SIGUSR1" (and so on) for each of SIGUSR1, SIGUSR2, SIGWINCH and
SIGCONT it catches, "ready" once set up, and with --read "read LINE" for each
line of stdin (for terminal tests).
"""
import os
import signal
import sys


def say(text):
    os.write(1, (text + "\n").encode())


if __name__ == "__main__":
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGCONT):
        signal.signal(sig, lambda signum, frame: say("GOT " + signal.Signals(signum).name))
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # die of Ctrl-C, as most programs do
    say("ready")
    if "--read" in sys.argv:
        for line in sys.stdin:
            say("read " + line.strip())
    else:
        while True:
            signal.pause()
