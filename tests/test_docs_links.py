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


def test_the_training_guide_is_a_guide():
    """docs/training.md is the user guide to `oma train` (at most 400 lines); the studies keep the diary."""
    page = ROOT / "docs" / "training.md"
    assert len(page.read_text().splitlines()) <= 400
    headings = [ln[3:] for ln in prose(page) if ln.startswith("## ")]
    for section in ("Quick start", "Presets", "Options", "Metrics", "Reproducibility and resume"):
        assert section in headings


MENTION = re.compile(r"\b((?:docs|studies|benchmarks)/[\w./+-]*\.md)(?:#([\w-]+))?")
CODE = sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "configs").rglob("*.yaml"), *(ROOT / "benchmarks").glob("*.py"),
               *(ROOT / "studies" / "tools").glob("*.py"), *(ROOT / "studies").glob("*/*.yaml")])


def test_the_pages_code_and_configs_cite_exist():
    """A docstring, comment or preset header that cites `docs/x.md#anchor` (or a study's or benchmark's page)
    names a page and heading that exist: moving a page must not leave stale citations behind."""
    stale = []
    for f in CODE:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for path, fragment in MENTION.findall(line):
                dest = ROOT / path
                if not dest.is_file():
                    stale.append(f"{f.relative_to(ROOT)}:{n}: {path}: no such file")
                elif fragment and fragment not in anchors(dest):
                    stale.append(f"{f.relative_to(ROOT)}:{n}: {path}#{fragment}: no heading with that anchor")
    assert not stale, "\n".join(stale)
