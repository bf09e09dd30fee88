"""Every relative link in the documents leads somewhere: README.md,
CHANGELOG.md and every docs/*.md are read, each markdown link
`[text](target)` that is not http(s) or mailto is followed, and the test
fails when the target file does not exist or, for `file.md#anchor` and
`#anchor`, when the anchor is not the GitHub slug of a heading of that file.
Links inside fenced code blocks and inline code are not links."""
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
