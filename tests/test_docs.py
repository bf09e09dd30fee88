"""Every relative link in the documents leads somewhere: README.md,
CHANGELOG.md and every docs/*.md are read, each markdown link
`[text](target)` that is not http(s) or mailto is followed, and the test
fails when the target file does not exist or, for `file.md#anchor` and
`#anchor`, when the anchor is not the GitHub slug of a heading of that file.
Links inside fenced code blocks and inline code are not links.

And the docs in one voice (#38): no current document (the README, docs/)
describes a rule the old way (RETIRED: each retired phrasing beside the rule
that replaced it), names a test that does not exist, or an option that
`--help` does not know; every option has a row in the reference's table,
whose defaults, and --help's, are the parser's; the README's exit statuses
and receipt keys are the reference's."""
import glob
import os
import re

import pytest

from conftest import ROOT

DOCUMENTS = sorted(["README.md", "CHANGELOG.md"] + [
    os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md"))])
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)[ \t#]*$", re.M)


def prose(path):
    """The text of a document, fenced code blocks removed."""
    with open(os.path.join(ROOT, path)) as f:
        return FENCE.sub("", f.read())


def slug(heading):
    """GitHub's anchor for a heading: lowercase; every character but
    letters, digits, spaces, hyphens and underscores dropped; spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors of a document's headings; a heading seen before gets
    -1, -2... as on GitHub."""
    found, seen = set(), {}
    for heading in HEADING.findall(prose(path)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else "%s-%d" % (base, count))
    return found


def links(path):
    """The relative links of a document: [(target)]."""
    text = INLINE_CODE.sub("", prose(path))
    return [target for target in LINK.findall(text)
            if not re.match(r"(?i)(https?:|mailto:)", target)]


def test_the_slug_is_githubs():
    assert slug("The owner's teardown: --end-kept") == "the-owners-teardown---end-kept"
    assert slug("GNU timeout: what is the same, what differs") == \
        "gnu-timeout-what-is-the-same-what-differs"
    assert slug("An RL controller (NeMo Gym)") == "an-rl-controller-nemo-gym"
    assert slug("3.1.0") == "310"


def test_the_documents_are_read():
    assert "docs/recipes.md" in DOCUMENTS and "docs/reference.md" in DOCUMENTS
    assert all(links(path) for path in ("README.md", "docs/reference.md"))


@pytest.mark.parametrize("path", DOCUMENTS)
def test_every_relative_link_leads_somewhere(path):
    broken = []
    for target in links(path):
        name, _, anchor = target.partition("#")
        destination = os.path.normpath(os.path.join(os.path.dirname(path), name)) if name else path
        if not os.path.exists(os.path.join(ROOT, destination)):
            broken.append("%s: no such file" % target)
        elif anchor and destination.endswith(".md") and anchor not in anchors(destination):
            broken.append("%s: no heading %r in %s" % (target, anchor, destination))
    assert broken == [], "%s: broken links:\n%s" % (path, "\n".join(broken))


# --- The map at the top of supervisor.py ---------------------------------------------------------

def index_rows():
    """[(section title, [names])] from the module docstring's index: a row
    is a title, two spaces or more, then names separated by commas (a
    parenthesised note after a name is prose); a row that starts with
    spaces only continues the one above."""
    import ast
    with open(os.path.join(ROOT, "supervisor.py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    block = doc.split("The file, top to bottom", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in block.splitlines():
        title, names = (re.split(r"\s{2,}", line.strip(), 1) + [""])[:2] if not line.startswith(
            " " * 10) else ("", line.strip())
        names = [name.strip() for name in re.sub(r"\([^)]*\)", "", names).split(",")
                 if name.strip()]
        if title:
            rows.append((title, names))
        else:
            rows[-1][1].extend(names)
    return rows


def sections():
    """[(banner title, [top-level names defined below it])], in file order."""
    import ast
    with open(os.path.join(ROOT, "supervisor.py")) as f:
        source = f.read()
    banners = [(m.start(), m.group(1)) for m in re.finditer(r"^# --- (.*?) -+$", source, re.M)]
    found = [(title, []) for _, title in banners]
    starts = [source[:offset].count("\n") + 1 for offset, _ in banners]
    for node in ast.parse(source).body:
        names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
            t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        below = [i for i, line in enumerate(starts) if line < node.lineno]
        if below:
            found[below[-1]][1].extend(names)
    return found


def test_the_index_names_every_section_and_its_entry_points_in_file_order():
    rows, banners = index_rows(), sections()
    assert [title for title, _ in rows] == [title for title, _ in banners]
    assert all(named for _, named in rows), "a section of the index names no entry point"
    for (title, named), (_, defined) in zip(rows, banners):
        missing = [name for name in named if name not in defined]
        assert missing == [], "the index names %s under %r, which does not define them" % (
            missing, title)
        where = [defined.index(name) for name in named]
        assert where == sorted(where), "the index lists %r out of the file's order: %s" % (
            title, named)


# --- Every key a receipt holds is in the reference's table ---------------------------------------

def receipt_table():
    """{key: the meaning's text} from the rows of docs/reference.md's
    receipt table (a row may name several keys, each in backticks)."""
    with open(os.path.join(ROOT, "docs", "reference.md")) as f:
        text = f.read().split("\n## The receipt\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) >= 3:
            for key in re.findall(r"`([a-z_]+)`", cells[0]):
                rows[key] = " | ".join(cells[2:])
    return rows


def written_keys(options, command):
    """{where: set of keys} of the receipt a run writes: the top level, and
    the keys of each object and of each list's entries below it; and the
    receipt."""
    from conftest import read_receipt, run_supervisor
    receipt_path = options[options.index("--receipt") + 1]
    result = run_supervisor(*options + ["--"] + command)
    assert result.returncode in (0, 124), result.stderr
    receipt = read_receipt(receipt_path)
    found = {"": set(receipt)}
    for key, value in receipt.items():
        for entry in value if isinstance(value, list) else [value]:
            if isinstance(entry, dict):
                found.setdefault(key, set()).update(entry)
                for inner, deeper in entry.items():
                    if isinstance(deeper, dict):
                        found.setdefault(inner, set()).update(deeper)
    return found, receipt


def test_every_key_a_receipt_holds_is_documented(paths, tmp_path):
    """Runs that fill the receipt's objects and lists (a kept process, a
    drain, the output cap, a limit where a cgroup takes one), and each key
    they write, at the top or inside an object or a list's entries, is named
    in the reference's table: a top-level key in its first column, a key
    below it in its row's meaning."""
    from conftest import HAS_CGROUP, kill_all
    table, found = receipt_table(), {}
    kept_run = paths.options() + ["--preserve-descendants-on-success"]
    keys, receipt = written_keys(kept_run, ["sh", "-c", "setsid -f sleep 300 >/dev/null 2>&1"])
    kill_all([p["pid"] for p in receipt["preserved"]])
    stopped_run = paths.options(timeout=0.5) + [
        "--output", str(tmp_path / "run.log"), "--max-output", "1K"] + (
            ["--cpu-time", "60"] if HAS_CGROUP else [])
    more, _ = written_keys(stopped_run, ["sh", "-c", "echo out; sleep 300 & exec sleep 300"])
    for where, each in list(keys.items()) + list(more.items()):
        found.setdefault(where, set()).update(each)
    assert found[""] == set(table), "keys written but not documented: %s; documented but " \
        "not written: %s" % (sorted(found[""] - set(table)), sorted(set(table) - found[""]))
    assert {"ladder", "preserved", "drained", "usage", "output", "namespaces"} <= set(found)
    for where, each in found.items():
        if where:
            meaning = table.get(where) or next(text for text in table.values()
                                               if "`%s`" % where in text)
            missing = [key for key in each if '"%s"' % key not in meaning
                       and "`%s`" % key not in meaning]
            assert missing == [], "%s: %s written, not in its row" % (where, missing)


# --- The docs in one voice ------------------------------------------------------------------------
#
# A rule the code changed must not be described the old way anywhere. The
# documents a user reads for what holds now: the README and docs/ (the
# CHANGELOG is history: it says what each version did, old rules included).

CURRENT = [path for path in DOCUMENTS if path != "CHANGELOG.md"]

# Retired phrasings: (a regex no current document may match, the rule that
# replaced it, where that rule is stated). Add a row whenever a rule changes.
RETIRED = [
    (r"(?i)\bend(?:s|ed)?\b[^.|]{0,80}\bminute old",
     "a killed supervisor's run is ended by the next supervisor at once (3.2.0); only an "
     "unmarked, empty cgroup waits 60 s to be removed",
     "docs/reference.md#containment"),
    (r"(?i)maker's pid,? (?:and )?start time|mark's pid and start time"
     r"|pid, start time and PID namespace",
     "whether a cgroup's maker lives is its flock on the cgroup's cgroup.kill, from any PID or "
     "time namespace; marks are one word (b53cd13, #37 items 2-4)",
     "docs/reference.md#containment"),
    (r"(?i)started before its maker did",
     "a leftover run is left alone when it holds a process that started before the cgroup "
     "last changed (st_ctime), not before its maker (#37 item 3: start time 0 passed)",
     "docs/reference.md#containment"),
    (r"(?i)disk the receipt shares \(then no receipt",
     "the receipt's room is reserved at the start: a full disk cannot cost it, but where the "
     "filesystem makes no unnamed file (dfeea73, #37 item 6)",
     "docs/reference.md#the-receipt"),
    (r"(?i)README'?s controller recipe|controller removes it before each launch",
     "the controller's recipe is in docs/recipes.md, and it launches only where no receipt is "
     "(it refuses a session directory used before; #38 item 2)",
     "docs/recipes.md#an-rl-controller-nemo-gym"),
    (r"(?i)kill -TERM \"\$\(cat",
     "a recipe never signals a pid read from a file: as root it may be anybody's by then; the "
     "stop file alone stops the run (#38 item 2)",
     "docs/recipes.md#an-rl-controller-nemo-gym"),
]


def text_of(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_the_retired_table_is_sound():
    for pattern, rule, where in RETIRED:
        re.compile(pattern)
        name, _, anchor = where.partition("#")
        assert os.path.exists(os.path.join(ROOT, name)) and anchor in anchors(name), where
        assert not re.search(pattern, rule), "the new rule matches its own retired phrasing"


@pytest.mark.parametrize("path", CURRENT)
def test_no_rule_is_described_the_old_way(path):
    text, found = text_of(path), []
    for pattern, rule, where in RETIRED:
        for match in re.finditer(pattern, text):
            line = text.count("\n", 0, match.start()) + 1
            found.append("%s:%d: %r: now %s (%s)" % (path, line, match.group(0), rule, where))
    assert found == [], "described the old way:\n" + "\n".join(found)


# Every test a document names exists: a test renamed when its rule changed
# leaves the old name behind, with the old rule beside it.
TEST_NAME = re.compile(r"\btest_\w+")


def defined_tests():
    names = set()
    for path in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True):
        names.add(os.path.basename(path)[:-3])
        with open(path) as f:
            names.update(re.findall(r"^\s*def (test_\w+)", f.read(), re.M))
    return names


@pytest.mark.parametrize("path", CURRENT)
def test_every_test_a_document_names_exists(path):
    known = defined_tests()
    missing = sorted(set(name for name in TEST_NAME.findall(text_of(path)) if name not in known))
    assert missing == [], "%s names tests that do not exist: %s" % (path, missing)


# No document runs the supervisor with the current directory (or PYTHONPATH)
# first on the module path (#37 item 9): `PYTHONPATH=DIR python3 -m
# supervisor`, launched as root from a directory the sandbox can write, runs
# a planted supervisor.py as root. `-I` (isolated) or `-P` (3.11+) is safe.
MODULE_RUN = re.compile(r"\bpython[\d.]*((?:\s+-[A-Za-z]+)*)\s+-m\s*(?:supervisor|treereap)\b")
PYTHONPATH_RUN = re.compile(r"\bPYTHONPATH=\S*\s+(?:\S*/)?python[\d.]*((?:\s+-[A-Za-z]+)*)")


def unsafe_module_runs(text):
    """Where a text runs the module, or python under PYTHONPATH, without -I
    or -P (a run may wrap across lines, as prose does): [(line number, the
    run)]."""
    found = set()
    for pattern in (MODULE_RUN, PYTHONPATH_RUN):
        for match in pattern.finditer(text):
            flags = "".join(flag.lstrip("-") for flag in match.group(1).split())
            if "I" not in flags and "P" not in flags:
                found.add((text.count("\n", 0, match.start()) + 1,
                           " ".join(match.group(0).split())))
    return sorted(found)


def test_the_unsafe_module_run_is_recognised():
    for text in ("PYTHONPATH=DIR python3 -m supervisor --timeout 5 -- true",
                 "(`PYTHONPATH=DIR python3 -m\nsupervisor ...`)", "`python3 -m treereap ...`",
                 "python3 -u -m supervisor", "env PYTHONPATH=/opt/x /usr/bin/python3.11 x.py"):
        assert set(line for line, _ in unsafe_module_runs(text)) == {1}, text
    for text in ("python3 -I -m supervisor", "python3 -P -m treereap", "python3 -Im supervisor",
                 "PYTHONPATH=x python3 -I supervisor.py", "python3 -m pip install .",
                 "python3 -I treereap.pyz", ".venv/bin/python -m pytest"):
        assert unsafe_module_runs(text) == [], text


@pytest.mark.parametrize("path", CURRENT)
def test_no_document_runs_the_module_from_the_current_directory(path):
    found = unsafe_module_runs(text_of(path))
    assert found == [], "%s: runs the module with the current directory or PYTHONPATH first " \
        "on the module path (a planted supervisor.py runs in its place): give python -I " \
        "(or -P, 3.11+):\n%s" % (path, "\n".join("%d: %s" % entry for entry in found))


# --- Options: the documents, --help and the parser say the same --------------------------------

def help_text():
    import subprocess
    from conftest import PY, SOURCE
    result = subprocess.run([PY, SOURCE, "--help"], stdout=subprocess.PIPE,
                            universal_newlines=True, timeout=60)
    assert result.returncode == 0
    return result.stdout


LONG_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# Options the documents name that are not ours: {option: the tool}. An option
# of our own scripts is checked against that script's --help.
OTHER_TOOLS = {
    "--cap-add": "docker run", "--init": "docker run", "--name": "docker run",
    "--privileged": "docker run", "--rm": "docker run", "--security-opt": "podman run",
    "--rootfs": "podman run", "--runtime": "podman run", "--format": "podman inspect", "--cgroup": "runc/crun exec",
    "--fork": "unshare", "--kill-child": "unshare", "--pid": "unshare",
    "--mount-proc": "unshare", "--scope": "systemd-run",
    "--entrypoint": "docker run", "--memory": "docker run", "--network": "docker run",
    "--pids-limit": "docker run", "--read-only": "docker run",
    "--grace-period": "kubectl delete", "--disable-status": "srun", "--time": "sbatch/srun",
    "--no-wait": "ray job submit", "--submission-id": "ray job submit",
    "--working-dir": "ray job submit", "--noprofile": "bash", "--norc": "bash",
    "--no-build-isolation": "pip", "--no-deps": "pip", "--no-index": "pip",
    "--check": "scripts/build_pyz.py",
    "--density-n": "scripts/bench.py", "--density-rounds": "scripts/bench.py",
    "--coverage": "scripts/bench.py", "--json": "scripts/bench.py", "--nemo": "scripts/bench.py",
    "--only": "scripts/bench.py", "--python": "scripts/bench.py", "--pyz": "scripts/bench.py",
    "--quick": "scripts/bench.py", "--density-n": "scripts/bench.py",
    "--density-rounds": "scripts/bench.py",
    "--entrypoint": "docker run", "--memory": "docker run", "--network": "docker run",
    "--pids-limit": "docker run", "--read-only": "docker run",
    "--grace-period": "kubectl delete", "--time": "sbatch",
    "--no-build-isolation": "pip", "--no-deps": "pip", "--no-index": "pip",
    "--no-wait": "ray job submit", "--submission-id": "ray job submit",
    "--working-dir": "ray job submit", "--disable-status": "srun",
    "--noprofile": "bash", "--norc": "bash",
}
# Options that are gone: the parser refuses each, saying so (and what to use).
RETIRED_OPTIONS = {"--keep-services": "is gone", "--foreground": "is not supported"}


def test_every_option_a_document_names_exists():
    ours = set(LONG_OPTION.findall(help_text()))
    unknown = {}
    for path in CURRENT:
        for option in LONG_OPTION.findall(text_of(path)):
            if option not in ours and option not in OTHER_TOOLS and option not in RETIRED_OPTIONS:
                unknown.setdefault(option, set()).add(path)
    assert unknown == {}, "options no --help knows (renamed? another tool's: OTHER_TOOLS): %s" % (
        sorted((option, sorted(paths)) for option, paths in unknown.items()))
    assert not ours & set(OTHER_TOOLS), "an option of ours listed as another tool's"


def test_the_options_of_our_scripts_that_the_documents_name_exist():
    import subprocess
    from conftest import PY
    for script in sorted(set(t for t in OTHER_TOOLS.values() if t.startswith("scripts/"))):
        result = subprocess.run([PY, os.path.join(ROOT, script), "--help"],
                                stdout=subprocess.PIPE, universal_newlines=True, timeout=120)
        named = [o for o, tool in OTHER_TOOLS.items() if tool == script]
        missing = [o for o in named if o not in LONG_OPTION.findall(result.stdout)]
        assert result.returncode == 0 and missing == [], (script, missing)


def test_every_retired_option_is_refused_saying_so(tmp_path):
    from conftest import run_supervisor
    for option, says in RETIRED_OPTIONS.items():
        result = run_supervisor(option, "--timeout", "5", "--", "true", cwd=str(tmp_path))
        assert result.returncode == 125 and "%s %s" % (option, says) in result.stderr, (
            option, result.stderr)


def options_table():
    """{option: the row's meaning} of docs/reference.md's options table,
    for every flag the row's first cell names (`--cleanup-timeout
    DURATION`, `-k`, `--kill-after`)."""
    section = text_of("docs/reference.md").split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `-"):
            first, meaning = line[2:].split(" | ", 1)
            for flag in re.findall(r"`(--?[\w-]+)", first):
                rows[flag] = meaning
    return rows


def test_every_option_has_a_row_in_the_reference_and_every_row_an_option():
    ours = set(flag for line in help_text().splitlines() if re.match(r"  -", line)
               for flag in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", line))
    rows = set(options_table())
    assert ours - rows == set(), "in --help, no row in the reference's options table"
    assert rows - ours == set(RETIRED_OPTIONS), "a row for an option --help does not have"


# How the reference's options table and --help state a default.
STATED_DEFAULT = [
    re.compile(r"\(default:? `?([\w.]+)`?[),]"),    # (default 10), (default `TERM`)
    re.compile(r"`(\w+)`, the default\b"),          # (`auto`, the default)
]


def parser_defaults():
    """{flag: the parser's default} for every option that has a value of
    its own (flags and policies state none)."""
    import supervisor
    found = {}
    for flags, keyword, kind, default, _, _ in supervisor._OPTIONS:
        if default is not None and kind != "flag" and keyword != "policy":
            for flag in flags:
                found[flag] = default
    return found


def same(stated, default):
    try:
        return float(stated) == float(default)
    except (TypeError, ValueError):
        return str(stated) == str(default)


def test_every_default_the_reference_states_is_the_parsers():
    rows, defaults, checked = options_table(), parser_defaults(), []
    for flag, default in defaults.items():
        if flag not in rows:
            continue
        stated = [m.group(1) for pattern in STATED_DEFAULT for m in pattern.finditer(rows[flag])]
        assert stated, "the reference's row for %s states no default (the parser's: %r)" % (
            flag, default)
        assert all(same(s, default) for s in stated), (flag, stated, default)
        checked.append(flag)
    assert {"--cleanup-timeout", "--signal", "--containment"} <= set(checked)


def test_every_default_help_states_is_the_parsers():
    """--help gives a default in parentheses at the start of its text's
    last clause: (10), (TERM; ...), (auto)."""
    import supervisor
    text = help_text()
    for flags, keyword, kind, default, _, _ in supervisor._OPTIONS:
        if default is None or kind == "flag" or keyword == "policy":
            continue
        entry = text.split("  " + ", ".join(sorted(flags, key=len)), 1)
        entry = entry[1] if len(entry) == 2 else text.split(flags[-1], 1)[1]
        entry = entry.split("\n  -", 1)[0]
        stated = re.findall(r"\((\w+)[;)]", entry)
        if isinstance(kind, tuple) and set(kind) <= set(stated):
            continue  # each value named in turn, none as the default (the reference says it)
        assert stated and same(stated[0], default), (flags, stated, default)


def test_the_grace_by_default_is_the_same_everywhere():
    """Every "-k ... default N s" or "-k ..., N s by default" in a current
    document gives the parser's default."""
    import supervisor
    pattern = re.compile(r"-k`?[^.|]{0,30}?(?:default (\d+) s|(\d+) s by default)")
    found = [(path, m.group(1) or m.group(2)) for path in CURRENT
             for m in pattern.finditer(text_of(path))]
    assert found, "no document states -k's default"
    wrong = [(path, n) for path, n in found if float(n) != supervisor.DEFAULT_CLEANUP_TIMEOUT]
    assert wrong == []


# --- The README's tables say what the reference's say -------------------------------------------

def table_rows(path, heading):
    """The first cells of the table in the section `heading` of path."""
    section = text_of(path).split("\n%s\n" % heading, 1)[1].split("\n## ", 1)[0]
    return [line.split(" | ")[0][2:] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| ---") and " | " in line][1:]


def test_the_readmes_exit_statuses_are_the_references_and_helps():
    def numbers(cells):
        return set(int(n) for cell in cells for n in re.findall(r"(?<!\w)1\d\d(?![+\w])", cell))
    readme = numbers(table_rows("README.md", "## Exit status"))
    reference = numbers(table_rows("docs/reference.md", "## Exit status"))
    stated = help_text().split("exit status:", 1)[1]
    assert readme == reference == {124, 125, 126, 127, 137}
    assert readme <= set(int(n) for n in re.findall(r"\b(1\d\d)\b", stated))


def test_the_readmes_receipt_keys_are_the_references():
    keys = set(key for cell in table_rows("README.md", "## The receipt")
               for key in re.findall(r"`([a-z_]+)`", cell))
    assert len(keys) >= 8 and keys - set(receipt_table()) == set()


# --- The figures the documents give are the code's ----------------------------------------------

# (a regex whose group is a figure, in text with its whitespace collapsed;
# the constant of supervisor.py it must equal). Each must match somewhere.
FIGURES = [
    (r"[tT]imeout \+ (\d+) ?[x×] ?cleanup(?:_timeout)?", "CLEANUP_PHASE_COUNT"),
    (r"[tT]imeout \+ \d+ ?[x×] ?cleanup(?:_timeout)? \+ (\d+) s", "EXEC_TIMEOUT_SLACK"),
    (r"exec_timeout\(0, (?:cleanup_timeout|k)\)`? = (\d+) ?[x×]? ?(?:k|cleanup)", "CLEANUP_PHASE_COUNT"),
    (r"exec_timeout\(0, (?:cleanup_timeout|k)\)`? = \d+ ?[x×]? ?(?:k|cleanup) \+ (\d+) s",
     "EXEC_TIMEOUT_SLACK"),
    (r"within ([\d.]+) s is the same request|the same one after ([\d.]+) s", "_STOP_BURST"),
    (r"within (\d+) s wherever|look by path every (\d+) s|Every (\d+) s \(while the command runs"
     r"|noticed within (\d+) s", "_STOP_FILE_CHECK_INTERVAL"),
    (r"(?:does not|must) answer within (\d+) s", "_STOP_FILE_ANSWER"),
    (r"at most ([\d,]+) entries|stop at ([\d,]+) entries", "_LIST_LIMIT"),
    (r"`--summary PATH` \|[^|]*?[Aa]t most (\d+) KiB", "_SUMMARY_LIMIT", 1024),
]


def test_every_figure_the_documents_give_is_the_codes():
    import supervisor
    texts = dict((path, re.sub(r"\s+", " ", text_of(path))) for path in CURRENT)
    for row in FIGURES:
        pattern, constant, unit = (row + (1,))[:3]
        value = getattr(supervisor, constant)
        found = [(path, next(g for g in m.groups() if g)) for path, text in texts.items()
                 for m in re.finditer(pattern, text)]
        assert found, "no document gives %s: %s" % (constant, pattern)
        wrong = [(path, figure) for path, figure in found
                 if float(figure.replace(",", "")) * unit != value]
        assert wrong == [], "%s is %r; the documents say %s" % (constant, value, wrong)


def test_every_exec_timeout_a_document_works_out_is_the_functions():
    """`exec_timeout(1800, 20) = 1890`, `exec_timeout(0, 3) = 39 s`,
    `3 × 10 + 30 = 60`: the sums the documents give, worked out again."""
    import supervisor
    calls = re.compile(r"exec_timeout\((\d+), (\d+)\)`? = ([\d,]+)")
    sums = re.compile(r"\b(\d+) ?[×x] ?(\d+) \+ (\d+) = ([\d,]+)")
    found = 0
    for path in CURRENT:
        text = re.sub(r"\s+", " ", text_of(path))
        for timeout, cleanup, said in calls.findall(text):
            found += 1
            assert supervisor.exec_timeout(float(timeout), float(cleanup)) == float(
                said.replace(",", "")), (path, timeout, cleanup, said)
        for count, cleanup, slack, said in sums.findall(text):
            found += 1
            assert (int(count), int(slack)) == (supervisor.CLEANUP_PHASE_COUNT,
                                                supervisor.EXEC_TIMEOUT_SLACK), (path, said)
            assert int(count) * int(cleanup) + int(slack) == int(said.replace(",", "")), (
                path, count, cleanup, slack, said)
    assert found >= 4
