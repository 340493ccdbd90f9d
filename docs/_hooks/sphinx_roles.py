"""Griffe extension (mkdocs.yml, mkdocstrings): the docstrings' Sphinx roles become links in the API reference.

oma's docstrings cite each other as Sphinx does (``:func:`outcome_advantages```, ``:mod:`oma.core```,
``~`` to show the last name only). mkdocstrings renders Markdown, where a role would print as ":func:"
before the code; each becomes an optional cross-reference instead: a link where the object is documented
in the site (docs/reference/), plain code where it is not, with no warning either way.
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|obj|exc):`(?P<tilde>~?)(?P<name>[\w.]+)`")


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring:
            obj.docstring.value = ROLE.sub(lambda m: reference(obj, m["name"], bool(m["tilde"])), obj.docstring.value)


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
