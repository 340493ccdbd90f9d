"""The host contract's own cost: `oma.hosts.align` (advantages, weights over the whole step, metrics) against
the advantage step a host runs natively, on the same stepwise batch.

Run by hand (results committed as benchmarks/hosts.md):

    .venv/bin/python benchmarks/hosts.py --out benchmarks/hosts.md

The batch is benchmarks/accounting.py's (≈20 rows per trajectory, groups of 8, L=32, rows shuffled), cut into 4
PPO mini-batches as a host would. verl's native advantage step is `compute_grpo_vectorized_outcome_advantage` with
the string uids its trainer passes (the fastest of verl's GRPO paths on such ids); verl's update then aggregates
the loss itself. `align` does more: it also computes every token's weight (Mass Alignment over the whole step)
and the `oma/*` metrics, so the ratio is what switching oma on adds to the advantage step, not a like-for-like
race. Timings are the best of `--repeats` means over calls that fill 0.2 s, all in one run (ratios are what
matter on a shared machine).
"""

from __future__ import annotations

import argparse
import platform

import torch
from accounting import GROUP_SIZE, LENGTH, make_batch, per_call  # benchmarks/ is on sys.path when run as a script
from rich.console import Console
from rich.progress import track
from rich.table import Table
from throughput import publish
from verl.trainer.ppo import core_algos

from oma import hosts

MINIBATCHES = 4


def cases(b: dict) -> dict[str, object]:
    layout = list(torch.arange(b["scores"].shape[0]).tensor_split(MINIBATCHES))
    step = hosts.HostStep(group_index=b["group"], traj_index=b["traj"], scores=b["scores"], response_mask=b["mask"],
                          step_index=b["step"], minibatches=layout)
    oma_on, baseline = hosts.HostOptions(), hosts.HostOptions(accounting="row", mass="native")
    return {
        "verl: its GRPO advantage step (str uid)": lambda: core_algos.compute_grpo_vectorized_outcome_advantage(
            b["rewards"], b["mask"].float(), b["uid_str"]),
        "oma.hosts.align, OA + uniform MA": lambda: hosts.align(step, oma_on),
        "oma.hosts.align, row + native (the baseline)": lambda: hosts.align(step, baseline),
        "  of which advantages (OA)": lambda: hosts.advantages(step, oma_on),
        "  of which weights (uniform MA)": lambda: hosts.weights(step, oma_on),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the Markdown page here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[int, dict[str, float]] = {}
    for rows in args.sizes:
        batch = make_batch(rows)
        results[rows] = {name: per_call(fn, args.repeats)
                         for name, fn in track(list(cases(batch).items()), description=f"R={rows:,}")}
    names = list(next(iter(results.values())))
    native = names[0]
    table = Table(title="seconds per call (best of means), 1 thread")
    table.add_column("call")
    for rows in args.sizes:
        table.add_column(f"R={rows:,}", justify="right")
    for name in names:
        table.add_row(name, *(f"{results[r][name]:.4f}" for r in args.sizes))
    Console().print(table)

    lines = [
        "# Benchmark: the host contract's cost against a host's advantage step",
        "",
        "Command: `.venv/bin/python benchmarks/hosts.py --out benchmarks/hosts.md`",
        "",
        f"Machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, 1 thread, the "
        f"shared 2-core CPU. Batch: ≈20 rows per trajectory (10–30), groups of {GROUP_SIZE}, L={LENGTH}, rows "
        f"shuffled, {MINIBATCHES} mini-batches. Seconds per call: the best of {args.repeats} means over calls that "
        "fill 0.2 s. `align` computes advantages, every token's weight and the `oma/*` metrics; verl's advantage "
        "step computes advantages only (its loss aggregation runs later, in the update), so the ratio is what "
        "switching oma on adds there.",
        "",
        "| call | " + " | ".join(f"R={r:,} (s)" for r in args.sizes) + " | " + " | ".join(
            f"× verl at {r:,}" for r in args.sizes) + " |",
        "|---|" + "---:|" * (2 * len(args.sizes)),
    ]
    for name in names:
        lines.append(f"| {name.strip()} | " + " | ".join(f"{results[r][name]:.4f}" for r in args.sizes) + " | "
                     + " | ".join(f"{results[r][name] / results[r][native]:.2f}" for r in args.sizes) + " |")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
