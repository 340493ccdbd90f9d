"""Index plans for PPO epochs: mini-batches of whole trajectories, micro-batches of rows.

Exact gradient accumulation with oma is two lines: weights once on the mini-batch, then any
split of its rows::

    W = token_weights(mask, group_index, traj_index)          # normalisers: whole mini-batch
    for idx in micro_batches(mask.shape[0], max_rows=8):
        loss = weighted_loss(token_objective(logp(idx), ...), W[idx])
        loss.backward()                                      # Σ over micro-batches = full loss

Because loss = Σ W·ℓ is linear in its rows, the summed micro-batch losses and gradients equal the
mini-batch's for any split (docs/math.md#invariances (2)); nothing is re-normalised per micro-batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from oma.core.validate import check_count, check_index
from oma.core.segments import segments


def micro_batches(n_rows: int, max_rows: int) -> list[Tensor]:
    """Consecutive row-index chunks of at most ``max_rows`` rows covering 0..n_rows-1."""
    check_count("n_rows", n_rows, 0)
    check_count("max_rows", max_rows, 1)
    return list(torch.arange(n_rows).split(max_rows))


def trajectory_minibatches(traj_index: Tensor, num_minibatches: int, *, generator: torch.Generator | None = None) -> list[Tensor]:
    """Split rows into ``num_minibatches`` mini-batches of *whole* trajectories (row-index tensors).

    Trajectories are shuffled with ``generator`` (kept in ``torch.unique`` order when None) and
    dealt into mini-batches of as-equal-as-possible trajectory counts, so outcome statistics and
    Mass Alignment see every row of a trajectory together. Returns row indices, each sorted.
    """
    traj_index = check_index("traj_index", traj_index)
    check_count("num_minibatches", num_minibatches, 1)
    traj = segments(traj_index)
    if not 1 <= num_minibatches <= max(traj.n, 1):
        raise ValueError(f"num_minibatches must be in [1, {max(traj.n, 1)}] (the trajectory count), got {num_minibatches}")
    order = torch.randperm(traj.n, generator=generator) if generator is not None else torch.arange(traj.n)
    slot = torch.empty(traj.n, dtype=torch.int64)
    slot[order] = torch.arange(traj.n) % num_minibatches
    row_slot = slot.to(traj.inverse.device)[traj.inverse]
    return [(row_slot == k).nonzero().squeeze(-1) for k in range(num_minibatches)]
