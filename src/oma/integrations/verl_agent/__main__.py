"""``python -m oma.integrations.verl_agent check BATCH``: what verl-agent and OMA make of one dumped batch
(docs/verl-agent.md#audit-your-run).

BATCH is a Parquet or JSONL file with verl-agent's columns, as docs/audit.md#verl-agent-batches dumps
them (``response_tokens`` or ``response_mask``; ``row_hash`` or ``row_id`` marks the padding copies).
Prints, per trajectory, its rows and tokens, its mean advantage under row accounting (verl-agent's)
and trajectory accounting (OA), and its share of the step's loss mass under verl-agent's own
aggregation and under Mass Alignment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import torch
from torch import Tensor

from oma.integrations._columns import ids
from oma.integrations.verl_agent.batch import AGG_MODES, ActorLoss, align_batch, float32_zero_spread
from oma.integrations.verl_agent.trainer import ESTIMATORS


def read_columns(path: str | Path) -> dict[str, np.ndarray]:
    """A dumped batch's columns as numpy arrays; ``response_tokens`` becomes a ``response_mask`` and a
    ``row_hash`` stands for ``row_id``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    with open(path, "rb") as f:
        parquet = f.read(4) == b"PAR1"  # by its magic bytes, whatever it is named (`.pq`, `.parquet`)
    table: pa.Table = pq.read_table(path) if parquet else pa_json.read_json(path)
    cols = {name: np.asarray(table[name].to_pylist(), dtype=object) for name in table.column_names}
    if "response_mask" in cols:
        rows = [np.asarray(m, dtype=bool) for m in cols["response_mask"]]
        width = max((len(m) for m in rows), default=0)
        cols["response_mask"] = np.stack([np.pad(m, (0, width - len(m))) for m in rows]) if rows else np.zeros((0, 0), bool)
    elif "response_tokens" in cols:
        counts = cols["response_tokens"].astype(np.float64)
        bad = ~((counts >= 0) & (counts == np.floor(counts)))  # astype(int64) made -3 a 0 and 2.5 a 2
        if bad.any():
            first = int(bad.nonzero()[0][0])
            raise ValueError(f"{path}: column 'response_tokens' must hold whole numbers >= 0, found "
                             f"{cols['response_tokens'][first]!r} at row {first} (0-based)")
        n = counts.astype(np.int64)
        cols["response_mask"] = np.arange(max(int(n.max(initial=0)), 1)) < n[:, None]
    if "response_mask" in cols and not cols["response_mask"].any():
        raise ValueError(f"{path}: no row has a response token (response_mask or response_tokens all 0): there is "
                         "no loss to weigh")
    if "row_id" not in cols and "row_hash" in cols:
        cols["row_id"] = cols["row_hash"]
    return cols


def _per_trajectory(traj: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.float64).index_add_(0, traj, values)


def float32_residue(cols: dict[str, np.ndarray], estimator: str, norm_by_std: bool, invalid_penalty: float) -> Tensor | None:
    """Per row, what stock verl-agent's float32 arithmetic adds to an advantage that is exactly 0 (a group of
    equal scores, :func:`~oma.integrations.verl_agent.batch.float32_zero_spread`); None without the std
    (then the residue is at most an ulp of the score). The scores in float32 as verl-agent forms them."""
    if not norm_by_std or estimator == "rloo":
        return None
    if "token_level_rewards" in cols:
        scores = torch.as_tensor(np.stack(list(cols["token_level_rewards"])).astype(np.float32)).sum(-1)
    else:  # the reward on the last token, less the penalty, both float32 (apply_invalid_action_penalty)
        scores = torch.as_tensor(cols["episode_rewards"].astype(np.float32))
        if invalid_penalty:
            scores = scores - invalid_penalty * (1 - torch.as_tensor(cols["is_action_valid"].astype(np.float32)))
    group = ids(cols["uid"])[0]
    residue = float32_zero_spread(scores, group)
    if estimator == "gigpo":  # ω = 1, the step term over the rows of a uid in one state
        state = ids(list(zip(group.tolist(), ids(cols["anchor_obs"])[0].tolist(), strict=True)))[0]
        residue = residue + float32_zero_spread(torch.as_tensor(cols["step_rewards"].astype(np.float32)), state)
    return residue


def check(path: str | Path, *, estimator: str = "grpo", norm_by_std: bool | None = None, invalid_penalty: float = 0.1,
          mass: str = "uniform", actor: ActorLoss | None = None) -> str:
    """The report's text (module docstring)."""
    cols = read_columns(path)
    std = (estimator != "gigpo") if norm_by_std is None else norm_by_std
    common = {"estimator": estimator, "norm_by_std": std}
    base = align_batch(cols, {**common, "accounting": "row", "mass": "native"}, actor=actor, invalid_penalty=invalid_penalty)
    oma = align_batch(cols, {**common, "accounting": "trajectory", "mass": mass}, actor=actor, invalid_penalty=invalid_penalty)
    traj, labels = ids(cols["traj_uid"])
    keep = ~base.is_copy
    t, n = traj[keep], len(labels)
    rows = _per_trajectory(t, torch.ones(len(t), dtype=torch.float64), n)
    tokens = _per_trajectory(t, torch.as_tensor(cols["response_mask"]).sum(-1)[keep].double(), n)
    adv_row, adv_traj = (_per_trajectory(t, r.adv[keep], n) / rows for r in (base, oma))
    share_native, share_oma = (m / m.sum() for m in (_per_trajectory(traj, r.weights.sum(-1), n) for r in (base, oma)))
    uid = {lab: u for lab, u in zip(cols["traj_uid"], cols["uid"], strict=True)}
    out = [f"{path}: {len(traj)} rows ({int(base.is_copy.sum())} padding copies), {n} trajectories; {estimator}, "
           f"norm_by_std={std}, invalid_penalty={invalid_penalty:g}",
           f"{'uid':>14} {'traj_uid':>14} {'rows':>5} {'tokens':>7} {'A row':>9} {'A traj':>9} "
           f"{'mass native':>12} {'mass ' + mass:>12}"]
    for i in sorted(range(n), key=lambda i: (str(uid[labels[i]]), str(labels[i]))):
        out.append(f"{str(uid[labels[i]])[-14:]:>14} {str(labels[i])[-14:]:>14} {int(rows[i]):>5} {int(tokens[i]):>7} "
                   f"{float(adv_row[i]):>9.4f} {float(adv_traj[i]):>9.4f} {float(share_native[i]):>12.4f} "
                   f"{float(share_oma[i]):>12.4f}")
    copy_share = float(base.weights[base.is_copy].sum() / base.weights.sum())
    out.append(f"padding copies carry {copy_share:.4f} of verl-agent's own mass, 0 under mass={mass}; "
               f"Kish effective trajectories: {base.metrics.get('oma/effective_trajectories', 0):.2f} native, "
               f"{oma.metrics.get('oma/effective_trajectories', 0):.2f} {mass}")
    residue = float32_residue(cols, estimator, std, invalid_penalty)
    if residue is None:
        out.append("float32 zero spread: none without the std (stock verl-agent's residue is then an ulp of the score)")
    else:
        hit = residue != 0
        size = residue[hit].abs() if hit.any() else torch.zeros(1)
        out.append(f"float32 zero spread: {int(hit.sum())} of {len(traj)} rows sit in groups of equal scores whose float32 "
                   f"mean is inexact; stock verl-agent gives them |A| up to {float(size.max()):.3f} (mean "
                   f"{float(size.mean()):.3f}), oma 0 (docs/verl-agent.md#float32-zero-spread)")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oma.integrations.verl_agent", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="per-trajectory advantages and mass of one dumped verl-agent batch")
    p.add_argument("batch", help="a Parquet or JSONL dump (docs/audit.md#verl-agent-batches)")
    p.add_argument("--estimator", choices=ESTIMATORS, default="grpo")
    p.add_argument("--std", dest="norm_by_std", action=argparse.BooleanOptionalAction, default=None,
                   help="divide by the group std (default: on for grpo, off for gigpo as algorithm.gigpo.mode=mean_norm)")
    p.add_argument("--invalid-penalty", type=float, default=0.1, help="invalid_action_penalty_coef (0 if the penalty was off)")
    p.add_argument("--mass", choices=("uniform", "group"), default="uniform")
    p.add_argument("--mini-batch-rows", type=int, help="ppo_mini_batch_size × rollout.n (default: the whole batch)")
    p.add_argument("--micro-batch-rows", type=int, help="ppo_micro_batch_size_per_gpu")
    p.add_argument("--dp", type=int, default=1, help="the actor's data-parallel ranks")
    p.add_argument("--loss-agg-mode", choices=AGG_MODES, default="token-mean")
    p = sub.add_parser("check-install", help="oma's hook against a verl-agent checkout's own code "
                       "(docs/verl-agent.md#checked-against-verl-agents-own-code)")
    p.add_argument("path", nargs="?", help="a verl-agent checkout (default: the installed verl's parent, if agent_system "
                   "is beside it)")
    p.add_argument("--seed", type=int, default=0, help="the synthetic batch's seed")
    args = parser.parse_args(argv)
    if args.command == "check-install":
        from oma.integrations.verl_agent.check_install import main as check_install  # imports the checkout only now

        return check_install(args.path, seed=args.seed, prog=parser.prog)
    try:
        actor = ActorLoss(mini_batch_rows=args.mini_batch_rows, micro_batch_rows=args.micro_batch_rows, dp=args.dp,
                          loss_agg_mode=args.loss_agg_mode)
        print(check(args.batch, estimator=args.estimator, norm_by_std=args.norm_by_std,
                    invalid_penalty=args.invalid_penalty, mass=args.mass, actor=actor))
    except (OSError, ValueError, pa.ArrowException) as exc:
        print(f"{parser.prog} check: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
