r"""Outcome statistics and episode-level advantages, with Outcome Alignment (OA).

Stepwise agent RL (verl-agent, ROLL, SkyRL step-wise, rLLM) trains on one *row* per agent step, so
a trajectory $τ$ of $K_τ$ steps contributes $K_τ$ rows, each stamped with the episode outcome $R_τ$.
Group statistics over rows count each outcome $K_τ$ times ("row" accounting, verl's default).
Outcome Alignment computes them over unique trajectories instead ("trajectory" accounting).
Reference: Zhang et al., "Outcome-Mass Alignment", [arXiv 2611.16816](https://arxiv.org/abs/2611.16816) (2026); docs/math.md#outcome-statistics-and-advantages-outcome-alignment.

Conventions (docs/math.md#outcome-statistics-and-advantages-outcome-alignment): std is unbiased (Bessel); a group with a single member (row or
trajectory, per accounting) or with zero spread gives advantage exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from oma.core.validate import check_float, check_index, check_option, check_positive, check_same_device
from oma.core.segments import BatchStructure, SegmentStats, batch_structure, segment_mean_std, segment_sum, segments

Accounting = Literal["row", "trajectory"]
"""How group outcome statistics count members.

* ``"row"``: every row is a member, so trajectory $τ$'s outcome is counted $K_τ$ times. This is what
  verl's ``compute_grpo_outcome_advantage`` and verl-agent (``compute_mean_std_cross_steps=True``)
  compute. Bias: long trajectories pull $μ_g$ and $σ_g$ toward their outcome.
* ``"trajectory"``: Outcome Alignment — every unique trajectory is one member with outcome
  $R_τ$ = the mean of its rows' scores. Unbiased by expansion length.
"""

Estimator = Literal["grpo", "rloo"]
"""Group-relative outcome estimator.

* ``"grpo"``: $A = (R − μ_g)/(σ_g + ε)$ (Shao et al. 2024, DeepSeekMath); with ``norm_by_std=False``
  $A = R − μ_g$ (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783), which drops the std's
  difficulty-dependent scaling.
* ``"rloo"``: $A = R −$ the mean of the *other* members (Ahmadian et al. 2024, arXiv 2402.14740);
  unbiased leave-one-out baseline, never divided by a std (``norm_by_std`` does not apply).
"""

ACCOUNTINGS: tuple[str, ...] = get_args(Accounting)
ESTIMATORS: tuple[str, ...] = get_args(Estimator)


@dataclass(frozen=True)
class GroupOutcomeStats:
    """Outcome statistics of each group under one accounting.

    Attributes:
        group_ids: distinct group ids, sorted, [G].
        mean: $μ_g$, float64 [G].
        std: $σ_g$ (unbiased; 0 for single-member groups), float64 [G].
        members: rows (``"row"``) or trajectories (``"trajectory"``) per group, int64 [G].
        zero_spread: all members of the group have the same outcome, bool [G].
        accounting: which accounting produced these.
    """

    group_ids: Tensor
    mean: Tensor
    std: Tensor
    members: Tensor
    zero_spread: Tensor
    accounting: str

    @property
    def degenerate(self) -> Tensor:
        """Groups whose advantage is 0 by convention: a single member or zero spread, bool [G]."""
        return (self.members < 2) | self.zero_spread


def trajectory_outcomes(scores: Tensor, structure: BatchStructure) -> Tensor:
    """R_τ = mean of τ's rows' scores, float64 [T] (equals the stamped outcome when rows agree).

    A trajectory whose rows carry different scores is summed in an order fixed by the values, not in
    row order: float addition is not associative, so rows (0.1, 0.2, 0.3) and (0.3, 0.2, 0.1) summed
    as they come give 0.6000000000000001 and 0.6. In a group whose trajectories tie, that ulp would
    make the spread non-zero and A ≈ 1e-16/ε ≈ 1e-10 instead of 0, and it would depend on row order
    (docs/math.md#invariances). The order is that of the float64 bit patterns (an integer sort,
    cheaper than a float one), so R_τ is bit-identical under any row order where
    ``index_add_`` adds in order (CPU). A batch whose trajectories' rows all carry one score, as in
    ``oma train``, sums in any order to the same bits and is not sorted.
    """
    inverse, n = structure.traj.inverse, structure.n_traj
    values = scores.to(torch.float64)
    # one row's score of each trajectory, per row
    first = values.new_empty(n).scatter_(0, inverse, values).index_select(0, inverse)
    if not torch.equal(values, first):
        # index_add_ adds each trajectory's rows in the order they come, so ordering every row by its
        # bits orders every trajectory's (no grouping by trajectory needed). Rows with equal bits add
        # alike in any order, so the sort need not be stable (a stable one costs 3.5x at 10^4 rows)
        rows = torch.argsort(values.view(torch.int64))
        values, inverse = values.index_select(0, rows), inverse.index_select(0, rows)
    return segment_sum(values, inverse, n) / structure.traj.counts.to(torch.float64)


def _members(scores: Tensor, structure: BatchStructure, accounting: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """(member values, member's group segment, member of each row or None when members are rows)."""
    if accounting == "row":
        return scores.to(torch.float64), structure.row_group, None
    return trajectory_outcomes(scores, structure), structure.traj_group, structure.traj.inverse


def _member_stats(values: Tensor, member_group: Tensor, n_groups: int) -> SegmentStats:
    return segment_mean_std(values, member_group, torch.bincount(member_group, minlength=n_groups))


def _group_relative(
    values: Tensor, member_group: Tensor, stats: SegmentStats, estimator: str, norm_by_std: bool, eps: float
) -> Tensor:
    """Group-relative advantage of each member (float64); 0 in degenerate groups."""
    centred = values - stats.mean.index_select(0, member_group)
    if estimator == "rloo":
        # R − (Σ − R)/(n − 1) = n(R − μ)/(n − 1); degenerate groups are zeroed below.
        n = stats.count.index_select(0, member_group).to(torch.float64)
        adv = centred * n / (n - 1.0).clamp_min(1.0)
    elif norm_by_std:
        adv = centred / (stats.std.index_select(0, member_group) + eps)
    else:
        adv = centred
    degenerate = (stats.count < 2) | stats.zero_spread
    return torch.where(degenerate.index_select(0, member_group), torch.zeros_like(adv), adv)


def _check_scores(scores: Tensor, group_index: Tensor) -> Tensor:
    group_index = check_index("group_index", group_index)
    scores = check_float("scores", scores, (group_index.shape[0],))
    check_same_device(scores=scores, group_index=group_index)
    return scores


def _structure(group_index: Tensor, traj_index: Tensor, structure: BatchStructure | None) -> BatchStructure:
    """``structure`` if the caller passed the batch's own, else :func:`batch_structure` of the ids."""
    if structure is None:
        return batch_structure(group_index, traj_index)
    if not isinstance(structure, BatchStructure):
        raise TypeError(f"structure must be an oma.core.BatchStructure, got {type(structure).__name__}")
    if structure.row_group.shape[0] != group_index.shape[0]:
        raise ValueError(
            f"structure describes {structure.row_group.shape[0]} rows, the batch has {group_index.shape[0]}"
        )
    return structure


def group_outcome_stats(
    scores: Tensor,
    group_index: Tensor,
    traj_index: Tensor,
    *,
    accounting: Accounting = "trajectory",
    structure: BatchStructure | None = None,
) -> GroupOutcomeStats:
    """$μ_g$, $σ_g$ and member counts of every group under ``accounting`` (docs/math.md#outcome-statistics-and-advantages-outcome-alignment).

    * row accounting: $μ_g = Σ_{r∈g} s_r / n_g$ over the $n_g$ rows of $g$, $σ_g$ = std over those rows.
    * trajectory accounting: $μ_g = Σ_{τ∈𝒯_g} R_τ / |𝒯_g|$ over the trajectories $𝒯_g$ of $g$, $σ_g$ = std over them.

    The two coincide when every trajectory of g has the same number of rows (docs/math.md#invariances (4)).
    ``structure``: the batch's :func:`~oma.core.batch_structure`, when the caller already has it.
    """
    check_option("accounting", accounting, ACCOUNTINGS)
    scores = _check_scores(scores, group_index)
    structure = _structure(group_index, traj_index, structure)
    values, member_group, _ = _members(scores, structure, accounting)
    stats = _member_stats(values, member_group, structure.n_groups)
    return GroupOutcomeStats(
        group_ids=structure.group_ids,
        mean=stats.mean,
        std=stats.std,
        members=stats.count,
        zero_spread=stats.zero_spread,
        accounting=accounting,
    )


def outcome_advantages(
    scores: Tensor,
    group_index: Tensor,
    traj_index: Tensor,
    *,
    accounting: Accounting = "trajectory",
    estimator: Estimator = "grpo",
    norm_by_std: bool = True,
    eps: float = 1e-6,
    structure: BatchStructure | None = None,
) -> Tensor:
    r"""Episode-level group-relative advantage of every row, A[R] (docs/math.md#outcome-statistics-and-advantages-outcome-alignment).

    With $μ_g$, $σ_g$ from :func:`group_outcome_stats` under ``accounting``:

    * ``grpo``: $A = (s − μ_g)/(σ_g + ε)$, or $A = s − μ_g$ with ``norm_by_std=False`` (Dr. GRPO).
    * ``rloo``: $A = s −$ the mean of the other members of $g$ (Ahmadian et al. 2024).

    Under ``"row"`` accounting s is the row's own score s_r (exactly what verl computes, member by
    member). Under ``"trajectory"`` accounting (OA) s is the trajectory outcome R_τ = mean of its
    rows' scores, and the one value A_τ is broadcast to every row of τ.

    Special cases (each a test): for groups of ≥2 members ``accounting="row"`` equals
    ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` (and verl's RLOO); when all
    trajectories of a group have the same number of rows the two accountings agree; a group with one
    member or zero spread gets A = 0 (verl instead returns s/(1+ε) for a singleton group).

    Args:
        scores: float [R], the episode outcome stamped on each row (finite).
        group_index: integer [R], group (task instance) of each row.
        traj_index: integer [R], trajectory of each row, unique across the batch; a trajectory
            must lie in exactly one group.
        accounting: ``"row"`` or ``"trajectory"`` (see :data:`Accounting`).
        estimator: ``"grpo"`` or ``"rloo"`` (see :data:`Estimator`).
        norm_by_std: divide by σ_g + ε (``grpo`` only).
        eps: ε in the denominator.
        structure: the batch's :func:`~oma.core.batch_structure`, when the caller already has it
            (several calls on one batch then sort its ids once).

    Returns:
        A, shape [R], dtype of ``scores`` (computed in float64).

    Reference: Zhang et al., Outcome-Mass Alignment, [arXiv 2611.16816](https://arxiv.org/abs/2611.16816).
    """
    check_option("accounting", accounting, ACCOUNTINGS)
    check_option("estimator", estimator, ESTIMATORS)
    check_positive("eps", eps, allow_zero=True)
    scores = _check_scores(scores, group_index)
    structure = _structure(group_index, traj_index, structure)
    return _episode_advantages(scores, structure, accounting, estimator, norm_by_std, eps).to(scores.dtype)


def _episode_advantages(
    scores: Tensor, structure: BatchStructure, accounting: str, estimator: str, norm_by_std: bool, eps: float
) -> Tensor:
    """Row advantages (float64 [R]) of validated inputs; the body of :func:`outcome_advantages`."""
    values, member_group, to_rows = _members(scores, structure, accounting)
    stats = _member_stats(values, member_group, structure.n_groups)
    adv = _group_relative(values, member_group, stats, estimator, norm_by_std, eps)
    return adv if to_rows is None else adv.index_select(0, to_rows)


def discounted_returns(step_rewards: Tensor, traj_index: Tensor, step_index: Tensor, *, gamma: float = 0.95) -> Tensor:
    r"""Per-row discounted return within its trajectory, $G_{τ,k} = Σ_{j≥k} γ^{j−k} r_{τ,j}$.

    Steps are ordered by ``step_index`` inside each trajectory (ids need not be contiguous: a
    trajectory with steps {0, 2, 5} is the sequence of those three rows). A repeated
    (traj_index, step_index) pair is ambiguous and raises.

    Vectorised as a pointer-jumping scan over the linear recurrence $G_k = r_k + γ G_{k+1}$:
    ⌈log2 K_max⌉ rounds of O(R) gathers, no loop over rows or trajectories, exact in float64.

    Returns: float64 [R] in the original row order.
    """
    traj_index = check_index("traj_index", traj_index)
    rows = traj_index.shape[0]
    step_index = check_index("step_index", step_index, rows)
    step_rewards = check_float("step_rewards", step_rewards, (rows,))
    check_same_device(step_rewards=step_rewards, traj_index=traj_index, step_index=step_index)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if rows == 0:
        return torch.zeros(0, dtype=torch.float64, device=step_rewards.device)
    traj = segments(traj_index)
    order = torch.argsort(step_index, stable=True)
    order = order.index_select(0, torch.argsort(traj.inverse.index_select(0, order), stable=True))
    t_sorted, s_sorted = traj.inverse.index_select(0, order), step_index.index_select(0, order)
    same_traj = t_sorted[1:] == t_sorted[:-1]
    dup = same_traj & (s_sorted[1:] == s_sorted[:-1])
    if bool(dup.any()):
        k = int(dup.nonzero()[0, 0])
        raise ValueError(
            f"duplicated row: traj_index {int(traj_index[order[k]])} has step_index {int(s_sorted[k])} twice"
        )
    # State per sorted row i: G_i = a_i + b_i · G_{p_i}; row `rows` is a sentinel with G = 0.
    device = step_rewards.device
    sentinel = torch.zeros(1, dtype=torch.float64, device=device)
    a = torch.cat([step_rewards.index_select(0, order).to(torch.float64), sentinel])
    has_next = torch.cat([same_traj, torch.zeros(2, dtype=torch.bool, device=device)])  # [rows + 1]
    p = torch.where(has_next, torch.arange(1, rows + 2, device=device), torch.full_like(has_next, rows, dtype=torch.int64))
    b = has_next.to(torch.float64) * float(gamma)
    longest = int(traj.counts.max())
    for _ in range(max(0, (longest - 1).bit_length())):
        a = a + b * a.index_select(0, p)
        b = b * b.index_select(0, p)
        p = p.index_select(0, p)
    out = torch.empty(rows, dtype=torch.float64, device=device)
    out[order] = a[:-1]
    return out


def gigpo_advantages(
    scores: Tensor,
    step_rewards: Tensor,
    anchor: Tensor,
    group_index: Tensor,
    traj_index: Tensor,
    step_index: Tensor,
    *,
    accounting: Accounting = "trajectory",
    norm_by_std: bool = True,
    gamma: float = 0.95,
    step_advantage_w: float = 1.0,
    eps: float = 1e-6,
    structure: BatchStructure | None = None,
) -> Tensor:
    r"""GiGPO advantage $A_r = A^E_τ + ω A^S_r$ (Feng et al. 2025, arXiv 2505.10978; docs/math.md#outcome-statistics-and-advantages-outcome-alignment).

    * $A^E_τ$: the episode term, :func:`outcome_advantages` with ``estimator="grpo"``; Outcome
      Alignment applies here through ``accounting``.
    * $A^S_r$: the step term, left native. Rows of group g that acted in the same environment state
      (same ``anchor``) form an anchor group; with $G_r$ the discounted return of row $r$ inside its
      trajectory (:func:`discounted_returns`), $A^S_r = (G_r − \text{mean})/(\text{std} + ε)$ over the anchor group,
      or $G_r −$ mean with ``norm_by_std=False``. Single-member or zero-spread anchor groups give 0.

    Special cases: ``step_advantage_w=0`` gives exactly the ``grpo`` episode advantage; with one
    step per trajectory every anchor group holds rows of distinct trajectories of one group.

    Args:
        scores: float [R], episode outcome on each row.
        step_rewards: float [R], the row's own step reward $r_{τ,k}$.
        anchor: integer [R], id of the state the row acted in (see :func:`oma.core.anchor_ids`).
        group_index: as in :func:`outcome_advantages`.
        traj_index: as in :func:`outcome_advantages`.
        step_index: integer [R], the row's step number inside its trajectory.
        gamma: discount γ in [0, 1] of the step return.
        step_advantage_w: ω ≥ 0, weight of the step term.
        structure: the batch's :func:`~oma.core.batch_structure`, when the caller already has it.

    Returns: A, shape [R], dtype of ``scores``.
    """
    check_option("accounting", accounting, ACCOUNTINGS)
    check_positive("eps", eps, allow_zero=True)
    check_positive("step_advantage_w", step_advantage_w, allow_zero=True)
    scores = _check_scores(scores, group_index)
    anchor = check_index("anchor", anchor, scores.shape[0])
    check_same_device(scores=scores, anchor=anchor)
    structure = _structure(group_index, traj_index, structure)
    episode = _episode_advantages(scores, structure, accounting, "grpo", norm_by_std, eps)
    returns = discounted_returns(step_rewards, traj_index, step_index, gamma=gamma)
    # Anchor group = (group, anchor): combine two dense segment numbers into one int64 key.
    anchor_seg = segments(anchor)
    key = structure.row_group * anchor_seg.n + anchor_seg.inverse
    anchor_groups = segments(key)
    stats = segment_mean_std(returns, anchor_groups.inverse, anchor_groups.counts)
    step = _group_relative(returns, anchor_groups.inverse, stats, "grpo", norm_by_std, eps)
    return (episode + step_advantage_w * step).to(scores.dtype)
