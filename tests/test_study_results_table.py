"""studies/tools/results_table.py: the page regenerates from the committed evidence; a row, Holm and an added
baseline_gain by hand; a missing or damaged source is named in one line."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import benchmark_scripts
import pytest
from studies import STUDIES

from oma.experiments.stats import Estimate

PAGE = STUDIES / "results"
HISTORY_REPORT = STUDIES / "compare-2026-11-30" / "household-grpo" / "results.json"
LM_CAP20 = STUDIES / "lm-accounting" / "evidence" / "2026-12-05-accounting-75"


def _module():
    return benchmark_scripts.load("results_table")


def _committed() -> dict:
    return json.loads((PAGE / "results.json").read_text())


def test_the_committed_page_regenerates_byte_for_byte(tmp_path: Path) -> None:
    assert _module().main(["--out", str(tmp_path)]) == 0
    for name in ("README.md", "results.json"):
        assert (tmp_path / name).read_bytes() == (PAGE / name).read_bytes(), f"studies/results/{name} is stale"


# ------------------------------------------------------------------------------------------------
# By hand


T_975_DF9 = 2.262157162798205
"""Student t's 0.975 quantile with 9 degrees of freedom (a table value)."""


def _t_tail_by_hand(t: float, df: int, steps: int = 4000) -> float:
    """P(|T| > t) for Student t: 1 − 2∫_0^t f, f integrated by Simpson's rule."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    h = t / steps
    total = 0.0
    for i in range(steps + 1):
        w = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += w * c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
    return 1.0 - 2.0 * total * h / 3.0


def _greedy_at(run: Path, iteration: int) -> float:
    with gzip.open(run / "metrics.jsonl.gz", "rt") as f:
        records = [json.loads(line) for line in f if line.strip()]
    return next(r["eval_success"] for r in records if r["iteration"] == iteration and "eval_success" in r)


def test_the_lm_cap20_greedy_row_by_hand() -> None:
    # OA+MA − row+native in held-out greedy success at iteration 75, seeds 5-14, straight from the runs' metrics
    d = [_greedy_at(LM_CAP20 / "OA+MA" / f"seed-{k}", 75) - _greedy_at(LM_CAP20 / "row+native" / f"seed-{k}", 75)
         for k in range(5, 15)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    p = _t_tail_by_hand(abs(mean) / se, n - 1)

    [row] = [r for r in _committed()["rows"] if r["source"].startswith("lm-accounting") and "greedy" in r["measure"]]
    assert row["seeds"] == list(range(5, 15))
    assert row["diff"]["mean"] == pytest.approx(mean, abs=1e-12)
    assert row["diff"]["lo"] == pytest.approx(mean - T_975_DF9 * se, abs=1e-9)
    assert row["diff"]["hi"] == pytest.approx(mean + T_975_DF9 * se, abs=1e-9)
    assert row["diff"]["p"] == pytest.approx(p, abs=1e-7)
    assert row["diff"]["n"] == 10 and not row["holm"] and row["sign"] == "not resolved"
    page = (PAGE / "README.md").read_text()
    lo, hi = mean - T_975_DF9 * se, mean + T_975_DF9 * se
    assert f"| {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {p:.3f} |  | not resolved |" in page


def _holm_by_hand(ps: list[float], alpha: float = 0.05) -> list[bool]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [False] * len(ps)
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        out[i] = True
    return out


def test_holm_on_a_made_up_family_by_hand() -> None:
    m = _module()
    # m = 4: 0.005 <= 0.05/4, 0.01 <= 0.05/3, then 0.03 > 0.05/2 stops: 0.04 is not tested
    ps = [0.01, 0.04, 0.03, 0.005]
    rows = [m.Row("lm", f"w{i}", f"w{i}", "measure", "OA+MA", "study", "source", [0.1, 0.2], [0, 1], None,
                  Estimate(0.0, 0.0, 2)) for i in range(4)]
    for r, p in zip(rows, ps):
        r.diff = Estimate(0.1, 0.05, 10, p=p)
    m.mark_holm(rows)
    assert [r.holm for r in rows] == [True, False, False, True] == _holm_by_hand(ps)
    # all four pass once the second-smallest clears 0.05/3 and the rest their own thresholds
    for r, p in zip(rows, [0.012, 0.05, 0.02, 0.001]):
        r.diff = Estimate(0.1, 0.05, 10, p=p)
    m.mark_holm(rows)
    assert [r.holm for r in rows] == [True, True, True, True]


def test_the_committed_family_is_holm_by_hand() -> None:
    rows = _committed()["rows"]
    kept = _holm_by_hand([r["diff"]["p"] for r in rows])
    assert [r["holm"] for r in rows] == kept
    assert f"{sum(kept)} of {len(rows)} do" in (PAGE / "README.md").read_text()
    slopes = _committed()["slopes"]["rows"]
    assert [s["holm"] for s in slopes] == _holm_by_hand([s["slope"]["p"] for s in slopes])


def test_the_added_baseline_gain_by_hand(tmp_path: Path) -> None:
    res = json.loads(HISTORY_REPORT.read_text())
    gains = [r["endpoint"] - r["eval_success"][r["eval_iterations"].index(0)] for r in res["runs"]
             if r["variant"] == "row+native"]
    n = len(gains)
    mean = sum(gains) / n
    sd = math.sqrt(sum((g - mean) ** 2 for g in gains) / (n - 1))
    assert n == 3
    assert res["baseline_gain"]["mean"] == pytest.approx(mean, abs=1e-12)
    assert res["baseline_gain"]["half_width"] == pytest.approx(4.302652729749464 * sd / math.sqrt(n), abs=1e-9)
    assert list(res)[list(res).index("variants") + 1] == "baseline_gain"  # where `oma report` writes it

    # the mode that added it: on a copy without the field it writes the committed file back, byte for byte
    copy = tmp_path / "compare-2026-11-30" / "household-grpo" / "results.json"
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps({k: v for k, v in res.items() if k != "baseline_gain"}, indent=2))
    assert _module().main(["--studies", str(tmp_path), "--add-baseline-gain"]) == 0
    assert copy.read_bytes() == HISTORY_REPORT.read_bytes()


# ------------------------------------------------------------------------------------------------
# Bad input


def _mirror(dst: Path, src: Path, target: str) -> Path:
    """``dst`` as ``src`` by symbolic links, except along ``target``: its folders are real and the file itself a
    copy, to damage or remove. Returns the copy."""
    parts = Path(target).parts
    dst.mkdir()
    for i, part in enumerate(parts):
        for child in src.iterdir():
            if child.name != part:
                (dst / child.name).symlink_to(child)
        src, dst = src / part, dst / part
        if i < len(parts) - 1:
            dst.mkdir()
    shutil.copyfile(src, dst)
    return dst


@pytest.mark.parametrize("target", [
    "compare-2026-11-30/household-grpo/results.json",
    "tabular-coupling-map/map/map.json",
    "tabular-coupling-map/map/reset/results.json",
    "lm-accounting/evidence/2026-12-05-accounting-75/row+native/seed-5/metrics.jsonl.gz",
    "longer-preset/evidence/2026-12-06-grpo-420-ema/OA+MA/seed-16/summary.json",
    "dose-response/sweep/dose_response.json",
])
@pytest.mark.parametrize("harm", ["missing", "cut short"])
def test_a_bad_source_is_named_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str,
                                           harm: str) -> None:
    copy = _mirror(tmp_path / "studies", STUDIES, target)
    if harm == "missing":
        copy.unlink()
    else:
        data = copy.read_bytes()
        copy.write_bytes(data[: len(data) // 2])
    assert _module().main(["--studies", str(tmp_path / "studies"), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(copy) in err, err
    assert not (tmp_path / "out" / "README.md").exists()


T_975_DF11 = 2.200985160082949
"""Student t's 0.975 quantile with 11 degrees of freedom (a table value)."""
LM_CAP50 = STUDIES / "dose-response" / "lm-test"


def _cap50_run(variant: str, seed: int) -> Path:
    [run] = LM_CAP50.glob(f"batches/seeds-*/{variant}/seed-{seed}")
    return run


def test_the_cap50_rows_by_hand_and_as_the_lm_test_analysed_them() -> None:
    # its endpoint is the mean of the evaluations at iterations 45, 60 and 75, straight from the committed batches
    def endpoint(variant: str, seed: int) -> float:
        return sum(_greedy_at(_cap50_run(variant, seed), it) for it in (45, 60, 75)) / 3

    analysis = json.loads((LM_CAP50 / "analysis.json").read_text())
    [ma] = [r["diff"] for r in analysis["secondary"]
            if (r["variant"], r["success"], r["measure"]) == ("row+MA", "greedy", "endpoint")]
    rows = {r["compared"]: r for r in _committed()["rows"] if r["source"] == "dose-response/lm-test"}
    assert _committed()["lm_cap50"] == "reported" and sorted(rows) == ["MA alone", "OA+MA"]
    for compared, variant, own in (("OA+MA", "OA+MA", analysis["primary"]), ("MA alone", "row+MA", ma)):
        d = [endpoint(variant, k) - endpoint("row+native", k) for k in range(12)]
        mean = sum(d) / 12
        se = math.sqrt(sum((x - mean) ** 2 for x in d) / 11) / math.sqrt(12)
        row = rows[compared]["diff"]
        assert rows[compared]["seeds"] == list(range(12))
        assert row["mean"] == pytest.approx(mean, abs=1e-12) == pytest.approx(own["mean"], abs=1e-12)
        assert row["lo"] == pytest.approx(mean - T_975_DF11 * se, abs=1e-9) == pytest.approx(own["lo"], abs=1e-12)
        assert row["hi"] == pytest.approx(mean + T_975_DF11 * se, abs=1e-9) == pytest.approx(own["hi"], abs=1e-12)
        assert row["p"] == pytest.approx(_t_tail_by_hand(abs(mean) / se, 11), abs=1e-7)


def test_before_the_cap50_test_reports_its_rows_wait(tmp_path: Path) -> None:
    # the same studies without lm-test/results.json: no cap-50 number, and a family smaller by its two rows
    studies = tmp_path / "studies"
    studies.mkdir()
    for child in STUDIES.iterdir():
        if child.name != "dose-response":
            (studies / child.name).symlink_to(child)
    (studies / "dose-response" / "lm-test").mkdir(parents=True)
    for child in (STUDIES / "dose-response").iterdir():
        if child.name != "lm-test":
            (studies / "dose-response" / child.name).symlink_to(child)
    for child in LM_CAP50.iterdir():
        if child.name != "results.json":
            (studies / "dose-response" / "lm-test" / child.name).symlink_to(child)
    assert _module().main(["--studies", str(studies), "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "results.json").read_text())
    assert got["lm_cap50"] == "not yet reported"
    assert not [r for r in got["rows"] if r["source"] == "dose-response/lm-test"]
    assert got["family_size"] == _committed()["family_size"] - 2
    assert "has not reported" in (tmp_path / "out" / "README.md").read_text()


def test_the_papers_numbers_sit_in_one_table_with_ours() -> None:
    lines = (PAGE / "README.md").read_text().splitlines()
    paper = lines.index(next(x for x in lines if x.startswith("| the paper: ALFWorld |")))
    ours = [i for i, x in enumerate(lines) if x.startswith("| [") and "../tabular-coupling-map/" in x]
    assert ours and paper < ours[0]
    assert all(x.startswith("| ") for x in lines[paper:ours[-1] + 1]), "a table ends between the paper's rows and ours"
    assert lines[paper - 1].startswith("|---") and lines[paper - 2].startswith("| where |")
    assert "| the paper: ALFWorld | success | OA+MA | failures expand much more than successes |" in lines[paper]


def test_the_readmes_results_table_is_the_one_the_script_writes() -> None:
    """README.md's block between the markers equals readme_block of the committed evidence, byte for byte: its rows
    are the page's OA+MA rows, not numbers typed by hand."""
    m = _module()
    readme = m.README.read_text(encoding="utf-8")
    start, end = readme.index(m.README_START), readme.index(m.README_END) + len(m.README_END)
    assert readme[start:end] == m.readme_block(m.collect(STUDIES)), "README.md's results table is stale"


def test_the_readme_block_has_every_tabular_setting_and_counts_harms_as_well_as_gains() -> None:
    m = _module()
    c = m.collect(STUDIES)
    block = m.readme_block(c)
    settings = json.loads((STUDIES / "tabular-coupling-map" / "map" / "map.json").read_text())["settings"]
    assert all(f"(`{s}`)" in block for s in settings)
    tab = [r for r in c["tested"] if r.block == "tabular" and r.compared == "OA+MA"]
    harms = sum(r.holm and r.diff.mean < 0 for r in tab)
    assert harms >= 1 and f"− in {harms} of its {len(tab)} settings" in block
    with pytest.raises(m.SourceError, match="markers are missing"):
        m.readme_with_block("# no markers here\n", block)
