"""Timing of oma.core's accounting against verl's GRPO on the same stepwise batch.

Run by hand (results committed as benchmarks/accounting.md):

    .venv/bin/python benchmarks/accounting.py --out benchmarks/accounting.md

Batch: R rows, ≈20 rows per trajectory (uniform 10–30), groups of 8 trajectories, L=32 response
tokens per row, binary outcomes. All timings in one run (ratios are what matter on a shared
machine); each entry is the time per call: the best of `--repeats` measurements, each the mean over as
many calls as fill 0.2 s (timeit's autorange, whose own pass is the warm-up), so a 0.5-ms call is
timed over hundreds of calls, not one.
"""

from __future__ import annotations

import argparse
import platform
import timeit
from collections.abc import Callable

import numpy as np
import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table
from verl.trainer.ppo import core_algos

from oma.core import gigpo_advantages, outcome_advantages, token_weights

LENGTH = 32
GROUP_SIZE = 8


def make_batch(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    k = rng.integers(10, 31, size=rows // 10)  # more trajectories than needed; cut at `rows`
    k = k[: int(np.searchsorted(np.cumsum(k), rows)) + 1]
    traj = np.repeat(np.arange(len(k)), k)[:rows]
    n_traj = int(traj.max()) + 1
    group = traj // GROUP_SIZE
    outcome = rng.integers(0, 2, size=n_traj).astype(np.float32)
    step = np.concatenate([np.arange(n) for n in k])[:rows]
    perm = rng.permutation(rows)  # rows arrive in no particular order
    traj, group, step = traj[perm], group[perm], step[perm]
    scores = torch.from_numpy(outcome[traj])  # every row carries its trajectory's outcome, as in oma train
    n_tok = torch.from_numpy(rng.integers(1, LENGTH + 1, size=rows))
    mask = torch.arange(LENGTH) < n_tok.unsqueeze(-1)
    rewards = torch.zeros(rows, LENGTH)
    rewards[torch.arange(rows), n_tok - 1] = scores
    return {
        "scores": scores,
        "group": torch.from_numpy(group),
        "traj": torch.from_numpy(traj),
        "step": torch.from_numpy(step),
        "anchor": torch.from_numpy(rng.integers(0, 50, size=rows)),
        "step_rewards": torch.from_numpy(rng.normal(size=rows).astype(np.float32)),
        # a score that differs between a trajectory's rows (per-step penalties): trajectory_outcomes sorts them
        "scores_varied": scores - 0.01 * torch.from_numpy(step.astype(np.float32)),
        "mask": mask,
        "rewards": rewards,
        "uid_int": group,
        "uid_str": np.array([f"{g:08x}-uid" for g in group], dtype=object),
    }


def per_call(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call: the best of ``repeats`` means over as many calls as fill 0.2 s."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=repeats, number=number)) / number


def cases(b: dict) -> dict[str, Callable[[], object]]:
    return {
        "oma outcome_advantages (row)": lambda: outcome_advantages(b["scores"], b["group"], b["traj"], accounting="row"),
        "oma outcome_advantages (trajectory)": lambda: outcome_advantages(b["scores"], b["group"], b["traj"], accounting="trajectory"),
        "oma outcome_advantages (trajectory, rows' scores differ)": lambda: outcome_advantages(
            b["scores_varied"], b["group"], b["traj"], accounting="trajectory"),
        "oma gigpo_advantages (trajectory)": lambda: gigpo_advantages(
            b["scores"], b["step_rewards"], b["anchor"], b["group"], b["traj"], b["step"]),
        "oma token_weights (token-mean, uniform)": lambda: token_weights(b["mask"], b["group"], b["traj"]),
        "verl grpo_vectorized (int index)": lambda: core_algos.compute_grpo_vectorized_outcome_advantage(
            b["rewards"], b["mask"].float(), b["uid_int"]),
        "verl grpo_vectorized (torch index)": lambda: core_algos.compute_grpo_vectorized_outcome_advantage(
            b["rewards"], b["mask"].float(), b["group"]),
        "verl grpo_vectorized (str uid)": lambda: core_algos.compute_grpo_vectorized_outcome_advantage(
            b["rewards"], b["mask"].float(), b["uid_str"]),
        "verl grpo loop (str uid)": lambda: core_algos.compute_grpo_outcome_advantage(
            b["rewards"], b["mask"].float(), b["uid_str"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the Markdown table here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[int, dict[str, float]] = {}
    for rows in args.sizes:
        batch = make_batch(rows)
        results[rows] = {}
        for name, fn in track(list(cases(batch).items()), description=f"R={rows:,}"):
            # verl's loop version costs ~seconds at 10^6 rows: one timed run is enough there
            repeats = 1 if "loop" in name and rows >= 1_000_000 else args.repeats
            results[rows][name] = per_call(fn, repeats)
    names = list(next(iter(results.values())))
    table = Table(title="seconds per call (best of means), 1 thread")
    table.add_column("function")
    for rows in args.sizes:
        table.add_column(f"R={rows:,}", justify="right")
    for name in names:
        table.add_row(name, *(f"{results[r][name]:.4f}" for r in args.sizes))
    Console().print(table)

    big, small = max(args.sizes), min(args.sizes)
    ours = results[big]["oma outcome_advantages (trajectory)"]
    lines = [
        "# Benchmark: outcome accounting vs verl's GRPO",
        "",
        "Command: `.venv/bin/python benchmarks/accounting.py --out benchmarks/accounting.md`",
        "",
        f"Machine: {platform.machine()}, {platform.python_version()}, torch {torch.__version__}, 1 thread "
        f"(`torch.set_num_threads(1)`), shared 2-core CPU. Seconds per call: the best of {args.repeats} "
        "measurements, each the mean over as many calls as fill 0.2 s (timeit's autorange, after its own pass; "
        "verl's loop version at 10^6 rows: one measurement of one call).",
        "",
        f"Batch: ≈20 rows per trajectory (10–30), groups of {GROUP_SIZE} trajectories, L={LENGTH}, rows shuffled. "
        "Ids are dense integers (as oma's trainer assigns them), which `oma.core` segments by counting; "
        "sparse ids (hashes) take `torch.unique`'s sort instead (about 4x slower at 10^6 rows). Every row carries its "
        "trajectory's outcome, as in `oma train`; the row \"rows' scores differ\" takes 0.01 per step off each row's "
        "score, so `trajectory_outcomes` sorts the rows by value to sum them in an order independent of row order "
        "(docs/math.md#invariances).",
        "",
        "| function | " + " | ".join(f"R={r:,} (s)" for r in args.sizes) + f" | µs/row at {small:,} | µs/row at {big:,} |",
        "|---|" + "---:|" * (len(args.sizes) + 2),
    ]
    for name in names:
        t = results
        lines.append(
            f"| {name} | " + " | ".join(f"{t[r][name]:.4f}" for r in args.sizes)
            + f" | {1e6 * t[small][name] / small:.3f} | {1e6 * t[big][name] / big:.3f} |"
        )
    lines += [
        "",
        "Targets (issue 2), at every size and at R=10^6:",
        "",
    ]
    for rows in args.sizes:
        r = results[rows]
        lines.append(
            f"- R={rows:,}: trajectory accounting / verl vectorised (int index) = "
            f"{r['oma outcome_advantages (trajectory)'] / r['verl grpo_vectorized (int index)']:.2f}x the time, "
            f"/ verl vectorised (torch index, its fastest path) = "
            f"{r['oma outcome_advantages (trajectory)'] / r['verl grpo_vectorized (torch index)']:.2f}x, "
            f"/ verl vectorised (str uid, what verl's trainer passes) = "
            f"{r['oma outcome_advantages (trajectory)'] / r['verl grpo_vectorized (str uid)']:.2f}x"
        )
    lines.append(
        f"- R={big:,}: verl's loop version takes {results[big]['verl grpo loop (str uid)'] / ours:.0f}x as long as trajectory accounting."
    )
    lines.append(
        f"- Growth: trajectory accounting µs/row goes from {1e6 * results[small]['oma outcome_advantages (trajectory)'] / small:.3f} "
        f"to {1e6 * ours / big:.3f} over a {big // small}x larger batch (linear = constant µs/row; sorting adds a log factor)."
    )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
