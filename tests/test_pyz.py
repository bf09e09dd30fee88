"""treereap.pyz, built by scripts/build_pyz.py from supervisor.py alone: the
same bytes from the same source and interpreters; each CPython runs the pyc
compiled for it, any other the source inside; a run through it is a run of
the script. The suite builds it once (per worker), into pytest's tmp_path,
with the interpreters the suite runs (conftest.PYTHONS).
"""
import ast
import glob
import hashlib
import os
import re
import subprocess
import zipfile

import pytest

from conftest import OTHER_PYTHONS, PY, PYTHONS, ROOT, SOURCE, THIS_PYTHON, read_receipt, run

BUILD = os.path.join(ROOT, "scripts", "build_pyz.py")
COMMITTED = os.path.join(ROOT, "treereap.pyz")

# One worker builds it once.
pytestmark = pytest.mark.xdist_group("pyz")


def build(output, *options, python=PY, **kwargs):
    argv = [python, BUILD, "-q", "-o", output] + list(options)
    for path in PYTHONS.values():  # the suite's interpreters, no others
        argv += ["--python", path]
    result = run(argv, timeout=600, **kwargs)
    assert result.returncode == 0, result.stderr
    return output


def source_sha256():
    with open(SOURCE, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def module_name(version):
    return "treereap_" + version.replace(".", "")


def compiled(version):
    """Does the pyz hold a pyc for this version (3.6 to 3.13)?"""
    return (3, 6) <= tuple(int(part) for part in version.split(".")) <= (3, 13)


def runs(version):
    """The module of the pyz that this version imports."""
    return module_name(version) if compiled(version) else "supervisor"


@pytest.fixture(scope="session")
def pyz(tmp_path_factory):
    return build(str(tmp_path_factory.mktemp("pyz") / "treereap.pyz"))


@pytest.fixture(scope="session")
def pyz_for_this_python_only(tmp_path_factory):
    """A pyz with one pyc, for the interpreter that runs pytest."""
    return build(str(tmp_path_factory.mktemp("pyz-only") / "treereap.pyz"), "--only", THIS_PYTHON)


def imported(stderr):
    """The modules of treereap.pyz that `python -v` says it imported: the
    words of `import NAME # ...` (3.6 to 3.9: `# loaded from Zip PATH`;
    3.10+: `import 'NAME' # <zipimporter ...>`)."""
    return set(re.findall(r"^import '?(treereap_\d+|supervisor)'? # ", stderr, re.M))


def test_the_build_is_reproducible(pyz, tmp_path):
    """Built again, elsewhere, by another python3 when there is one (3.8+),
    with another hash seed and time zone: the same bytes."""
    hosts = [p for v, p in PYTHONS.items() if tuple(map(int, v.split("."))) >= (3, 8)]
    again = build(str(tmp_path / "again.pyz"), python=hosts[-1], cwd=str(tmp_path),
                  env=dict(os.environ, PYTHONHASHSEED="12345", TZ="XYZ-9"))
    with open(pyz, "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read()


def test_the_zip_holds_the_source_a_pyc_per_python_and_the_build_record(pyz):
    with zipfile.ZipFile(pyz) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        assert names == sorted(names)
        assert set(names) == ({"__main__.py", "BUILD.txt", "supervisor.py"}
                              | {module_name(v) + ".pyc" for v in PYTHONS if compiled(v)})
        assert {info.compress_type for info in infos} == {zipfile.ZIP_STORED}
        assert len({info.date_time for info in infos}) == 1
        assert {info.external_attr >> 16 for info in infos} == {0o100644}
        with open(SOURCE, "rb") as f:
            assert archive.read("supervisor.py") == f.read()
        record = archive.read("BUILD.txt").decode()
    assert "sha256: %s\n" % source_sha256() in record
    for version in filter(compiled, PYTHONS):
        assert re.search(r"^  %s\.pyc +CPython %s\.\d+," % (module_name(version), version),
                         record, re.M), record


def test_version_names_the_sha256_of_supervisor_py(pyz):
    result = run([PY, pyz, "--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(" (treereap.pyz, built from supervisor.py sha256 %s)\n"
                                  % source_sha256()), result.stdout
    assert run([PY, BUILD, "--check", pyz]).returncode == 0


def test_check_refuses_a_pyz_of_another_source(pyz, tmp_path):
    other = tmp_path / "supervisor.py"
    with open(SOURCE, "rb") as f:
        other.write_bytes(f.read() + b"\n")
    result = run([PY, BUILD, "--check", pyz, "--source", str(other)])
    assert result.returncode == 1 and "BUILD.txt names sha256" in result.stderr


@pytest.mark.parametrize("what", ["missing", "a directory"])
def test_check_of_a_path_it_cannot_read_says_so_in_one_line(tmp_path, what):
    """--check of a missing path (the recipe's first launch) or a directory:
    one line naming the path and how to build it, exit 2; no traceback."""
    path = tmp_path / "treereap.pyz"
    if what == "a directory":
        path.mkdir()
    result = run([PY, BUILD, "--check", str(path)])
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "build_pyz.py -o" in lines[0], lines
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_check_of_a_file_that_is_no_zip_says_so(tmp_path):
    path = tmp_path / "treereap.pyz"
    path.write_bytes(b"#!/usr/bin/env python3\n")
    result = run([PY, BUILD, "--check", str(path)])
    assert result.returncode == 1 and result.stderr == "%s: not a zip application (built by " \
        "another tool, or cut short)\n" % path, result.stderr


@pytest.mark.parametrize("version", list(PYTHONS))
def test_each_python_runs_the_pyc_compiled_for_it(pyz, version):
    result = run([PYTHONS[version], "-v", pyz, "--version"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert imported(result.stderr) == {runs(version)}


@pytest.mark.parametrize("version", list(PYTHONS))
def test_a_run_through_the_pyz_is_a_run_of_the_script(pyz, version, tmp_path):
    receipts, work = {}, tmp_path / "work"
    work.mkdir()
    for name, entry in (("script", SOURCE), ("pyz", pyz)):
        receipt = tmp_path / name / "receipt.json"
        result = run([PYTHONS[version], entry, "--timeout", "60", "--workdir", work,
                      "--receipt", receipt, "--", "sh", "-c", "exit 3"], cwd=str(work))
        assert result.returncode == 3, result.stderr
        receipts[name] = read_receipt(receipt)
    script, through = receipts["script"], receipts["pyz"]
    assert set(through) == set(script)
    for key in ("exit_status", "return_code", "cleanup_confirmed", "stop_reason",
                "supervisor_version", "python_version", "containment", "command"):
        assert through[key] == script[key], key
    assert through["exit_status"] == 3 and through["cleanup_confirmed"] is True


@pytest.mark.skipif(not OTHER_PYTHONS or not compiled(THIS_PYTHON),
                    reason="needs a CPython besides the one running pytest, which is 3.6-3.13")
def test_a_python_with_no_pyc_inside_runs_the_source(pyz_for_this_python_only, other_python,
                                                     tmp_path):
    work, receipt = tmp_path / "work", tmp_path / "out" / "receipt.json"
    work.mkdir()
    result = run([other_python, "-v", pyz_for_this_python_only, "--timeout", "60", "--workdir",
                  work, "--receipt", receipt, "--", "sh", "-c", "exit 3"], cwd=str(work))
    assert result.returncode == 3, result.stderr[-2000:]
    assert imported(result.stderr) == {"supervisor"}
    assert read_receipt(receipt)["cleanup_confirmed"] is True


@pytest.mark.parametrize("version", list(PYTHONS))
def test_a_pyc_of_another_magic_number_falls_back_to_the_source(pyz, version, tmp_path):
    """A pyc the running CPython cannot load (a pre-release's magic number):
    zipimport refuses it, and __main__.py imports the source instead."""
    broken = str(tmp_path / "broken.pyz")
    with zipfile.ZipFile(pyz) as archive, open(broken, "wb") as f:
        f.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(f, "w") as out:
            for info in archive.infolist():
                data = archive.read(info)
                out.writestr(info, b"\0\0" + data[2:] if info.filename.endswith(".pyc") else data)
    result = run([PYTHONS[version], "-v", broken, "--version"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "built from supervisor.py sha256 %s" % source_sha256() in result.stdout
    assert imported(result.stderr) == {"supervisor"}


def old_python(version):
    """A CPython `version` ("2.7", "3.5") that pyenv has, or None."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python")))
    return found[-1] if found else None


def test_main_py_parses_under_the_grammar_of_python_3_5(pyz):
    """No syntax newer than 3.5 in the zip's __main__.py (ast's feature_version:
    an f-string or an annotation is refused), so that 3.5 reaches its check."""
    with zipfile.ZipFile(pyz) as archive:
        main = archive.read("__main__.py").decode()
    ast.parse(main, "__main__.py", feature_version=(3, 5))


@pytest.mark.parametrize("version", ["2.7", "3.5"])
def test_an_old_python_gets_one_line_and_125(pyz, version, tmp_path):
    """The README's promise for Python 2 and 3.5, kept by the pyz as by
    supervisor.py: one line on stderr, nothing run, 125."""
    python = old_python(version)
    if python is None:
        pytest.skip("pyenv has no CPython %s (pyenv versions)" % version)
    release = run([python, "-c", "import sys; print(sys.version.split()[0])"]).stdout.strip()
    for argv in (["--version"], ["--timeout", "5", "--", "touch", str(tmp_path / "ran")]):
        result = run([python, pyz] + argv)
        assert result.returncode == 125, result.stderr
        assert result.stdout == ""
        assert result.stderr == "treereap: needs Python 3.6 or later; this is %s\n" % release
        assert not (tmp_path / "ran").exists()
    assert run([python, SOURCE, "--version"]).stderr == result.stderr  # the script's own line


def test_the_default_output_is_one_git_ignores(tmp_path):
    """Without -o the pyz goes to dist/treereap.pyz in the checkout, which
    git ignores: the build leaves no untracked file (a checkout's copy,
    with its .gitignore, in a repository of its own)."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("supervisor.py", ".gitignore", os.path.join("scripts", "build_pyz.py")):
        with open(os.path.join(ROOT, name), "rb") as f:
            (checkout / name).write_bytes(f.read())
    git = ["git", "-C", str(checkout)]
    assert run(git + ["init", "-q"]).returncode == 0
    result = run([PY, str(checkout / "scripts" / "build_pyz.py"), "-q", "--only",
                  THIS_PYTHON, "--python", PY], cwd=str(checkout))
    assert result.returncode == 0, result.stderr
    assert (checkout / "dist" / "treereap.pyz").is_file()
    status = run(git + ["status", "--porcelain", "--untracked-files=all"]).stdout
    assert status.split() == ["??", ".gitignore", "??", "scripts/build_pyz.py", "??",
                              "supervisor.py"], status


def committed():
    """Is there a treereap.pyz committed at the top (in git's index; outside a
    checkout, any there)?"""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "--error-unmatch", "treereap.pyz"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return os.path.exists(COMMITTED)
    if listed.returncode == 0:
        return True
    inside = subprocess.run(["git", "-C", ROOT, "rev-parse", "--is-inside-work-tree"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return inside.returncode != 0 and os.path.exists(COMMITTED)


@pytest.mark.skipif(not committed(), reason="no treereap.pyz committed at the repository top")
def test_a_committed_pyz_was_built_from_this_supervisor_py():
    with zipfile.ZipFile(COMMITTED) as archive:
        record = archive.read("BUILD.txt").decode()
    assert "sha256: %s\n" % source_sha256() in record, (
        "treereap.pyz was built from another supervisor.py: rebuild it "
        "(python3 scripts/build_pyz.py -o treereap.pyz)\n" + record)
    result = run([PY, BUILD, "--check", COMMITTED])
    assert result.returncode == 0, result.stderr
