"""studies/tools/lm_test.py: the LM test's pre-registered analysis on hand-made batches, every figure by hand; the
guard before seeds 0-11; the stopping rule; the verdict against a line; the ratio band."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import benchmark_scripts
import pytest
from studies import STUDIES

from oma.experiments.dose_response import load_fits, predict
from oma.experiments.stats import Estimate

SWEEP = STUDIES / "dose-response" / "sweep" / "dose_response.json"
T975_11 = 2.200985160082949  # Student t, 0.975 quantile, 11 degrees of freedom
VARIANTS = ("row+native", "row+MA", "OA+MA")


def _module():
    return benchmark_scripts.load("lm_test")


def _run(rd: Path, greedy: float, sampled: float, k_fail: float, k_success: float) -> None:
    """A finished run of 4 iterations with flat success curves (evaluations at 0, 2 and 4): endpoint = nAUC = the
    curve's value; every iteration logs failures of ``k_fail`` steps and successes of ``k_success``."""
    rd.mkdir(parents=True)
    lines = []
    for it in range(5):
        rec = {"iteration": it}
        if it:
            rec.update(rows=10, rows_per_traj_failure=k_fail, rows_per_traj_success=k_success)
        if it % 2 == 0:
            rec.update(eval_success=greedy, eval_sampled_success=sampled)
        lines.append(json.dumps(rec))
    (rd / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (rd / "config.json").write_text(json.dumps({"algo": {"estimator": "gigpo"}}))
    (rd / "summary.json").write_text(json.dumps({"iterations": 4}))


def _compare(seeds: list[int]) -> dict:
    return {"command": "oma compare hand-made --horizon 4", "horizon": 4, "seeds": seeds,
            "variants": [{"name": v, "algo.accounting": "trajectory" if v == "OA+MA" else "row",
                          "algo.mass": "native" if v == "row+native" else "uniform"} for v in VARIANTS],
            "config": {"algo": {"estimator": "gigpo"}, "env": {"name": "household", "eval_tasks": 128},
                       "eval_every": 2}, "runs": {}}


BASE = [0.50, 0.60, 0.55, 0.40, 0.45, 0.70, 0.65, 0.50, 0.55, 0.60, 0.35, 0.50]
D_OMA = [-0.20, -0.22, -0.18, -0.21, -0.19, -0.20, -0.23, -0.17, -0.20, -0.21, -0.19, -0.20]
D_MA = [0.02, -0.03, 0.01, 0.00, 0.04, -0.02, 0.03, -0.01, 0.00, 0.02, -0.04, 0.02]
D_SAMPLED = [0.01, -0.01, 0.02, 0.00, -0.02, 0.01, 0.00, 0.01, -0.01, 0.02, -0.02, 0.00]


def _study(tmp_path: Path, seeds: int = 12, k_fail: float = 3.0, k_success: float = 1.5, d_oma=D_OMA) -> Path:
    """A study folder: the committed sweep's lines, and batches seeds-0-1 and seeds-2-(seeds-1) of hand-made runs."""
    study = tmp_path / "dose-response"
    (study / "sweep").mkdir(parents=True)
    shutil.copy(SWEEP, study / "sweep" / "dose_response.json")
    for first, last in ((0, 1), (2, seeds - 1)):
        batch = study / "lm-test" / "batches" / f"seeds-{first}-{last}"
        batch.mkdir(parents=True)
        (batch / "compare.json").write_text(json.dumps(_compare(list(range(last + 1)))))
        for k in range(first, last + 1):
            b, s = BASE[k], BASE[k] - 0.1
            _run(batch / "row+native" / f"seed-{k}", b, s, k_fail, k_success)
            _run(batch / "row+MA" / f"seed-{k}", b + D_MA[k], s + D_SAMPLED[k], k_fail, k_success)
            _run(batch / "OA+MA" / f"seed-{k}", b + d_oma[k], s + D_SAMPLED[k], k_fail, k_success)
    return study


def _ci(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), T975_11 * statistics.stdev(xs) / math.sqrt(len(xs))


def test_the_analysis_by_hand(tmp_path: Path) -> None:
    study = _study(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert _module().main(["--study", str(study), "--out", str(out)]) == 0
    a = json.loads((out / "analysis.json").read_text())
    # primary: flat curves, so the endpoint's paired difference is D_OMA seed by seed
    mean, hw = _ci(D_OMA)
    assert a["primary"]["mean"] == pytest.approx(mean) and a["primary"]["half_width"] == pytest.approx(hw, rel=1e-6)
    assert a["primary"]["n"] == 12 and a["seeds"] == list(range(12))
    assert a["stopping"]["final"] is True and a["stopping"]["add_seeds"] == []  # hw ≈ 0.0105 ≤ 0.03
    # secondary: row+MA greedy endpoint and nAUC are D_MA; the sampled ones D_SAMPLED for both variants
    sec = {(x["variant"], x["success"], x["measure"]): x for x in a["secondary"]}
    assert list(sec) == [("row+MA", "greedy", "endpoint"), ("OA+MA", "sampled", "endpoint"),
                         ("row+MA", "sampled", "endpoint"), ("OA+MA", "greedy", "nAUC"), ("row+MA", "greedy", "nAUC")]
    for key, xs in ((("row+MA", "greedy", "endpoint"), D_MA), (("OA+MA", "sampled", "endpoint"), D_SAMPLED),
                    (("OA+MA", "greedy", "nAUC"), D_OMA)):
        assert sec[key]["diff"]["mean"] == pytest.approx(statistics.fmean(xs))
    # Holm over five: OA+MA's greedy nAUC (t ≈ −117) survives; the others' p are far above 0.05 / 4
    assert [x["holm"] for x in a["secondary"]] == [False, False, False, True, False]
    # the ratio: K fail / K success = 3 / 1.5 = 2.0 at every iteration, inside [2.0, 2.7]: the line at 2.35 only
    assert a["ratio"]["mean"] == pytest.approx(2.0)
    assert {x["ratio"] for x in a["against"]} == {2.35}
    fits = load_fits(SWEEP)
    [primary] = [x for x in a["against"] if (x["variant"], x["success"], x["measure"]) == ("OA+MA", "greedy", "endpoint")]
    line = predict(fits["stay-gigpo"]["OA+MA"]["endpoint"], 2.35)
    assert primary["line"]["mean"] == pytest.approx(line.mean)
    assert line.lo > mean + hw  # the line's CI lies above the LM's: below, by hand
    assert primary["verdict"] == "below" and primary["same_sign"] is (line.mean < 0)
    assert len(a["against"]) == 2 * 2 * 2  # 2 components × greedy/sampled × endpoint/nAUC
    assert len(a["others"]) == 2 * 2 * 2  # resets and dead ends × 2 components × 2 measures
    page = (out / "analysis.md").read_text()
    assert f"**{mean:+.3f} [{mean - hw:+.3f}, {mean + hw:+.3f}]**" in page and "**below**" in page
    assert "iterations 0, 2, 4; 128 held-out tasks" in page
    res = json.loads((out / "results.json").read_text())  # oma report's, what studies/results reads
    assert res["metric"] == "greedy" and res["variants"]["OA+MA"]["paired_seeds"] == list(range(12))
    assert json.loads((out / "compare.json").read_text())["seeds"] == list(range(12))
    assert (out / "prediction.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_ratio_outside_the_band_evaluates_the_line_there_too(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert _module().main(["--study", str(_study(tmp_path, k_fail=6.0)), "--out", str(out)]) == 0
    a = json.loads((out / "analysis.json").read_text())
    assert a["ratio"]["mean"] == pytest.approx(4.0)
    assert sorted({x["ratio"] for x in a["against"]}) == pytest.approx([2.35, 4.0])
    assert "outside it, so the line is evaluated at it too" in (out / "analysis.md").read_text()


def test_a_wide_primary_asks_for_four_more_seeds(tmp_path: Path) -> None:
    wide = [(-0.1 if k % 2 else 0.1) for k in range(12)]  # sd ≈ 0.104: half-width ≈ 0.066 > 0.03
    out = tmp_path / "out"
    out.mkdir()
    assert _module().main(["--study", str(_study(tmp_path, d_oma=wide)), "--out", str(out)]) == 0
    a = json.loads((out / "analysis.json").read_text())
    assert a["stopping"] == {"n_seeds": 12, "half_width": pytest.approx(_ci(wide)[1]), "threshold": 0.03,
                             "add_seeds": [12, 13, 14, 15], "final": False}
    assert "seeds 12–15 are to be added before the test reports" in (out / "analysis.md").read_text()


def test_the_stopping_rule_ends_at_24_seeds() -> None:
    m = _module()
    assert m.stopping(Estimate(0.0, 0.05, 24))["final"] is True
    assert m.stopping(Estimate(0.0, 0.05, 20))["add_seeds"] == [20, 21, 22, 23]
    assert m.stopping(Estimate(0.5, 0.03, 12))["final"] is True  # at the threshold: stop, whatever the mean


@pytest.mark.parametrize(("lm", "line", "expected"), [
    (Estimate(-0.10, 0.02, 12), Estimate(0.0, 0.05, 120), "below"),  # −0.08 < −0.05
    (Estimate(0.10, 0.02, 12), Estimate(0.0, 0.05, 120), "above"),
    (Estimate(-0.06, 0.02, 12), Estimate(0.0, 0.05, 120), "consistent"),  # −0.04 ≥ −0.05: they overlap
])
def test_the_verdict_by_hand(lm: Estimate, line: Estimate, expected: str) -> None:
    assert _module().verdict(lm, line) == expected


def test_no_difference_before_seeds_0_to_11(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert _module().main(["--study", str(_study(tmp_path, seeds=8)), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "lm_test.py: 8 paired seeds; the plan analyses none before seeds 0-11"
    assert list(out.iterdir()) == []


def test_no_batch_is_named(tmp_path: Path, capsys) -> None:
    study = _study(tmp_path)
    shutil.rmtree(study / "lm-test" / "batches")
    (study / "lm-test" / "batches").mkdir()
    assert _module().main(["--study", str(study), "--out", str(tmp_path)]) == 1
    assert "no batch (seeds-A-B/compare.json)" in capsys.readouterr().err


def test_the_committed_analysis_regenerates_byte_for_byte(tmp_path: Path) -> None:
    committed = STUDIES / "dose-response" / "lm-test"
    assert _module().main(["--out", str(tmp_path)]) == 0
    for name in ("analysis.md", "analysis.json", "report.md", "results.json", "compare.json"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes(), f"lm-test/{name} is stale"
