"""studies/tools/learning_long.py: run discovery, gains and the seed-paired difference, by hand."""

from __future__ import annotations

import itertools
import json
from functools import partial
from pathlib import Path

import benchmark_scripts
import studies
import pytest


def _module():
    return benchmark_scripts.load("learning_long")


def _run(d: Path, greedy: tuple[float, float], sampled: tuple[float, float]) -> None:
    d.mkdir(parents=True)
    rows = [{"iteration": 0, "eval_success": greedy[0], "eval_sampled_success": sampled[0]},
            {"iteration": 1, "success": 0.5},
            {"iteration": 2, "eval_success": greedy[1], "eval_sampled_success": sampled[1]}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _summary_table(report: str) -> list[str]:
    """The lines of a report's summary table (its header, separator and one row per variant)."""
    return report.split("## Summary\n\n")[1].split("\n\n")[0].splitlines()


def test_run_folders_without_compare_json(tmp_path: Path) -> None:
    # OA+MA greedy gains +0.30, +0.10; row+native +0.10, +0.00: paired differences +0.20, +0.10.
    _run(tmp_path / "runs" / "OA+MA" / "seed-0", (0.2, 0.5), (0.3, 0.4))
    _run(tmp_path / "runs" / "OA+MA" / "seed-1", (0.4, 0.5), (0.3, 0.3))
    _run(tmp_path / "runs" / "row+native" / "seed-0", (0.2, 0.3), (0.3, 0.3))
    _run(tmp_path / "runs" / "row+native" / "seed-1", (0.4, 0.4), (0.3, 0.5))
    _run(tmp_path / "runs" / "row+native" / "seed-2", (0.4, 0.4), (0.3, 0.5))  # unpaired: not in the difference
    (tmp_path / "runs" / "OA+MA" / "seed-3").mkdir()  # unfinished: listed and left out
    out = tmp_path / "report.md"
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--preset", "configs/x.yaml", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# configs/x.yaml across seeds")
    assert "`oma train configs/x.yaml seed=K [algo.accounting=row algo.mass=native]" in text
    assert "| 0 | 0.200 | 0.500 | +0.300 | met |" in text  # +0.30 >= +0.25
    assert "| 1 | 0.400 | 0.500 | +0.100 | not met |" in text
    assert "## OA+MA − row+native, paired by seed (2 seeds)" in text
    assert "- greedy gain: +0.150 ±" in text  # mean of +0.20 and +0.10
    assert "- sampled gain: -0.050 ±" in text  # (+0.1 − 0.0) and (0.0 − 0.2): mean −0.05
    assert "left out: OA+MA/seed-3" in text
    assert (tmp_path / "report.png").is_file()


def test_the_end_as_the_mean_of_the_last_evaluations_by_hand(tmp_path: Path) -> None:
    m = _module()
    curve = {"eval_success": {0: 0.1, 15: 0.3, 30: 0.2, 45: 0.4}, "eval_sampled_success": {0: 0.2, 15: 0.2, 30: 0.5, 45: 0.5}}
    runs = {"OA+MA": {0: curve}, "short": {0: curve}}
    ends = m.averaged_ends(runs, m.Horizons(45, "short", 30), 2)
    assert ends["OA+MA"][0]["eval_success"][45] == pytest.approx((0.2 + 0.4) / 2)
    assert ends["OA+MA"][0]["eval_sampled_success"][45] == pytest.approx(0.5)
    assert ends["short"][0]["eval_success"][30] == pytest.approx((0.3 + 0.2) / 2)  # read at its own horizon
    assert ends["OA+MA"][0]["eval_success"][0] == 0.1 and curve["eval_success"][45] == 0.4  # warm start and input kept
    assert m.averaged_ends(runs, m.Horizons(45), 1) == runs  # k = 1: the evaluation at the horizon
    with pytest.raises(ValueError, match="short/seed-0 has fewer than 2 greedy evaluations after 0 up to 15"):
        m.averaged_ends(runs, m.Horizons(45, "short", 15), 2)
    assert m.last_evaluations(runs, 45, 2) == [30, 45]


def test_the_report_reads_the_mean_of_the_last_evaluations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for seed, (mid, end) in enumerate([(0.4, 0.6), (0.3, 0.3)]):  # greedy gains +0.30 at the end, +0.20 over the last 2
        d = tmp_path / "runs" / "OA+MA" / f"seed-{seed}"
        d.mkdir(parents=True)
        rows = [{"iteration": i, "eval_success": g, "eval_sampled_success": 0.5} for i, g in ((0, 0.2), (1, mid), (2, end))]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.md"
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--last", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "--last 2 --out" in text
    assert ("its endpoint success, the mean of its last 2 evaluations up to its horizon** "
            "(docs/experiments.md#the-metrics; for the horizon 2: iterations 1, 2)") in text
    assert "| 0 | 0.200 | 0.500 | +0.300 | met |" in text  # (0.4 + 0.6) / 2 = 0.5
    assert "| 1 | 0.200 | 0.300 | +0.100 | not met |" in text
    assert "**greedy gain: +0.200 ±" in text
    # the paired tables name the end they read, not the evaluation at the horizon
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--last", "2", "--since", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "## OA+MA: the mean of the last 2 evaluations up to iteration 2 − iteration 1, paired by run (2 seeds)" in text
    assert "- greedy success: +0.050 ± " in text  # (0.5 - 0.4 + 0.3 - 0.3) / 2
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--last", "3", "--out", str(out)]) == 2
    assert "--last 3: OA+MA/seed-0 has fewer than 3 greedy evaluations after 0 up to 2" in capsys.readouterr().err
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--last", "0", "--out", str(out)]) == 2
    assert "--last: expected a count of evaluations >= 1, got 0" in capsys.readouterr().err


def test_the_end_as_the_best_greedy_evaluation_by_hand() -> None:
    m = _module()
    curve = {"eval_success": {0: 0.1, 15: 0.4, 30: 0.2, 45: 0.3, 60: 0.9},
             "eval_sampled_success": {0: 0.2, 15: 0.3, 30: 0.5, 45: 0.6, 60: 0.1}}
    runs = {"OA+MA": {0: curve}, "short": {0: curve}}
    assert m.best_evaluation(curve, 45) == 15 and m.best_evaluation(curve, 60) == 60
    assert m.best_evaluation({"eval_success": {0: 0.1, 15: 0.4, 30: 0.4}}, 30) == 15  # a tie: the earliest
    ends = m.best_ends(runs, m.Horizons(45, "short", 30))
    assert ends["OA+MA"][0]["eval_success"][45] == 0.4 and ends["OA+MA"][0]["eval_sampled_success"][45] == 0.3
    assert ends["short"][0]["eval_success"][30] == 0.4  # read at its own horizon
    assert ends["OA+MA"][0]["eval_success"][0] == 0.1 and curve["eval_success"][45] == 0.3  # warm start and input kept
    with pytest.raises(ValueError, match="OA\\+MA/seed-0: no greedy evaluation after 0 up to 10"):
        m.best_ends(runs, m.Horizons(10))
    gap = {"eval_success": {0: 0.1, 15: 0.4, 30: 0.2}, "eval_sampled_success": {0: 0.2, 30: 0.5}}
    with pytest.raises(ValueError, match="OA\\+MA/seed-1 has no sampled evaluation at 15, its best greedy one"):
        m.best_ends({"OA+MA": {1: gap}}, m.Horizons(30))


def test_the_report_reads_the_best_evaluation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # best greedy gains +0.40 (at 1) and +0.15 (at 2); row+native's runs are the same, so its paired table shows
    for variant, (seed, (mid, end)) in itertools.product(("OA+MA", "row+native"), enumerate([(0.6, 0.4), (0.3, 0.35)])):
        d = tmp_path / "runs" / variant / f"seed-{seed}"
        d.mkdir(parents=True)
        rows = [{"iteration": i, "eval_success": g, "eval_sampled_success": x}
                for i, g, x in ((0, 0.2, 0.5), (1, mid, 0.7), (2, end, 0.6))]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "r.md"
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--best", "--out", str(out)]) == 0
    text = out.read_text()
    assert "--horizon 2 --best --out" in text and "an upper bound on what early stopping" in text
    assert "| 0 | 0.200 | 0.600 | +0.400 | met | 0.500 | 0.700 | +0.200 |" in text  # the sampled of iteration 1
    assert "| 1 | 0.200 | 0.350 | +0.150 | not met | 0.500 | 0.600 | +0.100 |" in text
    assert "Chosen evaluations (iteration): seed 0: 1, seed 1: 2" in text
    assert "**greedy gain: +0.275 ±" in text
    paired = [ln for ln in text.splitlines() if "success at" in ln]
    assert len(paired) == 2 and all("success at the best evaluation up to iteration 2: +0.000 ±" in ln for ln in paired)
    for bad in (["--last", "2"], ["--since", "1"]):
        assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--best", *bad, "--out", str(out)]) == 2
        assert "--best: not with --last or --since" in capsys.readouterr().err


def test_an_empty_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _module().main([str(tmp_path), "--out", str(tmp_path / "r.md")]) == 2
    assert "no runs found" in capsys.readouterr().err


def test_a_comparison_names_its_own_preset(tmp_path: Path) -> None:
    _run(tmp_path / "cmp" / "OA+MA" / "seed-0", (0.2, 0.3), (0.3, 0.4))
    doc = {"command": "oma compare configs/y.yaml --variants 2", "config_path": "configs/y.yaml", "horizon": 2,
           "seeds": [0, 1], "variants": [{"name": "OA+MA", "algo.accounting": "trajectory", "algo.mass": "uniform"}],
           "config": {}, "runs": {"OA+MA/seed-0": {}, "OA+MA/seed-1": {}}}  # seed 1 never ran: left out
    (tmp_path / "cmp" / "compare.json").write_text(json.dumps(doc))
    out = tmp_path / "report.md"
    assert _module().main([str(tmp_path / "cmp"), "--horizon", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# configs/y.yaml across seeds")
    assert "Commands: `oma compare configs/y.yaml --variants 2` then" in text
    assert "| 0 | 0.200 | 0.300 | +0.100 | not met |" in text and "- greedy gain: +0.100 (one seed)" in text
    assert "left out: OA+MA/seed-1" in text


def test_the_default_jobs_target_is_judged_over_seeds(tmp_path: Path) -> None:
    # greedy gains +0.15, +0.10, +0.20: mean +0.15, CI above 0 -> met; sampled +0.15, -0.05, +0.10: mean
    # +0.067 -> not met. No per-run target column.
    for seed, g, s in ((0, 0.15, 0.15), (1, 0.10, -0.05), (2, 0.20, 0.10)):
        _run(tmp_path / "runs" / "OA+MA" / f"seed-{seed}", (0.3, 0.3 + g), (0.4, 0.4 + s))
    out = tmp_path / "report.md"
    args = [str(tmp_path / "runs"), "--horizon", "2", "--target", "default", "--preset", "configs/d.yaml", "--out", str(out)]
    assert _module().main(args) == 0
    text = out.read_text()
    assert "--horizon 2 --target default --out" in text and "Target (the default job's)" in text
    assert "| 0 | 0.300 | 0.450 | +0.150 | 0.400 | 0.550 | +0.150 |" in text  # no target cell
    assert "- **greedy gain: +0.150 ±" in text and "n = 3 seeds; target met)" in text
    assert "- **sampled gain: +0.067 ±" in text and "n = 3 seeds; target not met)" in text
    m = _module()
    from oma.experiments.stats import mean_ci

    assert m.meets_mean_target(mean_ci([0.15, 0.10, 0.20]))
    assert not m.meets_mean_target(mean_ci([0.30, -0.05, 0.20]))  # mean +0.15, CI reaches below 0
    assert not m.meets_mean_target(mean_ci([0.09, 0.09, 0.09]))  # CI above 0, mean below +0.10


def test_every_variant_is_paired_against_the_baseline_in_gain_and_in_final_success(tmp_path: Path) -> None:
    # base greedy 0.2 -> 0.3 and 0.4 -> 0.4 (gains +0.1, 0.0); "a" 0.5 -> 0.5 and 0.6 -> 0.8 (gains 0.0, +0.2):
    # gain differences -0.1, +0.2 (mean +0.05); final differences 0.5 - 0.3, 0.8 - 0.4 = +0.2, +0.4 (mean +0.3).
    _run(tmp_path / "runs" / "base" / "seed-0", (0.2, 0.3), (0.3, 0.3))
    _run(tmp_path / "runs" / "base" / "seed-1", (0.4, 0.4), (0.3, 0.3))
    _run(tmp_path / "runs" / "a" / "seed-0", (0.5, 0.5), (0.3, 0.3))
    _run(tmp_path / "runs" / "a" / "seed-1", (0.6, 0.8), (0.3, 0.3))
    _run(tmp_path / "runs" / "b" / "seed-1", (0.6, 0.8), (0.3, 0.3))  # one common seed: no pairing
    out = tmp_path / "report.md"
    args = [str(tmp_path / "runs"), "--horizon", "2", "--target", "default", "--baseline", "base",
            "--command", "`oma train seed=K threads=1`,", "--out", str(out)]
    assert _module().main(args) == 0
    text = out.read_text()
    assert "Commands: `oma train seed=K threads=1`, then" in text
    assert "--target default --baseline 'base' --command TEXT --out" in text
    assert "## a − base, paired by seed (2 seeds)" in text and "## b − base" not in text and "## base −" not in text
    assert "- greedy gain: +0.050 ±" in text
    assert "- greedy success at iteration 2: +0.300 ±" in text
    assert "- sampled gain: +0.000 ±" in text


def test_runs_with_other_episodes_per_iteration_are_compared_on_the_same_data(tmp_path: Path) -> None:
    # "big" rolls out 2 tasks x 4 = 8 episodes per iteration, "small" 1 task x 4 = 4: with --unit episode,
    # big's iteration 1 and small's iteration 2 are both episode 8. _run evaluates at iterations 0 and 2, so
    # only small reaches episode 8 there; big's evaluation at iteration 1 is written by hand.
    _run(tmp_path / "runs" / "small" / "seed-0", (0.2, 0.5), (0.3, 0.4))
    big = tmp_path / "runs" / "big" / "seed-0"
    big.mkdir(parents=True)
    rows = [{"iteration": 0, "eval_success": 0.2, "eval_sampled_success": 0.3},
            {"iteration": 1, "eval_success": 0.3, "eval_sampled_success": 0.2}]
    (big / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for d, tasks in ((tmp_path / "runs" / "small" / "seed-0", 1), (big, 2)):
        (d / "config.json").write_text(json.dumps({"env": {"tasks_per_iter": tasks, "group_size": 4}}))
    out = tmp_path / "report.md"
    args = [str(tmp_path / "runs"), "--horizon", "8", "--unit", "episode", "--target", "default", "--out", str(out)]
    assert _module().main(args) == 0
    text = out.read_text()
    assert "--horizon 8 --unit episode --target default --out" in text
    assert "training episodes 0 (the warm start) to 8; gain = training episode 8 − training episode 0" in text
    assert "| 0 | 0.200 | 0.500 | +0.300 | 0.300 | 0.400 | +0.100 |" in text  # small at its iteration 2
    assert "| 0 | 0.200 | 0.300 | +0.100 | 0.300 | 0.200 | -0.100 |" in text  # big at its iteration 1
    # by iteration, at horizon 2, big (evaluated at iterations 0 and 1 only) is left out
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--out", str(tmp_path / "it.md")]) == 0
    assert "left out: big/seed-0" in (tmp_path / "it.md").read_text()


def test_episodes_need_the_runs_config(tmp_path: Path) -> None:
    _run(tmp_path / "runs" / "a" / "seed-0", (0.2, 0.5), (0.3, 0.4))
    with pytest.raises(SystemExit, match="no config.json"):
        _module().main([str(tmp_path / "runs"), "--horizon", "8", "--unit", "episode", "--out", str(tmp_path / "r.md")])


def test_a_named_baseline_without_runs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "runs" / "a" / "seed-0", (0.5, 0.5), (0.3, 0.3))
    _run(tmp_path / "runs" / "a" / "seed-1", (0.6, 0.8), (0.3, 0.3))
    (tmp_path / "runs" / "base" / "seed-0").mkdir(parents=True)  # started, not finished at the horizon
    out = tmp_path / "report.md"
    for name in ("bsae", "base"):  # a typo, and a variant with no finished run
        assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--baseline", name, "--out", str(out)]) == 2
        assert f"--baseline '{name}': no finished runs" in capsys.readouterr().err
    assert not out.exists()
    # unnamed, the row+native default is paired where it has runs and skipped where it has none
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--out", str(out)]) == 0
    assert "paired by seed" not in out.read_text()


def test_a_long_legend_goes_below_the_panels(tmp_path: Path) -> None:
    # four variants: the legend leaves the greedy panel (where it would cover the curves) for the figure,
    # and the figure grows by its two rows
    import matplotlib.image

    m = _module()
    runs = {f"variant {k}": {0: {"eval_success": {0: 0.1, 2: 0.2}, "eval_sampled_success": {0: 0.1, 2: 0.3}}}
            for k in range(4)}
    m.plot(runs, tmp_path / "four.png", 2)
    m.plot(dict(list(runs.items())[:3]), tmp_path / "three.png", 2)
    four, three = (matplotlib.image.imread(tmp_path / f"{n}.png") for n in ("four", "three"))
    assert four.shape[1] == three.shape[1]
    assert four.shape[0] == round(120 * (3.6 + 0.25 * 2)) and three.shape[0] == round(120 * 3.6)


def test_the_summary_puts_the_baseline_first_then_ranks_by_greedy_gain(tmp_path: Path) -> None:
    # greedy gains: base +0.1, 0.0 (mean +0.05); a 0.0, +0.2 (mean +0.10); c +0.3 on seed 0 only.
    # a − base, paired: −0.1, +0.2 -> mean +0.05, sd 0.3/√2, half-width t(0.975, 1) · sd / √2 = 12.706 · 0.15 = 1.906.
    # Sampled gains are all 0. c shares one seed with base: not paired.
    _run(tmp_path / "runs" / "a" / "seed-0", (0.5, 0.5), (0.3, 0.3))
    _run(tmp_path / "runs" / "a" / "seed-1", (0.6, 0.8), (0.3, 0.3))
    _run(tmp_path / "runs" / "base" / "seed-0", (0.2, 0.3), (0.3, 0.3))
    _run(tmp_path / "runs" / "base" / "seed-1", (0.4, 0.4), (0.3, 0.3))
    _run(tmp_path / "runs" / "c" / "seed-0", (0.2, 0.5), (0.3, 0.3))
    out = tmp_path / "report.md"
    args = [str(tmp_path / "runs"), "--horizon", "2", "--target", "default", "--baseline", "base", "--out", str(out)]
    assert _module().main(args) == 0
    table = _summary_table(out.read_text())
    assert table[0] == ("| variant | seeds | greedy gain | sampled gain | greedy gain − base's, paired "
                        "| sampled gain − base's, paired |")
    assert table[2] == "| base | 0, 1 | +0.050 ± 0.635 | +0.000 ± 0.000 |  |  |"  # sd 0.1/√2 · 12.706 / √2
    assert table[3] == "| c | 0 | +0.300 (one seed) | +0.000 (one seed) |  |  |"
    assert table[4] == "| a | 0, 1 | +0.100 ± 1.271 | +0.000 ± 0.000 | +0.050 ± 1.906 | +0.000 ± 0.000 |"
    assert len(table) == 5
    assert (tmp_path / "report-gains.png").is_file() and "![gains per variant](report-gains.png)" in out.read_text()


def test_several_folders_are_one_study_and_the_summary_counts_runs_meeting_the_per_run_target(tmp_path: Path) -> None:
    # Seeds 0-1 in one folder, seed 2 of both variants in another. Greedy gains, per run:
    # OA+MA      0.2 -> 0.5 +0.30 met; 0.4 -> 0.5 +0.10 not met (neither +0.25 nor double); 0.1 -> 0.2 +0.10 met (doubles)
    # row+native 0.2 -> 0.5 +0.30 met; 0.4 -> 0.4 +0.00 not met;                             0.1 -> 0.3 +0.20 met (triples)
    # so 2 of 3 runs each, mean gains 0.5 / 3 = +0.167 each, paired differences 0, +0.1, -0.1 (mean 0).
    _run(tmp_path / "a" / "OA+MA" / "seed-0", (0.2, 0.5), (0.3, 0.3))
    _run(tmp_path / "a" / "OA+MA" / "seed-1", (0.4, 0.5), (0.3, 0.3))
    _run(tmp_path / "a" / "row+native" / "seed-0", (0.2, 0.5), (0.3, 0.3))
    _run(tmp_path / "a" / "row+native" / "seed-1", (0.4, 0.4), (0.3, 0.3))
    _run(tmp_path / "b" / "OA+MA" / "seed-2", (0.1, 0.2), (0.3, 0.3))
    _run(tmp_path / "b" / "row+native" / "seed-2", (0.1, 0.3), (0.3, 0.3))
    out = tmp_path / "report.md"
    assert _module().main([str(tmp_path / "a"), str(tmp_path / "b"), "--horizon", "2", "--out", str(out)]) == 0
    text = out.read_text()
    assert f"studies/tools/learning_long.py {tmp_path / 'a'} {tmp_path / 'b'} --preset" in text
    assert "out_dir=DIR/<variant>/seed-K`" in text
    table = _summary_table(text)
    assert table[0].startswith("| variant | seeds | greedy gain | sampled gain | runs meeting the target | greedy gain − ")
    assert table[2].startswith("| row+native | 0, 1, 2 | +0.167 ± ") and table[2].split(" | ")[4] == "2 of 3"
    assert table[3].startswith("| OA+MA | 0, 1, 2 | +0.167 ± ") and table[3].split(" | ")[4] == "2 of 3"
    assert "## OA+MA − row+native, paired by seed (3 seeds)" in text
    assert "- greedy gain: +0.000 ±" in text  # 0.0, +0.1, −0.1


def test_the_summary_has_no_count_under_the_default_jobs_target(tmp_path: Path) -> None:
    _run(tmp_path / "runs" / "x" / "seed-0", (0.2, 0.5), (0.3, 0.3))
    _run(tmp_path / "runs" / "y" / "seed-0", (0.2, 0.3), (0.3, 0.3))
    out = tmp_path / "report.md"
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--target", "default", "--out", str(out)]) == 0
    assert "runs meeting the target" not in out.read_text()


def test_one_seed_in_two_folders_or_a_folder_without_runs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "a" / "OA+MA" / "seed-0", (0.2, 0.5), (0.3, 0.3))
    _run(tmp_path / "b" / "OA+MA" / "seed-0", (0.2, 0.4), (0.3, 0.3))
    (tmp_path / "empty").mkdir()
    out = tmp_path / "report.md"
    assert _module().main([str(tmp_path / "a"), str(tmp_path / "b"), "--horizon", "2", "--out", str(out)]) == 2
    assert f"OA+MA/seed-0 is in both {tmp_path / 'a'} and {tmp_path / 'b'}" in capsys.readouterr().err
    assert _module().main([str(tmp_path / "a"), str(tmp_path / "empty"), "--horizon", "2", "--out", str(out)]) == 2
    assert f"{tmp_path / 'empty'}: no runs found" in capsys.readouterr().err
    assert not out.exists()


def _curve_run(d: Path, greedy: dict[int, float]) -> None:
    d.mkdir(parents=True)
    rows = [{"iteration": i, "eval_success": g, "eval_sampled_success": 0.3} for i, g in greedy.items()]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_the_baseline_read_at_its_own_horizon(tmp_path: Path) -> None:
    # long: evaluated at 0, 1, 3; greedy gains at 3: +0.3 (seed 0), +0.2 (seed 1). short: evaluated at 0 and 1
    # only, gains at 1: +0.1, +0.0. Paired at 3 against 1: +0.2, +0.2 -> +0.200 ± 0.000.
    _curve_run(tmp_path / "runs" / "long" / "seed-0", {0: 0.2, 1: 0.3, 3: 0.5})
    _curve_run(tmp_path / "runs" / "long" / "seed-1", {0: 0.4, 1: 0.4, 3: 0.6})
    _curve_run(tmp_path / "runs" / "short" / "seed-0", {0: 0.2, 1: 0.3})
    _curve_run(tmp_path / "runs" / "short" / "seed-1", {0: 0.4, 1: 0.4})
    out = tmp_path / "r.md"
    base = [str(tmp_path / "runs"), "--horizon", "3", "--target", "default", "--baseline", "short", "--out", str(out)]
    assert _module().main(base) == 2  # at 3 the short job has no finished runs
    assert _module().main([*base, "--baseline-horizon", "1"]) == 0
    text = out.read_text()
    table = _summary_table(text)
    assert table[2] == "| short | 0, 1 | +0.050 ± 0.635 | +0.000 ± 0.000 |  |  |"
    assert table[3] == "| long | 0, 1 | +0.250 ± 0.635 | +0.000 ± 0.000 | +0.200 ± 0.000 | +0.000 ± 0.000 |"
    assert "- greedy gain: +0.200 ± 0.000" in text and "- greedy success at iteration 3 against iteration 1: +0.200 ± 0.000" in text
    assert "| 0 | 0.200 | 0.300 | +0.100 |" in text.split("## short")[1]  # the short job's table ends at 1
    assert "--baseline 'short' --baseline-horizon 1" in text and "short is read at iteration 1" in text
    # without a baseline there is nothing to read elsewhere
    assert _module().main([str(tmp_path / "runs"), "--baseline-horizon", "1", "--out", str(out)]) == 2


def test_the_summary_without_the_baseline_has_no_paired_columns(tmp_path: Path) -> None:
    m = _module()
    runs = {v: {k: {"eval_success": {0: 0.1, 2: 0.1 + g}, "eval_sampled_success": {0: 0.1, 2: 0.1}}
                for k, g in enumerate(gains)} for v, gains in (("x", (0.1, 0.3)), ("y", (0.2, 0.4)))}
    lines = m.summary(runs, m.Horizons(2), "row+native")
    assert lines[2] == "| variant | seeds | greedy gain | sampled gain |"
    assert [line.split(" | ")[0] for line in lines[4:6]] == ["| y", "| x"]  # mean +0.30 before +0.20


def test_the_forest_grows_a_row_per_variant(tmp_path: Path) -> None:
    import matplotlib.image

    m = _module()
    runs = {f"variant {k}": {s: {"eval_success": {0: 0.1, 2: 0.1 + 0.05 * s}, "eval_sampled_success": {0: 0.1, 2: 0.2}}
                             for s in range(3)} for k in range(5)}
    m.forest(runs, tmp_path / "five.png", m.Horizons(2), "variant 0", 0.10)
    five = matplotlib.image.imread(tmp_path / "five.png")
    assert five.shape[0] == round(120 * (1.2 + 0.32 * 5))


DEFAULT_JOB = ["--preset", "studies/default-job/household-gigpo-oma-2026-12-04.yaml", "--horizon", "15"]
TERSE = ["--preset", "studies/default-job/household-gigpo-oma-terse.yaml"]


def _terse_against(horizon: int, baseline: str = "the default job", baseline_horizon: int = 15) -> list[str]:
    """A terse job read at ``horizon`` against ``baseline`` read at the end of its own job."""
    return [*TERSE, "--horizon", str(horizon), "--baseline", baseline, "--baseline-horizon", str(baseline_horizon)]


@pytest.mark.parametrize(("page", "evidence", "extra"), [
    ("learning-default-15-seeds", "2026-12-04-15-seeds", DEFAULT_JOB),
    ("learning-default-oracle", "2026-12-04-oracle", [*DEFAULT_JOB, "--baseline", "the default job"]),
    ("learning-default-150", "2026-12-04-150-iterations",
     ["--preset", "studies/default-job/household-gigpo-oma-long.yaml", "--horizon", "150"]),
    ("learning-default-batch", "2026-12-04-batch",
     [*DEFAULT_JOB[:2], "--horizon", "960", "--unit", "episode", "--baseline", "the default job"]),
    ("learning-default-hidden-64", "2026-12-04-hidden-64",
     [*DEFAULT_JOB[:2], "--horizon", "60", "--baseline", "the default job's recipe"]),
    ("learning-default-terse", "2026-12-04-terse",
     [*DEFAULT_JOB[:2], "--horizon", "60", "--baseline", "the default job's recipe"]),
    ("learning-default-terse-45", "2026-12-04-terse-45", _terse_against(45)),
    ("learning-default-train-horizon", "2026-12-04-train-horizon",
     [*DEFAULT_JOB[:2], "--horizon", "60", "--baseline", "terse, no training cap"]),
    ("learning-default-cap20-150", "2026-12-04-cap20-150",
     [*DEFAULT_JOB[:2], "--horizon", "150", "--baseline", "the default job's recipe"]),
    ("learning-default-fast", "2026-12-04-fast", _terse_against(60)),
    ("learning-default-fast-vs-terse-45", "2026-12-04-fast-vs-terse-45", _terse_against(60, "terse, 45 iterations", 45)),
    ("learning-default-cap20-75", "2026-12-04-cap20-75", _terse_against(75)),
    ("learning-default-ema", "2026-12-05-default-ema-15-24",  # the default job with its average, seeds 15-24
     ["--preset", "configs/household-gigpo-oma.yaml", "--horizon", "75"]),
    ("learning-default-cap20-75-pooled", "2026-12-04-cap20-75-pooled", _terse_against(75)),
    ("learning-default-cap20-375", "2026-12-05-cap20-375",  # judged by the long preset's per-run target
     ["--preset", "configs/household-gigpo-oma.yaml", "--horizon", "375", "--target", "long",
      "--baseline", "terse, cap 20, 300 iterations", "--baseline-horizon", "300"]),
    ("learning-default-375-accounting", "2026-12-05-accounting-375",  # row+native, the baseline unless named
     ["--preset", "configs/household-gigpo-oma.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-default-375-last-3", "2026-12-05-accounting-375",  # the same runs, each end the mean of 3 evaluations
     ["--preset", "studies/default-job-375/household-gigpo-oma-375.yaml", "--horizon", "375", "--target", "long", "--last", "3"]),
    ("learning-grpo-375", "2026-12-05-grpo-375",  # target 2's preset, row+native the baseline
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-grpo-375-last-3", "2026-12-05-grpo-375",  # the same runs, each end the mean of 3 evaluations
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long", "--last", "3"]),
    ("learning-grpo-375-8-seeds", ("2026-12-05-grpo-375", "2026-12-05-grpo-375-seeds-5-7"),  # 3 more seeds
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-grpo-375-8-seeds-last-3", ("2026-12-05-grpo-375", "2026-12-05-grpo-375-seeds-5-7"),
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long", "--last", "3"]),
    ("learning-grpo-375-ema-8-seeds", ("2026-12-05-grpo-375-ema", "2026-12-05-grpo-375-ema-seeds-5-7"),
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-grpo-375-ema", "2026-12-05-grpo-375-ema",  # the same runs, averaging their weights from 275
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-grpo-375-ema-last-3", "2026-12-05-grpo-375-ema",
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long", "--last", "3"]),
    ("learning-grpo-525", "2026-12-05-grpo-525",  # the 8-seed study's runs continued to 525 (a longer budget)
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "525", "--target", "long", "--since", "375"]),
    ("learning-grpo-525-at-450", "2026-12-05-grpo-525",  # the same runs at 450, secondary
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "450", "--target", "long", "--since", "375"]),
    ("learning-grpo-525-last-3", "2026-12-05-grpo-525",  # the same runs, each end the mean of 3 evaluations
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "525", "--target", "long", "--since", "375",
      "--last", "3"]),
    ("learning-grpo-375-10-seeds",  # seeds 8-9 trained to 525, read at 375 (the preset's end)
     ("2026-12-05-grpo-375", "2026-12-05-grpo-375-seeds-5-7", "2026-12-05-grpo-525-seeds-8-9"),
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-grpo-525-10-seeds", ("2026-12-05-grpo-525", "2026-12-05-grpo-525-seeds-8-9"),
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "525", "--target", "long", "--since", "375"]),
    ("learning-grpo-375-12-seeds",  # seeds 10-11 trained to 525 as well, read at 375
     ("2026-12-05-grpo-375", "2026-12-05-grpo-375-seeds-5-7", "2026-12-05-grpo-525-seeds-8-9",
      "2026-12-06-grpo-525-seeds-10-11"),
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long"]),
    ("learning-grpo-525-12-seeds",
     ("2026-12-05-grpo-525", "2026-12-05-grpo-525-seeds-8-9", "2026-12-06-grpo-525-seeds-10-11"),
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "525", "--target", "long", "--since", "375"]),
    ("learning-grpo-420-ema", "2026-12-06-grpo-420-ema",  # a candidate: evaluation time spent on iterations, the average
     ["--preset", "configs/household-grpo-oma-long.yaml", "--horizon", "420", "--target", "long"]),
    ("learning-grpo-375-best", ("2026-12-05-grpo-375", "2026-12-05-grpo-375-seeds-5-7"),  # an oracle's checkpoint
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "375", "--target", "long", "--best"]),
    ("learning-grpo-525-best", "2026-12-05-grpo-525",
     ["--preset", "studies/longer-preset/household-grpo-oma-375.yaml", "--horizon", "525", "--target", "long", "--best"]),
    ("learning-default-75-accounting", "2026-12-05-accounting-75",  # row+native, the baseline unless named
     ["--preset", "configs/household-gigpo-oma.yaml", "--horizon", "75"]),
    ("learning-default-cap20-300", "2026-12-04-cap20-300",  # judged by the long preset's per-run target
     ["--preset", "configs/household-gigpo-oma.yaml", "--horizon", "300", "--target", "long",
      "--baseline", "terse, cap 20, 150 iterations", "--baseline-horizon", "150"]),
])
def test_a_committed_page_is_what_its_committed_runs_give(tmp_path: Path, page: str, evidence: str | tuple[str, ...],
                                                          extra: list[str]) -> None:
    """Every table of the page, regenerated from the runs' metrics committed under studies/*/evidence/
    (one folder, or several read as one study; judged by the default job's target unless ``extra`` names
    another: the last --target counts)."""
    out = tmp_path / f"{page}.md"
    folders = [str(studies.evidence(e)) for e in ((evidence,) if isinstance(evidence, str) else evidence)]
    assert _module().main([*folders, "--target", "default", *extra, "--command", "TEXT", "--out", str(out)]) == 0

    def body(text: str) -> list[str]:  # the commands line names the paths; the tables must match exactly
        return [ln for ln in text.splitlines()[3:] if not ln.startswith("![")]

    committed = body(studies.page(page).read_text())
    assert sum(ln.startswith("| ") for ln in committed) > 5  # a header and 5 seeds at least
    assert body(out.read_text()) == committed


def test_each_reading_of_a_runs_end_is_named() -> None:
    m = _module()
    assert m.end_name("iteration", 375) == "iteration 375"
    assert m.end_name("episode", 60, last=3) == "the mean of the last 3 evaluations up to episode 60"
    assert m.end_name("iteration", 525, best=True) == "the best evaluation up to iteration 525"


def test_the_points_each_end_is_read_from_by_hand() -> None:
    m = _module()
    curve = {"eval_success": {0: 0.1, 15: 0.4, 30: 0.2, 45: 0.3, 60: 0.9}, "eval_sampled_success": {}}
    assert m.read_points(curve, 45, best=True) == [15]
    assert m.read_points(curve, 45, last=2) == [30, 45]
    assert m.read_points(curve, 45) == [45]
    assert m.read_points(curve, 60, last=3) == [30, 45, 60]


def test_the_learning_curves_mark_the_points_a_last_or_best_reading_takes(tmp_path: Path) -> None:
    for seed, greedy in enumerate([{0: 0.2, 1: 0.5, 2: 0.3}, {0: 0.4, 1: 0.5, 2: 0.6}]):
        _curve_run(tmp_path / "runs" / "OA+MA" / f"seed-{seed}", greedy)
    pngs = {}
    for name, flags in (("plain", []), ("last", ["--last", "2"]), ("best", ["--best"])):
        out = tmp_path / f"{name}.md"
        assert _module().main([str(tmp_path / "runs"), "--horizon", "2", *flags, "--out", str(out)]) == 0
        pngs[name] = out.with_suffix(".png").read_bytes()
        assert ("the ones each end reads marked" in out.read_text()) == (name == "last")
        assert ("the one each end reads marked" in out.read_text()) == (name == "best")
    assert len(set(pngs.values())) == 3  # the marks differ, and none is the plain plot


def test_a_baseline_read_at_its_own_horizon_is_named_with_its_reading() -> None:
    m = _module()
    # success at the ends, long − short by seed: 0.6 − 0.3 and 0.6 − 0.4 -> (0.3 + 0.2) / 2 = +0.25
    runs = {"long": {0: {"eval_success": {0: 0.2, 3: 0.6}, "eval_sampled_success": {0: 0.2, 3: 0.2}},
                     1: {"eval_success": {0: 0.4, 3: 0.6}, "eval_sampled_success": {0: 0.2, 3: 0.2}}},
            "short": {0: {"eval_success": {0: 0.2, 1: 0.3}, "eval_sampled_success": {0: 0.2, 1: 0.2}},
                      1: {"eval_success": {0: 0.4, 1: 0.4}, "eval_sampled_success": {0: 0.2, 1: 0.2}}}}
    horizons = m.Horizons(3, "short", 1)
    lines = m.paired(runs, horizons, "short")
    assert lines[3].startswith("- greedy success at iteration 3 against iteration 1: +0.250 ± ")
    last = m.paired(runs, horizons, "short", at=partial(m.end_name, "iteration", last=2))
    assert last[3].startswith("- greedy success at the mean of the last 2 evaluations up to iteration 3 against "
                              "the mean of the last 2 evaluations up to iteration 1: +0.250 ± ")


def test_what_the_iterations_after_a_point_added_by_hand() -> None:
    m = _module()
    # greedy 0.50 -> 0.60 and 0.40 -> 0.35 from iteration 15 to 30: differences +0.10, -0.05, mean +0.025
    runs = {"OA+MA": {0: {"eval_success": {0: 0.3, 15: 0.5, 30: 0.6}, "eval_sampled_success": {0: 0.3, 15: 0.4, 30: 0.5}},
                      1: {"eval_success": {0: 0.2, 15: 0.4, 30: 0.35}, "eval_sampled_success": {0: 0.3, 15: 0.4, 30: 0.6}}}}
    lines = m.since(runs, m.Horizons(30), 15)
    assert lines[0] == "## OA+MA: iteration 30 − iteration 15, paired by run (2 seeds)"
    assert lines[2].startswith("- greedy success: +0.025 ± ") and lines[2].endswith("; higher in 1 of 2 runs")
    assert lines[3].startswith("- sampled success: +0.150 ± ") and lines[3].endswith("; higher in 2 of 2 runs")
    with pytest.raises(ValueError, match="OA\\+MA/seed-0 has no evaluation at iteration 20"):
        m.since(runs, m.Horizons(30), 20)


def test_the_report_adds_what_came_after_since(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for seed, greedy in enumerate([{0: 0.2, 1: 0.3, 2: 0.6}, {0: 0.4, 1: 0.5, 2: 0.5}]):
        _curve_run(tmp_path / "runs" / "OA+MA" / f"seed-{seed}", greedy)
    out = tmp_path / "r.md"
    assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--since", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "--horizon 2 --since 1 --out" in text
    assert "## OA+MA: iteration 2 − iteration 1, paired by run (2 seeds)" in text
    assert "- greedy success: +0.150 ± " in text and "higher in 1 of 2 runs" in text  # (+0.3 + 0.0) / 2
    for bad in ("0", "2"):
        assert _module().main([str(tmp_path / "runs"), "--horizon", "2", "--since", bad, "--out", str(out)]) == 2
        assert f"--since: expected a point after 0 and before --horizon 2, got {bad}" in capsys.readouterr().err
