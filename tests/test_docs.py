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
