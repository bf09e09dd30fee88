"""The kernel's own containment: the run in a cgroup of its own. What it
keeps stays there, named by the receipt, for the owner to end; what left
the cgroup is still found; nested supervisors nest their cgroups; where no
cgroup can be made, auto falls back to the /proc walk and `cgroup` refuses.

Tests that make a cgroup of their own remove it; the supervisor removes its."""
import json
import os
import shutil
import shlex
import signal
import subprocess
import time

import pytest

from conftest import (
    CGROUP_ROOT, IS_ROOT, PY, ROOT, alive, finish, kill_all, kill_pinned, needs_cgroup, read_lines,
    read_lines_until,
    read_receipt, run, run_supervisor, spawn, start_supervisor, supervisor_below, supervisor_cmd,
    wait_until,
)

CGROUP = ["--containment", "cgroup"]


def cgroup_dir(path):
    """The directory of a cgroup path as a receipt gives it (relative to the
    hierarchy's root), on this machine's cgroup v2 mount."""
    return CGROUP_ROOT + path


def cgroup_procs(path):
    with open(cgroup_dir(path) + "/cgroup.procs") as f:
        return [int(pid) for pid in f.read().split()]


def remove_test_cgroup(directory):
    """Remove a cgroup a test made, and the cgroups below it (a run a failed
    test left there), killing (by pidfd, and only our descendants) what is
    in them, so that they can go."""
    for name in os.listdir(directory):
        if os.path.isdir(os.path.join(directory, name)):
            remove_test_cgroup(os.path.join(directory, name))
    with open(directory + "/cgroup.procs") as f:
        for pid in f.read().split():
            kill_pinned(int(pid))
    assert wait_until(lambda: not open(directory + "/cgroup.procs").read().split())
    os.rmdir(directory)


def our_cgroups():
    """The cgroups supervisors made at the hierarchy's root."""
    try:
        return sorted(n for n in os.listdir(CGROUP_ROOT) if n.startswith("treereap-"))
    except OSError:
        return []


@needs_cgroup
def test_the_run_is_in_a_cgroup_of_its_own_and_it_is_removed_at_the_end(paths):
    script = "cat /proc/self/cgroup; setsid sh -c 'cat /proc/self/cgroup' ; exit 0"
    result = run_supervisor(*paths.options() + CGROUP + ["--", "sh", "-c", script])
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["containment"] == "cgroup" and receipt["kept_cgroup"] is None
    lines = [line for line in result.stdout.splitlines() if line.startswith("0::")]
    assert lines == ["0::" + receipt["cgroup"]] * 2  # the command, and a process in a new session
    assert not os.path.exists(cgroup_dir(receipt["cgroup"]))
    assert receipt["usage"]["source"] == "cgroup"


@needs_cgroup
def test_what_a_run_kept_outlives_it_in_its_cgroup_and_the_owner_ends_it_all(paths):
    """--preserve-descendants-on-success, an exit 0: the run's cgroup is the
    kept one, and stays while it holds the service and its child; --end-kept
    ends all of it at once, even a descendant whose parent died (no pid
    chain leads to it any more)."""
    script = "setsid -f sh -c 'sleep 300 & echo child $!; echo service $$; exec sleep 300'"
    proc = start_supervisor(*paths.options(cleanup=1) + ["--preserve-descendants-on-success"]
                            + CGROUP + ["--", "sh", "-c", script])
    lines = read_lines(proc.stdout, 2)  # child, service: in any order
    pids = dict(line.split() for line in lines)
    service, child = int(pids["service"]), int(pids["child"])
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    try:
        assert status == 0, err
        assert receipt["cleanup_confirmed"] is True
        assert [p["pid"] for p in receipt["preserved"]] == [service]
        kept = receipt["kept_cgroup"]
        assert kept == receipt["cgroup"] and os.path.isdir(cgroup_dir(kept))
        assert sorted(cgroup_procs(kept)) == sorted([service, child])
        os.kill(service, signal.SIGKILL)  # the child loses its parent: only the cgroup holds it
        assert wait_until(lambda: not alive(service))
        ended = run_supervisor("--end-kept", paths.receipt, "-k", "5")
        assert ended.returncode == 0, ended.stderr
        assert "all kept processes are gone" in ended.stderr
        assert not alive(child) and not os.path.exists(cgroup_dir(kept))
    finally:
        kill_all([p for p in (service, child) if alive(p)])


@needs_cgroup
def test_a_process_moved_out_of_the_runs_cgroup_is_still_drained(paths, tmp_path):
    """A root command can write a child's pid into another cgroup: that child
    escapes cgroup.kill, but it still descends from the supervisor, and the
    walk behind the confirmation finds and drains it."""
    other = os.path.join(CGROUP_ROOT, "test-escape-%d" % os.getpid())
    os.mkdir(other)
    try:
        script = ("setsid sh -c 'trap \"\" TERM; echo escaped $$; exec sleep 300' > escaped & "
                  "while [ ! -s escaped ]; do sleep 0.01; done; "
                  "cut -d' ' -f2 escaped > %s/cgroup.procs; echo moved; exec sleep 300" % other)
        proc = start_supervisor(*paths.options(cleanup=0.5, stop=True) + CGROUP + [
            "--", "sh", "-c", script])
        read_lines_until(proc.stdout, "moved")
        escaped = int((paths.work / "escaped").read_text().split()[1])
        assert cgroup_procs("/" + os.path.basename(other)) == [escaped]
        paths.stop.write_text("")
        status, _, err = finish(proc)
        receipt = read_receipt(paths.receipt)
        assert status == 124, err
        assert receipt["cleanup_confirmed"] is True
        assert not alive(escaped)
        assert escaped in [p["pid"] for p in receipt["drained"]]
    finally:
        remove_test_cgroup(other)


@needs_cgroup
def test_a_dead_supervisors_cgroup_is_removed_a_live_ones_never(paths):
    """A supervisor holds a flock on each cgroup it makes: an empty one that
    nobody holds, older than a maker could take to lock it, was left by a
    supervisor SIGKILLed meanwhile, and the next run removes it, whatever
    pid its name has (pid 1 of a container is always alive). One that is
    held, or too young to judge, stays, even if its pid is nobody's here."""
    import fcntl
    import time
    free_pid = next(pid for pid in range(4000000, 4100000) if not alive(pid))
    names = {"dead": "treereap-1-0badc0de", "held": "treereap-%d-0badc0de" % free_pid,
             "young": "treereap-%d-0badc0df" % free_pid}
    dirs = dict((k, os.path.join(CGROUP_ROOT, n)) for k, n in names.items())
    hour_ago = time.time() - 3600
    for kind, path in dirs.items():
        os.mkdir(path)
        if kind != "young":
            os.utime(path, (hour_ago, hour_ago))
    held = os.open(dirs["held"], os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = run_supervisor(*paths.options() + CGROUP + ["--", "true"])
        assert result.returncode == 0, result.stderr
        assert not os.path.exists(dirs["dead"])
        assert os.path.isdir(dirs["held"]) and os.path.isdir(dirs["young"])
    finally:
        os.close(held)
        for path in dirs.values():
            if os.path.exists(path):
                os.rmdir(path)


@needs_cgroup
def test_what_a_nested_supervisor_holds_stays_in_its_cgroup_when_the_outer_keeps_all(open_dir):
    """The outer run keeps everything (its command exited 0) while a nested
    supervisor, a background job of it, still runs its command as nobody (so
    the inner trusts `populated 0` alone). The inner's command stays in the
    inner's cgroup, not moved with the rest to the outer's kept one: the
    inner's deadline ends it, and the inner's receipt is true. The run's
    cgroup is the kept one, whole; --end-kept then ends it."""
    work, ctl = open_dir["work"], open_dir["ctl"]
    inner = supervisor_cmd("--timeout", 2, "-k", 1, "--user", "nobody", "--workdir", work,
                           "--receipt", ctl + "/inner.json", "--", "sh", "-c",
                           "echo $$ > pid; exec sleep 300")
    script = ("setsid -f %s >/dev/null 2>&1; while [ ! -s %s/pid ]; do sleep 0.01; done; exit 0"
              % (" ".join(shlex.quote(str(a)) for a in inner), work))
    outer_receipt = ctl + "/outer.json"
    result = run_supervisor("--timeout", 30, "--workdir", work, "--receipt", outer_receipt,
                            "--preserve-descendants-on-success", *CGROUP + ["--", "sh", "-c", script])
    outer = read_receipt(outer_receipt)
    sleeper = int(open(work + "/pid").read())
    try:
        assert result.returncode == 0, result.stderr
        assert outer["kept_cgroup"] == outer["cgroup"]
        assert wait_until(lambda: os.path.exists(ctl + "/inner.json"), timeout=30)
        inner_receipt = read_receipt(ctl + "/inner.json")
        assert inner_receipt["timed_out"] is True
        assert inner_receipt["cleanup_confirmed"] is True and not alive(sleeper)
        ended = run_supervisor("--end-kept", outer_receipt, "-k", "5")
        assert ended.returncode == 0, ended.stderr
        assert not any(os.path.exists(cgroup_dir(outer[k])) for k in ("cgroup", "kept_cgroup"))
    finally:
        kill_all([sleeper] + [p["pid"] for p in outer["preserved"] if alive(p["pid"])])
        for key in ("kept_cgroup", "cgroup"):
            if outer.get(key) and os.path.isdir(cgroup_dir(outer[key])):
                os.rmdir(cgroup_dir(outer[key]))


@needs_cgroup
def test_usage_comes_from_the_cgroup(paths):
    """cpu.stat counts every process the run held, reaped or not: here a
    process that burns 0.3 s of CPU in a session of its own and is still
    running at the stop (the drain kills it, unreaped by anyone but the
    kernel's count)."""
    burn = ("import time\nend = time.process_time() + 0.3\n"
            "while time.process_time() < end: pass\nprint('burnt', flush=True)\ntime.sleep(60)\n")
    proc = start_supervisor(*paths.options(stop=True) + CGROUP + [
        "--", "sh", "-c", 'setsid "$0" -c "$1" & wait', PY, burn])
    read_lines_until(proc.stdout, "burnt")
    paths.stop.write_text("")
    status, _, err = finish(proc)
    usage = read_receipt(paths.receipt)["usage"]
    assert usage["source"] == "cgroup", err
    assert usage["cpu_user_s"] + usage["cpu_system_s"] >= 0.25
    assert usage["fork_rss_kib"] > 0


def test_usage_reads_memory_peak_where_the_memory_controller_is_on(tmp_path):
    """Where the memory controller is on for the run's cgroup (not here: this
    host keeps it in cgroup v1), memory.peak is the run's peak, all of its
    processes at once. The reading itself, on a cgroup's files as the kernel
    writes them."""
    (tmp_path / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n"
                                       "system_usec 500000\nnr_periods 0\n")
    (tmp_path / "memory.peak").write_text("10485760\n")
    code = ("import os, supervisor as s\n"
            "fd = os.open(%r, os.O_RDONLY | os.O_DIRECTORY)\n"
            "print(s._cgroup_usage(s._Cgroup('/run', %r, fd, False)))\n" % (
                str(tmp_path), str(tmp_path)))
    result = run([PY, "-c", code], cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == 0, result.stderr
    usage = eval(result.stdout)
    assert (usage["source"], usage["cpu_user_s"], usage["cpu_system_s"], usage["cpu_usage_s"],
            usage["memory_peak_kib"]) == ("cgroup", 1.0, 0.5, 1.5, 10240)


@pytest.mark.skipif(not IS_ROOT or not os.path.isdir(CGROUP_ROOT),
                    reason="needs root and a cgroup v2 mount to make read-only")
def test_where_no_cgroup_can_be_made_auto_falls_back_and_cgroup_refuses(paths):
    """The cgroup v2 mount made read-only in a private mount namespace: auto
    takes the /proc walk (and says why in the receipt), --containment cgroup
    refuses in one line."""
    def in_read_only_cgroups(*options):
        inner = shlex.join(supervisor_cmd(*paths.options() + list(options) + ["--", "true"]))
        script = "mount -o bind,remount,ro %s && exec %s" % (CGROUP_ROOT, inner)
        return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    result = in_read_only_cgroups()
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["containment"] == "children" and receipt["cgroup"] is None
    assert "read-only" in receipt["cgroup_unavailable"]
    result = in_read_only_cgroups("--containment", "cgroup")
    assert result.returncode == 125
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "--containment cgroup" in lines[0] and "read-only" in lines[0]
    assert not paths.receipt.exists()


@needs_cgroup
def test_a_writable_cgroup_mount_listed_after_a_read_only_one_is_taken(paths, tmp_path):
    """The same hierarchy mounted twice, the read-only mount listed first (as a
    container may have it): auto took the walk; the writable one is taken."""
    writable = tmp_path / "cgroup2"
    writable.mkdir()
    inner = shlex.join(supervisor_cmd(*paths.options() + ["--", "true"]))
    script = ("mount -o bind,remount,ro %s && mount -t cgroup2 none %s && exec %s"
              % (CGROUP_ROOT, writable, inner))
    result = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    assert result.returncode == 0, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["containment"] == "cgroup", receipt["cgroup_unavailable"]


@needs_cgroup
def test_auto_leaves_a_systemd_units_cgroup_alone_unless_it_is_delegated(paths):
    """On a systemd host (/run/systemd/system, here a tmpfs of a private
    mount namespace), a cgroup named for a unit (.service, .scope, .slice)
    is systemd's: auto does not make the run's cgroup in it, and says why;
    once the unit is delegated (the trusted.delegate attribute, as
    Delegate=yes sets it), it does, below the unit's."""
    unit = os.path.join(CGROUP_ROOT, "test-%d.service" % os.getpid())
    os.mkdir(unit)
    try:
        for delegated in (False, True):
            if delegated:
                os.setxattr(unit, "trusted.delegate", b"1")
            script = ("mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && "
                      "echo $$ > %s/cgroup.procs && exec %s" % (unit, " ".join(
                          shlex.quote(str(a)) for a in supervisor_cmd(
                              *paths.options() + ["--", "true"]))))
            result = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
            assert result.returncode == 0, result.stderr
            receipt = read_receipt(paths.receipt)
            if delegated:
                assert receipt["containment"] == "cgroup", receipt["cgroup_unavailable"]
                assert receipt["cgroup"].startswith("/" + os.path.basename(unit) + "/")
            else:
                assert receipt["containment"] == "children"
                assert "systemd manages" in receipt["cgroup_unavailable"]
    finally:
        remove_test_cgroup(unit)


def test_an_unknown_containment_is_refused(paths):
    result = run_supervisor(*paths.options() + ["--containment", "jail", "--", "true"])
    assert result.returncode == 125
    assert result.stderr.count("\n") == 1 and "--containment" in result.stderr


@needs_cgroup
def test_a_forged_kept_cgroup_is_left_alone(paths, tmp_path):
    """--end-kept kills a kept cgroup only if it is one this supervisor makes
    (named after the run's cgroup) and it holds the kept processes the
    receipt names: a receipt pointing at another's cgroup ends nothing."""
    other = os.path.join(CGROUP_ROOT, "treereap-1-00000000.kept-00000000")
    os.mkdir(other)
    victim = subprocess.Popen(["sleep", "300"])
    named = subprocess.Popen(["sleep", "300"])  # alive, and not in that cgroup
    try:
        with open(other + "/cgroup.procs", "w") as f:
            f.write(str(victim.pid))
        with open("/proc/%d/stat" % named.pid) as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        forged = tmp_path / "forged.json"
        # Named after another run, holding none of what it names, or naming
        # nothing kept: each left alone.
        for run_cgroup, kept in (("/treereap-1-00000000", [{"pid": named.pid, "start_time": start}]),
                                 ("/treereap-2-00000000", [{"pid": named.pid, "start_time": start}]),
                                 ("/treereap-1-00000000", [])):
            forged.write_text(json.dumps({
                "preserved": kept, "cgroup": run_cgroup, "namespaces": dict(
                    (k, os.readlink("/proc/self/ns/" + k)) for k in ("pid", "cgroup")),
                "kept_cgroup": "/" + os.path.basename(other)}))
            result = run_supervisor("--end-kept", forged, "-k", "1")
            assert result.returncode == 125, result.stderr
            assert "left alone" in result.stderr
            assert victim.poll() is None
    finally:
        for proc in (victim, named):
            proc.kill()
            proc.wait()
        os.rmdir(other)


def argv0(pid):
    """pid's argv[0] (b"" when it has none: a zombie, or gone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")[0]
    except OSError:
        return b""


def in_the_runs_cgroup(script):
    """script, as a command that knows its cgroup's directory ($cg)."""
    return ["sh", "-c", "cg=%s$(sed -n 's/^0:://p' /proc/self/cgroup); %s" % (CGROUP_ROOT, script)]


@needs_cgroup
def test_with_everything_kept_what_a_child_cgroup_holds_is_kept_listed_and_ended(paths):
    """A root command puts a process in a cgroup of its own below the run's,
    then exits 0 (everything kept): it is kept, listed, and --end-kept ends it
    (it was in no kept cgroup, listed nowhere, and said "all gone")."""
    script = ("mkdir $cg/child; setsid sleep 300 >/dev/null 2>&1 & echo $! > pid; "
              "echo $! > $cg/child/cgroup.procs; exit 0")
    result = run_supervisor(*paths.options() + ["--preserve-descendants-on-success"] + CGROUP + [
        "--"] + in_the_runs_cgroup(script))
    sleeper = int((paths.work / "pid").read_text())
    receipt = read_receipt(paths.receipt)
    try:
        assert result.returncode == 0, result.stderr
        assert receipt["kept_cgroup"] == receipt["cgroup"] and alive(sleeper)
        assert sleeper in [p["pid"] for p in receipt["preserved"]], receipt["preserved"]
        ended = run_supervisor("--end-kept", paths.receipt, "-k", "5")
        assert ended.returncode == 0 and "all kept processes are gone" in ended.stderr, ended.stderr
        assert not alive(sleeper) and not os.path.exists(cgroup_dir(receipt["cgroup"]))
    finally:
        kill_all([sleeper])


@needs_cgroup
def test_the_supervisor_written_into_the_runs_cgroup_moves_back_out(paths):
    """A root command writes its supervisor's pid into the run's cgroup.procs:
    the stop would freeze the supervisor with the run (no receipt, 12 s past a
    7 s bound), cgroup.kill kill it. It moves back to its own cgroup first."""
    script = "echo $PPID > $cg/cgroup.procs; echo started; exec sleep 30"
    result = run_supervisor(*paths.options(timeout=0.5, cleanup=1) + CGROUP + [
        "--"] + in_the_runs_cgroup(script), timeout=30)
    assert result.returncode == 124, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True and receipt["duration_s"] < 4.5


@needs_cgroup
def test_a_threaded_cgroup_below_the_runs_changes_nothing(paths):
    """A root command makes a threaded cgroup below the run's: reading its
    cgroup.procs fails (EOPNOTSUPP), and every stop ended "supervisor
    failed". Its processes are the run's cgroup's: the stop is as ever."""
    script = "mkdir $cg/t && echo threaded > $cg/t/cgroup.type; echo started; exec sleep 30"
    result = run_supervisor(*paths.options(timeout=0.5, cleanup=1) + CGROUP + [
        "--"] + in_the_runs_cgroup(script))
    assert result.returncode == 124, result.stderr
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True and receipt["error"] is None
    assert not os.path.exists(cgroup_dir(receipt["cgroup"]))


def make_old(path):
    """A leftover cgroup counts as a dead supervisor's once a minute old."""
    then = time.time() - 120
    os.utime(path, (then, then))


def in_cgroup(home, argv):
    """argv started in the cgroup home: a home of the test's own, which no
    other test's supervisor sweeps for leftovers."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', home] + [str(a) for a in argv]


@pytest.fixture
def home():
    """A cgroup of the test's own for its supervisors to start in."""
    directory = os.path.join(CGROUP_ROOT, "test-home-%d" % os.getpid())
    os.mkdir(directory)
    yield directory
    remove_test_cgroup(directory)


def killed_supervisors_run(options, home, script, before=()):
    """A supervisor started in home on script (which prints a pid first),
    SIGKILLed once that pid is printed: (the pid, the run's cgroup path)."""
    proc = spawn(in_cgroup(home, list(before) + supervisor_cmd(*options + CGROUP + ["--"] + (
        in_the_runs_cgroup(script)))))
    orphan = int(read_lines(proc.stdout, 1)[0])
    with open("/proc/%d/cgroup" % orphan) as f:
        left = f.read().split("::")[1].strip()
    proc.kill()
    proc.wait()
    return orphan, left


def the_next_supervisor(home, before=()):
    return run(in_cgroup(home, list(before) + supervisor_cmd("-v", "--timeout", "5", "--",
                                                             "true")), cwd="/")


# As Docker's and Podman's default capabilities leave root: no CAP_SYS_ADMIN,
# so no trusted.* extended attributes.
NO_SYS_ADMIN = ["setpriv", "--bounding-set=-sys_admin"]


@needs_cgroup
@pytest.mark.parametrize("before", [[], NO_SYS_ADMIN], ids=["all-caps", "no-cap-sys-admin"])
def test_a_run_left_by_a_killed_supervisor_is_ended_by_the_next_one_at_once(paths, home, before):
    """SIGKILL the supervisor: its run lives on in its cgroup (a child in a
    session of its own, past PR_SET_PDEATHSIG). The next supervisor started
    in the same cgroup ends it at once (its maker, named in the cgroup's
    mark, is gone), and says so with -v, with how many it ended. Without
    CAP_SYS_ADMIN (a container's default) the mark is user.treereap."""
    if before and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    orphan, left = killed_supervisors_run(paths.options(timeout=300), home,
                                          "setsid sleep 300 & echo $!; exec sleep 300", before)
    try:
        assert alive(orphan) and os.path.isdir(cgroup_dir(left))
        names = os.listxattr(cgroup_dir(left))
        assert ("user.treereap" if before else "trusted.treereap") in names, names
        result = the_next_supervisor(home, before)
        assert result.returncode == 0, result.stderr
        assert "ended %s, a run whose supervisor was killed: 1 process(es)" % left in result.stderr
        assert wait_until(lambda: not alive(orphan))
        assert not os.path.exists(cgroup_dir(left))
    finally:
        kill_all([orphan])


# A time namespace whose boot time is a day off (a CRIU restore, a runtime's).
OTHER_TIME_NAMESPACE = ["unshare", "--time", "--boottime", "86400", "--fork"]


@needs_cgroup
def test_a_flock_on_a_killed_supervisors_run_does_not_keep_it_alive(open_dir, home):
    """A --user command waits for the run's cgroup's flock, which it gets the
    moment its supervisor is SIGKILLed: a lock anyone may take passed for a
    live supervisor, and the run lived on. The maker's proof of life is its
    lock on cgroup.kill, which only root may open: the next one ends it."""
    options = ["--timeout", 300, "--workdir", open_dir["work"], "--receipt", open_dir["receipt"],
               "--user", "nobody"]
    orphan, left = killed_supervisors_run(options, home,
                                          "setsid flock $cg sleep 300 & echo $!; exec sleep 300")
    try:
        assert wait_until(lambda: "FLOCK" in open("/proc/locks").read()
                          and any(line.split()[4] == str(orphan) for line in
                                  open("/proc/locks").read().splitlines()))
        result = the_next_supervisor(home)
        assert "ended %s, a run whose supervisor was killed" % left in result.stderr, result.stderr
        assert wait_until(lambda: not alive(orphan))
    finally:
        kill_all([orphan])


@needs_cgroup
def test_a_flock_on_a_run_killed_in_another_pid_namespace_does_not_keep_it_alive(open_dir, home):
    """The killed supervisor was in a PID namespace of its own (a container's
    exec; its init is the test's, so the run outlives it), the
    next one here: the mark named that namespace, where the directory's
    flock said whether the maker lived, and the --user command's flock
    passed for it (2 of 2, #37). The lock on cgroup.kill: the run is ended."""
    locked = os.path.join(open_dir["work"], "locked")
    script = "setsid flock $cg sh -c 'touch %s; exec sleep 300' & exec sleep 300" % locked
    killed = supervisor_cmd("--timeout", 300, "--workdir", open_dir["work"], "--receipt",
                            open_dir["receipt"], "--user", "nobody", *CGROUP + ["--"] +
                            in_the_runs_cgroup(script))
    proc = spawn(in_cgroup(home, ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                                  "sh", "-c", '"$@" & exec sleep 300', "sh"] + killed))
    def runs():
        return [n for n in os.listdir(home) if n.startswith("treereap-")
                and not n.endswith(".supervisor")]
    try:
        # flock waits for its supervisor's lock (and sh has run it: the stop
        # signal, the command's at the supervisor's death, would end sh first).
        def flock_waits():
            with open(os.path.join(home, runs()[0], "cgroup.procs")) as f:
                return any(argv0(int(pid)) == b"flock" for pid in f.read().split())
        assert wait_until(lambda: len(runs()) == 1 and flock_waits())
        left = runs()
        supervisor = supervisor_below(proc.pid)
        os.kill(supervisor, signal.SIGKILL)
        assert wait_until(lambda: os.path.exists(locked))  # the supervisor's lock, taken
        result = the_next_supervisor(home)
        assert len(left) == 1 and "ended /%s/%s, a run whose supervisor was killed: 2 process" % (
            os.path.basename(home), left[0]) in result.stderr, (left, result.stderr)
        assert wait_until(lambda: not os.path.exists(os.path.join(home, left[0])))
    finally:
        proc.kill()
        proc.wait()


@needs_cgroup
@pytest.mark.parametrize("first, then", [(OTHER_TIME_NAMESPACE, []), ([], OTHER_TIME_NAMESPACE)],
                         ids=["run-in-timens", "next-in-timens"])
def test_a_live_run_is_never_ended_from_another_time_namespace(paths, home, first, then):
    """Two supervisors in one cgroup home, one in a time namespace whose
    boot time is a day off: a start time in /proc/PID/stat is given in the
    reader's boot time, so the other's maker read as dead and its live run
    was ended (cgroup.kill: 125, or 137 "confirmed", 5 of 5 both ways). The
    maker's lock says it lives, in any namespace: left alone."""
    proc = spawn(in_cgroup(home, list(first) + supervisor_cmd(*paths.options(timeout=300) + CGROUP + [
        "--", "sh", "-c", "echo started; exec sleep 300"])))
    try:
        read_lines_until(proc.stdout, "started")
        result = the_next_supervisor(home, then)
        assert result.returncode == 0 and "ended" not in result.stderr, result.stderr
        assert proc.poll() is None
        os.kill(supervisor_below(proc.pid), signal.SIGTERM)  # (unshare passes nothing on)
        status, _, err = finish(proc)
        assert status == 143 and read_receipt(paths.receipt)["cleanup_confirmed"] is True, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_cgroup
def test_end_kept_ends_a_kept_cgroup_whose_own_processes_hold_its_lock(paths):
    """What a run kept takes the kept cgroup's flock, which passed for its
    run's supervisor still alive: --end-kept left it alone (125). The mark's
    maker says the run is over: it is ended."""
    script = "setsid flock $cg sleep 300 >/dev/null 2>&1 & echo $! > locker; exit 0"
    result = run_supervisor(*paths.options() + ["--preserve-descendants-on-success"] + CGROUP + [
        "--"] + in_the_runs_cgroup(script))
    assert result.returncode == 0, result.stderr
    receipt, locker = read_receipt(paths.receipt), int((paths.work / "locker").read_text())
    try:
        assert wait_until(lambda: any(line.split()[4:5] == [str(locker)] for line in
                                      open("/proc/locks").read().splitlines()))
        ended = run_supervisor("--end-kept", paths.receipt, "-k", "5")
        assert ended.returncode == 0, ended.stderr
        assert not alive(locker) and not os.path.exists(cgroup_dir(receipt["kept_cgroup"]))
    finally:
        kill_all([locker])


@needs_cgroup
def test_prepare_cgroup_moves_what_shares_the_cgroup_into_a_leaf_and_runs_go_beside_it(home):
    """A container's init and its execs share one cgroup, where no
    controller can be enabled for the runs. --prepare-cgroup moves each of
    its processes into a leaf, treereap.init; run again it changes nothing;
    a supervisor started later in that leaf makes the run's cgroup beside
    it, and the leaf keeps what it holds."""
    init = spawn(in_cgroup(home, ["sleep", "300"]))
    try:
        assert wait_until(lambda: str(init.pid) in open(home + "/cgroup.procs").read().split())
        first = run(in_cgroup(home, supervisor_cmd("--prepare-cgroup")), cwd="/")
        assert first.returncode == 0 and "moved into treereap.init" in first.stderr, first.stderr
        assert open(home + "/cgroup.procs").read().split() == []
        assert str(init.pid) in open(home + "/treereap.init/cgroup.procs").read().split()
        again = run(["sh", "-c", 'echo $$ > "$0/treereap.init/cgroup.procs" && exec "$@"', home]
                    + supervisor_cmd("--prepare-cgroup"), cwd="/")
        assert again.returncode == 0 and " 0 process(es) moved" in again.stderr, again.stderr
        later = run(["sh", "-c", 'echo $$ > "$0/treereap.init/cgroup.procs" && exec "$@"', home]
                    + supervisor_cmd("--timeout", 10, "--containment", "cgroup", "--", "sh", "-c",
                                     "sed -n 's/^0:://p' /proc/self/cgroup"), cwd="/")
        assert later.returncode == 0, later.stderr
        assert os.path.dirname(later.stdout.strip()) == home[len(CGROUP_ROOT):], later.stdout
    finally:
        init.kill()
        init.wait()


@needs_cgroup
def test_a_limit_refused_in_the_prepared_leaf_leaves_no_descriptor_open(home):
    """supervise(memory_max=) from --prepare-cgroup's leaf where the memory
    controller is not to be had: refused each time, and the descriptors it
    opened are closed (the leaf's parent was left open, one a call)."""
    if "memory" in open(home + "/cgroup.controllers").read().split():
        pytest.skip("the memory controller is available below this cgroup: nothing refuses")
    os.mkdir(home + "/treereap.init")
    code = ("import os, supervisor as s\n"
            "open(%r, 'w').write(str(os.getpid()))\n"
            "before = sorted(os.listdir('/proc/self/fd'))\n"
            "for _ in range(3):\n"
            "    try:\n"
            "        s.supervise(['true'], 5, memory_max=1 << 30, containment='cgroup')\n"
            "    except s.SupervisorError as e:\n"
            "        print('refused:', e)\n"
            "print(before == sorted(os.listdir('/proc/self/fd')))\n"
            % (home + "/treereap.init/cgroup.procs"))
    result = run([PY, "-c", code], cwd="/", env=dict(os.environ, PYTHONPATH=ROOT))
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and len(lines) == 4, (result.stdout, result.stderr)
    assert all(line.startswith("refused:") for line in lines[:3]) and lines[3] == "True", lines


@needs_cgroup
def test_prepare_cgroup_refuses_the_hierarchys_root():
    """Run in the hierarchy's root cgroup, it moved every process there (PID 1
    too) into treereap.init, then failed ("Invalid argument") and left them
    moved. The root needs nothing (the kernel lets it enable controllers
    with processes in it): refused before anything moves."""
    before = open(CGROUP_ROOT + "/cgroup.procs").read().split()
    result = run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', CGROUP_ROOT]
                 + supervisor_cmd("--prepare-cgroup"), cwd="/")
    assert result.returncode == 125 and "the hierarchy's root" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not os.path.exists(CGROUP_ROOT + "/treereap.init")
    assert "1" not in before or "1" in open(CGROUP_ROOT + "/cgroup.procs").read().split()


def test_prepare_cgroup_runs_no_command():
    result = run_supervisor("--prepare-cgroup", "--", "true")
    assert result.returncode == 125 and "--prepare-cgroup runs no command" in result.stderr


@needs_cgroup
def test_a_forged_leftover_holding_an_older_process_is_left_alone(home):
    """A root command makes a cgroup named like a run's, marks it as a run's
    and moves an older process in: the next, innocent supervisor ends none
    of it. With the old mark ("run", no maker) nothing ties it to a run; a
    mark naming a maker that started after the process does not either."""
    namespace = os.readlink("/proc/self/ns/pid")
    victim = spawn(["sleep", "300"])
    start = int(open("/proc/%d/stat" % victim.pid).read().rsplit(")", 1)[1].split()[19])
    # Older than the cgroups to come by more than a tick or two (the slack).
    ticks = os.sysconf("SC_CLK_TCK")
    assert wait_until(lambda: time.clock_gettime(time.CLOCK_BOOTTIME) - start / ticks > 0.2)
    gone = spawn(["true"])
    gone.wait()
    dead = gone.pid
    forged = []
    try:
        # The mark as it is now; as 3.2 wrote it, naming a maker that started
        # after the process, or one that started at boot (start time 0, a
        # dead pid: nothing older than it, and it passed; #37).
        for name, mark in (("treereap-1-deadbeef", b"run"),
                           ("treereap-2-deadbeef", b"run 2 %d %s" % (start + 100, namespace.encode())),
                           ("treereap-3-deadbeef", b"run %d 0 %s" % (dead, namespace.encode()))):
            forged.append(os.path.join(home, name))
            os.mkdir(forged[-1])
            os.setxattr(forged[-1], "trusted.treereap", mark)
            with open(forged[-1] + "/cgroup.procs", "w") as f:
                f.write(str(victim.pid))
            make_old(forged[-1])
            result = the_next_supervisor(home)
            assert result.returncode == 0 and "ended" not in result.stderr, result.stderr
            assert alive(victim.pid) and os.path.isdir(forged[-1])
            with open(home + "/cgroup.procs", "w") as f:
                f.write(str(victim.pid))
    finally:
        victim.kill()
        victim.wait()
        for directory in forged:
            if os.path.isdir(directory):
                remove_test_cgroup(directory)


@needs_cgroup
def test_what_a_policy_kept_is_never_taken_for_a_killed_supervisors_run(paths, home):
    proc = spawn(in_cgroup(home, supervisor_cmd(*paths.options() + CGROUP + [
        "--preserve-descendants-on-success", "--", "sh", "-c",
        "setsid sleep 300 & echo $!; exit 0"])))
    kept = int(read_lines(proc.stdout, 1)[0])
    status, _, err = finish(proc)
    receipt = read_receipt(paths.receipt)
    try:
        assert status == 0 and receipt["kept_cgroup"] == receipt["cgroup"], err
        make_old(cgroup_dir(receipt["kept_cgroup"]))
        result = run(in_cgroup(home, supervisor_cmd("-v", "--timeout", "5", "--", "true")),
                     cwd="/")
        assert result.returncode == 0 and "ended" not in result.stderr, result.stderr
        assert alive(kept) and os.path.isdir(cgroup_dir(receipt["kept_cgroup"]))
    finally:
        ended = run_supervisor("--end-kept", paths.receipt, "-k", "5")
        assert ended.returncode == 0, ended.stderr
        assert not alive(kept)
