"""RL iterations of several variants of a config, timed side by side: seconds, rows and prompt tokens.

Run by hand (results committed as studies/default-job/terse-speed.md):

    .venv/bin/python studies/tools/iteration_speed.py --variant alfworld= --variant terse=env.options.text=terse \
        --out studies/default-job/terse-speed.md

Each ``--variant NAME=OVERRIDE[,OVERRIDE...]`` is the config (the default job unless ``--config``) with
those overrides; its warm-started policy is built as `oma train` builds it (cached). Then, for iterations
1 to ``--repeats``, every variant rolls out that iteration's tasks and updates on the batch, the variants
alternating and each restored to its warm start before every iteration, so a slow spell of the shared
machine falls on all of them and the ratios are measured in one run. A variant whose policy fails more
often has longer episodes, so the table gives the time per iteration (what a job's length follows) and
per row (what the policy's passes cost) apart.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import copy
import shlex
import statistics
import time

import torch
from rich.console import Console
from rich.progress import Progress

from oma.train import cpu_info, load_config, make_optimizer, training_rollout, update
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the benchmark harness it reuses
from throughput import on_policy_batch, publish, warm_policy


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"terse=env.options.text=terse,seed=1"`` -> ``("terse", ["env.options.text=terse", "seed=1"])``."""
    name, sep, overrides = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant must be NAME=OVERRIDE[,OVERRIDE...] (overrides may be empty); got {text!r}")
    return name, [o for o in overrides.split(",") if o]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--variant", action="append", required=True, type=parse_variant)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    variants = {}
    with Progress(console=Console()) as progress:
        for name, overrides in args.variant:
            cfg = load_config(args.config, overrides)
            make_env, model, tok = warm_policy(cfg, progress)
            variants[name] = (cfg, make_env, model, tok, copy.deepcopy(model.state_dict()))

        stats: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in variants}
        task = progress.add_task("iterations", total=args.repeats * len(variants))
        for iteration in range(1, args.repeats + 1):
            for name, (cfg, make_env, model, tok, start) in variants.items():
                model.load_state_dict(start)
                t0 = time.perf_counter()
                ro = training_rollout(cfg, make_env, model, tok, iteration, torch.Generator().manual_seed(cfg.seed + iteration))
                t_rollout = time.perf_counter() - t0
                rows = ro.rows
                batch = on_policy_batch(cfg, rows)
                t0 = time.perf_counter()
                update(model, make_optimizer(cfg, list(model.parameters())), batch, cfg, tok.pad_token_id, iteration)
                t_update = time.perf_counter() - t0
                stats[name].append((t_rollout, t_update, len(rows), sum(len(p) for p in rows.prompt_ids)))
                progress.advance(task)

    base = next(iter(variants))
    med = {name: {"rollout": statistics.median(s[0] for s in runs), "update": statistics.median(s[1] for s in runs),
                  "iteration": statistics.median(s[0] + s[1] for s in runs),
                  "row_ms": statistics.median(1e3 * (s[0] + s[1]) / s[2] for s in runs),
                  "rows": statistics.mean(s[2] for s in runs), "tokens": statistics.mean(s[3] / s[2] for s in runs)}
           for name, runs in stats.items()}
    cfg0 = variants[base][0]
    cpu = cpu_info()
    command = " ".join([".venv/bin/python studies/tools/iteration_speed.py", *(["--config", args.config] if args.config else []),
                        *(f"--variant {shlex.quote(n + '=' + ','.join(o))}" for n, o in args.variant), f"--repeats {args.repeats}",
                        *(["--out", args.out] if args.out else [])])
    lines = [
        "# Benchmark: RL iterations of config variants, side by side",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {cpu['cpu']} ({cpu['cpu_capability']}), torch {torch.__version__}, {cfg0.threads} threads "
        "(shared, noisy: read the ratios, each measured in this one run).",
        "",
        f"Iterations 1–{args.repeats} of each variant ({cfg0.env.tasks_per_iter} tasks × {cfg0.env.group_size} episodes), "
        "from its warm start every time, the variants alternating; medians over the iterations, rows and prompt "
        "tokens are means.",
        "",
        "| variant | overrides | rows | prompt tokens per row | rollout s | update s | iteration s | ms per row "
        f"| iterations per second vs {base} | rows per second vs {base} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {name} | {' '.join(f'`{o}`' for o in overrides) or '—'} | {m['rows']:.0f} | {m['tokens']:.1f} "
          f"| {m['rollout']:.2f} | {m['update']:.2f} | {m['iteration']:.2f} | {m['row_ms']:.2f} "
          f"| {med[base]['iteration'] / m['iteration']:.2f}× | {med[base]['row_ms'] / m['row_ms']:.2f}× |"
          for (name, overrides), m in zip(args.variant, med.values())),
        "",
    ]
    text = "\n".join(lines)
    publish(text, args.out)


if __name__ == "__main__":
    main()
