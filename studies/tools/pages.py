"""The command line the page-writing study tools share: read the committed studies, write ``<stem>.md`` and
``<stem>.json`` atomically, and turn a missing or damaged source into one line naming it (exit 1)."""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oma.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]


def page_main(argv: list[str], prog: str, description: str, default_out: str, stem: str,
              collect: Callable[[Path], Any], render: Callable[[Any], str], to_json: Callable[[Any], dict]) -> int:
    """``prog [--studies DIR] [--out DIR]``: ``collect(studies)``, then ``render`` and ``to_json`` of it into
    ``out/<stem>.md`` and ``out/<stem>.json`` (``out`` defaults to ``studies/<default_out>``)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--studies", type=Path, default=ROOT / "studies", help="the studies folder to read")
    p.add_argument("--out", type=Path, default=None, help=f"folder to write (default STUDIES/{default_out})")
    args = p.parse_args(argv)
    out = args.out or args.studies / default_out
    try:
        got = collect(args.studies)
        atomic_write_text(out / f"{stem}.json", json.dumps(to_json(got), indent=2) + "\n")
        atomic_write_text(out / f"{stem}.md", render(got))
    except (OSError, ValueError, KeyError) as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    print(f"{prog}: wrote {out / (stem + '.md')} and {out / (stem + '.json')}")
    return 0
