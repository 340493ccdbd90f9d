"""``actor_train.worker_cls: oma.integrations.roll.worker.ActorWorker`` (docs/roll.md#quick-start): ROLL's
agentic actor, whose ``loss_func`` first writes each micro-batch's advantages from the hook's ``oma_adv`` and
``oma_weights`` (:func:`oma.integrations.roll.batch.carry`). This module imports ROLL: ROLL loads it by name."""

from __future__ import annotations

from typing import Any

from roll.pipeline.agentic.agentic_actor_worker import ActorWorker as _AgenticActorWorker

from oma.integrations.roll.batch import WEIGHTS_KEY, carry


class ActorWorker(_AgenticActorWorker):
    def loss_func(self, data: Any, output_tensor: Any) -> Any:
        if WEIGHTS_KEY in data.batch.keys():  # absent under mass=native: ROLL's own loss, oma's advantages
            carry(data, self.pipeline_config.loss_agg_mode)
        return super().loss_func(data, output_tensor)
