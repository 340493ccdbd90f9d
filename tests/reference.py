"""Naive per-row reference implementations (plain Python loops over dicts), written from docs/math.md.

They share no code with oma.core: an equivalence test between the two can only pass if both
read the math the same way.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    """A stepwise batch as plain tensors (what a rollout produces)."""

    scores: torch.Tensor  # float64 [R]
    group_index: torch.Tensor  # int64 [R]
    traj_index: torch.Tensor  # int64 [R]
    step_index: torch.Tensor  # int64 [R]
    response_mask: torch.Tensor  # bool [R, L]
    step_rewards: torch.Tensor  # float64 [R]
    anchor: torch.Tensor  # int64 [R]

    @property
    def rows(self) -> int:
        return int(self.scores.shape[0])

    def take(self, idx: torch.Tensor) -> "Batch":
        return Batch(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))


def make_batch(rng: np.random.Generator, *, groups=3, max_traj=4, max_rows=6, length=5, step_penalty=False) -> Batch:
    """Random batch with non-contiguous, unsorted ids, rows shuffled, some empty rows."""
    scores, gidx, tidx, sidx, masks, srew, anch = [], [], [], [], [], [], []
    gids = rng.choice(10_000, size=groups, replace=False)
    tid_pool = iter(rng.choice(100_000, size=groups * max_traj, replace=False))
    for g in gids:
        for _ in range(int(rng.integers(1, max_traj + 1))):
            t = next(tid_pool)
            outcome = float(rng.integers(0, 3))
            k_rows = int(rng.integers(1, max_rows + 1))
            for k in range(k_rows):
                n_tok = int(rng.integers(0, length + 1))
                scores.append(outcome - (0.1 * rng.integers(0, 2) if step_penalty else 0.0))
                gidx.append(int(g))
                tidx.append(int(t))
                sidx.append(k)
                masks.append([True] * n_tok + [False] * (length - n_tok))
                srew.append(float(rng.integers(0, 3)) - 1.0)
                anch.append(int(rng.integers(0, 3)))
    perm = rng.permutation(len(scores))
    b = Batch(
        torch.tensor(scores, dtype=torch.float64),
        torch.tensor(gidx),
        torch.tensor(tidx),
        torch.tensor(sidx),
        torch.tensor(masks, dtype=torch.bool).reshape(len(scores), length),
        torch.tensor(srew, dtype=torch.float64),
        torch.tensor(anch),
    )
    return b.take(torch.from_numpy(perm))


def _mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std


def _relative(values: list[float], estimator: str, norm_by_std: bool, eps: float) -> list[float]:
    n = len(values)
    if n < 2 or max(values) == min(values):
        return [0.0] * n
    mean, std = _mean_std(values)
    if estimator == "rloo":
        return [v - (sum(values) - v) / (n - 1) for v in values]
    return [(v - mean) / (std + eps) if norm_by_std else v - mean for v in values]


def outcome_advantages(b: Batch, accounting: str, estimator: str, norm_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    rows_of_group = defaultdict(list)
    rows_of_traj = defaultdict(list)
    for r in range(b.rows):
        rows_of_group[int(b.group_index[r])].append(r)
        rows_of_traj[int(b.traj_index[r])].append(r)
    adv = [0.0] * b.rows
    for rows in rows_of_group.values():
        if accounting == "row":
            vals = _relative([float(b.scores[r]) for r in rows], estimator, norm_by_std, eps)
            for r, a in zip(rows, vals):
                adv[r] = a
        else:
            trajs = sorted({int(b.traj_index[r]) for r in rows})
            outcomes = [sum(float(b.scores[r]) for r in rows_of_traj[t]) / len(rows_of_traj[t]) for t in trajs]
            for t, a in zip(trajs, _relative(outcomes, estimator, norm_by_std, eps)):
                for r in rows_of_traj[t]:
                    adv[r] = a
    return adv


def discounted_returns(b: Batch, gamma: float) -> list[float]:
    out = [0.0] * b.rows
    rows_of_traj = defaultdict(list)
    for r in range(b.rows):
        rows_of_traj[int(b.traj_index[r])].append(r)
    for rows in rows_of_traj.values():
        rows.sort(key=lambda r: int(b.step_index[r]))
        g = 0.0
        for r in reversed(rows):
            g = float(b.step_rewards[r]) + gamma * g
            out[r] = g
    return out


def gigpo_advantages(b: Batch, accounting: str, norm_by_std: bool, gamma: float, w: float, eps: float = 1e-6) -> list[float]:
    episode = outcome_advantages(b, accounting, "grpo", norm_by_std, eps)
    returns = discounted_returns(b, gamma)
    anchor_groups = defaultdict(list)
    for r in range(b.rows):
        anchor_groups[(int(b.group_index[r]), int(b.anchor[r]))].append(r)
    step = [0.0] * b.rows
    for rows in anchor_groups.values():
        for r, a in zip(rows, _relative([returns[r] for r in rows], "grpo", norm_by_std, eps)):
            step[r] = a
    return [e + w * s for e, s in zip(episode, step)]


def reduce_loss(loss: list[list[float]], mask: list[list[bool]], reducer: str, length_norm: float) -> float:
    """The native reducer applied to a list of rows (verl agg_loss semantics, single process)."""
    row_sums = [sum(l for l, m in zip(lr, mr) if m) for lr, mr in zip(loss, mask)]
    row_ntok = [sum(mr) for mr in mask]
    active = [n > 0 for n in row_ntok]
    if reducer == "token-mean":
        total = sum(row_ntok)
        return sum(row_sums) / total if total else 0.0
    if reducer == "token-sum":
        return sum(row_sums)
    n_rows = sum(active)
    if n_rows == 0:
        return 0.0
    if reducer == "seq-mean-token-mean":
        return sum(s / n for s, n, a in zip(row_sums, row_ntok, active) if a) / n_rows
    if reducer == "seq-mean-token-sum":
        return sum(s for s, a in zip(row_sums, active) if a) / n_rows
    if reducer == "seq-mean-token-sum-norm":
        return sum(s for s, a in zip(row_sums, active) if a) / n_rows / length_norm
    raise ValueError(reducer)


def total_loss(b: Batch, token_loss: torch.Tensor, reducer: str, mass: str) -> float:
    """Σ_τ w_τ·J_τ (aligned) or the reducer over the whole batch (native), by loops."""
    loss = token_loss.tolist()
    mask = b.response_mask.tolist()
    length = b.response_mask.shape[1]
    if mass == "native":
        return reduce_loss(loss, mask, reducer, length)
    rows_of_traj = defaultdict(list)
    for r in range(b.rows):
        rows_of_traj[int(b.traj_index[r])].append(r)
    active = {t: any(any(mask[r]) for r in rows) for t, rows in rows_of_traj.items()}
    group_of = {int(b.traj_index[r]): int(b.group_index[r]) for r in range(b.rows)}
    active_groups = {group_of[t] for t, a in active.items() if a}
    total = 0.0
    for t, rows in rows_of_traj.items():
        if not active[t]:
            continue
        if mass == "uniform":
            w = 1.0 / sum(active.values())
        else:
            in_group = sum(1 for u, a in active.items() if a and group_of[u] == group_of[t])
            w = 1.0 / (len(active_groups) * in_group)
        total += w * reduce_loss([loss[r] for r in rows], [mask[r] for r in rows], reducer, length)
    return total
