"""studies/tools/ema_screen.py: the averages' gains and paired differences, by hand, and its committed page."""

from __future__ import annotations

import json
from pathlib import Path

import benchmark_scripts
import studies
import pytest


def _module():
    return benchmark_scripts.load("ema_screen")


def _run(d: Path, start: tuple[float, float], live: tuple[float, float], ema: tuple[float, float]) -> None:
    d.mkdir(parents=True)
    rows = [{"iteration": 0, "eval_success": start[0], "eval_sampled_success": start[1]},
            {"iteration": 1, "success": 0.5},
            {"iteration": 2, "eval_success": live[0], "eval_sampled_success": live[1],
             "ema0.9_eval_success": ema[0], "ema0.9_eval_sampled_success": ema[1]}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_gains_and_paired_differences_by_hand(tmp_path: Path) -> None:
    _run(tmp_path / "a" / "seed-0", (0.25, 0.5), (0.5, 0.5), (0.75, 0.25))
    _run(tmp_path / "a" / "seed-1", (0.5, 0.5), (0.5, 0.75), (0.75, 1.0))
    arms = _module().read_arms([tmp_path], 2)
    # gains: end − warm start, the average's from the same warm start (θ̄_0 = θ_0)
    assert arms["a"][0] == {"live": {"eval_success": 0.25, "eval_sampled_success": 0.0},
                            "EMA 0.9": {"eval_success": 0.5, "eval_sampled_success": -0.25}}
    text, forest = _module().report(arms, 2, "a", "CMD")
    # greedy: live gains 0.25, 0.0 → 0.125; the average's 0.5, 0.25 → 0.375; paired +0.25 on both seeds
    assert "| live | +0.125 ± 1.588 |" in text  # t(0.975, 1) · s/√2 = 12.706 · 0.125
    # sampled: the average's gains −0.25, +0.5 → +0.125 ± 12.706 · 0.530/√2; paired −0.25, +0.25 → 0 ± 3.177
    assert "| EMA 0.9 | +0.375 ± 1.588 | +0.125 ± 4.765 | +0.250 ± 0.000 | +0.000 ± 3.177 |" in text
    assert [label for _, label, _ in forest] == ["EMA 0.9 − live, greedy", "EMA 0.9 − live, sampled"]


def test_a_run_without_the_horizon_is_refused(tmp_path: Path) -> None:
    _run(tmp_path / "a" / "seed-0", (0.25, 0.5), (0.5, 0.5), (0.75, 0.25))
    with pytest.raises(SystemExit, match="iteration 0 and 75"):
        _module().read_arms([tmp_path], 75)


GRPO_375 = ["--live", "studies/longer-preset/evidence/2026-12-05-grpo-375", "--horizon", "375", "--baseline", "row+native", "--pool",
            "--title", "an average of the weights in target 2's preset (GRPO, 375 iterations), started at iteration 275, "
                       "against the live weights of the same runs"]


@pytest.mark.parametrize("page, evidence, extra", [
    ("learning-default-ema-screen", "2026-12-05-ema-lr-screen", []),
    # target 2's preset averaging from iteration 275, paired with the same runs' live weights
    ("learning-grpo-375-ema-vs-live", "2026-12-05-grpo-375-ema", GRPO_375),
    # the same with three more seeds (5-7), each folder of runs paired with its live twins in either live folder
    ("learning-grpo-375-ema-vs-live-8-seeds", ("2026-12-05-grpo-375-ema", "2026-12-05-grpo-375-ema-seeds-5-7"),
     ["--live", "studies/longer-preset/evidence/2026-12-05-grpo-375", "studies/longer-preset/evidence/2026-12-05-grpo-375-seeds-5-7",
      *GRPO_375[2:-1], GRPO_375[-1] + ", seeds 0-7"]),
    # the default job's confirmation runs, paired with the same training evaluated without the average
    ("learning-default-ema-vs-live", "2026-12-05-default-ema-15-24",
     ["--live", "studies/weight-average/evidence/2026-12-05-default-live-15-24", "--horizon", "75", "--title",
      "the default job's average of the weights against its live weights, paired within runs (seeds 15-24)"]),
])
def test_the_committed_page_is_what_its_committed_runs_give(tmp_path: Path, monkeypatch, page: str,
                                                           evidence: str | tuple[str, ...], extra: list[str]) -> None:
    monkeypatch.chdir(studies.ROOT)  # --live names a folder relative to the repository
    out = tmp_path / "page.md"
    folders = [studies.evidence(e) for e in ((evidence,) if isinstance(evidence, str) else evidence)]
    assert _module().main([*map(str, folders), *extra, "--out", str(out)]) == 0

    def body(text: str) -> list[str]:  # the image line names the output's own file; the command is its description
        return [ln for ln in text.splitlines() if not ln.startswith(("![", "Command: "))]

    committed = body(studies.page(page).read_text())
    runs = sum(len(list(folder.glob("*/seed-*"))) for folder in folders)
    assert sum(ln.startswith("| ") for ln in committed) > runs + 2  # a row per run and the summary rows at least
    assert body(out.read_text()) == committed
    assert (tmp_path / "page-gains.png").stat().st_size > 0


def _pair(root: Path, arm: str, seed: int, start: float, live: float, ema: float, beta: float = 0.5,
          live_start: float | None = None) -> None:
    """AVG/<arm>/seed-K trained with optim.ema = beta and LIVE/<arm>/seed-K, the same training without it."""
    for side, end, first, b in (("avg", ema, start, beta), ("live", live, start if live_start is None else live_start, 0.0)):
        d = root / side / arm / f"seed-{seed}"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"optim": {"ema": b}}))
        rows = [{"iteration": 0, "eval_success": first, "eval_sampled_success": first, "warm_start": {"cached": side == "avg"}},
                {"iteration": 1, "loss": 1.0, "time_update": 0.1 if side == "avg" else 0.2},
                {"iteration": 2, "loss": 0.5, "eval_success": end, "eval_sampled_success": end / 2}]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_an_average_paired_with_its_runs_live_weights_by_hand(tmp_path: Path) -> None:
    _pair(tmp_path, "a", 0, 0.25, 0.5, 0.75)
    _pair(tmp_path, "a", 1, 0.5, 0.5, 0.5)
    _pair(tmp_path, "b", 0, 0.25, 0.75, 0.75)
    arms = _module().read_arms([tmp_path / "avg"], 2, [tmp_path / "live"])
    # greedy gains from the shared warm start: live 0.5 − 0.25, the average's 0.75 − 0.25; sampled = end/2 − start
    assert arms["a"][0] == {"live": {"eval_success": 0.25, "eval_sampled_success": 0.0},
                            "EMA 0.5": {"eval_success": 0.5, "eval_sampled_success": 0.125}}
    text, forest = _module().report(arms, 2, "a", "CMD", "T", pool=True)
    assert text.startswith("# Benchmark: T\n")
    # pooled over 3 runs, greedy: differences 0.25, 0, 0 → mean 0.0833, s = 0.1443, t(0.975, 2) = 4.303 → ± 0.359
    assert "## Every arm's runs pooled (3 runs)" in text
    assert "| EMA 0.5 | +0.083 ± 0.359 | +0.042 ± 0.179 |" in text
    assert [label for arm, label, _ in forest if arm == "pooled"] == ["EMA 0.5 − live, greedy", "EMA 0.5 − live, sampled"]


@pytest.mark.parametrize("bad, message", [({"loss": 2.0}, "trained differently .iteration 1."),
                                          ({"beta": 0.0}, "optim.ema is 0"),
                                          ({"live_start": 0.5}, "different warm starts")])
def test_runs_that_are_not_one_training_are_not_paired(tmp_path: Path, bad: dict, message: str) -> None:
    args = {"beta": 0.5, "live_start": None} | bad
    _pair(tmp_path, "a", 0, 0.25, 0.5, 0.75, beta=args["beta"], live_start=args["live_start"])
    if "loss" in bad:  # the average's run took another update at iteration 1
        d = tmp_path / "avg" / "a" / "seed-0" / "metrics.jsonl"
        d.write_text(d.read_text().replace('"loss": 1.0', '"loss": 2.0'))
    with pytest.raises(SystemExit, match=message):
        _module().read_arms([tmp_path / "avg"], 2, [tmp_path / "live"])


def test_more_seeds_in_other_folders_are_one_study(tmp_path: Path) -> None:
    """Seeds 0-1 in one pair of folders, seed 2 in another: pooled as one study, each run with its own twin."""
    _pair(tmp_path / "first", "a", 0, 0.25, 0.5, 0.75)
    _pair(tmp_path / "first", "a", 1, 0.5, 0.5, 0.5)
    _pair(tmp_path / "later", "a", 2, 0.25, 0.25, 0.5)
    arms = _module().read_arms([tmp_path / "first" / "avg", tmp_path / "later" / "avg"], 2,
                               [tmp_path / "first" / "live", tmp_path / "later" / "live"])
    assert list(arms["a"]) == [0, 1, 2]
    assert arms["a"][2] == {"live": {"eval_success": 0.0, "eval_sampled_success": -0.125},
                            "EMA 0.5": {"eval_success": 0.25, "eval_sampled_success": 0.0}}
    # greedy differences 0.25, 0, 0.25: mean 0.1667, s = 0.1443, t(0.975, 2) = 4.303 -> ± 0.359
    text, _ = _module().report(arms, 2, "a", "CMD", "T", pool=True)
    assert "| EMA 0.5 | +0.167 ± 0.359 |" in text


def test_a_seed_twice_or_a_run_without_one_live_twin_is_refused(tmp_path: Path) -> None:
    _pair(tmp_path / "first", "a", 0, 0.25, 0.5, 0.75)
    _pair(tmp_path / "later", "a", 0, 0.25, 0.5, 0.75)
    first, later = tmp_path / "first", tmp_path / "later"
    with pytest.raises(SystemExit, match="a/seed-0 is in both .*: one seed would count twice"):
        _module().read_arms([first / "avg", later / "avg"], 2)
    with pytest.raises(SystemExit, match="in exactly one of .*, found 2"):  # the twin is in both live folders
        _module().read_arms([first / "avg"], 2, [first / "live", later / "live"])
    with pytest.raises(SystemExit, match="found 0"):
        _module().read_arms([first / "avg"], 2, [tmp_path / "elsewhere"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="empty: no runs found"):
        _module().read_arms([first / "avg", tmp_path / "empty"], 2)
