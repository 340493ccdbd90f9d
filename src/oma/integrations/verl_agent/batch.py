r"""OMA on a verl-agent batch, read by verl-agent's column names (docs/verl-agent.md); no verl import.

verl-agent (github.com/langfengQ/verl-agent, vendoring verl 0.3.1) trains on one row per agent step.
At its ``compute_advantage`` call each row carries ``uid`` (its group: one task rolled out n times),
``traj_uid`` (its episode), ``episode_rewards`` (the episode's summed reward, never penalised),
``is_action_valid``, ``response_mask``, ``token_level_rewards`` (the episode reward on the last
response token, minus ``invalid_action_penalty_coef`` when the action was invalid) and, for GiGPO,
``anchor_obs`` and ``step_rewards`` (the step's discounted return, the penalty already subtracted
in place). :func:`align_batch` turns such a batch into an :class:`oma.hosts.HostStep`, calls
:func:`oma.hosts.align`, and returns the advantages, the per-token weights W (loss = Σ W·ℓ over the
step's optimizer steps) and what to write into the batch's ``advantages`` so that verl-agent's own
actor minimises exactly Σ W·ℓ.

**Why the carrier is exact.** verl-agent's actor (:class:`ActorLoss`) gives every valid token of row
r one factor f_r per unit of token loss: its ``agg_loss`` on the row's micro-batch, divided by the
gradient-accumulation count and averaged over data-parallel ranks. The policy losses (PPO-clip with
dual clip, GSPO) are positively homogeneous in the advantage, ℓ(c·A) = c·ℓ(A) for c ≥ 0, so
advantages A' = A·W/f make its loss Σ f·ℓ(A') = Σ W·ℓ(A).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import core, hosts
from oma.integrations._columns import array, finite, floats, groups, ids, matrix, missing, repeats

PREFIX = "algorithm.oma"
"""Where verl-agent's config keeps oma's options (added with ``+algorithm.oma.KEY=VALUE``)."""

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""``actor_rollout_ref.actor.loss_agg_mode`` values of verl-agent's ``agg_loss`` (it has no ``token-sum``)."""

LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo")
"""``actor_rollout_ref.actor.policy_loss.loss_mode`` values of verl-agent's actor; GSPO aggregates its
policy term by ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says."""

MASKED_MEAN_EPS = 1e-8
"""verl's ``masked_mean`` adds it to the token count of ``token-mean``."""


class VerlAgentConfigError(hosts.HostConfigError):
    """A verl-agent setting under which oma's weights would not reach the loss exactly; one line naming the
    key and what to use instead."""


@dataclass(frozen=True)
class ActorLoss:
    r"""How verl-agent's actor (verl 0.3.1 ``DataParallelPPOActor.update_policy``) makes each optimizer
    step's loss from one training step of R rows.

    The driver hands ``dp`` ranks contiguous chunks of R/dp rows. Each rank cuts its chunk into
    mini-batches of ``mini_batch_rows // dp`` rows, one optimizer step each (the ranks' gradients
    averaged), and each mini-batch into micro-batches of ``micro_batch_rows`` rows (by a token budget
    with ``dynamic_bsz``). A micro-batch's loss is ``agg_loss(ℓ, mask, loss_agg_mode)`` divided by the
    micro-batches per mini-batch (times its rows over the mini-batch rows with ``dynamic_bsz``).
    """

    mini_batch_rows: int | None = None
    """Rows of one optimizer step over all ranks, ``ppo_mini_batch_size × rollout.n`` (None: the whole step)."""
    micro_batch_rows: int | None = None
    """``ppo_micro_batch_size_per_gpu`` (None: each rank's mini-batch is one micro-batch)."""
    dp: int = 1
    """Data-parallel ranks of the actor, ``n_gpus_per_node × nnodes / ulysses_sequence_parallel_size``."""
    dynamic_bsz: bool = False
    """``use_dynamic_bsz``: micro-batches by token count, which oma cannot see."""
    loss_agg_mode: str = "token-mean"
    """:data:`AGG_MODES`."""
    loss_mode: str = "vanilla"
    """:data:`LOSS_MODES`."""

    def __post_init__(self) -> None:
        for key, value, allowed in (("loss_agg_mode", self.loss_agg_mode, AGG_MODES),
                                    ("policy_loss.loss_mode", self.loss_mode, LOSS_MODES)):
            if value not in allowed:
                raise VerlAgentConfigError(f"actor_rollout_ref.actor.{key} must be one of {list(allowed)}, got {value!r}")
        for name, value in (("mini_batch_rows", self.mini_batch_rows), ("micro_batch_rows", self.micro_batch_rows),
                            ("dp", self.dp)):
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise VerlAgentConfigError(f"ActorLoss.{name} must be an integer >= 1, got {value!r}")
        if self.mini_batch_rows is not None and self.mini_batch_rows < self.dp:
            raise VerlAgentConfigError(f"ActorLoss.mini_batch_rows={self.mini_batch_rows} is fewer rows than dp={self.dp} ranks")
        micro = self.micro_batch_rows
        if self.mini_batch_rows is not None and micro is not None and not self.dynamic_bsz \
                and (self.mini_batch_rows // self.dp) % micro:
            raise VerlAgentConfigError(
                f"ppo_micro_batch_size_per_gpu={micro} must divide the rows per rank of a mini-batch "
                f"({self.mini_batch_rows} // {self.dp}), as verl-agent's worker asserts")

    @property
    def mode(self) -> str:
        """The aggregation of the policy term: ``loss_agg_mode``, or GSPO's fixed ``seq-mean-token-mean``."""
        return "seq-mean-token-mean" if self.loss_mode == "gspo" else self.loss_agg_mode

    def local_rows(self, rows: int) -> int:
        """Rows of one mini-batch on one rank."""
        return (self.mini_batch_rows if self.mini_batch_rows is not None else rows) // self.dp

    def _ranks(self, rows: int) -> Tensor:
        """[dp, R/dp]: each rank's rows (the driver hands out contiguous chunks)."""
        if rows % self.dp:
            raise ValueError(f"the step's {rows} rows do not split over dp={self.dp} ranks: verl-agent's "
                             "adjust_batch pads the batch to a multiple of the micro-batch rows times the GPUs")
        return torch.arange(rows).view(self.dp, rows // self.dp)

    def minibatches(self, rows: int) -> list[Tensor]:
        """Row indices of each optimizer step: the j-th mini-batch of every rank."""
        per_rank = [chunk.split(self.local_rows(rows)) for chunk in self._ranks(rows)]
        return [torch.cat(step) for step in zip(*per_rank, strict=True)]

    def slots(self, rows: int) -> list[Tensor]:
        """Row indices of each micro-batch; with ``dynamic_bsz``, of each rank's mini-batch (the actor cuts
        it by tokens, which only the token-count-free aggregations do not notice).

        Raises:
            ValueError: R does not split into equal rank chunks, or (fixed micro-batches) a rank's rows
                into whole micro-batches: verl-agent's ``adjust_batch`` pads the batch so that they do.
        """
        ranks, local, micro = self._ranks(rows), self.local_rows(rows), self._micro(rows)
        if self.micro_batch_rows is not None and not self.dynamic_bsz and ranks.shape[1] % micro:
            raise ValueError(f"a rank's {ranks.shape[1]} rows are no whole number of micro-batches of "
                             f"ppo_micro_batch_size_per_gpu={micro} rows: verl-agent's adjust_batch pads the batch so that they are")
        return [piece for chunk in ranks for mini in chunk.split(local) for piece in mini.split(micro)]

    def _micro(self, rows: int) -> int:
        """Rows of a fixed micro-batch (with ``dynamic_bsz``: the rank's mini-batch, cut by tokens)."""
        return self.local_rows(rows) if self.dynamic_bsz or self.micro_batch_rows is None else self.micro_batch_rows

    def check_carrier(self) -> None:
        """Refuse the aggregations whose factor f oma cannot know: with ``dynamic_bsz`` the actor cuts
        micro-batches by tokens, and ``token-mean`` / ``seq-mean-token-sum-norm`` normalise by them."""
        if self.dynamic_bsz and self.mode in ("token-mean", "seq-mean-token-sum-norm"):
            raise VerlAgentConfigError(
                f"actor_rollout_ref.actor.use_dynamic_bsz=True with loss_agg_mode={self.mode}: the actor normalises each "
                "micro-batch it cuts by tokens, which oma cannot see when it computes advantages; use loss_agg_mode="
                "seq-mean-token-sum or seq-mean-token-mean (exact for any split), or use_dynamic_bsz=False")

    def token_factor(self, response_mask: Tensor, *, exact: bool = True, mode: str | None = None) -> Tensor:
        r"""f_r, float64 [R]: what the actor multiplies each valid token loss of row r by, over the step
        (verl-agent's own loss is Σ f·mask·ℓ).

        A micro-batch of B rows weighs 1/(GA·dp) in its optimizer step with fixed micro-batches (GA =
        local/B, their count per mini-batch) and B/(local·dp) with ``dynamic_bsz``, times ``agg_loss``'s
        coefficient: 1/(M + 1e-8) for ``token-mean`` (M its valid tokens), 1/B for
        ``seq-mean-token-sum``, 1/(n_r·B) for ``seq-mean-token-mean`` and GSPO (n_r the row's valid
        tokens; 0 for a row without one), 1/L for ``seq-mean-token-sum-norm`` (L the padded length; in
        verl 0.3.1 this mode does not divide by rows). The two that count rows do not depend on the split,
        so they are exact with ``dynamic_bsz`` too; the other two then take each rank's mini-batch as one
        micro-batch, which ``exact`` refuses (:meth:`check_carrier`). ``mode``: another term's aggregation
        (the KL loss and entropy bonus use ``loss_agg_mode`` even under GSPO); default the policy term's.
        """
        if exact:
            self.check_carrier()
        rows, length = response_mask.shape
        n = response_mask.sum(-1).to(torch.float64)
        mode, per_step, micro = mode or self.mode, self.local_rows(rows) * self.dp, self._micro(rows)
        out = torch.empty(rows, dtype=torch.float64)
        for idx in self.slots(rows):
            share = (len(idx) if self.dynamic_bsz else micro) / per_step  # B/(local·dp) = 1/(GA·dp)
            if mode == "token-mean":
                out[idx] = share / (float(n[idx].sum()) + MASKED_MEAN_EPS)
            elif mode == "seq-mean-token-sum":
                out[idx] = share / len(idx)
            elif mode == "seq-mean-token-mean":
                out[idx] = torch.where(n[idx] > 0, share / (len(idx) * n[idx].clamp_min(1.0)), torch.zeros_like(n[idx]))
            else:
                out[idx] = share / length
        return out


@dataclass(frozen=True)
class VerlAgentResult:
    adv: Tensor
    """float64 [R]: each row's advantage A."""
    weights: Tensor
    """float64 [R, L]: the per-token loss weights W; the step's optimizer steps together minimise Σ W·ℓ."""
    advantages: Tensor
    """float32 [R, L]: what goes into the batch's ``advantages``: A on the response mask under ``mass=native``
    (verl-agent's own), A·W/f (:meth:`ActorLoss.token_factor`) under Mass Alignment."""
    metrics: dict[str, float]
    """``oma/*`` (:func:`oma.hosts.metrics` on W)."""
    is_copy: Tensor
    """bool [R]: the padding copies."""


# ------------------------------------------------------------------------------------------ columns


def _rows(batch: Mapping[str, Any]) -> int:
    if "response_mask" not in batch:
        raise ValueError(missing(batch, "response_mask", "bool/0-1 [R, L], the trainable response tokens "
                                  "(verl-agent's batch.batch['response_mask'])"))
    return len(batch["response_mask"])


def _groups(batch: Mapping[str, Any], rows: int) -> tuple[Tensor, Tensor]:
    """(group_index, traj_index) from ``uid`` and ``traj_uid``; a ``traj_uid`` under two ``uid`` is refused."""
    return groups(batch, rows, group=("uid", "the group id (one task rolled out n times) verl-agent's rollout sets in "
                                      "batch.non_tensor_batch['uid']"),
                  traj=("traj_uid", "the episode id verl-agent's rollout sets in batch.non_tensor_batch['traj_uid']"),
                  hint="; pass verl-agent's own uid and traj_uid columns")


def scores(batch: Mapping[str, Any], rows: int, invalid_penalty: float) -> Tensor:
    """Each row's score s_r as verl-agent computes it (``token_level_rewards.sum(-1)``).

    From ``token_level_rewards`` when the batch has it (the penalty, and a KL penalty under
    ``use_kl_in_reward``, already in); else ``episode_rewards − invalid_penalty·(1 − is_action_valid)``,
    what ``apply_invalid_action_penalty`` makes of the reward manager's score.
    """
    if "token_level_rewards" in batch:
        return finite("token_level_rewards", matrix(batch, "token_level_rewards", rows).to(torch.float64).sum(-1))
    episode = floats(batch, "episode_rewards", rows, "the episode's reward verl-agent stamps on each of its rows, or "
                      "pass 'token_level_rewards'")
    if invalid_penalty == 0:
        return episode
    valid = array(batch, "is_action_valid", rows, f"verl-agent subtracts invalid_action_penalty_coef="
                   f"{invalid_penalty:g} from the score of each invalid action; pass is_action_valid, or "
                   "invalid_penalty=0 for a run with use_invalid_action_penalty=False")
    return episode - invalid_penalty * (1.0 - torch.as_tensor(valid.astype(np.float64)))


def copies(batch: Mapping[str, Any], rows: int, traj_index: Tensor, is_copy: Any = None) -> Tensor | None:
    """bool [R]: the padding copies ``adjust_batch`` appended, from ``is_copy`` (argument, then column), or
    from a ``row_id`` column (the row's index before ``adjust_batch``; a copy repeats its original's, so a
    later row of the same trajectory with an earlier row's ``row_id`` is a copy). None when there is neither."""
    if is_copy is not None or "is_copy" in batch:
        given = {"is_copy": is_copy} if is_copy is not None else batch
        flags = array(given, "is_copy", rows, "")
        if flags.dtype != bool and not np.isin(flags, (0, 1)).all():
            raise ValueError("is_copy must be booleans (or 0/1), one per row")
        return torch.as_tensor(flags.astype(bool))
    if "row_id" not in batch:
        return None
    return repeats(traj_index, array(batch, "row_id", rows, ""))


def float32_zero_spread(values: Tensor, group: Tensor, *, eps: float = 1e-6) -> Tensor:
    r"""float32 [R]: what verl-agent's std-normalised advantage, (x − μ̂)/(σ̂ + ε) in float32, gives the rows of
    groups of two or more equal values x, whose exact advantage (oma's) is 0; 0 on every other row.

    μ̂ and σ̂ are torch's float32 mean and sample std of the n equal values, as verl-agent computes them
    (``torch.mean``/``torch.std`` of the group's float32 scores). Where n·x is not exact in float32, μ̂ is an
    ulp or so off x and σ̂ of the same order (~1e-7 for x near 1), so ε = 1e-6 turns rounding into an
    advantage of up to ±0.5: docs/verl-agent.md#float32-zero-spread. ``values``: the float32 scores (or
    step returns) as verl-agent holds them; ``group``: int [R].
    """
    values = values.to(torch.float32)
    n = int(group.max()) + 1 if len(group) else 0
    low = torch.full((n,), float("inf")).scatter_reduce(0, group, values, reduce="amin")
    high = torch.full((n,), float("-inf")).scatter_reduce(0, group, values, reduce="amax")
    count = torch.zeros(n, dtype=torch.int64).index_add_(0, group, torch.ones_like(group))
    flat = ((low == high) & (count >= 2)).index_select(0, group)
    out = torch.zeros(len(values), dtype=torch.float32)
    for size, x in {(int(count[g]), float(values[r])) for r, g in zip(flat.nonzero().flatten().tolist(),
                                                                       group[flat].tolist(), strict=True)}:
        same = torch.full((size,), x, dtype=torch.float32)
        residue = (same[0] - same.mean()) / (same.std() + eps)
        out[flat & (values == x) & (count.index_select(0, group) == size)] = residue
    return out


# ------------------------------------------------------------------------------------------ options


def read_options(given: hosts.HostOptions | Mapping[str, Any] | None) -> hosts.HostOptions:
    """The run's :class:`oma.hosts.HostOptions` (a mapping is read under ``algorithm.oma``), with γ = 0:
    verl-agent's ``step_rewards`` are already its discounted returns (``compute_step_discounted_returns``
    with ``algorithm.gamma``), so the step term takes them as they are."""
    if isinstance(given, hosts.HostOptions):
        opts = given
    else:
        node = dict(given or {})
        if node.get("gamma") is not None:
            raise VerlAgentConfigError(
                f"{PREFIX}.gamma is not an option here: verl-agent discounts step_rewards itself "
                "(compute_step_discounted_returns with algorithm.gamma) before oma sees them; set algorithm.gamma")
        opts = hosts.HostOptions.from_mapping({k: v for k, v in node.items() if k != "gamma"}, prefix=PREFIX)
    if opts.outcome != "mean":
        raise VerlAgentConfigError(f"{opts.prefix}.outcome={opts.outcome!r}: verl-agent's rows carry no step order "
                                   "after balance_batch; a trajectory's outcome is the mean of its rows' scores (outcome=mean)")
    return dataclasses.replace(opts, gamma=0.0)


def _check_penalty(invalid_penalty: float) -> None:
    if not (isinstance(invalid_penalty, int | float) and math.isfinite(invalid_penalty) and invalid_penalty >= 0):
        raise VerlAgentConfigError(
            f"actor_rollout_ref.actor.invalid_action_penalty_coef must be a finite number >= 0, got {invalid_penalty!r}")


# ------------------------------------------------------------------------------------------ the step


def host_step(batch: Mapping[str, Any], opts: hosts.HostOptions, actor: ActorLoss, *, invalid_penalty: float = 0.1,
              is_copy: Any = None) -> hosts.HostStep:
    """The :class:`oma.hosts.HostStep` of a verl-agent batch: ids from ``uid``/``traj_uid``, scores by
    :func:`scores`, GiGPO's ``anchor_obs``/``step_rewards``, the actor's optimizer steps
    (:meth:`ActorLoss.minibatches`), the copies."""
    rows = _rows(batch)
    mask = matrix(batch, "response_mask", rows)
    group, traj = _groups(batch, rows)
    anchor = step_rewards = None
    if opts.estimator == "gigpo":
        for name, what in (("anchor_obs", "GiGPO's step term groups the rows of a uid by their anchor observation "
                            "(batch.non_tensor_batch['anchor_obs'])"),
                           ("step_rewards", "GiGPO's step term compares the rows' discounted returns "
                            "(batch.batch['step_rewards'], set before adjust_batch)")):
            if name not in batch:
                raise ValueError(missing(batch, name, f"{opts.prefix}.estimator=gigpo needs it: {what}"))
        anchor = ids(array(batch, "anchor_obs", rows, ""))[0]
        step_rewards = floats(batch, "step_rewards", rows, "the step's discounted return")
    flags = copies(batch, rows, traj, is_copy)
    if flags is None and opts.aligned:
        raise ValueError(
            "no 'row_id' or 'is_copy' column: verl-agent's adjust_batch pads the batch with copies of random rows, which "
            f"{opts.prefix}.accounting={opts.accounting} mass={opts.mass} must not count; set "
            "batch.non_tensor_batch['row_id'] = np.arange(len(batch)) just before adjust_batch (docs/verl-agent.md), or "
            "pass is_copy")
    return hosts.HostStep(group_index=group, traj_index=traj, scores=scores(batch, rows, invalid_penalty),
                          response_mask=mask.bool(), step_index=core.batch_structure(group, traj).position_in_trajectory(),
                          anchor=anchor, step_rewards=step_rewards, minibatches=actor.minibatches(rows), copies=flags)


def _check_copies(step: hosts.HostStep) -> None:
    """Refuse copy marks that mark a row no other row repeats: adjust_batch's copies are exact duplicates."""
    orphan = (hosts.copy_sources(step) < 0).nonzero()
    if orphan.numel():
        raise ValueError(f"row {int(orphan[0, 0])} is marked as a padding copy, but no other row of its trajectory has "
                         "its anchor_obs and step_rewards: is_copy / row_id must mark only adjust_batch's duplicates")


def _check_row_ids(step: hosts.HostStep, content: Tensor) -> None:
    """Refuse copy marks set after ``adjust_batch``: its copies repeat a row token for token (prompt and
    response), so a row that repeats an earlier row of its trajectory without being marked means that
    ``row_id`` numbered the rows after the copies existed (every id then unique, no copy found)."""
    key = torch.cat([step.traj_index.unsqueeze(-1), content.long()], dim=-1)
    inverse = torch.unique(key, dim=0, return_inverse=True)[1]
    rows = torch.arange(step.rows)
    first = torch.full((step.rows,), step.rows).scatter_reduce(0, inverse, rows, reduce="amin")
    unmarked = (first.index_select(0, inverse) != rows) & ~step.copies
    if unmarked.any():
        raise VerlAgentConfigError(
            f"{int(unmarked.sum())} rows repeat another row of their trajectory token for token (adjust_batch's padding "
            "copies) but row_id does not mark them: the row_id line runs after adjust_batch; put "
            "batch.non_tensor_batch['row_id'] = np.arange(len(batch)) on the line just before "
            "batch = adjust_batch(self.config, batch) (docs/verl-agent.md#quick-start)")


def unaligned_metrics(step: hosts.HostStep, actor: ActorLoss, w: Tensor, coef: float) -> dict[str, float]:
    r"""How much of the step's objective the actor's KL loss and entropy bonus keep outside Mass Alignment
    (docs/verl-agent.md#the-whole-objective). Both terms weigh each valid token by f (``loss_agg_mode``'s
    factor, :meth:`ActorLoss.token_factor`) times their coefficient, c in all:

    * ``oma/unaligned_share``: c·Σf / (ΣW + c·Σf), their share of the per-token loss weight;
    * ``oma/unaligned_mass_moved``: ½·Σ_τ |f-mass_τ/Σf − W-mass_τ/ΣW|, the share of their mass that lies on
      other trajectories than Mass Alignment puts it (0: where MA would, 1: wholly elsewhere).

    Left out, never NaN, when no token carries weight."""
    f = actor.token_factor(step.response_mask, exact=False, mode=actor.loss_agg_mode).unsqueeze(-1) * step.response_mask
    outside, inside = coef * float(f.sum()), float(w.sum())
    if outside <= 0 or inside <= 0:
        return {}
    n = int(step.traj_index.max()) + 1
    by_traj = [core.segment_sum(x.sum(-1), step.traj_index, n) for x in (f, w)]
    moved = 0.5 * float((by_traj[0] / by_traj[0].sum() - by_traj[1] / by_traj[1].sum()).abs().sum())
    return {"oma/unaligned_share": outside / (inside + outside), "oma/unaligned_mass_moved": moved}


def align_batch(batch: Mapping[str, Any], options: hosts.HostOptions | Mapping[str, Any] | None = None, *,
                actor: ActorLoss | None = None, invalid_penalty: float = 0.1, is_copy: Any = None,
                iteration: int | None = None, unaligned_coef: float = 0.0) -> VerlAgentResult:
    r"""OA and MA on one verl-agent training step, by its column names (module docstring).

    * **Advantages** (:func:`oma.hosts.advantages`, estimator ``grpo``, ``rloo`` or ``gigpo``). Under
      ``accounting=row`` over every row, copies included: verl-agent's own numbers. Under
      ``accounting=trajectory`` over the rows that are no copy, each copy taking its original's A.
    * **Weights**, loss = Σ W·ℓ over the step's optimizer steps. ``mass=native``: verl-agent's own,
      f·mask (:meth:`ActorLoss.token_factor`; with ``dynamic_bsz`` and a token-counting aggregation,
      each rank's mini-batch taken as one micro-batch). ``uniform``/``group``:
      :func:`oma.core.token_weights` over the rows that are no copy (copies weigh 0), scaled to the
      step's native total R/(local mini-batch rows·dp), the mini-batches' worth of rows.
    * **advantages** for the batch: A under ``native``; A·W/f under MA (:meth:`ActorLoss.token_factor`).

    Args:
        batch: columns by verl-agent's names (numpy arrays, lists or tensors; string ids welcome):
            ``uid``, ``traj_uid``, ``response_mask`` [R, L]; ``token_level_rewards`` [R, L], or
            ``episode_rewards`` and ``is_action_valid``; for GiGPO ``anchor_obs`` and ``step_rewards``;
            the copies as ``is_copy`` or ``row_id`` (:func:`copies`); ``input_ids`` [R, P + L], when
            given, checks them (a repeated row that is not marked is refused: the patch's ``row_id``
            line runs after ``adjust_batch``).
        options: :class:`oma.hosts.HostOptions`, or a mapping read under ``algorithm.oma``
            (γ is fixed to 0, see :func:`read_options`). ``reducer`` is the aggregation inside a
            trajectory under MA; under ``mass=native`` the actor's own aggregation stands.
        actor: the actor's layout and aggregation (default: the whole step one micro-batch, token-mean).
        invalid_penalty: ``invalid_action_penalty_coef``, used when the batch has no ``token_level_rewards``.
        is_copy: bool [R], overrides the batch's copy columns.
        iteration: the step's number, for ``dump_dir``.
        unaligned_coef: the summed coefficients of the actor's KL loss and entropy bonus, trained outside
            Mass Alignment (``allow_unaligned``); > 0 adds :func:`unaligned_metrics` under MA.

    Raises:
        ValueError: a missing or malformed column, named, and what to pass instead; a refused
            setting as :class:`VerlAgentConfigError`. Nothing is written before.
    """
    opts, actor = read_options(options), actor or ActorLoss()
    _check_penalty(invalid_penalty)
    step = host_step(batch, opts, actor, invalid_penalty=invalid_penalty, is_copy=is_copy)
    native = opts.mass == "native"
    factor = actor.token_factor(step.response_mask, exact=not native)
    if step.copies is not None:
        _check_copies(step)
        if "input_ids" in batch:
            _check_row_ids(step, matrix(batch, "input_ids", step.rows))
    result = hosts.align(step, opts, iteration=iteration)  # the last refusal is behind us: it may write the dump
    adv = result.adv.double()
    if native:  # verl-agent's own loss, and its own advantages
        w = factor.unsqueeze(-1) * step.response_mask
        token_adv = adv.unsqueeze(-1) * step.response_mask
    else:  # hosts' k mini-batches' worth rescaled to the step's native total, R/(local·dp) of them
        w = result.weights * (step.rows / (actor.local_rows(step.rows) * actor.dp * len(step.layout)))
        token_adv = hosts.carried_advantages(adv.unsqueeze(-1), w, factor.unsqueeze(-1))
    metrics = hosts.metrics(step, opts, w)
    if unaligned_coef > 0 and not native:
        metrics.update(unaligned_metrics(step, actor, w, unaligned_coef))
    return VerlAgentResult(adv, w, token_adv.to(torch.float32), metrics, step.kept.logical_not())
