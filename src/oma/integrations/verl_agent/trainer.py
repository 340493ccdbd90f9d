"""What verl-agent's patched ``RayPPOTrainer.fit`` calls (docs/verl-agent.md#quick-start): the run's
config read and checked once (:func:`check_config`), and each step's advantages written into its batch
(:func:`compute_advantage`, in place of verl-agent's own). Neither imports verl: the batch is used
through ``batch.batch`` (tensors) and ``batch.non_tensor_batch`` (numpy arrays), the config through
keys (an OmegaConf node or nested dicts)."""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from oma import hosts
from oma.integrations.verl.options import cfg_select
from oma.integrations.verl_agent.batch import PREFIX, ActorLoss, VerlAgentConfigError, align_batch, read_options

ESTIMATORS: tuple[str, ...] = ("grpo", "rloo", "gigpo")
"""``algorithm.adv_estimator`` values oma computes (verl-agent's names; oma's estimators of the same name)."""

GIGPO_MODES: dict[str, bool] = {"mean_norm": False, "mean_std_norm": True}
"""``algorithm.gigpo.mode`` → whether both GiGPO terms divide by their group's std (``norm_by_std``)."""

STRATEGIES: tuple[str, ...] = ("fsdp", "fsdp2")
"""``actor_rollout_ref.actor.strategy`` values whose actor is verl 0.3.1's ``dp_actor`` (:class:`ActorLoss`)."""

NON_TENSOR_COLUMNS: tuple[str, ...] = ("uid", "traj_uid", "episode_rewards", "is_action_valid", "anchor_obs", "row_id")
TENSOR_COLUMNS: tuple[str, ...] = ("response_mask", "token_level_rewards", "step_rewards", "input_ids")

ALLOW_UNALIGNED = "allow_unaligned"
"""``algorithm.oma.allow_unaligned``: train under Mass Alignment with the actor's KL loss and entropy bonus
left at verl-agent's own weighting (docs/verl-agent.md#the-whole-objective); refused without it."""


@dataclass(frozen=True)
class Setup:
    """A verl-agent run's OMA options and its actor, checked (:func:`check_config`)."""

    options: hosts.HostOptions
    actor: ActorLoss
    invalid_penalty: float
    """``invalid_action_penalty_coef``, 0 with ``use_invalid_action_penalty=False``."""
    unaligned: tuple[tuple[str, float], ...] = ()
    """The actor's terms left outside Mass Alignment by ``allow_unaligned`` (``kl_loss``, ``entropy``), each
    with its coefficient; empty under ``mass=native`` or when the actor adds none."""

    def __str__(self) -> str:
        o, a = self.options, self.actor
        rows = "the whole step" if a.mini_batch_rows is None else f"{a.mini_batch_rows} rows"
        line = (f"oma: verl-agent integration active — {o.estimator}, accounting={o.accounting}, mass={o.mass}, "
                f"reducer={o.reducer}; actor: {a.loss_mode} with {a.mode}, {rows} per optimizer step over dp={a.dp}")
        if self.unaligned:
            terms = ", ".join(f"{name} ×{coef:g}" for name, coef in self.unaligned)
            line += (f"; NOT under Mass Alignment ({PREFIX}.{ALLOW_UNALIGNED}=true): {terms}, their share of the "
                     "objective logged each step as oma/unaligned_share")
        return line


def unaligned_terms(config: Any) -> list[tuple[str, float, str]]:
    """The terms verl-agent's actor adds to the policy loss by ``loss_agg_mode``, with no per-trajectory weight
    (verl 0.3.1 ``dp_actor.update_policy``): ``(name, coefficient, why refused)`` for the KL loss
    (``use_kl_loss``) and the entropy bonus (``entropy_coeff``, 0.001 by default)."""
    actor = "actor_rollout_ref.actor"
    out = []
    if bool(cfg_select(config, f"{actor}.use_kl_loss", False)):
        coef = float(cfg_select(config, f"{actor}.kl_loss_coef", 0.001))
        out.append(("kl_loss", coef, f"{actor}.use_kl_loss=True (kl_loss_coef={coef:g}): verl-agent's actor adds the KL "
                    "loss by loss_agg_mode with no per-trajectory weight, so Mass Alignment would not reach it; set "
                    f"{actor}.use_kl_loss=False and algorithm.use_kl_in_reward=True (the KL penalty then goes through "
                    "the scores)"))
    coef = float(cfg_select(config, f"{actor}.entropy_coeff", 0.001) or 0.0)
    if coef != 0.0:
        out.append(("entropy", coef, f"{actor}.entropy_coeff={coef:g}: verl-agent's actor adds the entropy bonus by "
                    "loss_agg_mode with no per-trajectory weight, so Mass Alignment would not reach it; set "
                    f"{actor}.entropy_coeff=0 (verl-agent's default is 0.001)"))
    return out


def _node(config: Any) -> dict[str, Any]:
    node = cfg_select(config, PREFIX)
    if node is None:
        return {}
    if not hasattr(node, "keys"):
        raise VerlAgentConfigError(f"{PREFIX} must be a mapping of options, got {node!r}")
    return {str(k): node[k] for k in node.keys() if node[k] is not None}


def actor_from_config(config: Any) -> ActorLoss:
    """:class:`ActorLoss` from ``actor_rollout_ref`` and ``trainer``, normalised as verl-agent's FSDP worker
    does: mini-batch rows ``ppo_mini_batch_size × rollout.n``, dp = GPUs / Ulysses size."""
    actor = "actor_rollout_ref.actor"
    gpus = int(cfg_select(config, "trainer.n_gpus_per_node", 1)) * int(cfg_select(config, "trainer.nnodes", 1))
    dp = gpus // int(cfg_select(config, f"{actor}.ulysses_sequence_parallel_size", 1))
    micro = cfg_select(config, f"{actor}.ppo_micro_batch_size_per_gpu")
    if micro is None and cfg_select(config, f"{actor}.ppo_micro_batch_size") is not None:
        micro = int(cfg_select(config, f"{actor}.ppo_micro_batch_size")) // dp
    dynamic = bool(cfg_select(config, f"{actor}.use_dynamic_bsz", False))
    if micro is None and not dynamic:
        raise VerlAgentConfigError(f"{actor}.ppo_micro_batch_size_per_gpu is not set (verl-agent's adjust_batch needs it too)")
    return ActorLoss(
        mini_batch_rows=int(cfg_select(config, f"{actor}.ppo_mini_batch_size")) * int(cfg_select(config, "actor_rollout_ref.rollout.n", 1)),
        micro_batch_rows=None if micro is None else int(micro), dp=dp, dynamic_bsz=dynamic,
        loss_agg_mode=str(cfg_select(config, f"{actor}.loss_agg_mode", "token-mean")),
        loss_mode=str(cfg_select(config, f"{actor}.policy_loss.loss_mode", "vanilla")))


def check_config(config: Any) -> Setup:
    """The run's :class:`Setup` from verl-agent's config, or a :class:`VerlAgentConfigError` naming the key.

    Options: ``algorithm.oma.*`` (:class:`oma.hosts.HostOptions`; defaults OA + MA), the estimator from
    ``algorithm.adv_estimator``, ``norm_by_std`` from ``algorithm.norm_adv_by_std_in_grpo`` (GRPO) or
    ``algorithm.gigpo.mode`` (GiGPO), ω from ``algorithm.gigpo.step_advantage_w``, and under
    ``mass=native`` the reducer from the actor's aggregation. Refused: another estimator, GiGPO's
    similarity-based step groups, ``algorithm.oma.estimator``/``gamma``/``outcome=final``; under Mass
    Alignment, an actor :class:`ActorLoss` does not model (Megatron, multi-turn ``loss_mask``), the
    aggregations it cannot carry (:meth:`ActorLoss.check_carrier`), and a KL loss or entropy bonus
    (:func:`unaligned_terms`) unless ``algorithm.oma.allow_unaligned=true`` keeps them outside it.
    """
    raw = cfg_select(config, "algorithm.adv_estimator", "gae")
    estimator = str(getattr(raw, "value", raw))
    if estimator not in ESTIMATORS:
        raise VerlAgentConfigError(f"algorithm.adv_estimator={estimator} has no OMA form; use one of {list(ESTIMATORS)}, "
                                   "or keep verl-agent's own compute_advantage for it")
    node = _node(config)
    allow = node.pop(ALLOW_UNALIGNED, False)
    if not isinstance(allow, bool):
        raise VerlAgentConfigError(f"{PREFIX}.{ALLOW_UNALIGNED} must be true or false, got {allow!r}")
    if "estimator" in node:
        raise VerlAgentConfigError(f"{PREFIX}.estimator is not an option here: algorithm.adv_estimator picks it")
    if estimator == "gigpo":
        mode = str(cfg_select(config, "algorithm.gigpo.mode", "mean_norm"))
        if mode not in GIGPO_MODES:
            raise VerlAgentConfigError(f"algorithm.gigpo.mode must be one of {list(GIGPO_MODES)}, got {mode!r}")
        if cfg_select(config, "algorithm.gigpo.enable_similarity", False):
            raise VerlAgentConfigError("algorithm.gigpo.enable_similarity=True: oma's step groups are the rows of a uid "
                                       "with equal anchor_obs; set it to False")
        defaults = {"norm_by_std": GIGPO_MODES[mode],
                    "step_advantage_w": float(cfg_select(config, "algorithm.gigpo.step_advantage_w", 1.0))}
    else:
        defaults = {"norm_by_std": bool(cfg_select(config, "algorithm.norm_adv_by_std_in_grpo", True))}
    actor = actor_from_config(config)
    opts = read_options({**defaults, **node, "estimator": estimator})
    if opts.mass == "native":
        if node.get("reducer", actor.mode) != actor.mode:
            raise VerlAgentConfigError(f"{PREFIX}.reducer={node['reducer']} with mass=native: verl-agent's own loss aggregates "
                                       f"by {actor.mode} (actor_rollout_ref.actor.loss_agg_mode); drop {PREFIX}.reducer")
        opts = dataclasses.replace(opts, reducer=actor.mode)
    unaligned = unaligned_terms(config) if opts.mass != "native" else []
    if opts.mass != "native":
        strategy = str(cfg_select(config, "actor_rollout_ref.actor.strategy", "fsdp"))
        if strategy not in STRATEGIES:
            raise VerlAgentConfigError(f"actor_rollout_ref.actor.strategy={strategy} with {PREFIX}.mass={opts.mass}: oma "
                                       f"carries its weights through verl-agent's FSDP actor only; use one of {list(STRATEGIES)}")
        if cfg_select(config, "actor_rollout_ref.rollout.multi_turn.enable", False):
            raise VerlAgentConfigError(f"actor_rollout_ref.rollout.multi_turn.enable=True with {PREFIX}.mass={opts.mass}: "
                                       "the actor then masks by loss_mask, not the response_mask oma weighs; set it to False")
        actor.check_carrier()
        if unaligned and not allow:
            raise VerlAgentConfigError(f"{unaligned[0][2]}, or +{PREFIX}.{ALLOW_UNALIGNED}=true to train with it "
                                       f"outside Mass Alignment ({PREFIX}.mass={opts.mass})")
    use_penalty = bool(cfg_select(config, "actor_rollout_ref.actor.use_invalid_action_penalty", True))
    coef = float(cfg_select(config, "actor_rollout_ref.actor.invalid_action_penalty_coef", 0.1))
    return Setup(opts, actor, coef if use_penalty else 0.0, tuple((name, c) for name, c, _ in unaligned))


def _integers(values: Any) -> bool:
    array = np.asarray(values)
    if array.dtype == object:  # verl keeps non-tensor columns as object arrays when they were built from lists
        return all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in array.tolist())
    return bool(np.issubdtype(array.dtype, np.integer))


def compute_advantage(data: Any, config: Any, metrics: MutableMapping[str, Any] | None = None, *,
                      iteration: int | None = None) -> Any:
    """verl-agent's ``compute_advantage`` step with OMA: writes ``advantages`` (:attr:`VerlAgentResult.advantages`)
    and ``returns`` (A on the response mask) into ``data.batch`` and the ``oma/*`` metrics into ``metrics``;
    returns ``data``. Call it where verl-agent calls its own, after ``apply_invalid_action_penalty``;
    the scores are the batch's ``token_level_rewards`` (penalty and KL penalty in), the copies its
    ``row_id`` (docs/verl-agent.md#padding-copies). Nothing is written when it refuses."""
    setup = check_config(config)
    tensors, non_tensors = data.batch, data.non_tensor_batch
    if setup.options.mass != "native" and setup.actor.dynamic_bsz and "multi_modal_inputs" in non_tensors:
        raise VerlAgentConfigError(
            "actor_rollout_ref.actor.use_dynamic_bsz=True on a multi-modal batch: verl-agent's actor then scales each "
            "micro-batch's loss by the number of its keys (len of a dict), not its rows; set use_dynamic_bsz=False")
    if "row_id" in non_tensors and not _integers(non_tensors["row_id"]):
        raise VerlAgentConfigError("batch.non_tensor_batch['row_id'] must hold one integer per row: set it to "
                                   "np.arange(len(batch)) just before adjust_batch (docs/verl-agent.md#quick-start)")
    columns: dict[str, Any] = {k: non_tensors[k] for k in NON_TENSOR_COLUMNS if k in non_tensors}
    columns.update({k: tensors[k] for k in TENSOR_COLUMNS if k in tensors.keys()})
    result = align_batch(columns, setup.options, actor=setup.actor, invalid_penalty=setup.invalid_penalty,
                         iteration=iteration, unaligned_coef=sum(abs(c) for _, c in setup.unaligned))
    mask = tensors["response_mask"]
    tensors["advantages"] = result.advantages.to(mask.device)
    tensors["returns"] = (result.adv.unsqueeze(-1) * mask.detach().cpu()).to(torch.float32).to(mask.device)
    if metrics is not None:
        metrics.update(result.metrics)
    return data

