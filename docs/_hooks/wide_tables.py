"""mkdocs hook: a page with a table of 8 or more columns (a study's results, a report) gives that table the room of
the table of contents (Material's ``hide: [toc]``, as a page's front matter would say), so that it fits a 1280-px
screen instead of hiding its last columns; docs/stylesheets/extra.css sets such tables in a smaller type. The
pages' headings stay reachable from the search and, on narrow screens, from the navigation drawer."""

from __future__ import annotations

import re

WIDE = 8  # columns
# A table's delimiter row: |---|:---:| ... (pipes at both ends, as the repository's tables are written)
DELIMITER = re.compile(r"^\s*\|(?:\s*:?-{3,}:?\s*\|)+\s*$")
FENCE = re.compile(r"\s*(```|~~~)")


def widest_table(markdown: str) -> int:
    """The most columns of a table in ``markdown`` outside fenced code (0 without a table)."""
    widest, fenced = 0, False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and DELIMITER.match(line):
            widest = max(widest, line.count("|") - 1)
    return widest


def on_page_markdown(markdown, page, config, files):
    if widest_table(markdown) >= WIDE:
        hide = page.meta.setdefault("hide", [])
        if "toc" not in hide:
            hide.append("toc")
    return markdown
