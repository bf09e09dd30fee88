"""The tests that need a pure cgroup v2 kernel (memory, pids and cpu in
cgroup v2, as on most hosts today), run in one QEMU guest booted for the
batch by the project's harness, tests/guest/vmrun.sh: Debian's kernel from
/boot, the host's / read-only below a throwaway overlay, cgroup2 at
/sys/fs/cgroup with every v1 controller off. TCG is 10-15x slower than this
host: the guest's bounds are generous.

The batch: the limits, the containment tests, and the supervisor in
containers (tests/test_containers.py: runc, crun and Podman, which the guest
takes from this host's /; the guest's / is moved onto / before the chroot,
as switch_root does, so that a runtime's exec lands in the container), and
under a real Docker engine (tests/test_docker.py: a dockerd of its own in
the guest, its image's files made here beforehand).

Needs root, qemu-system-x86_64, a kernel in /boot with its modules, and a
static busybox (apt-get install qemu-system-x86 linux-image-amd64
busybox-static kmod), and for the containers runc, crun and podman (apt-get
install --no-install-recommends runc crun podman); skipped elsewhere with
the reason, unless SUPERVISOR_REQUIRE_GUEST=1 (as in CI, .ci/run): then
that is a failure, and so is a runtime missing in the guest.
"""
import glob
import os
import shlex
import shutil
import signal
import subprocess

import pytest

from conftest import IS_ROOT, PY, ROOT

HARNESS = os.path.join(ROOT, "tests", "guest", "vmrun.sh")
# What runs in the guest: the limits, and the containment tests, whose
# cgroup paths are found, not assumed (/sys/fs/cgroup there); the containers;
# of the Docker engine's tests, those that need cgroup v2 (about 50 s).
BATCH = ["tests/test_limits.py", "tests/test_containment.py", "tests/test_containers.py",
         "tests/test_docker.py"]
DOCKER_IMAGE = os.path.join(ROOT, "tests", "engines", "docker_image.py")
# The whole batch: about 3 minutes of one CPU; a bound for a hang only.
GUEST_LIMIT = 1200


def why_no_guest():
    if not IS_ROOT:
        return "needs root (the guest's 9p share reads every file as its owner)"
    for tool in ("qemu-system-x86_64", "busybox", "modprobe"):
        if shutil.which(tool) is None:
            return "no %s (apt-get install qemu-system-x86 linux-image-amd64 " \
                   "busybox-static kmod)" % tool
    if not glob.glob("/boot/vmlinuz-*"):
        return "no kernel in /boot (apt-get install linux-image-amd64)"
    return None


@pytest.mark.timeout(GUEST_LIMIT + 60)
def test_the_batch_that_needs_cgroup_v2_controllers_passes_in_a_pure_cgroup_v2_guest(tmp_path):
    why = why_no_guest()
    if why is not None:
        if os.environ.get("SUPERVISOR_REQUIRE_GUEST") == "1":
            pytest.fail("SUPERVISOR_REQUIRE_GUEST=1, and the guest cannot run: " + why)
        pytest.skip(why)
    # (The GiB of output is the host's to test: in the guest it costs 20 s.)
    # The host's /tmp is seen (a checkout may be there), below the overlay;
    # the tests' own files go to a fresh tmpfs (TMPDIR: on the overlay a
    # copied-up file's st_dev is not its directory's).
    command = ("TMPDIR=/dev/shm %s -m pytest -v -n 0 -p no:cacheprovider -p no:hypothesispytest "
               "-rfEs --durations=10 -k 'not gib' %s") % (
        shlex.quote(PY), " ".join(BATCH))
    # The supervisor as the pyz, built here for this interpreter: in the
    # guest, compiling supervisor.py at each start costs 0.4 s of emulated
    # CPU (a third of the batch). The pyz's own tests are tests/test_pyz.py.
    pyz = os.path.join(str(tmp_path), "treereap.pyz")
    pythons = [PY] + ["/usr/bin/python3"] * os.path.exists("/usr/bin/python3")  # (containers')
    subprocess.check_call([PY, os.path.join(ROOT, "scripts", "build_pyz.py"), "-o", pyz] + [
        arg for python in pythons for arg in ("--python", python)],
        stdout=subprocess.DEVNULL, timeout=300)
    env = dict(os.environ, TREEREAP_IN_GUEST="1", PYTHONDONTWRITEBYTECODE="1",
               VMRIG_HOST_TMP="1", SUPERVISOR_ENTRY=pyz)
    # Docker's image, made here with that pyz in it: made in the guest,
    # reading the host's files through 9p, it costs 50 s of the batch.
    if os.path.exists("/usr/bin/python3") and shutil.which("busybox"):
        image = os.path.join(str(tmp_path), "docker-image.tar")
        subprocess.check_call(["/usr/bin/python3", DOCKER_IMAGE, "--pyz", pyz, image],
                              timeout=300)
        env["TREEREAP_DOCKER_IMAGE"] = image
    # The batch runs under PY alone: no other interpreter to ask its version
    # (at 0.5 s each there); the other CPythons are the host's tests.
    env["SUPERVISOR_TEST_PYTHONS"] = PY
    for name in ("PYTEST_XDIST_WORKER", "SUPERVISOR_REQUIRE_PYTHONS"):
        env.pop(name, None)
    # In a process group of its own, so that a guest out of time goes with
    # all of QEMU. At the host's tests' priority: the guest's batch is the
    # longest part of the suite (at nice 10 a busy host starved it).
    proc = subprocess.Popen([HARNESS, command], cwd=ROOT, env=env,
                            universal_newlines=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output = proc.communicate(timeout=GUEST_LIMIT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0]
        pytest.fail("the guest ran past %d s\n%s" % (GUEST_LIMIT, failures_first(output)))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, failures_first(output)
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, failures_first(output)
    # In the guest nothing of the batch may be skipped for want of the guest:
    # a skip there would be a test this host never runs.
    assert "runs in the pure cgroup v2 guest" not in output, failures_first(output)


def failures_first(output):
    """What a failed batch says first: each failed test and its first error
    line (pytest's short summary, -rfE), and under a timeout the test that
    was running (-v names each as it starts); then the output's end."""
    lines = output.splitlines()
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))
              or line.endswith((" FAILED", " ERROR"))]
    started = [line for line in lines if line.startswith("tests/") and "::" in line]
    return "\n".join(["failed: %d" % len(failed)] + failed + [
        "last started: %s" % (started[-1] if started else "none"), "",
        "the output's end:", output[-6000:]])
