r"""The trajectory-aware part of oma's verl trainers, as a mixin over verl's v1 ``PPOTrainer``.

Changes three things of ``verl.trainer.ppo.v1.trainer_base.PPOTrainer`` (verl 0.9.1):

* ``trainer_mode`` reads as the verl mode the class extends (``sync`` …), so verl's mode-specific
  code (replay buffer, ``trainer.v1.<mode>`` options, checkpoints) behaves exactly as for that mode
  while ``trainer.v1.trainer_mode`` selects ``oma_sync`` (…) by name;
* the ``actor/entropy`` metric per token, and
* the advantage: verl's ``_compute_advantage`` steps (KL-in-reward, rollout correction, write-back)
  unchanged, with :func:`oma.integrations.verl.batch.compute_oma_batch` in place of the estimator:
  verl's batch read into :class:`oma.hosts.HostStep` and :func:`oma.hosts.align` called on it (OA over
  the step's batch, MA weights over the step, the ``oma/*`` metrics, the batch written under
  ``algorithm.oma.dump_dir``); ``advantages = A·W`` and ``returns = A`` (so verl's
  ``critic/returns/*`` metrics show the unweighted advantage).

The two verl methods are overridden in :class:`oma.integrations.verl._verl_private.TrainerOverrides`,
with every other verl private oma reads. At construction the mixin refuses a verl other than 0.9.x and
configurations where the objective would not be exact
(:func:`oma.integrations.verl.batch.check_trainer_config`), and verifies, and logs, that the oma
names are registered in verl (plugin failures are otherwise silent).

Importable without verl's trainer stack (TransferQueue etc.): those are imported when used.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from oma.integrations.verl import _verl_private
from oma.integrations.verl.batch import check_trainer_config, compute_oma_batch, prompt_anchor_ids
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


class OMATrainerMixin(_verl_private.TrainerOverrides):
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
        _verl_private.check_version()
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

    def _oma_dp_size(self) -> int:
        """The actor's data-parallel size."""
        return _verl_private.dp_size(self.actor_rollout_wg)

    def _oma_mini_batch_rows(self, n_rows: int) -> int | None:
        """Rows per PPO mini-batch (``ppo_mini_batch_size·rollout.n``), or None when it does not tile the batch."""
        actor = self.config.actor_rollout_ref.actor
        rows = int(actor.ppo_mini_batch_size) * int(self.config.actor_rollout_ref.rollout.n)
        if rows <= 0 or n_rows % rows:
            return None  # no actor update this step (critic warm-up) or verl did not pad: one mini-batch
        return rows

    def _oma_iteration(self) -> int:
        """The number of this training batch: verl's global step, or with ``parameter_sync_step`` = p > 1
        (p batches per global step) (global step − 1)·p + the batch's index + 1."""
        return (self.global_steps - 1) * self.parameter_sync_step + self.local_trigger_step + 1

    def _oma_fields(self) -> list[str]:
        """TransferQueue fields the advantage reads besides verl's: the prompts GiGPO anchors on."""
        return ["prompts"] if self.oma_options.estimator == "gigpo" else []

    def _oma_advantages(self, data, batch, extra: dict, metrics: dict) -> None:
        """OA advantages and MA weights over the step (:func:`compute_oma_batch`): ``advantages = A·W``,
        ``returns = A``, the ``oma/*`` metrics, and the batch under ``dump_dir``."""
        key_uids = [str(k).rsplit("_", 2)[0] for k in batch.keys]
        data_uids = [str(u) for u in data.non_tensor_batch["uid"].tolist()]
        if key_uids != data_uids:
            bad = next(i for i, (a, b) in enumerate(zip(key_uids, data_uids, strict=True)) if a != b)
            raise ValueError(f"oma: row {bad}: key {batch.keys[bad]!r} does not start with its uid {data_uids[bad]!r}")
        prompts = extra.get("prompts")
        anchor = None
        if prompts is not None:
            anchor = prompt_anchor_ids(list(prompts.unbind(0)) if prompts.is_nested else list(prompts))
        result = compute_oma_batch(
            data.batch["token_level_rewards"],
            data.batch["response_mask"],
            list(batch.keys),
            self.config.algorithm,
            dp_size=self._oma_dp_size(),
            mini_batch_rows=self._oma_mini_batch_rows(len(batch)),
            padding=[tag.get("is_padding", False) for tag in batch.tags],
            anchor=anchor,
            loss_scale_factor=cfg_get(self.config.actor_rollout_ref.actor, "loss_scale_factor", None),
            iteration=self._oma_iteration() if self.oma_options.dump_dir is not None else None,
        )
        data.batch["advantages"] = result.weighted_advantages
        data.batch["returns"] = result.advantages.to(result.weighted_advantages.dtype)
        metrics.update(result.metrics)
