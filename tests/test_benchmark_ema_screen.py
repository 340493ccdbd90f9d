"""benchmarks/ema_screen.py: the averages' gains and paired differences, by hand, and its committed page."""

from __future__ import annotations

import json
from pathlib import Path

import benchmark_scripts
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
    arms = _module().read_arms(tmp_path, 2)
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
        _module().read_arms(tmp_path, 75)


def test_the_committed_page_is_what_its_committed_runs_give(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    out = tmp_path / "page.md"
    assert _module().main([str(root / "evidence" / "2026-12-05-ema-lr-screen"), "--out", str(out)]) == 0
    def body(text: str) -> list[str]:  # the image line names the output's own file
        return [ln for ln in text.splitlines() if not ln.startswith("![")]

    committed = body((root / "learning-default-ema-screen.md").read_text())
    assert sum(ln.startswith("| ") for ln in committed) > 20
    assert body(out.read_text()) == committed
    assert (tmp_path / "page-gains.png").stat().st_size > 0
