r"""Every verl private oma relies on, in one module, each pinned against the installed verl by
tests/test_verl_private.py, so that a verl release which changes one fails there, loudly, and not
silently in a user's run. At start-up the trainer (and the CPU platform) also refuse any verl other than
0.9.x (:func:`check_version`).

* ``PPOTrainer._compute_advantage`` (``verl.trainer.ppo.v1.trainer_base``): **copied** from verl
  0.9.1 into :class:`TrainerOverrides`, with its step 3 handed to oma. verl's own step 3 calls the
  registered estimator with the group ``uid`` only (no trajectory ids, no mini-batch layout) and step 4
  writes the result to TransferQueue inside the same method, so there is no point between them where oma
  could replace the advantages; calling verl's method and then rewriting its output would read and
  write the whole batch twice, and run the estimator where it must refuse (no trajectory ids). The
  copy's source is pinned by hash (:data:`COMPUTE_ADVANTAGE_SHA256`).
* ``PPOTrainer._compute_old_log_prob``: extended (its ``actor/entropy`` metric per token).
* ``WorkerGroup._dispatch_info`` and ``Worker._query_dispatch_info``: the actor's data-parallel size,
  read as verl's ``_balance_batch`` reads it (:func:`dp_size`).
* ``EngineRegistry._engines``, ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` and
  ``RolloutReplica._server_handle`` / ``_server_address``: the CPU platform's registrations
  (:mod:`oma.integrations.verl.cpu`, :mod:`oma.integrations.verl.hf_rollout`).

Importable without verl's trainer stack: verl is imported where it is used.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from oma.hosts import require_version

SUPPORTED = "0.9"
"""The verl series oma's trainer and CPU platform support."""

TESTED = "0.9.1"
"""The verl release the privates below were read from, and the tests pin."""

COMPUTE_ADVANTAGE_SHA256 = "2a4a2aa4a475b228d401959818e0b9019276ce27961c133961de217baa387da7"
"""sha256 of verl 0.9.1's ``inspect.getsource(PPOTrainer._compute_advantage)``, the method
:meth:`TrainerOverrides._compute_advantage` copies."""


def check_version() -> None:
    """Refuse, in one line naming both versions, a verl outside :data:`SUPPORTED`."""
    require_version("verl", SUPPORTED, TESTED)


class TrainerOverrides:
    """verl 0.9.1 ``PPOTrainer`` methods oma overrides; the OMA part is the subclass's
    ``_oma_advantages(data, batch, extra, metrics)`` (it sets ``data.batch["advantages"]`` and
    ``["returns"]``) and ``_oma_fields()`` (the extra TransferQueue fields it reads)."""

    def _tq(self):
        return importlib.import_module("transfer_queue")

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
        """verl 0.9.1's ``_compute_advantage`` with step 3 (the advantage) replaced by ``_oma_advantages``."""
        from tensordict import TensorDict
        from verl.protocol import DataProto
        from verl.workers.utils.padding import response_to_nested

        tq = self._tq()
        algorithm = self.config.algorithm
        extra_fields = self._oma_fields()
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob", "values"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields + extra_fields)

        response_mask = data["response_mask"]
        extra = {f: data.pop(f) for f in extra_fields}  # nested: kept out of the padded batch
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

        # 3. the advantages: oma's
        self._oma_advantages(data, batch, extra, metrics)

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


def dp_size(worker_group: Any, role: str = "actor") -> int:
    """``role``'s data-parallel size, read (and cached) the way verl's ``_balance_batch`` reads it."""
    if role not in worker_group._dispatch_info:
        worker_group._dispatch_info[role] = worker_group._query_dispatch_info(role)
    return max(worker_group._dispatch_info[role]) + 1


def engine_registered(registry: Any, model_type: str, backends: tuple[str, ...], device: str) -> bool:
    """Whether verl's ``EngineRegistry`` holds an engine for ``device`` under every one of ``backends``."""
    engines = registry._engines.get(model_type, {})
    return all(device in engines.get(b, {}) for b in backends)


def register_rollout(rollout_base: Any, name: str, target: str) -> None:
    """Register rollout ``name`` (server mode) as the class at dotted path ``target`` in
    ``verl.workers.rollout.base``, which has no registration function."""
    rollout_base._ROLLOUT_REGISTRY[(name, "async")] = target


def set_replica_server(replica: Any, handle: Any, address: str) -> None:
    """What a ``RolloutReplica.launch_servers`` must leave behind: the handle and address verl's
    ``server_handle`` / ``server_address`` return."""
    replica._server_handle = handle
    replica._server_address = address
