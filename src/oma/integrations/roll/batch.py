r"""OMA on a ROLL agentic batch, read by ROLL's column names (docs/roll.md); no ROLL import.

ROLL's agentic pipeline (github.com/alibaba/ROLL, ``roll/pipeline/agentic``) trains with the step env
manager on one row per agent step. At its ``agentic_compute_advantage`` call each row carries
``traj_group_id`` (its group), ``traj_id`` (its episode), ``sample_uuid`` (the row's identity, which
``AgenticPipeline.adjust_batch``'s padding copies repeat), ``step``, ``episode_scores`` (the episode's
outcome), the tensor ``scores`` (the step's reward on its tokens), ``response_mask`` ([R, L+1]; the loss
reads ``[:, 1:]``) and, for GiGPO, ``state_hash`` and ``step_rewards`` (the step's discounted return of
``step_scores``, computed before the copies exist). :func:`align_batch` turns such a batch into an
:class:`oma.hosts.HostStep`, calls :func:`oma.hosts.align`, and returns the advantages on the response
tokens and, under Mass Alignment, the per-token weights the actor (:mod:`oma.integrations.roll.worker`)
carries into its loss with :func:`loss_advantages`.

**Why the carrier is exact.** ROLL's actor (``ActorWorker.loss_func`` with ``agg_loss``) gives every
valid token of a micro-batch's row one factor f per unit of token loss, from counts over the whole
backward batch (all ranks), which ROLL hands each micro-batch in ``meta_info``: 1/T for ``token-mean``
(T its valid tokens), 1/G for ``seq-mean-token-sum`` (G its rows with a valid token), 1/(n_r·G) for
``seq-mean-token-mean`` (n_r the row's valid tokens), 1/L for ``seq-mean-token-sum-norm`` (L the padded
length); the strategies' ``loss_scale`` (micro-batches × ranks) cancels the mean over micro-batches and
ranks. PPO-clip (with dual clip) is positively homogeneous in the advantage, ℓ(c·A) = c·ℓ(A) for
c ≥ 0, so advantages A' = A·W/f make that loss Σ W·ℓ(A), whatever rows the actor's shuffle puts in a
backward batch and however it cuts micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import hosts
from oma.integrations._columns import array, finite, floats, groups, ids, matrix, missing, repeats

PREFIX = "oma"
"""The YAML node beside ROLL's own keys that holds oma's options (read by :func:`oma.integrations.roll.install`)."""

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""``loss_agg_mode`` values of ROLL's ``agg_loss``; the default is ``seq-mean-token-mean``."""

ESTIMATORS: dict[str, str] = {"grpo": "grpo", "reinforce": "grpo", "gigpo": "gigpo"}
"""``adv_estimator`` → oma's estimator. ROLL's ``grpo`` and ``reinforce`` both score a row by
``agentic_reward_norm`` of its ``scores`` (group mean, and std with ``mean_std``): oma's ``grpo``."""

STRATEGIES: tuple[str, ...] = ("fsdp2_train", "megatron_train")
"""``actor_train.strategy_args.strategy_name`` values whose ``train_step`` was read: each micro-batch's
``agg_loss`` times ``loss_scale`` = micro-batches × ranks, normalised by the backward batch's counts."""

WORKER_CLS = "oma.integrations.roll.worker.ActorWorker"
"""``actor_train.worker_cls`` under Mass Alignment: ROLL's agentic actor that reads ``oma_weights``."""

WEIGHTS_KEY, ADV_KEY = "oma_weights", "oma_adv"
"""Tensor columns the hook adds: W·R per token (the step's share times its rows) and A on the tokens."""

NORM_EPS = 1e-6
"""ROLL's ``agentic_reward_norm``: (x − μ)/(σ + 1e-6), and 0 where σ ≤ 1e-6 or the group has one row."""

COUNT_EPS = 1e-8
"""``agg_loss`` adds it to the row count (``seq-mean-*``), ``masked_mean`` to a row's token count."""


class RollConfigError(hosts.HostConfigError):
    """A ROLL setting under which oma's advantages or weights would not reach the loss exactly; one line
    naming the key and what to use instead."""


def cfg_get(config: Any, dotted: str, default: Any = None) -> Any:
    """``config``'s value at ``a.b.c`` (attributes of ROLL's dataclasses, or keys of a mapping)."""
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
    return default if node is None else node


@dataclass(frozen=True)
class Setup:
    """A ROLL run's OMA options and its loss aggregation, checked (:func:`check_config`)."""

    options: hosts.HostOptions
    loss_agg_mode: str

    def __str__(self) -> str:
        o = self.options
        return (f"oma: ROLL integration active — {o.estimator}, accounting={o.accounting}, mass={o.mass}, "
                f"reducer={o.reducer}; actor: loss_agg_mode={self.loss_agg_mode}")


def _reward_norm(config: Any) -> tuple[str | None, str | None]:
    """(norm_mean_type, norm_std_type) of ``reward_normalization`` as ROLL resolves them
    (``RewardNormalizationConfig.__post_init__``: explicit types first, else from ``method``)."""
    node = cfg_get(config, "reward_normalization")
    grouping = str(cfg_get(node, "grouping", "batch"))
    mean, std = cfg_get(node, "norm_mean_type"), cfg_get(node, "norm_std_type")
    fallback = _resolve(str(cfg_get(node, "method", "identity")), grouping)
    return (mean if mean is not None else fallback[0], std if std is not None else fallback[1])


def _resolve(method: str, grouping: str) -> tuple[str | None, str | None]:
    """ROLL's ``_resolve_reward_norm_defaults``: ``batch`` grouping takes batch statistics, any other group ones."""
    scope = "batch" if grouping.lower() == "batch" else "group"
    if method == "mean":
        return scope, None
    if method in ("mean_std", "asym_clip"):
        return scope, scope
    return None, None  # identity, and the unknown methods ROLL falls back to identity for


REFUSED_IF_SET: tuple[tuple[str, Any, str], ...] = (
    ("gamma", 1.0, "1 (oma's advantage is the row's normalised reward on every response token, "
                   "compute_reinforce_return with gamma=1)"),
    ("add_token_level_kl", False, "false (a KL penalty in the reward makes the advantage vary by token)"),
    ("whiten_advantages", False, "false (whitening pools the batch's tokens, rows and copies alike)"),
    ("whiten_rewards", False, "false (whitening pools the batch's tokens, rows and copies alike)"),
    ("advantage_clip", None, "null"),
    ("reward_clip", None, "null"),
    ("use_opd", False, "false (on-policy distillation adds a per-token KL to the advantage)"),
    ("is_pure_opd", False, "false"),
)
"""Keys whose non-default value changes ROLL's advantage in a way oma's hook would not reproduce: refused."""


def check_config(config: Any, node: Mapping[str, Any] | None) -> Setup:
    """The run's :class:`Setup` from ROLL's ``AgenticConfig`` (or a mapping of its keys) and the ``oma`` node,
    or a :class:`RollConfigError` naming the key.

    The estimator comes from ``adv_estimator`` (:data:`ESTIMATORS`), ``norm_by_std`` from
    ``reward_normalization``, GiGPO's ω from ``step_reward_weight``; under ``mass=native`` the reducer is
    ``loss_agg_mode``. Refused: a group other than ``traj_group_id``, batch statistics, no mean (the
    default, ``method: identity``), GiGPO with ``episode_reward_weight`` ≠ 1 or step/episode normalisers that
    differ, :data:`REFUSED_IF_SET`, ``batch_adjust_mode`` other than ``copy``; under Mass Alignment a worker
    other than :data:`WORKER_CLS`, a strategy not in :data:`STRATEGIES`, ``apply_loss_scale=false``, dynamic
    batching or sequence packing in training (not checked), the KL loss, the entropy loss and train–infer
    filters (added with no per-trajectory weight).
    """
    raw = str(cfg_get(config, "adv_estimator", "gae"))
    if raw not in ESTIMATORS:
        raise RollConfigError(f"adv_estimator={raw} has no OMA form; use one of {list(ESTIMATORS)}, or leave oma out")
    given = dict(node or {})
    for key in ("estimator", "norm_by_std", "step_advantage_w", "gamma", "outcome", "eps", "loss_scale_factor"):
        if key in given:
            raise RollConfigError(f"{PREFIX}.{key} is not an option here: ROLL's own keys set it "
                                  "(adv_estimator, reward_normalization, step_reward_weight, step_reward_gamma)")
    grouping = str(cfg_get(config, "reward_normalization.grouping", "batch"))
    if grouping != "traj_group_id":
        raise RollConfigError(f"reward_normalization.grouping={grouping}: oma's group statistics are over a "
                              "traj_group_id (one task rolled out group_size times); set it to traj_group_id")
    mean, std = _reward_norm(config)
    if mean != "group" or std not in (None, "group"):
        raise RollConfigError(
            f"reward_normalization resolves to norm_mean_type={mean}, norm_std_type={std}: oma takes the group's mean "
            "(and std); set reward_normalization.method to mean_std or mean (the default identity has no baseline)")
    norm_by_std = std == "group"
    for key, default, expected in REFUSED_IF_SET:
        value = cfg_get(config, key, default)
        if value != default and not (default is None and not value):
            raise RollConfigError(f"{key}={value} with oma: set {key} to {expected}")
    adjust = str(cfg_get(config, "batch_adjust_mode", "copy"))
    if adjust != "copy":
        raise RollConfigError(f"batch_adjust_mode={adjust}: oma knows adjust_batch's copies (sample_uuid repeated), "
                              "not rows it deletes or samples; set batch_adjust_mode=copy")
    estimator = ESTIMATORS[raw]
    defaults: dict[str, Any] = {"norm_by_std": norm_by_std, "estimator": estimator, "eps": NORM_EPS, "gamma": 0.0}
    if estimator == "gigpo":
        episode_w = float(cfg_get(config, "episode_reward_weight", 1.0))
        if episode_w != 1.0:
            raise RollConfigError(f"episode_reward_weight={episode_w:g}: oma's GiGPO weighs the episode term 1 and the "
                                  "step term step_reward_weight; set episode_reward_weight=1")
        # ROLL normalises the step term by `method` alone (RewardNormalizationConfig(grouping="state_group_id",
        # method=...)), whatever explicit norm types the episode term takes: oma uses one norm_by_std for both
        step_mean, step_std = _resolve(str(cfg_get(config, "reward_normalization.method", "identity")), "state_group_id")
        if (step_mean, step_std) != (mean, std):
            raise RollConfigError(
                "reward_normalization.norm_mean_type/norm_std_type differ from what reward_normalization.method gives "
                "GiGPO's step term: set method (mean_std or mean) and leave the norm types unset")
        # step_rewards are ROLL's discounted returns already (compute_discounted_returns): γ = 0 takes them as they are
        defaults["step_advantage_w"] = float(cfg_get(config, "step_reward_weight", 1.0))
    mode = str(cfg_get(config, "loss_agg_mode", "seq-mean-token-mean"))
    if mode not in AGG_MODES:
        raise RollConfigError(f"loss_agg_mode must be one of {list(AGG_MODES)}, got {mode!r}")
    opts = hosts.HostOptions.from_mapping({**defaults, **given}, prefix=PREFIX)
    if opts.outcome != "mean":
        raise RollConfigError(f"{PREFIX}.outcome=final: a trajectory's outcome is its episode_scores")
    if opts.mass == "native":
        if given.get("reducer", mode) != mode:
            raise RollConfigError(f"{PREFIX}.reducer={given['reducer']} with mass=native: ROLL's own loss aggregates by "
                                  f"loss_agg_mode={mode}; drop {PREFIX}.reducer")
        opts = dataclasses.replace(opts, reducer=mode)
    else:
        _check_actor(config)
    return Setup(opts, mode)


def _check_actor(config: Any) -> None:
    """Under Mass Alignment: the actor that carries the weights, and nothing beside them in the loss."""
    worker = cfg_get(config, "actor_train.worker_cls")
    if worker != WORKER_CLS:
        raise RollConfigError(f"actor_train.worker_cls={worker} with {PREFIX}.mass set: set actor_train.worker_cls: "
                              f"{WORKER_CLS} (it carries oma's weights into agg_loss)")
    strategy = cfg_get(config, "actor_train.strategy_args.strategy_name")
    if strategy not in STRATEGIES:
        raise RollConfigError(f"actor_train.strategy_args.strategy_name={strategy} with {PREFIX}.mass set: oma's "
                              f"carrier was written for {list(STRATEGIES)}")
    if not bool(cfg_get(config, "actor_train.apply_loss_scale", True)):
        raise RollConfigError("actor_train.apply_loss_scale=false with oma.mass set: the carrier relies on ROLL's "
                              "loss_scale cancelling the mean over micro-batches and ranks; set it to true")
    for key in ("use_dynamic_batching_in_train", "use_sequence_packing"):
        if bool(cfg_get(config, f"actor_train.{key}", False)):
            raise RollConfigError(f"actor_train.{key}=true with {PREFIX}.mass set: the carrier was checked with ROLL's fixed "
                                  "micro-batches (per_device_train_batch_size rows) only; set it to false")
    for key, why in (("use_kl_loss", "the KL loss"), ("entropy_loss_coef", "the entropy loss")):
        value = cfg_get(config, key, 0)
        if value and (key != "use_kl_loss" or float(cfg_get(config, "kl_loss_coef", 0) or 0) != 0):
            raise RollConfigError(f"{key}={value} with {PREFIX}.mass set: ROLL's actor adds {why} by loss_agg_mode with no "
                                  f"per-trajectory weight, so Mass Alignment would not reach it; set {key} to "
                                  f"{'false' if key == 'use_kl_loss' else '0'}")
    if any(bool(cfg_get(f, "enabled", False)) for f in (cfg_get(config, "train_infer_correction.filters", []) or [])):
        raise RollConfigError("train_infer_correction.filters with an enabled filter and oma.mass set: the actor then "
                              "drops tokens after oma has weighed them; disable the filters")


# ------------------------------------------------------------------------------------------ the step


NON_TENSOR_COLUMNS: tuple[str, ...] = ("traj_group_id", "traj_id", "sample_uuid", "episode_scores", "state_hash", "step")
TENSOR_COLUMNS: tuple[str, ...] = ("response_mask", "scores", "step_rewards")


def _loss_mask(batch: Mapping[str, Any], rows: int) -> Tensor:
    """bool [R, L]: ``response_mask[:, 1:]``, the tokens ROLL's loss reads (its mask covers input_ids)."""
    if "response_mask" not in batch:
        raise ValueError(missing(batch, "response_mask", "ROLL's batch.batch['response_mask'], [R, 1 + L] over input_ids"))
    return matrix(batch, "response_mask", rows)[:, 1:].bool()


def _groups(batch: Mapping[str, Any], rows: int) -> tuple[Tensor, Tensor]:
    return groups(batch, rows, group=("traj_group_id", "the group id ROLL's env manager sets in "
                                      "batch.non_tensor_batch['traj_group_id']"),
                  traj=("traj_id", "the episode id ROLL's env manager sets in batch.non_tensor_batch['traj_id']"))


def copies(batch: Mapping[str, Any], rows: int, traj_index: Tensor) -> Tensor:
    """bool [R]: ``adjust_batch``'s padding copies, the later rows that repeat an earlier row's ``sample_uuid``
    (ROLL sets it, ``f"{traj_id}_{i}"``, right after the rollout, before any copy exists)."""
    uuid = array(batch, "sample_uuid", rows, "the row identity ROLL's pipeline sets after get_batch "
                  "(batch.non_tensor_batch['sample_uuid']); adjust_batch's copies repeat it")
    absent = [r for r, v in enumerate(uuid.tolist()) if v is None or (isinstance(v, float) and np.isnan(v))]
    if absent:
        raise ValueError(f"column 'sample_uuid' has no value at row {absent[0]}: each row needs its identity to tell "
                         "adjust_batch's copies from new rows")
    flags = repeats(traj_index, uuid)
    uuid_keys, _ = ids(uuid)
    owner = torch.full((rows,), -1, dtype=torch.int64).scatter_reduce(0, uuid_keys, traj_index, reduce="amax",
                                                                     include_self=False)
    stray = (owner.index_select(0, uuid_keys) != traj_index).nonzero()
    if stray.numel():
        raise ValueError(f"sample_uuid {uuid[int(stray[0, 0])]!r} is under two traj_id values: it must identify one row "
                         "(adjust_batch's copies repeat the whole row)")
    return flags


def host_step(batch: Mapping[str, Any], opts: hosts.HostOptions) -> hosts.HostStep:
    """The :class:`oma.hosts.HostStep` of a ROLL batch. Scores: under ``accounting=row`` with ``grpo`` each row's
    own ``scores`` summed over tokens (ROLL's: the step's reward); otherwise ``episode_scores`` (the trajectory's
    outcome, counted once under OA; GiGPO's episode term in ROLL too). GiGPO: ``state_hash`` for the anchor and
    ``step_rewards`` (already discounted: oma's γ is 0)."""
    rows = len(batch["response_mask"]) if "response_mask" in batch else 0
    mask = _loss_mask(batch, rows)
    group, traj = _groups(batch, rows)
    if opts.accounting == "row" and opts.estimator == "grpo":
        if "scores" not in batch:
            raise ValueError(missing(batch, "scores", "ROLL's batch.batch['scores'] [R, L], the step's reward on its tokens"))
        scores = finite("scores", matrix(batch, "scores", rows).to(torch.float64).sum(-1))
    else:
        scores = floats(batch, "episode_scores", rows, "the episode's outcome ROLL's env manager stamps on each of its rows")
    anchor = step_rewards = None
    if opts.estimator == "gigpo":
        anchor = ids(array(batch, "state_hash", rows, "GiGPO's step term groups rows by the state they acted in "
                            "(batch.non_tensor_batch['state_hash'])"))[0]
        if "step_rewards" not in batch:
            raise ValueError(missing(batch, "step_rewards", "GiGPO's step term compares the rows' discounted returns "
                                      "(batch.batch['step_rewards'], set by compute_discounted_returns)"))
        value = batch["step_rewards"]
        step_rewards = finite("step_rewards", torch.as_tensor(np.asarray(value.detach().cpu() if isinstance(value, Tensor)
                                                                          else value, dtype=np.float64)).reshape(-1))
        if step_rewards.shape[0] != rows:
            raise ValueError(f"column 'step_rewards' must have one entry per row ({rows} rows), got {step_rewards.shape[0]}")
    flags = copies(batch, rows, traj) if opts.aligned or "sample_uuid" in batch else None
    from oma import core  # position in trajectory: copies get their own, so γ = 0 returns stay per row

    return hosts.HostStep(group_index=group, traj_index=traj, scores=scores, response_mask=mask,
                          step_index=core.batch_structure(group, traj).position_in_trajectory(),
                          anchor=anchor, step_rewards=step_rewards, copies=flags)


def _check_copies(step: hosts.HostStep) -> None:
    """A copy must repeat a row the advantage cannot tell it from: same trajectory, state and step return."""
    orphan = (hosts.copy_sources(step) < 0).nonzero()
    if orphan.numel():
        raise ValueError(f"row {int(orphan[0, 0])} repeats an earlier row's sample_uuid but not its state_hash and "
                         "step_rewards: sample_uuid must mark only adjust_batch's exact copies")


@dataclass(frozen=True)
class RollResult:
    adv: Tensor
    """float64 [R]: each row's advantage A."""
    token_adv: Tensor
    """float32 [R, L]: A on ``response_mask[:, 1:]``, what goes into ``advantages`` (ROLL's shape)."""
    weights: Tensor | None
    """float32 [R, L] under Mass Alignment: W·R, the step's per-token share times its R rows, which the actor
    divides by a backward batch's rows (:func:`loss_advantages`); None under ``mass=native``."""
    metrics: dict[str, float]
    is_copy: Tensor


def align_batch(batch: Mapping[str, Any], options: hosts.HostOptions, *, iteration: int | None = None) -> RollResult:
    """A, and W under Mass Alignment, for one ROLL step given by its columns (:data:`NON_TENSOR_COLUMNS`,
    :data:`TENSOR_COLUMNS`). Raises ValueError naming the column on malformed input; nothing is written before."""
    step = host_step(batch, options)
    if step.copies is not None:
        _check_copies(step)
    result = hosts.align(step, options, iteration=iteration)
    adv = result.adv.double()
    token_adv = (adv.unsqueeze(-1) * step.response_mask).to(torch.float32)
    weights = None if options.mass == "native" else (result.weights * step.rows).to(torch.float32)
    is_copy = step.kept.logical_not()
    return RollResult(adv, token_adv, weights, result.metrics, is_copy)


def token_factor(loss_mask: Tensor, mode: str, batch_num_tokens: float, global_valid_samples: float) -> Tensor:
    """float64 [B, L]: what ROLL's ``agg_loss`` multiplies each token loss of a micro-batch by, given the backward
    batch's ``batch_num_tokens`` and ``global_valid_samples`` (``meta_info``); 0 off the mask."""
    mask = loss_mask.to(torch.float64)
    if mode == "token-mean":
        f = torch.full_like(mask, 1.0 / float(batch_num_tokens))
    elif mode == "seq-mean-token-sum":
        f = torch.full_like(mask, 1.0 / (float(global_valid_samples) + COUNT_EPS))
    elif mode == "seq-mean-token-mean":
        n = mask.sum(-1, keepdim=True)
        f = (1.0 / (n + COUNT_EPS)).expand_as(mask) / (float(global_valid_samples) + COUNT_EPS)
    elif mode == "seq-mean-token-sum-norm":
        f = torch.full_like(mask, 1.0 / mask.shape[-1])
    else:
        raise RollConfigError(f"loss_agg_mode must be one of {list(AGG_MODES)}, got {mode!r}")
    return f * mask


def loss_advantages(token_adv: Tensor, weights: Tensor, loss_mask: Tensor, mode: str, batch_num_tokens: float,
                    global_valid_samples: float, backward_rows: float) -> Tensor:
    """float32 [B, L]: the advantages a micro-batch hands ROLL's ``loss_func`` so that its ``agg_loss`` is Σ W·ℓ(A)
    with W = ``weights`` / ``backward_rows`` (module docstring): A·W/f on the mask, 0 off it."""
    f = token_factor(loss_mask, mode, batch_num_tokens, global_valid_samples)
    w = weights.to(torch.float64) / float(backward_rows)
    return hosts.carried_advantages(token_adv, w, f).to(torch.float32)


def carry(micro_batch: Any, loss_agg_mode: str) -> None:
    """Write ``advantages`` of one micro-batch as ROLL's actor hands it to ``loss_func`` (``batch`` tensors,
    ``meta_info`` with the backward batch's ``batch_num_tokens`` and ``global_valid_samples``), from the hook's
    ``oma_adv`` and ``oma_weights``: :func:`loss_advantages`. Idempotent (it reads ``oma_adv``, never
    ``advantages``), so a second PPO epoch over the same rows gets the same advantages."""
    tensors, meta = micro_batch.batch, micro_batch.meta_info
    tokens, samples = meta["batch_num_tokens"], meta["global_valid_samples"]
    mask = tensors["response_mask"][:, 1:]
    # on the batch's device: the counts are numbers (or 0-d tensors) ROLL all-reduced, the rest per token
    tensors["advantages"] = loss_advantages(tensors[ADV_KEY].detach(), tensors[WEIGHTS_KEY].detach(), mask.detach(),
                                            loss_agg_mode, float(tokens["response_mask"]), float(samples["response_mask"]),
                                            float(samples["default"]))
