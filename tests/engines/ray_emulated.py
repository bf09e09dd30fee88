"""`ray job submit`, `stop`, `status` and `logs`, emulated: what Ray's job
supervisor does to an entrypoint, to the letter of Ray 2.60's source
(ray/dashboard/modules/job/job_supervisor.py, JobSupervisor), for the
tests where no Ray is installed (tests/test_ray.py).

- The entrypoint is `shlex.join` of the words after `--` (job/cli.py, submit),
  run with `subprocess.Popen(entrypoint, shell=True, start_new_session=True)`,
  its output to the job's log, SIGINT blocked ("Ray intentionally blocks
  SIGINT in all processes"), in the job's working_dir (here a copy of it), with
  PYTHONUNBUFFERED=1 (_get_driver_env_vars); beside it a watcher, in a session
  of its own: `while kill -s 0 PARENT; do sleep 1; done; kill -9 -PGID`.
- The child is polled every SUBPROCESS_POLL_PERIOD_S (0.1 s).
- A stop: the entrypoint and its descendants at that moment
  (`psutil.Process(pid).children(recursive=True)`) each get SIGTERM
  (RAY_JOB_STOP_SIGNAL, SIGTERM by default) by os.kill; they are polled every
  0.1 s (psutil.wait_procs: a zombie that is not our child still counts as
  running) for int(RAY_JOB_STOP_WAIT_TIME_S) seconds (DEFAULT_RAY_JOB_STOP_
  WAIT_TIME_S = 3); those left each get SIGKILL; the job is STOPPED, and the
  supervisor (the actor) exits.

State lives under $TREEREAP_RAY_STATE/ID: status, driver.log (the job's
output, as `ray job logs`), supervisor.log (the actor's lines), stop (a stop
request), watcher.pid.
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

POLL = 0.1  # JobSupervisor.SUBPROCESS_POLL_PERIOD_S
DEFAULT_STOP_WAIT = 3  # JobSupervisor.DEFAULT_RAY_JOB_STOP_WAIT_TIME_S
TERMINAL = ("STOPPED", "SUCCEEDED", "FAILED")
INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "init.py")


def state(job, *names):
    return os.path.join(os.environ["TREEREAP_RAY_STATE"], job, *names)


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def log(job, line):
    with open(state(job, "supervisor.log"), "a") as f:
        f.write(line + "\n")


def start_time(pid):
    """The start time in /proc/PID/stat, or None when pid is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].split()[19]


def children(pid):
    found = []
    for tid in os.listdir("/proc/%d/task" % pid) if os.path.isdir("/proc/%d" % pid) else ():
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                found.extend(int(word) for word in f.read().split())
        except OSError:
            pass
    return found


def tree(pid):
    """pid and its descendants (psutil's children(recursive=True))."""
    found, todo = [pid], children(pid)
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children(p))
    return [(p, start_time(p)) for p in found]


def submit(argv):
    job, working_dir, words = None, None, list(argv)
    while words and words[0] != "--":
        option = words.pop(0)
        if option == "--submission-id":
            job = words.pop(0)
        elif option == "--working-dir":
            working_dir = words.pop(0)
        elif option == "--address":
            words.pop(0)
        elif option != "--no-wait":
            sys.exit("ray_emulated: %s: not emulated" % option)
    entrypoint = shlex.join(words[1:])
    os.makedirs(state(job))
    cwd = state(job, "working_dir")
    shutil.copytree(working_dir or os.getcwd(), cwd)
    write(state(job, "entrypoint"), entrypoint)
    write(state(job, "status"), "PENDING")
    # The job supervisor (an actor's worker, on a node whose init reaps
    # what is orphaned: init.py), in a session of its own.
    init = subprocess.Popen([sys.executable, INIT, sys.executable, os.path.abspath(__file__),
                             "_supervise", job], cwd=cwd, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    write(state(job, "init.pid"), str(init.pid))
    print("Job '%s' submitted successfully" % job)


def supervise(job):
    """JobSupervisor.run, for one job."""
    entrypoint = read(state(job, "entrypoint"))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as in every Ray process
    with open(state(job, "driver.log"), "a") as logs_file:
        logs_file.write("Running entrypoint for job %s: %s\n" % (job, entrypoint))
        logs_file.flush()
        child = subprocess.Popen(entrypoint, shell=True, start_new_session=True,
                                 stdout=logs_file, stderr=subprocess.STDOUT, env=env)
    watcher = subprocess.Popen(
        "while kill -s 0 %d; do sleep 1; done; kill -9 -%d" % (os.getpid(), child.pid),
        shell=True, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    write(state(job, "watcher.pid"), str(watcher.pid))
    write(state(job, "status"), "RUNNING")
    while child.poll() is None and not os.path.exists(state(job, "stop")):
        time.sleep(POLL)
    if child.returncode is not None:
        log(job, "Job %s entrypoint command exited with code %d" % (job, child.returncode))
        write(state(job, "status"), "SUCCEEDED" if child.returncode == 0 else "FAILED")
        return
    stop_signal = os.environ.get("RAY_JOB_STOP_SIGNAL", "SIGTERM")
    procs = tree(child.pid)
    kill_all(procs, getattr(signal, stop_signal))
    wait = int(os.environ.get("RAY_JOB_STOP_WAIT_TIME_S", DEFAULT_STOP_WAIT))
    end = time.monotonic() + wait
    while time.monotonic() < end:
        if not running(procs, child):
            log(job, "Job %s has been terminated gracefully with %s." % (job, stop_signal))
            break
        time.sleep(POLL)
    else:
        log(job, "still running: %s" % " ".join(
            "%d:%s" % (pid, read("/proc/%d/cmdline" % pid).replace("\0", " "))
            for pid in running(procs, child)))
        log(job, "Attempt to gracefully terminate job %s through %s has timed out after %d "
            "seconds. Job is now being force-killed with SIGKILL." % (job, stop_signal, wait))
        kill_all(procs, signal.SIGKILL)
    child.poll()
    write(state(job, "status"), "STOPPED")


def kill_all(procs, sig):
    for pid, _ in procs:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def running(procs, child):
    """psutil.wait_procs(procs, timeout=0)'s alive: our child until reaped,
    any other until its pid is gone (a zombie counts)."""
    child.poll()
    return [pid for pid, start in procs if (child.returncode is None if pid == child.pid else
                                            start is not None and start_time(pid) == start)]


def stop(job):
    open(state(job, "stop"), "w").close()
    while read(state(job, "status")) not in TERMINAL:
        time.sleep(POLL)
    print("Job '%s' was stopped" % job)


def main(argv):
    if argv[:1] == ["_supervise"]:
        return supervise(argv[1])
    if argv[:1] != ["job"] or len(argv) < 3:
        sys.exit("ray_emulated: only `ray job submit|stop|status|logs` are emulated")
    verb, rest = argv[1], [word for word in argv[2:] if not word.startswith("--address")]
    if verb == "submit":
        return submit(rest)
    job = rest[-1]
    if verb == "stop":
        return stop(job)
    if verb == "status":
        status = read(state(job, "status"))  # (Ray's words for STOPPED)
        print("Job '%s' was stopped" % job if status == "STOPPED" else
              "Status for job '%s': %s" % (job, status))
    elif verb == "logs":
        sys.stdout.write(read(state(job, "driver.log")))
    else:
        sys.exit("ray_emulated: job %s: not emulated" % verb)


if __name__ == "__main__":
    main(sys.argv[1:])
