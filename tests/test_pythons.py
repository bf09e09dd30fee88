"""Every other CPython 3.6 to 3.13: the smoke subset.

The whole suite runs under the interpreter that runs pytest. Under each other
one, these tests go through the code that differs between versions: the file
compiles; `_signal` and, before 3.8, the valid_signals() fallback (a real-time
signal stops the run); set_wakeup_fd with and without warn_on_full_buffer (a
burst of SIGCHLD); pidfds through os.pidfd_open or, before 3.9, the raw
syscall (a process two levels down in another session, proven and killed);
and the receipt writer.
"""
import json
import signal
import subprocess

from conftest import (
    ROOT, SUPERVISOR, alive, finish, read_receipt, run_supervisor, start_tree,
)


def test_the_file_compiles(other_python):
    code = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')"
    subprocess.check_call([other_python, "-c", code, SUPERVISOR], timeout=60)


def test_a_forced_stop_by_a_real_time_signal(other_python, paths):
    spec = {"name": "cmd", "children": [
        {"name": "service", "detach": True, "session": True},
        {"name": "tool", "session": True, "children": [
            {"name": "helper", "group": True, "ignore_term": True}]}]}
    proc, nodes = start_tree(spec, *paths.options(cleanup=0.5), python=other_python,
                             tree_python=other_python)
    number = signal.SIGRTMIN + 5
    proc.send_signal(number)
    status, _, err = finish(proc)
    assert status == 128 + number, err
    receipt = read_receipt(paths.receipt)
    assert receipt["signal"] == "SIGRTMIN+5" and receipt["cleanup_confirmed"] is True
    assert receipt["preserved"] == [] and not any(alive(pid) for pid in nodes.values())


def test_exit_statuses_and_a_burst_of_orphans(other_python, paths):
    burst = "for i in $(seq 40); do (true &); done; exit 3"
    result = run_supervisor(*paths.options() + ["--", "sh", "-c", burst], python=other_python)
    assert result.returncode == 3, result.stderr
    assert read_receipt(paths.receipt)["cleanup_confirmed"] is True
    result = run_supervisor(*paths.options() + ["--", "no-such-command-here"], python=other_python)
    assert result.returncode == 127
    text = paths.receipt.read_text()
    assert json.loads(text)["error"].startswith("cannot run") and text.endswith("}\n")


def test_the_api(other_python, tmp_path):
    code = (
        "import json, signal, sys\n"
        "before = [signal.getsignal(s) for s in (1, 2, 15, 17)]\n"
        "import supervisor as s\n"
        "t = s.CleanupReceipt\n"
        "r = s.supervise(['sh', '-c', 'exit 7'], 30, 2, workdir=%r)\n"
        "after = [signal.getsignal(s) for s in (1, 2, 15, 17)]\n"
        "print(json.dumps([issubclass(t, dict) and t(a=1) == {'a': 1}, before == after, r['exit_status'],"
        " s.exec_timeout(60, 5)]))\n" % str(tmp_path))
    out = subprocess.run([other_python, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [True, True, 7, 105.0]
