r"""Trainer-side OMA for verl: verl's batch read into the host contract (:mod:`oma.hosts`), and its result
laid out for verl's update.

Pure functions (torch + :mod:`oma.hosts`), used by :mod:`oma.integrations.verl.trainer_mixin` and
testable without verl's trainer stack.

**Where the ids come from.** verl's v1 agent loop stores every output under the key
``{uid}_{session_id}_{index}``: ``uid`` is the prompt (the GRPO *group*), ``session_id`` ∈ [0, n)
one rollout of it (the *trajectory*), ``index`` the output's position in that session (the agent
*step*). verl's own padding rows (keys ``pad<hex>_{i}_0``, tag ``is_padding``, an empty response mask)
are the step's ``copies``: no mass, no trajectory's place in the metrics or the dump.

**How the objective is made exact.** verl's actor loss for a micro-batch is
``agg_loss(ℓ(A'), mask, loss_agg_mode, dp_size, ...)``. With ``loss_agg_mode=token-sum`` that is
``dp_size·Σ mask·ℓ(A')`` with no normaliser, data-parallel gradients are averaged (÷dp_size) and
micro-batch gradients summed, so one optimizer step minimises ``Σ_{rows of its mini-batch} Σ_l
mask·ℓ(A')``. Every oma weight is a per-row constant on the row's valid tokens,
``W[r, l] = c_r·mask[r, l]`` (:func:`oma.core.token_weights`), and the supported token losses are
positively homogeneous in the advantage, ``ℓ(c·A) = c·ℓ(A)`` for ``c ≥ 0`` (PPO-clip incl. dual
clip: clip and min act on the ratio, the sign of A is kept; GSPO: the sequence ratio does not
involve A). Hence with ``A' = A·W``::

    Σ_r Σ_l mask·ℓ(A·W) = Σ_r Σ_l W·ℓ(A) = oma.core.weighted_loss(ℓ(A), W)

for any micro-batch split, any data-parallel size and any dynamic batch sizing.

**Which rows form a mini-batch.** verl splits the step's batch into ``dp_size`` contiguous chunks
(one per data-parallel rank) and each rank cuts its chunk, unshuffled (``actor.shuffle=false``),
into consecutive local mini-batches of ``ppo_mini_batch_size·n/dp_size`` rows; global mini-batch
``i`` is the union of the ranks' ``i``-th pieces (:func:`minibatch_rows`). Those boundaries fall
wherever verl's balancing put the rows, so a trajectory can lie in several mini-batches.

**Where W is computed.** :func:`oma.hosts.weights` with the step's mini-batches: ``mass: native``
reproduces verl (the reducer over each PPO mini-batch, as verl normalises it); Mass Alignment
(``uniform``, ``group``) computes W once over the **whole step**, times the number of mini-batches k,
so each trajectory keeps exactly its share of the step's objective whatever the mini-batch boundaries,
padding and data-parallel split (docs/verl.md#exact-mass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import core, hosts
from oma.hosts import HostOptions, HostStep
from oma.integrations.verl.options import cfg_get, cfg_select, host_options

SUPPORTED_POLICY_LOSSES: tuple[str, ...] = ("vanilla", "gspo")
"""verl ``policy_loss.loss_mode`` values whose objective oma reproduces exactly (with a ``token_objective``)."""

REQUIRED_LOSS_AGG_MODE = "token-sum"


# ------------------------------------------------------------------------------------------ layout


def minibatch_rows(n_rows: int, dp_size: int, mini_batch_rows: int) -> list[Tensor]:
    """Row indices (in batch order) of each global PPO mini-batch, as verl 0.9.1 forms them unshuffled.

    verl dispatches ``dp_size`` contiguous chunks of ``n_rows/dp_size`` rows; each rank iterates its
    chunk in pieces of ``mini_batch_rows/dp_size`` rows (``tu.make_iterator``, ``shuffle=False``).
    Global mini-batch ``i`` = the ``i``-th piece of every rank.
    """
    if dp_size < 1 or mini_batch_rows < 1:
        raise ValueError(f"dp_size and mini_batch_rows must be >= 1, got {dp_size}, {mini_batch_rows}")
    if n_rows % dp_size or mini_batch_rows % dp_size:
        raise ValueError(f"n_rows={n_rows} and mini_batch_rows={mini_batch_rows} must be multiples of dp_size={dp_size}")
    per_rank, local = n_rows // dp_size, mini_batch_rows // dp_size
    if per_rank % local:
        raise ValueError(f"rows per rank ({per_rank}) must be a multiple of the local mini-batch ({local}), as verl asserts")
    rank_start = torch.arange(dp_size).unsqueeze(1) * per_rank
    return [(rank_start + i * local + torch.arange(local)).reshape(-1) for i in range(per_rank // local)]


# ----------------------------------------------------------------------------------- verl's batch


def host_step(
    keys: Sequence[str],
    token_level_rewards: Tensor,
    response_mask: Tensor,
    *,
    minibatches: list[Tensor] | None = None,
    padding: Sequence[bool] | None = None,
    anchor: Tensor | None = None,
) -> HostStep:
    """verl's batch in oma's ids (module docstring, *Where the ids come from*).

    Args:
        keys: verl's row keys ``{uid}_{session_id}_{index}`` in batch order (split from the right, as
            verl does): group ``uid``, trajectory ``{uid}_{session_id}``, step ``index``.
        token_level_rewards: [R, L]; a row's score is their sum, as verl's outcome estimators take it.
        response_mask: [R, L] (bool/int), the mask verl's loss will use.
        minibatches: the rows of each PPO mini-batch (:func:`minibatch_rows`); None: one.
        padding: verl's ``is_padding`` tag of each row: the step's copies.
        anchor: int64 [R] state ids (``oma_gigpo``; :func:`prompt_anchor_ids`). GiGPO's step reward is
            then the terminal one, each trajectory's score on its last step (verl has no per-step reward).
    """
    from oma.integrations.verl.estimators import terminal_step_rewards

    rows = token_level_rewards.shape[0]
    if len(keys) != rows or tuple(response_mask.shape) != tuple(token_level_rewards.shape):
        raise ValueError(f"batch mismatch: {len(keys)} keys, token_level_rewards {tuple(token_level_rewards.shape)}, "
                         f"response_mask {tuple(response_mask.shape)}")
    groups: dict[str, int] = {}
    trajs: dict[str, int] = {}
    group_index, traj_index, step_index = [], [], []
    for key in keys:
        fields = str(key).rsplit("_", 2)
        if len(fields) != 3:
            raise ValueError(f"row key {key!r} is not verl's '{{uid}}_{{session_id}}_{{index}}'")
        uid, session, index = fields
        try:
            step_index.append(int(index))
        except ValueError:
            raise ValueError(f"row key {key!r}: output index {index!r} is not an integer") from None
        group_index.append(groups.setdefault(uid, len(groups)))
        traj_index.append(trajs.setdefault(f"{uid}_{session}", len(trajs)))
    if len(set(zip(traj_index, step_index, strict=True))) != rows:
        raise ValueError("duplicated row key: the same {uid}_{session_id}_{index} appears twice in the batch")
    traj, step = torch.tensor(traj_index, dtype=torch.int64), torch.tensor(step_index, dtype=torch.int64)
    scores = token_level_rewards.detach().sum(dim=-1).cpu().to(torch.float64)
    return HostStep(group_index=torch.tensor(group_index, dtype=torch.int64), traj_index=traj, scores=scores,
                    response_mask=response_mask.detach().cpu().bool(), step_index=step, anchor=anchor,
                    step_rewards=None if anchor is None else terminal_step_rewards(scores, traj, step),
                    minibatches=minibatches,
                    copies=None if padding is None else torch.tensor([bool(p) for p in padding], dtype=torch.bool))


def prompt_anchor_ids(prompts: Sequence[Any]) -> Tensor:
    """Anchor (state) ids from each row's prompt token ids: rows with identical contexts share an id."""
    import hashlib

    digests = []
    for p in prompts:
        arr = np.ascontiguousarray(np.asarray(p.detach().cpu() if isinstance(p, Tensor) else p, dtype=np.int64))
        digests.append(hashlib.blake2b(arr.tobytes(), digest_size=16).hexdigest())
    return core.anchor_ids(digests)


@dataclass(frozen=True)
class OMABatch:
    """One training step's OMA quantities, laid out for verl's update.

    Attributes:
        step: the batch in oma's ids (:func:`host_step`).
        advantages: A·mask, [R, L] in the rewards' dtype (what ``returns`` gets).
        weights: W, float64 [R, L] (:func:`oma.hosts.weights`).
        weighted_advantages: A·W, [R, L] in the rewards' dtype: what verl's update receives.
        metrics: the ``oma/*`` metrics (:func:`oma.hosts.metrics`).
    """

    step: HostStep
    advantages: Tensor
    weights: Tensor
    weighted_advantages: Tensor
    metrics: dict[str, float]


def compute_oma_batch(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    keys: Sequence[str],
    algorithm_config: Any,
    *,
    dp_size: int = 1,
    mini_batch_rows: int | None = None,
    padding: Sequence[bool] | None = None,
    anchor: Tensor | None = None,
    loss_scale_factor: float | None = None,
    iteration: int | None = None,
) -> OMABatch:
    """OA advantages and MA weights of one step (:func:`oma.hosts.align`), for verl's update.

    Args:
        token_level_rewards: [R, L] (:func:`host_step`).
        response_mask: [R, L], the mask verl's loss will use.
        keys: verl's row keys in batch order.
        algorithm_config: verl's ``algorithm`` node (``adv_estimator`` ∈ oma_*, ``algorithm.oma``).
        dp_size: the actor's data-parallel size.
        mini_batch_rows: rows per PPO mini-batch (``ppo_mini_batch_size·rollout.n``); None = one
            mini-batch.
        padding: verl's ``is_padding`` tag of each row.
        anchor: int64 [R] state ids (``oma_gigpo``).
        loss_scale_factor: L_norm for ``reducer: seq-mean-token-sum-norm`` when ``algorithm.oma``
            sets none (the trainer passes ``actor.loss_scale_factor``).
        iteration: the step's number, naming its file under ``algorithm.oma.dump_dir``.
    """
    from oma.integrations.verl import ESTIMATOR_NAMES

    estimator = str(cfg_get(algorithm_config, "adv_estimator", ""))
    if estimator not in ESTIMATOR_NAMES:
        raise ValueError(f"algorithm.adv_estimator must be one of {list(ESTIMATOR_NAMES)} for oma's trainer, got {estimator!r}")
    if estimator == "oma_gigpo" and anchor is None:
        raise ValueError("oma_gigpo needs anchor ids (the trainer derives them from the rows' prompts)")
    options = host_options(algorithm_config, loss_scale_factor=loss_scale_factor)
    rows = token_level_rewards.shape[0]
    layout = None if mini_batch_rows is None else minibatch_rows(rows, dp_size, mini_batch_rows)
    step = host_step(keys, token_level_rewards, response_mask, minibatches=layout, padding=padding, anchor=anchor)
    result = hosts.align(step, options, iteration=iteration)
    dtype = token_level_rewards.dtype
    adv = result.adv.to(dtype).unsqueeze(-1) * step.response_mask.to(dtype)
    weighted = (adv.to(torch.float64) * result.weights).to(dtype)
    device = token_level_rewards.device
    return OMABatch(step=step, advantages=adv.to(device), weights=result.weights,
                    weighted_advantages=weighted.to(device), metrics=result.metrics)


# ------------------------------------------------------------------------------------ config checks


class UnsupportedConfigError(ValueError):
    """A verl configuration under which oma's trainer could not reproduce the OMA objective exactly."""


def check_trainer_config(config: Any) -> HostOptions:
    """Validate a full verl config for oma's trainer; return the OMA options (:func:`host_options`, whose
    bad keys and values are refused as :class:`oma.hosts.HostConfigError`). Raises on any refusal.

    Refused (each with the reason in the message):

    * ``algorithm.adv_estimator`` not one of oma's (a critic/GAE has no group outcome to align);
    * ``actor.loss_agg_mode`` other than ``token-sum``: verl's other modes renormalise each
      micro-batch by counts oma cannot see at advantage time; oma's ``algorithm.oma.reducer``
      carries the native aggregation inside each trajectory instead;
    * ``actor.policy_loss.loss_mode`` other than ``vanilla``/``gspo`` (``bypass_mode`` rejects tokens
      inside the loss; ``clip_cov``/``kl_cov`` select tokens by the advantage's values; ``dro`` adds a
      term without A; the rest have no :func:`oma.core.token_objective` to be checked against);
    * ``actor.use_kl_loss`` and ``actor.entropy_coeff != 0``: verl aggregates these terms with the
      same ``token-sum`` and no weight, so they would be unnormalised and un-aligned (use
      ``algorithm.use_kl_in_reward``, which goes through the advantage);
    * ``actor.shuffle``: the weights are computed for the mini-batches verl forms unshuffled;
    * ``algorithm.use_pf_ppo`` (resamples rows after the advantage) and an enabled ``distillation``
      (adds losses outside the policy term);
    * ``critic.enable=True``: the critic would train on ``returns``, which oma sets to the outcome
      advantage A (a value function of A is not one of the return), and GAE is not an oma estimator.
    """
    algorithm = cfg_get(config, "algorithm")
    actor = cfg_select(config, "actor_rollout_ref.actor")
    from oma.integrations.verl import ESTIMATOR_NAMES

    problems: list[str] = []
    estimator = cfg_get(algorithm, "adv_estimator", None)
    if estimator not in ESTIMATOR_NAMES:
        problems.append(f"algorithm.adv_estimator={estimator!r}: oma's trainer needs one of {list(ESTIMATOR_NAMES)}")
    agg = cfg_get(actor, "loss_agg_mode", "token-mean")
    if agg != REQUIRED_LOSS_AGG_MODE:
        problems.append(
            f"actor_rollout_ref.actor.loss_agg_mode={agg!r}: set it to 'token-sum' (the Mass Alignment weights "
            "carry the normaliser; put the native aggregation you want inside each trajectory in "
            f"algorithm.oma.reducer, e.g. algorithm.oma.reducer={agg!r})"
        )
    loss_mode = cfg_select(actor, "policy_loss.loss_mode", "vanilla")
    if loss_mode not in SUPPORTED_POLICY_LOSSES:
        problems.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: oma is exact only for "
            f"{list(SUPPORTED_POLICY_LOSSES)} (positively homogeneous in the advantage, checked against oma.core)"
        )
    if bool(cfg_get(actor, "use_kl_loss", False)):
        problems.append(
            "actor_rollout_ref.actor.use_kl_loss=True: verl adds the KL term with loss_agg_mode and no weight, so "
            "under token-sum it would be an unnormalised, un-aligned sum; use algorithm.use_kl_in_reward=True instead"
        )
    entropy_coeff = float(cfg_get(actor, "entropy_coeff", 0.0) or 0.0)
    if entropy_coeff != 0.0:
        problems.append(
            f"actor_rollout_ref.actor.entropy_coeff={entropy_coeff}: the entropy bonus is aggregated without the "
            "Mass Alignment weights (unnormalised under token-sum); set it to 0"
        )
    if bool(cfg_get(actor, "shuffle", False)):
        problems.append(
            "actor_rollout_ref.actor.shuffle=True: set it to False (mass: native is verl's reducer per mini-batch, "
            "computed on the mini-batches verl forms unshuffled)"
        )
    if bool(cfg_get(algorithm, "use_pf_ppo", False)):
        problems.append("algorithm.use_pf_ppo=True: it resamples rows after the advantage, breaking the weights")
    if bool(cfg_select(config, "critic.enable", False)):
        problems.append(
            "critic.enable=True: oma's trainer writes the outcome advantage A into returns, so a critic would "
            "learn a value of A; oma's estimators are critic-free (group-relative), set critic.enable=False"
        )
    if bool(cfg_select(config, "distillation.enabled", False)):
        problems.append("distillation.enabled=True: distillation losses are outside the weighted policy term")
    if problems:
        raise UnsupportedConfigError(
            "oma's verl trainer refuses this configuration (the objective would not equal "
            "oma.core.weighted_loss):\n  - " + "\n  - ".join(problems)
        )
    return host_options(algorithm, loss_scale_factor=cfg_get(actor, "loss_scale_factor", None))
