"""An RL controller's protocol as NeMo Gym's controller runs it
(nemo_gym/agent_utils/supervisor_client.py), in its two stored layouts,
with the sandbox's exec played by sh from / (as docker exec and kubectl exec
start it). The scripts follow that protocol step by step, in our own words:

launch: give up if the session directory is gone or a stop already claimed
  it; check that the interpreter can load the supervisor (--help); ignore
  SIGTERM (only to fence this start-up); claim the launch with a symlink;
  write the pid; exec the supervisor, its output to a log.
stop:   done if the receipt is there; create the stop file; try to claim the
  launch for the stop (a stop that wins writes a receipt of its own, and no
  supervisor ever starts); else SIGTERM the pid in the pid file, and look
  for the receipt once a second, for a number of seconds.

The controller then requires cleanup_confirmed true and reads the four keys
it knows (cleanup_confirmed, error, return_code, timed_out)."""
import json
import os
import shlex
import signal
import subprocess
import time

import pytest

from conftest import PY, SUPERVISOR, alive, kill_all, read_receipt, spawn, wait_until

# The two layouts: (pid file, stop file, log, whether it knows the flag).
LAYOUTS = {
    "runner": ("runner.pid", "runner.stop", "runner.log"),
    "supervisor": ("supervisor.pid", "stop.request", "output.log"),
}
REFERENCE_KEYS = {"cleanup_confirmed", "error", "return_code", "timed_out"}


class Session(object):
    """One session directory, and the controller's two scripts for it."""

    def __init__(self, top, layout, timeout=600, cleanup=2, preserve=False):
        self.dir = top / "session"
        self.dir.mkdir()
        self.pid_file, self.stop_file, self.log = (self.dir / n for n in LAYOUTS[layout])
        self.receipt, self.claim = self.dir / "cleanup.json", self.dir / "launch.claim"
        self.timeout, self.cleanup, self.preserve = timeout, cleanup, preserve

    def launch_script(self, command):
        q = lambda p: shlex.quote(str(p))
        supervisor = "%s -I %s" % (q(PY), q(SUPERVISOR))
        return " ".join([
            "[ -d %s ] && [ ! -L %s ] || exit 0;" % (q(self.dir), q(self.claim)),
            "%s --help >/dev/null || exit $?;" % supervisor,
            "trap '' TERM; ln -s launch %s 2>/dev/null || exit 0;" % q(self.claim),
            "echo $$ > %s &&" % q(self.pid_file),
            "exec %s --timeout %s --cleanup-timeout %s --stop-file %s %s--receipt %s -- %s"
            % (supervisor, self.timeout, self.cleanup, q(self.stop_file),
               "--preserve-descendants-on-success " if self.preserve else "",
               q(self.receipt), " ".join(q(a) for a in command)),
            ">%s 2>&1" % q(self.log)])

    def stop_script(self, seconds):
        q = lambda p: shlex.quote(str(p))
        own = json.dumps({"cleanup_confirmed": True, "return_code": None, "error": None,
                          "timed_out": False})
        temporary = q(str(self.receipt) + ".stop.tmp")
        return " ".join([
            "[ -f %s ] && exit 0;" % q(self.receipt),
            "touch %s || exit 1;" % q(self.stop_file),
            "ln -s stop %s 2>/dev/null || true;" % q(self.claim),
            'if [ "$(readlink %s)" = stop ]; then' % q(self.claim),
            "printf '%%s' %s > %s && mv %s %s; exit $?; fi;" % (
                q(own), temporary, temporary, q(self.receipt)),
            'if [ -s %s ]; then kill -TERM "$(cat %s)" 2>/dev/null || true; fi;' % (
                q(self.pid_file), q(self.pid_file)),
            "for _ in $(seq 1 %d); do [ -f %s ] && exit 0; sleep 1; done; exit 1" % (
                seconds, q(self.receipt))])

    def launch(self, command, cwd="/"):
        """The sandbox's exec of the launch script, from cwd: / where the
        controller gives no workdir (docker exec, kubectl exec), else the
        task's workdir (SandboxSession.execute passes its own)."""
        return spawn(["sh", "-c", self.launch_script(command)], cwd=cwd, stdout=None,
                     stderr=None)

    def stop(self, seconds=2, cwd="/"):
        return subprocess.run(["sh", "-c", self.stop_script(seconds)], cwd=cwd,
                              timeout=60).returncode

    def logged(self, text):
        try:
            return text.encode() in self.log.read_bytes()
        except OSError:
            return False

    def read(self):
        return read_receipt(self.receipt)


# A harness that starts a service in a session of its own and a tool in its
# group, prints their pids, and then exits 0, exits 7, or waits to be stopped.
HARNESS = r"""
import os, subprocess, sys, time
service = subprocess.Popen(["sleep", "300"], start_new_session=True)
tool = subprocess.Popen(["sleep", "300"])
print("pids", service.pid, tool.pid, flush=True)
if sys.argv[1] == "wait":
    time.sleep(300)
sys.exit(int(sys.argv[1]))
"""


def harness(ending):
    return [PY, "-c", HARNESS, ending]


def pids_logged(session):
    assert wait_until(lambda: session.logged("pids"))
    line = [l for l in session.log.read_text().splitlines() if l.startswith("pids")][0]
    return [int(word) for word in line.split()[1:]]


def normalised(receipt):
    """What the controller keeps of a confirmed receipt."""
    assert receipt["cleanup_confirmed"] is True
    return dict((key, receipt[key]) for key in REFERENCE_KEYS)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_controllers_stop_is_answered_within_its_first_second(tmp_path, layout):
    """Stop file, SIGTERM to the pid in the pid file, then a look a second:
    the receipt is there by the second look (within 1 s), confirmed, and
    nothing of the run is left, the service in its own session included."""
    session = Session(tmp_path, layout)
    launcher = session.launch(harness("wait"))
    pids = pids_logged(session)
    assert session.stop(seconds=2) == 0  # found at the first look or the second
    assert launcher.wait(timeout=60) in (124, 143)
    assert normalised(session.read()) == {"cleanup_confirmed": True, "error": None,
                                          "return_code": -signal.SIGTERM, "timed_out": False}
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_without_the_flag_a_successful_harness_leaves_nothing_running(tmp_path, layout):
    """NeMo Gym passes no policy flag when it owns the sandbox, and expects
    every descendant gone: the default drains all of them."""
    session = Session(tmp_path, layout)
    launcher = session.launch(harness("0"))
    assert launcher.wait(timeout=60) == 0
    pids = pids_logged(session)
    assert normalised(session.read()) == {"cleanup_confirmed": True, "error": None,
                                          "return_code": 0, "timed_out": False}
    assert session.read()["preserved"] == [] and not any(alive(pid) for pid in pids)


def test_with_the_flag_a_successful_harness_keeps_its_services_for_the_verifier(tmp_path):
    """A borrowed sandbox: --preserve-descendants-on-success, the harness
    exits 0 by itself: its service and its tool stay for the verifier (the
    sandbox's owner tears them down), and the receipt lists them."""
    session = Session(tmp_path, "supervisor", preserve=True)
    launcher = session.launch(harness("0"))
    assert launcher.wait(timeout=60) == 0
    pids = pids_logged(session)
    try:
        receipt = session.read()
        assert normalised(receipt) == {"cleanup_confirmed": True, "error": None,
                                       "return_code": 0, "timed_out": False}
        assert all(alive(pid) for pid in pids)
        assert sorted(p["pid"] for p in receipt["preserved"]) == sorted(pids)
    finally:
        kill_all(pids)


@pytest.mark.parametrize("ending", ["7", "stop", "timeout"])
def test_with_the_flag_any_other_ending_drains_everything(tmp_path, ending):
    session = Session(tmp_path, "supervisor", timeout=1 if ending == "timeout" else 600,
                      preserve=True)
    launcher = session.launch(harness("7" if ending == "7" else "wait"))
    pids = pids_logged(session)
    if ending == "stop":
        assert session.stop(seconds=2) == 0
    launcher.wait(timeout=60)
    receipt = normalised(session.read())
    assert receipt["timed_out"] is (ending == "timeout") and receipt["error"] is None
    assert receipt["return_code"] == (7 if ending == "7" else -signal.SIGTERM)
    assert session.read()["preserved"] == [] and not any(alive(pid) for pid in pids)


def test_from_the_tasks_workdir_the_run_starts_there(tmp_path):
    """The controller's exec runs in the task's workdir when it has one: no
    --workdir is passed, so that directory is the command's, and the
    session directory, elsewhere, holds the receipt."""
    task = tmp_path / "task"
    task.mkdir()
    session = Session(tmp_path, "supervisor")
    launcher = session.launch(["sh", "-c", "pwd > where; exit 0"], cwd=str(task))
    assert launcher.wait(timeout=60) == 0
    assert (task / "where").read_text().strip() == str(task)
    assert normalised(session.read())["return_code"] == 0


def test_a_session_directory_inside_the_tasks_workdir_is_refused(tmp_path):
    """The receipt must stay out of the command's reach: a session directory
    below the exec's working directory (the task's workdir) is refused
    before anything starts, one line in the log, and no receipt: the
    controller then reports the launch outcome unknown. The README's recipe
    says to keep the session directory outside the task's workdir."""
    task = tmp_path / "task"
    task.mkdir()
    session = Session(task, "supervisor")
    launcher = session.launch(["touch", str(tmp_path / "ran")], cwd=str(task))
    assert launcher.wait(timeout=60) == 125
    assert not session.receipt.exists() and not (tmp_path / "ran").exists()
    assert "inside the workdir" in session.log.read_text()


def test_a_stop_before_the_launch_fences_it(tmp_path):
    """The stop wins the claim: it writes its own receipt, and the launch that
    comes later gives up without starting the supervisor."""
    session = Session(tmp_path, "supervisor")
    assert session.stop(seconds=2) == 0
    launcher = session.launch(["touch", str(tmp_path / "ran")])
    assert launcher.wait(timeout=60) == 0
    assert not (tmp_path / "ran").exists() and not session.pid_file.exists()
    assert session.read() == {"cleanup_confirmed": True, "return_code": None, "error": None,
                              "timed_out": False}


REPORTER = r"""
import os, signal, sys, time
def report(signum, frame):
    os.write(1, ("GOT %d\n" % signum).encode())
    time.sleep(float(sys.argv[1]))
    os._exit(3)
signal.signal(signal.SIGTERM, report)
os.write(1, b"ready\n")
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("pause", [0, 0.02, 0.5])
def test_the_controllers_stop_keeps_the_commands_grace(tmp_path, pause):
    """The stop file, then SIGTERM: one request, with one outcome. The
    SIGTERM used to count as a second stop signal, which skips the grace: the
    command, which takes 0.3 s to exit, died of SIGKILL. The same with a
    controller slower between its two steps (two sandbox execs). And
    whichever the supervisor read first, the outcome is the stop file's (it
    was `signal`, 143, in 6 to 17 of 30 peer runs, and 9 of 10 at 0-20 ms)."""
    session = Session(tmp_path, "runner")
    launcher = session.launch([PY, "-c", REPORTER, "0.3"])
    assert wait_until(lambda: session.logged("ready"))  # its handler is set
    session.stop_file.touch()
    time.sleep(pause)
    os.kill(int(session.pid_file.read_text()), signal.SIGTERM)
    status = launcher.wait(timeout=60)
    receipt = session.read()
    assert receipt["return_code"] == 3, receipt  # its handler finished: no SIGKILL
    assert receipt["stop_reason"] == "stop_file" and receipt["cleanup_confirmed"] is True
    assert status == receipt["exit_status"] == 124


def test_the_command_gets_sigterm_first_at_the_deadline_despite_the_fence(tmp_path):
    """The command does not inherit the launch's `trap '' TERM`: at the
    deadline it gets SIGTERM (and may exit gracefully), not SIGKILL after the
    whole grace. A deadline is a time, and a loaded machine may reach it
    before the command's trap is set: then it dies of that SIGTERM, which is
    the same proof."""
    session = Session(tmp_path, "runner", timeout=1)
    launcher = session.launch(["sh", "-c", "trap 'echo GOT 15; exit 3' TERM; echo started; "
                               "while :; do sleep 0.05; done"])
    assert launcher.wait(timeout=60) == 124
    receipt = session.read()
    assert receipt["timed_out"] is True
    if session.logged("started"):
        assert receipt["return_code"] == 3  # its handler ran
    else:
        assert receipt["return_code"] == -signal.SIGTERM
    assert receipt["ladder"][0]["duration_s"] < 1.9  # not the 2 s grace, then SIGKILL
