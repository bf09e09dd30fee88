"""The command line: bad input is refused with one line and nothing left
anywhere; durations read as timeout(1) reads them; help and version."""
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from conftest import IS_ROOT, PY, ROOT, read_receipt, run_supervisor, supervisor_cmd

sys.path.insert(0, ROOT)
import supervisor  # noqa: E402  (the pure helpers only: no run in-process)


def listing(top):
    return sorted(os.path.relpath(os.path.join(d, n), str(top))
                  for d, dirs, files in os.walk(str(top)) for n in dirs + files)


@pytest.fixture
def sandbox(tmp_path):
    """A workdir, a receipt path in directories that do not exist yet, and a
    marker the command would create if it ever ran."""
    work = tmp_path / "work"
    work.mkdir()
    return {"work": work, "receipt": tmp_path / "out" / "deep" / "receipt.json",
            "marker": work / "ran", "top": tmp_path}


def refused(sandbox, args, python=PY, must_name=None):
    """Run with bad args: exit 125, one stderr line naming the problem,
    nothing started, no file or directory created."""
    before = listing(sandbox["top"])
    result = run_supervisor(*args, python=python)
    assert result.returncode == 125, (args, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("treereap: "), result.stderr
    if must_name:
        assert must_name in lines[0], lines[0]
    assert result.stdout == ""
    assert not sandbox["marker"].exists()
    assert listing(sandbox["top"]) == before
    return lines[0]


def good(sandbox, **replace):
    args = {"--timeout": "5", "--workdir": sandbox["work"], "--receipt": sandbox["receipt"]}
    args.update(replace)
    flat = []
    for name, value in args.items():
        if value is not None:
            flat += [name, value]
    return flat + ["--", "touch", sandbox["marker"]]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "NaN", "inf", "-inf", "abc", "", " ",
                                   "0s", "5x", "1..2", "m", "--", "-1e-10000", "0e5",
                                   "\u0661", "\u00a05", "5\u2003", "\uff15", "42D"])
def test_bad_timeout_is_refused(sandbox, value):
    refused(sandbox, good(sandbox, **{"--timeout": value}), must_name="--timeout")


@pytest.mark.parametrize("value", ["-0", "-1", "nan", "abc", "0x0"])
def test_bad_cleanup_timeout_is_refused(sandbox, value):
    refused(sandbox, good(sandbox, **{"--cleanup-timeout": value}), must_name="--cleanup-timeout")


def test_missing_timeout_is_refused(sandbox):
    refused(sandbox, good(sandbox, **{"--timeout": None}), must_name="--timeout")


def test_option_without_value_is_refused(sandbox):
    refused(sandbox, ["--timeout"], must_name="--timeout")


@pytest.mark.parametrize("tail", [["--"], []])
def test_no_command_is_refused(sandbox, tail):
    refused(sandbox, ["--timeout", "5", "--workdir", sandbox["work"]] + tail, must_name="command")


def test_unknown_option_is_refused(sandbox):
    refused(sandbox, ["--bogus"] + good(sandbox), must_name="--bogus")


@pytest.mark.parametrize("args, must_name", [
    (["--receipt", "-"], "--receipt"), (["--stop-file", "-"], "--stop-file"),
    (["--workdir", "/tmp", "--workdir", "/"], "--workdir")], ids=["receipt -", "stop-file -", "twice"])
def test_dash_for_a_path_and_an_option_given_twice_are_refused(sandbox, args, must_name):
    refused(sandbox, args + good(sandbox, **{"--workdir": None, "--receipt": None}),
            must_name=must_name)


def test_end_kept_with_a_command_is_refused(sandbox):
    refused(sandbox, ["--end-kept", sandbox["top"] / "r.json", "--", "true"], must_name="--end-kept")


@pytest.mark.parametrize("flag", ["--verbose=1", "--drain-all=yes"])
def test_a_flag_with_a_value_is_refused(sandbox, flag):
    refused(sandbox, [flag] + good(sandbox), must_name=flag.partition("=")[0])


def test_receipt_inside_the_workdir_is_refused(sandbox):
    inside = sandbox["work"] / "sub" / "receipt.json"
    refused(sandbox, good(sandbox, **{"--receipt": inside}), must_name="--receipt")


def test_a_refusal_after_a_bundle_still_removes_the_earlier_receipt(sandbox):
    receipt = sandbox["top"] / "ctl" / "receipt.json"
    receipt.parent.mkdir()
    receipt.write_text("{}")
    result = run_supervisor("-vs", "INT", "--receipt", receipt, "--timeout", "bogus", "--",
                            "true")
    assert result.returncode == 125 and not receipt.exists(), result.stderr


def test_an_unknown_short_option_in_a_bundle_is_named(sandbox):
    refused(sandbox, ["-vx"] + good(sandbox), must_name="unknown option -x")


def test_a_receipt_in_the_current_directory_names_the_default_workdir(sandbox):
    """No --workdir given: the refusal says the workdir is the current
    directory, and how to choose another."""
    result = run_supervisor("--timeout", "5", "--receipt", "r.json", "--", "true",
                            cwd=str(sandbox["work"]))
    assert result.returncode == 125 and not (sandbox["work"] / "r.json").exists()
    assert "without it, the current directory" in result.stderr and "--workdir" in result.stderr


@pytest.mark.parametrize("bundle", [["-vs", "INT"], ["-vsINT"], ["-vk", "3"], ["-vk3"]])
def test_short_options_bundle_as_getopt_takes_them(sandbox, bundle):
    result = run_supervisor(*bundle + good(sandbox))
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(sandbox["receipt"])
    assert receipt["stop_signal"] == ("SIGINT" if "s" in bundle[0] else "SIGTERM")
    assert receipt["cleanup_timeout_s"] == (3.0 if "k" in bundle[0] else 10.0)
    assert "started: pid %d" % receipt["pid"] in result.stderr  # -v took effect


def test_verbose_says_when_it_starts_what_it_drained_and_how_long(sandbox):
    result = run_supervisor("-v", "--timeout", "0.5", "--workdir", sandbox["work"], "--",
                            "sh", "-c", "sleep 30 & exec sleep 30")
    assert result.returncode == 124
    first, *_, last = result.stderr.splitlines()
    assert first.startswith("treereap: started: pid ") and "deadline 0.5s" in first
    assert " in the cgroup " in first or " in the /proc walk" in first
    assert "exit status 124 in " in last and "(cleanup " in last
    assert "2 drained (" in last and " sleep, " in last, last


def test_receipt_inside_the_workdir_through_a_symlink_is_refused(sandbox):
    link = sandbox["top"] / "innocent"
    link.symlink_to(sandbox["work"])
    refused(sandbox, good(sandbox, **{"--receipt": link / "receipt.json"}), must_name="--receipt")


def test_receipt_inside_the_workdir_through_dotdot_is_refused(sandbox):
    sneaky = "%s/../%s/receipt.json" % (sandbox["top"] / "elsewhere", sandbox["work"].name)
    refused(sandbox, good(sandbox, **{"--receipt": sneaky}), must_name="--receipt")


def test_receipt_that_is_the_workdir_is_refused(sandbox):
    refused(sandbox, good(sandbox, **{"--receipt": sandbox["work"]}), must_name="--receipt")


def test_receipt_directory_not_writable_is_refused(sandbox):
    locked = sandbox["top"] / "locked"
    locked.mkdir()
    if IS_ROOT:  # root writes through permissions: use a read-only mount
        subprocess.check_call(["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(locked)])
    else:
        locked.chmod(0o500)
    try:
        line = refused(sandbox, good(sandbox, **{"--receipt": locked / "a" / "receipt.json"}),
                       must_name="--receipt")
        assert str(locked) in line
    finally:
        if IS_ROOT:
            subprocess.check_call(["umount", str(locked)])
        else:
            locked.chmod(0o700)


def test_missing_workdir_is_refused(sandbox):
    refused(sandbox, good(sandbox, **{"--workdir": sandbox["top"] / "missing"}),
            must_name="--workdir")


def test_workdir_that_is_a_file_is_refused(sandbox):
    plain = sandbox["top"] / "plain"
    plain.write_text("")
    refused(sandbox, good(sandbox, **{"--workdir": plain}), must_name="--workdir")


def test_refuses_outside_linux(sandbox):
    code = ("import sys; sys.platform = 'darwin'; import supervisor; "
            "sys.exit(supervisor.main(sys.argv[1:]))")
    result = subprocess.run([PY, "-c", code] + [str(a) for a in good(sandbox)], cwd=ROOT,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
    assert result.returncode == 125
    assert "needs Linux" in result.stderr and not sandbox["marker"].exists()


def test_refuses_a_proc_of_another_pid_namespace(sandbox):
    if not IS_ROOT:
        pytest.skip("needs root for unshare --pid")
    result = subprocess.run(["unshare", "--pid", "--fork", PY, os.path.join(ROOT, "supervisor.py")]
                            + [str(a) for a in good(sandbox)], stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=30)
    assert result.returncode == 125
    assert "PID namespace" in result.stderr and not sandbox["marker"].exists()


# --- Durations ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("1.5", 1.5), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0),
    ("0.25s", 0.25), ("1e3", 1000.0), (".5", 0.5), ("+7", 7.0), (" 7", 7.0),
    # Too large to represent: clamped, as timeout(1) clamps (to the largest time_t).
    ("1e300", 2.0 ** 63), ("1e400", 2.0 ** 63), ("1" + "0" * 4933, 2.0 ** 63),
    ("9223372036854775808d", 2.0 ** 63),
])
def test_durations_read_as_timeout_reads_them(sandbox, text, seconds):
    args = good(sandbox, **{"--timeout": text, "--cleanup-timeout": text})
    result = run_supervisor(*args)
    # Under load, a deadline of 0.25 s may come before `touch` ends: stopped, as it should be.
    assert result.returncode == 0 or (seconds < 1 and result.returncode in (124, 137)), \
        result.stderr
    receipt = read_receipt(sandbox["receipt"])
    assert receipt["timeout_s"] == seconds and receipt["cleanup_timeout_s"] == seconds


@given(st.floats(min_value=1e-6, max_value=1e12), st.sampled_from(["", "s", "m", "h", "d"]))
def test_parse_duration_accepts_every_positive_number(value, unit):
    parsed = supervisor.parse_duration(repr(value) + unit)
    assert math.isclose(parsed, value * supervisor._DURATION_UNITS.get(unit, 1))


@given(st.text())
def test_parse_duration_accepts_only_positive_finite_values(text):
    try:
        value = supervisor.parse_duration(text)
    except supervisor.UsageError as e:
        assert "--timeout" in str(e)
    else:
        assert 0 < value < float("inf")


def test_a_duration_too_small_to_represent_is_the_smallest_one(sandbox):
    """1e-10000 is above zero: as timeout(1), the deadline is at once."""
    args = good(sandbox, **{"--timeout": "1e-10000"})
    args[-2:] = ["sleep", "5"]
    result = run_supervisor(*args)
    assert result.returncode == 124, result.stderr
    assert read_receipt(sandbox["receipt"])["timeout_s"] == 1e-9


def test_exec_timeout_stays_finite_for_the_largest_duration():
    largest = supervisor.parse_duration("1e400")
    assert math.isfinite(supervisor.exec_timeout(largest, largest))


def test_huge_timeout_does_not_overflow_a_wait(sandbox):
    args = good(sandbox, **{"--timeout": "1e300", "--cleanup-timeout": "1e300"})
    args[-2:] = ["sh", "-c", "sleep 0.2; exit 4"]
    result = run_supervisor(*args)
    assert result.returncode == 4, result.stderr


# --- Help, version, receipt encoding -----------------------------------------------------------

def test_help():
    result = run_supervisor("--help")
    assert result.returncode == 0 and "--timeout DURATION" in result.stdout


def test_help_with_stdout_closed_still_exits_0():
    result = subprocess.run(supervisor_cmd("--help"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=60)
    assert result.returncode == 0 and result.stderr == b""


def test_version():
    result = run_supervisor("--version")
    assert result.returncode == 0
    assert result.stdout == "treereap %s\n" % supervisor.__version__




def test_python_2_gets_one_line_and_125():
    """Python 2 (or 3.5) reads the file far enough to say what it needs, in
    one line, before an import it lacks would print a traceback."""
    import glob
    pythons = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/2.*/bin/python"))) + [
        p for p in ("/usr/bin/python2", "/usr/bin/python2.7") if os.path.exists(p)]
    if not pythons:
        pytest.skip("no Python 2 here (pyenv's 2.7, or /usr/bin/python2)")
    result = subprocess.run([pythons[0], supervisor.__file__, "--timeout", "5", "--", "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=60)
    assert result.returncode == 125 and result.stdout == ""
    assert result.stderr.startswith("treereap: needs Python 3.6 or later; this is 2.")
    assert result.stderr.count("\n") == 1, result.stderr


def test_dash_V_is_the_version():
    for flag in ("-V", "--version"):
        result = run_supervisor(flag)
        assert result.returncode == 0 and result.stdout.startswith("treereap %s" % (
            supervisor.__version__)), result.stdout


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@given(JSON_VALUES)
def test_the_receipts_json_is_json_dumps_own_text(value):
    """The receipt's encoder (which spares every run the import of json, re
    and enum) writes what json.dumps(value, indent=2) writes."""
    import json
    assert supervisor._json(value) == json.dumps(value, indent=2)


@pytest.mark.parametrize("option", ["--memory-max", "--max-output", "--pids-max"])
def test_every_example_a_message_gives_is_taken(tmp_path, option):
    """A refused size names examples (issue 38: --memory-max once offered
    4096 and 512K, which it then refused as under 1M): each is taken by the
    option whose message gave it."""
    base = ["--timeout", "5", "--workdir", str(tmp_path), "--receipt",
            str(tmp_path.parent / "r.json"), "--output", str(tmp_path.parent / "out.log")]
    with pytest.raises(supervisor.UsageError) as refusal:
        supervisor._parse_args(base + [option, "x", "--", "true"])
    examples = str(refusal.value).rpartition("(")[2].rstrip(")").split(", ")
    assert examples and all(examples), str(refusal.value)
    for example in examples:
        _, values, command = supervisor._parse_args(base + [option, example, "--", "true"])
        supervisor._checked_plan(command, values)  # raises if the example is refused


@pytest.mark.parametrize("args, words", [
    ([], "--timeout DURATION -- COMMAND (see --help)"),
    (["--", "echo", "hi", "--timeout", "5"], "--timeout after the command is the command's "
     "own argument: put it before"),
    (["10", "true"], "write --timeout 10 -- true"),
    (["--receipt", "echo", "hi"], "if 'echo' was the command, --receipt took it as its value: "
     "put the command after --"),
    (["--receipt", "sleep", "5"], "if 'sleep' was the command, --receipt took it as its value"),
    (["-k", "5", "true"], "--timeout is required (seconds, e.g. --timeout 600 -- COMMAND)"),
    (["10", "sh", "-c", "sleep 1; echo"], "write --timeout 10 -- sh -c 'sleep 1; echo'"),
    (["--timeout", "5"], "no command given: put it after --"),
    (["-v", "--", "true"], "--timeout is required (seconds, e.g. --timeout 600 -- COMMAND)"),
    (["true"], "--timeout is required (seconds, e.g. --timeout 600 -- COMMAND)"),
])
def test_a_misplaced_deadline_says_what_to_write(sandbox, args, words):
    """timeout(1)'s order, a deadline after the command, an option that
    swallowed the command's name, a bare call: one line that says what to
    write (issue 38 items 7 and 11)."""
    line = refused(sandbox, args)
    assert words in line, line
    if args[:1] == ["-k"]:  # -k's value is no command's name: no hint that it was
        assert line.endswith("COMMAND)"), line


@pytest.mark.parametrize("read, open_", [(b"0\n", True), (b"1\n", False), (b"2\n", False),
                                         (b"3\n", False), (b"", True), (b"x\n", True),
                                         (OSError(13, "denied"), True)])
def test_ptrace_scope_is_closed_only_when_yama_says_so(monkeypatch, read, open_):
    """--user's census counts the uid's older processes as outsiders unless
    Yama keeps them from tracing the run (scope 1, 2, 3): anything else (a
    file masked to nothing, unreadable) is the stricter answer, open."""
    def fake(path, dir_fd=None):
        if isinstance(read, Exception):
            raise read
        return read
    monkeypatch.setattr(supervisor, "_read_path", fake)
    assert supervisor._ptrace_is_open() is open_
