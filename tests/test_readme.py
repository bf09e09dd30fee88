"""Every example in the README and in docs/recipes.md runs as written: each
`sh` or `python` block is marked, above its fence, either `<!-- example -->`
(run alone), `<!-- example: NAME -->` (run with the other blocks of that
name in the same file, in order, in one directory) or `<!-- not run: why -->`;
an unmarked one fails this test. Each runs in a directory of its own holding
a copy of supervisor.py, as a user who has just copied the file would run
it."""
import os
import re
import shutil
import subprocess

import pytest

from conftest import PY, ROOT, SUPERVISOR, run, wait_until

# The files whose examples run, by their path in the checkout: a group's name
# starts with it, so the names of two files cannot collide.
DOCUMENTS = ("README.md", "docs/recipes.md")
BLOCK = re.compile(r"(?:<!-- (example(?:: [\w-]+)?|not run: [^>]*) -->\n)?```(\w*)\n(.*?)```",
                   re.S)
# Paths the controller's example uses as a sandbox's would: cleared around it.
FIXED_PATHS = ("/tmp/session", "/tmp/process_supervisor.py")


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
    ("-- sh ci-step.sh",
     lambda result, top: " 1 drained" in result.stderr and "tests passed" in result.stdout
     and read_json(top / "runner" / "receipt.json")["cleanup_confirmed"] is True),
    # The owner's teardown ends what the receipt kept.
    ("--end-kept ctl/receipt.json",
     lambda result, top: "all kept processes are gone: ended 1" in result.stderr),
]


def test_every_example_is_marked():
    assert UNMARKED == [], "blocks with no <!-- example --> or <!-- not run -->"
    for document in DOCUMENTS:  # each file has examples that run
        assert any(name.startswith(document + ":") for name in GROUPS), document
    assert len([name for name in GROUPS if name.startswith("README.md:")]) >= 5
    every_code = "".join(code for blocks in GROUPS.values() for _, code in blocks)
    assert all(line in every_code for line, _ in CLAIMS)  # no claim checks nothing


def background_log():
    """What the controller's launch, run in the background, said."""
    try:
        with open("/tmp/session/output.log") as f:
            return f.read()
    except OSError:
        return None


def clear_fixed_paths():
    for path in FIXED_PATHS:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_the_example_runs_as_written(name, tmp_path):
    here = tmp_path / "checkout"  # as a CI job's: RUNNER_TEMP is outside it
    here.mkdir()
    shutil.copy(SUPERVISOR, str(here / "supervisor.py"))
    (tmp_path / "runner").mkdir()
    env = dict(os.environ, RUNNER_TEMP=str(tmp_path / "runner"), PYTHONPATH=str(here))
    # Only an example that uses the fixed paths clears them: another one, on
    # the other worker, must not pull them from under it.
    fixed = any(path in code for _, code in GROUPS[name] for path in FIXED_PATHS)
    if fixed:
        clear_fixed_paths()
    try:
        for language, code in GROUPS[name]:
            argv = ["bash", "-c", code] if language == "sh" else [PY, "-c", code]
            result = run(argv, cwd=str(here), env=env, stdout=subprocess.PIPE)
            assert result.returncode == 0, (code, result.stdout, result.stderr, background_log())
            for line, holds in CLAIMS:
                if line in code:
                    assert holds(result, tmp_path), (code, result.stdout, result.stderr)
        # What an example left in the background (the controller's launch) ends.
        assert not fixed or wait_until(lambda: not os.path.exists("/tmp/session/supervisor.pid")
                                       or os.path.exists("/tmp/session/cleanup.json"))
    finally:
        if fixed:
            clear_fixed_paths()
