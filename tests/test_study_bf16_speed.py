"""studies/tools/bf16_speed.py: its gap by hand; a tiny run reports every phase and reads fp32 log-probs exactly."""

from __future__ import annotations

import sys

import benchmark_scripts
import torch


def test_the_gap_by_hand() -> None:
    gap = benchmark_scripts.load("bf16_speed").gap
    a = torch.tensor([[0.1, 0.5, 9.0]])
    b = torch.tensor([[0.1, 0.2, 0.0]])
    mask = torch.tensor([[True, True, False]])  # the third column is no response token: left out
    # |a - b| over the mask: 0.0 and 0.3 -> mean 0.15, max 0.3 (the 99th percentile interpolates to 0.297)
    assert gap(a, b, mask) == "1.5e-01 | 3.0e-01 | 3.0e-01"


def test_a_tiny_run_reports_each_phase_and_fp32_reads_its_own_rollout(tmp_path, monkeypatch) -> None:
    tiny = ["env.tasks_per_iter=1", "env.group_size=2", "optim.num_minibatches=1", "env.train_max_steps=null",
            "env.options.max_steps=4",
            "warm_start.episodes=2", "warm_start.epochs=1", "policy.hidden=16", "policy.layers=1", "policy.heads=2",
            "policy.vocab_size=300", f"warm_start.cache_dir={tmp_path / 'cache'}", "threads=1"]
    out = tmp_path / "bf16.md"
    monkeypatch.setattr(sys, "argv", ["bf16_speed.py", "configs/household-gigpo-oma.yaml", *tiny, "--repeats", "2",
                                      "--out", str(out)])
    benchmark_scripts.load("bf16_speed").main()
    text = out.read_text()
    cells = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:] for line in text.splitlines()
             if line.startswith("| ")}
    for row in ("rollout", "update", "iteration", "forward + backward", "forward, no gradients", "fp32", "bf16"):
        assert row in cells, row
    # the same weights and the same arithmetic: a full fp32 pass reads the log-probs its rollout recorded
    assert float(cells["fp32 forward vs fp32 rollout"][2]) < 1e-4
    for reading in ("bf16 forward vs bf16 rollout", "bf16 forward vs fp32 rollout"):
        assert reading in cells
    assert "Command: `.venv/bin/python studies/tools/bf16_speed.py configs/household-gigpo-oma.yaml env.tasks_per_iter=1" in text
