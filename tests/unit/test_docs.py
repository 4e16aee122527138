"""The README is a front page (at most 200 lines; reference material lives in docs/), and every relative link of the
README and of docs/*.md points to a file that exists, and, for a link to a section of a Markdown page, to a heading of
that page (GitHub's anchors)."""
import re
from pathlib import Path

import pytest

from tfhpc import REPO_ROOT

README = REPO_ROOT / "README.md"
README_MAX_LINES = 200
PAGES = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]

CODE_BLOCK = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text):
    """The text without code blocks and code spans, where brackets and parentheses are not links."""
    return CODE_SPAN.sub("", CODE_BLOCK.sub("", text))


def links(text):
    return INLINE_LINK.findall(prose(text)) + REFERENCE_LINK.findall(prose(text))


def anchors(page):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens, repeats numbered -1, -2, ..."""
    seen, found = {}, set()
    for heading in HEADING.findall(CODE_BLOCK.sub("", page.read_text())):  # code spans in headings count
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
        slug = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_readme_is_a_front_page():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference "
                                       "material to a page under docs/ and link it")


def test_link_parsing_sees_links_and_skips_code():
    text = "[a](docs/x.md) `[b](no.md)` ![c](img.png \"t\")\n```\n[d](no2.md)\n```\n[e]: ref.md\n<https://x.org>\n"
    assert links(text) == ["docs/x.md", "img.png", "ref.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_relative_links_point_to_existing_files(page):
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # absolute URL (https:, mailto:, ...): not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor.lower() not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {Path(path).name or page.name}")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: broken links: " + "; ".join(broken)
