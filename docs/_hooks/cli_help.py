"""mkdocs hook: docs/reference/cli.md shows each command's real ``--help``, generated at build time.

The page holds the line ``<!-- oma commands -->``; this hook replaces it with one section per command of
``oma.cli.COMMANDS``: its one-line help, the text ``oma <command> --help`` prints, and its module's docstring
(mkdocstrings; its ``main`` is the same for every command, so it is left out). A new subcommand appears on the
page without an edit.
"""

from __future__ import annotations

import contextlib
import io
import os
from unittest import mock

MARKER = "<!-- oma commands -->"
COLUMNS = "80"  # argparse wraps at the terminal's width; a fixed one makes the page the same everywhere


def help_text(argv: list[str]) -> str:
    """What ``oma *argv`` prints on stdout (run in this process: the modules import torch once, not per command)."""
    from oma.cli import main

    out = io.StringIO()
    with mock.patch.dict(os.environ, {"COLUMNS": COLUMNS}), contextlib.redirect_stdout(out):
        try:
            status = main(argv)
        except SystemExit as done:  # argparse's --help exits
            status = done.code
    if status not in (0, None):
        raise RuntimeError(f"oma {' '.join(argv)} exited with {status}")
    return out.getvalue().rstrip()


def commands_markdown() -> str:
    from oma.cli import COMMANDS

    sections = [f"`oma --help` lists them:\n\n```text\n{help_text(['--help'])}\n```\n"]
    for name, (module, summary) in COMMANDS.items():
        sections.append(
            f"## `oma {name}`\n\n{summary[0].upper()}{summary[1:]}.\n\n"
            f"```text\n{help_text([name, '--help'])}\n```\n\n"
            f"::: {module}\n    options:\n      show_root_heading: false\n      show_root_toc_entry: false\n"
            "      heading_level: 3\n      members: false\n"
        )
    return "\n".join(sections)


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, commands_markdown())
