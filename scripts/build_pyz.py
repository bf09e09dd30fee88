#!/usr/bin/env python3
"""build_pyz.py: build treereap.pyz, supervisor.py as bytecode, in one zip.

    python3 scripts/build_pyz.py [-o PATH] [--python PATH]... [--only 3.X,...]
                                 [--require 3.X,...]
    python3 scripts/build_pyz.py --check PYZ

Run with python3 3.8 or later; standard library only. Without -o it writes
dist/treereap.pyz at the repository top (dist/ is git's to ignore: the
build leaves no untracked file in a checkout). The zip (entries stored, not
compressed, after a `#!/usr/bin/env python3` line) holds:

    __main__.py          under Python 2 or 3.5 and older, prints the one line
                         supervisor.py prints there and exits 125 (it parses
                         under Python 2.7 as under 3.x); else imports the
                         module compiled for the running CPython
                         (treereap_311 from treereap_311.pyc on 3.11), or,
                         for any other interpreter, supervisor.py from the
                         zip; sets its _BUILT_FROM to the source's sha256 and
                         runs the command line as `python3 supervisor.py` does
    treereap_3X.pyc      one per CPython 3.6 to 3.13 found, compiled by that
                         interpreter (zipimport loads NAME.pyc only when its
                         magic number is the running interpreter's, hence a
                         name per version); a CPython not found is absent, and
                         its users run the source
    supervisor.py        the source, for the fallback
    BUILD.txt            the source's sha256, the interpreters compiled

Interpreters: each --python PATH, else every CPython 3.6 to 3.13 that pyenv
has ($PYENV_ROOT or ~/.pyenv: versions/3.X.Y/bin/python, the newest patch
release of each), then python3.6 ... python3.13 and python3 on PATH; the
first found for a version is the one used. --only compiles only the
versions listed; --require (for CI) makes a listed version that is not found
an error, as --only does.

Reproducible: the same supervisor.py and the same interpreters give the same
bytes. Entries are sorted, dated 1980-01-01 00:00:00 (or SOURCE_DATE_EPOCH,
UTC, never before 1980), mode 0644; the pycs do not embed the build time:
hash-based and unchecked on 3.7+ (py_compile's UNCHECKED_HASH), and on 3.6
(no hash-based pycs) compiled from a copy of the source whose mtime is that
same date; each is compiled with PYTHONHASHSEED=0 (the order of a frozenset
constant follows the string hashes) and names its source `supervisor.py`.
Each is compiled at optimization level 2: without docstrings (and asserts),
which supervisor.py never reads; the pyc is 17% smaller, and loads faster.

--check PYZ: does PYZ hold this supervisor.py (its sha256 in BUILD.txt and
__main__.py, the bytes of the supervisor.py inside)? Exit 0 if so, 1 if not,
2 if PYZ cannot be read (one line naming it, and how to build it).
(--source PATH, for the tests: another supervisor.py to build or check.)
"""
import argparse
import calendar
import glob
import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "supervisor.py")
# Where git ignores it (.gitignore: dist/), made if missing.
DEFAULT_OUTPUT = os.path.join(ROOT, "dist", "treereap.pyz")
VERSIONS = ["3.%d" % minor for minor in range(6, 14)]  # what supervisor.py supports
SHEBANG = b"#!/usr/bin/env python3\n"
SOURCE_NAME = "supervisor.py"  # in the zip, and the file name inside each pyc
FALLBACK_MODULE = "supervisor"

# Run by each interpreter: compile the source to a pyc, print the magic number.
COMPILE = """\
import importlib.util, py_compile, sys
source, pyc, name = sys.argv[1:4]
kwargs = {}
if sys.version_info >= (3, 7):
    kwargs["invalidation_mode"] = py_compile.PycInvalidationMode.UNCHECKED_HASH
py_compile.compile(source, cfile=pyc, dfile=name, doraise=True, optimize=2, **kwargs)
print(importlib.util.MAGIC_NUMBER.hex())
"""

# Run by each candidate: what it is.
PROBE = "import sys; print(sys.implementation.cache_tag or '-', '%d.%d.%d' % sys.version_info[:3])"

# Parsed by every Python that may be asked to run the zip, Python 2.7 and 3.5
# too: they get supervisor.py's one line and 125, never a traceback (no
# f-string, annotation or other syntax newer than 2.7 below).
MAIN = '''\
# treereap.pyz: scripts/build_pyz.py made this zip from supervisor.py alone.
import sys

if sys.version_info < (3, 6):  # as supervisor.py says it
    sys.stderr.write("treereap: needs Python 3.6 or later; this is %s\\n" % sys.version.split()[0])
    sys.exit(125)

import zipimport

# The sha256 of that supervisor.py; and by sys.implementation.cache_tag, the
# module compiled by that CPython.
BUILT_FROM = "{sha256}"
COMPILED = {{{compiled}
}}


def _load():
    name = COMPILED.get(sys.implementation.cache_tag)
    if name is not None:
        try:
            return __import__(name)
        except zipimport.ZipImportError:
            pass  # not this interpreter's magic number (a pre-release?)
    return __import__("{fallback}")  # the source, compiled at each start


module = _load()
module._BUILT_FROM = BUILT_FROM
module._exit(module.main())
'''


class BuildError(Exception):
    pass


def module_name(version):
    """The module compiled for CPython `version` ("3.11"): treereap_311."""
    return "treereap_" + version.replace(".", "")


def zip_date():
    """The date of every entry: SOURCE_DATE_EPOCH (UTC), else 1980-01-01, the
    first a zip can hold."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch:
        return (1980, 1, 1, 0, 0, 0)
    return max((1980, 1, 1, 0, 0, 0), tuple(time.gmtime(int(epoch))[:6]))


def _version_key(version):
    return tuple(int(part) for part in version.split("."))


def _probe(python):
    """(cache tag, X.Y.Z) of an interpreter, or None."""
    try:
        result = subprocess.run([python, "-S", "-c", PROBE], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = result.stdout.decode("utf-8", "replace").split()
    if result.returncode != 0 or len(words) != 2:
        return None
    return words


def candidates():
    """Where to look for interpreters, in order of preference."""
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = glob.glob(os.path.join(pyenv_root, "versions", "3.*", "bin", "python"))
    patch = re.compile(r"3\.\d+\.\d+$")

    def release(path):
        name = os.path.basename(os.path.dirname(os.path.dirname(path)))
        return _version_key(name) if patch.match(name) else None

    pyenv = sorted((p for p in found if release(p)), key=release, reverse=True)
    on_path = [shutil.which(name) for name in ["python" + v for v in VERSIONS] + ["python3"]]
    return pyenv + [p for p in on_path if p]


def find_interpreters(pythons=None, wanted=VERSIONS, log=None):
    """{"3.11": (path, "3.11.7"), ...}: one CPython per version in `wanted`,
    from `pythons` if given, else from candidates()."""
    log = log or (lambda text: None)
    chosen, seen = {}, set()
    for python in pythons or candidates():
        real = os.path.realpath(python)
        if real in seen:
            continue
        seen.add(real)
        probed = _probe(python)
        if probed is None:
            if pythons:
                raise BuildError("%s: not a working Python 3 interpreter" % python)
            continue
        tag, release = probed
        version = ".".join(release.split(".")[:2])
        if tag != "cpython-" + version.replace(".", ""):
            if pythons:
                raise BuildError("%s: not CPython (cache tag %s)" % (python, tag))
            continue
        if version in wanted and version not in chosen:
            chosen[version] = (python, release)
        elif pythons:
            log("not compiled with %s (CPython %s): %s" % (python, release, (
                "a version supervisor.py does not support" if version not in VERSIONS else
                "left out by --only" if version not in wanted else "already compiled")))
    return dict(sorted(chosen.items(), key=lambda kv: _version_key(kv[0])))


def compile_with(python, source, pyc):
    """Compile source to pyc with `python`; its magic number (hex)."""
    # No PYTHONPATH, PYTHONSTARTUP... from the caller; a fixed hash seed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    result = subprocess.run([python, "-S", "-B", "-c", COMPILE, source, pyc, SOURCE_NAME],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if result.returncode != 0:
        raise BuildError("%s could not compile %s:\n%s" % (
            python, source, result.stderr.decode("utf-8", "replace")))
    magic = result.stdout.decode().strip()
    with open(pyc, "rb") as f:
        if f.read(4).hex() != magic:
            raise BuildError("%s wrote a pyc that is not its own (magic %s)" % (python, magic))
    return magic


def build_txt(sha256, version, compiled):
    lines = ["treereap.pyz, built by scripts/build_pyz.py",
             "source: %s" % SOURCE_NAME,
             "sha256: %s" % sha256,
             "version: %s" % version,
             "compiled:"]
    for v, (release, magic) in compiled.items():
        lines.append("  %-17s CPython %s, magic number %s" % (
            module_name(v) + ".pyc", release, magic))
    if not compiled:
        lines.append("  (none)")
    lines.append("any other interpreter: %s, compiled at each start" % SOURCE_NAME)
    return "\n".join(lines) + "\n"


def _entry(name, data, date):
    info = zipfile.ZipInfo(name, date_time=date)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # Unix: the mode below is read
    info.external_attr = (stat.S_IFREG | 0o644) << 16
    return info, data


def build(output, source=SOURCE, pythons=None, only=None, require=(), log=None):
    """Build the pyz at `output`; returns the contents of its BUILD.txt."""
    log = log or (lambda text: None)
    wanted = [v for v in VERSIONS if only is None or v in only]
    unknown = sorted(set(list(only or []) + list(require)) - set(VERSIONS), key=_version_key)
    if unknown:
        raise BuildError("not a version supervisor.py supports (%s to %s): %s" % (
            VERSIONS[0], VERSIONS[-1], ", ".join(unknown)))
    found = find_interpreters(pythons, wanted, log)
    missing = [v for v in sorted(set(require) | set(only or []), key=_version_key)
               if v not in found]
    if missing:
        raise BuildError("CPython %s not found (found: %s)" % (
            ", ".join(missing), ", ".join(found) or "none"))
    with open(source, "rb") as f:
        code = f.read()
    sha256 = hashlib.sha256(code).hexdigest()
    match = re.search(rb'^__version__ = "([^"]+)"', code, re.M)
    version = match.group(1).decode() if match else "?"
    date = zip_date()
    stamp = calendar.timegm(date)  # the source mtime a 3.6 pyc records (UTC)
    entries, compiled = [], {}
    with tempfile.TemporaryDirectory(prefix="build_pyz-") as work:
        copy = os.path.join(work, SOURCE_NAME)
        with open(copy, "wb") as f:
            f.write(code)
        os.utime(copy, (stamp, stamp))
        for v, (python, release) in found.items():
            pyc = os.path.join(work, module_name(v) + ".pyc")
            magic = compile_with(python, copy, pyc)
            with open(pyc, "rb") as f:
                entries.append(_entry(module_name(v) + ".pyc", f.read(), date))
            compiled[v] = (release, magic)
            log("compiled %s.pyc with %s (CPython %s)" % (module_name(v), python, release))
    tags = "".join('\n    "cpython-%s": "%s",' % (v.replace(".", ""), module_name(v))
                   for v in compiled)
    main = MAIN.format(sha256=sha256, compiled=tags, fallback=FALLBACK_MODULE)
    text = build_txt(sha256, version, compiled)
    entries += [_entry("__main__.py", main.encode(), date), _entry(SOURCE_NAME, code, date),
                _entry("BUILD.txt", text.encode(), date)]
    entries.sort(key=lambda entry: entry[0].filename)
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w") as archive:
        for info, data in entries:
            archive.writestr(info, data)
    directory = os.path.dirname(os.path.abspath(output))
    fd, temporary = tempfile.mkstemp(prefix=".treereap.pyz-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buffer.getvalue())
        os.chmod(temporary, 0o755)
        os.replace(temporary, output)
    except BaseException:
        os.unlink(temporary)
        raise
    return text


def check(pyz, source=SOURCE):
    """[] if pyz was built from source, else what differs."""
    with open(source, "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()
    with open(pyz, "rb") as f:  # missing, unreadable, a directory: the OSError says which
        try:
            archive = zipfile.ZipFile(f)
        except zipfile.BadZipFile:
            return ["not a zip application (built by another tool, or cut short)"]
        with archive:
            return _differences(archive, sha256)


def _differences(archive, sha256):
    """What differs between an open pyz and the source of that sha256."""
    problems = []
    names = archive.namelist()
    for name in ("BUILD.txt", "__main__.py", SOURCE_NAME):
        if name not in names:
            problems.append("no %s inside" % name)
    if problems:
        return problems
    built = re.search(r"^sha256: ([0-9a-f]{64})$", archive.read("BUILD.txt").decode(), re.M)
    if not built or built.group(1) != sha256:
        problems.append("BUILD.txt names sha256 %s" % (built.group(1) if built else "none"))
    if ('BUILT_FROM = "%s"' % sha256) not in archive.read("__main__.py").decode():
        problems.append("__main__.py sets another sha256")
    if hashlib.sha256(archive.read(SOURCE_NAME)).hexdigest() != sha256:
        problems.append("the %s inside is another one" % SOURCE_NAME)
    return problems


def _versions(text):
    return [v.strip() for v in text.split(",") if v.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="build_pyz.py", description="Build treereap.pyz from supervisor.py alone.")
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                        help="where to write it (default: dist/treereap.pyz at the repository "
                             "top, which git ignores)")
    parser.add_argument("--python", action="append", metavar="PATH",
                        help="an interpreter to compile with (repeat it); default: every "
                             "CPython 3.6 to 3.13 found (pyenv, then PATH)")
    parser.add_argument("--only", type=_versions, metavar="3.X,...",
                        help="compile only for these versions (each must be found)")
    parser.add_argument("--require", type=_versions, default=[], metavar="3.X,...",
                        help="fail if one of these versions is not found (for CI)")
    parser.add_argument("--source", default=SOURCE, help=argparse.SUPPRESS)
    parser.add_argument("--check", metavar="PYZ",
                        help="check that PYZ was built from supervisor.py, and build nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    args = parser.parse_args(argv)
    if args.check:
        try:
            problems = check(args.check, args.source)
        except OSError as e:  # no such file, not readable: one line, not a traceback
            print("build_pyz.py: cannot check %s: %s; build it: python3 scripts/build_pyz.py "
                  "-o %s" % (e.filename or args.check, e.strerror or e, args.check),
                  file=sys.stderr)
            return 2
        for problem in problems:
            print("%s: %s" % (args.check, problem), file=sys.stderr)
        if not problems and not args.quiet:
            print("%s: built from %s" % (args.check, args.source))
        return 1 if problems else 0
    log = None if args.quiet else (lambda text: print(text, file=sys.stderr))
    if args.output == DEFAULT_OUTPUT:
        os.makedirs(os.path.dirname(DEFAULT_OUTPUT), exist_ok=True)
    try:
        text = build(args.output, args.source, args.python, args.only, args.require, log)
    except BuildError as e:
        print("build_pyz.py: %s" % e, file=sys.stderr)
        return 2
    if not args.quiet:
        print("%s:\n%s" % (args.output, text), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
