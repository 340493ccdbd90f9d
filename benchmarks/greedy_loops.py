"""Why greedy success lags sampled success: are greedy failures cycles?

Run by hand on a finished `oma train` run (results in docs/training.md#why-greedy-success-lags-every-greedy-failure-is-a-loop-measured):

    .venv/bin/python benchmarks/greedy_loops.py runs/long-grpo/OA+MA/seed-0 --iteration 0
    .venv/bin/python benchmarks/greedy_loops.py runs/long-grpo/OA+MA/seed-0 --iteration 60

Replays the run's greedy held-out evaluation (the same 128 tasks as `evaluate`) with the warm start
(iteration 0, from the warm-start cache) or the checkpoint of an iteration, and counts the failed
episodes in which an observation repeats exactly. With no history window the prompt is the task
plus the observation, so a repeated observation under greedy decoding is a cycle to the step cap.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from oma.agent.rollout import Episode
from oma.train.checkpoint import load_checkpoint
from oma.train.config import load_config
from oma.train.loop import env_factory, make_optimizer, policy_rollout
from oma.train.warmstart import build_policy


def first_repeat(episode: Episode) -> int | None:
    """Index of the first step whose observation was already seen in the episode, or None."""
    seen: set[str] = set()
    for i, (observation, _action) in enumerate(episode.transcript):
        if observation in seen:
            return i
        seen.add(observation)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="an oma train run folder (holds config.json and checkpoints/)")
    ap.add_argument("--iteration", type=int, default=0, help="0 = the warm start; else a checkpointed iteration")
    args = ap.parse_args(argv)
    cfg = load_config(args.run / "config.json")
    if cfg.env.history_length != 0:
        print(f"{args.run}: env.history_length is {cfg.env.history_length}; the count assumes 0", file=sys.stderr)
        return 2
    torch.set_num_threads(cfg.threads)
    make_env = env_factory(cfg)
    model, tokenizer, _ = build_policy(cfg, make_env)
    if args.iteration:
        optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
        load_checkpoint(args.run / "checkpoints" / f"iter_{args.iteration:06d}", model, optimizer)
    seeds = [cfg.env.eval_seed_offset + k for k in range(cfg.env.eval_tasks)]
    ro = policy_rollout(cfg, make_env, model, tokenizer, seeds, group_size=1, temperature=0.0, generator=None)
    failures = [e for e in ro.episodes if not e.won]
    repeats = [r for r in map(first_repeat, failures) if r is not None]
    median = statistics.median(repeats) if repeats else None
    print(f"| {args.run} it {args.iteration} | {ro.success_rate:.3f} | {len(failures)} | {len(repeats)} | {median} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
