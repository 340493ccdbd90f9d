"""oma's verl v1 trainers, registered by name (imported lazily by the plugin's hook on
``verl.trainer.ppo.v1``; importing it directly also works).

| ``trainer.v1.trainer_mode`` | extends |
|---|---|
| ``oma_sync`` | ``PPOTrainerSync`` (``sync``) |
| ``oma_colocate_async`` | ``PPOTrainerColocateAsync`` (``colocate_async``) |
| ``oma_separate_async`` | ``PPOTrainerSeparateAsync`` (``separate_async``) |

The OMA behaviour is :class:`oma.integrations.verl.trainer_mixin.OMATrainerMixin`. Needs verl's
trainer stack (``verl[verl-core]``: TransferQueue, ...), which the v1 trainer itself needs.
"""

from __future__ import annotations

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from oma.integrations.verl.trainer_mixin import OMATrainerMixin


@register_trainer("oma_sync")
class OMATrainerSync(OMATrainerMixin, PPOTrainerSync):
    """verl's synchronous v1 trainer with trajectory-aware Outcome-Mass Alignment."""

    _oma_base_mode = "sync"


@register_trainer("oma_colocate_async")
class OMATrainerColocateAsync(OMATrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated asynchronous v1 trainer with trajectory-aware Outcome-Mass Alignment."""

    _oma_base_mode = "colocate_async"


@register_trainer("oma_separate_async")
class OMATrainerSeparateAsync(OMATrainerMixin, PPOTrainerSeparateAsync):
    """verl's separated asynchronous v1 trainer with trajectory-aware Outcome-Mass Alignment."""

    _oma_base_mode = "separate_async"
