"""`pip install .` on every CPython the file runs on (3.6 to 3.13).

Offline: one wheel is built once, by the suite's interpreter with the
setuptools of the test environment (no build isolation, no index), and each
interpreter installs it into a venv of its own with that venv's own pip
(CPython 3.6's is 18.1) and runs the command; where the venv has a
setuptools of its own (ensurepip gives one up to 3.11), the checkout is also
built from source by it, as `pip install .` does on that interpreter
without the index. What the index would give each one (build-system's
requires) is checked without it.

The suite installs on the oldest and the newest CPython found; the others
are skipped unless SUPERVISOR_INSTALL_MATRIX=1 (each costs 3-7 s: a venv
with pip, then the install).
"""
import os
import re
import subprocess
import zipfile

import pytest

from conftest import PY, PYTHONS, ROOT, run

# What a build reads: the metadata is setup.cfg's (pyproject.toml says why).
PACKAGE_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "README.md", "supervisor.py",
                 "treereap.py")
MATRIX = os.environ.get("SUPERVISOR_INSTALL_MATRIX") == "1"
ENDS = {min(PYTHONS, key=lambda v: tuple(map(int, v.split(".")))),
        max(PYTHONS, key=lambda v: tuple(map(int, v.split("."))))}
# The last setuptools for each CPython (59.6.0 for 3.6, which 60 dropped).
LAST_SETUPTOOLS = {"3.6": "59.6.0", "3.7": "68.0.0", "3.8": "75.3.0"}
# One worker builds the wheel once.
pytestmark = pytest.mark.xdist_group("install")


def offline_env():
    """No index, nothing asked: pip as the tests run it."""
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith("PYTHON"))
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def copy_checkout(where):
    """The files a build reads, copied (the build leaves nothing in the
    checkout); treereap.py stays a link to supervisor.py."""
    os.makedirs(where)
    for name in PACKAGE_FILES:
        subprocess.check_call(["cp", "-P", os.path.join(ROOT, name), where])
    assert os.path.islink(os.path.join(where, "treereap.py"))
    return where


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    top = tmp_path_factory.mktemp("wheel")
    source = copy_checkout(str(top / "source"))
    result = run([PY, "-m", "pip", "wheel", "--no-index", "--no-build-isolation", "--no-deps",
                  "-q", "-w", str(top / "dist"), source], cwd=str(top), timeout=300,
                 env=offline_env())
    assert result.returncode == 0, result.stderr
    wheels = os.listdir(str(top / "dist"))
    assert len(wheels) == 1 and re.match(r"treereap-[\d.]+-py3-none-any\.whl$", wheels[0]), wheels
    return str(top / "dist" / wheels[0])


def version():
    with open(os.path.join(ROOT, "supervisor.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def venv_of(version_, where):
    """A venv of that CPython, with its own pip: its python."""
    result = run([PYTHONS[version_], "-m", "venv", where], timeout=300, env=offline_env())
    assert result.returncode == 0, result.stderr
    return os.path.join(where, "bin", "python")


def installed_runs(venv_python, where):
    """The installed command and module, as a user runs them."""
    bindir = os.path.dirname(venv_python)
    result = run([os.path.join(bindir, "treereap"), "--version"], cwd=where)
    assert result.returncode == 0 and result.stdout.startswith("treereap %s" % version()), (
        result.stdout, result.stderr)
    result = run([os.path.join(bindir, "treereap"), "--timeout", "30", "--", "sh", "-c", "exit 7"],
                 cwd=where)
    assert result.returncode == 7, result.stderr
    result = run([venv_python, "-c", "import treereap, sys; sys.stdout.write(treereap.__file__)"],
                 cwd=where)
    assert result.returncode == 0 and "site-packages" in result.stdout, result.stderr


# Can this venv build the checkout offline with what it has? Its setuptools,
# and either pip's setup.py path (pip before 19: CPython 3.6's own) or a
# bdist_wheel (setuptools 70.1 and later, or the wheel package); with the
# index, pip's isolated build environment fetches both.
BUILDS_OFFLINE = """\
import sys
try:
    import setuptools
    import pip
except ImportError:
    sys.exit(1)
if int(pip.__version__.split(".")[0]) < 19:
    sys.exit(0)
try:
    from setuptools.command import bdist_wheel
except ImportError:
    try:
        import wheel
    except ImportError:
        sys.exit(1)
"""


def builds_offline(venv_python):
    return run([venv_python, "-c", BUILDS_OFFLINE]).returncode == 0


def matrix(versions):
    """Each version, the ends of the range in the suite, the rest with
    SUPERVISOR_INSTALL_MATRIX=1."""
    reason = "the suite installs on the oldest and newest CPython found; " \
             "SUPERVISOR_INSTALL_MATRIX=1 installs on every one"
    return [v if MATRIX or v in ENDS else pytest.param(v, marks=pytest.mark.skip(reason=reason))
            for v in versions]


@pytest.mark.parametrize("version_", matrix(PYTHONS))
def test_pip_install_on_each_cpython(version_, wheel, tmp_path):
    """The wheel, by the interpreter's own pip; and where its venv has a
    setuptools that can build it offline (3.6's: setuptools 40.6.2, pip
    18.1), the checkout built from source by it (`pip install .` without
    the index): the same command, the same module."""
    venv = venv_of(version_, str(tmp_path / "venv"))
    result = run([venv, "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=str(tmp_path),
                 timeout=300, env=offline_env())
    assert result.returncode == 0, result.stderr
    installed_runs(venv, str(tmp_path))
    if not builds_offline(venv):
        return  # no setuptools (3.12 and later), or no bdist_wheel without the index
    result = run([venv, "-m", "pip", "uninstall", "-y", "-q", "treereap"], env=offline_env())
    assert result.returncode == 0, result.stderr
    source = copy_checkout(str(tmp_path / "source"))
    result = run([venv, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                  source], cwd=str(tmp_path), timeout=300, env=offline_env())
    assert result.returncode == 0, result.stderr
    installed_runs(venv, str(tmp_path))


def build_requires():
    """pyproject.toml's build-system requires (a list of strings)."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    block = re.search(r"^\[build-system\]\n(.*?)(?=^\[)", text, re.M | re.S).group(1)
    listed = re.search(r"^requires = \[(.*?)\]", block, re.M | re.S).group(1)
    return re.findall(r'"([^"]+)"', listed)


@pytest.mark.parametrize("python_version", ["%d.%d" % (3, minor) for minor in range(6, 14)])
def test_the_index_has_a_build_backend_for_each_cpython(python_version):
    """What `pip install .` fetches into its isolated build environment: for
    each CPython, a setuptools that runs on it (the last one for it, and
    none too new for 3.6, where the index may not say so). It failed on 3.6
    by `setuptools>=61` (3.7 or later) and the [project] table, which
    setuptools reads from 61 on only."""
    pip_vendor = pytest.importorskip("pip._vendor.packaging.requirements")
    requirements = [pip_vendor.Requirement(text) for text in build_requires()]
    environment = {"python_version": python_version, "python_full_version": python_version + ".0"}
    wanted = [r for r in requirements if r.marker is None or r.marker.evaluate(environment)]
    setuptools = [r for r in wanted if r.name == "setuptools"]
    assert len(setuptools) == 1 and {r.name for r in wanted} <= {"setuptools", "wheel"}, wanted
    runs_there = LAST_SETUPTOOLS.get(python_version, "80.9.0")
    assert setuptools[0].specifier.contains(runs_there), (python_version, str(setuptools[0]))
    if python_version == "3.6":  # what the index may offer 3.6's pip 18.1 regardless
        assert not setuptools[0].specifier.contains("60.0.0")  # needs Python 3.7
        wheel = [r for r in wanted if r.name == "wheel"]  # for `pip wheel .` (bdist_wheel)
        assert len(wheel) == 1 and wheel[0].specifier.contains("0.37.1"), wanted
        assert not wheel[0].specifier.contains("0.38.0")  # needs Python 3.7


def test_the_metadata_says_what_the_file_needs(wheel):
    """The wheel's Requires-Python is the file's own floor (supervisor.py
    refuses anything older than 3.6 in one line)."""
    with zipfile.ZipFile(wheel) as archive:
        name = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")][0]
        metadata = archive.read(name).decode()
    assert "\nRequires-Python: >=3.6\n" in metadata
    assert "\nName: treereap\n" in metadata and "\nVersion: %s\n" % version() in metadata
    with open(os.path.join(ROOT, "supervisor.py")) as f:
        assert "if sys.version_info < (3, 6):" in f.read()
