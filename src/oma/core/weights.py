r"""Reducers as per-token weights, implicit trajectory mass, and Mass Alignment (MA). docs/math.md#mass-alignment.

Every reducer that turns ℓ[R, L] into a scalar is linear in ℓ, so it *is* a weight tensor:
$\text{loss} = Σ_{r,l} W_{r,l}\, ℓ_{r,l}$. Writing it that way makes each trajectory's share of the objective
visible (:func:`implicit_mass`) and makes exact micro-batching trivial: W is computed once on the
mini-batch, and any split of its rows sums to the same loss and gradient.

Mass Alignment keeps the native reducer *inside* each trajectory, $J_τ$ = the reducer on $τ$'s rows alone,
and sets $\text{loss} = Σ_τ w_τ J_τ$ with an explicit mass target $w_τ$.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from oma.core.validate import check_float, check_mask, check_option, check_positive, check_same_device
from oma.core.segments import BatchStructure, batch_structure, segment_sum

Reducer = Literal["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
r"""Native loss aggregation, named and computed as verl's ``agg_loss(loss_agg_mode=...)`` (single process).

With $m$ the mask, $n_r = Σ_l m_{r,l}$ the row's valid tokens, $M_B = Σ_r n_r$, $R'$ the rows with $n_r > 0$:

* ``"token-mean"``: $Σ mℓ / M_B$ (DAPO, arXiv 2503.14476). Implicit mass of $τ$: $M_τ/M_B$, ∝ tokens —
  long trajectories dominate.
* ``"token-sum"``: $Σ mℓ$. Mass ∝ tokens, and the scale grows with the batch.
* ``"seq-mean-token-mean"``: $(1/R') Σ_r Σ_l mℓ/n_r$ (original GRPO, arXiv 2402.03300). Mass $K_τ/R'$,
  ∝ rows; inside a row, short responses' tokens weigh more (the length bias Dr. GRPO names).
* ``"seq-mean-token-sum"``: $(1/R') Σ_r Σ_l mℓ$. Mass ∝ tokens.
* ``"seq-mean-token-sum-norm"``: $(1/R') Σ_r Σ_l mℓ / L_\text{norm}$ (Dr. GRPO, arXiv 2503.20783), $L_\text{norm}$ the
  padded length L unless ``loss_scale_factor`` fixes it. Mass ∝ tokens. With the default $L_\text{norm}$
  the loss depends on padding (as in verl); pass a constant to make it padding-invariant.
"""

Mass = Literal["native", "uniform", "group"]
r"""Trajectory mass target $w_τ$ of Mass Alignment (over trajectories with ≥1 trainable token).

* ``"native"``: no alignment: the reducer over the whole batch, with its implicit mass
  (∝ tokens or rows, so trajectories that expand more weigh more: the bias OMA removes).
* ``"uniform"``: $w_τ = 1/T$, every trajectory the same mass (OMA default).
* ``"group"``: $w_τ = 1/(G\,|𝒯_g|)$, every group the same mass, split equally among its
  trajectories; differs from uniform only when groups differ in size (e.g. after filtering).
"""

REDUCERS: tuple[str, ...] = get_args(Reducer)
MASSES: tuple[str, ...] = get_args(Mass)


def _row_unit(reducer: str, n_tokens: Tensor, length: int, loss_scale_factor: float | None) -> Tensor:
    """Within-row factor u_r of the reducer (row r's tokens get u_r / D_scope), float64 [R]."""
    if reducer == "seq-mean-token-mean":
        return torch.where(n_tokens > 0, 1.0 / n_tokens.clamp_min(1.0), torch.zeros_like(n_tokens))
    if reducer == "seq-mean-token-sum-norm":
        return torch.full_like(n_tokens, 1.0 / float(length if loss_scale_factor is None else loss_scale_factor))
    return torch.ones_like(n_tokens)


def _scope_counts(reducer: str, n_tokens: Tensor) -> Tensor | None:
    """Each row's count toward the reducer's normaliser D (tokens or rows); None for token-sum (D = 1)."""
    if reducer == "token-mean":
        return n_tokens
    if reducer == "token-sum":
        return None
    return (n_tokens > 0).to(torch.float64)  # seq-mean-*: R' = rows with a trainable token


def _mass_targets(mass: str, structure: BatchStructure, active_traj: Tensor) -> Tensor:
    """w_τ per trajectory, float64 [T]; zero for trajectories with no trainable token."""
    active = active_traj.to(torch.float64)
    if mass == "uniform":
        return active / active.sum().clamp_min(1.0)
    per_group = torch.zeros(structure.n_groups, dtype=torch.float64, device=active.device)
    per_group.index_add_(0, structure.traj_group, active)
    n_active_groups = (per_group > 0).sum().clamp_min(1).to(torch.float64)
    return active / (n_active_groups * per_group[structure.traj_group].clamp_min(1.0))


def _validate(response_mask: Tensor, group_index: Tensor, traj_index: Tensor, reducer: str, mass: str,
              loss_scale_factor: float | None) -> BatchStructure:
    check_option("reducer", reducer, REDUCERS)
    check_option("mass", mass, MASSES)
    response_mask = check_mask("response_mask", response_mask)
    structure = batch_structure(group_index, traj_index)
    if structure.traj.inverse.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"response_mask has {response_mask.shape[0]} rows but group_index/traj_index have "
            f"{structure.traj.inverse.shape[0]}"
        )
    check_same_device(response_mask=response_mask, traj_index=traj_index)
    if loss_scale_factor is not None:  # or None: the padded length
        check_positive("loss_scale_factor", loss_scale_factor)
    return structure


def token_weights(
    response_mask: Tensor,
    group_index: Tensor,
    traj_index: Tensor,
    *,
    reducer: Reducer = "token-mean",
    mass: Mass = "uniform",
    loss_scale_factor: float | None = None,
) -> Tensor:
    r"""Per-token weights W[R, L] with $\text{loss} = Σ Wℓ$ (float64). docs/math.md#mass-alignment.

    Each reducer is $u_r m_{r,l} / D$: $u_r$ the within-row factor ($1/n_r$ for seq-mean-token-mean,
    $1/L_\text{norm}$ for seq-mean-token-sum-norm, else 1), $D$ the reducer's normaliser ($M$ tokens for
    token-mean, $R'$ rows for seq-mean-*, 1 for token-sum).

    * ``mass="native"``: $D$ over the whole batch: $W = u_r m / D_B$, exactly verl's ``agg_loss``.
    * aligned (``"uniform"``/``"group"``): $D$ over $τ$ alone, scaled by the target,
      $W = w_τ u_r m / D_τ$, so $\text{loss} = Σ_τ w_τ J_τ$ with $J_τ$ the native reducer on $τ$'s rows.

    Special cases: with equal rows and tokens per trajectory, aligned = native for the mean
    reducers (docs/math.md#invariances (4)). Rows with no trainable token get weight 0 and never a division by
    zero; trajectories with no trainable token get no mass (targets are over the others).

    Invariant to row order (W permutes with the rows), to padding columns (except
    ``seq-mean-token-sum-norm`` without ``loss_scale_factor``, whose L_norm *is* the padding), and
    exact under any micro-batch split of the rows: compute W on the mini-batch, then
    Σ_micro weighted_loss(ℓ[idx], W[idx]) = weighted_loss(ℓ, W).

    Args:
        response_mask: bool [R, L], True = trainable token.
        group_index: integer [R] ids (see :func:`oma.core.outcome_advantages`).
        traj_index: integer [R] ids (see :func:`oma.core.outcome_advantages`).
        reducer: see :data:`Reducer`.
        mass: see :data:`Mass`.
        loss_scale_factor: L_norm of ``seq-mean-token-sum-norm``; None = padded length L (verl).

    Reference: Zhang et al., Outcome-Mass Alignment, [arXiv 2611.16816](https://arxiv.org/abs/2611.16816).
    """
    structure = _validate(response_mask, group_index, traj_index, reducer, mass, loss_scale_factor)
    m = response_mask.to(torch.float64)
    coef = row_coefficients(m.sum(-1), structure, reducer=reducer, mass=mass, length=response_mask.shape[1],
                            loss_scale_factor=loss_scale_factor)
    return m * coef.unsqueeze(-1)


def row_coefficients(
    n_tokens: Tensor,
    structure: BatchStructure,
    *,
    reducer: Reducer = "token-mean",
    mass: Mass = "uniform",
    length: int,
    loss_scale_factor: float | None = None,
) -> Tensor:
    r"""The weight $c_r$ every trainable token of row $r$ gets: $W_{r,l} = m_{r,l}\, c_r$, float64 [R].

    Every reducer weighs a row's tokens alike and sees the mask only through n_r (and, for
    ``seq-mean-token-sum-norm``, the padded length L), so the weights follow from token counts
    alone — what :func:`token_weights` builds W from, and what lets an audit of 10^6 rows work
    without materialising W[R, L] (row r's total weight is n_r·c_r).

    Args:
        n_tokens: n_r, trainable tokens per row (≥ 0), [R].
        structure: :func:`oma.core.segments.batch_structure` of the batch's ids.
        reducer: as in :func:`token_weights`.
        mass: as in :func:`token_weights`.
        loss_scale_factor: as in :func:`token_weights`.
        length: the padded response length L.
    """
    check_option("reducer", reducer, REDUCERS)
    check_option("mass", mass, MASSES)
    n = n_tokens.to(torch.float64)
    unit = _row_unit(reducer, n, length, loss_scale_factor)
    counts = _scope_counts(reducer, n)
    if mass == "native":
        coef = unit if counts is None else unit / counts.sum().clamp_min(1.0)
    else:
        tinv = structure.traj.inverse
        active_traj = segment_sum(n, tinv, structure.n_traj) > 0
        per_traj = _mass_targets(mass, structure, active_traj)
        if counts is not None:
            per_traj = per_traj / segment_sum(counts, tinv, structure.n_traj).clamp_min(1.0)
        coef = unit * per_traj[tinv]
    # Rows without a trainable token contribute to no normaliser (verl's seq_mask excludes them).
    return torch.where(n > 0, coef, torch.zeros_like(coef))


def weighted_loss(token_loss: Tensor, weights: Tensor) -> Tensor:
    r"""The scalar loss $Σ_{r,l} W_{r,l}\, ℓ_{r,l}$ — the one place oma makes a scalar.

    Accumulates in float64 and returns the dtype of ``token_loss``. Positions with W = 0
    (padding, masked tokens) are skipped, so NaN/inf there never reaches the loss or gradient.
    Linear in its rows: summing it over any split of the rows gives the whole (exact micro-batching).
    """
    weights = check_float("weights", weights)
    token_loss = check_float("token_loss", token_loss, tuple(weights.shape), finite=False)
    check_same_device(token_loss=token_loss, weights=weights)
    live = weights != 0
    contrib = torch.where(live, weights * token_loss.to(torch.float64), torch.zeros((), dtype=torch.float64, device=weights.device))
    if not bool(torch.isfinite(contrib).all()):
        raise ValueError("token_loss is NaN or inf at a token with non-zero weight")
    return contrib.sum().to(token_loss.dtype)


def implicit_mass(
    response_mask: Tensor,
    group_index: Tensor,
    traj_index: Tensor,
    *,
    reducer: Reducer = "token-mean",
    mass: Mass = "native",
    loss_scale_factor: float | None = None,
) -> Tensor:
    r"""Each trajectory's share of the objective when every token's ℓ is 1: $m_τ = Σ_{(r,l)∈τ} W_{r,l} / Σ W$.

    float64 [T] in the trajectory order of ``torch.unique(traj_index)``; sums to 1 (all zeros if
    the batch has no trainable token). Under ``"native"`` this is the hidden weighting rule of
    stepwise training: $M_τ/M_B$ for token-mean, $K_τ/R'$ for seq-mean-token-mean. Under Mass
    Alignment with a mean reducer it equals the target $w_τ$; with a sum reducer it is
    $w_τ J_τ(1)/Σ_{τ'} w_{τ'} J_{τ'}(1)$, $J_τ(1)$ being the sum reducer's own within-trajectory scale (τ's tokens per row for
    ``seq-mean-token-sum``, its total tokens for ``token-sum``).
    """
    structure = _validate(response_mask, group_index, traj_index, reducer, mass, loss_scale_factor)
    n_tokens = response_mask.sum(-1)
    row_weight = n_tokens.to(torch.float64) * row_coefficients(
        n_tokens, structure, reducer=reducer, mass=mass, length=response_mask.shape[1], loss_scale_factor=loss_scale_factor
    )
    per_traj = segment_sum(row_weight, structure.traj.inverse, structure.n_traj)
    total = per_traj.sum()
    return per_traj / total if bool(total > 0) else per_traj
