"""Griffe extension (mkdocs.yml, mkdocstrings): the docstrings' Sphinx roles and page mentions become links in
the API reference.

oma's docstrings cite each other as Sphinx does (``:func:`outcome_advantages```, ``:mod:`oma.core```,
``~`` to show the last name only). mkdocstrings renders Markdown, where a role would print as ":func:"
before the code; each becomes an optional cross-reference instead: a link where the object is documented
in the site (docs/reference/), plain code where it is not, with no warning either way.

They cite the guide, the studies and the benchmarks by path, as read in the code (``docs/math.md#mass-alignment``);
each such mention becomes a Markdown link to that page, the path kept as its text. The API reference's pages all
lie in docs/reference/ and links.py publishes studies/ and benchmarks/ beside the guide, so the link is the page's
path in the site from there (``../math.md#mass-alignment``, ``../studies/results/README.md``), which mkdocs turns into
the page's address and ``mkdocs build --strict`` checks, anchor included. A mention in code (backticks) stays code.
"""

from __future__ import annotations

import posixpath
import re

import griffe

ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):`(?P<tilde>~?)(?P<name>[\w.]+)`")
# A page of the site cited by its path in the repository, outside inline code, with its anchor if any.
CODE_OR_MENTION = re.compile(r"(?P<code>(`+).*?(?<!`)\2(?!`))"
                             r"|(?<![\w/\[])(?<!\]\()(?P<path>(?:docs|studies|benchmarks)/[\w./+-]*\.md)(?P<anchor>#[\w-]+)?")
REFERENCE_DIR = "reference"  # where the pages that render docstrings lie in the site (docs/reference/)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring:
            text = ROLE.sub(lambda m: reference(obj, m["name"], bool(m["tilde"])), obj.docstring.value)
            obj.docstring.value = page_links(text)


def page_links(text: str) -> str:
    """``text`` with each mention of a page (``docs/x.md#anchor``, ``studies/s/README.md``) outside inline
    code made a Markdown link to it, relative to docs/reference/ (see the module's docstring)."""
    def link(m: re.Match) -> str:
        if m["code"]:
            return m["code"]
        mention = m["path"] + (m["anchor"] or "")
        in_site = m["path"].removeprefix("docs/")  # the guide is the site's root; studies/, benchmarks/ as they are
        target = posixpath.relpath(in_site, REFERENCE_DIR) + (m["anchor"] or "")
        return f"[{mention}]({target})"
    return CODE_OR_MENTION.sub(link, text)


def reference(obj: griffe.Object, name: str, last_only: bool) -> str:
    """The autorefs element for ``name`` as written in ``obj``'s docstring."""
    title = name.rpartition(".")[2] if last_only else name
    return f'<autoref identifier="{target(obj, name)}" optional>`{title}`</autoref>'


def target(obj: griffe.Object, name: str) -> str:
    """``name``'s full path: its first part resolved in ``obj``'s scope (a name the module defines or
    imports), or ``name`` itself when it is already one (``oma.core.token_weights``)."""
    head, dot, rest = name.partition(".")
    try:
        return obj.resolve(head) + dot + rest
    except griffe.NameResolutionError:
        return name
