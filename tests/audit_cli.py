"""`oma audit` run as the command line runs it, for the audit's tests: its JSON document, or its one-line refusal."""

from __future__ import annotations

import json
from pathlib import Path

from oma.cli import main as oma_main


def audit_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out.json"
    assert oma_main(["audit", *args, "--json", str(out), "--quiet"]) == 0
    return json.loads(out.read_text())


def fails(tmp_path: Path, capsys, *args: str) -> str:
    """Exit status 2, one line on stderr without a traceback, and no output file."""
    out = tmp_path / "never.json"
    assert oma_main(["audit", *args, "--json", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oma audit: error: ") and "Traceback" not in err, err
    assert not out.exists() and not list(tmp_path.glob(".never.json*"))
    return err.strip()
