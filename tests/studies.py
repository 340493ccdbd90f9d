"""Where the lab notebook's files live: each study's folder under studies/ (its pages, figures, configs and
committed runs), found by name so that a test names a page, a run folder or a config, not its study."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"


def _one(pattern: str) -> Path:
    found = sorted(STUDIES.glob(pattern))
    assert len(found) == 1, f"studies/{pattern}: expected one match, found {[str(p.relative_to(ROOT)) for p in found]}"
    return found[0]


def evidence(folder: str) -> Path:
    """A study's committed runs: ``studies/<study>/evidence/<folder>`` (a subfolder path may follow)."""
    first, _, rest = folder.partition("/")
    base = _one(f"*/evidence/{first}")
    return base / rest if rest else base


def page(stem: str) -> Path:
    """A study's page ``studies/<study>/<stem>.md``."""
    return _one(f"*/{stem}.md")


def preset(name: str) -> Path:
    """A config by file name: a user's preset in configs/, else the study that keeps it."""
    user = ROOT / "configs" / name
    return user if user.is_file() else _one(f"*/{name}")
