"""Random process trees, stopped by force: afterwards, with --keep-services,
exactly the detached services adopted before the stop (with their
descendants) are alive and the receipt lists them; by default nothing is.
Either way the receipt says the cleanup was confirmed.

What must survive is computed from the tree's spec alone, by the rules the
README states, not by asking the supervisor.
"""
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import KEEP, alive, finish, kill_pinned, read_receipt, start_tree, wait_until


@st.composite
def nodes(draw, depth=0):
    node = {"ignore_term": draw(st.booleans())}
    if depth > 0:  # the root is the command: it leads its group already, and
        # neither moves, detaches nor exits early
        placement = draw(st.sampled_from(["inherit", "inherit", "group", "session"]))
        if placement != "inherit":
            node[placement] = True
        node["detach"] = draw(st.booleans())
        node["exit_early"] = draw(st.integers(0, 3)) == 0
    width = draw(st.integers(0, 3 if depth == 0 else 2)) if depth < 3 else 0
    node["children"] = [draw(nodes(depth + 1)) for _ in range(width)]
    return node


def name_nodes(node, name="n"):
    node["name"] = name
    for i, child in enumerate(node["children"]):
        name_nodes(child, "%s.%d" % (name, i))
    return node


def walk(node):
    yield node
    for child in node["children"]:
        for found in walk(child):
            yield found


def expected_survivors(root):
    """(preserved, all that must stay alive) by the rules: a node is adopted
    before the stop when it detached or its parent exited early; it is
    preserved when it is also alive and outside the command's process group;
    everything under a preserved service is left alone; the rest is drained."""
    preserved, keep = [], []

    def visit(node, parent, in_group, kept):
        in_group = in_group and not (node.get("session") or node.get("group"))
        adopted = parent is not None and (node.get("detach") or parent.get("exit_early"))
        if adopted and not in_group and not node.get("exit_early"):
            preserved.append(node["name"])  # our child at the stop, outside the group
            kept = True
        if kept and not node.get("exit_early"):
            keep.append(node["name"])
        for child in node["children"]:
            visit(child, node, in_group, kept)

    visit(root, None, True, False)
    return preserved, keep


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(nodes(), st.booleans())
def test_forced_stop_keeps_exactly_the_detached_services(tmp_path_factory, spec, keeping):
    root = name_nodes(spec)
    paths = tmp_path_factory.mktemp("tree")
    receipt_path, stop, work = paths / "out" / "receipt.json", paths / "stop", paths / "work"
    work.mkdir()
    proc, pids = start_tree(root, "--timeout", "60", "--cleanup-timeout", "0.3",
                            "--workdir", work, "--receipt", receipt_path, "--stop-file", stop,
                            *(KEEP if keeping else []))
    early = [pids[n["name"]] for n in walk(root) if n.get("exit_early")]
    assert wait_until(lambda: not any(alive(pid) for pid in early))
    stop.write_text("")
    status, _, err = finish(proc)
    preserved, keep = expected_survivors(root) if keeping else ([], [])
    try:
        assert status == (137 if root["ignore_term"] else 124), err  # 137: SIGKILLed
        receipt = read_receipt(receipt_path)
        assert receipt["cleanup_confirmed"] is True
        assert sorted(p["pid"] for p in receipt["preserved"]) == sorted(pids[n] for n in preserved)
        alive_now = sorted(name for name, pid in pids.items() if alive(pid))
        assert alive_now == sorted(keep)
    finally:
        for name in keep:
            kill_pinned(pids[name])
        wait_until(lambda: not any(alive(pids[name]) for name in keep))
