"""PID 1 of a fresh PID namespace: run a command, then report what is left.

    unshare --pid --fork --mount-proc python ns_init.py COMMAND...

Runs COMMAND as its child (reaping every orphan meanwhile, as an init must),
then prints "EXIT <status>" and "LEFT <pid> <state> <comm>" for every process
still alive in the namespace but itself (five looks, 20 ms apart), and exits: the kernel then kills them all,
so nothing a test starts here can escape it.
"""
import os
import sys
import time


def main(argv):
    pid = os.fork()
    if pid == 0:
        os.execvp(argv[1], argv[1:])
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            break
    # Several looks, 20 ms apart: one scan can miss a process that replaces
    # itself faster than the scan reads /proc.
    left = {}
    for _ in range(5):
        left.update(live_processes())
        time.sleep(0.02)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    sys.stdout.write("EXIT %d\n%s" % (code, "".join(
        "LEFT %d %s\n" % (pid, what) for pid, what in sorted(left.items()))))
    sys.stdout.flush()


def live_processes():
    """{pid: "state comm"} for every live process here but this one."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/%s/stat" % name) as f:
                    data = f.read()
            except OSError:
                continue
            state = data[data.rindex(")") + 2]
            if state not in "ZX":
                found[int(name)] = "%s %s" % (state, data[data.index("(") + 1:data.rindex(")")])
    return found


if __name__ == "__main__":
    main(sys.argv)
