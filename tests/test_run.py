"""A run end to end, through the CLI: exit statuses, stop reasons, what is
drained, what is kept, and the receipt that says so."""
import json
import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import (
    DEFAULT_CONTAINMENT, IS_ROOT, PY, ROOT, alive, descendants, finish, heavy, inotify_watches,
    plain_signals,
    proc_stat, read_lines, read_lines_until, read_receipt, run, run_supervisor, start_supervisor,
    start_tree, stop_noticed_after, wait_until,
)


RECEIPT_TYPES = {
    "schema_version": int, "supervisor_version": str, "python_version": str,
    "command": list, "workdir": str, "pid": (int, type(None)), "supervisor_pid": int,
    "namespaces": dict,
    "started_at": str, "ended_at": str, "duration_s": float, "timeout_s": float,
    "cleanup_timeout_s": float, "policy": str, "stop_signal": (str, type(None)),
    "stop_reason": str, "signal": (str, type(None)), "oom_killed_by": (str, type(None)),
    "timed_out": bool, "return_code": (int, type(None)), "exit_status": int,
    "cleanup_confirmed": bool, "cleanup_s": float, "ladder": list, "containment": str,
    "cgroup": (str, type(None)), "kept_cgroup": (str, type(None)),
    "cgroup_unavailable": (str, type(None)),
    "user": (dict, type(None)), "preserved": list, "survivors": list,
    "survivors_count": (int, type(None)),
    "unattributed": list, "drained": list, "drained_count": int,
    "usage": dict, "limits": (dict, type(None)), "output": (dict, type(None)),
    "error": (str, type(None)),
}


# --- Exit statuses and stop reasons --------------------------------------------------------

@pytest.mark.parametrize("script, status, return_code", [
    ("exit 0", 0, 0),
    ("exit 3", 3, 3),
    ("kill -9 $$", 137, -9),
    ("kill -TERM $$", 143, -15),
])
def test_command_status_passes_through(paths, script, status, return_code):
    result = run_supervisor(*paths.options() + ["--", "sh", "-c", script])
    assert result.returncode == status, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "exit"
    assert receipt["return_code"] == return_code
    assert receipt["exit_status"] == status
    assert receipt["timed_out"] is False and receipt["signal"] is None
    assert receipt["cleanup_confirmed"] is True


def test_deadline_stops_the_run(paths):
    result = run_supervisor(*paths.options(timeout=0.5) + ["--", "sleep", "30"])
    assert result.returncode == 124, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "timeout" and receipt["timed_out"] is True
    assert receipt["return_code"] == -signal.SIGTERM
    assert receipt["cleanup_confirmed"] is True
    assert 0.5 <= receipt["duration_s"] < 10


def test_stop_file_stops_the_run(paths):
    proc = start_supervisor(*paths.options(stop=True) + [
        "--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "stop_file"
    assert receipt["timed_out"] is False
    assert receipt["return_code"] == -signal.SIGTERM
    assert receipt["cleanup_confirmed"] is True


def test_stop_file_may_be_a_dangling_symlink(paths):
    proc = start_supervisor(*paths.options(stop=True) + [
        "--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    os.symlink(str(paths.work / "nowhere"), str(paths.stop))
    status, _, err = finish(proc)
    assert status == 124, err
    assert read_receipt(paths.receipt)["stop_reason"] == "stop_file"


def test_stop_file_in_a_directory_created_later(tmp_path, paths):
    paths.stop = tmp_path / "later" / "deeper" / "stop"
    proc = start_supervisor(*paths.options(stop=True) + [
        "--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    paths.stop.parent.mkdir(parents=True)
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    assert read_receipt(paths.receipt)["stop_reason"] == "stop_file"


def test_stop_file_in_a_directory_replaced_during_the_run(tmp_path, paths):
    """The watch follows the directory's inode: a directory renamed away and
    replaced must be watched anew, not left to the slow safety check (2 s)."""
    control = tmp_path / "control"
    control.mkdir()
    paths.stop = control / "stop"
    proc = start_supervisor(*paths.options(stop=True) + [
        "--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    spare = tmp_path / "spare"
    spare.mkdir()
    os.rename(str(control), str(tmp_path / "old-control"))
    os.rename(str(spare), str(control))
    new_inode = os.stat(str(control)).st_ino
    # Watched anew, by the supervisor's lookout (the child that looks at the stop file).
    assert wait_until(lambda: any(new_inode in inotify_watches(p) for p in descendants(proc.pid)))
    created = time.time()
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    assert stop_noticed_after(read_receipt(paths.receipt), created) < 1.5  # not the 2 s check


def test_stop_file_present_at_start_means_never_started(paths):
    paths.stop.write_text("")
    marker = paths.work / "ran"
    result = run_supervisor(*paths.options(stop=True) + ["--", "touch", marker])
    assert result.returncode == 124, result.stderr
    assert not marker.exists()
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "stop_file"
    assert receipt["return_code"] is None and receipt["pid"] is None
    assert receipt["cleanup_confirmed"] is True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_stop_signal_to_the_supervisor(paths, sig):
    proc = start_supervisor(*paths.options() + [
        "--", "sh", "-c", "echo started; exec sleep 30"])
    read_lines_until(proc.stdout, "started")
    proc.send_signal(sig)
    status, _, err = finish(proc)
    assert status == 128 + sig, err
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] == "signal"
    assert receipt["signal"] == signal.Signals(sig).name
    assert receipt["timed_out"] is False
    assert receipt["cleanup_confirmed"] is True


def test_command_not_found_is_127(paths):
    """Ten times: the exec report and the child's exit race, and whichever
    is seen first, the command never ran (no pid, no return code)."""
    for _ in range(10):
        result = run_supervisor(*paths.options() + ["--", "no-such-command-here"])
        assert result.returncode == 127
        assert "no-such-command-here" in result.stderr and len(result.stderr.splitlines()) == 1
        receipt = read_receipt(paths.receipt)
        assert receipt["return_code"] is None and receipt["pid"] is None, receipt
        assert "No such file" in receipt["error"]
        assert receipt["exit_status"] == 127 and receipt["cleanup_confirmed"] is True


def test_command_not_executable_is_126(paths):
    script = paths.work / "not-executable"
    script.write_text("#!/bin/sh\nexit 0\n")
    result = run_supervisor(*paths.options() + ["--", script])
    assert result.returncode == 126
    assert "Permission denied" in read_receipt(paths.receipt)["error"]


def test_workdir_is_the_commands_directory(paths):
    result = run_supervisor(*paths.options() + ["--", "pwd"])
    assert result.returncode == 0
    assert result.stdout.strip() == str(paths.work)


def test_stdio_and_environment_pass_through(paths):
    env = dict(os.environ, SUPERVISED_MARK="x y\tz")
    result = run_supervisor(*paths.options() + [
        "--", "sh", "-c", 'read line; echo "$line/$SUPERVISED_MARK"; echo err >&2'],
        input="hello\n", env=env)
    assert result.returncode == 0
    assert result.stdout == "hello/x y\tz\n"
    assert result.stderr == "err\n"


# --- Natural exit: drain the group, keep the rest ---------------------------------------------

def test_natural_exit_drains_a_background_member(paths):
    result = run_supervisor(*paths.options() + [
        "--", "sh", "-c", "sleep 300 & echo $!; exit 0"])
    assert result.returncode == 0, result.stderr
    background = int(result.stdout.split()[0])
    assert not alive(background)
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True and receipt["preserved"] == []
    assert [step["step"] for step in receipt["ladder"]] == ["terminating", "draining"]


def test_natural_exit_kills_a_member_that_ignores_sigterm(paths):
    spec = {"name": "cmd", "exit_early": True, "exit_code": 5,
            "children": [{"name": "stubborn", "ignore_term": True}]}
    proc, nodes = start_tree(spec, *paths.options(cleanup=0.5))
    status, _, err = finish(proc)
    assert status == 5, err
    assert not alive(nodes["stubborn"])
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True
    terminating = receipt["ladder"][0]
    assert terminating["step"] == "terminating" and terminating["duration_s"] >= 0.5


def test_natural_exit_drains_everything_by_default(paths):
    spec = {"name": "cmd", "exit_early": True, "children": [
        {"name": "service", "detach": True, "session": True,
         "children": [{"name": "worker"}]},
        {"name": "member"}]}
    proc, nodes = start_tree(spec, *paths.options())
    status, _, err = finish(proc)
    assert status == 0, err
    assert not any(alive(pid) for pid in nodes.values())
    receipt = read_receipt(paths.receipt)
    assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is True
    assert receipt["policy"] == "drain-all"


def test_natural_exit_drains_a_stopped_member(paths):
    spec = {"name": "cmd", "exit_early": True,
            "children": [{"name": "frozen", "stop_self": True}]}
    proc, nodes = start_tree(spec, *paths.options())
    status, _, err = finish(proc)
    assert status == 0, err
    assert not alive(nodes["frozen"])
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True


# --- Forced stop: drain everything ------------------------------------------------------------

def stop_tree(spec, paths, cleanup=2, extra=(), **kwargs):
    """Start a tree, let it settle, stop it through the stop file."""
    proc, nodes = start_tree(spec, *paths.options(cleanup=cleanup, stop=True) + list(extra),
                             **kwargs)
    early = [pid for name, pid in nodes.items() if name.startswith("early")]
    assert wait_until(lambda: not any(alive(p) for p in early))
    paths.stop.write_text("")
    status, out, err = finish(proc)
    return status, nodes, err


def test_forced_stop_drains_a_detached_service_whatever_the_policy(paths):
    spec = {"name": "cmd", "children": [
        {"name": "service", "detach": True, "session": True, "children": [{"name": "worker"}]},
        {"name": "member"}]}
    status, nodes, err = stop_tree(spec, paths, extra=["--preserve-descendants-on-success"])
    assert status == 124, err
    assert not any(alive(pid) for pid in nodes.values())
    receipt = read_receipt(paths.receipt)
    assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is True
    assert sorted(p["pid"] for p in receipt["drained"]) == sorted(nodes.values())


def test_forced_stop_drains_a_tool_in_another_session(paths):
    spec = {"name": "cmd", "children": [
        {"name": "tool", "session": True, "children": [{"name": "helper", "group": True}]}]}
    status, nodes, err = stop_tree(spec, paths)
    assert status == 124, err
    assert not any(alive(pid) for pid in nodes.values())
    receipt = read_receipt(paths.receipt)
    assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is True


def test_forced_stop_kills_a_tree_that_ignores_sigterm_within_budget(paths):
    spec = {"name": "cmd", "ignore_term": True, "children": [
        {"name": "a", "ignore_term": True, "children": [{"name": "b", "ignore_term": True}]},
        {"name": "c", "ignore_term": True, "session": True,
         "children": [{"name": "d", "ignore_term": True}]}]}
    status, nodes, err = stop_tree(spec, paths, cleanup=0.5)
    assert status == 137, err  # as timeout(1): the stop had to SIGKILL the command
    assert not any(alive(pid) for pid in nodes.values())
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True
    assert receipt["return_code"] == -signal.SIGKILL
    steps = dict((s["step"], s["duration_s"]) for s in receipt["ladder"])
    assert 0.5 <= steps["terminating"] < 0.5 + 2  # the grace, then no more
    assert receipt["cleanup_s"] <= 3 * 0.5 + 2    # within the budget


def test_forced_stop_drains_stopped_members(paths):
    spec = {"name": "cmd", "children": [
        {"name": "frozen", "stop_self": True},
        {"name": "elsewhere", "session": True, "stop_self": True}]}
    status, nodes, err = stop_tree(spec, paths)
    assert status == 124, err
    assert not any(alive(pid) for pid in nodes.values())
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True


@heavy
def test_forced_stop_drains_a_fork_storm(paths):
    """A few hundred processes, still forking when the stop comes, some in
    sessions of their own, some ignoring SIGTERM. Whether the walk catches
    them all in its budget is a race for the CPU; confirmed must mean that
    none of them is alive, and not confirmed must say 125."""
    proc = start_supervisor(*paths.options(cleanup=1, stop=True) + [
        "--", PY, os.path.join(os.path.dirname(__file__), "helpers", "storm.py"), "300"])
    first = read_lines(proc.stdout, 20)  # the storm is under way: stop it mid-flight
    paths.stop.write_text("")
    status, out, err = finish(proc)
    started = [tuple(map(int, line.split()[1:])) for line in first + out.splitlines() if line]
    assert len(started) >= 20
    receipt = read_receipt(paths.receipt)
    assert receipt["preserved"] == [] and status == receipt["exit_status"]
    if receipt["cleanup_confirmed"]:
        assert status == 124, err
        assert not [pid for pid, start in started if alive(pid, start)]
    else:
        assert status == 125 and "not confirmed" in err, err


LEAVER = r"""
import os, signal
read_end, write_end = os.pipe()
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    os.write(write_end, b"x")
    signal.pause()
os.read(read_end, 1)  # the child leads its own group now
os.setpgid(0, child)  # the command moves itself into its child's group
print("moved", flush=True)
signal.pause()
"""


def test_a_command_that_leaves_its_group_is_still_stopped_and_never_kept(paths):
    proc = start_supervisor(*paths.options(cleanup=0.5, stop=True) + ["--", PY, "-c", LEAVER])
    read_lines_until(proc.stdout, "moved")
    tree = [proc_stat(p) and p for p in descendants(proc.pid)]
    paths.stop.write_text("")
    status, _, err = finish(proc)
    assert status == 124, err
    receipt = read_receipt(paths.receipt)
    assert receipt["preserved"] == [] and receipt["cleanup_confirmed"] is True
    assert receipt["return_code"] == -signal.SIGTERM
    assert not any(alive(pid) for pid in tree if pid)


@pytest.mark.parametrize("count, hard", [(200, 128), (60, 64)], ids=["200", "60-of-64"])
def test_many_members_with_a_low_fd_limit_are_still_drained(paths, containment, count, hard):
    """The drain pins each member with a pidfd: with a soft limit of 64 it must
    make room, or fall back to polling /proc, not fail. (60 processes under a
    hard limit of 64 failed with EMFILE: the budget was counted past 64 only.)"""
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))

    script = "for i in $(seq %d); do sleep 300 & done; exit 0" % count
    result = run_supervisor(*paths.options(cleanup=5) + containment[1] + [
        "--", "sh", "-c", script], preexec_fn=plain_signals(then=low_limit))
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True and receipt["error"] is None


def test_undecodable_arguments_are_replaced_in_the_receipt(paths):
    arg = os.fsdecode(b"caf\xe9")
    result = run_supervisor(*paths.options() + ["--", "true", arg])
    assert result.returncode == 0, result.stderr
    text = paths.receipt.read_text()
    assert "\\udce9" not in text
    assert read_receipt(paths.receipt)["command"] == ["true", "caf\ufffd"]


def test_adopted_orphans_leave_no_zombies_during_a_run(paths):
    script = ("for i in 1 2 3 4 5 6 7 8 9 10; do (sleep 0.05 & echo orphan $!); done; "
              "echo spawned; exec sleep 30")
    proc = start_supervisor(*paths.options() + ["--", "sh", "-c", script])
    orphans = [int(line.split()[1]) for line in read_lines_until(proc.stdout, "spawned")
               if line.startswith("orphan")]
    assert len(orphans) == 10
    # Each orphan is adopted, exits, and must then be reaped: gone from /proc.
    assert wait_until(lambda: all(proc_stat(pid) is None for pid in orphans), timeout=10), \
        [proc_stat(pid) for pid in orphans]
    proc.send_signal(signal.SIGTERM)
    status, _, err = finish(proc)
    assert status == 143, err


# --- The receipt -------------------------------------------------------------------------------

def test_receipt_has_every_key_with_its_type(paths):
    result = run_supervisor(*paths.options() + ["--", "true"])
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert set(receipt) == set(RECEIPT_TYPES)
    for key, types in RECEIPT_TYPES.items():
        assert isinstance(receipt[key], types), (key, receipt[key])
    assert receipt["command"] == ["true"]
    assert receipt["workdir"] == str(paths.work)
    assert receipt["schema_version"] == 6 and receipt["containment"] == DEFAULT_CONTAINMENT
    assert receipt["started_at"].endswith("Z") and receipt["ended_at"] >= receipt["started_at"]


def test_receipt_lists_survivors_when_cleanup_fails(tmp_path, paths):
    """A process frozen by a cgroup v1 freezer ignores even SIGKILL until thawed:
    cleanup cannot be confirmed, the exit status says 125, survivors are listed."""
    freezer = "/sys/fs/cgroup/freezer"
    if not IS_ROOT or not os.path.isdir(freezer):
        pytest.skip("needs root and a cgroup v1 freezer to make an unkillable process")
    cgroup = os.path.join(freezer, "supervisor-test-%d" % os.getpid())
    os.mkdir(cgroup)
    spec = {"name": "cmd", "children": [{"name": "stuck"}]}
    try:
        proc, nodes = start_tree(spec, *paths.options(cleanup=0.3, stop=True))
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(nodes["stuck"]))
        with open(os.path.join(cgroup, "freezer.state"), "w") as f:
            f.write("FROZEN")
        paths.stop.write_text("")
        status, _, err = finish(proc)
        assert status == 125
        assert "cleanup not confirmed" in err and str(nodes["stuck"]) in err
        receipt = read_receipt(paths.receipt)
        assert receipt["cleanup_confirmed"] is False and receipt["exit_status"] == 125
        assert receipt["stop_reason"] == "stop_file"
        survivor = receipt["survivors"][0]
        assert survivor["pid"] == nodes["stuck"] and survivor["state"] == "D"
        assert set(survivor) == {"pid", "ppid", "pgid", "sid", "state", "name"}
    finally:
        with open(os.path.join(cgroup, "freezer.state"), "w") as f:
            f.write("THAWED")
        wait_until(lambda: not open(os.path.join(cgroup, "cgroup.procs")).read().strip())
        os.rmdir(cgroup)


def test_a_reader_sees_no_receipt_or_a_whole_one(paths):
    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            try:
                text = paths.receipt.read_text()
            except FileNotFoundError:
                seen.append(None)
                continue
            seen.append(json.loads(text))  # raises on a partial receipt

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(5):
            assert run_supervisor(*paths.options() + ["--", "true"]).returncode == 0
    finally:
        stop.set()
        reader.join()
    receipts = [r for r in seen if r is not None]
    assert receipts and all(set(r) == set(RECEIPT_TYPES) for r in receipts)
    assert [p.name for p in paths.receipt.parent.iterdir()] == ["receipt.json"]


@pytest.mark.parametrize("size", ["4m", "64k"])
def test_a_command_that_fills_the_disk_cannot_cost_the_receipt(tmp_path, paths, size):
    """The workdir and the receipt on one small filesystem (a sandbox's /tmp),
    and the command fills it: the receipt's write failed (125, no receipt),
    though the run was drained and confirmed. Its room (bounded: the lists'
    caps, the plan's texts, the summary) is taken before the command starts,
    and given back for the receipt. A filesystem without that room refuses
    the run at once, naming --receipt; nothing starts, nothing is left."""
    if not IS_ROOT:
        pytest.skip("needs root to mount a small tmpfs")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.check_call(["mount", "-i", "-t", "tmpfs", "-o", "size=" + size, "tmpfs",
                           str(mount)])
    try:
        paths.receipt, paths.work = mount / "receipt.json", mount / "work"
        paths.work.mkdir()
        fill = "head -c 16777216 /dev/zero > filler 2>/dev/null; exit 0"
        result = run_supervisor(*paths.options() + ["--", "sh", "-c", fill])
        if size == "64k":
            assert result.returncode == 125 and result.stderr.count("\n") == 1, result.stderr
            assert "--receipt" in result.stderr and "No space left" in result.stderr
            assert sorted(p.name for p in mount.iterdir()) == ["work"]
            assert list(paths.work.iterdir()) == []
        else:
            assert result.returncode == 0, result.stderr
            assert read_receipt(paths.receipt)["cleanup_confirmed"] is True
            assert (paths.work / "filler").stat().st_size > 3 << 20  # all it could have
            assert sorted(p.name for p in mount.iterdir()) == ["receipt.json", "work"]
    finally:
        subprocess.check_call(["umount", "-i", str(mount)])


# --- The API ---------------------------------------------------------------------------------

def run_python(code, python=PY):
    """Run code with supervisor importable, in a directory of its own."""
    with tempfile.TemporaryDirectory() as here:
        result = run([python, "-c", code], cwd=here, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_api_exec_timeout_and_constants():
    out = run_python("import supervisor as s; print(s.exec_timeout(60), s.exec_timeout(60, 5), "
                     "s.CLEANUP_PHASE_COUNT, s.DEFAULT_CLEANUP_TIMEOUT)")
    assert out.split() == ["120.0", "105.0", "3", "10.0"]


def test_api_supervise_returns_the_receipt(tmp_path):
    code = ("import json, supervisor as s\n"
            "r = s.supervise(['sh', '-c', 'exit 7'], 30, 2, workdir=%r)\n"
            "r2 = s.supervise(['sleep', '30'], 0.3, 1)\n"
            "print(json.dumps([r, r2]))\n" % str(tmp_path))
    first, second = json.loads(run_python(code))
    assert first["exit_status"] == 7 and first["return_code"] == 7
    assert first["workdir"] == str(tmp_path)
    assert second["stop_reason"] == "timeout" and second["exit_status"] == 124


def test_api_refuses_a_bad_argv_before_starting():
    code = ("import supervisor as s\n"
            "for argv in (['true', 'a\\0b'], ['true', 5], 'true', []):\n"
            "    try:\n"
            "        s.supervise(argv, 5)\n"
            "    except s.UsageError as e:\n"
            "        print('refused')\n")
    assert run_python(code).split() == ["refused"] * 4


def test_api_import_has_no_side_effects():
    code = ("import ctypes, signal, sys\n"
            "libc = ctypes.CDLL(None)\n"
            "before = [signal.getsignal(s) for s in range(1, 32) if s not in (9, 19)]\n"
            "loaded = set(sys.modules)\n"
            "import supervisor\n"
            "after = [signal.getsignal(s) for s in range(1, 32) if s not in (9, 19)]\n"
            "v = ctypes.c_int(-1); libc.prctl(37, ctypes.byref(v), 0, 0, 0)\n"
            "new = set(sys.modules) - loaded\n"
            "print(before == after, v.value, 'json' in new, 'typing' in new)\n")
    assert run_python(code).split() == ["True", "0", "False", "False"]


def test_api_cleanup_receipt_type():
    """A dict to make and read (a TypedDict where typing has one, 3.8+)."""
    code = "import supervisor; print(issubclass(supervisor.CleanupReceipt, dict))"
    assert run_python(code).strip() == "True"


def test_api_leaves_the_callers_children_for_the_caller_to_wait_for():
    """supervise() reaps what its run leaves, never the caller's own children:
    one already exited before the run, one exiting during it. Their exit
    statuses are the caller's (Popen.wait() reads 0 for a child reaped behind
    its back)."""
    # early is a zombie before the run; late exits during it (the command waits
    # until late is a zombie, unreaped: only the caller may reap it).
    code = ("import os, subprocess, supervisor as s\n"
            "early = subprocess.Popen(['sh', '-c', 'exit 7'])\n"
            "os.waitid(os.P_PID, early.pid, os.WEXITED | os.WNOWAIT)\n"
            "late = subprocess.Popen(['sh', '-c', 'while [ ! -e started ]; do sleep 0.01; done;"
            " exit 9'])\n"
            "wait = ('touch started; while [ \"$(cut -d\\\" \\\" -f3 /proc/%d/stat)\" != Z ];"
            " do sleep 0.01; done' % late.pid)\n"
            "r = s.supervise(['sh', '-c', 'sleep 30 & ' + wait], 30, 2)\n"
            "print(early.wait(), late.wait(), r['cleanup_confirmed'], r['preserved'])\n")
    assert run_python(code).split() == ["7", "9", "True", "[]"]
