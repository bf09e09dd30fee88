"""timeout(1)'s conventions, by the cases of GNU coreutils' own tests
(tests/timeout/*.sh and timeout-blocked.pl), written in our own words and
run through a shim: `timeout OPTIONS DURATION COMMAND` becomes
`supervisor.py OPTIONS --timeout DURATION -- COMMAND`.

Every case checks what timeout(1) does, except the deliberate differences,
each marked DIFFERENT with what we do instead and why (the README lists them
under "GNU timeout"):
- a duration of 0 is refused (125): timeout(1) reads it as "no deadline";
- --foreground is refused (125): the command gets the terminal anyway when
  the supervisor is in its foreground, and a stop ends its children too;
- -v says other words (the run stopped, what it sent, and how it ended);
- a SIGPIPE the caller ignored reaches the command at its default: CPython
  ignores SIGPIPE at start, so the caller's disposition cannot be known;
- SIGALRM sent to the supervisor is a stop by that signal (142), where
  timeout(1) takes it for its own timer (124); and a stop sends the stop
  signal to every process of the run, not only to the command's group;
- /proc must be this PID namespace's (an unshare --pid without
  --mount-proc is refused: 125);
- a SIGINT or SIGHUP the caller ignored stays ignored (timeout(1) catches
  them whatever its caller had): nohup and a script's `cmd &` mean it.
Not a case of theirs, but a difference all the same: without -k, timeout(1)
never sends SIGKILL; here every stop ends in SIGKILL after the grace (10 s
by default), so that nothing of the run is left; -k 0 asks for timeout(1)'s
way (no end to the grace but a second stop signal).
"""
import os
import shlex
import signal
import subprocess

import pytest

from conftest import (IS_ROOT, PY, SUPERVISOR, alive, plain_signals, read_lines, read_receipt,
                      run, spawn, wait_until)

import supervisor  # noqa: E402  (exec_timeout alone: no run in-process)

# LDBL_MAX, as coreutils' getlimits_ prints it; and one past the largest time_t
# and unsigned int.
LDBL_MAX = "1.18973149535723176502e+4932"
TIME_T_OFLOW, UINT_OFLOW = "9223372036854775808", "4294967296"


def timeout(*args):
    """The shim: timeout(1)'s command line as ours. Options before the
    duration keep their meaning (-s, -k, --preserve-status, -v), and the
    duration becomes --timeout."""
    args = list(args)
    options = []
    while args and args[0].startswith("-") and args[0] != "--":
        option = args.pop(0)
        options.append(option)
        if option in ("-s", "-k", "--signal", "--kill-after"):
            options.append(args.pop(0))
    if args and args[0] == "--":
        args.pop(0)
    duration = args.pop(0)
    return [PY, SUPERVISOR] + options + ["--timeout", duration, "--"] + args


def shell_timeout(*args):
    """The shim's command line, quoted for sh."""
    return " ".join(shlex.quote(a) for a in timeout(*args))


def status_of(*args, **kwargs):
    kwargs.setdefault("cwd", "/")  # nobody's workdir, as the receipt goes nowhere
    return run(timeout(*args), **kwargs).returncode


# (case, its arguments, timeout(1)'s status, ours when DIFFERENT)
STATUSES = [
    ("a quick command", ["10", "true"], 0, None),
    ("a day", ["1d", "true"], 0, None),
    ("no deadline", ["0", "true"], 0, 125),  # DIFFERENT: 0 is refused
    ("the command's status", ["10", "sh", "-c", "exit 2"], 2, None),
    ("the deadline", [".1", "sleep", "10"], 124, None),
    ("--preserve-status", ["--preserve-status", ".1", "sleep", "10"], 143, None),
    ("-s0 -k1: SIGKILL after the grace", ["-s0", "-k1", ".1", "sleep", "10"], 137, None),
    ("-s EXIT is -s 0", ["-s", "EXIT", "-k1", ".1", "sleep", "10"], 137, None),
    ("--foreground -s0 -k1", ["--foreground", "-s0", "-k1", ".1", "sleep", "10"], 137, 125),
    ("an invalid duration", ["invalid", "sleep", "0"], 125, None),
    ("a negative one", [" -0.1", "sleep", "0"], 125, None),
    ("a negative one too small to represent", [" -1e-10000", "sleep", "0"], 125, None),
    ("an invalid --kill-after", ["--kill-after=invalid", "1", "sleep", "0"], 125, None),
    ("an invalid unit", ["42D", "sleep", "0"], 125, None),
    ("a fraction", ["10.34", "sleep", "0"], 0, None),
    ("many digits", ["9.999999999", "sleep", "0"], 0, None),
    ("one too small to represent: at once", ["1e-10000", "sleep", "10"], 124, None),
    ("an invalid signal", ["--signal=invalid", "1", "sleep", "0"], 125, None),
    ("a command that is a directory", ["10", "."], 126, None),
    ("a command not found", ["10", "no_such"], 127, None),
    ("past time_t", [TIME_T_OFLOW, "sleep", "0"], 0, None),
    ("past unsigned int", [UINT_OFLOW, "sleep", "0"], 0, None),
    ("past time_t, in days", [TIME_T_OFLOW + "d", "sleep", "0"], 0, None),
    ("many days", ["2.34e+5d", "sleep", "0"], 0, None),
    ("LDBL_MAX", [LDBL_MAX, "sleep", "0"], 0, None),
    ("minus LDBL_MAX", ["--", "-" + LDBL_MAX, "sleep", "0"], 125, None),
]


@pytest.mark.parametrize("case, args, theirs, ours", STATUSES, ids=[c[0] for c in STATUSES])
def test_exit_statuses_are_timeouts(case, args, theirs, ours):
    assert status_of(*args) == (theirs if ours is None else ours)


def test_a_command_that_ignores_sigchld_is_run_as_usual():
    assert run(["sh", "-c", "trap '' CHLD; exec " + shell_timeout("10", "true")],
               cwd="/").returncode == 0


def test_a_child_of_the_caller_that_exits_early_is_not_the_command():
    script = "setsid sleep .1 & exec " + shell_timeout(".5", "sh", "-c", "sleep 2; echo foo")
    result = run(["sh", "-c", script], cwd="/")
    assert result.returncode == 124 and result.stdout == ""


def test_verbose_says_what_it_sends_in_its_own_words():
    """DIFFERENT: timeout(1) says "sending signal 0 to command 'sleep'" and
    then "sending signal KILL"; ours says the same things its own way."""
    for option in ("-v", "--verbose"):
        result = run(timeout(option, "-s0", "-k", ".1", ".1", "sleep", "10"), cwd="/")
        assert result.returncode == 137
        assert "no signal first" in result.stderr and "SIGKILL" in result.stderr


def test_a_broken_pipe_on_stderr_keeps_the_status(tmp_path):
    script = "{ %s 2>&1; echo $? > %s; } | :" % (
        shell_timeout("-v", ".1", "sleep", "10"), tmp_path / "status")
    result = run(["sh", "-c", script], cwd="/")
    assert result.returncode == 0
    assert (tmp_path / "status").read_text().strip() == "124"


def test_sigpipe_reaches_the_command_at_its_default():
    """DIFFERENT: timeout(1) passes on a SIGPIPE its caller ignored, so `yes`
    writing to a closed pipe says "Broken pipe"; CPython ignores SIGPIPE at
    start, so the supervisor cannot know, and the command gets it at its
    default: `yes` ends quietly (as from a shell)."""
    script = "(trap '' PIPE && %s | :) 2>&1" % shell_timeout("10", "yes")
    result = run(["sh", "-c", script], cwd="/")
    assert "Broken pipe" not in result.stdout


def test_the_command_gets_the_stop_signal_when_the_supervisor_is_killed(tmp_path):
    """As timeout(1) (PR_SET_PDEATHSIG): SIGKILL the supervisor, and the
    command gets the stop signal (here USR1). Held by the walk: a run's
    cgroup whose maker is gone is ended at once by the next supervisor that
    starts (a test beside this one), maybe before the trap runs."""
    script = ("trap 'touch sig.received; exit' USR1; touch running; i=0; "
              "while [ ! -e sig.received ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done")
    proc = spawn(timeout("-sUSR1", "--containment=proc", "25", "sh", "-c", script),
                 cwd=str(tmp_path))
    assert wait_until((tmp_path / "running").exists)
    proc.kill()
    proc.wait()
    assert wait_until((tmp_path / "sig.received").exists)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_a_stop_signal_reaches_the_command_as_itself(tmp_path, sig):
    """As timeout(1) passes it on: SIGTERM, SIGINT, SIGHUP and SIGQUIT sent
    to the supervisor are the command's first signal, whatever -s says (KILL
    here: the deadline's)."""
    script = ("for s in TERM INT HUP QUIT; do trap \"echo $s > got; exit 5\" $s; done; "
              "echo > running; while :; do sleep 0.1; done")
    proc = spawn(timeout("-sKILL", "25", "sh", "-c", script), cwd=str(tmp_path),
                 preexec_fn=plain_signals())
    assert wait_until((tmp_path / "running").exists)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + sig
    assert (tmp_path / "got").read_text().strip() == signal.Signals(sig).name[3:]


def test_a_sigterm_the_caller_ignored_is_not_passed_on(tmp_path):
    """A launcher that fenced its start-up (trap '' TERM; exec ...) leaves
    SIGTERM ignored in the command: a SIGTERM to the supervisor stops the
    run with -s (INT here), which the command does not ignore."""
    script = "trap 'echo INT > got; exit 3' INT; echo > running; while :; do sleep 0.1; done"
    launcher = "trap '' TERM; exec %s" % shlex.join(timeout("-sINT", "25", "sh", "-c", script))
    proc = spawn(["sh", "-c", launcher], cwd=str(tmp_path), preexec_fn=plain_signals())
    assert wait_until((tmp_path / "running").exists)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert (tmp_path / "got").read_text().strip() == "INT"


def test_sigalrm_to_the_supervisor_is_a_stop_by_that_signal(tmp_path):
    """DIFFERENT: timeout(1) takes SIGALRM for its own timer (124); here it is
    a stop by signal (142). Nested as in coreutils' test, the command is
    stopped too, but not only through the inner supervisor: a stop sends the
    stop signal to every process of the run (timeout(1) sends it to its
    child and its group), so SIGALRM may reach it before the inner's USR1."""
    script = ("trap 'touch sig.received; exit' USR1; echo $$ > running; "
              "while [ ! -e sig.received ]; do sleep 0.1; done")
    inner = timeout("-sUSR1", "25", "sh", "-c", script)
    outer = [PY, SUPERVISOR, "-sALRM", "--timeout", "30", "--"] + inner
    proc = spawn(outer, cwd=str(tmp_path))
    assert wait_until(lambda: (tmp_path / "running").exists()
                      and (tmp_path / "running").read_text().strip())
    command = int((tmp_path / "running").read_text())
    proc.send_signal(signal.SIGALRM)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + signal.SIGALRM
    assert not alive(command)


@pytest.mark.skipif(not IS_ROOT, reason="needs root for unshare --pid")
def test_as_pid_1_of_a_pid_namespace_the_deadline_holds():
    """coreutils runs it as PID 1 without --mount-proc: DIFFERENT, refused
    (the /proc it would read is another namespace's); with --mount-proc, 124."""
    base = ["unshare", "--pid", "--fork"]
    assert run(base + timeout(".1", "sleep", "10"), cwd="/").returncode == 125
    assert run(base + ["--mount-proc"] + timeout(".1", "sleep", "10"), cwd="/").returncode == 124


def test_a_blocked_sigalrm_in_the_caller_changes_nothing():
    result = run(timeout(".1", "sleep", "10"), cwd="/",
                 preexec_fn=plain_signals(blocked=[signal.SIGALRM]))
    assert result.returncode == 124


def test_a_sigint_the_caller_ignored_stays_ignored():
    """DIFFERENT, coreutils' timeout-group.sh (its first part): the caller
    ignores SIGINT (a script's background job), and SIGINT is sent to the
    caller's whole process group. timeout(1) takes it whatever its caller
    had, and stops the command; here it stays ignored, by the supervisor and
    the command, which runs to its end."""
    script = ("trap '' INT; %s & job=$!; sleep 0.3; kill -INT -- -$$; wait $job; "
              "echo status=$?" % shell_timeout("10", "sh", "-c", "sleep 1; exit 3"))
    result = run(["sh", "-c", script], cwd="/", preexec_fn=plain_signals(then=os.setpgrp))
    assert "status=3" in result.stdout, result.stdout + result.stderr


def test_foreground_is_refused_with_the_reason():
    result = run(timeout("--foreground", "1", "true"), cwd="/")
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1 and "--foreground is not supported" in result.stderr


def test_k_0_lets_the_grace_last_until_the_run_ends_as_timeout_k_0_does(tmp_path):
    """As timeout(1) -k 0 ("a duration of 0 disables the associated
    timeout"): no SIGKILL after the stop signal. A command that ignores
    SIGTERM ends in its own time, with its own status in the receipt (a 0
    read as "no grace" would have killed it); a second stop signal still
    ends the run at once (another, or the same after _STOP_BURST)."""
    receipt = tmp_path / "receipt.json"
    ignores = "trap '' TERM; touch %s; sleep %%s; exit 3" % (tmp_path / "running")
    result = run([PY, SUPERVISOR, "-k", "0", "--receipt", str(receipt), "--timeout", ".2", "--",
                  "sh", "-c", ignores % "1.5"], cwd="/")
    written = read_receipt(receipt)
    assert result.returncode == 124, result.stderr
    assert written["return_code"] == 3 and written["cleanup_timeout_s"] == 0, written
    assert written["cleanup_confirmed"] is True and written["ladder"][0]["duration_s"] >= 1
    (tmp_path / "running").unlink()
    proc = spawn([PY, SUPERVISOR, "-v", "-k0", "--receipt", str(receipt), "--timeout", "60",
                  "--", "sh", "-c", ignores % "60"], cwd="/",
                 preexec_fn=plain_signals(), stderr=subprocess.PIPE)
    assert wait_until((tmp_path / "running").exists)
    proc.send_signal(signal.SIGTERM)
    assert "SIGTERM received" in read_lines(proc.stderr, 2)[1]
    proc.send_signal(signal.SIGINT)  # the grace has no end but another stop signal
    status = proc.wait(timeout=60)
    proc.stderr.close()
    written = read_receipt(receipt)
    assert status == 137, written
    assert written["return_code"] == -signal.SIGKILL and written["cleanup_confirmed"] is True
    assert supervisor.exec_timeout(10, 0) == float("inf")
