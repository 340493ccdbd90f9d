"""Segment (grouped) reductions over id arrays: the vectorised building blocks of oma.core.

A *segment* is the set of elements sharing an id. Everything here is a sort (``torch.unique``)
plus scatter/index_add, so cost is O(N log N) with no Python loop over rows, trajectories or
groups, on any device. Sums accumulate in float64. Gathers use ``index_select``: the same values
as advanced indexing at about a quarter of its cost on CPU (14 against 54 µs for 10^4 rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from oma.core.validate import check_index, check_same_device


@dataclass(frozen=True)
class Segments:
    """The segments of an id array.

    Attributes:
        ids: the distinct ids, sorted ascending, shape [S].
        inverse: segment number (0..S-1) of each element, shape [N].
        counts: elements per segment, int64 [S].
    """

    ids: Tensor
    inverse: Tensor
    counts: Tensor

    @property
    def n(self) -> int:
        return int(self.ids.shape[0])


def segments(ids: Tensor) -> Segments:
    """Distinct ids (sorted), each element's segment and each segment's size.

    Ids that are small non-negative integers (the common case: 0..T-1 with gaps) are segmented
    by counting, O(N + max id) without a sort; any others by ``torch.unique``. Both give the
    same result.
    """
    n = ids.numel()
    if n and ids.dtype != torch.bool:
        lo, hi = int(ids.min()), int(ids.max())
        if lo >= 0 and hi < 4 * n + 1024:
            occupied = torch.bincount(ids.to(torch.int64), minlength=hi + 1)
            present = occupied > 0
            dense = torch.cumsum(present, 0) - 1  # id -> segment number
            inverse = dense.index_select(0, ids.to(torch.int64))
            return Segments(present.nonzero().squeeze(-1).to(ids.dtype), inverse, occupied[present])
    uniq, inverse, counts = torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)
    return Segments(uniq, inverse, counts)


def segment_sum(values: Tensor, inverse: Tensor, n: int) -> Tensor:
    """Σ of ``values`` per segment, float64 [n] (long sums accumulate in float64)."""
    out = torch.zeros(n, dtype=torch.float64, device=values.device)
    return out.index_add_(0, inverse, values.to(torch.float64))


def _segment_extreme(values: Tensor, inverse: Tensor, n: int, reduce: str) -> Tensor:
    out = torch.zeros(n, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, inverse, values, reduce=reduce, include_self=False)


@dataclass(frozen=True)
class SegmentStats:
    """Mean and unbiased std per segment, in float64.

    Attributes:
        mean: Σv / n, [S].
        std: sqrt(Σ(v − mean)² / (n − 1)) (Bessel, as ``torch.std``); 0 where n < 2, [S].
        count: members per segment, int64 [S].
        zero_spread: True where all members are exactly equal (max == min), [S]. Computed from
            the values, not from ``std``, so that rounding in the mean can never turn equal
            values into a tiny non-zero spread.
    """

    mean: Tensor
    std: Tensor
    count: Tensor
    zero_spread: Tensor


def segment_mean_std(values: Tensor, inverse: Tensor, counts: Tensor) -> SegmentStats:
    """Two-pass mean and unbiased std of ``values`` per segment (float64)."""
    n = int(counts.shape[0])
    v = values.to(torch.float64)
    cnt = counts.to(torch.float64)
    mean = segment_sum(v, inverse, n) / cnt.clamp_min(1.0)
    dev = v - mean.index_select(0, inverse)
    var = segment_sum(dev * dev, inverse, n) / (cnt - 1.0).clamp_min(1.0)
    std = torch.where(counts >= 2, var.sqrt(), torch.zeros_like(var))
    zero_spread = _segment_extreme(v, inverse, n, "amax") == _segment_extreme(v, inverse, n, "amin")
    return SegmentStats(mean=mean, std=std, count=counts, zero_spread=zero_spread)


@dataclass(frozen=True)
class BatchStructure:
    """How the rows of a batch nest into trajectories and groups.

    Attributes:
        traj: segments of ``traj_index`` over rows (T trajectories, in ``torch.unique`` order).
        group_ids: the distinct group ids, sorted, [G].
        traj_group: group segment (0..G-1) of each trajectory, [T].
        row_group: group segment (0..G-1) of each row, [R].
    """

    traj: Segments
    group_ids: Tensor
    traj_group: Tensor
    row_group: Tensor

    @property
    def n_traj(self) -> int:
        return self.traj.n

    @property
    def n_groups(self) -> int:
        return int(self.group_ids.shape[0])

    def trajectories_per_group(self) -> Tensor:
        """|𝒯_g| per group, int64 [G]."""
        return torch.bincount(self.traj_group, minlength=self.n_groups)

    def position_in_trajectory(self) -> Tensor:
        """Each row's order of appearance inside its trajectory (0, 1, ...), int64 [R].

        The step order of batches that keep a trajectory's rows in step order but carry no step
        column (verl-agent's rows, verl's agent loop outputs).
        """
        inverse = self.traj.inverse
        order = torch.argsort(inverse, stable=True)
        first = torch.cumsum(self.traj.counts, 0) - self.traj.counts
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel(), device=order.device) - first[inverse[order]]
        return pos


class TrajectorySplitError(ValueError):
    """A trajectory whose rows carry two group ids (every trajectory must lie in one group).

    Attributes:
        traj_id: the first such trajectory's id (as given in ``traj_index``).
        group_ids: the two group ids it spans, ascending.
        n_split: how many trajectories span more than one group.
    """

    def __init__(self, traj_id: int, group_ids: tuple[int, int], n_split: int):
        self.traj_id, self.group_ids, self.n_split = traj_id, group_ids, n_split
        super().__init__(
            f"traj_index {traj_id} spans groups {group_ids[0]} and {group_ids[1]} in group_index; every trajectory "
            f"must lie in exactly one group ({n_split} trajectories violate this)"
        )


def batch_structure(group_index: Tensor, traj_index: Tensor) -> BatchStructure:
    """Validate ``group_index``/``traj_index`` and map rows → trajectories → groups.

    Ids need not be contiguous or sorted. A trajectory whose rows carry two different group ids
    raises :class:`TrajectorySplitError` (a ``ValueError``) naming the trajectory and both groups.

    Every function of :mod:`oma.core` that takes ids computes this once; callers that need several
    of them on one batch compute it themselves and pass it as ``structure=`` (an O(R log R) sort
    for arbitrary ids, O(R) for small non-negative ones).
    """
    group_index = check_index("group_index", group_index)
    traj_index = check_index("traj_index", traj_index, group_index.shape[0])
    check_same_device(group_index=group_index, traj_index=traj_index)
    traj = segments(traj_index)
    g = group_index.to(torch.int64)
    # Any row's group stands for its trajectory; a row that disagrees exposes a split trajectory.
    g_traj = torch.empty(traj.n, dtype=torch.int64, device=g.device).scatter_(0, traj.inverse, g)
    split = g != g_traj.index_select(0, traj.inverse)
    if bool(split.any()):
        r = int(split.nonzero()[0, 0])
        n_split = int(torch.unique(traj.inverse[split]).numel())
        pair = sorted((int(g_traj[traj.inverse[r]]), int(g[r])))
        raise TrajectorySplitError(int(traj_index[r]), (pair[0], pair[1]), n_split)
    group_ids, traj_group = torch.unique(g_traj, sorted=True, return_inverse=True)
    row_group = traj_group.index_select(0, traj.inverse)
    return BatchStructure(traj=traj, group_ids=group_ids, traj_group=traj_group, row_group=row_group)
