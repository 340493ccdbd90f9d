r"""OMA on a SkyRL step-wise training batch: trajectory ids, row-accounted advantages, MA weights.

Pure functions over torch tensors (and :mod:`oma.core`), importable without SkyRL; the trainer in
:mod:`oma.integrations.skyrl.trainer` calls them. docs/skyrl.md explains the mapping.

**What SkyRL's batch holds** (``skyrl`` 0.4.0, ``generator.step_wise_trajectories=true``): one row
per agent step; ``metadata["uids"]`` the prompt of each row (the GRPO *group*);
``metadata["is_last_step"]`` True on the last step of each trajectory, whose rows are contiguous;
``rewards`` per token, of which step-wise training uses the last step's sum (the trajectory's
outcome); ``loss_mask`` 0/1, the trainable tokens. SkyRL pads the batch for data parallelism with
rows ``uid = "pad{i}"``, ``is_last_step = True`` and an all-zero ``loss_mask``.

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

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import core
from oma.core.validate import check_option

ACCOUNTINGS = core.ACCOUNTINGS
MASSES = core.MASSES

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

KEY = "trainer.algorithm.oma"


@dataclass
class OMAConfig:
    """``trainer.algorithm.oma``: the OMA options of a SkyRL run (docs/skyrl.md#configuration-reference).

    ``accounting=trajectory`` with ``mass=native`` is SkyRL unmodified.
    """

    accounting: str = "trajectory"
    """Outcome statistics over unique trajectories (``trajectory``: SkyRL's own step-wise
    advantages, which already use one outcome per trajectory) or over rows (``row``: every step is a
    member of its group, as verl-agent's stepwise baseline counts them; ``grpo`` and ``rloo`` only)."""
    mass: str = "uniform"
    """Each trajectory's total weight in the step's objective: ``native`` (SkyRL's
    ``loss_reduction`` per mini-batch: mass grows with a trajectory's tokens or turns), ``uniform``
    (1/T each) or ``group`` (1/(G·|trajectories of its group|))."""
    audit_dir: str | None = None
    """When set, every training step's batch is written to ``<audit_dir>/batches/iter_<step>.parquet``
    in ``oma audit``'s format (``oma audit <audit_dir>``), whatever the other options (docs/skyrl.md#audit-your-run)."""

    def __post_init__(self) -> None:
        check_option(f"{KEY}.accounting", self.accounting, ACCOUNTINGS)
        check_option(f"{KEY}.mass", self.mass, MASSES)

    @property
    def active(self) -> bool:
        """False when the options are SkyRL's own semantics (nothing to change in the objective)."""
        return self.accounting != "trajectory" or self.mass != "native"


def check_config(cfg: Any) -> OMAConfig:
    """Refuse, naming the key, a SkyRL config on which oma's objective would not be what docs/skyrl.md says.

    ``cfg`` is a SkyRL ``SkyRLTrainConfig`` (or any object with the same attribute paths) whose
    ``trainer.algorithm.oma`` holds an :class:`OMAConfig`. Returns the options.
    """
    options = getattr(cfg.trainer.algorithm, "oma", None)
    if not isinstance(options, OMAConfig):
        raise ValueError(f"{KEY} must be an oma OMAConfig (build the config with oma's OMASkyRLTrainConfig), "
                         f"got {type(options).__name__}")
    if not options.active:
        return options
    algo = cfg.trainer.algorithm
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


@dataclass(frozen=True)
class StepwiseStructure:
    """Who is who in a step-wise batch: integer group and trajectory ids per row."""

    group_index: Tensor
    traj_index: Tensor
    is_last_step: Tensor

    @property
    def step_index(self) -> Tensor:
        """Each row's position in its trajectory (SkyRL keeps a trajectory's steps in order)."""
        return core.batch_structure(self.group_index, self.traj_index).position_in_trajectory()


def stepwise_structure(uids: Sequence[str], is_last_step: Sequence[bool] | None) -> StepwiseStructure:
    """Group ids from ``uids`` and trajectory ids from ``is_last_step`` (SkyRL's rule:
    ``traj_ids = cumsum`` of the previous row's ``is_last_step``), checked.

    Raises ``ValueError`` naming ``metadata['is_last_step']`` when it is missing, of another length
    than ``uids``, does not end the batch, or leaves a trajectory spanning two uids.
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
    return StepwiseStructure(group_index=group_index, traj_index=traj, is_last_step=last)


def row_outcomes(token_level_rewards: Tensor, structure: StepwiseStructure) -> Tensor:
    """s_τ on every row of τ: the last step's reward sum (SkyRL's step-wise outcome), float64 [R]."""
    return token_level_rewards.sum(-1).to(torch.float64)[structure.is_last_step][structure.traj_index]


def row_accounted_advantages(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    structure: StepwiseStructure,
    *,
    estimator: str,
    norm_by_std: bool,
    eps: float = 1e-6,
) -> Tensor:
    r"""verl-agent's stepwise accounting inside SkyRL: every row is a member of its group.

    Each row carries its trajectory's outcome s_τ (the last step's reward sum, as SkyRL's step-wise
    branch uses it), and the group statistics count it once per row
    (:func:`oma.core.outcome_advantages` with ``accounting="row"``), so a trajectory with more steps
    weighs more in μ_g and σ_g. Returns A[R, L] = A_r·response_mask (SkyRL's layout).
    """
    adv = core.outcome_advantages(row_outcomes(token_level_rewards, structure), structure.group_index, structure.traj_index, accounting="row",
                                  estimator=estimator, norm_by_std=norm_by_std, eps=eps)
    return adv.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)


def mass_weights(
    loss_mask: Tensor,
    structure: StepwiseStructure,
    *,
    mass: str,
    loss_reduction: str,
    max_seq_len: int | None,
    n_minibatches: int,
) -> Tensor:
    r"""Per-token weights W[R, L] of Mass Alignment over the whole step, times the number of mini-batches.

    W = k·:func:`oma.core.token_weights` (reducer from ``loss_reduction``; Σ W = k): each trajectory
    gets exactly its target share w_τ·k of the step's objective, wherever the mini-batch boundaries
    fall, and each of the k optimizer steps carries a total of 1 on average, as under SkyRL's
    per-mini-batch normaliser. Rows with no trainable token (SkyRL's padding) get 0.

    ``loss_mask`` must be 0/1: the worker multiplies each token's loss by it.
    """
    check_option("mass", mass, ("uniform", "group"))
    if n_minibatches < 1:
        raise ValueError(f"n_minibatches must be >= 1, got {n_minibatches}")
    trainable = loss_mask != 0
    if not bool((trainable == (loss_mask == 1)).all()):
        raise ValueError("loss_mask must be 0/1 with trainer.algorithm.oma.mass != native (SkyRL multiplies each "
                         "token's loss by it, so other values would rescale oma's weights)")
    reducer = REDUCER_OF_LOSS_REDUCTION[loss_reduction]
    weights = core.token_weights(trainable, structure.group_index, structure.traj_index, reducer=reducer, mass=mass,
                                 loss_scale_factor=float(max_seq_len) if reducer == "seq-mean-token-sum-norm" else None)
    return weights * n_minibatches


def write_audit_batch(audit_dir: str | os.PathLike, step: int, structure: StepwiseStructure, token_level_rewards: Tensor,
                      loss_mask: Tensor, pad_size: int) -> Path:
    """Write a step-wise training batch for ``oma audit`` (SkyRL's ``pad_size`` padding rows left out).

    Columns: ``group_id`` (uid), ``traj_id``, ``step``, ``score`` (the trajectory's outcome on each
    row) and ``response_tokens`` (Σ loss_mask), at ``<audit_dir>/batches/iter_<step>.parquet``.
    """
    from oma.batchfile import batch_path, write_batch

    rows = len(structure.traj_index) - int(pad_size)
    keep = slice(0, rows)
    return write_batch(batch_path(audit_dir, step), group_index=structure.group_index[keep],
                       traj_index=structure.traj_index[keep], step_index=structure.step_index[keep],
                       scores=row_outcomes(token_level_rewards, structure)[keep], response_mask=loss_mask[keep] != 0)
