#!/usr/bin/env python3
"""docker_image.py: a root filesystem for `docker import`, from this
machine's files, where no image registry is reachable.

    python3 tests/engines/docker_image.py [--pyz PYZ] OUT.tar   (or - for stdout)
    ... | docker import -c 'ENV PATH=/usr/bin:/bin' - NAME

What it holds: a static busybox and its applets in /bin; /usr/bin/python3
(the system's, $DOCKER_IMAGE_PYTHON to choose another) with only the part
of its standard library that supervisor.py and the pyz load (found by
importing them in that interpreter: the modules, the extension modules of
lib-dynload) and the shared libraries `ldd` lists for the binary and those
extension modules; /etc/passwd and /etc/group with root and nobody; /tmp;
an empty /receipts; with --pyz, PYZ at /opt/treereap.pyz (what the recipe's
Dockerfile copies). About 16 MB: the whole library made an image of 49 MB,
which Docker in the tests' emulated guest took 50 s to import.

Standard library only; run it with any python3. Used by tests/test_docker.py
and, on the host before the guest boots, by tests/test_guest.py.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.environ.get("DOCKER_IMAGE_PYTHON", "/usr/bin/python3")
# What the supervisor imports when it starts, and later where it needs them
# (supervisor.py imports these inside functions), and what running a pyz
# takes (runpy, zipimport); the codecs a container's C locale asks for.
LOAD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import supervisor, ctypes, ctypes.util, fcntl, grp, pwd, resource, textwrap, runpy, zipimport
import encodings.ascii, encodings.latin_1, encodings.utf_8, encodings.aliases
files = [m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)]
print(json.dumps({"stdlib": os.path.dirname(os.__file__), "files": files}))
"""


def loaded():
    """The standard library's directory, and the files PYTHON loads."""
    said = subprocess.check_output([PYTHON, "-I", "-c", LOAD, ROOT], universal_newlines=True)
    found = json.loads(said)
    stdlib = found["stdlib"]
    files = sorted(f for f in set(found["files"]) if f.startswith(stdlib + "/")
                   and not f.startswith(ROOT + "/"))
    return stdlib, files


def libraries(objects):
    found = set()
    for path in objects:
        said = subprocess.run(["ldd", path], stdout=subprocess.PIPE,
                              universal_newlines=True).stdout
        found.update(word for word in said.split() if word.startswith("/"))
    return sorted(found)


class Tree(object):
    """The tar stream, with every directory made once, before its files."""

    def __init__(self, tar):
        self.tar, self.made = tar, set()

    def directory(self, name, mode=0o755):
        name = name.strip("/")
        if name and name not in self.made:
            self.directory(os.path.dirname(name))
            self.made.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            self.tar.addfile(info)

    def file(self, path, name=None):
        """path's content (a symlink followed) at name (path by default)."""
        name = (name or path).strip("/")
        self.directory(os.path.dirname(name))
        info = self.tar.gettarinfo(os.path.realpath(path), name)
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        with open(path, "rb") as f:
            self.tar.addfile(info, f)

    def text(self, name, data):
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        self.tar.addfile(info, io.BytesIO(data))

    def link(self, name, target):
        name = name.strip("/")
        self.directory(os.path.dirname(name))
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        self.tar.addfile(info)


def write(out, pyz=None):
    busybox = shutil.which("busybox")
    applets = subprocess.check_output([busybox, "--list"], universal_newlines=True).split()
    real = os.path.realpath(PYTHON)
    stdlib, files = loaded()
    extensions = [f for f in files if f.endswith(".so")]
    with tarfile.open(fileobj=out, mode="w|") as tar:
        tree = Tree(tar)
        for name, mode in (("tmp", 0o1777), ("receipts", 0o755), ("etc", 0o755)):
            tree.directory(name, mode)
        tree.file(busybox, "/bin/busybox")
        if pyz:
            tree.file(pyz, "/opt/treereap.pyz")
        for applet in applets:
            if applet != "busybox":
                tree.link("bin/" + applet, "busybox")
        tree.text("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                                b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        tree.text("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        for library in libraries([real] + extensions):
            tree.file(library)
        tree.file(real)
        if os.path.realpath(PYTHON) != PYTHON:
            tree.link(PYTHON, os.path.basename(real))
        # Each module with its compiled form, where Python left one.
        tree.directory(os.path.join(stdlib, "lib-dynload"))
        for path in files:
            tree.file(path)
            if path.endswith(".py"):
                directory, base = os.path.split(path)
                cache = os.path.join(directory, "__pycache__", "%s.%s.pyc" % (
                    base[:-3], sys_tag()))
                if os.path.exists(cache):
                    tree.file(cache)


_TAG = []


def sys_tag():
    if not _TAG:
        _TAG.append(subprocess.check_output(
            [PYTHON, "-c", "import sys; print(sys.implementation.cache_tag)"],
            universal_newlines=True).strip())
    return _TAG[0]


def main(argv):
    pyz = None
    if argv[1:2] == ["--pyz"] and len(argv) > 2:
        pyz, argv = argv[2], argv[:1] + argv[3:]
    if len(argv) != 2:
        sys.stderr.write("usage: docker_image.py [--pyz PYZ] OUT.tar|-\n")
        return 2
    if argv[1] == "-":
        write(sys.stdout.buffer, pyz)
    else:
        with open(argv[1], "wb") as out:
            write(out, pyz)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
