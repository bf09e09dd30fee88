"""Where it runs: inherited signal state, every signal, a second stop signal,
terminals, PID 1, odd parents, durations, closed stdio.

Every test here runs under the interpreter that runs pytest; test_pythons.py
runs the version-dependent paths under every other CPython."""
import fcntl
import os
import pty
import select
import shlex
import signal
import subprocess
import termios
import time

import pytest

from conftest import (
    CGROUP_ROOT, HELPERS, IS_ROOT, PY, SUPERVISOR, alive, children_of, descendants, finish, kill_pinned, plain_signals,
    proc_stat, read_lines_until, read_receipt, run, run_supervisor, spawn, start_supervisor,
    start_tree, supervisor_cmd, tree_cmd, wait_until,
)

CATCHER = [PY, os.path.join(HELPERS, "catcher.py")]


def mask_of(*signals):
    return sum(1 << (s - 1) for s in signals)


def sig_masks(text):
    """{SigBlk: int, SigIgn: int} from grep output of /proc/self/status."""
    masks = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        masks[key] = int(value.strip(), 16)
    return masks


def caller(blocked=(), ignored=()):
    """preexec_fn: the state a parent hands us (nohup, a shell, a launcher),
    on top of a known one (whatever pytest was started with is reset)."""
    return plain_signals(blocked=blocked, ignored=ignored)


# --- 1. Inherited signal state ------------------------------------------------------------------

def test_command_gets_the_callers_mask_and_ignores_but_default_chld_pipe_xfsz(paths):
    blocked = (signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD, signal.SIGTERM)
    ignored = (signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)
    result = run_supervisor(*paths.options() + ["--", "grep", "-E", "^Sig(Blk|Ign)",
                                                "/proc/self/status"],
                            preexec_fn=caller(blocked, ignored))
    assert result.returncode == 0, result.stderr
    masks = sig_masks(result.stdout)
    assert masks["SigBlk"] == mask_of(signal.SIGUSR2, signal.SIGALRM, signal.SIGTERM)
    assert masks["SigIgn"] == mask_of(signal.SIGHUP, signal.SIGQUIT)


def test_blocked_and_ignored_sigchld_in_the_caller_do_not_break_waits(paths):
    prepare = caller(blocked=(signal.SIGCHLD, signal.SIGTERM), ignored=(signal.SIGCHLD,))
    result = run_supervisor(*paths.options() + ["--", "sh", "-c", "sleep 0.1 & wait; exit 6"],
                            preexec_fn=prepare)
    assert result.returncode == 6, result.stderr
    proc = start_supervisor(*paths.options() + ["--", "sh", "-c", "echo started; exec sleep 30"],
                            preexec_fn=prepare)
    read_lines_until(proc.stdout, "started")
    proc.send_signal(signal.SIGTERM)  # blocked in the caller, unblocked by us
    status, _, err = finish(proc)
    assert status == 137, err  # the command has it blocked too (the caller's mask): SIGKILL
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True


def until_go(status):
    """A command that says "started", then exits with status once the test
    creates the file `go` in the workdir: the run lasts until the test is done
    with it, however slow the machine."""
    return ["sh", "-c", "echo started; while [ ! -e go ]; do sleep 0.01; done; exit %d" % status]


def ignores(pid, sig):
    """Is sig ignored by pid (SigIgn of /proc/PID/status)? The kernel drops an
    ignored signal when it is sent: once kill() returns, nothing is pending."""
    with open("/proc/%d/status" % pid) as f:
        masks = sig_masks("".join(line for line in f if line.startswith("SigIgn")))
    return bool(masks["SigIgn"] & mask_of(sig))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_ignored_by_the_caller_stays_ignored(paths, sig):
    proc = start_supervisor(*paths.options() + ["--"] + until_go(9),
                            preexec_fn=caller(ignored=(sig,)))
    read_lines_until(proc.stdout, "started")
    assert ignores(proc.pid, sig)
    proc.send_signal(sig)
    (paths.work / "go").write_text("")
    status, _, err = finish(proc)
    assert status == 9, err
    assert read_receipt(paths.receipt)["stop_reason"] == "exit"


def test_sigpipe_kills_the_writer_of_a_closed_pipe_inside_the_command(paths):
    script = 'yes | head -n 1 >/dev/null; echo "yes: ${PIPESTATUS[0]}"'
    result = run_supervisor(*paths.options() + ["--", "bash", "-c", script],
                            preexec_fn=caller(ignored=(signal.SIGPIPE,)))
    assert result.returncode == 0
    assert result.stdout == "yes: %d\n" % (128 + signal.SIGPIPE)
    assert result.stderr == ""  # no "Broken pipe" from yes


# --- 2. Every signal has a meaning -------------------------------------------------------------

FATAL = ["SIGQUIT", "SIGALRM", "SIGVTALRM", "SIGXCPU", "SIGXFSZ", "SIGPROF", "SIGIO",
         "SIGPWR", "SIGSYS", "SIGSTKFLT"]


def signal_number(name):
    """SIGRTMIN+5 and friends; Python names SIGSTKFLT (16) only from 3.11."""
    base, _, offset = name.partition("+")
    return (getattr(signal, base, None) or {"SIGSTKFLT": 16}[base]) + int(offset or 0)


@pytest.mark.parametrize("name", FATAL + ["SIGRTMIN", "SIGRTMIN+5", "SIGRTMAX"])
def test_every_other_fatal_signal_is_a_forced_stop(paths, name):
    number = signal_number(name)
    proc = start_supervisor(*paths.options() + ["--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    proc.send_signal(number)
    status, _, err = finish(proc)
    assert status == 128 + number, err
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == name
    assert receipt["cleanup_confirmed"] is True


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH])
def test_usr1_usr2_winch_are_forwarded_to_the_group(paths, sig):
    proc = start_supervisor(*paths.options() + ["--"] + CATCHER)
    read_lines_until(proc.stdout, "ready")
    proc.send_signal(sig)
    read_lines_until(proc.stdout, "GOT " + signal.Signals(sig).name)
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 143, err


def test_sigpipe_to_the_supervisor_is_ignored(paths):
    proc = start_supervisor(*paths.options() + ["--"] + until_go(2))
    read_lines_until(proc.stdout, "started")
    assert ignores(proc.pid, signal.SIGPIPE)
    proc.send_signal(signal.SIGPIPE)
    (paths.work / "go").write_text("")
    status, _, err = finish(proc)
    assert status == 2, err


# --- 3. A second stop signal ----------------------------------------------------------------

def test_a_second_stop_signal_skips_the_grace(paths):
    spec = {"name": "cmd", "report_term": True, "children": [{"name": "m", "ignore_term": True}]}
    proc, nodes = start_tree(spec, *paths.options(cleanup=60))
    proc.send_signal(signal.SIGTERM)
    read_lines_until(proc.stdout, "TERM cmd")  # the grace has begun
    proc.send_signal(signal.SIGINT)
    status, _, err = finish(proc)
    assert status == 137, err  # the command lived through the grace: SIGKILL ended it
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM"
    assert receipt["cleanup_confirmed"] is True
    grace = receipt["ladder"][0]
    assert grace["step"] == "terminating" and grace["duration_s"] < 30  # not the 60 s grace
    assert not any(alive(pid) for pid in nodes.values())


def test_a_stop_signal_after_a_natural_exit_only_hurries_the_drain(paths):
    spec = {"name": "cmd", "exit_early": True, "exit_code": 3,
            "children": [{"name": "m", "report_term": True}]}
    proc, nodes = start_tree(spec, *paths.options(cleanup=60))
    read_lines_until(proc.stdout, "TERM m")  # the command exited, and the grace has begun
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 3, err
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "exit" and receipt["signal"] is None
    assert receipt["ladder"][0]["duration_s"] < 30 and receipt["cleanup_confirmed"] is True
    assert not alive(nodes["m"])


def test_sigtstp_suspends_the_run_and_sigcont_resumes_it(paths):
    # A process group of its own, below pytest: never orphaned, whatever group
    # pytest runs in (the kernel drops SIGTSTP in an orphaned group).
    proc = start_supervisor(*paths.options() + ["--"] + CATCHER, 
                            preexec_fn=plain_signals(then=lambda: os.setpgid(0, 0)))
    read_lines_until(proc.stdout, "ready")
    command = [p for p in descendants(proc.pid) if proc_stat(p)[1] == proc.pid][0]
    proc.send_signal(signal.SIGTSTP)
    assert wait_until(lambda: proc_stat(proc.pid)[0] == "T" and proc_stat(command)[0] == "T")
    proc.send_signal(signal.SIGCONT)
    read_lines_until(proc.stdout, "GOT SIGCONT")  # the command was resumed too
    assert proc_stat(proc.pid)[0] != "T"
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 143, err


# --- 4. Terminals ------------------------------------------------------------------------------

def spawn_in_pty(argv):
    """Start argv as a session leader with a new pseudo-terminal as its
    controlling terminal and stdio. Returns (process, master fd)."""
    master, slave = pty.openpty()

    def take_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=plain_signals(then=take_terminal), close_fds=True)
    os.close(slave)
    return proc, master


def read_pty_until(master, text, timeout=20.0):
    seen = b""
    end = time.monotonic() + timeout
    while text.encode() not in seen:
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise AssertionError("no %r on the terminal; saw %r" % (text, seen))
        if select.select([master], [], [], remaining)[0]:
            try:
                seen += os.read(master, 4096)
            except OSError:  # EIO: the other side closed
                raise AssertionError("terminal closed before %r; saw %r" % (text, seen))
    return seen.decode(errors="replace")


def test_ctrl_c_on_the_terminal_ends_the_command(paths):
    spec_member = "sleep 300 & echo $! > %s/member; exec %s --read" % (
        paths.work, shlex.join([PY, os.path.join(HELPERS, "catcher.py")]))
    proc, master = spawn_in_pty(supervisor_cmd(*paths.options() + ["--", "sh", "-c", spec_member]))
    try:
        read_pty_until(master, "ready")
        os.write(master, b"hello\n")  # the command has the terminal: it can read
        read_pty_until(master, "read hello")
        os.write(master, b"\x03")
        assert proc.wait(timeout=20) == 130
    finally:
        os.close(master)
    receipt = read_receipt(paths.receipt)
    assert receipt["return_code"] == -signal.SIGINT and receipt["cleanup_confirmed"] is True
    # The command's death, or the Ctrl-C the supervisor heard too, may come
    # first: either way the run was stopped by a Ctrl-C, and says so.
    assert (receipt["stop_reason"], receipt["signal"]) == ("signal", "SIGINT"), receipt
    assert not alive(int((paths.work / "member").read_text()))


def test_the_commands_own_sigint_to_its_group_is_not_a_ctrl_c(paths):
    """At a terminal the listener hears the terminal's signals only: a
    command that sends SIGINT to its own group (kill -INT 0) and catches it
    runs to its end."""
    script = "trap 'echo caught' INT; echo ready; kill -INT 0; sleep 0.3; exit 4"
    assert status_at_a_terminal(paths, script, "caught") == 4
    assert read_receipt(paths.receipt)["stop_reason"] == "exit"


def status_at_a_terminal(paths, script, until):
    """The supervisor on sh -c script at a terminal: its exit status, once
    `until` was read there."""
    proc, master = spawn_in_pty(supervisor_cmd(*paths.options() + ["--", "sh", "-c", script]))
    try:
        read_pty_until(master, until)
        return proc.wait(timeout=60)
    finally:
        os.close(master)


def test_a_command_that_killed_the_listener_may_die_of_sigint_later(paths):
    """The listener is a member of the command's group: a command may kill
    it (its pipe's end is then closed) and die of its own SIGINT later: an
    exit by SIGINT, 130, confirmed (it was a traceback, 125)."""
    script = ("for p in $(cat /proc/$PPID/task/$PPID/children); do [ $p = $$ ] || kill -9 $p; "
              "done; sleep 0.5; echo ready; kill -INT $$")
    assert status_at_a_terminal(paths, script, "ready") == 130
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "exit" and receipt["cleanup_confirmed"] is True, receipt


@pytest.mark.parametrize("key, sig", [(b"\x03", signal.SIGINT), (b"\x1c", signal.SIGQUIT)])
def test_ctrl_c_stops_a_command_that_catches_it_as_timeout_k_would(paths, key, sig):
    """The terminal's Ctrl-C (Ctrl-\\) goes to the command's group, which
    holds the terminal: a command that catches it runs on, unless the
    supervisor hears it too. It gets its signal, then the grace (-k 1), then
    SIGKILL; what it started is drained."""
    script = ("trap 'echo caught' INT QUIT; sleep 300 & echo $! > %s/member; echo ready; "
              "while :; do sleep 0.1; done" % paths.work)
    proc, master = spawn_in_pty(supervisor_cmd(*paths.options(timeout=120, cleanup=1) + [
        "--", "sh", "-c", script]))
    try:
        read_pty_until(master, "ready")
        # The supervisor's listener joins the command's group after the
        # command starts (under load, after "ready"): wait for it
        assert wait_until(lambda: ctrl_c_listener(proc.pid)), children_of(proc.pid)
        os.write(master, key)
        read_pty_until(master, "caught")
        assert proc.wait(timeout=60) == 137
    finally:
        os.close(master)
    receipt = read_receipt(paths.receipt)
    assert (receipt["stop_reason"], receipt["signal"]) == ("signal", signal.Signals(sig).name)
    assert receipt["stop_signal"] == signal.Signals(sig).name
    assert receipt["cleanup_confirmed"] is True and receipt["return_code"] == -signal.SIGKILL
    assert not alive(int((paths.work / "member").read_text()))


def ctrl_c_listener(supervisor):
    """The supervisor's child in the command's group that is not the command
    (_CtrlC): SIGINT and SIGQUIT are blocked in it from its fork (the
    supervisor's mask), so one sent once it is in the group is heard."""
    kids = dict((pid, os.getpgid(pid)) for pid in children_of(supervisor))
    return [pid for pid, group in kids.items() if group != pid and group in kids]


def test_under_pythoninspect_the_run_still_comes_first(paths):
    """Run as a script, main() waits for atexit (CPython frees the script's
    parse tree first); but python -i or PYTHONINSPECT open a prompt on a
    terminal before atexit, and the run would wait behind it: there main()
    runs at once."""
    argv = ["env", "PYTHONINSPECT=1"] + supervisor_cmd(*paths.options() + [
        "--", "sh", "-c", "echo command ran; exit 7"])
    assert run_in_pty_until(argv, "command ran", timeout=20) == 7
    assert read_receipt(paths.receipt)["return_code"] == 7


def run_in_pty_until(argv, line, timeout=60):
    """Start argv on a terminal of its own, wait for `line` on it, then for
    its exit: the status (killed and reaped whatever happens)."""
    proc, master = spawn_in_pty(argv)
    try:
        read_pty_until(master, line)
        return proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_terminal_comes_back_to_an_api_caller_after_a_failed_exec(tmp_path):
    probe = ("import os, sys\n"
             "sys.path.insert(0, %r)\n"
             "import supervisor\n"
             "r = supervisor.supervise(['/nonexistent-command'], 5)\n"
             "print('exit', r['exit_status'], 'foreground', os.tcgetpgrp(0) == os.getpgrp())\n"
             % os.path.dirname(SUPERVISOR))
    proc, master = spawn_in_pty([PY, "-c", probe])
    try:
        assert proc.wait(timeout=20) == 0
        out = read_pty_until(master, "foreground")
    finally:
        os.close(master)
    assert "exit 127 foreground True" in out


def test_ctrl_z_suspends_the_run_and_fg_resumes_it(paths):
    proc, master = spawn_in_pty(["env", "PS1=prompt$ ", "bash", "--norc", "--noprofile", "-i"])
    try:
        read_pty_until(master, "prompt$ ")
        command = shlex.join(supervisor_cmd(*paths.options() + ["--"] + CATCHER + ["--read"]))
        os.write(master, command.encode() + b"\n")
        read_pty_until(master, "ready")
        os.write(master, b"\x1a")
        read_pty_until(master, "Stopped")
        supervisor = [p for p in descendants(proc.pid) if (proc_stat(p) or "x")[1] == proc.pid]
        assert supervisor and proc_stat(supervisor[0])[0] == "T"
        command_pid = [p for p in descendants(supervisor[0])][0]
        # Its SIGSTOP takes when it next runs: on a loaded machine, after ours.
        assert wait_until(lambda: proc_stat(command_pid)[0] == "T", timeout=10)
        os.write(master, b"fg\n")
        os.write(master, b"again\n")
        read_pty_until(master, "read again")  # resumed, and it has the terminal again
        os.write(master, b"\x03")
        read_pty_until(master, "prompt$ ")  # Ctrl-C flushes what is typed before it
        os.write(master, b"echo status=$?\n")
        read_pty_until(master, "status=130")
        os.write(master, b"exit\n")
        proc.wait(timeout=20)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True


# --- 5. PID 1 ----------------------------------------------------------------------------------

def test_as_pid_1_of_a_pid_namespace(paths):
    if not IS_ROOT:
        pytest.skip("needs root for unshare --pid")
    script = ("(sleep 0.1 & echo orphan $!); (sleep 0.1 & echo orphan $!); "
              "setsid sh -c 'sleep 300' & echo started; exec sleep 30")
    proc = spawn(["unshare", "--pid", "--fork", "--mount-proc"]
                 + supervisor_cmd(*paths.options() + ["--", "sh", "-c", script]))
    lines = read_lines_until(proc.stdout, "started")
    supervisor = descendants(proc.pid)
    tree = dict((p, proc_stat(p)) for p in supervisor)
    pid1 = [p for p, s in tree.items() if s and s[1] == proc.pid][0]
    # The short-lived orphans (pids as the namespace sees them) exit and are
    # reaped by PID 1: gone from its list of children.
    orphans = [line.split()[1] for line in lines if line.startswith("orphan")]
    assert len(orphans) == 2

    def reaped():
        with open("/proc/%d/task/%d/children" % (pid1, pid1)) as f:
            children = f.read().split()
        return not any((proc_stat(int(p)) or ("Z",))[0] == "Z" for p in children)
    assert wait_until(reaped)
    os.kill(pid1, signal.SIGTERM)  # PID 1 has no default actions: ours must work
    status, _, err = finish(proc)
    assert status == 143, err
    receipt = read_receipt(paths.receipt)
    assert receipt["supervisor_pid"] == 1 and receipt["stop_reason"] == "signal"
    assert receipt["cleanup_confirmed"] is True
    assert not [p for p in supervisor if alive(p)]  # the namespace died with PID 1


# --- 6. Odd parents ----------------------------------------------------------------------------

def test_nested_supervisors_an_outer_stop_stops_the_inner_cleanly(paths, tmp_path, containment):
    kind, options = containment
    inner_receipt = tmp_path / "inner.json"
    inner = supervisor_cmd(*options + ["--timeout", 60, "--cleanup-timeout", 1, "--receipt",
                                       inner_receipt, "--workdir", paths.work, "--"] + tree_cmd(
                               {"name": "cmd", "children": [{"name": "tool", "session": True}]}))
    proc = start_supervisor(*paths.options(cleanup=5, stop=True) + options + ["--"] + inner)
    lines = read_lines_until(proc.stdout, "READY")
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    outer, inner = read_receipt(paths.receipt), read_receipt(inner_receipt)
    assert outer["cleanup_confirmed"] is True and outer["stop_reason"] == "stop_file"
    # The outer stop sends SIGTERM to every process of its run, the inner's
    # too: the inner supervisor sees its own SIGTERM, or its command's end.
    assert inner["cleanup_confirmed"] is True
    assert (inner["stop_reason"], inner["signal"]) in (("signal", "SIGTERM"), ("exit", None))
    assert outer["return_code"] == 143  # the inner one exited, it was not killed
    pids = [int(line.split()[2]) for line in lines if line.startswith("NODE")]
    assert not any(alive(pid) for pid in pids)
    assert outer["containment"] == inner["containment"] == kind
    if kind == "cgroup":  # each makes its cgroup below its own
        assert inner["cgroup"].startswith(outer["cgroup"] + "/")
        assert not os.path.exists(CGROUP_ROOT + outer["cgroup"])


def test_nested_supervisors_the_outer_drains_what_a_killed_inner_left(paths, tmp_path,
                                                                     containment):
    kind, options = containment
    spec = {"name": "cmd", "ignore_term": True, "children": [
        {"name": "a", "ignore_term": True}, {"name": "b", "session": True, "ignore_term": True}]}
    inner = supervisor_cmd(*options + ["--timeout", 60, "--cleanup-timeout", 30, "--receipt",
                                       tmp_path / "inner.json", "--workdir", paths.work, "--"]
                           + tree_cmd(spec))
    proc = start_supervisor(*paths.options(cleanup=0.5, stop=True) + options + ["--"] + inner)
    lines = read_lines_until(proc.stdout, "READY")
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 137, err
    outer = read_receipt(paths.receipt)
    assert outer["return_code"] == -signal.SIGKILL  # the inner supervisor was killed
    assert outer["cleanup_confirmed"] is True and outer["containment"] == kind
    assert not (tmp_path / "inner.json").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".inner")] == []
    pids = [int(line.split()[2]) for line in lines if line.startswith("NODE")]
    assert not any(alive(pid) for pid in pids)


def test_new_session_survives_a_kill_of_the_callers_group(paths):
    spec = {"name": "cmd", "children": [{"name": "m"}, {"name": "t", "session": True}]}
    proc, nodes = start_tree(spec, "--new-session", *paths.options(),
                             start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # what some exec launchers do on cancel
    proc.wait()
    assert wait_until(lambda: paths.receipt.exists(), timeout=20)
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM"
    assert receipt["cleanup_confirmed"] is True
    assert wait_until(lambda: not any(alive(pid) for pid in nodes.values()))


def test_new_session_stops_when_the_relay_dies_even_with_sigterm_ignored(paths):
    script = "grep SigIgn /proc/$$/status; echo ready; exec sleep 30"
    proc = start_supervisor("--new-session", *paths.options() + ["--", "sh", "-c", script],
                            start_new_session=True,
                            preexec_fn=caller(ignored=(signal.SIGTERM,)))
    lines = read_lines_until(proc.stdout, "ready")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: paths.receipt.exists(), timeout=20)
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM"
    assert receipt["cleanup_confirmed"] is True and receipt["duration_s"] < 20
    ignored = sig_masks(lines[0])["SigIgn"]
    assert not ignored & mask_of(signal.SIGTERM)  # the stop signal: at its default for the command


def test_new_session_relays_signals_and_the_exit_status(paths):
    proc = start_supervisor("--new-session", *paths.options() + ["--", "sh", "-c",
                            "echo sid=$(cut -d' ' -f6 /proc/$$/stat); echo ready; exec sleep 30"])
    line = [l for l in read_lines_until(proc.stdout, "ready") if l.startswith("sid=")][0]
    sid = int(line.split("=")[1])
    assert sid != os.getsid(0) and sid != proc.pid  # its own session, led by the inner one
    proc.send_signal(signal.SIGINT)
    status, _, err = finish(proc)
    assert status == 130, err
    assert read_receipt(paths.receipt)["signal"] == "SIGINT"
    assert run_supervisor("--new-session", *paths.options() + ["--", "sh", "-c", "exit 5"]).returncode == 5


def test_a_supervisor_killed_with_sigkill_leaves_no_receipt(paths):
    spec = {"name": "cmd", "children": [{"name": "m"}]}
    proc, nodes = start_tree(spec, *paths.options())
    proc.kill()
    proc.wait()
    try:
        assert not paths.receipt.parent.exists()  # made when the receipt is written
    finally:
        for pid in nodes.values():
            kill_pinned(pid)
        wait_until(lambda: not any(alive(pid) for pid in nodes.values()))


def test_children_inherited_from_before_exec_are_never_touched(paths):
    inner = shlex.join(supervisor_cmd(*paths.options(timeout=10) + [
        "--", "sh", "-c", "sleep 0.2; exit 0"]))
    script = "sleep 300 >/dev/null 2>&1 & echo inherited=$!; sleep 0.05 & exec %s" % inner
    result = run(["sh", "-c", script])
    inherited = int(result.stdout.split("=")[1])
    try:
        assert result.returncode == 0, result.stderr  # the quick inherited child's exit is not ours
        assert alive(inherited)
        assert read_receipt(paths.receipt)["preserved"] == []
        forced = "sleep 300 >/dev/null 2>&1 & echo inherited=$!; exec %s" % shlex.join(supervisor_cmd(
            *paths.options(timeout=0.3) + ["--", "sleep", "30"]))
        result = run(["sh", "-c", forced])
        second = int(result.stdout.split("=")[1])
        assert result.returncode == 124 and alive(second)
        receipt = read_receipt(paths.receipt)
        assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is True
    finally:
        for pid in [p for p in descendants(os.getpid()) if alive(p)]:
            kill_pinned(pid)


# --- 8. Closed or broken stdio -----------------------------------------------------------------

def test_closed_stdio_is_passed_on_closed_and_does_not_stop_the_run(paths):
    probe = ("import os\n"
             "state = []\n"
             "for fd in (0, 1, 2):\n"
             "    try:\n"
             "        os.fstat(fd); state.append('open')\n"
             "    except OSError:\n"
             "        state.append('closed')\n"
             "open('fds', 'w').write(' '.join(state))\n")

    def close_stdio():
        for fd in (0, 1, 2):
            os.close(fd)

    result = subprocess.run(supervisor_cmd(*paths.options() + ["--", PY, "-c", probe]),
                            preexec_fn=plain_signals(then=close_stdio),
                            timeout=120)
    assert result.returncode == 0
    assert (paths.work / "fds").read_text() == "closed closed closed"
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True
    result = subprocess.run(supervisor_cmd(*paths.options(timeout=0.3) + ["--", "nope-not-here"]),
                            preexec_fn=plain_signals(then=close_stdio),
                            timeout=120)
    assert result.returncode == 127


def test_a_broken_stderr_pipe_does_not_change_the_outcome(paths):
    read_end, write_end = os.pipe()
    os.close(read_end)  # whoever read our stderr is gone
    try:
        result = subprocess.run(supervisor_cmd(*paths.options() + ["--", "nope-not-here"]), stderr=write_end, timeout=60)
        assert result.returncode == 127
        result = subprocess.run(supervisor_cmd(*paths.options(timeout=0.3) + ["--", "sleep", "30"]), stderr=write_end, timeout=60)
        assert result.returncode == 124
    finally:
        os.close(write_end)
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True
