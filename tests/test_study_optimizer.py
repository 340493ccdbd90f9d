"""studies/tools/optimizer.py: each component's Δ under both optimizers and their Welch difference, by hand; the
sign reading; the committed page regenerates byte for byte once Adam's cells are committed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import benchmark_scripts
import pytest
from studies import STUDIES

STAY = STUDIES / "tabular-coupling-map" / "map" / "stay"
PAGE = STUDIES / "optimizer"


def _module():
    return benchmark_scripts.load("optimizer")


def _map(root: Path, endpoints: dict[str, float], spread: float = 0.01) -> None:
    """A map folder with the one setting `stay`, its runs' endpoints set by hand: variant's value + seed-dependent
    noise of size ``spread`` shared by every variant of a seed (so paired Δ are exact)."""
    shutil.copytree(STAY, root / "stay")
    (root / "map.json").write_text(json.dumps({"settings": ["stay"]}))
    res = json.loads((root / "stay" / "results.json").read_text())
    for run in res["runs"]:
        run["endpoint"] = endpoints[run["variant"]] + spread * (run["seed"] % 5)
    (root / "stay" / "results.json").write_text(json.dumps(res))


def test_by_hand_a_sign_that_holds_and_one_that_flips(tmp_path: Path) -> None:
    """SGD: MA +0.05, OA −0.02; Adam: MA +0.03, OA +0.04 (exact on every seed): MA holds (Adam − SGD −0.02), OA flips
    (+0.06); OA+MA is +0.00 under SGD, so it is not resolved."""
    studies = tmp_path / "studies"
    base = 0.5
    _map(studies / "tabular-coupling-map" / "map",
         {"row+native": base, "row+MA": base + 0.05, "OA+native": base - 0.02, "OA+MA": base})
    _map(studies / "optimizer" / "map-adam",
         {"row+native": base, "row+MA": base + 0.03, "OA+native": base + 0.04, "OA+MA": base + 0.01})
    out = tmp_path / "out"
    assert _module().main(["--studies", str(studies), "--out", str(out)]) == 0
    [row] = json.loads((out / "results.json").read_text())["rows"]
    ma, oa, both = (row["parts"][p] for p in ("MA", "OA", "OA+MA"))
    assert ma["reading"] == "same sign" and ma["adam_minus_sgd"]["mean"] == pytest.approx(-0.02)
    assert oa["reading"] == "flips" and oa["adam_minus_sgd"]["mean"] == pytest.approx(0.06)
    assert both["reading"] == "not resolved"
    page = (out / "results.md").read_text()
    assert "1 of 1 cells keep their sign, 0 flip" in page and "0 of 1 cells keep their sign, 1 flip" in page


def test_without_adam_cells_it_is_one_line(tmp_path: Path, capsys) -> None:
    studies = tmp_path / "studies"
    _map(studies / "tabular-coupling-map" / "map", {v: 0.5 for v in ("row+native", "row+MA", "OA+native", "OA+MA")})
    assert _module().main(["--studies", str(studies), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("optimizer.py: error:") and "no Adam cells committed" in err and err.count("\n") == 1


def test_the_committed_page_regenerates_byte_for_byte(tmp_path: Path) -> None:
    assert _module().main(["--out", str(tmp_path)]) == 0
    for name in ("results.md", "results.json"):
        assert (tmp_path / name).read_bytes() == (PAGE / name).read_bytes(), f"studies/optimizer/{name} is stale"
