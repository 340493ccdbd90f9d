r"""SkyRL's step-wise training batch and config read into the host contract (:mod:`oma.hosts`).

Pure functions over torch tensors, importable without SkyRL; the trainer in
:mod:`oma.integrations.skyrl.trainer` calls them, then :func:`oma.hosts.advantages`,
:func:`oma.hosts.weights`, :func:`oma.hosts.metrics` and :func:`oma.hosts.dump`. docs/skyrl.md explains
the mapping.

**What SkyRL's batch holds** (``skyrl`` 0.4.0, ``generator.step_wise_trajectories=true``): one row
per agent step; ``metadata["uids"]`` the prompt of each row (the GRPO *group*);
``metadata["is_last_step"]`` True on the last step of each trajectory, whose rows are contiguous;
``rewards`` per token, of which step-wise training uses the last step's sum (the trajectory's
outcome); ``loss_mask`` 0/1, the trainable tokens. SkyRL pads the batch for data parallelism with
rows ``uid = "pad{i}"``, ``is_last_step = True`` and an all-zero ``loss_mask`` after the others
(``metadata["pad_size"]`` of them), outside every mini-batch: they are left out of the step.

**Why scaling the advantages is exact.** SkyRL's worker minimises, per optimizer step,
``Σ_rows Σ_t loss_mask·ℓ(A')`` (``reduce_loss`` is a masked sum; the worker multiplies by the
data-parallel size before the gradient all-reduce averages it), after
``apply_loss_reduction_to_advantages_minibatch`` has divided the advantages by the mini-batch's
normaliser. The policy losses oma accepts (:data:`POLICY_LOSSES`) are positively homogeneous in
the advantage, ``ℓ(c·A) = c·ℓ(A)`` for ``c ≥ 0``, so ``A' = A·W`` with oma's
per-token weights ``W`` gives ``Σ W·ℓ(A)``: :func:`oma.core.weighted_loss`, for any micro-batch
size and data-parallel split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import core
from oma.hosts import HostOptions, HostStep, require_version

KEY = "trainer.algorithm.oma"

SUPPORTED = "0.4"
"""The SkyRL series the overridden trainer methods were read from (``compute_advantages_and_returns``,
``_normalize_advantages``: SkyRL's own, not an extension point)."""

TESTED = "0.4.0"

REDUCER_OF_LOSS_REDUCTION: dict[str, core.Reducer] = {
    "token_mean": "token-mean",
    "sequence_mean": "seq-mean-token-mean",
    "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
}
"""SkyRL's ``trainer.algorithm.loss_reduction`` → the oma reducer with the same shape inside a
trajectory. ``prompt_mean`` and ``token_mean_legacy`` have none (docs/skyrl.md#what-is-exact)."""

ESTIMATORS_OF_ROW_ACCOUNTING: tuple[str, ...] = core.ESTIMATORS
"""``trainer.algorithm.advantage_estimator`` values that ``accounting: row`` recomputes (``grpo``, ``rloo``)."""

POLICY_LOSSES: tuple[str, ...] = ("regular", "dual_clip", "gspo", "cispo", "rollout_is", "dppo")
"""``trainer.algorithm.policy_loss_type`` values whose token loss is positively homogeneous in A (exact
MA): PPO-clip and dual clip (clip and min act on the ratio, A's sign is kept), GSPO (a sequence
ratio), CISPO and ``rollout_is`` (a stopped-gradient weight times A·log π), DPPO (a mask that reads
only A's sign). The last three are what SkyRL's fully async trainer accepts."""

REFUSED: dict[str, str] = {
    "audit_dir": f"was renamed {KEY}.dump_dir: set that instead",
    "estimator": "is set by trainer.algorithm.advantage_estimator: set that instead",
    "norm_by_std": "is set by trainer.algorithm.grpo_norm_by_std: set that instead",
    "reducer": "is set by trainer.algorithm.loss_reduction: set that instead",
    "loss_scale_factor": "is set by trainer.algorithm.max_seq_len: set that instead",
    "eps": "is SkyRL's own (its estimators' 1e-6): not an option here",
    "outcome": "is SkyRL's step-wise rule (the last step's reward): not an option here",
    "gamma": "is GiGPO's, which SkyRL does not run: not an option here",
    "step_advantage_w": "is GiGPO's, which SkyRL does not run: not an option here",
}
"""The contract's keys SkyRL's own config sets (or that do not apply), refused under ``trainer.algorithm.oma``
with what to use instead: only ``accounting``, ``mass`` and ``dump_dir`` are read from it."""


def host_options(algorithm: Any) -> HostOptions:
    """``trainer.algorithm.oma`` (a mapping: SkyRL's config keeps it as a dict) with SkyRL's own settings
    as the rest of the options: the estimator, ``grpo_norm_by_std``, the reducer of ``loss_reduction``
    and its L_norm ``max_seq_len``, and the outcome of step-wise training (the last step's reward)."""
    node = getattr(algorithm, "oma", None)
    if node is not None and not isinstance(node, Mapping):
        raise ValueError(f"{KEY} must be a mapping of options (accounting, mass, dump_dir), got {type(node).__name__}")
    defaults: dict[str, Any] = {"norm_by_std": bool(algorithm.grpo_norm_by_std), "outcome": "final"}
    if algorithm.advantage_estimator in ESTIMATORS_OF_ROW_ACCOUNTING:
        defaults["estimator"] = algorithm.advantage_estimator
    reducer = REDUCER_OF_LOSS_REDUCTION.get(algorithm.loss_reduction)
    if reducer is not None:
        defaults["reducer"] = reducer
        if reducer == "seq-mean-token-sum-norm" and algorithm.max_seq_len:
            defaults["loss_scale_factor"] = float(algorithm.max_seq_len)
    return HostOptions.from_mapping(node, prefix=KEY, refused=REFUSED, **defaults)


def changes_skyrl(options: HostOptions) -> bool:
    """False for SkyRL's own semantics (``accounting: trajectory``, ``mass: native``): nothing to change."""
    return options.accounting != "trajectory" or options.mass != "native"


def check_version() -> None:
    """Refuse, in one line naming both versions, a SkyRL outside :data:`SUPPORTED`."""
    require_version("skyrl", SUPPORTED, TESTED)


def check_config(cfg: Any) -> HostOptions:
    """Refuse, naming the key, a SkyRL config on which oma's objective would not be what docs/skyrl.md
    says. ``cfg`` is a SkyRL ``SkyRLTrainConfig`` (or any object with the same attribute paths). Returns
    the options."""
    algo = cfg.trainer.algorithm
    options = host_options(algo)
    if not changes_skyrl(options):
        return options
    if not cfg.generator.step_wise_trajectories:
        raise ValueError("generator.step_wise_trajectories must be true with trainer.algorithm.oma "
                         f"(accounting={options.accounting!r}, mass={options.mass!r}): OMA acts on step-wise "
                         "batches; set it, or set oma.accounting=trajectory and oma.mass=native")
    if algo.policy_loss_type not in POLICY_LOSSES:
        raise ValueError(f"trainer.algorithm.policy_loss_type must be one of {list(POLICY_LOSSES)} with OMA, got "
                         f"{algo.policy_loss_type!r}: its loss is not proportional to the advantage's scale")
    if options.accounting == "row" and algo.advantage_estimator not in ESTIMATORS_OF_ROW_ACCOUNTING:
        raise ValueError(f"trainer.algorithm.advantage_estimator must be one of {list(ESTIMATORS_OF_ROW_ACCOUNTING)} "
                         f"with {KEY}.accounting=row, got {algo.advantage_estimator!r}")
    if options.mass != "native":
        if algo.loss_reduction not in REDUCER_OF_LOSS_REDUCTION:
            raise ValueError(f"trainer.algorithm.loss_reduction must be one of {list(REDUCER_OF_LOSS_REDUCTION)} with "
                             f"{KEY}.mass={options.mass!r}, got {algo.loss_reduction!r} (no per-trajectory shape)")
        if algo.loss_reduction == "seq_mean_token_sum_norm" and not algo.max_seq_len:
            raise ValueError("trainer.algorithm.max_seq_len must be set with loss_reduction=seq_mean_token_sum_norm")
        if algo.advantage_batch_normalize:
            raise ValueError(f"trainer.algorithm.advantage_batch_normalize must be false with {KEY}.mass="
                             f"{options.mass!r}: the batch z-score would be applied after the weights")
    return options


def host_step(uids: Sequence[str], is_last_step: Sequence[bool] | None, rewards: Tensor, loss_mask: Tensor,
              pad_size: int = 0) -> HostStep:
    """SkyRL's step-wise batch in oma's ids, its ``pad_size`` padding rows left out (module docstring).

    Groups are ``metadata['uids']``; trajectories follow SkyRL's rule, ``traj_ids = cumsum`` of the
    previous row's ``metadata['is_last_step']``; a row's score is its reward sum (the options' ``final``
    outcome takes each trajectory's last step's, as step-wise SkyRL does); the response mask is
    ``loss_mask != 0``. Raises ``ValueError`` naming ``metadata['is_last_step']`` when it is missing, of
    another length than ``uids``, does not end the batch, or leaves a trajectory spanning two uids.
    """
    if is_last_step is None:
        raise ValueError("metadata['is_last_step'] is missing from the training batch: oma needs it to find "
                         "trajectories (generator.step_wise_trajectories must be true)")
    last = torch.as_tensor(np.asarray(is_last_step, dtype=bool))
    if last.ndim != 1 or len(last) != len(uids):
        raise ValueError(f"metadata['is_last_step'] has {len(last)} entries for {len(uids)} rows (metadata['uids'])")
    if len(last) == 0 or not bool(last[-1]):
        raise ValueError("metadata['is_last_step'] must be True on the batch's last row (every trajectory ends)")
    traj = torch.cat([torch.zeros(1, dtype=torch.long), last[:-1].long()]).cumsum(0)
    codes: dict[str, int] = {}  # uid → id in order of first appearance (a dict beats sorting 10^6 strings)
    group_index = torch.as_tensor([codes.setdefault(str(u), len(codes)) for u in uids], dtype=torch.long)
    first = torch.cat([torch.ones(1, dtype=torch.bool), last[:-1]])
    start_group = group_index[first][traj]  # each row's trajectory's first-row group
    if not torch.equal(start_group, group_index):
        bad = int(torch.nonzero(start_group != group_index)[0])
        raise ValueError(f"metadata['is_last_step']: row {bad} (uid {uids[bad]!r}) continues a trajectory of uid "
                         f"{uids[int(torch.nonzero(traj == traj[bad])[0])]!r}; a trajectory's steps share one uid")
    rows = len(uids) - int(pad_size)
    group_index, traj = group_index[:rows], traj[:rows]
    return HostStep(group_index=group_index, traj_index=traj, scores=rewards[:rows].sum(-1).to(torch.float64),
                    response_mask=loss_mask[:rows] != 0,
                    step_index=core.batch_structure(group_index, traj).position_in_trajectory())


def minibatches(boundaries: Sequence[tuple[int, int]], rows: int) -> list[Tensor]:
    """The rows of each of SkyRL's mini-batches, ``(start, end)`` slices cut to the step's ``rows`` (its
    padding rows are no trajectory's)."""
    return [torch.arange(min(start, rows), min(end, rows)) for start, end in boundaries]


def check_binary(loss_mask: Tensor) -> None:
    """Refuse a ``loss_mask`` other than 0/1 under Mass Alignment: SkyRL's worker multiplies each token's loss
    by it, so other values would rescale oma's weights."""
    if not bool(((loss_mask == 0) | (loss_mask == 1)).all()):
        raise ValueError(f"loss_mask must be 0/1 with {KEY}.mass != native (SkyRL multiplies each token's loss by "
                         "it, so other values would rescale oma's weights)")
