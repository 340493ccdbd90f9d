r"""What the audit finds in one batch, as data: :class:`AuditReport` and its parts, its JSON
document (docs/audit.md#json-schema) and its verdict paragraph (docs/audit.md#the-verdict).

:mod:`oma.diagnostics.audit` computes these figures, :mod:`oma.diagnostics.report` renders them
as tables; this module depends on neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SCHEMA_VERSION = 1
"""Version of the ``--json`` document."""

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
class DumpInfo:
    """Where a batch came from and what was done to it on reading (``oma audit --from``).

    Attributes:
        format: ``"oma"`` (the audit's own columns, docs/audit.md#input-format) or ``"verl-agent"``
            (docs/audit.md#verl-agent-batches).
        invalid_penalty: verl-agent's invalid-action penalty subtracted from each row's score
            (None for ``oma``).
        invalid_actions: rows whose action was invalid (None without an ``is_action_valid`` column).
        row_identity: the column that told padding copies apart (``row_hash``, ``row_id`` or
            ``input_ids``); None for ``oma``, and for a verl-agent dump without one, where copies cannot be
            told from repeated steps.
    """

    format: str = "oma"
    invalid_penalty: float | None = None
    invalid_actions: int | None = None
    row_identity: str | None = None


@dataclass(frozen=True)
class PaddingCopies:
    """Rows whose row identity (``row_hash``, ``row_id`` or ``input_ids``) repeats an earlier row of their
    trajectory: verl-agent's ``adjust_batch`` padding.

    The audit keeps them (they are trained on); this says how much they weigh.

    Attributes:
        rows: rows flagged as copies (the later of two identical rows).
        trajectories: trajectories with at least one copy.
        mass: Σ ω_r over the copies, keyed by accounting (their share of the objective).
    """

    rows: int
    trajectories: int
    mass: dict[str, float]


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
        padding_copies: :class:`PaddingCopies` when the reader looked for them (``--from
            verl-agent``), else None.
        dump: :class:`DumpInfo`, the input's format and the invalid-action penalty applied.

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
    dump: DumpInfo = DumpInfo()
    padding_copies: PaddingCopies | None = None

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
        return verdict(self)

    def to_dict(self, *, per_group: bool = True) -> dict:
        """The JSON document of ``oma audit --json`` (schema in docs/audit.md)."""
        return report_dict(self, per_group=per_group)


# ------------------------------------------------------------------------------------------------
# JSON


def _num(x) -> float | int | None:
    """JSON-safe number: NaN/inf → None, floats rounded to 12 significant digits (stable text)."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.12g}")


def _arr(a: np.ndarray) -> list:
    if a.dtype.kind in "iub":
        return a.tolist()
    if a.dtype.kind == "f":
        return [_num(v) for v in a.tolist()]
    return [v if isinstance(v, (int, str)) else str(v) for v in a.tolist()]


def report_dict(r: AuditReport, *, per_group: bool = True) -> dict:
    """The ``--json`` document (docs/audit.md lists every key). Key order is fixed."""
    acc = r.accountings

    def by_acc(attr: str) -> dict:
        return {k: _num(getattr(a, attr)) for k, a in acc.items()}

    out: dict = {
        "schema_version": SCHEMA_VERSION,
        "source": r.source,
        "rows": r.rows,
        "trajectories": r.trajectories,
        "groups": r.groups,
        "rows_per_traj_mean": _num(r.rows_per_traj_mean),
        "expansion_ratio_fail_over_success": _num(r.expansion_ratio_fail_over_success),
        "mu_row_minus_mu_traj_mean": _num(r.mu_row_minus_mu_traj_mean),
        "kish_ess_fraction": by_acc("kish_ess_fraction"),
        "mass_share_success": by_acc("mass_share_success"),
        "mass_share_failure": by_acc("mass_share_failure"),
        "mass_share_longest10": by_acc("mass_share_longest10"),
        "kish_ess": by_acc("kish_ess"),
        "push_ess_fraction": by_acc("push_ess_fraction"),
        "net_push": by_acc("net_push"),
        "groups_pushed_up": by_acc("groups_pushed_up"),
        "groups_pushed_down": by_acc("groups_pushed_down"),
        "advantage_success_mean": by_acc("advantage_success_mean"),
        "advantage_failure_mean": by_acc("advantage_failure_mean"),
        "degenerate_mass_share": by_acc("degenerate_mass_share"),
        "settings": {
            "reducer": r.reducer,
            "aligned_mass": r.aligned_mass,
            "estimator": r.estimator,
            "norm_by_std": r.norm_by_std,
            "eps": _num(r.eps),
            "success_rule": r.success_rule,
            "from": r.dump.format,
            "invalid_penalty": _num(r.dump.invalid_penalty),
            "row_identity": r.dump.row_identity,
        },
        "successes": r.successes,
        "failures": r.failures,
        "rows_per_traj": {
            "all": _num(r.rows_per_traj_mean),
            "success": _num(r.rows_per_traj_success_mean),
            "failure": _num(r.rows_per_traj_failure_mean),
        },
        "tokens_per_traj": {
            "all": _num(r.tokens_per_traj_mean),
            "success": _num(r.tokens_per_traj_success_mean),
            "failure": _num(r.tokens_per_traj_failure_mean),
        },
        "token_ratio_fail_over_success": _num(r.token_ratio_fail_over_success),
        "coupling": {
            "rows_vs_outcome": _num(r.coupling_rows_outcome),
            "tokens_vs_outcome": _num(r.coupling_tokens_outcome),
        },
        "mu_row_minus_mu_traj": {
            "mean": _num(r.mu_row_minus_mu_traj_mean),
            "abs_mean": _num(r.mu_row_minus_mu_traj_abs_mean),
            "min": _num(r.mu_row_minus_mu_traj_min),
            "max": _num(r.mu_row_minus_mu_traj_max),
        },
        "singleton_groups": dict(r.singleton_groups),
        "zero_spread_groups": dict(r.zero_spread_groups),
        "duplicated_rows": r.duplicated_rows,
        "padding_copies": None
        if r.padding_copies is None
        else {
            "rows": r.padding_copies.rows,
            "trajectories": r.padding_copies.trajectories,
            "mass": {k: _num(v) for k, v in r.padding_copies.mass.items()},
        },
        "invalid_actions": r.dump.invalid_actions,
        "group_mass_shift_tv": _num(r.group_mass_shift_tv),
        "direction_split": {
            "baseline": "row+native",
            **{
                k: {
                    "cos_within": _num(d.cos_within),
                    "cos_between": _num(d.cos_between),
                    "cos_total": _num(d.cos_total),
                    "scale_ratio": _num(d.scale_ratio),
                }
                for k, d in r.direction_split.items()
            },
        },
        "verdict": verdict(r),
    }
    if per_group:
        out["per_group"] = {
            "group_id": _arr(np.asarray(r.group_labels)),
            "trajectories": _arr(r.group_trajectories),
            "mu_row": _arr(r.mu_row),
            "mu_traj": _arr(r.mu_traj),
            "mass": {"native": _arr(r.group_mass_native), "aligned": _arr(r.group_mass_aligned)},
            "net_push": {k: _arr(a.net_push_per_group) for k, a in acc.items()},
        }
    return out


# ------------------------------------------------------------------------------------------------
# verdict


def _pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _f(x: float, spec: str = ".3g") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


NO_ROW_IDENTITY = (
    "this dump has no row identity (a row_hash, row_id or input_ids column), so the audit cannot tell verl-agent's "
    "padding copies from steps that repeat a state with the same reward and length, and counts none; dump row_id "
    "as docs/audit.md#verl-agent-batches shows to weigh them"
)


def copies_unknown(r: AuditReport) -> bool:
    """A verl-agent dump without a row identity: padding copies may be in it, and cannot be told apart."""
    return r.dump.format == "verl-agent" and r.dump.row_identity is None


def verdict(r: AuditReport) -> str:
    """One plain-language paragraph: expansion, mass by outcome, baseline shift, push, direction, warnings."""
    acc = r.accountings
    today, oa, ma, full = acc["row+native"], acc["trajectory+native"], acc["row+aligned"], acc["trajectory+aligned"]
    parts: list[str] = []
    if r.successes and r.failures:
        ratio = r.expansion_ratio_fail_over_success
        ks, kf = r.rows_per_traj_success_mean, r.rows_per_traj_failure_mean
        expands = expansion(ratio)
        if expands == "more":
            parts.append(f"Failures expand {ratio:.1f}x more than successes ({kf:.1f} vs {ks:.1f} rows per trajectory)")
        elif expands == "less":
            parts.append(
                f"Successes expand {1 / ratio:.1f}x more than failures ({ks:.1f} vs {kf:.1f} rows per trajectory)"
            )
        else:
            parts.append(f"Successes and failures expand about equally ({ks:.1f} vs {kf:.1f} rows per trajectory)")
        parts[-1] += (
            f"; under {r.reducer} the failures carry {_pct(today.mass_share_failure)} of the objective mass, "
            f"and OMA ({r.aligned_mass} mass) would give them {_pct(full.mass_share_failure)}."
        )
    else:
        which = "a success" if not r.successes else "a failure"
        parts.append(
            f"None of the {r.trajectories} trajectories counts as {which} under the rule '{r.success_rule}', so the "
            "outcome split is one-sided (pass a won column or --success-threshold if that is wrong)."
        )
    if r.mu_row_minus_mu_traj_abs_mean > 1e-12:
        parts.append(
            f"Counting each outcome once per row moves the group baselines by {r.mu_row_minus_mu_traj_mean:+.3g} on "
            f"average (mean |shift| {r.mu_row_minus_mu_traj_abs_mean:.3g})."
        )
    else:
        parts.append("Row and trajectory accounting agree on every group's baseline.")

    def signed(x: float) -> str:
        return "0" if x == 0 else _f(x, "+.3f")

    push = (
        f"Net signed push (Σ mass × advantage; negative = toward failures) is {signed(today.net_push)} today, "
        f"{signed(oa.net_push)} with OA alone, {signed(ma.net_push)} with MA alone "
        f"and {signed(full.net_push)} with both"
    )
    if oa.net_push < today.net_push - 1e-9 * (1 + abs(today.net_push)):
        push += ": OA alone leans further toward failures than today, so switch OA and MA together."
    else:
        push += "."
    parts.append(push)
    d = r.direction_split.get("trajectory+aligned")
    if d is not None and math.isfinite(d.cos_total):
        parts.append(
            f"Against today's update, full OMA keeps the within-group direction at cosine {d.cos_within:.2f} and the "
            f"spread across groups at cosine {d.cos_between:.2f} (update size x{d.scale_ratio:.2f}); Mass Alignment "
            f"moves {_pct(r.group_mass_shift_tv)} of the objective mass between groups."
        )
    parts.append(
        f"Effective trajectories (Kish): {_pct(today.kish_ess_fraction)} of {r.trajectories} today, "
        f"{_pct(full.kish_ess_fraction)} aligned."
    )
    n_deg = r.singleton_groups["trajectory"] + r.zero_spread_groups["trajectory"]
    if n_deg:
        parts.append(
            f"Warning: {n_deg} of {r.groups} groups have one trajectory or one outcome, so their advantage is 0; they "
            f"hold {_pct(today.degenerate_mass_share)} of today's mass."
        )
    if r.duplicated_rows:
        parts.append(f"Warning: {r.duplicated_rows} rows repeat a (traj_id, step) pair; check the dump.")
    if r.padding_copies is not None and r.padding_copies.rows:
        pc = r.padding_copies
        parts.append(
            f"{pc.rows} rows are padding copies of other rows (in {pc.trajectories} trajectories, by their "
            f"{r.dump.row_identity}); they are trained on and carry {100 * pc.mass[BASELINE]:.1f}% of today's mass."
        )
    if copies_unknown(r):
        parts.append(f"Padding copies: {NO_ROW_IDENTITY}.")
    parts.append(f"What the evidence found for OA, MA and both in batches like this: docs/how-to-choose.md#{choose_anchor(r)}.")
    return " ".join(parts)


EQUAL_BAND = 1.05
"""Failures and successes expand "about equally" when their ratio lies within this factor of 1."""


def expansion(ratio: float) -> str:
    """``more`` (failures expand more), ``less`` or ``equal`` (within :data:`EQUAL_BAND` of 1): the verdict's reading
    of the ratio, and the section of docs/how-to-choose.md it links."""
    return "more" if ratio >= EQUAL_BAND else "less" if ratio <= 1 / EQUAL_BAND else "equal"


def choose_anchor(r: AuditReport) -> str:
    """The section of docs/how-to-choose.md for this batch's expansion: failures longer, shorter or as long."""
    if not (r.successes and r.failures):
        return "no-ratio-yet"
    return {"more": "failures-expand-more", "less": "failures-expand-less",
            "equal": "no-expansion"}[expansion(r.expansion_ratio_fail_over_success)]
