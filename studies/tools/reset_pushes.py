"""Where does Outcome Alignment lose on resets? Each update's push split by the row's action and its trajectory's outcome.

Run by hand (the lead runs it for the dose-response study):

    .venv/bin/python studies/tools/reset_pushes.py --seeds 0 1 2 --iterations 10 --out studies/<study>/reset-pushes.md

Trains the tabular lane's reset chain (``configs/chain-tabular-grpo.yaml`` with ``env.options.on_wrong=reset
env.options.length=6 env.options.actions=2``: the coupling map's ``reset`` setting; any preset and overrides can
be given) with ``oma train`` itself, under row+native (the baseline: ``algo.accounting=row algo.mass=native``
unless overridden), for ``--iterations`` iterations per seed, keeping every batch (``dump_batches``) and every
episode's transcript (``samples_per_iter``). Then, on each update's batch, it computes under row and under
trajectory statistics (the run's estimator, the same rows) each row's push

    q_r = m_r · A_r,   m_r = Σ_l W[r, l] (native weights of the batch: the reducer's own mass)

the coefficient of log π(a_r | s_r) in the update's gradient at ratio 1 (a tabular row's tokens all carry that
log-probability), and splits Σ q by the row's trajectory (success or failure) and its action, right or wrong
(the action the chain's sign calls for there, found by replaying the episode: ``env.expert_action()`` before each
step). Normalised SGD keeps only an update's direction, so the page compares the accountings by each cell's share
of Σ |q|: a failure's right actions pushed down harder under trajectory statistics is where OA would lose.
The weights are the batch's as one mini-batch (the trainer normalises each of its mini-batches on its own).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from oma.diagnostics import read_batch, run_batches
from oma.hosts import HostOptions, HostStep, advantages, weights
from oma.train import load_config, to_dict, train
from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the benchmark harness it reuses
from throughput import publish

PRESET = Path(__file__).resolve().parents[2] / "configs" / "chain-tabular-grpo.yaml"
RESET = ["env.options.on_wrong=reset", "env.options.length=6", "env.options.actions=2"]
"""The coupling map's ``reset`` setting on top of the preset."""
BASELINE = ["algo.accounting=row", "algo.mass=native"]

CELLS = (("success", "right"), ("success", "wrong"), ("failure", "right"), ("failure", "wrong"))
ACCOUNTINGS = ("row", "trajectory")


def right_actions(seed: int, actions: Sequence[str], make_env: Callable[[], object]) -> list[bool]:
    """Replay task ``seed`` with ``actions``: whether each one is the action the environment's expert takes there."""
    env = make_env()
    env.reset(seed)
    right = []
    for action in actions:
        right.append(action == env.expert_action())
        env.step(action)
    return right


def split(push: torch.Tensor, right: torch.Tensor, success: torch.Tensor) -> dict[tuple[str, str], float]:
    """Σ push over the rows of each (trajectory outcome, action) cell of :data:`CELLS`."""
    out = {}
    for outcome, action in CELLS:
        inside = (success if outcome == "success" else ~success) & (right if action == "right" else ~right)
        out[(outcome, action)] = float(push[inside].sum())
    return out


def pushes(step: HostStep, options: HostOptions) -> dict[str, torch.Tensor]:
    """q_r = m_r · A_r per accounting of :data:`ACCOUNTINGS` (A from ``options``' estimator with that accounting, m
    from the batch's native weights)."""
    mass = weights(step, HostOptions(**{**_fields(options), "mass": "native"})).sum(-1)
    return {acc: mass * advantages(step, HostOptions(**{**_fields(options), "accounting": acc})).double()
            for acc in ACCOUNTINGS}


def _fields(options: HostOptions) -> dict:
    return {k: getattr(options, k) for k in ("reducer", "estimator", "norm_by_std", "gamma", "step_advantage_w")}


def batch_split(run_dir: Path, iteration: int, path: Path, options: HostOptions, make_env) -> dict[str, dict]:
    """One update's split per accounting, from its dumped batch and its episodes' transcripts."""
    b = read_batch(path)
    episodes = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    episodes = [e for e in episodes if e["iteration"] == iteration]
    right_of = [right_actions(e["seed"], [a["action"] for a in e["transcript"]], make_env) for e in episodes]
    traj = torch.tensor(b.traj_index)
    step_index = torch.tensor(b.step_index)
    if len(episodes) != int(traj.max()) + 1:
        raise SystemExit(f"{run_dir}: iteration {iteration} kept {len(episodes)} transcripts of {int(traj.max()) + 1} "
                         "episodes (samples_per_iter must cover them all)")
    right = torch.tensor([right_of[t][s] for t, s in zip(traj.tolist(), step_index.tolist())])
    tokens = torch.tensor(b.response_tokens)
    mask = torch.arange(int(tokens.max())).unsqueeze(0) < tokens.unsqueeze(-1)
    step = HostStep(group_index=torch.tensor(b.group_index), traj_index=traj, scores=torch.tensor(b.scores),
                    response_mask=mask, step_index=step_index,
                    anchor=None if b.anchor is None else torch.tensor(b.anchor),
                    step_rewards=None if b.step_rewards is None else torch.tensor(b.step_rewards))
    success = torch.tensor(b.won).bool()
    return {acc: split(q, right, success) | {"abs": float(q.abs().sum())} for acc, q in pushes(step, options).items()}


def run(config: str, overrides: list[str], seed: int, iterations: int, work: Path) -> list[dict[str, dict]]:
    """Train seed ``seed`` for ``iterations`` iterations into ``work`` and split every update's push."""
    cfg = load_config(config, [*RESET, *BASELINE, *overrides, f"seed={seed}", f"iterations={iterations}",
                               "dump_batches=true", f"out_dir={work}", "tensorboard=false"])
    cfg.samples_per_iter = cfg.env.tasks_per_iter * cfg.env.group_size
    train(cfg, work)
    a = to_dict(cfg)["algo"]
    options = HostOptions(reducer=a["reducer"], estimator=a["estimator"], norm_by_std=a["norm_by_std"],
                          gamma=a["gamma"], step_advantage_w=a["step_advantage_w"])
    make_env = env_factory(cfg)
    return [batch_split(work, it, path, options, make_env) for it, path in run_batches(work)]


def shares(total: dict[str, dict]) -> dict[str, dict[tuple[str, str], float]]:
    """Each cell's Σ q as a share of the accounting's Σ |q| (signed)."""
    return {acc: {c: total[acc][c] / total[acc]["abs"] for c in CELLS} for acc in ACCOUNTINGS}


def add(splits: list[dict[str, dict]]) -> dict[str, dict]:
    """Σ over updates of each accounting's cells and Σ |q|."""
    return {acc: {k: sum(s[acc][k] for s in splits) for k in (*CELLS, "abs")} for acc in ACCOUNTINGS}


def plot(per_update: list[dict[str, dict]], total: dict[str, dict], path: Path) -> None:
    """Left: each cell's share of Σ |q| over all updates, row vs trajectory. Right: per update, the share on a
    failure's right actions."""
    from oma.diagnostics.plots import figure, save_png

    fig = figure(11.0, 4.0)
    ax = fig.add_subplot(1, 2, 1)
    sh = shares(total)
    for j, acc in enumerate(ACCOUNTINGS):
        ax.bar([i + 0.38 * j for i in range(len(CELLS))], [sh[acc][c] for c in CELLS], width=0.38,
               label=f"{acc} statistics", color=("#888888", "#1f4e9c")[j])
    ax.set_xticks([i + 0.19 for i in range(len(CELLS))], [f"{o}\n{a} action" for o, a in CELLS], fontsize=8)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_ylabel("Σ q / Σ |q| (all updates)")
    ax.set_title("Push by cell (native mass)", fontsize=9)
    ax.legend(fontsize=8)
    ax = fig.add_subplot(1, 2, 2)
    for j, acc in enumerate(ACCOUNTINGS):
        ax.plot([s[acc][("failure", "right")] / s[acc]["abs"] for s in per_update], marker="o", ms=3,
                color=("#888888", "#1f4e9c")[j], label=f"{acc} statistics")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("update (seeds one after another)")
    ax.set_ylabel("share of Σ |q| on a failure's right actions")
    ax.set_title("Right actions inside failures, per update", fontsize=9)
    ax.legend(fontsize=8)
    save_png(fig, path)


def report(total: dict[str, dict], updates: int, command: str, figure: str | None) -> str:
    sh = shares(total)
    lines = ["# Where OA loses on resets: the push on right and wrong actions inside successes and failures", "",
             f"Command: `{command}`", "",
             (f"{updates} updates of row+native runs on the reset chain; per update, q_r = m_r · A_r under row and under "
              "trajectory statistics on the same rows (native mass), summed per cell over all updates. Share = Σ q / "
              "Σ |q| of that accounting (normalised SGD keeps only the direction)."), "",
             "| trajectory | action | Σ q, row | Σ q, trajectory | share, row | share, trajectory | share, trajectory − row |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for c in CELLS:
        lines.append(f"| {c[0]} | {c[1]} | {total['row'][c]:+.4f} | {total['trajectory'][c]:+.4f} | "
                     f"{sh['row'][c]:+.3f} | {sh['trajectory'][c]:+.3f} | {sh['trajectory'][c] - sh['row'][c]:+.3f} |")
    if figure:
        lines += ["", f"![the push by cell]({figure})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(PRESET))
    parser.add_argument("overrides", nargs="*", help="on top of the reset chain and row+native")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--work", default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if "=" in args.config and not args.config.endswith((".yaml", ".yml")):  # overrides without a preset
        args.config, args.overrides = str(PRESET), [args.config, *args.overrides]
    if args.iterations < 1:
        raise SystemExit(f"--iterations {args.iterations}: expected a positive integer")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        per_update = [s for seed in args.seeds
                      for s in run(args.config, args.overrides, seed, args.iterations, work / f"seed-{seed}")]
    total = add(per_update)
    figure = None
    if args.out:
        path = Path(args.out).with_suffix(".png")
        plot(per_update, total, path)
        figure = path.name
    publish(report(total, len(per_update), " ".join(["studies/tools/reset_pushes.py", *argv]), figure), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
