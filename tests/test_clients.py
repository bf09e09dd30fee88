"""The real clients: GNU timeout around the supervisor, timeout(1)'s options,
CI, the receipt's drained and usage, the workdir from /, the API, and the
package beside supervisord. (An RL controller's protocol: test_nemo.py.)"""
import json
import os
import shlex
import shutil
import signal
import subprocess
import time

import pytest

from conftest import (
    DEFAULT_CONTAINMENT, PY, ROOT, alive, finish, heavy, kill_all, plain_signals,
    read_lines_until, read_receipt, run, run_supervisor, running, spawn, start_supervisor,
    start_tree, supervisor_cmd, wait_until,
)

REFERENCE_KEYS = {"cleanup_confirmed", "error", "return_code", "timed_out"}

# A command that reports the first signals it gets, then lives on for a while.
REPORTER = r"""
import os, signal, sys, time
def report(signum, frame):
    os.write(1, ("GOT %d\n" % signum).encode())
    if "--exit-on-signal" in sys.argv:
        time.sleep(float(sys.argv[-1]))
        os._exit(3)
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(sig, report)
os.write(1, b"ready\n")
while True:
    time.sleep(1)
"""


# --- GNU timeout around it: one burst, one request ------------------------------------------------

@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU timeout")
def test_gnu_timeout_around_the_supervisor_keeps_the_grace(paths):
    """timeout(1) sends SIGTERM to its child, then to its own process group:
    two at once, one request. The command's grace (it exits 0.3 s after
    SIGTERM) must hold every time."""
    for _ in range(2):
        proc = spawn(["timeout", "100"] + supervisor_cmd(*paths.options(cleanup=2) + [
            "--", PY, "-c", REPORTER, "--exit-on-signal", "0.3"]))
        read_lines_until(proc.stdout, "ready")
        proc.send_signal(signal.SIGTERM)
        status, _, err = finish(proc)
        assert status == 143, err  # timeout(1) passes on the supervisor's status
        receipt = read_receipt(paths.receipt)
        assert receipt["return_code"] == 3, receipt  # the command's handler finished: no SIGKILL
        assert receipt["signal"] == "SIGTERM" and receipt["cleanup_confirmed"] is True


def test_the_same_signal_twice_at_once_is_one_request_later_it_hurries(paths):
    proc = start_supervisor(*paths.options(cleanup=5) + [
        "--", PY, "-c", REPORTER, "--exit-on-signal", "0.5"])
    read_lines_until(proc.stdout, "ready")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 143, err
    assert read_receipt(paths.receipt)["return_code"] == 3  # the grace held
    spec = {"name": "cmd", "report_term": True}
    proc, _ = start_tree(spec, *paths.options(cleanup=60))
    proc.send_signal(signal.SIGTERM)
    read_lines_until(proc.stdout, "TERM cmd")
    time.sleep(0.3)  # past the burst: a second request, which skips the grace
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 137, err  # the command lived on: SIGKILL ended it
    assert read_receipt(paths.receipt)["ladder"][0]["duration_s"] < 30


# --- timeout(1)'s options ---------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["INT", "int", "SIGINT", "2", "sigint"])
def test_signal_chooses_the_first_signal_of_a_forced_stop(paths, spelling):
    proc = start_supervisor("-s", spelling, *paths.options(cleanup=2, stop=True) + [
        "--", PY, "-c", REPORTER, "--exit-on-signal", "0"])
    read_lines_until(proc.stdout, "ready")
    paths.stop.write_text("")
    status, out, err = finish(proc)
    assert status == 124, err
    assert "GOT %d" % signal.SIGINT in out
    assert read_receipt(paths.receipt)["return_code"] == 3


def test_signal_forms_and_refusals(paths):
    result = run_supervisor("--signal=RTMIN+1", *paths.options(timeout=0.3) + ["--", "sleep", "5"])
    assert result.returncode == 124, result.stderr
    assert read_receipt(paths.receipt)["return_code"] == -(signal.SIGRTMIN + 1)
    # As timeout(1): the stop signal KILL ends the command by SIGKILL: 137.
    result = run_supervisor("-sKILL", *paths.options(timeout=0.3) + ["--", "sleep", "5"])
    assert result.returncode == 137 and read_receipt(paths.receipt)["return_code"] == -9
    for bad in ("FOO", "-1", "999", "TERM+1", "RTMIN+x", "SIG_IGN", "\u0661"):
        result = run_supervisor("--signal", bad, *paths.options() + ["--", "true"])
        assert result.returncode == 125 and "--signal" in result.stderr, bad


def test_signal_0_sends_nothing_first_then_sigkill_after_the_grace(paths):
    """timeout -s 0 -k: no signal at the stop; the grace; then SIGKILL (137),
    and -v says so."""
    proc = start_supervisor("-s", "0", "-v", *paths.options(cleanup=0.5, stop=True) + [
        "--", PY, "-c", REPORTER])
    read_lines_until(proc.stdout, "ready")
    paths.stop.write_text("")
    status, out, err = finish(proc)
    assert status == 137, err
    assert "GOT" not in out  # no signal before the SIGKILL
    receipt = read_receipt(paths.receipt)
    assert receipt["return_code"] == -signal.SIGKILL and receipt["stop_signal"] is None
    assert receipt["ladder"][0]["duration_s"] >= 0.5  # the grace was waited out
    assert "no signal first" in err and "SIGKILL" in err


def test_the_stop_signal_starts_at_its_default_in_the_command(paths):
    """A caller that ignored SIGINT still has it ignored in the command, unless
    it is the stop signal."""
    script = "grep SigIgn /proc/self/status"
    for extra, ignored in (([], True), (["-s", "INT"], False)):
        result = run_supervisor(*extra + paths.options() + ["--", "sh", "-c", script],
                                preexec_fn=plain_signals(ignored=[signal.SIGINT]))
        mask = int(result.stdout.split()[1], 16)
        assert bool(mask & (1 << (signal.SIGINT - 1))) is ignored, (extra, result.stdout)


def test_kill_after_is_the_cleanup_timeout(paths):
    for spelling in (["-k", "0.5"], ["-k0.5"], ["--kill-after", "0.5"], ["--kill-after=0.5"]):
        result = run_supervisor("--timeout", 30, "--workdir", paths.work, "--receipt",
                                paths.receipt, *spelling + ["--", "true"])
        assert result.returncode == 0, result.stderr
        assert read_receipt(paths.receipt)["cleanup_timeout_s"] == 0.5
    # One option under three names: given twice, it is refused, not the last taken.
    result = run_supervisor(*paths.options() + ["-k", "0.5", "--", "true"])
    assert result.returncode == 125 and "given twice" in result.stderr


def test_preserve_status_keeps_the_commands_status(paths):
    result = run_supervisor("--preserve-status", *paths.options(timeout=0.3) + ["--", "sleep", "5"])
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    proc = start_supervisor("--preserve-status", *paths.options(stop=True) + [
        "--", PY, "-c", REPORTER, "--exit-on-signal", "0"])
    read_lines_until(proc.stdout, "ready")
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 3, err
    receipt = read_receipt(paths.receipt)
    assert receipt["exit_status"] == 3 and receipt["stop_reason"] == "stop_file"


def test_verbose_says_when_the_run_is_stopped_and_how_it_ended(paths):
    script = "setsid -f sleep 300; sleep 300 & echo started; exec sleep 300"
    proc = start_supervisor("-v", *paths.options(timeout=600, cleanup=1, stop=True) + [
        "--", "sh", "-c", script])
    read_lines_until(proc.stdout, "started")
    assert wait_until(lambda: len(running(proc.pid, [b"sleep", b"300"])) == 3)  # execs done
    paths.stop.write_text("")
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    assert status == 124
    started, *lines = err.splitlines()
    assert started.startswith("treereap: started: pid %d, in " % receipt["pid"])
    # A line when the grace runs out (SIGKILL needed): a loaded machine may get there.
    assert len(lines) == 2 or (len(lines) == 3 and "SIGKILL" in lines[1]), err
    assert lines[0].startswith("treereap: stopping the run: the stop file")
    assert "SIGTERM to the run" in lines[0]
    assert lines[-1].startswith("treereap: done: stop_file, exit status 124")
    assert "%d drained" % receipt["drained_count"] in lines[-1]
    assert "0 kept" in lines[-1] and "cleanup confirmed" in lines[-1]


def test_without_verbose_a_stopped_run_is_quiet(paths):
    result = run_supervisor(*paths.options(timeout=0.3) + ["--", "sleep", "5"])
    assert result.returncode == 124 and result.stderr == ""


def test_a_stop_file_left_from_an_earlier_run_says_why_nothing_ran(paths):
    paths.stop.write_text("")
    result = run_supervisor(*paths.options(stop=True) + ["--", "touch", paths.work / "ran"])
    assert result.returncode == 124
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "stop file" in lines[0] and "not started" in lines[0]
    assert not (paths.work / "ran").exists()


# --- --drain-all: CI ---------------------------------------------------------------------------------

SERVERS = (
    "setsid -f sh -c 'echo setsid $$ >> servers; exec sleep 300'; "
    "%s -c 'import subprocess; p = subprocess.Popen([\"sleep\", \"300\"], start_new_session=True); "
    "open(\"servers\", \"a\").write(\"popen %%d\\n\" %% p.pid)'; " % shlex.quote(PY))


@pytest.mark.parametrize("forced", [False, True])
def test_drain_all_leaves_no_test_server_behind(paths, forced):
    script = SERVERS + ("echo started; exec sleep 300" if forced else "exit 0")
    proc = start_supervisor("--drain-all", *paths.options(cleanup=1, stop=True) + [
        "--", "sh", "-c", script])
    if forced:
        read_lines_until(proc.stdout, "started")
        paths.stop.write_text("")
    status, _, err = finish(proc)
    servers = [int(line.split()[1]) for line in (paths.work / "servers").read_text().splitlines()]
    assert len(servers) == 2
    assert status == (124 if forced else 0), err
    receipt = read_receipt(paths.receipt)
    assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is True
    assert not any(alive(pid) for pid in servers)
    assert set(servers) <= set(p["pid"] for p in receipt["drained"])


def test_preserve_on_success_keeps_the_servers_and_says_so(paths):
    proc = start_supervisor(*paths.options() + ["--preserve-descendants-on-success", "--", "sh",
                                                "-c", SERVERS + "exit 0"])
    status, _, err = finish(proc)
    servers = [int(line.split()[1]) for line in (paths.work / "servers").read_text().splitlines()]
    try:
        assert status == 0, err
        assert sorted(p["pid"] for p in read_receipt(paths.receipt)["preserved"]) == sorted(servers)
    finally:
        kill_all(servers)


# --- The receipt: what the drain did, what the run cost ---------------------------------------------

def test_the_receipt_lists_what_was_drained(paths):
    script = "for i in 1 2 3; do sleep 300 & done; setsid -f sleep 301; echo started; exec sleep 302"
    proc = start_supervisor(*paths.options(cleanup=1, stop=True) + ["--", "sh", "-c", script])
    read_lines_until(proc.stdout, "started")
    for argv in ([b"sleep", b"302"], [b"sleep", b"301"]):  # the execs are done
        assert wait_until(lambda: running(proc.pid, argv))
    paths.stop.write_text("")
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    kept = [p["pid"] for p in receipt["preserved"]]
    try:
        assert status == 124, err
        # Everything (the default): the command itself, its group, the setsid one.
        assert [p["name"] for p in receipt["drained"]] == ["sleep"] * 5
        assert receipt["drained_count"] == 5 and receipt["schema_version"] == 6
        assert set(receipt["drained"][0]) == {"pid", "name"}
    finally:
        kill_all(kept)


@heavy
def test_the_drained_list_is_capped_at_a_thousand(paths):
    script = "for i in $(seq 1100); do sleep 300 & done; exit 0"
    result = run_supervisor(*paths.options(cleanup=5) + ["--", "sh", "-c", script])
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["drained_count"] == 1100 and len(receipt["drained"]) == 1000


def test_the_receipt_says_what_the_run_cost(paths):
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    result = run_supervisor(*paths.options() + ["--", "sh", "-c", "%s -c '%s' & wait" % (shlex.quote(PY), burn)])
    assert result.returncode == 0, result.stderr
    usage = read_receipt(paths.receipt)["usage"]
    assert set(usage) == {"source", "cpu_user_s", "cpu_system_s", "max_rss_kib",
                          "memory_peak_kib", "fork_rss_kib", "cpu_usage_s", "cpu_nr_throttled",
                          "cpu_throttled_s", "memory_events", "pids_peak", "pids_events_max",
                          "supervisor_cpu_s"}
    if usage["source"] == "cgroup":  # cpu.stat's own total
        assert usage["cpu_usage_s"] >= usage["cpu_user_s"] + usage["cpu_system_s"] - 0.01
    assert usage["source"] == ("cgroup" if DEFAULT_CONTAINMENT == "cgroup" else "rusage")
    assert 0.25 <= usage["cpu_user_s"] + usage["cpu_system_s"] < 5
    assert usage["max_rss_kib"] > 1000  # a Python process, the largest single one
    assert 0 < usage["supervisor_cpu_s"] < usage["cpu_user_s"] + usage["cpu_system_s"]


# --- / is nobody's workdir ----------------------------------------------------------------------------

def test_from_the_root_directory_any_receipt_path_is_accepted(paths):
    result = run_supervisor("--timeout", 5, "--receipt", paths.receipt, "--", "pwd", cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "/\n" and read_receipt(paths.receipt)["workdir"] == "/"
    result = run_supervisor("--timeout", 5, "--workdir", "/", "--receipt", paths.receipt,
                            "--", "true", cwd="/")
    assert result.returncode == 125 and "--receipt" in result.stderr


# --- --help teaches -------------------------------------------------------------------------------------

def test_help_teaches_what_the_readme_does():
    text = run_supervisor("--help").stdout
    # The policy in one line.
    assert [line for line in text.splitlines() if line.startswith("what is kept")] == [
        "what is kept: nothing by default (every process of the run is drained)."]
    for fragment in ("drained", "TERM, INT, HUP",
                     "the time EACH cleanup step may take", "COMMAND never starts",
                     "130: Ctrl-C", "docs/reference.md, beside this",
                     "cleanup_confirmed", "preserved", "exit_status", "--drain-all",
                     "--preserve-descendants-on-success", "--containment",
                     "--end-kept", "--signal", "--kill-after", "--preserve-status",
                     "--verbose", "137"):
        assert fragment in " ".join(text.split()), fragment  # (wrapped anywhere)


# --- The API ------------------------------------------------------------------------------------------

def run_python(code):
    result = subprocess.run([PY, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_readme_api_example_runs(tmp_path):
    receipt = tmp_path / "new" / "dir" / "receipt.json"
    code = ("import supervisor\n"
            "r = supervisor.supervise(['sh', '-c', 'exit 5'], timeout=60, cleanup_timeout=1,\n"
            "                         stop_file=%r, workdir=%r)\n"
            "supervisor.write_receipt(r, %r)\n"
            "print(r['exit_status'])\n" % (str(tmp_path / "stop"), str(tmp_path), str(receipt)))
    assert run_python(code).strip() == "5"
    assert json.loads(receipt.read_text())["exit_status"] == 5


def test_api_errors_speak_of_arguments_and_name_the_receipt_path(tmp_path):
    code = ("import supervisor\n"
            "try:\n"
            "    supervisor.supervise('make test', 60)\n"
            "except supervisor.UsageError as e:\n"
            "    print(e)\n"
            "try:\n"
            "    supervisor.write_receipt({}, %r)\n"
            "except OSError as e:\n"
            "    print(e)\n" % str(tmp_path / "file" / "receipt.json"))
    (tmp_path / "file").write_text("")
    first, second = run_python(code).splitlines()
    assert "argv list" in first and "--" not in first
    assert str(tmp_path / "file" / "receipt.json") in second and ".tmp" not in second


# --- Installed beside supervisord ----------------------------------------------------------------------

def test_pip_install_beside_supervisord(tmp_path):
    """supervisord's module is also called supervisor: the package installs
    the module as treereap, whose command names itself treereap. Offline: the
    wheel is built with the setuptools of the test environment (no build
    isolation, no package index), then installed into a fresh venv."""
    venv = tmp_path / "venv"
    subprocess.check_call([PY, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    site = subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                    "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   universal_newlines=True).strip()
    os.makedirs(os.path.join(site, "supervisor"))
    with open(os.path.join(site, "supervisor", "__init__.py"), "w") as f:
        f.write("raise ImportError('this is supervisord, not supervisor.py')\n")
    source = tmp_path / "source"  # a copy: the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "supervisor.py",
                 "treereap.py"):
        subprocess.check_call(["cp", "-P", os.path.join(ROOT, name), str(source)])
    assert os.path.islink(str(source / "treereap.py"))
    offline = ["--no-index", "--no-build-isolation", "--no-deps", "-q"]
    subprocess.check_call([PY, "-m", "pip", "wheel"] + offline + ["-w", str(tmp_path / "dist"),
                           str(source)], cwd=str(tmp_path), timeout=300)
    wheels = [str(w) for w in (tmp_path / "dist").iterdir()]
    subprocess.check_call([PY, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-index", "-q"] + wheels, cwd=str(tmp_path), timeout=300)
    help_text = subprocess.check_output([str(venv / "bin" / "treereap"), "--help"],
                                        universal_newlines=True)
    assert help_text.startswith("usage: treereap --timeout")
    result = run([venv / "bin" / "treereap", "--bogus"])
    assert result.returncode == 125 and result.stderr.startswith("treereap: unknown option")
    version = subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                       "import treereap; print(treereap.__version__)"],
                                      cwd=str(tmp_path), universal_newlines=True).strip()
    assert version == run_python("import supervisor; print(supervisor.__version__)").strip()
    result = run([venv / "bin" / "treereap", "--timeout", "5", "--", "sh", "-c", "exit 7"],
                 cwd=str(tmp_path))
    assert result.returncode == 7
    # The README's API example, saved in an empty directory and run there
    # (the fallback to `import supervisor` would find supervisord's here).
    from test_readme import GROUPS
    code = [code for name, blocks in sorted(GROUPS.items()) if name.startswith("README.md:")
            for language, code in blocks if language == "python"][0]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "example.py").write_text(code)
    env = dict((k, v) for k, v in os.environ.items() if k != "PYTHONPATH")
    result = run([venv / "bin" / "python", "example.py"], cwd=str(empty), env=env)
    assert result.returncode == 0 and result.stdout == "started\n1 drained\n", result.stderr
    assert os.listdir(str(empty)) == ["example.py"]


# --- Kubernetes: a summary as the termination message -------------------------------------------

def test_the_summary_says_how_the_run_ended_and_where_the_receipt_is(paths, tmp_path):
    summary = tmp_path / "summary"
    result = run_supervisor(*paths.options(timeout=0.5) + [
        "--summary", summary, "--", "sh", "-c", "sleep 30 & exec sleep 30"])
    assert result.returncode == 124 and result.stderr == ""
    lines = summary.read_text().splitlines()
    assert lines[0].startswith("done: timeout, exit status 124 in ") and "2 drained" in lines[0]
    assert "cleanup confirmed" in lines[0] and lines[-1] == "receipt: %s" % paths.receipt


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a bind mount, in a mount namespace)")
def test_the_summary_goes_into_a_bind_mounted_file_at_most_4_kib(paths, tmp_path):
    """As Kubernetes mounts /dev/termination-log: written in place (a rename
    cannot replace a mount point), cut to 4 KiB. A refusal writes one too."""
    source, log = tmp_path / "termination-log", tmp_path / "dev-termination-log"
    source.write_text("")
    log.write_text("")
    long_name = "no-such-command-" + "x" * 5000
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    base = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, source, log]
    result = run(base + supervisor_cmd(*paths.options() + ["--summary", log, "--", long_name]))
    assert result.returncode == 126, result.stderr[:200]  # (ENAMETOOLONG: cannot execute)
    text = source.read_bytes()
    assert len(text) == 4096 and text.startswith(b"done: exit, exit status 126")
    result = run(base + supervisor_cmd("--timeout", "x", "--summary", log, "--", "true"))
    assert result.returncode == 125
    assert source.read_text().startswith("refused, exit status 125: --timeout: 'x'")


def test_a_fifo_at_the_summary_path_never_blocks(paths, tmp_path):
    fifo = tmp_path / "summary"
    os.mkfifo(str(fifo))
    result = run_supervisor(*paths.options() + ["--summary", fifo, "--", "true"], timeout=60)
    assert result.returncode == 0 and "--summary: cannot write" in result.stderr


def test_a_symlink_at_the_summary_path_is_not_followed(paths, tmp_path):
    target, link = tmp_path / "target", tmp_path / "summary"
    target.write_text("untouched")
    link.symlink_to(target)
    result = run_supervisor(*paths.options() + ["--summary", link, "--", "true"])
    assert result.returncode == 0 and "--summary: cannot write" in result.stderr
    assert target.read_text() == "untouched"


# --- An engine's stop: its grace, then SIGKILL; a launcher that dies ------------------------------

# A command deaf to SIGTERM, with a child in a session of its own, deaf too:
# the stop needs SIGKILL, as a hung harness would.
DEAF = ("trap '' TERM; setsid sh -c \"trap '' TERM; echo \\$\\$ > child; exec sleep 300\" & "
        "while [ ! -s child ]; do sleep 0.01; done; echo started; exec sleep 300")


def engine_stop(proc, grace, sig=signal.SIGTERM):
    """What Docker, Kubernetes, Slurm and Ray do to stop a container or job:
    the signal, `grace` seconds, then SIGKILL (if the supervisor still runs)."""
    os.kill(proc.pid, sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
    return finish(proc)


@pytest.mark.parametrize("during", ["running", "a-deadlines-grace"])
def test_stop_timeout_puts_the_receipt_on_disk_within_the_engines_grace(paths, during):
    """-k 60 (a long grace for the deadline's stop: a harness that
    checkpoints) under an engine whose grace is 6 s: with --stop-timeout 6,
    the engine's SIGTERM ends the run, its grace cut to fit (6 - 2 s), and
    the receipt is on disk before the SIGKILL, confirmed, whether the
    SIGTERM came while the command ran or during the deadline's grace (then
    it is that stop again: 124, or 137 once SIGKILL was needed). Without it
    the engine's SIGKILL came first: no receipt."""
    timeout = 1 if during == "a-deadlines-grace" else 60
    proc = start_supervisor(*paths.options(timeout=timeout, cleanup=60) + [
        "-v", "--stop-timeout", "6", "--", "sh", "-c", DEAF])
    read_lines_until(proc.stdout, "started")
    child = int((paths.work / "child").read_text())
    try:
        if during == "a-deadlines-grace":
            read_lines_until(proc.stderr, "treereap: stopping the run: the deadline passed (1s); "
                             "SIGTERM to the run")
        status, _, err = engine_stop(proc, 6)
        receipt = read_receipt(paths.receipt)
        assert status == 137 and receipt["exit_status"] == 137, err
        assert receipt["cleanup_confirmed"] is True and not alive(child), receipt
        assert receipt["stop_reason"] == ("timeout" if timeout == 1 else "signal"), receipt
        assert receipt["ladder"][0]["step"] == "terminating", receipt
        assert "--stop-timeout 6s: SIGKILL" in err, err
    finally:
        kill_all([child])


def test_stop_with_parent_stops_the_run_when_its_launcher_dies(paths):
    """A launcher that cannot exec the supervisor (a CI step's shell) is
    killed: with --stop-with-parent the supervisor takes its death as a
    SIGTERM and stops the run, receipt and all; without, the run lives on,
    orphaned, to its deadline (here ended by the test)."""
    for flag in (["--stop-with-parent"], []):
        argv = supervisor_cmd(*paths.options(timeout=300, cleanup=2) + flag + [
            "--", "sh", "-c", "echo started; exec sleep 300"])
        launcher = spawn(["sh", "-c", '"$@"; echo never', "sh"] + argv)  # not exec'd: a child
        read_lines_until(launcher.stdout, "started")
        supervisor = [p for p in running(launcher.pid, [a.encode() for a in argv])]
        assert len(supervisor) == 1, supervisor
        launcher.kill()
        launcher.wait()
        if flag:
            assert wait_until(lambda: paths.receipt.exists() and not alive(supervisor[0]))
            receipt = read_receipt(paths.receipt)
            assert receipt["stop_reason"] == "signal" and receipt["signal"] == "SIGTERM"
            assert receipt["cleanup_confirmed"] is True and receipt["exit_status"] == 143
        else:
            assert alive(supervisor[0]) and not paths.receipt.exists()
            os.kill(supervisor[0], signal.SIGTERM)
            assert wait_until(lambda: paths.receipt.exists() and not alive(supervisor[0]))
        paths.receipt.unlink()


def test_stop_with_parent_and_new_session_stop_the_run_when_the_launcher_dies(paths):
    """With --new-session the supervising process is the relay's child: the
    relay dies with the launcher (--stop-with-parent), and so the run stops."""
    argv = supervisor_cmd(*paths.options(timeout=300, cleanup=2) + [
        "--new-session", "--stop-with-parent", "--", "sh", "-c", "echo started; exec sleep 300"])
    launcher = spawn(["sh", "-c", '"$@"; echo never', "sh"] + argv)
    read_lines_until(launcher.stdout, "started")
    both = running(launcher.pid, [a.encode() for a in argv])
    assert len(both) == 2, both  # the relay and the supervising process
    launcher.kill()
    launcher.wait()
    assert wait_until(lambda: paths.receipt.exists() and not any(alive(p) for p in both))
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal" and receipt["cleanup_confirmed"] is True


@pytest.mark.parametrize("stop", ["deadline", "stop-file"])
def test_with_k_0_one_stop_signal_ends_any_stops_grace(paths, stop):
    """-k 0: no end to the grace but a stop signal. After a stop by the
    deadline or the stop file, the first stop signal was taken for that stop
    again (a controller's stop file, then its SIGTERM), and a second was
    needed; now one does, unless it comes with the stop (within 0.25 s)."""
    proc = start_supervisor(*paths.options(timeout=0.3 if stop == "deadline" else 60, cleanup=0,
                                           stop=True) + [
        "-v", "--", "sh", "-c", "trap '' TERM; echo started; while :; do sleep 1; done"])
    read_lines_until(proc.stdout, "started")
    if stop == "stop-file":
        paths.stop.write_text("")
    read_lines_until(proc.stderr, "treereap: stopping the run: %s; SIGTERM to the run" % (
        "the deadline passed (0.3s)" if stop == "deadline" else
        "the stop file %s appeared" % paths.stop))
    time.sleep(0.3)  # (past the burst: a signal within it is the stop again)
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc, timeout=60)
    assert status == 137 and "a second stop signal cut the grace short" in err, err
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True


def test_end_kept_with_k_0_is_refused_naming_the_option(paths):
    result = run_supervisor("--end-kept", paths.receipt, "-k", "0")
    assert result.returncode == 125 and result.stderr.count("\n") == 1, result.stderr
    assert "-k 0" in result.stderr and "cleanup_timeout" not in result.stderr
