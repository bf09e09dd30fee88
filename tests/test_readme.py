"""Every example in the README and in docs/recipes.md runs as written: each
`sh` or `python` block is marked, above its fence, either `<!-- example -->`
(run alone), `<!-- example: NAME -->` (run with the other blocks of that
name in the same file, in order, in one directory) or `<!-- not run: why -->`;
an unmarked one fails this test. Each runs in a directory of its own holding
a copy of supervisor.py (and of scripts/build_pyz.py), as a user who has
just copied the file would run it, with a TMPDIR of its own; and leaves
nothing in that directory. Each also runs twice in a row in one directory,
as a user who reruns it: the second time it passes, or says what to do. No
wait in a block is unbounded. The controller's recipe (launch, stop) is run
as its user would: twice, after a refused launch, and launched again as the
refusal says. The Kubernetes recipe's manifest is parsed, and its numbers
checked against the stop's bound."""
import filecmp
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import PY, ROOT, SUPERVISOR, run, wait_until

import supervisor  # noqa: E402  (exec_timeout, parse_duration: no run in-process)

# The files whose examples run, by their path in the checkout: a group's name
# starts with it, so the names of two files cannot collide.
DOCUMENTS = ("README.md", "docs/recipes.md")
BLOCK = re.compile(r"(?:<!-- (example(?:: [\w-]+)?|not run: [^>]*) -->\n)?```(\w*)\n(.*?)```",
                   re.S)


def examples():
    """{name: [(language, code)]}, in each file's order; a block run alone
    gets a name of its own. A name is "FILE:NAME" (FILE:block-N for a block
    run alone, N its place in FILE)."""
    groups, unmarked = {}, []
    for document in DOCUMENTS:
        with open(os.path.join(ROOT, document)) as f:
            text = f.read()
        for number, (marker, language, code) in enumerate(BLOCK.findall(text)):
            if language not in ("sh", "python"):
                continue
            if not marker:
                unmarked.append("%s: %s" % (document, code.splitlines()[0]))
            elif marker.startswith("example"):
                name = marker.partition(": ")[2] or "block-%d" % number
                groups.setdefault("%s:%s" % (document, name), []).append((language, code))
    return groups, unmarked


GROUPS, UNMARKED = examples()


def read_json(path):
    import json
    with open(str(path)) as f:
        return json.load(f)


# What an example says it does, checked beyond its exit status: (a line of
# its code, what must hold of (result, tmp_path)).
CLAIMS = [
    # Under GNU timeout: at our own deadline, the status is ours.
    ("timeout -k 60 100 python3 supervisor.py",
     lambda result, top: "exit status 124" in result.stdout),
    # The CI step's test server is drained when the step ends, and -v says so.
    ('-- sh "$RUNNER_TEMP/step.sh"',
     lambda result, top: " 1 drained" in result.stderr and "tests passed" in result.stdout
     and read_json(top / "runner" / "receipt.json")["cleanup_confirmed"] is True),
    # The owner's teardown ends what the receipt kept.
    ('--end-kept "$top/receipt.json"',
     lambda result, top: "all kept processes are gone: ended 1" in result.stderr),
]


def test_every_example_is_marked():
    assert UNMARKED == [], "blocks with no <!-- example --> or <!-- not run -->"
    for document in DOCUMENTS:  # each file has examples that run
        assert any(name.startswith(document + ":") for name in GROUPS), document
    assert len([name for name in GROUPS if name.startswith("README.md:")]) >= 5
    every_code = "".join(code for blocks in GROUPS.values() for _, code in blocks)
    assert all(line in every_code for line, _ in CLAIMS)  # no claim checks nothing


def checkout(tmp_path):
    """A user's directory: the copied file (and the pyz builder), a TMPDIR
    and a CI runner's temporary directory beside it, outside it."""
    here = tmp_path / "checkout"  # as a CI job's: RUNNER_TEMP is outside it
    (here / "scripts").mkdir(parents=True)
    shutil.copy(SUPERVISOR, str(here / "supervisor.py"))
    shutil.copy(os.path.join(ROOT, "scripts", "build_pyz.py"), str(here / "scripts"))
    for name in ("runner", "tmp"):
        (tmp_path / name).mkdir()
    env = dict(os.environ, RUNNER_TEMP=str(tmp_path / "runner"), TMPDIR=str(tmp_path / "tmp"),
               PYTHONPATH=str(here))
    return here, env


def run_example(language, code, here, env):
    argv = ["bash", "-c", code] if language == "sh" else [PY, "-c", code]
    return run(argv, cwd=str(here), env=env, stdout=subprocess.PIPE)


def session_log(tmp_path):
    """What the controller's launch, run in the background, said."""
    try:
        with open(str(tmp_path / "tmp" / "session" / "output.log")) as f:
            return f.read()
    except OSError:
        return None


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_the_example_runs_as_written(name, tmp_path):
    here, env = checkout(tmp_path)
    session = tmp_path / "tmp" / "session"
    for language, code in GROUPS[name]:
        result = run_example(language, code, here, env)
        assert result.returncode == 0, (code, result.stdout, result.stderr, session_log(tmp_path))
        for line, holds in CLAIMS:
            if line in code:
                assert holds(result, tmp_path), (code, result.stdout, result.stderr)
    # What an example left in the background (the controller's launch) ends.
    assert wait_until(lambda: launch_settled(session))
    assert sorted(os.listdir(str(here))) == ["scripts", "supervisor.py"]  # nothing left there
    assert os.listdir(str(here / "scripts")) == ["build_pyz.py"]


def launch_settled(session):
    """The controller's launch claimed nothing, or its run wrote its receipt."""
    return not os.path.lexists(str(session / "launch.claim")) or (session / "cleanup.json").exists()


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_the_example_runs_twice_in_a_row(name, tmp_path):
    """A user who runs an example again, in the same directory with the same
    TMPDIR: each block passes again (the controller's second launch is
    refused, and says what to remove: the tests below), its claims hold, and
    nothing ends in a traceback."""
    here, env = checkout(tmp_path)
    session = tmp_path / "tmp" / "session"
    for round in (1, 2):
        for language, code in GROUPS[name]:
            result = run_example(language, code, here, env)
            assert result.returncode == 0 and "Traceback" not in result.stderr, (
                round, code, result.stdout, result.stderr, session_log(tmp_path))
            for line, holds in CLAIMS:
                if line in code:
                    assert holds(result, tmp_path), (round, code, result.stdout, result.stderr)
        assert wait_until(lambda: launch_settled(session))
    assert sorted(os.listdir(str(here))) == ["scripts", "supervisor.py"]
    assert os.listdir(str(here / "scripts")) == ["build_pyz.py"]


# A wait in a shell block: a loop on a condition. Bounded ones count (for i
# in $(seq N)); `until` and `while` have no bound of their own.
UNBOUNDED_WAIT = re.compile(r"^\s*(until|while)\b", re.M)


def test_no_wait_in_a_documented_shell_block_is_unbounded():
    found = []
    for document in DOCUMENTS:
        with open(os.path.join(ROOT, document)) as f:
            text = f.read()
        for _, language, code in BLOCK.findall(text):
            if language == "sh":
                found += ["%s: %s" % (document, line.strip()) for line in code.splitlines()
                          if UNBOUNDED_WAIT.match(line)]
    assert found == [], "bound these waits (for i in $(seq N); do ... && break; ...; done)"


# --- The controller's recipe, as its user runs it ------------------------------------------------

def controller(tmp_path):
    """The checkout, its environment, the session directory, and the
    recipe's two blocks as runnable steps: launch() and stop() return the
    finished block (text)."""
    here, env = checkout(tmp_path)
    (_, launch_code), (_, stop_code) = GROUPS["docs/recipes.md:controller"]
    session = tmp_path / "tmp" / "session"

    def step(code):
        def run_it():
            return run_example("sh", code, here, env)
        return run_it
    return here, env, session, step(launch_code), step(stop_code)


def receipt_of(session):
    return read_json(session / "cleanup.json")


def test_the_controllers_blocks_signal_no_pid():
    """As root a pid read from a file may be anybody's by the time it is
    read (the run ended, or its launch was refused): the recipe stops by the
    stop file alone, and neither block signals or writes a pid."""
    for _, code in GROUPS["docs/recipes.md:controller"]:
        assert not re.search(r"\bkill\b|\$\$|\.pid\b", code), code


def test_the_controllers_launch_is_quiet_and_builds_the_pyz_once(tmp_path):
    """All well, the launch prints nothing; the pyz is built at the first
    launch only, and again when supervisor.py changes (--check)."""
    here, env, session, launch, stop = controller(tmp_path)
    pyz = tmp_path / "tmp" / "treereap.pyz"
    first = launch()
    assert first.returncode == 0 and first.stderr == "" and first.stdout == "", first
    built = pyz.stat()
    assert stop().returncode == 0
    for name in ("launch.claim", "stop.request", "cleanup.json", "output.log"):
        os.unlink(str(session / name))
    again = launch()
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert (pyz.stat().st_ino, pyz.stat().st_mtime_ns) == (built.st_ino, built.st_mtime_ns)
    assert stop().returncode == 0
    for name in ("launch.claim", "stop.request", "cleanup.json", "output.log"):
        os.unlink(str(session / name))
    with open(str(here / "supervisor.py"), "a") as f:
        f.write("# changed\n")
    changed = launch()
    assert changed.returncode == 0 and changed.stderr == "", changed.stderr
    assert pyz.stat().st_mtime_ns != built.st_mtime_ns
    assert run([PY, str(here / "scripts" / "build_pyz.py"), "-q", "--check", str(pyz)],
               cwd=str(here)).returncode == 0  # built from the changed file
    assert filecmp.cmp(str(pyz), str(session / "treereap.pyz"), shallow=False)  # and copied in
    assert stop().returncode == 0


def test_the_controllers_recipe_twice_says_what_to_remove_and_then_works_again(tmp_path):
    """Launch, stop, launch, stop: the second launch starts nothing and names
    every file the first left (but the pyz, which is reused); the stop after
    it judges the first run's receipt, untouched, and signals nothing.
    Removing what it names, the launch and the stop work again: a new run,
    its command ran and was stopped."""
    here, env, session, launch, stop = controller(tmp_path)
    assert launch().returncode == 0 and stop().returncode == 0
    first = (session / "cleanup.json").read_bytes()
    left = sorted(os.listdir(str(session)))
    refused = launch()
    assert "was launched before" in refused.stderr, refused.stderr
    named = [name for name in left if name in refused.stderr]
    assert sorted(set(left) - set(named)) == ["treereap.pyz"], (left, refused.stderr)
    assert "Traceback" not in refused.stderr
    after = stop()
    assert after.returncode == 0 and after.stderr == "", after.stderr
    assert (session / "cleanup.json").read_bytes() == first  # no run wrote it again
    assert sorted(os.listdir(str(session))) == left
    for name in named:  # as told
        os.unlink(str(session / name))
    assert launch().stderr == ""
    result = stop()
    assert result.returncode == 0 and result.stderr == "", result.stderr
    second = receipt_of(session)
    assert (session / "cleanup.json").read_bytes() != first
    assert second["cleanup_confirmed"] is True and second["stop_reason"] == "stop_file"
    assert second["return_code"] == -signal.SIGTERM, second  # the command ran, and was stopped


def test_a_launch_while_the_run_lives_is_refused_and_the_stop_ends_that_run(tmp_path):
    """Launch, launch again before any stop, stop: the second launch starts
    nothing and says to stop the run first; the stop ends the first run,
    confirmed, at once (no wait for a receipt that never comes, no
    traceback), and nothing of it is left."""
    here, env, session, launch, stop = controller(tmp_path)
    assert launch().returncode == 0
    assert wait_until(lambda: "task started" in (session_log(tmp_path) or ""), timeout=60)
    refused = launch()
    assert "stop that run" in refused.stderr and "was launched before" in refused.stderr, \
        refused.stderr
    started = time.monotonic()
    result = stop()
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert time.monotonic() - started < 30  # the receipt came: no wait ran out
    receipt = receipt_of(session)
    assert receipt["cleanup_confirmed"] is True and receipt["return_code"] == -signal.SIGTERM
    assert receipt["stop_reason"] == "stop_file"
    assert session_log(tmp_path).count("task started") == 1  # one run, the first


def test_the_controllers_check_fails_when_the_command_never_ran(tmp_path):
    """A stop that lands before the command starts: the receipt confirms
    (nothing ran) with return_code null, and the recipe's check fails."""
    here, env = checkout(tmp_path)
    launch, stop = GROUPS["docs/recipes.md:controller"]
    session = tmp_path / "tmp" / "session"
    session.mkdir()
    (session / "stop.request").write_text("")  # the stop came before the launch's first look
    assert run_example(launch[0], launch[1], here, env).returncode == 0
    check = stop[1][stop[1].index("python3 - "):]
    assert wait_until((session / "cleanup.json").exists)
    result = run_example("sh", 'session="${TMPDIR:-/tmp}/session"\n' + check, here, env)
    assert result.returncode == 1 and "the command never ran" in result.stderr, result.stderr


def kubernetes_manifest():
    import yaml
    with open(os.path.join(ROOT, "docs", "recipes.md")) as f:
        text = f.read()
    block = re.search(r"<!-- checked: tests/test_readme.py parses this manifest[^>]*-->\n"
                      r"```yaml\n(.*?)```", text, re.S)
    return yaml.safe_load(block.group(1))


# The recipe's allowance for a pod's start (scheduling, the image pull, the
# init container), as docs/recipes.md says.
POD_START = 60


def job_backoffs(limit):
    """The Job controller's delays before its retries: 10 s, doubled each
    time, at most six minutes (Kubernetes' Job documentation, "Pod backoff
    failure policy")."""
    return sum(min(10 * 2 ** n, 360) for n in range(limit))


def what_does_not_add_up(job):
    """The Kubernetes recipe's bounds, checked on a manifest: what fails."""
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    argv = [c for c in pod["containers"] if c["name"] == "task"][0]["command"]
    timeout = supervisor.parse_duration(argv[argv.index("--timeout") + 1])
    cleanup = float(argv[argv.index("-k") + 1])
    grace, wrong = pod.get("terminationGracePeriodSeconds", 30), []
    # The kubelet's stop: its SIGKILL comes after the grace. With
    # --stop-timeout the supervisor's stop from outside is done within it.
    if "--stop-timeout" in argv:
        stop = supervisor.parse_duration(argv[argv.index("--stop-timeout") + 1])
    else:
        stop = supervisor.exec_timeout(0, cleanup)
    if grace < stop:
        wrong.append("terminationGracePeriodSeconds %s < the stop's %s s" % (grace, stop))
    # The Job's deadline counts across every attempt: each one's bound, the
    # back-offs between them.
    attempts = spec.get("backoffLimit", 6) + 1
    needed = attempts * (supervisor.exec_timeout(timeout, cleanup) + POD_START) + job_backoffs(
        attempts - 1)
    if spec.get("activeDeadlineSeconds", needed) < needed:
        wrong.append("activeDeadlineSeconds %s < %s attempts: %s s" % (
            spec["activeDeadlineSeconds"], attempts, needed))
    return wrong


def test_the_kubernetes_manifest_gives_the_stop_its_bound():
    job = kubernetes_manifest()
    assert what_does_not_add_up(job) == []
    # The check fails where the numbers do not add up: the grace below the
    # stop's, the Job's deadline for one attempt (the recipe's before #38),
    # or for one retry fewer than backoffLimit gives.
    import copy
    for change in ({"grace": 29}, {"deadline": 1950}, {"backoffLimit": 3}):
        wrong = copy.deepcopy(job)
        if "grace" in change:
            wrong["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = change["grace"]
        if "deadline" in change:
            wrong["spec"]["activeDeadlineSeconds"] = change["deadline"]
        if "backoffLimit" in change:
            wrong["spec"]["backoffLimit"] = change["backoffLimit"]
        assert what_does_not_add_up(wrong) != [], change
    pod = job["spec"]["template"]["spec"]
    task = [c for c in pod["containers"] if c["name"] == "task"][0]
    argv = task["command"]
    # The file the task runs is the one the init container copies in.
    init = pod["initContainers"][0]
    assert argv[:2] == ["python3", init["command"][-1]] and argv[1].endswith("treereap.pyz")
    mounts = dict((m["name"], m["mountPath"]) for m in task["volumeMounts"])
    assert mounts[init["volumeMounts"][0]["name"]] == os.path.dirname(argv[1])
    assert "--summary" in argv and argv[argv.index("--summary") + 1] == "/dev/termination-log"
    # One receipt per attempt, on the receipts volume: the pod's name, from
    # the downward API, which the kubelet expands in the command.
    receipt = argv[argv.index("--receipt") + 1]
    assert receipt == mounts["receipts"] + "/$(POD_NAME).json", receipt
    env = dict((e["name"], e) for e in task["env"])
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Each rule says only what its exit codes mean: 137 is claimed by none.
    rules = job["spec"]["podFailurePolicy"]["rules"]
    codes = dict((rule["action"], rule["onExitCodes"]["values"]) for rule in rules
                 if "onExitCodes" in rule)
    assert codes == {"FailJob": [125], "Count": [124]}
    assert any(rule["action"] == "Ignore" and rule["onPodConditions"] == [
        {"type": "DisruptionTarget"}] for rule in rules)
    assert pod["restartPolicy"] == "Never"  # (podFailurePolicy requires it)
