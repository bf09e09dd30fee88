"""Build a process tree from a JSON spec, report it, then wait to be killed.

    python tree.py SPEC

SPEC is a node: {"name": str, "session": bool, "group": bool,
"ignore_term": bool, "detach": bool, "exit_early": bool, "exit_code": int,
"stop_self": bool, "report_term": bool, "children": [nodes]}.
session: setsid(); group: setpgid(0, 0); ignore_term: SIGTERM ignored;
report_term: SIGTERM caught, "TERM name" printed, and the node lives on;
detach: started through an intermediate process that exits at once, so the
node is adopted by the nearest subreaper; exit_early: exits once its
subtree is built, so its children are adopted (the root: the command exits
by itself, with exit_code); stop_self: SIGSTOPs itself once reported.
Every node prints
"NODE name pid" when its subtree is built; the root then prints "READY".
Stdlib only and Python 3.6+, like supervisor.py. The tree is bounded by the
spec: nothing forks after READY.
"""
import json
import os
import signal
import sys


def build(node, report_fd):
    """Run in the node's own process: configure, spawn children, report."""
    if node.get("session"):
        os.setsid()
    elif node.get("group"):
        os.setpgid(0, 0)
    if node.get("report_term"):
        line = ("TERM %s\n" % node["name"]).encode()
        signal.signal(signal.SIGTERM, lambda signum, frame: os.write(1, line))
    else:
        signal.signal(signal.SIGTERM, signal.SIG_IGN if node.get("ignore_term") else signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, reap)
    for child in node.get("children", []):
        read_end, write_end = os.pipe()
        spawn(child, write_end)
        os.close(write_end)
        os.read(read_end, 1)  # the child's subtree is built
        os.close(read_end)
    os.write(1, ("NODE %s %d\n" % (node["name"], os.getpid())).encode())
    if report_fd is None:  # the root: the command itself
        os.write(1, b"READY\n")
    else:
        os.write(report_fd, b"x")
        os.close(report_fd)
    if node.get("exit_early"):
        os._exit(node.get("exit_code", 0))
    if node.get("stop_self"):
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        signal.pause()


def spawn(node, report_fd):
    pid = os.fork()
    if pid:
        if node.get("detach"):
            try:
                os.waitpid(pid, 0)  # the intermediate exits at once
            except ChildProcessError:
                pass  # the SIGCHLD reaper was first
        return
    try:
        if node.get("detach") and os.fork():
            os._exit(0)
        build(node, report_fd)
    finally:
        os._exit(1)


def reap(signum, frame):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


if __name__ == "__main__":
    build(json.loads(sys.argv[1]), None)
