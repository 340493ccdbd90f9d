"""studies/tools/iteration_speed.py: variants parsed by hand; a tiny run times every variant on the same tasks."""

from __future__ import annotations

import shlex
import sys

import benchmark_scripts
import pytest


def test_parse_variant_by_hand() -> None:
    parse = benchmark_scripts.load("iteration_speed").parse_variant
    assert parse("terse=env.options.text=terse,seed=1") == ("terse", ["env.options.text=terse", "seed=1"])
    assert parse("base=") == ("base", [])
    for bad in ("terse", "=seed=1"):
        with pytest.raises(SystemExit, match="--variant must be NAME=OVERRIDE"):
            parse(bad)


def test_a_tiny_run_reports_each_variant(tmp_path, monkeypatch) -> None:
    tiny = ",".join(["env.tasks_per_iter=1", "env.group_size=2", "optim.num_minibatches=1", "env.train_max_steps=null",
                     "env.options.max_steps=4",
                     "env.options.text=alfworld", "warm_start.episodes=2",
                     "warm_start.epochs=1", "policy.hidden=16", "policy.layers=1", "policy.heads=2", "policy.vocab_size=300",
                     f"warm_start.cache_dir={tmp_path / 'cache'}", "threads=1"])
    out = tmp_path / "speed.md"
    monkeypatch.setattr(sys, "argv", ["iteration_speed.py", "--variant", f"a={tiny}", "--variant", f"b={tiny}",
                                      "--variant", f"terse={tiny},env.options.text=terse",
                                      "--variant", f"a cap={tiny},env.train_max_steps=1", "--repeats", "2", "--out", str(out)])
    benchmark_scripts.load("iteration_speed").main()
    text = out.read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith(("| a |", "| b |", "| terse |", "| a cap |"))}
    assert set(rows) == {"a", "b", "terse", "a cap"}
    assert rows["a"][2:4] == rows["b"][2:4]  # the same config rolls out the same rows and prompt tokens
    assert rows["a"][-2] == "1.00×" and float(rows["a"][3]) > float(rows["terse"][3])  # terse prompts are shorter
    assert rows["a cap"][2] == "2"  # the training cap: 2 episodes of one step each, every iteration
    # the page's command runs again as written: a name with a space is quoted
    command = text.split("Command: `", 1)[1].split("`", 1)[0]
    assert f"a cap={tiny},env.train_max_steps=1" in shlex.split(command)
