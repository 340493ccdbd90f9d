r"""One contract for every host framework: a host's step in, OMA's advantages, weights and metrics out
(docs/hosts.md).

A host integration (verl, verl-agent, SkyRL, ``oma train``) does two things only: it reads its
framework's batch into a :class:`HostStep` (oma's ids: one row per agent step, its group, its
trajectory, its score, its response mask, the mini-batches its optimizer will take) and its
framework's config into :class:`HostOptions`; then it calls :func:`align` and hands the result back
to its framework. The math is :mod:`oma.core`'s; nothing here is host-specific.

* :func:`advantages`: A [R] under ``accounting`` (OA) and ``estimator``, with the trajectory outcome
  rule ``outcome`` (``mean`` of a trajectory's rows' scores, oma.core's $R_τ$; or its ``final`` row's).
* :func:`weights`: W [R, L] float64 with $\text{loss} = Σ Wℓ$. ``mass=native``: each mini-batch's own
  normaliser (the host's ``loss_agg_mode`` per optimizer step). ``uniform`` / ``group``: over the
  whole step, times the number of mini-batches k, so each trajectory gets its share of the step's
  objective whatever mini-batches and ranks its rows fall in, and an optimizer step carries 1 on
  average (docs/math.md#mass-alignment). Rows that copy another row (``copies``: padding a batch to a
  divisible size) get no weight under MA and take no trajectory's place.
* :func:`metrics`: the same ``oma/*`` names on every host.
* :func:`align`: all three, and the batch written for ``oma audit`` when ``dump_dir`` is set.
* :func:`require_version`: a host refuses, at start-up, a framework version the contract was not tested on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from oma import core

ESTIMATORS: tuple[str, ...] = ("grpo", "rloo", "gigpo")
"""Advantage estimators: the group-relative episode estimators of :func:`oma.core.outcome_advantages` and
GiGPO's episode + step terms (:func:`oma.core.gigpo_advantages`)."""

OUTCOMES: tuple[str, ...] = ("mean", "final")
"""A trajectory's outcome $R_τ$: the ``mean`` of its rows' scores (oma.core's rule; they agree when the host
stamps the episode's reward on every row) or the score of its ``final`` row (verl's: the reward on the last
turn)."""


class HostConfigError(ValueError):
    """A host's OMA option is wrong; the message is one line naming the key and what it accepts."""


def _choice(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise HostConfigError(f"{key} must be one of {list(allowed)}, got {value!r}")


@dataclass(frozen=True)
class HostOptions:
    """The OMA options of one run, validated once; errors name the key under ``prefix``."""

    accounting: str = "trajectory"
    """``trajectory``: group statistics over unique trajectories (OA); ``row``: over rows (verl-agent's baseline)."""
    mass: str = "uniform"
    """``uniform`` (each trajectory 1/T of the step), ``group`` (each group equal), ``native`` (the reducer's own)."""
    reducer: str = "token-mean"
    """The aggregation inside a trajectory, by verl's ``loss_agg_mode`` names (:data:`oma.core.REDUCERS`)."""
    estimator: str = "grpo"
    """:data:`ESTIMATORS`."""
    norm_by_std: bool = True
    """Divide the group-relative advantage by the group's std (``grpo``, ``gigpo``); false is Dr. GRPO."""
    gamma: float = 0.95
    """GiGPO's step-return discount."""
    step_advantage_w: float = 1.0
    """GiGPO's ω, the step term's weight."""
    eps: float = 1e-6
    """ε of the std normaliser."""
    loss_scale_factor: float | None = None
    """L_norm of ``reducer=seq-mean-token-sum-norm`` (None: the batch's padded response length)."""
    outcome: str = "mean"
    """:data:`OUTCOMES`."""
    dump_dir: str | None = None
    """When set, each step's batch is written to ``<dump_dir>/batches/iter_<step>.parquet`` for ``oma audit``."""
    prefix: str = field(default="oma", compare=False, repr=False)
    """Where the host keeps these options (``algorithm.oma``, ``trainer.algorithm.oma``): errors name ``prefix.key``."""

    def __post_init__(self) -> None:
        p = self.prefix
        _choice(f"{p}.accounting", self.accounting, core.ACCOUNTINGS)
        _choice(f"{p}.mass", self.mass, core.MASSES)
        _choice(f"{p}.reducer", self.reducer, core.REDUCERS)
        _choice(f"{p}.estimator", self.estimator, ESTIMATORS)
        _choice(f"{p}.outcome", self.outcome, OUTCOMES)
        for key, value, ok, expected in (
            ("gamma", self.gamma, lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
            ("step_advantage_w", self.step_advantage_w, lambda v: v >= 0.0, ">= 0"),
            ("eps", self.eps, lambda v: v >= 0.0, ">= 0"),
        ):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and ok(float(value))):
                raise HostConfigError(f"{p}.{key} must be a finite number {expected}, got {value!r}")
        lsf = self.loss_scale_factor
        if lsf is not None and not (isinstance(lsf, (int, float)) and math.isfinite(lsf) and lsf > 0):
            raise HostConfigError(f"{p}.loss_scale_factor must be a finite number > 0 or null, got {lsf!r}")
        if not isinstance(self.norm_by_std, bool):
            raise HostConfigError(f"{p}.norm_by_std must be true or false, got {self.norm_by_std!r}")

    @classmethod
    def from_mapping(cls, given: Mapping[str, Any] | None, *, prefix: str, refused: Mapping[str, str] | None = None,
                     **defaults: Any) -> HostOptions:
        """The options a host's config node ``given`` sets (None or absent values: ``defaults``, then the
        fields' own), under ``prefix``. An unknown key is refused by name, never dropped: a typo must not
        silently fall back to a default. ``refused`` maps the keys this host does not take from the node
        (the host's own config sets them, or they were renamed) to the rest of their one-line refusal,
        ``"<prefix>.<key> <refused[key]>"``, which says what to use instead."""
        refused = dict(refused or {})
        known = [f.name for f in fields(cls) if f.name != "prefix" and f.name not in refused]
        values = dict(defaults)
        for key, value in (given or {}).items():
            if key in refused:
                raise HostConfigError(f"{prefix}.{key} {refused[key]}")
            if key not in known:
                raise HostConfigError(f"{prefix}.{key} is not an option; known: {known}")
            if value is not None:
                values[str(key)] = value
        for key in ("gamma", "step_advantage_w", "eps", "loss_scale_factor"):
            if isinstance(values.get(key), str):
                try:
                    values[key] = float(values[key])
                except ValueError:
                    raise HostConfigError(f"{prefix}.{key} must be a number, got {values[key]!r}") from None
        return cls(**values, prefix=prefix)

    @property
    def aligned(self) -> bool:
        """Whether OMA changes anything: the baseline is ``accounting=row`` with ``mass=native``."""
        return not (self.accounting == "row" and self.mass == "native")


@dataclass
class HostStep:
    """One training step of a host, in oma's ids (docs/math.md#the-batch): one row per agent step."""

    group_index: Tensor
    """int [R]: the group (task / prompt) of each row."""
    traj_index: Tensor
    """int [R]: the trajectory (episode) of each row; a trajectory lies in one group."""
    scores: Tensor
    """float [R]: each row's score (the episode's outcome stamped on it, or the host's per-row score)."""
    response_mask: Tensor
    """bool [R, L]: True = a trainable response token."""
    step_index: Tensor | None = None
    """int [R]: each row's step within its trajectory (``outcome=final`` and GiGPO need it)."""
    anchor: Tensor | None = None
    """int [R]: GiGPO's state ids (rows in the same state share one)."""
    step_rewards: Tensor | None = None
    """float [R]: GiGPO's per-step rewards."""
    minibatches: list[Tensor] | None = None
    """Row indices of each optimizer step the host will take on this batch (None: one)."""
    copies: Tensor | None = None
    """bool [R]: rows that only pad the batch to a divisible size: verl-agent's ``adjust_batch`` copies of
    other rows, verl's synthetic padding rows (``is_padding``). They take no trajectory's place."""
    won: Tensor | None = None
    """bool [R]: the episode's success, stamped on its rows, when the host knows it (``oma train``); it
    decides success in :func:`metrics` and is written by :func:`dump`, as ``oma audit``'s ``won`` column
    does. Without it a trajectory succeeds when its outcome is > 0 (the audit's default rule)."""

    def __post_init__(self) -> None:
        rows = int(self.group_index.shape[0])
        mask = self.response_mask
        if mask.dim() != 2 or mask.shape[0] != rows:
            raise ValueError(f"response_mask must be [R, L] with R = {rows} rows, got {tuple(mask.shape)}")
        for name in ("traj_index", "scores", "step_index", "anchor", "step_rewards", "copies", "won"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (rows,):
                raise ValueError(f"{name} must be [R] with R = {rows} rows, got {tuple(value.shape)}")
        self.response_mask = mask.bool()
        if self.minibatches is not None:
            served = torch.cat(self.minibatches) if self.minibatches else torch.zeros(0, dtype=torch.long)
            if sorted(served.tolist()) != list(range(rows)):
                raise ValueError("minibatches must serve every row of the step exactly once")

    @property
    def rows(self) -> int:
        return int(self.group_index.shape[0])

    @property
    def layout(self) -> list[Tensor]:
        """The optimizer steps' rows: :attr:`minibatches`, or the whole step as one."""
        return self.minibatches if self.minibatches is not None else [torch.arange(self.rows)]

    @property
    def kept(self) -> Tensor:
        """bool [R]: the rows that are no padding copy."""
        return torch.ones(self.rows, dtype=torch.bool) if self.copies is None else ~self.copies.bool()

    def select(self, idx: Tensor) -> HostStep:
        """The step restricted to rows ``idx``, as one mini-batch (a host whose mini-batches hold whole
        trajectories, or that leaves rows out of its step, takes its weights or its dump from it)."""
        rows = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("response_mask", "minibatches")}
        return HostStep(**{k: None if v is None else v.index_select(0, idx) for k, v in rows.items()},
                        response_mask=self.response_mask.index_select(0, idx))


@dataclass(frozen=True)
class HostResult:
    adv: Tensor
    """float [R]: each row's advantage."""
    weights: Tensor
    """float64 [R, L]: per-token loss weights, loss = Σ W·ℓ."""
    metrics: dict[str, float]
    """``oma/*`` diagnostics (:func:`metrics`)."""


def outcome_scores(step: HostStep, options: HostOptions) -> Tensor:
    """Each row's score for the outcome statistics: the row's own (``outcome=mean``: R_τ is their mean), or
    its trajectory's final row's score stamped on every row (``outcome=final``)."""
    if options.outcome == "mean":
        return step.scores
    if step.step_index is None:
        raise ValueError(f"{options.prefix}.outcome=final needs each row's step_index")
    traj = core.batch_structure(step.group_index, step.traj_index).traj
    last = torch.full((traj.n,), -1, dtype=torch.int64).scatter_reduce(
        0, traj.inverse, step.step_index.to(torch.int64), reduce="amax")
    final = (step.step_index.to(torch.int64) == last.index_select(0, traj.inverse)).nonzero().squeeze(-1)
    per_traj = torch.zeros(traj.n, dtype=step.scores.dtype).index_copy(0, traj.inverse.index_select(0, final),
                                                                      step.scores.index_select(0, final))
    return per_traj.index_select(0, traj.inverse)


def copy_sources(step: HostStep) -> Tensor:
    """int64 [R]: for each row, a row that is no copy and that it repeats as far as its advantage can tell
    (the same trajectory, anchor and step reward), itself for a row that is no copy; −1 for a copy that
    repeats no row of the step."""
    parts = [step.traj_index.to(torch.int64)] + [x if x.dtype == torch.int64 else x.double().view(torch.int64)
                                                 for x in (step.anchor, step.step_rewards) if x is not None]
    key = torch.unique(torch.stack(parts, -1), dim=0, return_inverse=True)[1]
    kept = step.kept.nonzero().squeeze(-1)
    source = torch.full((step.rows,), -1, dtype=torch.int64).scatter_reduce(
        0, key.index_select(0, kept), kept, reduce="amax", include_self=True).index_select(0, key)
    return source.index_copy(0, kept, kept)


def advantages(step: HostStep, options: HostOptions) -> Tensor:
    """A [R] (docs/math.md#outcome-statistics-and-advantages-outcome-alignment).

    Padding copies (``step.copies``) count in the statistics under ``accounting=row``, as a stepwise host
    counts them. Under ``accounting=trajectory`` they are left out (a copy is no new episode, and would
    shift R_τ's mean and GiGPO's step groups), and each takes the advantage of the row it repeats
    (:func:`copy_sources`); one that repeats no row gets 0.
    """
    if options.accounting == "trajectory" and step.copies is not None and bool(step.copies.any()):
        kept = step.kept.nonzero().squeeze(-1)
        adv = _advantages(step.select(kept), options)
        source = copy_sources(step)
        # a row's source among the kept rows, as a position in `kept`; orphans read a 0 appended at the end
        position = torch.full((step.rows,), len(kept), dtype=torch.int64)
        position[kept] = torch.arange(len(kept))
        at = torch.where(source >= 0, position.index_select(0, source.clamp(min=0)), len(kept))
        return torch.cat([adv, adv.new_zeros(1)]).index_select(0, at)
    return _advantages(step, options)


def _advantages(step: HostStep, options: HostOptions) -> Tensor:
    scores = outcome_scores(step, options)
    o = options
    if o.estimator == "gigpo":
        missing = [n for n in ("step_index", "anchor", "step_rewards") if getattr(step, n) is None]
        if missing:
            raise ValueError(f"{o.prefix}.estimator=gigpo needs each row's {', '.join(missing)}")
        return core.gigpo_advantages(scores, step.step_rewards, step.anchor, step.group_index, step.traj_index,
                                     step.step_index, accounting=o.accounting, norm_by_std=o.norm_by_std,
                                     gamma=o.gamma, step_advantage_w=o.step_advantage_w, eps=o.eps)
    return core.outcome_advantages(scores, step.group_index, step.traj_index, accounting=o.accounting,
                                   estimator=o.estimator, norm_by_std=o.norm_by_std, eps=o.eps)


def weights(step: HostStep, options: HostOptions) -> Tensor:
    """W [R, L] float64 (module docstring): MA over the whole step × k mini-batches, native per mini-batch."""
    o = options

    def of(idx: Tensor) -> Tensor:
        return core.token_weights(step.response_mask.index_select(0, idx), step.group_index.index_select(0, idx),
                                  step.traj_index.index_select(0, idx), reducer=o.reducer, mass=o.mass,
                                  loss_scale_factor=o.loss_scale_factor)

    out = torch.zeros(step.response_mask.shape, dtype=torch.float64)
    if o.mass == "native":
        for idx in step.layout:
            out[idx] = of(idx)
        return out
    kept = step.kept.nonzero().squeeze(-1)
    out[kept] = of(kept) * len(step.layout)
    return out


def metrics(step: HostStep, options: HostOptions, w: Tensor) -> dict[str, float]:
    """The ``oma/*`` diagnostics every host logs under the same names, over the rows that carry a trainable
    token and are no copy (docs/hosts.md#metrics). A figure undefined on this step (no success yet, no
    weight) is left out, never NaN."""
    live = step.response_mask.any(-1) & step.kept
    out = {"oma/optimizer_steps": float(len(step.layout)), "oma/padding_copies": float((~step.kept).sum())}
    if not bool(live.any()):
        return out
    idx = live.nonzero().squeeze(-1)
    group, traj_index = step.group_index.index_select(0, idx), step.traj_index.index_select(0, idx)
    structure = core.batch_structure(group, traj_index)
    traj = structure.traj
    rows = traj.counts.to(torch.float64)
    outcome = core.trajectory_outcomes(outcome_scores(step, options).index_select(0, idx), structure)
    stats = core.group_outcome_stats(outcome.index_select(0, traj.inverse), group, traj_index,
                                     accounting="trajectory", structure=structure)
    out.update({"oma/trajectories": float(traj.n), "oma/groups": float(structure.n_groups),
                "oma/rows_per_trajectory/mean": float(rows.mean()), "oma/rows_per_trajectory/max": float(rows.max()),
                "oma/zero_spread_groups": float(stats.degenerate.double().mean())})
    mass = core.segment_sum(w.index_select(0, idx).sum(-1), traj.inverse, traj.n)
    total = float(mass.sum())
    # the audit's rule (docs/audit.md#input-format): the episode's won flag, else outcome > 0
    success = (core.trajectory_outcomes(step.won.index_select(0, idx).double(), structure) > 0
               if step.won is not None else outcome > 0)
    if total > 0:
        out["oma/effective_trajectories"] = total**2 / float((mass * mass).sum())  # Kish (docs/audit.md)
        out["oma/failure_mass_share"] = float(mass[~success].sum()) / total
    if bool(success.any()) and bool((~success).any()):
        out["oma/expansion_ratio"] = float(rows[~success].mean() / rows[success].mean())
    return out


def dump(step: HostStep, options: HostOptions, iteration: int) -> Path:
    """Write the step's batch (its copies left out: the audit counts trajectories) for ``oma audit``, at
    ``<dump_dir>/batches/iter_<iteration>.parquet``."""
    from oma.batchfile import batch_path, write_batch  # pyarrow: only for the hosts that dump

    kept = step.select(step.kept.nonzero().squeeze(-1))
    step_index = kept.step_index if kept.step_index is not None else core.batch_structure(
        kept.group_index, kept.traj_index).position_in_trajectory()
    return write_batch(batch_path(options.dump_dir, iteration), group_index=kept.group_index,
                       traj_index=kept.traj_index, step_index=step_index, scores=outcome_scores(kept, options),
                       response_mask=kept.response_mask, anchor=kept.anchor, step_rewards=kept.step_rewards,
                       won=kept.won)


def carried_advantages(adv: Tensor, weights: Tensor, factor: Tensor) -> Tensor:
    r"""float64, the shapes broadcast to [R, L]: the advantages A' = A·W/f that make a host's own loss
    Σ f·ℓ(A') equal Σ W·ℓ(A), where f is the factor the host's aggregation puts on each token's loss; 0 where
    f = 0 (a token the host does not weigh). Exact for a policy loss positively homogeneous in A,
    ℓ(c·A) = c·ℓ(A) for c ≥ 0 (PPO-clip, dual clip, GSPO): how the verl-agent, ROLL and rLLM integrations
    reach a loss they cannot reweigh directly."""
    adv, weights, factor = torch.broadcast_tensors(adv.double(), weights.double(), factor.double())
    weighed = factor > 0
    return torch.where(weighed, adv * weights / torch.where(weighed, factor, torch.ones_like(factor)),
                       torch.zeros_like(factor))


def align(step: HostStep, options: HostOptions, *, iteration: int | None = None) -> HostResult:
    """Advantages, weights and metrics of one host step; with ``options.dump_dir`` (and ``iteration``), its
    batch for ``oma audit`` too."""
    adv = advantages(step, options)
    w = weights(step, options)
    if options.dump_dir is not None:
        if iteration is None:
            raise ValueError(f"{options.prefix}.dump_dir is set: align() needs the step's iteration to name its file")
        dump(step, options, iteration)
    return HostResult(adv, w, metrics(step, options, w))


def require_version(package: str, supported: str, tested: str) -> None:
    """Refuse, in one line naming both versions, an installed ``package`` outside the ``supported`` series
    (``"0.9"``: any 0.9.x) that its integration was written against and tested on (version ``tested``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(package)
    except PackageNotFoundError:
        installed = None
    if installed is None or not (installed == supported or installed.startswith(supported + ".")):
        raise HostConfigError(f"oma's {package} integration supports {package} {supported}.x (tested on {tested}); "
                              f"the installed {package} is {installed or 'missing'}: pip install '{package}=={tested}'")
