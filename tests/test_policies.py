"""What a run keeps when it ends: the drain policies, in every containment.

drain-all (the default): nothing, at a natural exit and at a forced stop.
--preserve-descendants-on-success (NeMo Gym's spelling): everything, when the
command exits 0 by itself and nothing stopped the run; any other ending
drains everything. (--keep-services, 1.x's default, is gone.)"""
import pytest

from conftest import (
    alive, finish, kill_all, read_lines, read_receipt, run_supervisor, start_supervisor,
)

PRESERVE = ["--preserve-descendants-on-success"]
# A member of the command's group and a service in a session of its own,
# adopted (setsid -f), each printing its pid; then the command's own ending.
LEAVES = ("sleep 300 & echo member $!; "
          "setsid -f sh -c 'echo $$ > service.pid; echo service $$; exec sleep 300'; "
          "while [ ! -s service.pid ]; do sleep 0.01; done; ")


def leaves_then(ending):
    return ["sh", "-c", LEAVES + ending]


def pids_of(lines):
    return dict((line.split()[0], int(line.split()[1])) for line in lines
                if len(line.split()) == 2 and line.split()[0] in ("member", "service"))


def test_drain_all_is_the_default_and_drains_everything_at_a_natural_exit(paths, containment):
    kind, options = containment
    proc = start_supervisor(*paths.options() + options + ["--"] + leaves_then("exit 0"))
    status, out, err = finish(proc)
    pids = pids_of(out.splitlines())
    assert status == 0, err
    receipt = read_receipt(paths.receipt)
    assert receipt["policy"] == "drain-all" and receipt["containment"] == kind
    assert receipt["cleanup_confirmed"] is True and receipt["preserved"] == []
    assert not any(alive(pid) for pid in pids.values())
    assert set(pids.values()) <= set(p["pid"] for p in receipt["drained"])


def test_drain_all_is_accepted_as_a_synonym_and_two_policies_are_refused(paths):
    result = run_supervisor(*paths.options() + ["--drain-all", "--", "true"])
    assert result.returncode == 0 and read_receipt(paths.receipt)["policy"] == "drain-all"
    result = run_supervisor(*paths.options() + ["--drain-all"] + PRESERVE + ["--", "true"])
    assert result.returncode == 125 and "choose one policy" in result.stderr


def test_keep_services_is_gone_and_says_what_to_use_instead(paths):
    """--keep-services (1.x's default) kept what the command detached, at a
    stop too: gone in 3.2.0. A stop ends every process of the run."""
    result = run_supervisor(*paths.options() + ["--keep-services", "--", "true"])
    assert result.returncode == 125 and result.stderr.count("\n") == 1, result.stderr
    assert "--preserve-descendants-on-success" in result.stderr
    assert not paths.receipt.exists()


def test_preserve_on_success_keeps_everything_after_a_clean_exit(paths, containment):
    """Exit 0, nothing stopped the run: nothing is drained; what lives is
    listed (the member of the command's group too, re-parented to us)."""
    kind, options = containment
    proc = start_supervisor(*paths.options() + options + PRESERVE + ["--"] + leaves_then("exit 0"))
    status, out, err = finish(proc)
    pids = pids_of(out.splitlines())
    try:
        assert status == 0, err
        receipt = read_receipt(paths.receipt)
        assert receipt["policy"] == "preserve-descendants-on-success"
        assert receipt["cleanup_confirmed"] is True and receipt["drained"] == []
        assert all(alive(pid) for pid in pids.values())
        assert sorted(p["pid"] for p in receipt["preserved"]) == sorted(pids.values())
        assert [s["step"] for s in receipt["ladder"]] == []
        if kind == "cgroup":
            assert receipt["kept_cgroup"] == receipt["cgroup"]  # everything kept: the run's own
    finally:
        kill_all(list(pids.values()))


@pytest.mark.parametrize("ending", ["exit 3", "stop"])
def test_preserve_on_success_drains_everything_after_any_other_ending(paths, containment, ending):
    kind, options = containment
    command = leaves_then("echo started; " + ("exit 3" if ending == "exit 3" else "exec sleep 300"))
    proc = start_supervisor(*paths.options(cleanup=1, stop=True) + options + PRESERVE + ["--"]
                            + command)
    lines = read_lines(proc.stdout, 3)
    if ending == "stop":
        paths.stop.write_text("")
    status, out, err = finish(proc)
    pids = pids_of(lines + out.splitlines())
    assert status == (3 if ending == "exit 3" else 124), err
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True and receipt["preserved"] == []
    assert not any(alive(pid) for pid in pids.values())
    assert receipt["kept_cgroup"] is None


def test_preserve_on_success_drains_when_the_stop_file_came_with_the_exit(paths):
    """A stop file there when the command exits 0 is a stop asked for: as
    NeMo Gym's supervisor does, everything is drained."""
    command = leaves_then("touch %s; exit 0" % paths.stop)
    proc = start_supervisor(*paths.options(stop=True) + PRESERVE + ["--"] + command)
    status, out, err = finish(proc)
    pids = pids_of(out.splitlines())
    receipt = read_receipt(paths.receipt)
    assert receipt["stop_reason"] in ("exit", "stop_file"), err
    assert receipt["preserved"] == [] and not any(alive(pid) for pid in pids.values())


def test_a_stop_by_signal_drains_a_detached_service_by_default(paths, containment):
    kind, options = containment
    proc = start_supervisor(*paths.options(cleanup=1) + options + ["--"]
                            + leaves_then("echo started; exec sleep 300"))
    lines = read_lines(proc.stdout, 3)  # member, service, started: in any order
    proc.send_signal(15)
    status, out, err = finish(proc)
    pids = pids_of(lines)
    assert status == 143, err
    receipt = read_receipt(paths.receipt)
    assert receipt["cleanup_confirmed"] is True and receipt["preserved"] == []
    assert not any(alive(pid) for pid in pids.values())
