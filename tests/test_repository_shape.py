"""The product stays small and clear beside its lab notebook: what a user reads and runs (src/, tests/, docs/,
configs/, benchmarks/, the README) is at most 5 MB of tracked files; the studies keep the rest."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked_sizes() -> dict[str, int]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = [f for f in out.decode().split("\0") if f]
    return {f: (ROOT / f).lstat().st_size for f in files if (ROOT / f).exists() or (ROOT / f).is_symlink()}


def test_everything_outside_studies_is_at_most_5_mb():
    sizes = tracked_sizes()
    assert any(f.startswith("studies/") for f in sizes)  # the listing sees the notebook too
    outside = {f: s for f, s in sizes.items() if not f.startswith("studies/")}
    total = sum(outside.values())
    largest = sorted(outside, key=outside.get, reverse=True)[:5]
    assert total <= 5_000_000, f"{total / 1e6:.2f} MB outside studies/; largest: {largest}"
