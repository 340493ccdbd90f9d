"""studies/tools/components.py: the page regenerates from the committed cells; the interaction by hand and its
invariance to a seed's common shift; a damaged cell is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import benchmark_scripts
import pytest
from studies import STUDIES

PAGE = STUDIES / "dose-response"
STAY = STUDIES / "tabular-coupling-map" / "map" / "stay"


def _module():
    return benchmark_scripts.load("components")


def test_the_committed_page_regenerates_byte_for_byte(tmp_path: Path) -> None:
    assert _module().main(["--out", str(tmp_path)]) == 0
    for name in ("components.md", "components.json"):
        assert (tmp_path / name).read_bytes() == (PAGE / name).read_bytes(), f"studies/dose-response/{name} is stale"


def _one_cell(tmp_path: Path, endpoints: dict[str, list[float]]) -> Path:
    """A studies folder whose map has one setting, `stay`, copied from the committed one with hand-set per-seed
    endpoints (variant -> one value per seed)."""
    studies = tmp_path / "studies"
    cell = studies / "tabular-coupling-map" / "map" / "stay"
    shutil.copytree(STAY, cell)
    (cell.parent / "map.json").write_text(json.dumps({"settings": ["stay"]}))
    res = json.loads((cell / "results.json").read_text())
    for run in res["runs"]:
        run["endpoint"] = endpoints[run["variant"]][run["seed"]]
    (cell / "results.json").write_text(json.dumps(res))
    return studies


def _page(studies: Path, tmp_path: Path) -> dict:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    assert _module().main(["--studies", str(studies), "--out", str(out)]) == 0
    return json.loads((out / "components.json").read_text())


def test_the_interaction_by_hand_and_its_invariance_to_a_seeds_common_shift(tmp_path: Path) -> None:
    """row 0.5, OA 0.4, MA 0.6, OA+MA 0.8 on every seed: OA −0.1, MA +0.1, OA+MA +0.3, so the interaction is
    0.3 − (−0.1) − 0.1 = +0.3; adding any seed's own constant to its four runs changes none of it."""
    n = 30
    flat = {"row+native": [0.5] * n, "OA+native": [0.4] * n, "row+MA": [0.6] * n, "OA+MA": [0.8] * n}
    got = _page(_one_cell(tmp_path / "a", flat), tmp_path / "a")["cells"][0]
    assert got["interaction"]["mean"] == pytest.approx(0.3) and got["interaction"]["half_width"] == pytest.approx(0.0)
    assert {p: round(e["mean"], 9) for p, e in got["parts"].items()} == {"OA": -0.1, "MA": 0.1, "OA+MA": 0.3}
    shifted = {v: [x + 0.01 * (k % 7) for k, x in enumerate(xs)] for v, xs in flat.items()}
    again = _page(_one_cell(tmp_path / "b", shifted), tmp_path / "b")["cells"][0]
    assert again["interaction_per_seed"] == pytest.approx(got["interaction_per_seed"], abs=1e-12)


def test_a_damaged_cell_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    studies = _one_cell(tmp_path, {v: [0.5] * 30 for v in ("row+native", "OA+native", "row+MA", "OA+MA")})
    (studies / "tabular-coupling-map" / "map" / "stay" / "results.json").write_text("{not json")
    out = tmp_path / "out"
    assert _module().main(["--studies", str(studies), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("components.py: error:") and "results.json" in err and err.count("\n") == 1
    assert not (out / "components.md").exists()
