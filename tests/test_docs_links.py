"""Every relative link in README.md, docs/, benchmarks/ and studies/ names a file that exists and, with a
``#fragment``, a heading (GitHub's anchor of it) or an ``<a id>`` in that file."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md"),
                *(ROOT / "studies").glob("**/*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, markup dropped, lower case, punctuation other than
    '-' and '_' removed, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks (where neither headings nor links are markup)."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


@cache  # each target page is parsed once, not once per link to it
def anchors(page: Path) -> frozenset[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose(page):
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
        out.update(re.findall(r'<a id="([^"]+)"', line))
    return frozenset(out)


def links(page: Path) -> list[str]:
    return [t for line in prose(page) for t in LINK.findall(line) if not re.match(r"[a-z]+:", t)]


def test_slug_by_hand():
    assert slug("The RL gradient against the expert's: it points away (measured)") == \
        "the-rl-gradient-against-the-experts-it-points-away-measured"
    assert slug("Advantages without the std (Dr. GRPO; `mean_norm`): 5 seeds") == "advantages-without-the-std-dr-grpo-mean_norm-5-seeds"
    assert slug("See [docs](docs/x.md) now") == "see-docs-now"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def unlisted(lines: list[str], listed_under: str) -> list[str]:
    """The headings a page's ``## Contents`` does not link to: every ``##`` section, and every ``###``
    inside the ``##`` section named ``listed_under`` (docs/training.md's measured findings)."""
    contents, wanted, section = set(), [], None
    for line in lines:
        m = re.match(r"(#{2,3}) (.+)", line)
        if m:
            level, heading = m.groups()
            if level == "##":
                section = heading
                if heading != "Contents":
                    wanted.append(heading)
            elif section == listed_under:
                wanted.append(heading)
        elif section == "Contents":
            contents.update(f for t in LINK.findall(line) for f in [t.partition("#")[2]] if t.startswith("#"))
    return [h for h in wanted if slug(h) not in contents]


def test_unlisted_by_hand():
    page = ["## Contents", "* [A](#a)", "* [Findings](#findings)", "  - [Two x](#two-x)",
            "## A", "### inner of A", "## Findings", "### Two x", "### Three y", "## B"]
    assert unlisted(page, "Findings") == ["Three y", "B"]
    assert unlisted(page, "A") == ["inner of A", "B"]


def test_training_contents_links_every_section_and_finding():
    page = ROOT / "docs" / "training.md"
    assert unlisted(prose(page), "What limited learning") == []
