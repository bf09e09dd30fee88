"""The Ray recipe (docs/recipes.md, "Under Ray"), its blocks read from the
doc and run as written by bash: `ray job submit` of a supervised, hung test
suite, then `ray job stop`. Under two engines:

- "emulated", always: a `ray` on PATH that does what Ray 2.60's job supervisor
  does to an entrypoint, to the letter (tests/engines/ray_emulated.py cites
  the source: SIGTERM to the entrypoint and its descendants, SIGKILL to those
  left after RAY_JOB_STOP_WAIT_TIME_S, 3 s by default);
- "real": a real Ray on localhost, its head started here privately (own
  temporary directory, own ports, 127.0.0.1) and ended with the test, from
  the virtual environment SUPERVISOR_RAY_VENV names (`python3 -m venv DIR &&
  DIR/bin/pip install 'ray[default]'`). Without it the test is skipped,
  unless SUPERVISOR_REQUIRE_ENGINES names ray: then it fails.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest

from conftest import (PY, ROOT, SUPERVISOR, alive, descendants, heavy, kill_pinned, plain_signals,
                      read_receipt, reap_adopted_zombies, run, stop_noticed_after, wait_until)

RECIPES = os.path.join(ROOT, "docs", "recipes.md")
EMULATION = os.path.join(ROOT, "tests", "engines", "ray_emulated.py")
INIT = os.path.join(ROOT, "tests", "engines", "init.py")
VENV = os.environ.get("SUPERVISOR_RAY_VENV")
REQUIRED = "ray" in os.environ.get("SUPERVISOR_REQUIRE_ENGINES", "").split(",")

# A hung test suite, deaf to SIGINT and SIGTERM, and the test server it
# started: the supervisor's SIGKILL must end both within Ray's 3 s.
HUNG_SUITE = """python3 -m http.server 0 >/dev/null 2>&1 &
echo "server $!"
trap '' INT TERM
echo started
exec sleep 300
"""


def recipe_blocks():
    """The section's sh blocks: (submit, stop)."""
    with open(RECIPES) as f:
        text = f.read()
    section = text.split("\n## Under Ray\n", 1)[1].split("\n## ", 1)[0]
    blocks = [code for lang, code in re.findall(r"```(\w*)\n(.*?)```", section, re.S)
              if lang == "sh"]
    assert len(blocks) == 2 and "ray job submit" in blocks[0] and "ray job stop" in blocks[1]
    return blocks


class Emulated(object):
    name = "emulated"

    def __init__(self, tmp_path):
        self.state = tmp_path / "ray-state"
        self.state.mkdir()
        self.bin = tmp_path / "ray-bin"
        self.bin.mkdir()
        ray = self.bin / "ray"
        ray.write_text('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (PY, EMULATION))
        ray.chmod(0o755)
        self.env = {"PATH": "%s:%s" % (self.bin, os.environ["PATH"]),
                    "TREEREAP_RAY_STATE": str(self.state)}

    def driver_log(self, job):
        return self.state / job / "driver.log"

    def supervisor_log(self, job):
        return self.state / job / "supervisor.log"

    def job_ended(self, job):
        """Everything the job's node ran for it is gone: its init.py (which
        outlives the job's supervisor, its watcher, and what they left)."""
        reap_adopted_zombies()
        return not alive(int((self.state / job / "init.pid").read_text()))

    def close(self):
        pass


def free_ports(count):
    ports, sockets = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def free_range(size, taken):
    """A run of `size` free ports, for Ray's workers, none of them `taken`
    (the components' own: Ray refuses a port given twice)."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base + size < 65535 and all(_free(p) and p not in taken
                                       for p in range(base, base + size)):
            return base
    raise AssertionError("no run of %d free ports" % size)


def _free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


class Real(object):
    """A Ray head of our own: `ray start --head --block` (below init.py, as
    a node's init would reap what it orphans), on 127.0.0.1, in
    a temporary directory of its own (short: Ray's unix sockets live there),
    its ports chosen free; ended by SIGTERM to `ray start --block`, which
    ends what it started; whatever of ours is left then, by pid."""
    name = "real"

    def __init__(self, tmp_path):
        ray = os.path.join(VENV or "", "bin", "ray")
        if not VENV or not os.access(ray, os.X_OK):
            why = ("SUPERVISOR_RAY_VENV names no virtual environment with Ray (python3 -m venv "
                   "DIR && DIR/bin/pip install 'ray[default]')")
            if REQUIRED:
                pytest.fail("SUPERVISOR_REQUIRE_ENGINES names ray: " + why)
            pytest.skip(why)
        self.before = set(descendants(os.getpid()))
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        ports = free_ports(9)
        gcs, dash, client, node, objects, agent, agent_grpc, env_agent, metrics = ports
        workers = free_range(40, ports)
        self.address = "http://127.0.0.1:%d" % dash
        self.agent = agent  # the head's job agent: a job is submitted through it
        self.env = {"PATH": "%s:%s" % (os.path.dirname(ray), os.environ["PATH"]),
                    "RAY_ADDRESS": self.address, "RAY_USAGE_STATS_ENABLED": "0"}
        argv = [ray, "start", "--head", "--block", "--num-cpus=1", "--include-dashboard=true",
                "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1",
                "--disable-usage-stats", "--object-store-memory=100000000",
                "--temp-dir", self.temp, "--port", gcs, "--dashboard-port", dash,
                "--ray-client-server-port", client, "--node-manager-port", node,
                "--object-manager-port", objects, "--dashboard-agent-listen-port", agent,
                "--dashboard-agent-grpc-port", agent_grpc, "--runtime-env-agent-port", env_agent,
                "--metrics-export-port", metrics, "--min-worker-port", workers,
                "--max-worker-port", workers + 39]
        self.log = open(os.path.join(self.temp, "ray-start.log"), "wb")
        started = time.monotonic()
        self.head = subprocess.Popen([PY, INIT] + [str(a) for a in argv],
                                     env=dict(os.environ, **self.env),
                                     stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, preexec_fn=plain_signals())
        try:
            assert wait_until(self._up, timeout=200, interval=0.2), self._start_log()
        except BaseException:
            self.close()
            raise
        print("a Ray head up in %.1f s" % (time.monotonic() - started))

    def _up(self):
        """The dashboard answers, and the job agent listens (until it does,
        a submit is refused: "No available agent to submit job")."""
        assert self.head.poll() is None, self._start_log()
        try:
            with urllib.request.urlopen(self.address + "/api/version", timeout=5) as answer:
                if answer.status != 200:
                    return False
            socket.create_connection(("127.0.0.1", self.agent), timeout=5).close()
            return True
        except OSError:
            return False

    def _start_log(self):
        with open(os.path.join(self.temp, "ray-start.log"), "rb") as f:
            return f.read()[-3000:].decode(errors="replace")

    def _logs(self):
        return os.path.join(self.temp, "session_latest", "logs")

    def driver_log(self, job):
        return os.path.join(self._logs(), "job-driver-%s.log" % job)

    def supervisor_log(self, job):
        return os.path.join(self._logs(), "jobs", "supervisor-%s.log" % job)

    def job_ended(self, job):
        return True  # Ray's own: its processes go with the head

    def close(self):
        if self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)
        try:
            self.head.wait(60)
        except subprocess.TimeoutExpired:
            kill_pinned(self.head.pid)
            self.head.wait()

        def ours():
            reap_adopted_zombies()
            return [p for p in descendants(os.getpid()) if p not in self.before and alive(p)]
        if not wait_until(lambda: not ours(), timeout=30):
            for pid in ours():
                kill_pinned(pid)
            assert wait_until(lambda: not ours(), timeout=30), ours()
        self.log.close()
        shutil.rmtree(self.temp, ignore_errors=True)


# A real head starts some twenty processes, most of them Python (7 s on two
# quiet cores, 77 s beside two busy loops): with the heavy tests, one at a time.
@pytest.fixture(params=["emulated", pytest.param("real", marks=heavy)])
def ray_engine(request, tmp_path):
    engine = (Emulated if request.param == "emulated" else Real)(tmp_path)
    yield engine
    engine.close()


def read(path):
    try:
        with open(str(path)) as f:
            return f.read()
    except OSError:
        return ""


def submit(engine, tmp_path, submit_block):
    """The recipe's submit, as written, from a checkout holding
    supervisor.py and the hung suite. Returns (env, job id, receipt path,
    the test server's pid)."""
    here = tmp_path / "checkout"
    (here / "ci").mkdir(parents=True)
    shutil.copy(SUPERVISOR, str(here / "supervisor.py"))
    (here / "ci" / "tests.sh").write_text(HUNG_SUITE)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = "treereap-%s" % uuid.uuid4().hex[:12]
    env = dict(os.environ, TMPDIR=str(tmp), JOB=job, **engine.env)
    result = run(["bash", "-c", submit_block], cwd=str(here), env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert wait_until(lambda: "\nstarted\n" in read(engine.driver_log(job)), timeout=120), (
        read(engine.driver_log(job)), read(engine.supervisor_log(job)))
    server = int(re.search(r"^server (\d+)$", read(engine.driver_log(job)), re.M).group(1))
    return here, env, job, tmp / ("receipt-%s.json" % job), server


def test_ray_job_stop_leaves_a_receipt_and_nothing_running(ray_engine, tmp_path):
    """`ray job stop`: Ray's SIGTERM stops the run, --stop-timeout 2 ends
    it and writes the receipt within Ray's 3 s, and Ray's job supervisor
    finds every process gone: it says the job "has been terminated
    gracefully", with no SIGKILL of its own."""
    submit_block, stop_block = recipe_blocks()
    here, env, job, receipt_path, server = submit(ray_engine, tmp_path, submit_block)
    asked = time.time()
    result = run(["bash", "-c", stop_block], cwd=str(here), env=env)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert wait_until(lambda: "has been terminated" in read(ray_engine.supervisor_log(job)) or
                      "force-killed" in read(ray_engine.supervisor_log(job)), timeout=60)
    said = read(ray_engine.supervisor_log(job))
    assert "has been terminated gracefully with SIGTERM" in said, said
    receipt = read_receipt(receipt_path)
    assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM", receipt
    assert receipt["cleanup_confirmed"] is True and not alive(server), receipt
    noticed = stop_noticed_after(receipt, asked)
    written = os.stat(str(receipt_path)).st_mtime - asked
    print("%s: the receipt %.2f s after the stop was noticed (%.2f s after `ray job stop` "
          "started)" % (ray_engine.name, written - noticed, written))
    assert written - noticed < 3  # Ray's stop wait (implied by "gracefully")
    status = run(["ray", "job", "status", job], env=env)
    assert "Job '%s' was stopped" % job in status.stdout, (status.stdout, status.stderr)
    assert wait_until(lambda: ray_engine.job_ended(job))


def test_ray_job_stop_without_stop_timeout_loses_the_receipt(tmp_path):
    """What #36 item 4 saw: without --stop-timeout, the stop takes -k 30's
    phases, and Ray's SIGKILL at 3 s comes first: no receipt. (Emulated
    only: the cgroup the killed supervisor leaves is removed here.)"""
    engine = Emulated(tmp_path)
    submit_block, stop_block = recipe_blocks()
    submit_block = submit_block.replace(" --stop-timeout 2", "")
    assert "--stop-timeout" not in submit_block
    here, env, job, receipt_path, server = submit(engine, tmp_path, submit_block)
    cgroup = re.search(r"in the cgroup (\S+),", read(engine.driver_log(job)))
    assert run(["bash", "-c", stop_block], cwd=str(here), env=env).returncode == 0
    said = read(engine.supervisor_log(job))
    assert "force-killed with SIGKILL" in said and not receipt_path.exists(), said
    assert not alive(server)  # Ray's SIGKILL reached it: it was the entrypoint's descendant
    assert wait_until(lambda: engine.job_ended(job))
    if cgroup:  # (unless another supervisor removed it first, as it may: it is empty)
        assert wait_until(lambda: not read(os.path.join(cgroup.group(1), "cgroup.procs")).split())
        try:
            os.rmdir(cgroup.group(1))
        except FileNotFoundError:
            pass
