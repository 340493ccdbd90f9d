"""The umask of one test and the files that do not follow it, for the tests of #58 item 10 (outputs follow the
umask): import ``mask`` (a fixture) and ``wrong_modes`` from here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def mask(request):
    """The process's umask for one test, set back after it."""
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def wrong_modes(folder: Path, mask: int) -> list[str]:
    """The paths under ``folder`` (itself included) whose permissions are not what the umask gives."""
    return [f"{oct(stat.S_IMODE(p.stat().st_mode))} {p.relative_to(folder.parent)}" for p in [folder, *folder.rglob("*")]
            if stat.S_IMODE(p.stat().st_mode) != (0o777 if p.is_dir() else 0o666) & ~mask]
