r"""The trajectory-aware part of oma's verl trainers, as a mixin over verl's v1 ``PPOTrainer``.

Overrides three things of ``verl.trainer.ppo.v1.trainer_base.PPOTrainer`` (verl 0.9.1):

* ``trainer_mode`` reads as the verl mode the class extends (``sync`` …), so verl's mode-specific
  code (replay buffer, ``trainer.v1.<mode>`` options, checkpoints) behaves exactly as for that mode
  while ``trainer.v1.trainer_mode`` selects ``oma_sync`` (…) by name;
* ``_compute_old_log_prob``: verl's, with the ``actor/entropy`` metric divided by the step's
  tokens (verl aggregates it with ``loss_agg_mode=token-sum``, so it would be a sum);
* ``_compute_advantage``: verl's steps (KL-in-reward, rollout correction, write-back) unchanged;
  the advantage is :func:`oma.integrations.verl.batch.compute_oma_batch` — OA over the step's
  batch, MA weights over the step (exact whatever the mini-batch boundaries), ``advantages = A·W``
  and ``returns = A`` (so verl's
  ``critic/returns/*`` metrics show the unweighted advantage).

At construction it refuses configurations where the objective would not be exact
(:func:`oma.integrations.verl.batch.check_trainer_config`) and verifies, and logs, that the oma
names are registered in verl (plugin failures are otherwise silent).

Importable without verl's trainer stack (TransferQueue etc.): those are imported when used.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import numpy as np

from oma.integrations.verl.batch import (
    check_trainer_config,
    compute_oma_batch,
    prompt_anchor_ids,
)
from oma.integrations.verl.options import cfg_get, cfg_select

logger = logging.getLogger("oma.integrations.verl")
logger.setLevel(os.getenv("OMA_VERL_LOGGING_LEVEL", "INFO"))
if not logger.handlers and not logging.getLogger().handlers:  # verl normally installs a root handler
    logger.addHandler(logging.StreamHandler())


def verify_registration(trainer_name: str | None = None) -> dict[str, Any]:
    """Check that verl's registries hold oma's estimators (and trainer); log it; raise if not."""
    from verl.trainer.ppo import core_algos

    from oma.integrations.verl import ESTIMATOR_NAMES, _hooks
    from oma.integrations.verl.estimators import ESTIMATOR_FUNCTIONS

    wrong = [n for n in ESTIMATOR_NAMES if core_algos.ADV_ESTIMATOR_REGISTRY.get(n) is not ESTIMATOR_FUNCTIONS[n]]
    if wrong:
        raise RuntimeError(
            f"oma: estimators {wrong} are not registered to oma in verl's ADV_ESTIMATOR_REGISTRY "
            f"(hook errors: {_hooks.errors() or 'none'}). Is the 'verl.plugins' entry point installed "
            "(pip install -e '.[verl]') and VERL_USE_EXTERNAL_PLUGINS not 'none'?"
        )
    report: dict[str, Any] = {"estimators": list(ESTIMATOR_NAMES)}
    trainer_base = sys.modules.get("verl.trainer.ppo.v1.trainer_base")  # loaded whenever a real v1 trainer runs
    if trainer_name is not None and trainer_base is not None:
        if trainer_name not in trainer_base.TRAINER_REGISTRY:
            raise RuntimeError(f"oma: trainer {trainer_name!r} is not in verl's TRAINER_REGISTRY")
        report["trainer"] = trainer_name
    return report


class OMATrainerMixin:
    """Mix in before a verl v1 trainer class; set ``_oma_base_mode`` to that class's verl mode."""

    _oma_base_mode: str = "sync"

    # verl's PPOTrainer.__init__ assigns self.trainer_mode = config.trainer.v1.trainer_mode and
    # compares it with "sync" in several places; this data descriptor keeps the base mode's
    # semantics while the configured name (e.g. "oma_sync") is remembered.
    @property
    def trainer_mode(self) -> str:
        return self._oma_base_mode

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self._oma_trainer_name = value

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.oma_options = check_trainer_config(config)
        name = cfg_select(config, "trainer.v1.trainer_mode", None)
        report = verify_registration(name)
        logger.info(
            "oma: verl integration active — trainer %r (extends verl %r), estimators %s registered; "
            "adv_estimator=%s, options %s, loss_agg_mode=token-sum, policy loss %r",
            name, self._oma_base_mode, report["estimators"], cfg_select(config, "algorithm.adv_estimator"),
            self.oma_options, cfg_select(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"),
        )
        super().__init__(config, *args, **kwargs)

    # ----------------------------------------------------------------------------- helpers

    def _tq(self):
        return importlib.import_module("transfer_queue")

    def _oma_dp_size(self) -> int:
        """The actor's data-parallel size, read the way verl's ``_balance_batch`` reads it."""
        wg = self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        return max(wg._dispatch_info["actor"]) + 1

    def _oma_mini_batch_rows(self, n_rows: int) -> int | None:
        """Rows per PPO mini-batch (``ppo_mini_batch_size·rollout.n``), or None when it does not tile the batch."""
        actor = self.config.actor_rollout_ref.actor
        rows = int(actor.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        if rows <= 0 or n_rows % rows:
            return None  # no actor update this step (critic warm-up) or verl did not pad: one mini-batch
        return rows

    # ------------------------------------------------------------------------- overrides

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's, with ``actor/entropy`` reported per token: verl aggregates it with ``loss_agg_mode``,
        which oma sets to ``token-sum``, so it would be a sum over the step's tokens."""
        batch = super()._compute_old_log_prob(batch, metrics)
        if "actor/entropy" in metrics:
            mask = self._tq().kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                           select_fields=["response_mask"])
            tokens = float(mask.to_padded_tensor()["response_mask"].sum())
            metrics["actor/entropy"] = metrics["actor/entropy"] / max(tokens, 1.0)
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        """verl's ``_compute_advantage`` (0.9.1) with the advantage step replaced by OMA."""
        from tensordict import TensorDict
        from verl.protocol import DataProto
        from verl.trainer.ppo import core_algos
        from verl.workers.utils.padding import response_to_nested

        tq = self._tq()
        algorithm = self.config.algorithm
        estimator = str(algorithm.adv_estimator)
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]
        if estimator == "oma_gigpo":
            fields.append("prompts")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)

        response_mask = data["response_mask"]
        prompts = data.pop("prompts") if estimator == "oma_gigpo" else None
        data = DataProto(batch=data.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)

        # 1. KL penalty in the reward (goes through the advantage, so it stays exact)
        if algorithm.use_kl_in_reward:
            from verl.trainer.ppo.ray_trainer import apply_kl_penalty

            data, kl_metrics = apply_kl_penalty(data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        # 2. rollout correction (decoupled mode): IS weights and rejection on response_mask, before the weights
        rollout_corr_config = algorithm.get("rollout_correction", None)
        bypass = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass
        if rollout_correction:
            from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
            metrics.update(is_metrics)

        # 3. OMA: OA advantages and MA weights over the step, A·W to the update
        key_uids = [str(k).rsplit("_", 2)[0] for k in batch.keys]
        data_uids = [str(u) for u in data.non_tensor_batch["uid"].tolist()]
        if key_uids != data_uids:
            bad = next(i for i, (a, b) in enumerate(zip(key_uids, data_uids, strict=True)) if a != b)
            raise ValueError(f"oma: row {bad}: key {batch.keys[bad]!r} does not start with its uid {data_uids[bad]!r}")
        anchor = None
        if prompts is not None:
            anchor = prompt_anchor_ids(list(prompts.unbind(0)) if prompts.is_nested else list(prompts))
        n_rows = len(batch)
        result = compute_oma_batch(
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            list(batch.keys),
            algorithm,
            dp_size=self._oma_dp_size(),
            mini_batch_rows=self._oma_mini_batch_rows(n_rows),
            anchor=anchor,
            loss_scale_factor=cfg_get(self.config.actor_rollout_ref.actor, "loss_scale_factor", None),
            estimator_fn=core_algos.get_adv_estimator_fn(estimator),
        )
        data.batch["advantages"] = result.weighted_advantages
        data.batch["returns"] = result.advantages.to(result.weighted_advantages.dtype)
        metrics.update(result.metrics)

        # 4. write nested advantages and returns back to TransferQueue (as verl does)
        out_fields = ["advantages", "returns"]
        if algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = {f: response_to_nested(data.batch[f], response_mask) for f in out_fields}
        output = TensorDict(output, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)


