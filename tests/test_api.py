"""The API has the CLI's choices (policy, stop signal, receipt path, verbose),
ends what it started when the launch fails after the fork, and the owner's
teardown (--end-kept, end_kept()) ends what a receipt kept, never a pid
whose start time is not the receipt's. Each API call runs in a fresh
interpreter (supervise() takes over the process's signals for the run)."""
import json
import os
import subprocess
import tempfile

from conftest import (
    PY, ROOT, alive, finish, kill_all, needs_cgroup, read_lines, read_receipt, run,
    run_supervisor, start_supervisor, wait_until,
)


def run_python(code, cwd=None):
    """code, with supervisor importable, in a directory of its own."""
    with tempfile.TemporaryDirectory() as here:
        result = run([PY, "-c", code], cwd=cwd or here, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    return result


def test_supervise_takes_the_clis_choices_and_writes_the_receipt(paths):
    paths.receipt.parent.mkdir()
    paths.receipt.write_text(json.dumps({"cleanup_confirmed": True, "stale": True}))
    code = ("import json, supervisor as s\n"
            # The trap first, and a deadline a loaded machine's sh reaches it by.
            "r = s.supervise(['sh', '-c', 'trap \"exit 9\" INT; "
            "setsid -f sleep 300 >/dev/null 2>&1; while :; do sleep 0.05; done'], 2, 2, workdir=%r, "
            "policy='preserve-descendants-on-success', stop_signal='INT', receipt=%r, "
            "verbose=True)\n"
            "print(json.dumps(r))\n" % (str(paths.work), str(paths.receipt)))
    result = run_python(code)
    returned, written = json.loads(result.stdout), read_receipt(paths.receipt)
    assert returned == written and "stale" not in written
    assert written["policy"] == "preserve-descendants-on-success"
    assert written["stop_signal"] == "SIGINT" and written["preserved"] == []  # a stop keeps none
    assert written["return_code"] == 9 and written["exit_status"] == 124
    assert written["drained_count"] >= 2 and written["cleanup_confirmed"] is True
    assert "stopping the run: the deadline passed" in result.stderr  # verbose


def test_supervise_refuses_a_receipt_inside_the_workdir_and_bad_choices(paths):
    code = ("import supervisor as s\n"
            "for kwargs in (dict(receipt=%r), dict(policy='keep-all'), dict(stop_signal='NOPE'),"
            " dict(containment='jail'), dict(stop_files='x'), dict(verbose=1, user='')):\n"
            "    try:\n"
            "        s.supervise(['true'], 5, workdir=%r, **kwargs)\n"
            "    except s.UsageError as e:\n"
            "        print('refused:', e)\n" % (str(paths.work / "r.json"), str(paths.work)))
    lines = run_python(code).stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("refused:") for line in lines), lines
    assert "inside the workdir" in lines[0] and "policy" in lines[1]
    assert "no option 'stop_files'" in lines[4] and "user" in lines[5]


def test_supervise_takes_an_argv_of_bytes_and_the_receipt_shows_it_as_text(paths):
    """An argv of bytes runs as given; the receipt shows it as text (bytes that
    are not UTF-8 replaced)."""
    code = ("import supervisor as s\n"
            "r = s.supervise([b'sh', b'-c', b'exit 3', b'caf\\xe9'], 30, workdir=%r)\n"
            "print(r['return_code'], ascii(r['command']))\n" % str(paths.work))
    out = run_python(code).stdout.split(None, 1)
    assert out[0] == "3" and out[1].strip() == "['sh', '-c', 'exit 3', 'caf\\ufffd']", out


def test_a_launch_that_fails_after_the_fork_ends_what_it_started():
    """The child exists, then the supervisor fails before it holds it (here:
    the exec report cannot be made). supervise() does not raise and leave it
    running: it ends it, and returns a receipt that does not confirm."""
    code = ("import json, time, supervisor as s\n"
            "class Broken(object):\n"
            "    def __init__(self, fd):\n"
            "        raise OSError(5, 'launch handle lost after process creation')\n"
            "s._ExecReport = Broken\n"
            "r = s.supervise(['sleep', '300'], 30, 1)\n"
            "print(json.dumps(r))\n")
    receipt = json.loads(run_python(code).stdout)
    assert receipt["cleanup_confirmed"] is False and receipt["exit_status"] == 125
    assert "launch handle lost" in receipt["error"]
    assert receipt["pid"] is not None and not alive(receipt["pid"])


def test_end_kept_refuses_a_run_kept_without_a_cgroup_and_ends_nothing(paths):
    """Without a cgroup nothing holds all that kept processes started: once
    one exits, its children go to init and no pid leads to them, so no
    teardown could say "all gone". --end-kept says so in one line and ends
    nothing; the owner ends them."""
    script = "(sleep 300 >/dev/null 2>&1 & echo orphan $!; exec sleep 300 >/dev/null 2>&1) & exit 0"
    result = run_supervisor(*paths.options() + ["--containment", "proc",
                                                "--preserve-descendants-on-success",
                                                "--", "sh", "-c", script])
    orphan = int(result.stdout.split()[1])
    kept = [p["pid"] for p in read_receipt(paths.receipt)["preserved"]]
    try:
        assert result.returncode == 0 and len(kept) == 1, result.stderr
        ended = run_supervisor("--end-kept", paths.receipt, "-k", "1")
        assert ended.returncode == 125 and ended.stderr.count("\n") == 1, ended.stderr
        assert "kept 1 process(es) without a cgroup (containment children)" in ended.stderr
        assert alive(orphan) and alive(kept[0])
    finally:
        kill_all([orphan] + kept)


def test_end_kept_never_says_all_gone_of_a_kept_process_outside_its_removed_cgroup():
    """A kept process that left its kept cgroup, which was removed since: not
    taken as gone with the cgroup (NOT all gone, and it is left alone). And
    end_kept() from Python reaps none of the caller's own children (here one
    that exited 3 before: the caller still waits for it)."""
    code = ("import os, subprocess, supervisor as s\n"
            "first = subprocess.Popen(['sh', '-c', 'exit 3'])\n"
            "kept = subprocess.Popen(['sleep', '300'])\n"
            "start = int(open('/proc/%d/stat' % kept.pid).read().rsplit(')', 1)[1].split()[19])\n"
            "r = {'cgroup': '/treereap-1-00000000', 'kept_cgroup': '/treereap-1-00000000.kept-00000000',\n"
            "     'namespaces': dict((k, os.readlink('/proc/self/ns/' + k)) for k in ('pid', 'cgroup')),\n"
            "     'preserved': [{'pid': kept.pid, 'start_time': start, 'name': 'sleep'}]}\n"
            "import time; time.sleep(0.2)\n"
            "done, line = s.end_kept(r, 5)\n"
            "print(done, kept.poll(), first.wait(), line)\n"
            "kept.kill(); kept.wait()\n")
    out = run_python(code).stdout.split(None, 3)
    assert out[0] == "False" and out[1] == "None" and out[2] == "3", out
    assert out[3].startswith("NOT all gone"), out


@needs_cgroup
def test_end_kept_in_the_process_that_ran_supervise_ends_what_it_kept(tmp_path):
    """A controller keeps a run's services (the run's cgroup, kept whole),
    then ends them from the same process: the kept cgroup's maker is that
    process, alive, yet its supervise() has returned (a live maker's kept
    cgroup was left alone: NOT all gone, for as long as the caller lived)."""
    code = ("import json, os, supervisor as s\n"
            "s.supervise(['sh', '-c', 'setsid sleep 300 > /dev/null & echo $! > service'], 30,\n"
            "            policy='preserve-descendants-on-success', receipt='r.json',\n"
            "            containment='cgroup', workdir='work')\n"
            "r = json.load(open('r.json'))\n"
            "print(r['kept_cgroup'] is not None)\n"
            "print(*s.end_kept(r, 5))\n")
    (tmp_path / "work").mkdir()
    service = tmp_path / "work" / "service"
    try:
        out = run_python(code, cwd=str(tmp_path)).stdout.splitlines()
        assert out[0] == "True", out
        assert out[1].startswith("True all kept processes are gone: ended 1"), out
        assert not alive(int(service.read_text()))
    finally:
        kill_all([int(service.read_text())] if service.exists() else [])


def test_supervise_refuses_none_where_a_value_is_needed():
    code = ("import supervisor as s\n"
            "for args, kwargs in (((['true'], 5, None), {}), ((['true'], None), {}),"
            " ((['true'], 5), dict(stop_signal=None)), ((['true'], 5), dict(policy=None)),"
            " ((['true'], 5), dict(containment=None))):\n"
            "    try:\n"
            "        s.supervise(*args, **kwargs)\n"
            "    except s.UsageError as e:\n"
            "        print('refused:', e)\n")
    lines = run_python(code).stdout.splitlines()
    assert len(lines) == 5 and all("give a value" in line for line in lines), lines


def test_supervise_takes_stop_with_parent_as_a_pid():
    """stop_with_parent is the pid of the caller's parent (an int): the run
    goes as ever while that parent lives; a string, or a pid of no process
    that could be a parent, is refused."""
    code = ("import os, supervisor as s\n"
            "r = s.supervise(['true'], 30, 1, stop_with_parent=os.getppid())\n"
            "print(r['stop_reason'], r['return_code'])\n"
            "for bad in (str(os.getppid()), 0, True):\n"
            "    try:\n"
            "        s.supervise(['true'], 30, 1, stop_with_parent=bad)\n"
            "    except s.UsageError as e:\n"
            "        print('refused:', e)\n")
    lines = run_python(code).stdout.splitlines()
    assert lines[0] == "exit 0", lines
    assert len(lines) == 4 and all("give a pid" in line for line in lines[1:]), lines


def test_stop_with_parent_gives_the_caller_its_death_signal_back():
    """stop_with_parent sets the caller's PR_SET_PDEATHSIG for the run (the
    parent's death as SIGTERM); after supervise() returns, the caller has
    its own again (none, or one it set), as it has its handlers back: else a
    later death of its parent would SIGTERM it."""
    code = ("import ctypes, os, signal, supervisor as s\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "def death_signal():\n"
            "    v = ctypes.c_int(0)\n"
            "    libc.prctl(2, ctypes.byref(v), 0, 0, 0)\n"  # PR_GET_PDEATHSIG
            "    return v.value\n"
            "for own in (0, signal.SIGUSR1):\n"
            "    libc.prctl(1, own, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
            "    r = s.supervise(['true'], 30, 1, stop_with_parent=os.getppid())\n"
            "    print(r['cleanup_confirmed'], death_signal() == own)\n")
    lines = run_python(code).stdout.splitlines()
    assert lines == ["True True", "True True"], lines


def test_end_kept_api_and_a_receipt_that_kept_nothing():
    code = ("import os, supervisor as s\n"
            "ns = dict((k, os.readlink('/proc/self/ns/' + k)) for k in ('pid', 'cgroup'))\n"
            "print(s.end_kept({'preserved': [], 'kept_cgroup': None, 'namespaces': ns}))\n")
    assert run_python(code).stdout.strip() == "(True, 'all kept processes are gone: ended 0 " \
        "process(es)')"


def test_end_kept_refuses_what_is_not_a_receipt(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for path in (bad, tmp_path / "missing.json"):
        result = run_supervisor("--end-kept", path)
        assert result.returncode == 125 and result.stderr.count("\n") == 1
        assert "--end-kept" in result.stderr


def test_end_kept_refuses_a_receipt_of_other_namespaces(paths, tmp_path):
    """A receipt's pids and cgroup paths are those of the namespaces it names:
    read elsewhere (the owner on the host, the run in a container), the kept
    cgroup is not found ("removed already") and a pid is someone else's
    ("left alone"): exit 0, "all gone". Refused instead, in one line; and a
    receipt that names no namespaces is refused too."""
    result = run_supervisor(*paths.options() + ["--preserve-descendants-on-success", "--",
                                                "sh", "-c", "setsid -f sleep 300 >/dev/null 2>&1; exit 0"])
    receipt = read_receipt(paths.receipt)
    kept = [p["pid"] for p in receipt["preserved"]]
    try:
        assert result.returncode == 0 and len(kept) == 1, result.stderr
        for namespaces in (dict(receipt["namespaces"], pid="pid:[1]"), None):
            receipt["namespaces"] = namespaces
            other = tmp_path / "other.json"
            other.write_text(json.dumps(receipt))
            ended = run_supervisor("--end-kept", other, "-k", "1")
            assert ended.returncode == 125 and ended.stderr.count("\n") == 1, ended.stderr
            assert "another namespace" in ended.stderr and alive(kept[0])
    finally:
        kill_all(kept)


def test_supervise_takes_os_pathlike_for_every_path_and_in_argv(paths, tmp_path):
    """NeMo Gym's _supervise() passes stop_path as a pathlib.Path: every path
    the API takes, and any argument of the command, may be an os.PathLike."""
    script = tmp_path / "script.sh"
    script.write_text("echo ran > marker; echo out\n")
    code = ("import pathlib, supervisor as s\n"
            "P = pathlib.Path\n"
            "r = s.supervise(['sh', P(%r)], 30, workdir=P(%r), receipt=P(%r), stop_path=P(%r), "
            "output=P(%r), summary=P(%r))\n"
            "print(r['return_code'], r['command'][1], r['workdir'])\n" % (
                str(script), str(paths.work), str(paths.receipt), str(tmp_path / "stop"),
                str(tmp_path / "out.log"), str(tmp_path / "summary")))
    out = run_python(code).stdout.split()
    assert out == ["0", str(script), str(paths.work)]
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True
    assert (paths.work / "marker").exists() and (tmp_path / "out.log").read_text() == "out\n"
    assert (tmp_path / "summary").exists()


def test_every_long_option_is_a_keyword_and_a_wrong_one_names_the_nearest(paths):
    """kill_after= and cleanup_timeout, signal= and stop_signal,
    preserve_descendants_on_success=True (NeMo Gym's keyword) and policy;
    a keyword given twice under two names is refused; an unknown one names
    the nearest."""
    code = ("import supervisor as s\n"
            "r = s.supervise(['sh', '-c', 'setsid -f sleep 300 >/dev/null 2>&1'], 30, kill_after=4,"
            " signal='INT', preserve_descendants_on_success=True, workdir=%r)\n"
            "print(r['cleanup_timeout_s'], r['policy'], r['stop_signal'], "
            "' '.join(str(p['pid']) for p in r['preserved']))\n"
            "for kwargs in (dict(preserve_descendents_on_success=True), dict(kill_after=3, "
            "cleanup_timeout=4), dict(policy='drain-all', preserve_descendants_on_success=True), "
            "dict(stop_sigal='INT')):\n"
            "    try:\n"
            "        s.supervise(['true'], 5, workdir=%r, **kwargs)\n"
            "    except s.UsageError as e:\n"
            "        print('refused:', e)\n" % (str(paths.work), str(paths.work)))
    lines = run_python(code).stdout.splitlines()
    timeout, policy, stop_signal, *kept = lines[0].split()
    kill_all([int(pid) for pid in kept])
    assert (timeout, policy, len(kept)) == ("4.0", "preserve-descendants-on-success", 1), lines
    assert lines[1:] == [
        "refused: supervise() has no option 'preserve_descendents_on_success'; did you mean "
        "preserve_descendants_on_success?",
        "refused: supervise(): cleanup_timeout given twice (as kill_after)",
        "refused: supervise(): policy given twice (as preserve_descendants_on_success)",
        "refused: supervise() has no option 'stop_sigal'; did you mean stop_signal?"], lines


def test_cleanup_receipt_is_a_typeddict_made_when_asked_for(paths):
    """Importing supervisor imports no typing (it costs milliseconds at each
    start); asked for, CleanupReceipt is a TypedDict (3.8 on) whose keys are
    the receipt's."""
    code = ("import sys, json, supervisor as s\n"
            "print('typing' in sys.modules)\n"
            "R = s.CleanupReceipt\n"
            "import typing\n"
            "print(getattr(typing, 'is_typeddict', lambda t: None)(R))\n"
            "r = s.supervise(['true'], 30, workdir=%r)\n"
            "print(json.dumps([sorted(R.__annotations__), sorted(r)]))\n" % str(paths.work))
    lines = run_python(code).stdout.splitlines()
    assert lines[0] == "False" and lines[1] in ("True", "None")
    declared, written = json.loads(lines[2])
    assert declared == written
