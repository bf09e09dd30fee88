"""Random process trees, stopped by force: afterwards nothing of the tree is
alive, whatever the policy (a stop keeps nothing, not even with
--preserve-descendants-on-success), and the receipt says the cleanup was
confirmed: processes in groups and sessions of their own, detached (adopted
before the stop), exiting early (their children adopted), ignoring SIGTERM.
"""
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import alive, finish, kill_pinned, read_receipt, start_tree, wait_until


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


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(nodes(), st.booleans())
def test_a_forced_stop_leaves_nothing_of_any_tree(tmp_path_factory, spec, preserving):
    root = name_nodes(spec)
    paths = tmp_path_factory.mktemp("tree")
    receipt_path, stop, work = paths / "out" / "receipt.json", paths / "stop", paths / "work"
    work.mkdir()
    proc, pids = start_tree(root, "--timeout", "60", "--cleanup-timeout", "0.3",
                            "--workdir", work, "--receipt", receipt_path, "--stop-file", stop,
                            *(["--preserve-descendants-on-success"] if preserving else []))
    early = [pids[n["name"]] for n in walk(root) if n.get("exit_early")]
    assert wait_until(lambda: not any(alive(pid) for pid in early))
    stop.write_text("")
    status, _, err = finish(proc)
    try:
        assert status == (137 if root["ignore_term"] else 124), err  # 137: SIGKILLed
        receipt = read_receipt(receipt_path)
        assert receipt["cleanup_confirmed"] is True and receipt["preserved"] == []
        assert sorted(name for name, pid in pids.items() if alive(pid)) == []
    finally:
        for pid in pids.values():
            kill_pinned(pid)
