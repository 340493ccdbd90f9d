"""Trainer throughput at a config: generation speed, the iteration's time split, and the cost of OMA.

Run by hand (results committed as benchmarks/throughput.md):

    .venv/bin/python benchmarks/throughput.py configs/household-grpo-oma.yaml --out benchmarks/throughput.md

It builds the warm-started policy exactly as `oma train` does (cached), rolls out one iteration,
then times the update on that same batch under OA+MA (trajectory accounting, uniform mass) and
under the native baseline (row accounting, token-mean as is), alternating and restoring the model
between runs, so the ratio is measured in one run on one batch.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from oma.train import (Batch, advantages, build_policy, episode_scores, load_config, per_token, response_mask_of,
                       training_rollout, update)
from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env


def warm_policy(cfg, progress: Progress):
    """``(make_env, model, tokenizer)`` of ``cfg`` with torch's threads set to its ``threads`` and the
    warm-started policy built as `oma train` builds it (cached)."""
    torch.set_num_threads(cfg.threads)
    make_env = env_factory(cfg)
    model, tok, _ = build_policy(cfg, make_env, progress)
    return make_env, model, tok


def on_policy_batch(cfg, rows) -> Batch:
    """The update's batch of a rollout as `oma train` builds it: ``cfg``'s advantages, old log-probs as sampled, no reference."""
    mask = response_mask_of(rows)
    return Batch(rows, mask, advantages(cfg, rows, episode_scores(cfg, rows)), per_token(rows.logp, mask.shape[1]), None)


def publish(text: str, out: str | None) -> None:
    """Print a by-hand benchmark's Markdown page, and write it to ``out`` when one is named."""
    print(text)
    if out:
        Path(out).write_text(text)


def setup(description: str, repeats: int):
    """``(args, cfg, make_env, model, tokenizer)`` of a by-hand benchmark run as ``SCRIPT [config] [overrides]
    [--repeats N] [--out FILE]``: the config loaded and :func:`warm_policy` built."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("config", nargs="?")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    with Progress(console=Console()) as progress:
        make_env, model, tok = warm_policy(cfg, progress)
    return args, cfg, make_env, model, tok


def main() -> None:
    args, cfg, make_env, model, tok = setup(__doc__.splitlines()[0], repeats=3)
    pad = tok.pad_token_id

    t0 = time.perf_counter()
    ro = training_rollout(cfg, make_env, model, tok, 1, torch.Generator().manual_seed(0))
    t_rollout = time.perf_counter() - t0
    rows = ro.rows
    prompt_tokens = sum(len(p) for p in rows.prompt_ids)

    t0 = time.perf_counter()
    advantages(cfg, rows, episode_scores(cfg, rows))  # the oma.core part of the phase (old log-probs were recorded while sampling)
    t_adv = time.perf_counter() - t0

    start_model = copy.deepcopy(model.state_dict())
    variants = {
        "OA+MA (trajectory, uniform)": dict(accounting="trajectory", mass="uniform"),
        "native (row, token-mean)": dict(accounting="row", mass="native"),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, switches in variants.items():
            v = copy.deepcopy(cfg)
            v.algo.accounting, v.algo.mass = switches["accounting"], switches["mass"]
            model.load_state_dict(start_model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=v.optim.lr)
            batch = on_policy_batch(v, rows)
            t0 = time.perf_counter()
            update(model, optimizer, batch, v, pad, 1)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    oma_t, native_t = med["OA+MA (trajectory, uniform)"], med["native (row, token-mean)"]
    text = "\n".join([
        "# Benchmark: trainer throughput",
        "",
        f"Command: `.venv/bin/python benchmarks/throughput.py {args.config or ''} {' '.join(args.overrides)} --out benchmarks/throughput.md`",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{cfg.threads} threads, shared 2-core CPU. Policy: `{cfg.policy.model}` "
        f"(hidden {cfg.policy.hidden}, {cfg.policy.layers} layers), constrained decoding {cfg.policy.constrained}.",
        "",
        f"One iteration at this config: {cfg.env.tasks_per_iter} tasks x {cfg.env.group_size} episodes of "
        f"`{cfg.env.name}` {cfg.env.options or ''} → {len(rows)} rows "
        f"({len(rows) / len(ro.episodes):.1f} per trajectory), {prompt_tokens:,} prompt tokens, "
        f"{ro.generated_tokens:,} generated tokens.",
        "",
        "| phase | seconds | share |",
        "|---|---:|---:|",
        *(f"| {name} | {t:.2f} | {t / (t_rollout + t_adv + oma_t):.0%} |" for name, t in
          (("rollout (generation + env steps, old log-probs recorded)", t_rollout), ("advantages (oma.core)", t_adv),
           ("update (OA+MA)", oma_t))),
        "",
        f"- Generation: {ro.generated_tokens / t_rollout:.0f} generated tokens/s "
        f"({len(rows) / t_rollout:.0f} agent steps/s, prompts prefilled with a KV cache).",
        f"- `oma.core` advantages: {1e3 * t_adv:.1f} ms for {len(rows)} rows.",
        f"- Update time, median of {args.repeats} alternating runs on the same batch: OA+MA {oma_t:.2f} s, "
        f"native {native_t:.2f} s, **ratio {oma_t / native_t:.3f}** (target ≤ 1.05).",
        "",
    ])
    publish(text, args.out)


if __name__ == "__main__":
    main()
