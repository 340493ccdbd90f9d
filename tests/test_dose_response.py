"""`oma dose-response` (docs/experiments.md#dose-response): the regression by hand and against numpy, a tiny sweep end to
end, the pilot, bad input."""

import json
import math

import numpy as np
import pytest

import oma.train
from oma.cli import main as oma_main
from oma.experiments.dose_response import Fit, fit_line, load_fits, predict

T975 = {2: 4.303, 4: 2.776, 6: 2.447}  # Student-t table, two-sided 95%


def test_the_line_by_hand():
    """x = 1, 1, 2, 2, 3, 3 and y = x ± 0.1: slope 1, intercept 0, RSS = 6 × 0.01, s = √(0.06 / 4), Sxx = 4."""
    f = fit_line([1, 1, 2, 2, 3, 3], [1.1, 0.9, 2.1, 1.9, 3.1, 2.9])
    s = math.sqrt(0.06 / 4)
    assert (f.slope, f.intercept, f.n, f.df, f.x_mean, f.sxx) == pytest.approx((1.0, 0.0, 6, 4, 2.0, 4.0))
    assert f.s == pytest.approx(s) and (f.x_min, f.x_max) == (1.0, 3.0)
    # CIs from the t table: b ± t · s / √Sxx; a ± t · s · √(1/n + x̄² / Sxx)
    assert f.slope_ci.half_width == pytest.approx(T975[4] * s / 2, rel=1e-3)
    assert f.intercept_ci.half_width == pytest.approx(T975[4] * s * math.sqrt(1 / 6 + 4 / 4), rel=1e-3)
    assert f.slope_ci.significant and f.slope_ci.p < 1e-4 and not f.intercept_ci.significant
    # the mean response at r = 2.5: 2.5 ± t · s · √(1/6 + 0.5² / 4); at x̄ the narrowest, t · s / √n
    at = predict(f, 2.5)
    assert at.mean == pytest.approx(2.5) and at.half_width == pytest.approx(T975[4] * s * math.sqrt(1 / 6 + 0.25 / 4),
                                                                            rel=1e-3)
    assert predict(f, 2.0).half_width == pytest.approx(T975[4] * s / math.sqrt(6), rel=1e-3)
    assert predict(f, 0.0).mean == f.intercept and predict(f, 0.0).half_width == pytest.approx(f.intercept_ci.half_width)


def test_the_line_against_polyfit_and_a_plain_loop():
    rng = np.random.default_rng(0)
    x = np.repeat([1.2, 2.0, 3.1, 4.4], 30)
    y = 0.05 - 0.02 * x + rng.normal(0, 0.03, x.size)
    f = fit_line(x, y)
    slope, intercept = np.polyfit(x, y, 1)
    assert (f.slope, f.intercept) == pytest.approx((slope, intercept), rel=1e-10)
    n = len(x)
    sx, sy, sxx, sxy = 0.0, 0.0, 0.0, 0.0
    for xi, yi in zip(x, y):
        sx, sy, sxx, sxy = sx + xi, sy + yi, sxx + xi * xi, sxy + xi * yi
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a = (sy - b * sx) / n
    rss = sum((yi - a - b * xi) ** 2 for xi, yi in zip(x, y))
    assert (f.slope, f.intercept, f.s) == pytest.approx((b, a, math.sqrt(rss / (n - 2))), rel=1e-9)
    assert f.slope_ci.lo < -0.02 < f.slope_ci.hi  # the true slope inside its 95% CI (this draw)
    assert Fit.from_dict(json.loads(json.dumps(f.to_dict()))) == f


def test_the_line_refuses_what_gives_no_slope():
    with pytest.raises(ValueError, match="do not vary"):
        fit_line([2.0, 2.0, 2.0], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="at least 2 points"):
        fit_line([1.0], [0.1])
    two = fit_line([1.0, 2.0], [0.0, 1.0])  # a line through two points: no residual degree of freedom
    assert two.slope == pytest.approx(1.0) and math.isnan(two.slope_ci.half_width) and not two.slope_ci.significant
    assert two.to_dict()["s"] is None and math.isnan(Fit.from_dict(two.to_dict()).s)


SWEEP = ["env.eval_tasks=8", "eval_every=1", "--settings", "stay-grpo,trap-grpo", "--caps", "stay=12,18", "trap=5,8",
         "--eval-cap", "stay=12", "--seeds", "2", "--horizon", "2", "--predict-at", "1.5"]
"""Loops with a held-out cap of their own (12), traps with the cap bounding both."""


def test_a_tiny_sweep_end_to_end_and_resumed(tmp_path, monkeypatch, capsys):
    out = tmp_path / "dose"
    assert oma_main(["dose-response", *SWEEP, "--out", str(out)]) == 0
    cells = ["stay-grpo-cap12-eval12", "stay-grpo-cap18-eval12", "trap-grpo-cap5", "trap-grpo-cap8"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == cells
    for c in cells:
        doc = json.loads((out / c / "compare.json").read_text())
        env, cap = doc["config"]["env"], int(c.split("-cap", 1)[1].split("-")[0])
        assert doc["config"]["dump_batches"] is False
        if c.startswith("stay"):  # training episodes end at the cap, held-out ones at 12
            assert (env["options"]["max_steps"], env["train_max_steps"], env["eval_max_steps"]) == (max(cap, 12), cap, 12)
        else:
            assert (env["options"]["max_steps"], env["train_max_steps"], env["eval_max_steps"]) == (cap, None, None)
        assert [v["name"] for v in doc["variants"]] == ["row+native", "row+MA", "OA+native", "OA+MA"]
        assert not list((out / c).glob("*/seed-*/batches"))
    readme = (out / "README.md").read_text()
    for section in ("## Command", "## Design", "## The cells: endpoint", "## The cells: nAUC", "## The slopes",
                    "## Predicting from the fits", "## Machine and wall time"):
        assert section in readme, section
    assert "| 12, 18 | 12 |" in readme and "| 5, 8 | the cap |" in readme  # each kind's held-out cap
    assert (out / "dose_response.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((out / "dose_response.json").read_text())
    assert doc["eval_caps"] == {"stay": 12}
    # a trap's failures all run to the cap and its successes last the chain's length: ratio cap / 4, exactly
    assert doc["cells"]["trap-grpo-cap5"]["ratio"]["mean"] == 1.25 and doc["cells"]["trap-grpo-cap8"]["ratio"]["mean"] == 2.0
    assert doc["family_size"] <= 4 * 3 * 2 and doc["slope_family"] == 2 * 3 * 2
    # each fit is the OLS of the cells' per-seed paired differences (from their results.json) on the cells' ratios
    for setting in ("stay-grpo", "trap-grpo"):
        x, y = [], []
        for c in (c for c in cells if c.startswith(setting)):
            res = json.loads((out / c / "results.json").read_text())
            runs = {(r["variant"], r["seed"]): r for r in res["runs"]}
            ratio = res["variants"]["row+native"]["coupling"]["expansion_ratio"]["mean"]
            for k in (0, 1):
                x.append(ratio)
                y.append(runs[("row+MA", k)]["endpoint"] - runs[("row+native", k)]["endpoint"])
        fit = doc["fits"][setting]["MA"]["endpoint"]
        assert doc["cells"]["stay-grpo-cap12-eval12" if setting == "stay-grpo" else "trap-grpo-cap5"]["per_seed"]["MA"][
            "endpoint"] == y[:2]
        slope, intercept = np.polyfit(x, y, 1)
        assert (fit["fit"]["slope"], fit["fit"]["intercept"]) == pytest.approx((slope, intercept), abs=1e-12)
        f = load_fits(out / "dose_response.json")[setting]["MA"]["endpoint"]
        assert predict(f, 1.5).to_dict() == pytest.approx(fit["predictions"]["1.5"])
        assert predict(f, 1.0).to_dict() == pytest.approx(fit["at_ratio_1"])

    # ---- rerun: every cell's runs are reused, nothing trains; the sweep is rewritten ---------------
    def no_train(*a, **k):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(oma.train, "train", no_train)
    capsys.readouterr()
    assert oma_main(["dose-response", *SWEEP, "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((out / "dose_response.json").read_text())["fits"] == doc["fits"]


def test_the_pilot_prints_the_ratio_per_cap(tmp_path, capsys):
    out = tmp_path / "dose"
    argv = ["dose-response", "--pilot", "env.eval_tasks=8", "eval_every=1", "--settings", "trap-gigpo", "--caps",
            "trap=5,8", "--pilot-seeds", "2", "--horizon", "2", "--out", str(out)]
    assert oma_main(argv) == 0
    printed = capsys.readouterr().out
    assert "| trap-gigpo | 5 | 1.25 [1.25, 1.25] |" in printed and "| trap-gigpo | 8 | 2.00 [2.00, 2.00] |" in printed
    pilot = json.loads((out / "pilot" / "pilot.json").read_text())
    assert [(c["cap"], c["ratio"]["mean"], c["n_seeds"]) for c in pilot["cells"]] == [(5, 1.25, 2), (8, 2.0, 2)]
    doc = json.loads((out / "pilot" / "trap-gigpo-cap5" / "compare.json").read_text())
    assert [v["name"] for v in doc["variants"]] == ["row+native"] and doc["config"]["algo"]["estimator"] == "gigpo"
    assert "# Dose–response pilot" in (out / "pilot" / "README.md").read_text()
    assert not (out / "README.md").exists()


def test_an_eval_cap_of_its_own_holds_the_held_out_tasks_fixed(tmp_path, capsys):
    """With --eval-cap only training episodes end at the cell's cap: the ratio is still the training cap over the
    chain's length (by hand, for traps), held-out episodes end at the eval cap in every cell, and before any update
    every cell evaluates the same held-out tasks the same way (invariance)."""
    out = tmp_path / "dose"
    argv = ["dose-response", "--pilot", "env.eval_tasks=8", "eval_every=1", "--settings", "trap-grpo", "--caps",
            "trap=5,8", "--eval-cap", "trap=6", "--pilot-seeds", "2", "--horizon", "2", "--out", str(out)]
    assert oma_main(argv) == 0
    printed = capsys.readouterr().out
    assert "| trap-grpo | 5 | 1.25 [1.25, 1.25] |" in printed and "| trap-grpo | 8 | 2.00 [2.00, 2.00] |" in printed
    assert "Held-out episodes of `trap` end at 6 steps in every cell" in (out / "pilot" / "README.md").read_text()
    assert json.loads((out / "pilot" / "pilot.json").read_text())["eval_caps"] == {"trap": 6}
    first = {}
    for cap in (5, 8):
        cell = out / "pilot" / f"trap-grpo-cap{cap}-eval6"
        env = json.loads((cell / "compare.json").read_text())["config"]["env"]
        assert (env["options"]["max_steps"], env["train_max_steps"], env["eval_max_steps"]) == (max(cap, 6), cap, 6)
        for seed in (0, 1):
            run = [json.loads(line) for line in (cell / "row+native" / f"seed-{seed}" / "metrics.jsonl").open()]
            assert all(r["eval_steps"] <= 6 and r["eval_sampled_steps"] <= 6 for r in run)
            assert all(r["rows_per_traj_failure"] == cap for r in run[1:] if r.get("rows_per_traj_failure"))
            first.setdefault(seed, []).append({k: v for k, v in run[0].items() if k.startswith("eval_") and
                                               not k.startswith("eval_time")})
    assert all(a == b for a, b in first.values())


@pytest.mark.parametrize(("args", "needle"), [
    (["--caps", "loop=8,12"], "--caps 'loop=8,12': expected KIND=N,N,... with KIND one of stay, reset, trap"),
    (["--caps", "stay=8,x"], "--caps 'stay=8,x': the caps must be integers"),
    (["--caps", "trap=3,8"], "--caps trap: cap 3 is below the chain's length 4"),
    (["--caps", "stay=12"], "--caps stay: a slope needs at least 2 caps"),
    (["--settings", "stay-ppo"], "--settings: unknown setting(s) ['stay-ppo']"),
    (["--seeds", "1"], "--seeds must be >= 2"),
    (["--pilot", "--pilot-seeds", "0"], "--pilot-seeds must be >= 1"),
    (["--horizon", "0"], "--horizon must be >= 1"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--predict-at", "two"], "--predict-at 'two'"),
    (["--predict-at", "-1"], "ratios must be finite numbers > 0"),
    (["env.options.max_steps=9"], "--caps sets it per cell"),
    (["env.eval_max_steps=9"], "--eval-cap sets it"),
    (["--settings", "trap-grpo", "--eval-cap", "trap=3"], "--eval-cap trap: 3 is below the chain's length 4"),
    (["--settings", "trap-grpo", "--eval-cap", "stay=12"], "--eval-cap 'stay=12': expected KIND=N with KIND one of the "
                                                            "kinds swept (trap)"),
    (["--eval-cap", "stay=x"], "--eval-cap 'stay=x': the cap must be an integer"),
    (["algo.estimator=rloo"], "the setting sets it (--settings)"),
    (["--seeds", "many"], "--seeds"),
])
def test_bad_input_is_refused_in_one_line_naming_the_flag(args, needle, tmp_path, capsys):
    assert oma_main(["dose-response", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oma dose-response: error:") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
