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
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from oma.core import ESTIMATORS, MASSES, REDUCERS, gigpo_advantages, row_coefficients
from oma.core._validate import check_option, check_positive
from oma.core.advantages import _check_scores, _episode_advantages, _member_stats, _members, trajectory_outcomes
from oma.core.segments import batch_structure, segment_sum

ACCOUNTING_NAMES: tuple[str, ...] = ("row+native", "row+aligned", "trajectory+native", "trajectory+aligned")
"""The four accountings, ``"<outcome accounting>+<mass>"``; ``aligned`` is the chosen MA target."""

BASELINE = "row+native"
"""What verl / verl-agent compute today; the reference of the direction split."""

LONGEST_FRACTION = 0.10


@dataclass(frozen=True)
class AccountingFigures:
    """The figures of one accounting (``name`` in :data:`ACCOUNTING_NAMES`).

    Attributes:
        name: ``"row+native"``, ``"row+aligned"``, ``"trajectory+native"`` or ``"trajectory+aligned"``.
        accounting: outcome statistics over ``"row"`` or ``"trajectory"`` (OA).
        mass_rule: ``"native"`` or the Mass Alignment target (``"uniform"`` / ``"group"``).
        mass: m_τ, each trajectory's objective mass (``oma.core.implicit_mass``), float64 [T], Σ = 1.
        mass_share_success: Σ m_τ over successful trajectories.
        mass_share_failure: Σ m_τ over failed trajectories (= 1 − success share).
        mass_share_longest10: Σ m_τ over the longest 10% (⌈0.1·T⌉ trajectories with the most
            rows; ties by more tokens, then batch order).
        kish_ess: Kish effective number of trajectories, (Σ m_τ)² / Σ m_τ².
        kish_ess_fraction: kish_ess / T (1 = every trajectory weighs the same).
        push_ess_fraction: (Σ|p_τ|)² / Σ p_τ² / T with p_τ = Σ_{r∈τ} ω_r·A_r: the fraction of
            trajectories that effectively drive the update (NaN if every p_τ = 0).
        advantage_success_mean: mean over successful trajectories of ā_τ (mean of τ's row advantages).
        advantage_failure_mean: the same over failed trajectories.
        traj_push: p_τ = Σ_{r∈τ} ω_r·A_r, float64 [T].
        net_push_per_group: P_g = Σ_{τ∈g} p_τ, float64 [G]; < 0 means the group's update is
            dominated by pushing its low-advantage (failed) tokens down.
            A group's P_g within 1e-9·Σ_{r∈g}|ω_r·A_r| of 0 (float rounding) is reported as exactly 0.
        net_push: Σ_g P_g.
        groups_pushed_up: groups with P_g > 0.
        groups_pushed_down: groups with P_g < 0.
        degenerate_mass_share: mass of groups whose episode advantage is 0 by convention under
            this outcome accounting (single member or zero spread): objective mass spent on
            nothing but the KL/entropy terms (and GiGPO's step term).
    """

    name: str
    accounting: str
    mass_rule: str
    mass: np.ndarray = field(repr=False)
    mass_share_success: float
    mass_share_failure: float
    mass_share_longest10: float
    kish_ess: float
    kish_ess_fraction: float
    push_ess_fraction: float
    advantage_success_mean: float
    advantage_failure_mean: float
    traj_push: np.ndarray = field(repr=False)
    net_push_per_group: np.ndarray = field(repr=False)
    net_push: float
    groups_pushed_up: int
    groups_pushed_down: int
    degenerate_mass_share: float


@dataclass(frozen=True)
class DirectionSplit:
    r"""How accounting ``other`` differs from ``baseline``: within-group direction vs between-group mass.

    With c^a the per-token coefficient vector of accounting a (module docstring), c^a_g its
    restriction to group g and s^a_g = ‖c^a_g‖₂:

    * ``cos_within`` = Σ_g ⟨c^a_g, c^b_g⟩ / Σ_g s^a_g·s^b_g — the s^a_g·s^b_g-weighted mean of the
      per-group cosines ``cos_per_group``: 1 iff inside every group the two accountings push the
      tokens in the same direction (same relative coefficients), whatever their scale.
    * ``cos_between`` = ⟨s^a, s^b⟩ / (‖s^a‖·‖s^b‖) — cosine of the per-group magnitude vectors:
      1 iff the two accountings share the update's magnitude among groups in the same proportions.
    * ``cos_total`` = ⟨c^a, c^b⟩ / (‖c^a‖·‖c^b‖) = ``cos_between · cos_within`` exactly.
    * ``scale_ratio`` = ‖c^b‖ / ‖c^a‖ (overall size of the update, other over baseline).

    NaN where a norm is 0 (e.g. every group degenerate).
    """

    baseline: str
    other: str
    cos_total: float
    cos_within: float
    cos_between: float
    scale_ratio: float
    cos_per_group: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class AuditReport:
    """Everything :func:`audit` finds in one batch (docs/audit.md). Floats are NaN where undefined.

    Batch:
        source: where the batch came from (a path, or None).
        rows, trajectories, groups: R, T, G.
        reducer: the native reducer audited (``--reducer``).
        aligned_mass: the Mass Alignment target behind ``*+aligned`` (``uniform`` or ``group``).
        estimator, norm_by_std, eps: advantage settings passed to oma.core.
        success_rule: how success was decided (``won column``, ``score >= T`` or ``score > 0``).
        successes, failures: trajectories of each outcome class.

    Expansion (K_τ rows and M_τ trainable tokens of trajectory τ):
        rows_per_traj_mean: R / T.
        rows_per_traj_success_mean, rows_per_traj_failure_mean: mean K_τ per outcome class.
        tokens_per_traj_mean, tokens_per_traj_success_mean, tokens_per_traj_failure_mean: mean M_τ.
        expansion_ratio_fail_over_success: mean K of failures / mean K of successes.
        token_ratio_fail_over_success: mean M of failures / mean M of successes.
        coupling_rows_outcome: within-group (pooled) Pearson correlation of K_τ and R_τ: both
            centred on their group's trajectory mean, then r = Σxy / √(Σx²·Σy²). −1 = within
            every task, the longer episode is the worse one.
        coupling_tokens_outcome: the same with M_τ.

    Outcome statistics:
        mu_row, mu_traj: μ_g under row and trajectory accounting (``oma.core.group_outcome_stats``), [G].
        mu_row_minus_mu_traj_mean: mean over groups of μ_row − μ_traj (< 0: the row baseline sits
            closer to the failures' outcome, so failures look less bad and successes better).
        mu_row_minus_mu_traj_abs_mean, _min, _max: mean |shift|, smallest and largest shift.
        singleton_groups: groups with one member, keyed ``row`` / ``trajectory``.
        zero_spread_groups: groups of ≥ 2 members that all have the same outcome, same keys
            (disjoint from the singletons; both get advantage 0 by convention).
        duplicated_rows: rows repeating an earlier row's (traj_id, step); None without a step column.

    Mass and push:
        accountings: :class:`AccountingFigures` keyed by :data:`ACCOUNTING_NAMES`.
        group_mass_native, group_mass_aligned: Σ_{τ∈g} m_τ per group under each mass rule, [G].
        group_mass_shift_tv: ½·Σ_g |native − aligned| group mass: the share of the objective that
            Mass Alignment moves from some groups to others.
        direction_split: :class:`DirectionSplit` of each other accounting against ``row+native``.

    Per trajectory / group (arrays, in oma.core's order: ``torch.unique`` of the ids):
        traj_rows, traj_tokens, traj_outcome, traj_success, traj_group, traj_labels; group_labels,
        group_trajectories.
    """

    source: str | None
    rows: int
    trajectories: int
    groups: int
    reducer: str
    aligned_mass: str
    estimator: str
    norm_by_std: bool
    eps: float
    success_rule: str
    successes: int
    failures: int
    rows_per_traj_mean: float
    rows_per_traj_success_mean: float
    rows_per_traj_failure_mean: float
    tokens_per_traj_mean: float
    tokens_per_traj_success_mean: float
    tokens_per_traj_failure_mean: float
    expansion_ratio_fail_over_success: float
    token_ratio_fail_over_success: float
    coupling_rows_outcome: float
    coupling_tokens_outcome: float
    mu_row: np.ndarray = field(repr=False)
    mu_traj: np.ndarray = field(repr=False)
    mu_row_minus_mu_traj_mean: float
    mu_row_minus_mu_traj_abs_mean: float
    mu_row_minus_mu_traj_min: float
    mu_row_minus_mu_traj_max: float
    singleton_groups: dict[str, int]
    zero_spread_groups: dict[str, int]
    duplicated_rows: int | None
    accountings: dict[str, AccountingFigures] = field(repr=False)
    group_mass_native: np.ndarray = field(repr=False)
    group_mass_aligned: np.ndarray = field(repr=False)
    group_mass_shift_tv: float
    direction_split: dict[str, DirectionSplit] = field(repr=False)
    traj_rows: np.ndarray = field(repr=False)
    traj_tokens: np.ndarray = field(repr=False)
    traj_outcome: np.ndarray = field(repr=False)
    traj_success: np.ndarray = field(repr=False)
    traj_group: np.ndarray = field(repr=False)
    traj_labels: np.ndarray = field(repr=False)
    group_labels: np.ndarray = field(repr=False)
    group_trajectories: np.ndarray = field(repr=False)

    @property
    def mu_row_minus_mu_traj(self) -> np.ndarray:
        """μ_row − μ_traj per group, [G]."""
        return self.mu_row - self.mu_traj

    @property
    def kish_ess_fraction(self) -> dict[str, float]:
        """Kish ESS / T keyed by accounting."""
        return {k: a.kish_ess_fraction for k, a in self.accountings.items()}

    @property
    def mass_share_success(self) -> dict[str, float]:
        """Objective-mass share of successful trajectories keyed by accounting."""
        return {k: a.mass_share_success for k, a in self.accountings.items()}

    @property
    def net_push(self) -> dict[str, float]:
        """Net signed push Σ_g P_g keyed by accounting."""
        return {k: a.net_push for k, a in self.accountings.items()}

    @property
    def verdict(self) -> str:
        """A one-paragraph plain-language reading of the figures."""
        from oma.diagnostics.report import verdict

        return verdict(self)

    def to_dict(self, *, per_group: bool = True) -> dict:
        """The JSON document of ``oma audit --json`` (schema in docs/audit.md)."""
        from oma.diagnostics.report import report_dict

        return report_dict(self, per_group=per_group)


# ------------------------------------------------------------------------------------------------


def _tensor(name: str, x, dtype: torch.dtype | None = None) -> Tensor:
    t = x if isinstance(x, Tensor) else torch.as_tensor(np.array(x))  # a copy: inputs may be read-only
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


def _won_per_traj(won: Tensor, structure, traj_labels: np.ndarray | None) -> Tensor:
    w = won.to(torch.int64)
    n = structure.n_traj
    inv = structure.traj.inverse
    lo = torch.zeros(n, dtype=torch.int64).scatter_reduce_(0, inv, w, reduce="amin", include_self=False)
    hi = torch.zeros(n, dtype=torch.int64).scatter_reduce_(0, inv, w, reduce="amax", include_self=False)
    bad = lo != hi
    if bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        tid = traj_labels[int(structure.traj.ids[k])] if traj_labels is not None else int(structure.traj.ids[k])
        tid = tid.item() if isinstance(tid, np.generic) else tid
        raise ValueError(
            f"column 'won' differs between rows of trajectory {tid!r} ({int(bad.sum())} trajectories); "
            "success must be one value per trajectory"
        )
    return hi.bool()


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
    response_length: int | None = None,
    loss_scale_factor: float | None = None,
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
        response_length: padded length L (only ``seq-mean-token-sum-norm`` uses it; it cancels in
            every share); default: the mask's width or the largest count.
        group_labels, traj_labels: original id of each id value (when ids are codes), for display.
        source: where the batch came from, for the report.

    Returns: an :class:`AuditReport`.
    """
    check_option("reducer", reducer, REDUCERS)
    check_option("aligned_mass", aligned_mass, tuple(m for m in MASSES if m != "native"))
    check_option("estimator", estimator, (*ESTIMATORS, "gigpo"))
    check_positive("eps", eps, allow_zero=True)
    if (response_tokens is None) == (response_mask is None):
        raise ValueError("pass exactly one of response_tokens (count per row) and response_mask (bool [R, L])")
    s = _tensor("scores", scores, torch.float64)
    g = _tensor("group_index", group_index)
    t = _tensor("traj_index", traj_index)
    rows = int(s.shape[0])
    if rows == 0:
        raise ValueError("the batch has no rows")
    _check_scores(s, g)  # oma.core: finite, one per row
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

    structure = batch_structure(g, t)  # oma.core: validates ids, a trajectory in two groups raises
    T, G = structure.n_traj, structure.n_groups
    tinv, rgroup, tgroup = structure.traj.inverse, structure.row_group, structure.traj_group

    # ---- trajectories: length, tokens, outcome, success (oma.core for the outcome) -----------
    K = structure.traj.counts.to(torch.float64)
    M = segment_sum(n_tok, tinv, T)
    R_tau = trajectory_outcomes(s, structure)
    if won is not None:
        success = _won_per_traj(_tensor("won", won), structure, traj_labels)
        success_rule = "won column"
    elif success_threshold is not None:
        success = R_tau >= float(success_threshold)
        success_rule = f"score >= {success_threshold:g}"
    else:
        success = R_tau > 0
        success_rule = "score > 0"
    fail = ~success

    # ---- outcome statistics and advantages (oma.core) ---------------------------------------
    # The bodies of group_outcome_stats / outcome_advantages, given the one BatchStructure computed
    # above (each public call would redo the O(R log R) id sort; tests check equality with them).
    stats = {acc: _member_stats(*_members(s, structure, acc)[:2], G) for acc in ("row", "trajectory")}
    adv: dict[str, Tensor] = {}
    for acc in ("row", "trajectory"):
        if estimator == "gigpo":
            adv[acc] = _gigpo(
                s, g, t, step_index, anchor, step_rewards, structure, acc, norm_by_std, gamma, step_advantage_w, eps
            )
        else:
            adv[acc] = _episode_advantages(s, structure, acc, estimator, norm_by_std, eps)

    # ---- masses (oma.core reducer weights, summed per row) ----------------------------------
    omega: dict[str, Tensor] = {}
    for rule in ("native", aligned_mass):
        w = n_tok.to(torch.float64) * row_coefficients(
            n_tok, structure, reducer=reducer, mass=rule, length=max(int(length), 1), loss_scale_factor=loss_scale_factor
        )
        omega["native" if rule == "native" else "aligned"] = w / w.sum()

    # longest 10%: most rows, ties by more tokens, then batch (id) order
    n_long = max(1, math.ceil(LONGEST_FRACTION * T))
    order = np.lexsort((np.arange(T), -M.numpy(), -K.numpy()))
    longest = torch.zeros(T, dtype=torch.bool)
    longest[torch.as_tensor(order[:n_long])] = True

    figures: dict[str, AccountingFigures] = {}
    coef: dict[str, Tensor] = {}
    group_mass: dict[str, Tensor] = {}
    for name in ACCOUNTING_NAMES:
        acc, rule = name.split("+")
        om, a = omega[rule], adv[acc]
        q = om * a  # row's push Σ_l c[r, l]
        coef[name] = q
        m = segment_sum(om, tinv, T)
        group_mass[rule] = segment_sum(m, tgroup, G)
        p = segment_sum(q, tinv, T)
        P = segment_sum(p, tgroup, G)
        # float noise: a group's push within 1e-9 of its absolute push Σ|ω·A| is exactly 0
        scale = segment_sum(q.abs(), rgroup, G)
        P = torch.where(P.abs() <= 1e-9 * scale, torch.zeros_like(P), P)
        abar = segment_sum(a, tinv, T) / K
        p2 = float((p * p).sum())
        deg = (stats[acc].count < 2) | stats[acc].zero_spread
        figures[name] = AccountingFigures(
            name=name,
            accounting=acc,
            mass_rule="native" if rule == "native" else aligned_mass,
            mass=m.numpy(),
            mass_share_success=float(m[success].sum()),
            mass_share_failure=float(m[fail].sum()),
            mass_share_longest10=float(m[longest].sum()),
            kish_ess=float(m.sum() ** 2 / (m * m).sum()),
            kish_ess_fraction=float(m.sum() ** 2 / (m * m).sum()) / T,
            push_ess_fraction=(float(p.abs().sum()) ** 2 / p2 / T) if p2 > 0 else math.nan,
            advantage_success_mean=_mean_where(abar, success),
            advantage_failure_mean=_mean_where(abar, fail),
            traj_push=p.numpy(),
            net_push_per_group=P.numpy(),
            net_push=float(P.sum()),
            groups_pushed_up=int((P > 0).sum()),
            groups_pushed_down=int((P < 0).sum()),
            degenerate_mass_share=float(m[deg[tgroup]].sum()),
        )

    # ---- within-group direction vs between-group magnitude ----------------------------------
    inv_n = torch.where(n_tok > 0, 1.0 / n_tok.clamp_min(1.0), torch.zeros_like(n_tok))
    split = {
        other: _direction_split(coef[BASELINE], coef[other], inv_n, rgroup, G, BASELINE, other)
        for other in ACCOUNTING_NAMES
        if other != BASELINE
    }

    # ---- expansion, coupling, outcome statistics --------------------------------------------
    mu_row, mu_traj = stats["row"].mean, stats["trajectory"].mean
    shift = mu_row - mu_traj
    duplicated = None
    if step_index is not None:
        st = np.array(step_index, dtype=np.int64)
        if st.shape != (rows,):
            raise ValueError(f"step_index must have shape ({rows},), got {st.shape}")
        lo, hi = int(st.min()), int(st.max())
        key = np.sort(tinv.numpy() * (hi - lo + 1) + (st - lo))  # numpy's sort: ~10x torch's on CPU
        duplicated = int((key[1:] == key[:-1]).sum())
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
        success_rule=success_rule,
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
        singleton_groups={acc: int((stats[acc].count < 2).sum()) for acc in ("row", "trajectory")},
        zero_spread_groups={
            acc: int((stats[acc].zero_spread & (stats[acc].count >= 2)).sum()) for acc in ("row", "trajectory")
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
    )


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
    if step_index is None:
        # the row order inside each trajectory is its step order (verl-agent keeps rows in order)
        order = torch.argsort(structure.traj.inverse, stable=True)
        first = torch.cumsum(structure.traj.counts, 0) - structure.traj.counts
        pos = torch.empty_like(order)
        pos[order] = torch.arange(order.numel()) - first[structure.traj.inverse[order]]
        step_index = pos
    return gigpo_advantages(
        s,
        _tensor("step_rewards", step_rewards, torch.float64),
        _tensor("anchor", anchor, torch.int64),
        g,
        t,
        _tensor("step_index", step_index, torch.int64),
        accounting=acc,
        norm_by_std=norm_by_std,
        gamma=gamma,
        step_advantage_w=w,
        eps=eps,
    ).to(torch.float64)
