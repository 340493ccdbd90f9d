"""studies/tools/start_average.py: an average of the weights started at a checkpoint of a run without one."""

from __future__ import annotations

import json
from pathlib import Path

import benchmark_scripts
import studies
import pytest
import torch
from safetensors.torch import load_file

from oma.cli import main as oma_main
from oma.train.config import ConfigError, load_run_config
from run_records import records, training_only
from test_train import TINY

BETA = 0.5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """SRC: 4 iterations without an average, one optimizer step per iteration, every iteration checkpointed;
    DST: SRC's checkpoint at 2 with the average started there, resumed to 4."""
    tmp = tmp_path_factory.mktemp("start_average")
    # an entropy bonus moves the weights even where every advantage is 0 (tiny tasks are rarely won)
    common = [*TINY, "iterations=4", "optim.num_minibatches=1", "algo.entropy_coef=0.01",
              f"warm_start.cache_dir={tmp / 'cache'}"]
    assert oma_main(["train", *common, "optim.ema=0", f"out_dir={tmp / 'src'}"]) == 0
    assert benchmark_scripts.load("start_average").main([str(tmp / "src"), str(tmp / "dst"), "--iteration", "2",
                                                         "--ema", str(BETA)]) == 0
    started = load_file(str(tmp / "dst" / "checkpoints" / "iter_000002" / "ema.safetensors"))
    assert oma_main(["train", *common, f"optim.ema={BETA}", f"out_dir={tmp / 'dst'}", "--resume"]) == 0
    return tmp, started


def _live(run: Path, iteration: int) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"iter_{iteration:06d}" / "model.safetensors"))


def test_the_average_starts_at_the_checkpoints_weights(runs):
    tmp, started = runs
    live = _live(tmp / "src", 2)
    both = set(started) & set(live)  # save_model names a tied embedding once, as lm_head
    assert len(both) >= len(started) - 1
    assert all(torch.equal(started[k], live[k]) for k in both)


def test_training_continues_exactly_and_the_average_is_the_closed_form(runs):
    tmp, _ = runs
    src, dst = records(tmp / "src" / "metrics.jsonl"), records(tmp / "dst" / "metrics.jsonl")
    assert [r["iteration"] for r in dst] == [0, 1, 2, 3, 4]
    assert training_only(dst) == training_only(src)  # the average changes no rollout or update
    assert dst[:3] == src[:3]  # up to the checkpoint: SRC's own records, live-weight evaluations included
    # θ̄_4 = β²·θ_2 + (1 − β)·(β·θ_3 + θ_4), one optimizer step per iteration
    theta = {i: _live(tmp / "src", i) for i in (2, 3, 4)}
    averaged = load_file(str(tmp / "dst" / "checkpoints" / "iter_000004" / "ema.safetensors"))
    both = set(averaged) & set(theta[4])
    assert len(both) >= len(averaged) - 1
    for k in both:
        expected = BETA ** 2 * theta[2][k] + (1 - BETA) * (BETA * theta[3][k] + theta[4][k])
        torch.testing.assert_close(averaged[k], expected, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(averaged[k], theta[4][k]) for k in both)  # and it is not the live θ_4
    assert load_run_config(tmp / "dst").optim.ema == BETA


def test_bad_input_is_named(runs, tmp_path, capsys):
    tmp, _ = runs
    start_average = benchmark_scripts.load("start_average").start_average
    with pytest.raises(ConfigError, match="no checkpoint at iteration 7"):
        start_average(tmp / "src", tmp_path / "a", 7, BETA)
    with pytest.raises(ConfigError, match="already averages"):
        start_average(tmp / "dst", tmp_path / "b", 4, BETA)
    with pytest.raises(ConfigError, match="dst: .* exists"):
        start_average(tmp / "src", tmp / "dst", 2, BETA)
    with pytest.raises(ConfigError, match=r"optim\.ema"):
        start_average(tmp / "src", tmp_path / "c", 2, 1.0)
    with pytest.raises(ConfigError, match="0 is no average"):
        start_average(tmp / "src", tmp_path / "d", 2, 0.0)
    with pytest.raises(ConfigError, match="no config.json"):
        start_average(tmp_path, tmp_path / "e", 2, BETA)
    assert not any((tmp_path / n).exists() for n in "abcde")  # a refused start writes nothing


def test_the_late_start_of_the_committed_study_matches_an_average_from_the_warm_start():
    """Target 2's preset, OA+MA seed 1: the average started at 275 and one started at the warm start
    (the same training, checked) evaluate alike at 375 and wherever 0.97^steps has faded the difference."""
    from oma.train.config import config_diff

    late, full, live = (studies.evidence(d) / "OA+MA" / "seed-1" for d in
                        ("2026-12-05-grpo-375-ema", "2026-12-05-grpo-375-ema-from-scratch", "2026-12-05-grpo-375"))
    assert config_diff(json.loads((late / "config.json").read_text()), json.loads((full / "config.json").read_text()),
                       ("out_dir",)) == []
    late_r = {r["iteration"]: r for r in records(late / "metrics.jsonl")}
    full_r = {r["iteration"]: r for r in records(full / "metrics.jsonl")}
    live_r = {r["iteration"]: r for r in records(live / "metrics.jsonl")}
    assert sorted(full_r) == list(range(376))
    assert all(training_only([full_r[i]]) == training_only([live_r[i]]) for i in live_r)
    for it in range(315, 376, 15):  # 160 optimizer steps or more after the late start
        for key in ("eval_success", "eval_sampled_success"):
            assert late_r[it][key] == full_r[it][key], (it, key)
