"""Limits on the whole run: memory, processes and CPU time enforced by the
kernel in the run's cgroup (or refused before anything starts), and the
output capped by the supervisor anywhere.

The tests marked `in_guest` need a pure cgroup v2 kernel with the memory,
pids and cpu controllers: they run in the guest tests/test_guest.py boots
(one boot for the batch), and are skipped elsewhere with that reason. The
rest run here: on this hybrid host memory and pids are on cgroup v1, so
those limits are refused; --cpu-time needs only the run's cgroup v2.
"""
import os
import shlex
import signal
import subprocess

import pytest

from conftest import (
    CGROUP_ROOT, HAS_CGROUP, PY, ROOT, alive, finish, kill_all, needs_cgroup, read_receipt,
    run_supervisor, spawn, start_supervisor, supervisor_cmd, wait_until,
)

IN_GUEST = os.environ.get("TREEREAP_IN_GUEST") == "1"
in_guest = pytest.mark.skipif(not IN_GUEST, reason="runs in the pure cgroup v2 guest that "
                              "tests/test_guest.py boots (memory and pids are cgroup v1 here)")


def controllers_here():
    """The controllers a cgroup made beside the supervisor's would have."""
    try:
        with open("/proc/self/cgroup") as f:
            ours = [line.split(":", 2)[2].strip() for line in f if line.startswith("0::")][0]
        with open(CGROUP_ROOT + ours + "/cgroup.controllers") as f:
            return f.read().split()
    except (OSError, IndexError):
        return []


def receipt_of(result, paths):
    assert os.path.exists(str(paths.receipt)), result.stderr
    return read_receipt(paths.receipt)


# --- Refusals: never a limit silently unenforced ------------------------------------------------

def test_every_limit_with_no_cgroup_is_refused_in_one_line_before_anything_starts(paths):
    marker = paths.work / "ran"
    result = run_supervisor(*paths.options() + ["--containment", "proc", "--memory-max", "64M",
                                                "--pids-max", "20", "--cpu-time", "5", "--",
                                                "touch", marker])
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--memory-max, --pids-max, --cpu-time: needs a cgroup" in result.stderr
    assert not marker.exists() and not paths.receipt.exists()


@pytest.mark.skipif(not HAS_CGROUP or {"memory", "pids"} <= set(controllers_here()),
                    reason="needs a cgroup v2 without the memory and pids controllers (as here, "
                    "where they are on cgroup v1)")
def test_limits_whose_controllers_are_not_in_cgroup_v2_are_refused_with_the_cause_read(paths):
    """Both options in one line (a user fixes both at once), each with the
    cause /proc/self/cgroup shows (here: on a cgroup v1 hierarchy) and a way
    out."""
    with open("/proc/self/cgroup") as f:
        v1 = {name for line in f for name in line.split(":")[1].split(",")}
    marker = paths.work / "ran"
    result = run_supervisor(*paths.options() + ["--memory-max", "64M", "--pids-max", "20", "--",
                                                "touch", marker])
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1, result.stderr
    for option, controller in (("--memory-max", "memory"), ("--pids-max", "pids")):
        assert "%s (%s)" % (option, controller) in result.stderr
    if {"memory", "pids"} <= v1:
        assert "on cgroup v1 here" in result.stderr and "not delegated" not in result.stderr
        assert "cgroup v2 only" in result.stderr
    assert not marker.exists() and not paths.receipt.exists()


def test_a_controller_not_on_v1_is_said_to_be_not_delegated():
    """The other cause, where /proc/self/cgroup lists no v1 hierarchy (a
    pure cgroup v2 host whose parent cgroup kept the controller)."""
    import supervisor

    class Fs(object):
        def read(self, path):
            return {"self/cgroup": b"0::/job\n"}[path]

    class Home(object):
        shown = "/sys/fs/cgroup/job"

    line = supervisor._controllers_refused(Fs(), [("--memory-max", "memory")], Home())
    assert "--memory-max (memory): controller not delegated to /sys/fs/cgroup/job" in line
    assert "systemd-run --scope -p Delegate=yes" in line and "v1" not in line


@pytest.mark.parametrize("args, words", [
    (["--memory-max", "1.5.G"], "--memory-max: '1.5.G' is not a size (512M, 1.5G)"),
    (["--memory-max", "1e9"], "--memory-max: '1e9' is not"),
    (["--memory-max", "0"], "--memory-max: '0' is not"),
    (["--memory-max", "1BBB"], "--memory-max: '1BBB' is not"),
    (["--memory-max", "16777216T"], "--memory-max: '16777216T' is not"),
    (["--memory-max", "1000"], "--memory-max: at least 1M"),
    (["--pids-max", "10K"], "--pids-max: '10K' is not a whole number (100)"),
    (["--pids-max", "1.5"], "--pids-max: '1.5' is not a whole number (100)"),
    (["--cpu-time", "-1"], "--cpu-time: '-1' is not a positive duration"),
    (["--max-output", "1M"], "--max-output: needs --output FILE"),
    (["--output", "OUT", "--max-output", "1000"], "--max-output: at least 1K"),
    (["--output", "OUT", "--max-output", "1M", "--preserve-descendants-on-success"],
     "--max-output: not with --preserve-descendants-on-success"),
])
def test_limit_options_are_checked(paths, args, words):
    args = [str(paths.work.parent / "out.log") if a == "OUT" else a for a in args]
    result = run_supervisor(*paths.options() + args + ["--", "true"])
    assert result.returncode == 125 and words in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1


def test_sizes_read_as_users_of_such_tools_expect():
    """The units and the fractions systemd's MemoryMax= takes."""
    import supervisor
    for text, size in [("4096", 4096), ("512K", 512 << 10), ("512M", 512 << 20),
                       ("2G", 2 << 30), ("1GiB", 1 << 30), ("64mb", 64 << 20),
                       ("1.5G", 3 << 29), ("0.5K", 512), ("1P", 1 << 50), ("2E", 2 << 60)]:
        assert supervisor._parse_size(text, "--memory-max") == size


# --- CPU time of the whole tree -----------------------------------------------------------------

BUSY_TREE = ("for i in 1 2 3; do setsid sh -c 'while :; do :; done' & done; "
             "while :; do :; done")


def check_cpu_time_stop(receipt, limit):
    assert receipt["stop_reason"] == "cpu_time" and receipt["timed_out"] is False, receipt
    assert receipt["exit_status"] in (124, 137) and receipt["cleanup_confirmed"] is True
    assert receipt["drained_count"] >= 4  # the command and its three sessions
    used = receipt["usage"]["cpu_usage_s"]
    # Spent, then stopped: what it could spend past the limit is bounded by
    # the time the supervisor takes to read cpu.stat and freeze the run.
    assert limit <= used < limit + 1.5, receipt["usage"]
    assert receipt["limits"]["cpu_time_s"] == limit


@needs_cgroup
def test_cpu_time_stops_a_busy_tree_of_several_processes_within_its_bound(paths):
    result = run_supervisor(*paths.options(timeout=120) + ["--cpu-time", "2", "-v", "--",
                                                            "sh", "-c", BUSY_TREE])
    receipt = receipt_of(result, paths)
    check_cpu_time_stop(receipt, 2.0)
    assert result.returncode == receipt["exit_status"]
    assert "the run spent its CPU time (--cpu-time 2s)" in result.stderr


@needs_cgroup
def test_cpu_time_holds_its_bound_against_spinners_that_ignore_sigterm(paths):
    """Two spinners that ignore SIGTERM: the grace after the stop signal let
    them spend -k more seconds on each CPU (2.55 s of CPU for --cpu-time 1).
    Spent is spent: SIGKILL at once, no grace, no stop signal first. Past the
    limit they spend at most what they spin between two reads of cpu.stat
    (50 ms a CPU) and while the supervisor acts (bounded here generously: the
    machine may be loaded)."""
    spinners = "trap '' TERM; for i in 1 2; do sh -c \"trap '' TERM; while :; do :; done\" & done; wait"
    result = run_supervisor(*paths.options(timeout=120, cleanup=3) + [
        "--cpu-time", "1", "--", "sh", "-c", spinners])
    receipt = receipt_of(result, paths)
    assert receipt["stop_reason"] == "cpu_time" and receipt["stop_signal"] is None, receipt
    assert result.returncode == 137 and receipt["cleanup_confirmed"] is True, result.stderr
    assert 1.0 <= receipt["usage"]["cpu_usage_s"] < 1.0 + 0.05 * os.cpu_count() + 0.5
    assert [step["step"] for step in receipt["ladder"]] == ["terminating", "killing", "draining"]


SPINNERS = "for i in 1 2; do sh -c \"trap '' TERM; while :; do :; done\" & done; "


@needs_cgroup
@pytest.mark.parametrize("stop", ["deadline", "signal", "exit"])
def test_cpu_time_holds_in_every_grace(paths, stop):
    """--cpu-time 2 -k 30, two spinners deaf to SIGTERM: the deadline, a stop
    signal, or the command's own exit (the spinners left behind) starts a
    grace of 30 s, in which --cpu-time was not watched (8.7-9.3 s of CPU for
    --cpu-time 2 -k 8; the exit ended "exit 0"). Watched in every grace, the
    spinners are SIGKILLed once it is spent; the stop keeps its reason, the
    exit's becomes cpu_time (124: the command was gone)."""
    command = "trap '' TERM; " + SPINNERS + "echo started; " + (
        "exit 0" if stop == "exit" else "wait")
    if stop == "deadline":  # spin from the deadline's SIGTERM on, not before the deadline:
        # a short one could come before sh's trap (the slow guest), a long one
        # after the CPU time is spent
        command = ("spin() { sh -c 'trap \"\" TERM; while :; do :; done' & }; "
                   "trap 'spin; spin; wait' TERM; echo started; sleep 600 & wait")
    proc = start_supervisor(*paths.options(timeout=10 if stop == "deadline" else 120,
                                           cleanup=30) + [
        "--cpu-time", "2", "-v", "--", "sh", "-c", command])
    assert proc.stdout.readline() == b"started\n"
    if stop == "signal":
        proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == {"deadline": "timeout", "signal": "signal",
                                      "exit": "cpu_time"}[stop], receipt
    assert status == (124 if stop == "exit" else 137) and receipt["cleanup_confirmed"], err
    assert 2.0 <= receipt["usage"]["cpu_usage_s"] < 2.0 + 0.05 * os.cpu_count() + 0.5, receipt
    assert "the run spent its CPU time: SIGKILL" in err, err


@needs_cgroup
def test_cpu_time_not_spent_lets_the_command_exit(paths):
    result = run_supervisor(*paths.options() + ["--cpu-time", "60", "--", "sh", "-c", "exit 3"])
    receipt = receipt_of(result, paths)
    assert result.returncode == 3 and receipt["stop_reason"] == "exit"


# --- Output: the head and the tail, the command never held up -----------------------------------

WRITE_A_GIB = ("import sys; w = sys.stdout.buffer.write; w(b'HEAD\\n'); b = b'x' * (1 << 20)\n"
               "for i in range(1024): w(b)\n"
               "w(b'\\nLAST LINE\\n'); sys.stdout.flush(); sys.stderr.write('ON STDERR\\n')")


def test_a_trickle_of_output_is_kept_whole(paths):
    """A byte every 200 us for 2 s: after a small read the output's pipe
    waits 10 ms before it is watched again (one wake-up a byte cost the
    supervisor twice the writer's CPU: scripts/bench.py measures it), and
    not a byte is lost, the last ones included."""
    trickle = ("import os, time\nend = time.monotonic() + 2\nwhile time.monotonic() < end:\n"
               "    os.write(1, b'x'); time.sleep(0.0002)\nos.write(1, b'END')\n")
    out = paths.work.parent / "out.log"
    result = run_supervisor(*paths.options(timeout=60) + [
        "--output", out, "--max-output", "1M", "--", PY, "-S", "-c", trickle])
    output = receipt_of(result, paths)["output"]
    assert result.returncode == 0 and output["bytes_kept"] == output["bytes_seen"] > 1000
    assert out.read_bytes().endswith(b"xEND") and output["cut"] is False


def test_max_output_keeps_the_head_and_the_tail_of_a_gib(paths, containment):
    kind, options = containment
    out = paths.work.parent / "out.log"
    result = run_supervisor(*paths.options(timeout=300) + options + [
        "--output", out, "--max-output", "1M", "--", PY, "-c", WRITE_A_GIB])
    receipt = receipt_of(result, paths)
    assert result.returncode == 0 and receipt["stop_reason"] == "exit", result.stderr
    data = out.read_bytes()
    assert len(data) <= 1 << 20
    seen = len(b"HEAD\n") + (1 << 30) + len(b"\nLAST LINE\n") + len(b"ON STDERR\n")
    assert receipt["output"] == {"path": str(out), "max_bytes": 1 << 20, "bytes_seen": seen,
                                 "bytes_kept": len(data), "cut": True, "error": None}
    assert data.startswith(b"HEAD\nxxxx") and data.endswith(b"xxxx\nLAST LINE\nON STDERR\n")
    head, marker, tail = data.partition(b"\n[treereap: ")
    cut = int(tail.split(b" ", 1)[0])
    assert tail.startswith(b"%d bytes cut here]\n" % cut)
    kept_tail = len(tail) - len(b"%d bytes cut here]\n" % cut)
    assert len(head) + cut + kept_tail == seen and len(head) == 1 << 19


def test_output_that_fits_is_kept_whole(paths):
    out = paths.work.parent / "out.log"
    result = run_supervisor(*paths.options() + [
        "--output", out, "--max-output", "4K", "--", "sh", "-c", "echo out; echo err >&2"])
    receipt = receipt_of(result, paths)
    assert out.read_bytes() == b"out\nerr\n" and result.stdout == "" and result.returncode == 0
    assert receipt["output"]["cut"] is False and receipt["output"]["bytes_kept"] == 8


def test_output_alone_is_the_commands_stdout_and_stderr_uncapped(paths):
    out = paths.work.parent / "out.log"
    result = run_supervisor(*paths.options() + [
        "--output", out, "--preserve-descendants-on-success", "--",
        "sh", "-c", "head -c 100000 /dev/zero; echo err >&2"])
    receipt = receipt_of(result, paths)
    assert result.returncode == 0 and os.path.getsize(str(out)) == 100004
    assert receipt["output"]["bytes_kept"] == 100004 and receipt["output"]["max_bytes"] is None


def test_output_to_anything_but_a_regular_file_is_refused(paths, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    for target in (fifo, "/dev/null"):
        result = run_supervisor(*paths.options() + ["--output", target, "--max-output", "1M",
                                                    "--", "touch", paths.work / "ran"])
        assert result.returncode == 125 and "--output: cannot write" in result.stderr
        assert not (paths.work / "ran").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a small tmpfs, in a mount namespace)")
def test_a_full_disk_costs_the_output_never_the_receipt(paths, tmp_path):
    """FILE's filesystem fills up (short writes, then ENOSPC): what could
    not be kept is counted and named, and the run ends as usual."""
    disk = tmp_path / "disk"
    disk.mkdir()
    write = "import sys; sys.stdout.buffer.write(b'x' * (3 << 20)); sys.stdout.flush()"
    script = 'mount -t tmpfs -o size=256k tmpfs "$0" && exec "$@"'
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                             str(disk)] + supervisor_cmd(*paths.options() + [
                                 "--output", disk / "out.log", "--max-output", "2M",
                                 "--", PY, "-c", write]),
                            universal_newlines=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout=120)
    receipt = receipt_of(result, paths)
    assert result.returncode == 0 and receipt["cleanup_confirmed"] is True, result.stderr
    output = receipt["output"]
    assert output["bytes_seen"] == 3 << 20 and output["cut"] is True
    assert "No space left on device" in output["error"]
    assert "--output: cannot keep the output" in result.stderr


def test_a_stop_handler_that_writes_much_is_not_held_up_by_the_cap(paths):
    """The grace is the command's: writing 20 MB from its SIGTERM handler
    into a 64K cap, it exits by itself, never SIGKILLed, never SIGPIPEd."""
    out = paths.work.parent / "out.log"
    script = ("trap 'head -c 20000000 /dev/zero; exit 3' TERM; echo ready; "
              "while :; do sleep 0.05; done")
    proc = start_supervisor(*paths.options(timeout=300, cleanup=60) + [
        "--output", out, "--max-output", "64K", "--", "sh", "-c", script])
    assert wait_until(lambda: out.exists() and out.read_bytes() == b"ready\n")
    proc.terminate()
    finish(proc)
    receipt = read_receipt(paths.receipt)
    assert receipt["return_code"] == 3 and receipt["exit_status"] == 143, receipt
    assert receipt["output"]["bytes_seen"] >= 6 + 20000000  # and what sh says of the sleep
    assert os.path.getsize(str(out)) <= 64 << 10


# --- In the pure cgroup v2 guest: memory and processes ---------------------------------------

def limits_cmd(paths, *args):
    return supervisor_cmd(*paths.options(timeout=60) + list(args))


ALLOCATE = "import time; b = bytearray(%d << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"


@in_guest
def test_memory_max_the_oom_kill_takes_the_whole_run_and_the_supervisor_tells(paths):
    """Two processes: one sleeps, one allocates past the limit. The kernel
    kills both (memory.oom.group), the command dies of SIGKILL (137), and
    the supervisor, outside the limited cgroup, writes the receipt."""
    script = "sleep 300 & echo $! > sleeper; exec %s -c '%s'" % (shlex.quote(PY), ALLOCATE % 256)
    result = run_supervisor(*paths.options(timeout=120) + ["--memory-max", "64M", "-v", "--",
                                                           "sh", "-c", script])
    receipt = receipt_of(result, paths)
    assert result.returncode == 137 and receipt["exit_status"] == 137, result.stderr
    assert receipt["stop_reason"] == "memory" and receipt["return_code"] == -9
    assert receipt["cleanup_confirmed"] is True and receipt["oom_killed_by"] == "run"
    assert not alive(int((paths.work / "sleeper").read_text()))
    usage = receipt["usage"]
    assert usage["memory_events"]["oom_kill"] >= 1 and usage["memory_events"]["max"] >= 1
    assert usage["memory_peak_kib"] <= 64 * 1024
    assert receipt["limits"]["memory_max"] == 64 << 20
    assert receipt["limits"]["set"] == {"memory.max": str(64 << 20), "memory.swap.max": "0",
                                        "memory.oom.group": "1"}
    assert "--memory-max" in result.stderr and "OOM" in result.stderr


@in_guest
def test_an_oom_score_adj_of_minus_1000_does_not_exempt_the_run(paths):
    """Inherited from the supervisor (a service at OOMScoreAdjust=-1000),
    it would keep the OOM killer away: the command starts at 0."""
    result = subprocess.run(["sh", "-c", 'echo -1000 > /proc/self/oom_score_adj && exec "$@"',
                             "sh"] + limits_cmd(paths, "--memory-max", "40M", "--", PY, "-c",
                                                ALLOCATE % 256),
                            universal_newlines=True, timeout=120, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    receipt = receipt_of(result, paths)
    assert result.returncode == 137 and receipt["stop_reason"] == "memory", result.stderr


@pytest.fixture
def limited_home():
    """A cgroup of the test's own to start in, below one with a memory.max of
    200 MiB (as a container's or a pod's) that enables the controllers for
    the cgroups below it (so it holds no process itself)."""
    top = os.path.join(CGROUP_ROOT, "test-limited-%d" % os.getpid())
    os.mkdir(top)
    try:
        for name, value in (("memory.max", "200M"), ("memory.swap.max", "0"),
                            ("cgroup.subtree_control", "+memory +pids")):
            with open(os.path.join(top, name), "w") as f:
                f.write(value)
        os.mkdir(os.path.join(top, "job"))
        yield os.path.join(top, "job")
    finally:
        for directory, below, _ in sorted(os.walk(top), reverse=True):
            assert wait_until(lambda: not open(directory + "/cgroup.procs").read().split())
            os.rmdir(directory)


@in_guest
def test_an_oom_kill_above_the_run_never_takes_the_supervisor(paths, limited_home):
    """--memory-max 300M in a cgroup limited to 200M (a container's): the
    OOM kill comes from above, and it took the supervisor first (no
    receipt); or it killed the run and the receipt said stop_reason memory,
    a limit that was never reached. The supervisor is at oom_score_adj -1000
    and says at the start that the limit above comes first; the receipt
    says the command died of SIGKILL, by an OOM killer outside the run."""
    argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', limited_home] + limits_cmd(
        paths, "--memory-max", "300M", "--", PY, "-c", ALLOCATE % 400)
    result = subprocess.run(argv, universal_newlines=True, timeout=120, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    receipt = receipt_of(result, paths)
    assert result.returncode == 137 and receipt["return_code"] == -9, result.stderr
    assert receipt["stop_reason"] == "exit" and receipt["oom_killed_by"] == "outside", receipt
    assert receipt["cleanup_confirmed"] is True
    assert "a cgroup above the run allows 200 MiB" in result.stderr, result.stderr


@in_guest
def test_the_supervisor_moved_into_its_run_is_not_taken_by_its_oom_kill(paths):
    """A root command writes the supervisor's pid into the run's cgroup, then
    fills --memory-max: the group OOM kill (memory.oom.group) took the
    supervisor too, and no receipt came. At -1000 the kill passes it over,
    and it moves itself out again at its next wake-up."""
    script = "cg=%s$(sed -n 's/^0:://p' /proc/self/cgroup); echo $PPID > $cg/cgroup.procs; " \
             "exec %s -c '%s'" % (CGROUP_ROOT, shlex.quote(PY), ALLOCATE % 256)
    result = run_supervisor(*paths.options(timeout=120) + ["--memory-max", "64M", "--",
                                                           "sh", "-c", script])
    receipt = receipt_of(result, paths)
    assert result.returncode == 137 and receipt["stop_reason"] == "memory", result.stderr
    assert receipt["oom_killed_by"] == "run" and receipt["cleanup_confirmed"] is True


@in_guest
def test_limits_beside_an_init_after_prepare_cgroup(paths):
    """A cgroup shared with another process (a container's init, an exec's
    sibling): --memory-max is refused, naming the step that makes it work;
    after --prepare-cgroup, a supervisor started beside the init holds its
    run to the limit."""
    shared = os.path.join(CGROUP_ROOT, "test-shared-%d" % os.getpid())
    os.mkdir(shared)
    into = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', shared]
    init = spawn(into + ["sleep", "300"])
    try:
        assert wait_until(lambda: str(init.pid) in open(shared + "/cgroup.procs").read().split())
        limited = limits_cmd(paths, "--memory-max", "40M", "--", PY, "-c", ALLOCATE % 256)
        refused = subprocess.run(into + limited, universal_newlines=True, timeout=120,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert refused.returncode == 125 and "--prepare-cgroup" in refused.stderr, refused.stderr
        prepared = subprocess.run(into + supervisor_cmd("--prepare-cgroup"), timeout=120,
                                  universal_newlines=True, stderr=subprocess.PIPE)
        assert prepared.returncode == 0 and "memory, pids on" in prepared.stderr, prepared.stderr
        leaf = ["sh", "-c", 'echo $$ > "$0/treereap.init/cgroup.procs" && exec "$@"', shared]
        result = subprocess.run(leaf + limited, universal_newlines=True, timeout=120,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        receipt = receipt_of(result, paths)
        assert result.returncode == 137 and receipt["stop_reason"] == "memory", result.stderr
        assert alive(init.pid)
    finally:
        init.kill()
        init.wait()
        for directory, _, _ in sorted(os.walk(shared), reverse=True):
            assert wait_until(lambda: not open(directory + "/cgroup.procs").read().split())
            os.rmdir(directory)


@in_guest
def test_an_oom_of_a_nested_run_is_not_ours_to_report(paths):
    """The inner supervisor's --memory-max kills its run; the outer, asked
    for no limit, reports the inner's exit (137), not a memory stop of its
    own, and -v names no limit."""
    inner = supervisor_cmd("--timeout", "60", "--memory-max", "40M", "--", PY, "-c",
                           ALLOCATE % 256)
    result = run_supervisor(*paths.options(timeout=120) + ["-v", "--"] + inner)
    receipt = receipt_of(result, paths)
    assert result.returncode == 137 and receipt["stop_reason"] == "exit", result.stderr
    assert receipt["limits"] is None and "--memory-max reached" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("treereap: done: exit")


@in_guest
def test_supervise_with_limits_again_and_again_reuses_its_leaf(paths):
    """A supervise() caller stays in the leaf it moved into: its next
    limited run takes that leaf again, never one more level down."""
    home = make_cgroup("test-api-%d" % os.getpid())
    code = ("import os, supervisor\n"
            "for i in range(5):\n"
            "    r = supervisor.supervise(['true'], 30, pids_max=100, workdir='/')\n"
            "    print(r['cgroup'], open('/proc/self/cgroup').read().split('::')[1].strip())\n")
    try:
        result = subprocess.run(start_in(home, [PY, "-c", code]), universal_newlines=True,
                                timeout=120, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=ROOT)
        assert result.returncode == 0, result.stderr
        runs = [line.split() for line in result.stdout.splitlines()]
        assert len(runs) == 5 and len(set(where for _, where in runs)) == 1, runs
        assert all(run.count("/") == runs[0][0].count("/") for run, _ in runs), runs
    finally:
        remove_cgroups(home)


@in_guest
def test_new_session_with_limits_moves_its_relay_too(paths):
    home = make_cgroup("test-relay-%d" % os.getpid())
    try:
        result = subprocess.run(start_in(home, limits_cmd(paths, "--new-session", "--pids-max",
                                                          "50", "--", "true")),
                                universal_newlines=True, timeout=120, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert result.returncode == 0, result.stderr
        assert receipt_of(result, paths)["limits"]["set"] == {"pids.max": "50"}
    finally:
        remove_cgroups(home)


@in_guest
def test_memory_max_under_the_limit_changes_nothing(paths):
    result = run_supervisor(*paths.options(timeout=120) + ["--memory-max", "256M", "--", PY,
                                                           "-c", "b = bytearray(32 << 20)"])
    receipt = receipt_of(result, paths)
    assert result.returncode == 0 and receipt["stop_reason"] == "exit"
    assert receipt["usage"]["memory_events"]["oom_kill"] == 0
    assert receipt["usage"]["memory_peak_kib"] >= 32 * 1024


# Every process forks again, for ever: bounded by construction only by
# --pids-max (as root, RLIMIT_NPROC does not apply; the guest is throwaway).
FORK_BOMB = ("import os, time\n"
             "while True:\n"
             "    try:\n"
             "        os.fork()\n"
             "    except OSError:\n"
             "        time.sleep(0.05)\n")


@in_guest
def test_pids_max_holds_a_fork_bomb_and_the_deadline_drains_it(paths):
    result = run_supervisor(*paths.options(timeout=5, cleanup=10) + [
        "--pids-max", "32", "-v", "--", PY, "-c", FORK_BOMB])
    receipt = receipt_of(result, paths)
    assert receipt["stop_reason"] == "timeout" and receipt["cleanup_confirmed"] is True
    assert result.returncode in (124, 137)
    usage = receipt["usage"]
    assert usage["pids_events_max"] >= 1 and usage["pids_peak"] <= 32, usage
    assert receipt["drained_count"] >= 10 and receipt["limits"]["set"] == {"pids.max": "32"}
    assert "--pids-max" in result.stderr


@in_guest
def test_cpu_time_in_the_guest_reports_the_throttling_counters(paths):
    result = run_supervisor(*paths.options(timeout=120) + ["--cpu-time", "1", "--",
                                                            "sh", "-c", BUSY_TREE])
    receipt = receipt_of(result, paths)
    check_cpu_time_stop(receipt, 1.0)
    assert isinstance(receipt["usage"]["cpu_nr_throttled"], int)


def make_cgroup(name, controllers=""):
    path = os.path.join(CGROUP_ROOT, name)
    os.mkdir(path)
    if controllers:
        with open(path + "/cgroup.subtree_control", "w") as f:
            f.write(controllers)
    return path


def remove_cgroups(top):
    for below in sorted((os.path.join(d, n) for d, names, _ in os.walk(top) for n in names),
                        key=len, reverse=True):
        os.rmdir(below)
    os.rmdir(top)


def start_in(cgroup, argv):
    """argv started in the cgroup, alone there: the way a delegated scope or
    a container's first process starts."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup] + argv


@in_guest
def test_alone_in_its_cgroup_the_supervisor_moves_into_a_leaf_and_survives_the_oom(paths):
    home = make_cgroup("test-home-%d" % os.getpid())
    try:
        command = ["sh", "-c", "cat /proc/$PPID/cgroup > sup; exec %s -c '%s'" % (
            shlex.quote(PY), ALLOCATE % 256)]
        result = subprocess.run(start_in(home, limits_cmd(paths, "--memory-max", "48M", "--")
                                         + command), universal_newlines=True, timeout=120,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        receipt = receipt_of(result, paths)
        assert result.returncode == 137 and receipt["stop_reason"] == "memory", result.stderr
        assert receipt["cleanup_confirmed"] is True
        relative = home[len(CGROUP_ROOT):]
        supervisor_at = (paths.work / "sup").read_text().strip().split("::")[1]
        assert supervisor_at.startswith(relative + "/treereap-"), supervisor_at
        assert receipt["cgroup"].startswith(relative + "/treereap-")
        assert supervisor_at != receipt["cgroup"]
        with open(home + "/cgroup.subtree_control") as f:
            assert "memory" in f.read().split()
    finally:
        remove_cgroups(home)


@in_guest
def test_a_cgroup_shared_with_another_process_cannot_enable_the_limit(paths):
    home = make_cgroup("test-shared-%d" % os.getpid())
    other = spawn(start_in(home, ["sleep", "300"]))
    try:
        assert wait_until(lambda: open(home + "/cgroup.procs").read().split())
        marker = paths.work / "ran"
        result = subprocess.run(start_in(home, limits_cmd(paths, "--pids-max", "9", "--",
                                                          "touch", str(marker))),
                                universal_newlines=True, timeout=120, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert result.returncode == 125 and "--pids-max" in result.stderr, result.stderr
        assert "holds processes other than this one" in result.stderr
        assert not marker.exists() and not paths.receipt.exists()
        with open(home + "/cgroup.subtree_control") as f:
            assert f.read().split() == []
    finally:
        kill_all([other.pid])
        other.wait()
        remove_cgroups(home)


@in_guest
def test_a_controller_not_delegated_is_refused_in_the_guest_too(paths):
    top = make_cgroup("test-nomemory-%d" % os.getpid(), "+pids")
    try:
        home = make_cgroup(os.path.basename(top) + "/job")
        marker = paths.work / "ran"
        result = subprocess.run(start_in(home, limits_cmd(paths, "--memory-max", "64M", "--",
                                                          "touch", str(marker))),
                                universal_newlines=True, timeout=120, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert result.returncode == 125, result.stderr
        # The cause read from the machine: memory is on no v1 hierarchy here.
        assert "--memory-max (memory): controller not delegated to %s" % home in result.stderr
        assert "Delegate=yes" in result.stderr and "v1" not in result.stderr
        assert not marker.exists()
    finally:
        remove_cgroups(top)
