r"""The implicit-weighting audit of a stepwise rollout batch (docs/audit.md).

Given one batch (rows = agent steps, grouped into trajectories and groups), :func:`audit` reports
how much each outcome, length and group weighs in the update under the four accountings

    row+native, row+aligned, trajectory+native, trajectory+aligned

(outcome statistics over rows or over unique trajectories × the reducer's native mass or Mass
Alignment), for one native reducer. All the math comes from :mod:`oma.core` (advantages, group
statistics, trajectory outcomes, reducer weights); this module only sums it up per outcome class,
per length class and per group, vectorised (no Python loop over rows, trajectories or groups).

Notation (per accounting a = outcome accounting + mass rule):

* ω^a_r — row r's share of the objective when every token's ℓ is 1: Σ_l W[r, l] / Σ W, with W
  the per-token weights of ``oma.core.token_weights`` (sums to 1 over the batch);
  m^a_τ = Σ_{r∈τ} ω^a_r is ``oma.core.implicit_mass``.
* A^a_r — the row's advantage (``oma.core.outcome_advantages`` / ``gigpo_advantages``).
* c^a_{r,l} = W^a[r, l]·A^a_r / Σ W — the per-token coefficient of the policy gradient at ρ = 1
  (the loss is −Σ c·log π there). Its sum over a group is the *net signed push* of that group.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import Tensor

from oma.core import (
    ESTIMATORS,
    MASSES,
    REDUCERS,
    BatchStructure,
    GroupOutcomeStats,
    batch_structure,
    gigpo_advantages,
    group_outcome_stats,
    outcome_advantages,
    row_coefficients,
    segment_sum,
    trajectory_outcomes,
)
from oma.core.validate import check_option, check_positive
from oma.diagnostics.figures import (
    ACCOUNTING_NAMES,
    BASELINE,
    LONGEST_FRACTION,
    AccountingFigures,
    AuditReport,
    DirectionSplit,
    DumpInfo,
    PaddingCopies,
)

LARGEST_VALUE = 1e150
"""Largest |score| and |step reward| audited: the group std sums squared deviations, which overflow float64
beyond about 1e154 and would turn every advantage into 0 or NaN without a word."""

__all__ = ["ACCOUNTING_NAMES", "AccountingFigures", "AuditReport", "DirectionSplit", "audit"]


def audit(
    scores,
    group_index,
    traj_index,
    *,
    response_tokens=None,
    response_mask=None,
    step_index=None,
    anchor=None,
    step_rewards=None,
    won=None,
    reducer: str = "token-mean",
    aligned_mass: str = "uniform",
    estimator: str = "grpo",
    norm_by_std: bool = True,
    eps: float = 1e-6,
    gamma: float = 0.95,
    step_advantage_w: float = 1.0,
    success_threshold: float | None = None,
    success_rule: str | None = None,
    response_length: int | None = None,
    loss_scale_factor: float | None = None,
    padding_copy=None,
    dump: DumpInfo | None = None,
    group_labels: np.ndarray | None = None,
    traj_labels: np.ndarray | None = None,
    source: str | None = None,
) -> AuditReport:
    r"""Audit the implicit trajectory weighting of one stepwise batch (docs/audit.md).

    Args:
        scores: float [R], the episode outcome stamped on each row (R_τ = mean over τ's rows).
        group_index, traj_index: integer [R] ids (any values; a trajectory lies in one group).
        response_tokens: int [R], trainable tokens per row — or ``response_mask`` bool [R, L].
        step_index: integer [R], optional: enables the duplicated-row count (and GiGPO's order;
            without it GiGPO uses the row order inside each trajectory).
        anchor, step_rewards: integer / float [R]; required by ``estimator="gigpo"``.
        won: bool [R], optional; when given it decides success (one value per trajectory).
        reducer: the native reducer (``oma.core.REDUCERS``).
        aligned_mass: Mass Alignment target of the ``*+aligned`` accountings (``uniform``/``group``).
        estimator: ``grpo``, ``rloo`` or ``gigpo``; norm_by_std, eps, gamma, step_advantage_w as
            in oma.core.
        success_threshold: without ``won``: success iff R_τ ≥ threshold; default: R_τ > 0.
        success_rule: how ``won`` was decided, for the report (default ``"won column"``).
        response_length: padded length L (only ``seq-mean-token-sum-norm`` uses it; it cancels in
            every share); default: the mask's width or the largest count.
        padding_copy: bool [R], optional: rows that are padding copies of other rows (verl-agent's
            ``adjust_batch``); they stay in every figure and their mass is reported.
        dump: the input's :class:`DumpInfo` (format, invalid-action penalty), for the report.
        group_labels, traj_labels: original id of each id value (when ids are codes), for display.
        source: where the batch came from, for the report.

    Returns: an :class:`AuditReport`.
    """
    check_option("reducer", reducer, REDUCERS)
    check_option("aligned_mass", aligned_mass, tuple(m for m in MASSES if m != "native"))
    check_option("estimator", estimator, (*ESTIMATORS, "gigpo"))
    _check_finite(eps=eps, gamma=gamma, step_advantage_w=step_advantage_w, success_threshold=success_threshold)
    check_positive("eps", eps, allow_zero=True)
    s, g, t, n_tok, length = _inputs(scores, group_index, traj_index, response_tokens, response_mask, response_length)
    _check_magnitude("scores", s)
    rows = int(s.shape[0])
    structure = batch_structure(g, t)  # once for every oma.core call below
    T, G = structure.n_traj, structure.n_groups
    tinv, tgroup = structure.traj.inverse, structure.traj_group

    # ---- trajectories: length, tokens, outcome, success ------------------------------------
    stats = {acc: group_outcome_stats(s, g, t, accounting=acc, structure=structure) for acc in ("row", "trajectory")}
    K = structure.traj.counts.to(torch.float64)
    M = segment_sum(n_tok, tinv, T)
    R_tau = trajectory_outcomes(s, structure)
    if won is not None:
        success = _won_per_traj(_tensor("won", won), structure, traj_labels)
        rule = success_rule or "won column"
    elif success_threshold is not None:
        success, rule = R_tau >= float(success_threshold), f"score >= {success_threshold:g}"
    else:
        success, rule = R_tau > 0, "score > 0"
    duplicated = _duplicated_rows(step_index, structure, rows, traj_labels, must_be_unique=estimator == "gigpo")

    # ---- masses, advantages and figures per accounting (oma.core) ---------------------------
    omega = {
        key: _row_shares(n_tok, structure, reducer, rule_, length, loss_scale_factor)
        for key, rule_ in (("native", "native"), ("aligned", aligned_mass))
    }
    longest = _longest(K, M, T)
    inv_n = torch.where(n_tok > 0, 1.0 / n_tok.clamp_min(1.0), torch.zeros_like(n_tok))
    figures: dict[str, AccountingFigures] = {}
    group_mass: dict[str, Tensor] = {}
    split: dict[str, DirectionSplit] = {}
    # One accounting's advantages and pushes at a time, and only the baseline's push kept for the direction
    # split: at 10^7 rows each [R] float64 is 80 MB.
    for acc in ("row", "trajectory"):
        if estimator == "gigpo":
            a = _gigpo(s, g, t, step_index, anchor, step_rewards, structure, acc, norm_by_std, gamma,
                       step_advantage_w, eps)
        else:
            a = outcome_advantages(s, g, t, accounting=acc, estimator=estimator, norm_by_std=norm_by_std, eps=eps,
                                   structure=structure)
        for rule_ in ("native", "aligned"):
            name = f"{acc}+{rule_}"
            figures[name], q, group_mass[rule_] = _accounting_figures(
                name, omega[rule_], a, stats[acc], structure, success, longest, K,
                "native" if rule_ == "native" else aligned_mass,
            )
            if name == BASELINE:
                base = q
            else:
                split[name] = _direction_split(base, q, inv_n, structure.row_group, G, BASELINE, name)
        del a, q
    copies = None
    if padding_copy is not None:
        copy = _tensor("padding_copy", padding_copy, torch.bool)
        if copy.shape[0] != rows:
            raise ValueError(f"padding_copy has {copy.shape[0]} rows, scores has {rows}")
        copies = PaddingCopies(
            rows=int(copy.sum()),
            trajectories=int(torch.unique(tinv[copy]).numel()),
            mass={name: float(omega[name.split("+")[1]][copy].sum()) for name in ACCOUNTING_NAMES},
        )

    # ---- the report ----------------------------------------------------------------------------
    fail = ~success
    mu_row, mu_traj = stats["row"].mean, stats["trajectory"].mean
    shift = mu_row - mu_traj
    rows_s, rows_f = _mean_where(K, success), _mean_where(K, fail)
    tok_s, tok_f = _mean_where(M, success), _mean_where(M, fail)
    gid = structure.group_ids.numpy()
    tid = structure.traj.ids.numpy()
    return AuditReport(
        source=source,
        rows=rows,
        trajectories=T,
        groups=G,
        reducer=reducer,
        aligned_mass=aligned_mass,
        estimator=estimator,
        norm_by_std=bool(norm_by_std),
        eps=float(eps),
        success_rule=rule,
        successes=int(success.sum()),
        failures=int(fail.sum()),
        rows_per_traj_mean=rows / T,
        rows_per_traj_success_mean=rows_s,
        rows_per_traj_failure_mean=rows_f,
        tokens_per_traj_mean=float(M.mean()),
        tokens_per_traj_success_mean=tok_s,
        tokens_per_traj_failure_mean=tok_f,
        expansion_ratio_fail_over_success=_ratio(rows_f, rows_s),
        token_ratio_fail_over_success=_ratio(tok_f, tok_s),
        coupling_rows_outcome=_within_group_corr(K, R_tau, tgroup, G),
        coupling_tokens_outcome=_within_group_corr(M, R_tau, tgroup, G),
        mu_row=mu_row.numpy(),
        mu_traj=mu_traj.numpy(),
        mu_row_minus_mu_traj_mean=float(shift.mean()),
        mu_row_minus_mu_traj_abs_mean=float(shift.abs().mean()),
        mu_row_minus_mu_traj_min=float(shift.min()),
        mu_row_minus_mu_traj_max=float(shift.max()),
        singleton_groups={acc: int((stats[acc].members < 2).sum()) for acc in ("row", "trajectory")},
        zero_spread_groups={
            acc: int((stats[acc].zero_spread & (stats[acc].members >= 2)).sum()) for acc in ("row", "trajectory")
        },
        duplicated_rows=duplicated,
        accountings=figures,
        group_mass_native=group_mass["native"].numpy(),
        group_mass_aligned=group_mass["aligned"].numpy(),
        group_mass_shift_tv=0.5 * float((group_mass["native"] - group_mass["aligned"]).abs().sum()),
        direction_split=split,
        traj_rows=structure.traj.counts.numpy(),
        traj_tokens=M.numpy(),
        traj_outcome=R_tau.numpy(),
        traj_success=success.numpy(),
        traj_group=tgroup.numpy(),
        traj_labels=traj_labels[tid] if traj_labels is not None else tid,
        group_labels=group_labels[gid] if group_labels is not None else gid,
        group_trajectories=structure.trajectories_per_group().numpy(),
        dump=dump or DumpInfo(),
        padding_copies=copies,
    )


# ------------------------------------------------------------------------------------------------
# phases of audit()


def _inputs(scores, group_index, traj_index, response_tokens, response_mask, response_length):
    """Validated tensors: scores float64, ids, trainable tokens per row float64 [R], padded length L."""
    if (response_tokens is None) == (response_mask is None):
        raise ValueError("pass exactly one of response_tokens (count per row) and response_mask (bool [R, L])")
    s = _tensor("scores", scores, torch.float64)
    g = _tensor("group_index", group_index)
    t = _tensor("traj_index", traj_index)
    rows = int(s.shape[0])
    if rows == 0:
        raise ValueError("the batch has no rows")
    if response_mask is not None:
        mask = response_mask if isinstance(response_mask, Tensor) else torch.as_tensor(np.asarray(response_mask))
        if mask.dtype != torch.bool or mask.dim() != 2:
            raise ValueError(f"response_mask must be bool [R, L], got {mask.dtype} {tuple(mask.shape)}")
        n_tok = mask.sum(-1).to(torch.float64)
        length = int(mask.shape[1]) if response_length is None else int(response_length)
    else:
        n_tok = _tensor("response_tokens", response_tokens, torch.float64)
        if bool((n_tok < 0).any()):
            raise ValueError("response_tokens must be ≥ 0")
        length = int(n_tok.max()) if response_length is None else int(response_length)
    if n_tok.shape[0] != rows:
        raise ValueError(f"response tokens/mask have {n_tok.shape[0]} rows, scores has {rows}")
    if not bool((n_tok > 0).any()):
        raise ValueError("no row has a trainable token")
    return s, g, t, n_tok, max(length, 1)


def _row_shares(n_tok: Tensor, structure: BatchStructure, reducer: str, mass: str, length: int, lsf) -> Tensor:
    """ω_r: each row's share of the objective under ``reducer`` and ``mass`` (oma.core's weights), Σ = 1."""
    w = n_tok * row_coefficients(n_tok, structure, reducer=reducer, mass=mass, length=length, loss_scale_factor=lsf)
    return w / w.sum()


def _longest(K: Tensor, M: Tensor, T: int) -> Tensor:
    """The longest 10% of trajectories: most rows, ties by more tokens, then batch (id) order, bool [T]."""
    n_long = max(1, math.ceil(LONGEST_FRACTION * T))
    order = np.lexsort((np.arange(T), -M.numpy(), -K.numpy()))
    longest = torch.zeros(T, dtype=torch.bool)
    longest[torch.as_tensor(order[:n_long])] = True
    return longest


def _accounting_figures(
    name: str,
    om: Tensor,
    a: Tensor,
    stats: GroupOutcomeStats,
    structure: BatchStructure,
    success: Tensor,
    longest: Tensor,
    K: Tensor,
    mass_rule: str,
) -> tuple[AccountingFigures, Tensor, Tensor]:
    """One accounting's figures, its per-row push q = ω·A and its group masses."""
    T, G = structure.n_traj, structure.n_groups
    tinv, tgroup = structure.traj.inverse, structure.traj_group
    q = om * a  # row's push Σ_l c[r, l]
    m = segment_sum(om, tinv, T)
    p = segment_sum(q, tinv, T)
    P = segment_sum(p, tgroup, G)
    # float noise: a group's push within 1e-9 of its absolute push Σ|ω·A| is exactly 0
    scale = segment_sum(q.abs(), structure.row_group, G)
    P = torch.where(P.abs() <= 1e-9 * scale, torch.zeros_like(P), P)
    abar = segment_sum(a, tinv, T) / K
    p2 = float((p * p).sum())
    kish = float(m.sum() ** 2 / (m * m).sum())
    fig = AccountingFigures(
        name=name,
        accounting=name.split("+")[0],
        mass_rule=mass_rule,
        mass=m.numpy(),
        mass_share_success=float(m[success].sum()),
        mass_share_failure=float(m[~success].sum()),
        mass_share_longest10=float(m[longest].sum()),
        kish_ess=kish,
        kish_ess_fraction=kish / T,
        push_ess_fraction=(float(p.abs().sum()) ** 2 / p2 / T) if p2 > 0 else math.nan,
        advantage_success_mean=_mean_where(abar, success),
        advantage_failure_mean=_mean_where(abar, ~success),
        traj_push=p.numpy(),
        net_push_per_group=P.numpy(),
        net_push=float(P.sum()),
        groups_pushed_up=int((P > 0).sum()),
        groups_pushed_down=int((P < 0).sum()),
        degenerate_mass_share=float(m[stats.degenerate[tgroup]].sum()),
    )
    return fig, q, segment_sum(m, tgroup, G)


def _duplicated_rows(step_index, structure: BatchStructure, rows: int, traj_labels, must_be_unique: bool) -> int | None:
    """Rows repeating an earlier row's (trajectory, step); None without steps. GiGPO's step returns
    need a unique step per row, so there a repeat is an error naming the trajectory."""
    if step_index is None:
        return None
    st = np.array(step_index, dtype=np.int64)
    if st.shape != (rows,):
        raise ValueError(f"step_index must have shape ({rows},), got {st.shape}")
    lo, span = int(st.min()), int(st.max()) - int(st.min()) + 1
    if structure.n_traj * span >= 2**63:  # the (trajectory, step) key would overflow int64: number the steps by rank
        ranks = np.unique(st, return_inverse=True)[1]
        lo, span = 0, int(ranks.max()) + 1
    else:
        ranks = st
    key = structure.traj.inverse.numpy() * span + (ranks - lo)
    order = np.argsort(key, kind="stable")  # numpy's sort: ~10x torch's on CPU
    repeat = key[order][1:] == key[order][:-1]
    n = int(repeat.sum())
    if n and must_be_unique:
        r = int(order[1:][repeat][0])
        tau = int(structure.traj.inverse[r])
        tid = _traj_label(structure, tau, traj_labels)
        raise ValueError(
            f"trajectory {tid!r} has step {int(st[r])} twice ({n} rows repeat a (traj_id, step) pair): GiGPO's step "
            "returns need one row per step; padding copies (verl-agent's adjust_batch)? read the dump with "
            "--from verl-agent, which takes verl-agent's own step_rewards and needs no step column"
        )
    return n


def _traj_label(structure: BatchStructure, tau: int, traj_labels) -> object:
    tid = int(structure.traj.ids[tau])
    label = traj_labels[tid] if traj_labels is not None else tid
    return label.item() if isinstance(label, np.generic) else label


# ------------------------------------------------------------------------------------------------
# helpers


def _check_magnitude(name: str, values: Tensor) -> None:
    big = values.abs() > LARGEST_VALUE
    if bool(big.any()):
        r = int(big.nonzero()[0, 0])
        raise ValueError(
            f"{name} reach {float(values[r]):g} (row {r}, 0-based); beyond ±{LARGEST_VALUE:g} the group statistics "
            "overflow float64: rescale them"
        )


def _check_finite(**settings: float | None) -> None:
    """NaN or inf in a setting makes every figure that reads it n/a or 0 without a word."""
    for name, value in settings.items():
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


def _tensor(name: str, x, dtype: torch.dtype | None = None) -> Tensor:
    if isinstance(x, Tensor):
        t = x
    else:
        a = np.ascontiguousarray(x)
        # shared, not copied, even when read-only (a view of Arrow's memory): the audit never writes into its inputs
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            t = torch.from_numpy(a) if a.dtype.kind in "biuf" else torch.as_tensor(a)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D [R], got shape {tuple(t.shape)}")
    return t if dtype is None else t.to(dtype)


def _mean_where(values: Tensor, mask: Tensor) -> float:
    n = int(mask.sum())
    return float(values[mask].to(torch.float64).sum() / n) if n else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if (b != 0 and math.isfinite(a) and math.isfinite(b)) else math.nan


def _within_group_corr(x: Tensor, y: Tensor, group: Tensor, n_groups: int) -> float:
    """Pooled within-group Pearson correlation of x and y (both [T], group [T])."""
    cnt = torch.bincount(group, minlength=n_groups).to(torch.float64).clamp_min(1.0)
    xc = x - (segment_sum(x, group, n_groups) / cnt)[group]
    yc = y - (segment_sum(y, group, n_groups) / cnt)[group]
    den = float((xc * xc).sum() * (yc * yc).sum())
    return float((xc * yc).sum()) / math.sqrt(den) if den > 0 else math.nan


def _won_per_traj(won: Tensor, structure: BatchStructure, traj_labels: np.ndarray | None) -> Tensor:
    w = won.to(torch.int64)
    n = structure.n_traj
    inv = structure.traj.inverse
    lo = torch.zeros(n, dtype=torch.int64).scatter_reduce_(0, inv, w, reduce="amin", include_self=False)
    hi = torch.zeros(n, dtype=torch.int64).scatter_reduce_(0, inv, w, reduce="amax", include_self=False)
    bad = lo != hi
    if bool(bad.any()):
        tid = _traj_label(structure, int(bad.nonzero()[0, 0]), traj_labels)
        raise ValueError(
            f"column 'won' differs between rows of trajectory {tid!r} ({int(bad.sum())} trajectories); "
            "success must be one value per trajectory"
        )
    return hi.bool()


def _direction_split(qa: Tensor, qb: Tensor, inv_n: Tensor, rgroup: Tensor, G: int, a: str, b: str) -> DirectionSplit:
    """Per-token coefficients are q_r / n_r on each of row r's n_r tokens, so every inner product
    over tokens is a sum over rows of q^a_r·q^b_r / n_r."""
    ss_a = segment_sum(qa * qa * inv_n, rgroup, G)
    ss_b = segment_sum(qb * qb * inv_n, rgroup, G)
    dot = segment_sum(qa * qb * inv_n, rgroup, G)
    s_a, s_b = ss_a.sqrt(), ss_b.sqrt()
    ab = s_a * s_b
    per_group = torch.where(ab > 0, dot / ab.clamp_min(1e-300), torch.full_like(ab, math.nan))
    na, nb = float(ss_a.sum()), float(ss_b.sum())
    sab = float(ab.sum())
    total = float(dot.sum()) / math.sqrt(na * nb) if na > 0 and nb > 0 else math.nan
    between = sab / math.sqrt(na * nb) if na > 0 and nb > 0 else math.nan
    within = float(dot.sum()) / sab if sab > 0 else math.nan
    return DirectionSplit(
        baseline=a,
        other=b,
        cos_total=total,
        cos_within=within,
        cos_between=between,
        scale_ratio=math.sqrt(nb / na) if na > 0 else math.nan,
        cos_per_group=per_group.numpy(),
    )


def _gigpo(s, g, t, step_index, anchor, step_rewards, structure, acc, norm_by_std, gamma, w, eps) -> Tensor:
    if anchor is None or step_rewards is None:
        missing = "anchor" if anchor is None else "step_reward"
        raise ValueError(f"estimator 'gigpo' needs column {missing!r} (GiGPO's step term)")
    if step_index is None:  # the row order inside each trajectory is its step order (verl-agent keeps rows in order)
        step_index = structure.position_in_trajectory()
    step_rewards = _tensor("step_rewards", step_rewards, torch.float64)
    _check_magnitude("step_rewards", step_rewards)
    return gigpo_advantages(
        s,
        step_rewards,
        _tensor("anchor", anchor, torch.int64),
        g,
        t,
        _tensor("step_index", step_index, torch.int64),
        accounting=acc,
        norm_by_std=norm_by_std,
        gamma=gamma,
        step_advantage_w=w,
        eps=eps,
        structure=structure,
    ).to(torch.float64)
