"""studies/tools/horizon_budget.py: a run's measured phase times re-summed for other schedules, by hand, and its committed page."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import benchmark_scripts
import studies
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return benchmark_scripts.load("horizon_budget")


def _run(d: Path, iterations: int, every: int, loop: Callable[[int], float], logp_ref: float = 0.01,
         evaluation: float = 5.0, ref_at_eval: float = 0.5) -> list[dict]:
    """A run whose iteration i's loop phases sum to ``loop(i)`` (rollout, advantages, update = 0.5, 0.1, 0.4 of it)."""
    d.mkdir(parents=True)
    rows = [{"iteration": 0, "time_eval": evaluation + 1.0}]
    for i in range(1, iterations + 1):
        r = {"iteration": i, "time_rollout": 0.5 * loop(i), "time_advantages": 0.1 * loop(i),
             "time_update": 0.4 * loop(i), "time_logp_ref": logp_ref}
        if i % every == 0 or i == iterations:
            r.update(time_logp_ref=ref_at_eval, time_eval=evaluation)
        rows.append(r)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return rows


def test_evaluation_iterations_follow_the_loop() -> None:
    m = _module()
    assert m.evaluation_iterations(420, 60) == [0, 60, 120, 180, 240, 300, 360, 420]
    assert m.evaluation_iterations(435, 60) == [0, 60, 120, 180, 240, 300, 360, 420, 435]  # and at the horizon
    assert m.evaluation_iterations(10, 15) == [0, 10]


def test_costs_by_hand(tmp_path: Path) -> None:
    _run(tmp_path / "a" / "seed-0", iterations=6, every=2, loop=float)
    m = _module()
    loop, evaluation = m.phase_times(m.read_metrics(tmp_path / "a" / "seed-0"), "a/seed-0")
    # iteration i: its loop phases i s; + 0.01 s of logp_ref where it does not evaluate (1, 3, 5)
    assert loop == pytest.approx({1: 1.01, 2: 2.0, 3: 3.01, 4: 4.0, 5: 5.01, 6: 6.0})
    # an evaluation: time_eval + that iteration's logp_ref (the KL to the warm start); at 0 time_eval alone
    assert evaluation == pytest.approx({0: 6.0, 2: 5.5, 4: 5.5, 6: 5.5})
    # 6:2 → iterations 1+...+6 + 3 × 0.01 = 21.03, evaluations 6 + 3 × 5.5 = 22.5
    assert m.cost(loop, evaluation, 6, 2, "r") == pytest.approx(43.53)
    # 4:4 → 1.01 + 2 + 3.01 + 4 = 10.02; evaluations at 0 and 4: 6 + 5.5 = 11.5
    assert m.cost(loop, evaluation, 4, 4, "r") == pytest.approx(21.52)


def test_longest_horizon_by_hand(tmp_path: Path) -> None:
    # every iteration 1 s, every evaluation 5 s (6 s at 0): 6:2 costs 6 + 6 + 3 × 5 = 27 s (no logp_ref outside)
    rows = _run(tmp_path / "a" / "seed-0", iterations=12, every=2, loop=lambda i: 1.0, logp_ref=0.0, ref_at_eval=0.0)
    m = _module()
    runs = {"a/seed-0": m.phase_times(rows, "a/seed-0")}
    assert m.cost(*runs["a/seed-0"], 6, 2, "a/seed-0") == pytest.approx(27.0)
    # every 12: H iterations + 6 + 5 (one more evaluation at H): H ≤ 16 fits, and 12 is the runs' last
    assert m.longest(runs, (6, 2), every=12, step=2) == 12
    # every 4, step 2: 8 → 8 + 6 + 5 · 2 (4, 8) = 24 fits; 10 → 10 + 6 + 5 · 3 (4, 8, 10) = 31 and 12 → 33 do not
    assert m.longest(runs, (6, 2), every=4, step=2) == 8
    # 2:2 costs 2 + 6 + 5 = 13; every 2, step 4: 4 → 4 + 6 + 10 = 20 already costs more
    assert m.longest(runs, (2, 2), every=2, step=4) is None


def test_a_schedule_the_run_did_not_measure_is_refused(tmp_path: Path) -> None:
    _run(tmp_path / "a" / "seed-0", iterations=6, every=2, loop=float)
    m = _module()
    loop, evaluation = m.phase_times(m.read_metrics(tmp_path / "a" / "seed-0"), "a/seed-0")
    with pytest.raises(SystemExit, match="a/seed-0: no evaluation timed at iteration 3"):
        m.cost(loop, evaluation, 6, 3, "a/seed-0")
    with pytest.raises(SystemExit, match="a/seed-0: no timing of iteration 7"):
        m.cost(loop, evaluation, 8, 2, "a/seed-0")


def test_bad_input_is_refused_naming_it(tmp_path: Path) -> None:
    m = _module()
    for bad in ("420", "420:0", "a:60", "420:60:1"):
        with pytest.raises(SystemExit, match="--schedule .*HORIZON:EVERY"):
            m.parse_schedule(bad)
    with pytest.raises(SystemExit, match="r: iteration 1 has no time_update"):
        m.phase_times([{"iteration": 0, "time_eval": 1.0},
                       {"iteration": 1, "time_rollout": 1.0, "time_advantages": 0.1, "time_logp_ref": 0.0}], "r")
    _run(tmp_path / "a" / "seed-0", iterations=6, every=2, loop=float)
    with pytest.raises(SystemExit, match="--longest 0: expected a positive integer"):
        m.main([str(tmp_path), "--schedule", "6:2", "--longest", "0"])


def test_the_committed_page_regenerates(tmp_path: Path) -> None:
    page = studies.page("learning-grpo-horizon-budget")
    command = page.read_text().split("Command: `", 1)[1].split("`", 1)[0]
    argv = command.split("studies/tools/horizon_budget.py ", 1)[1].split(" --out ")[0].split()
    out = tmp_path / page.name
    _module().main([*argv, "--command", command, "--out", str(out)])
    assert out.read_text() == page.read_text()
    assert (tmp_path / "learning-grpo-horizon-budget-ratios.png").stat().st_size > 10_000
