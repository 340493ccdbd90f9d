r"""Mass Alignment on an rLLM verl-backend batch, read by rLLM's column names (docs/rllm.md); no rLLM or verl import.

rLLM (github.com/rllm-org/rllm, written against commit 9beb6e0f, which pins verl 0.8.0) turns each
trajectory into training rows in ``rllm/trainer/verl/transform.py``: the steps whose prompt extends the
previous step's full sequence merge into one row; a step that does not (a re-rendered chat template,
context management) starts a new row. Every row of a trajectory carries ``step_ids`` = the trajectory's
``uid`` and ``trajectory_ids`` = ``f"{task_id}_{name}"`` (its group: rLLM groups trajectories by task and
agent name). The advantage is one scalar per trajectory from its ``TrajectoryGroup`` (Outcome Alignment by
construction), broadcast onto each row's ``response_mask`` in ``update_dataproto_with_advantages``.

The mass is not aligned: verl 0.8.0's engine loss weighs a row by ``loss_agg_mode`` alone, so a trajectory
cut into k rows carries k times the mass under the ``seq-mean-*`` modes and mass ∝ tokens under
``token-mean``. :func:`align_batch` keeps rLLM's advantages and rescales them so that verl's own loss
becomes Σ W·ℓ with W from :func:`oma.hosts.weights`.

**Why the carrier is exact.** verl 0.8.0's ``ppo_loss`` (``verl/workers/utils/losses.py``) aggregates each
micro-batch by ``agg_loss`` with the *global* mini-batch figures: ``token-mean`` divides by the valid tokens
of the whole mini-batch over all data-parallel ranks, the ``seq-mean-*`` modes by ``global_batch_size``,
which rLLM sets to a fixed rollout count (``_pad_dataproto_to_world_size``); each times ``dp_size``, and the
ranks' gradients are averaged. So every valid token of row r gets one factor f_r per unit of token loss,
whatever the micro-batching (:meth:`ActorLoss.token_factor`). The policy losses (PPO-clip, dual clip) are
positively homogeneous in A, so advantages A' = A·W/f make verl's loss Σ f·ℓ(A') = Σ W·ℓ(A).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import hosts
from oma.integrations._columns import ids

PREFIX = "rllm.algorithm.oma"
"""Where rLLM's config keeps oma's options (``+rllm.algorithm.oma.KEY=VALUE``)."""

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""``actor_rollout_ref.actor.loss_agg_mode`` values of verl 0.8.0's ``agg_loss``."""

LOSS_MODES: tuple[str, ...] = ("vanilla",)
"""``actor_rollout_ref.actor.policy_loss.loss_mode`` values whose loss is positively homogeneous in A and
aggregated by ``loss_agg_mode`` with the global figures."""

SEQ_MEAN_EPS = 1e-8
"""verl's ``seq-mean-token-mean`` adds it to each row's token count."""

REFUSED_OPTIONS: dict[str, str] = {
    key: "is rLLM's own: oma keeps rLLM's advantages (rllm.algorithm.adv_estimator and its options), which are "
         "already one scalar per trajectory of each TrajectoryGroup"
    for key in ("estimator", "norm_by_std", "gamma", "step_advantage_w", "eps", "outcome")
}
"""The :class:`oma.hosts.HostOptions` keys rLLM's own config decides."""


class RllmConfigError(hosts.HostConfigError):
    """An rLLM setting under which oma's weights would not reach the loss exactly; one line naming the key."""


@dataclass(frozen=True)
class ActorLoss:
    r"""How rLLM's verl backend (verl 0.8.0 engine workers) turns per-token losses into the step's loss.

    The driver hands ``dp`` ranks contiguous chunks of R/dp rows (R padded by rLLM to a multiple of
    ``mini_batch_rows``); each rank takes mini-batches of ``mini_batch_rows // dp`` rows, one optimizer step
    each, in order unless ``shuffle``.
    """

    mini_batch_rows: int | None = None
    """``meta_info['rllm_actor_mini_batch_size']``, rows of one optimizer step over all ranks (None: the whole step)."""
    global_batch_size: int | None = None
    """``meta_info['rllm_actor_global_batch_size']``, the seq-mean denominator (None: ``mini_batch_rows``, rLLM's fallback)."""
    dp: int = 1
    """Data-parallel ranks of the actor."""
    loss_agg_mode: str = "token-mean"
    """:data:`AGG_MODES` (verl's default ``token-mean``; ``rllm.algorithm.loss_agg_mode`` overrides it)."""
    loss_mode: str = "vanilla"
    """:data:`LOSS_MODES`."""
    loss_scale_factor: float | None = None
    """``actor_rollout_ref.actor.loss_scale_factor``: L of ``seq-mean-token-sum-norm``."""
    shuffle: bool = False
    """``actor_rollout_ref.actor.shuffle``: mini-batches drawn at random."""

    def __post_init__(self) -> None:
        for key, value, allowed in (("loss_agg_mode", self.loss_agg_mode, AGG_MODES),
                                    ("policy_loss.loss_mode", self.loss_mode, LOSS_MODES)):
            if value not in allowed:
                raise RllmConfigError(f"actor_rollout_ref.actor.{key} must be one of {list(allowed)} for oma's rLLM "
                                      f"integration, got {value!r}")
        for name, value in (("mini_batch_rows", self.mini_batch_rows), ("global_batch_size", self.global_batch_size),
                            ("dp", self.dp)):
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise RllmConfigError(f"ActorLoss.{name} must be an integer >= 1, got {value!r}")
        if self.mini_batch_rows is not None and self.mini_batch_rows % self.dp:
            raise RllmConfigError(f"ActorLoss.mini_batch_rows={self.mini_batch_rows} must be a multiple of dp={self.dp}, "
                                  "as verl's train_mini_batch asserts")
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_scale_factor is None:
            # verl divides by the padded width of each micro-batch, which the no-padding engine picks per micro-batch
            raise RllmConfigError("actor_rollout_ref.actor.loss_scale_factor must be set with loss_agg_mode="
                                  "seq-mean-token-sum-norm: without it verl divides by each micro-batch's padded "
                                  "width, which oma cannot see")

    def check_carrier(self, rows: int) -> None:
        """Refuse ``token-mean`` with shuffled mini-batches: verl normalises by the tokens of a mini-batch
        that oma cannot know. One mini-batch, or any ``seq-mean-*`` mode, is exact under any order."""
        if self.loss_agg_mode == "token-mean" and self.shuffle and len(self.minibatches(rows)) > 1:
            raise RllmConfigError("actor_rollout_ref.actor.shuffle=True with loss_agg_mode=token-mean and several "
                                  "mini-batches: verl normalises by each random mini-batch's tokens, which oma cannot "
                                  "see; use shuffle=False or a seq-mean-* loss_agg_mode")

    def minibatches(self, rows: int) -> list[Tensor]:
        """Row indices of each optimizer step: the j-th mini-batch of every rank (with ``shuffle``, the
        composition is random; only the split-free modes use it then)."""
        mini = self.mini_batch_rows if self.mini_batch_rows is not None else rows
        if rows % mini or rows % self.dp:
            raise ValueError(f"the step's {rows} rows are no whole number of mini-batches of {mini} rows over dp={self.dp} "
                             "ranks: rLLM's _pad_dataproto_to_world_size pads the batch so that they are")
        chunks = torch.arange(rows).view(self.dp, rows // self.dp)
        per_rank = [chunk.split(mini // self.dp) for chunk in chunks]
        return [torch.cat(step) for step in zip(*per_rank, strict=True)]

    def token_factor(self, response_mask: Tensor) -> Tensor:
        r"""f_r, float64 [R]: what verl multiplies each valid token loss of row r by, over the step.

        ``token-mean``: 1/M (M the valid tokens of the row's mini-batch over all ranks);
        ``seq-mean-token-sum``: 1/G (G = ``global_batch_size``); ``seq-mean-token-mean``: 1/(G·(n_r + 1e-8));
        ``seq-mean-token-sum-norm``: 1/(G·L). ``dp_size`` times the local loss, averaged over ranks: 1.
        A row without a valid token gets 0 (verl's ``seq_mask``).
        """
        rows = response_mask.shape[0]
        self.check_carrier(rows)
        n = response_mask.sum(-1).to(torch.float64)
        layout = self.minibatches(rows)
        g = float(self.global_batch_size if self.global_batch_size is not None else len(layout[0]))
        out = torch.zeros(rows, dtype=torch.float64)
        for idx in layout:
            if self.loss_agg_mode == "token-mean":
                out[idx] = 1.0 / max(float(n[idx].sum()), 1.0)
            elif self.loss_agg_mode == "seq-mean-token-sum":
                out[idx] = 1.0 / g
            elif self.loss_agg_mode == "seq-mean-token-mean":
                out[idx] = 1.0 / (g * (n[idx] + SEQ_MEAN_EPS))
            else:
                out[idx] = 1.0 / (g * float(self.loss_scale_factor))
        return torch.where(n > 0, out, torch.zeros_like(out))


@dataclass(frozen=True)
class RllmResult:
    weights: Tensor
    """float64 [R, L]: per-token loss weights W; the step's optimizer steps together minimise Σ W·ℓ."""
    advantages: Tensor
    """float32 [R, L]: what goes into the batch's ``advantages``: rLLM's own under ``mass=native``, A·W/f under MA."""
    metrics: dict[str, float]
    """``oma/*`` (:func:`oma.hosts.metrics` on W)."""


def read_options(given: hosts.HostOptions | Mapping[str, Any] | None, actor: ActorLoss) -> hosts.HostOptions:
    """The OMA options under ``rllm.algorithm.oma``; ``reducer`` defaults to the actor's ``loss_agg_mode``
    (the aggregation rLLM asked for, now inside each trajectory). ``accounting=row`` is refused: rLLM's
    statistics are over the trajectories of a TrajectoryGroup and oma keeps them."""
    opts = given if isinstance(given, hosts.HostOptions) else hosts.HostOptions.from_mapping(
        given, prefix=PREFIX, refused=REFUSED_OPTIONS, reducer=actor.loss_agg_mode,
        loss_scale_factor=actor.loss_scale_factor)
    if opts.accounting != "trajectory":
        raise RllmConfigError(f"{PREFIX}.accounting must be 'trajectory' (rLLM's own: one advantage per trajectory of "
                              f"each TrajectoryGroup), got {opts.accounting!r}")
    return opts


def _column(batch: Mapping[str, Any], name: str, rows: int, what: str) -> np.ndarray:
    if name not in batch:
        raise ValueError(f"missing column {name!r}: {what}; found {sorted(map(str, batch)) or 'no columns'}")
    value = batch[name]
    out = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value, dtype=object)
    if out.ndim == 0 or out.shape[0] != rows:
        raise ValueError(f"column {name!r} must have one entry per row ({rows} rows), got shape {out.shape}")
    return out


def _matrix(batch: Mapping[str, Any], name: str, rows: int | None) -> Tensor:
    if name not in batch:
        raise ValueError(f"missing column {name!r}: [R, L] (rLLM's batch.batch[{name!r}]); "
                         f"found {sorted(map(str, batch)) or 'no columns'}")
    value = batch[name]
    out = value.detach().cpu() if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
    if out.dim() != 2 or (rows is not None and out.shape[0] != rows):
        raise ValueError(f"column {name!r} must be [R, L]{'' if rows is None else f' with R = {rows} rows'}, "
                         f"got shape {tuple(out.shape)}")
    return out


def host_step(batch: Mapping[str, Any], actor: ActorLoss) -> hosts.HostStep:
    """The step in oma's ids: group ``trajectory_ids``, trajectory ``step_ids``, score the row's
    ``traj_rewards`` sum, copies ``is_pad_step``, mini-batches :meth:`ActorLoss.minibatches`."""
    mask = _matrix(batch, "response_mask", None)
    rows = mask.shape[0]
    traj_col = _column(batch, "step_ids", rows, "each row's trajectory uid (rLLM's non_tensor_batch['step_ids'])")
    group_col = _column(batch, "trajectory_ids", rows, "each row's group f'{task_id}_{name}' "
                        "(rLLM's non_tensor_batch['trajectory_ids'])")
    pad = (torch.as_tensor(_column(batch, "is_pad_step", rows, "bool per row").astype(bool))
           if "is_pad_step" in batch else torch.zeros(rows, dtype=torch.bool))
    traj_index, traj_labels = ids(traj_col)
    group_index, _ = ids(group_col)
    kept = (~pad).nonzero().squeeze(-1)
    if len(kept):
        # a trajectory lies in one group: rLLM keys both by the trajectory, a uid reused across tasks is no trajectory
        pairs = torch.unique(torch.stack([traj_index[kept], group_index[kept]], -1), dim=0)
        counts = torch.bincount(pairs[:, 0], minlength=len(traj_labels))
        if bool((counts > 1).any()):
            bad = traj_labels[int((counts > 1).nonzero()[0, 0])]
            raise ValueError(f"column 'step_ids' must be unique per trajectory: {bad!r} appears under two "
                             "'trajectory_ids' (groups)")
    rewards = _matrix(batch, "traj_rewards", rows).to(torch.float64)
    scores = rewards.sum(-1)
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"column 'traj_rewards' has a NaN or infinite value at row {int((~torch.isfinite(scores)).nonzero()[0, 0])}")
    return hosts.HostStep(group_index=group_index, traj_index=traj_index, scores=scores, response_mask=mask.bool(),
                          minibatches=actor.minibatches(rows), copies=pad if bool(pad.any()) else None)


def align_batch(batch: Mapping[str, Any], options: hosts.HostOptions | Mapping[str, Any] | None = None, *,
                actor: ActorLoss | None = None, iteration: int | None = None) -> RllmResult:
    r"""Mass Alignment on one rLLM training step, by its column names (module docstring).

    * **Advantages**: rLLM's own (``advantages`` [R, L], from its estimator over TrajectoryGroups), kept.
    * **Weights**, loss = Σ W·ℓ over the step's optimizer steps. ``mass=native``: rLLM's own, f·mask
      (:meth:`ActorLoss.token_factor`). ``uniform``/``group``: :func:`oma.hosts.weights`, each trajectory its
      share of the step (k mini-batches' worth, 1 per optimizer step) whatever rows merging made of it;
      padding rows weigh 0.
    * **advantages** for the batch: unchanged under ``native``; A·W/f under MA.

    Args:
        batch: columns by rLLM's names (tensors, numpy arrays or lists; string ids welcome): ``step_ids``,
            ``trajectory_ids``, ``response_mask`` [R, L], ``advantages`` [R, L], ``traj_rewards`` [R, L],
            optionally ``is_pad_step``.
        options: :class:`oma.hosts.HostOptions`, or a mapping read under ``rllm.algorithm.oma``
            (:func:`read_options`).
        actor: the actor's layout and aggregation (default: one mini-batch, token-mean).
        iteration: the step's number, for ``dump_dir``.

    Raises:
        ValueError: a missing or malformed column, named; a refused setting as :class:`RllmConfigError`.
            Nothing is written before.
    """
    actor = actor or ActorLoss()
    opts = read_options(options, actor)
    step = host_step(batch, actor)
    adv = _matrix(batch, "advantages", step.rows).to(torch.float64)
    if adv.shape != step.response_mask.shape:
        raise ValueError(f"column 'advantages' must have response_mask's shape {tuple(step.response_mask.shape)}, "
                         f"got {tuple(adv.shape)}")
    factor = actor.token_factor(step.response_mask)
    if opts.mass == "native":
        w = factor.unsqueeze(-1) * step.response_mask
        token_adv = adv * step.response_mask
    else:
        w = hosts.weights(step, opts)
        token_adv = hosts.carried_advantages(adv, w, factor.unsqueeze(-1))
    if opts.dump_dir is not None:  # the last refusal is behind us
        if iteration is None:
            raise ValueError(f"{PREFIX}.dump_dir is set: align_batch() needs the step's iteration to name its file")
        hosts.dump(step, opts, iteration)
    return RllmResult(w, token_adv.to(torch.float32), hosts.metrics(step, opts, w))
