r"""oma inside SkyRL's step-wise trainer (``skyrl`` 0.4.0): config, trainers, entry point.

* :class:`OMASkyRLTrainConfig`: SkyRL's config with ``trainer.algorithm.oma`` (:class:`OMAConfig`),
  the way SkyRL asks integrations to add fields (subclassing its config dataclasses).
* :class:`OMATrainerMixin` overrides two methods of SkyRL's ``RayPPOTrainer``:

  - ``compute_advantages_and_returns``: reads the trajectory structure (``uids``,
    ``is_last_step``) before SkyRL drops it, keeps SkyRL's advantages under
    ``accounting: trajectory`` (its step-wise branch already computes one outcome per trajectory)
    and recomputes them with every row as a group member under ``accounting: row``;
  - ``_normalize_advantages``: ``mass: native`` is SkyRL's per-mini-batch ``loss_reduction``;
    ``uniform``/``group`` multiply the advantages by :func:`oma.integrations.skyrl.batch.mass_weights`,
    computed once over the whole training batch.

  :class:`OMARayPPOTrainer` and :class:`OMAFullyAsyncRayPPOTrainer` (``trainer.fully_async.enabled``)
  apply it to SkyRL's two trainers.
* :func:`main`: SkyRL's entry point with oma's config and trainers, reached from SkyRL's own command
  with ``trainer.override_entrypoint=oma.integrations.skyrl.trainer`` or as
  ``python -m oma.integrations.skyrl``. docs/skyrl.md.
"""

# No `from __future__ import annotations`: SkyRL's config builder reads the dataclass field types
# (OMATrainerConfig, OMAAlgorithmConfig, OMAConfig) as classes, not strings.
import logging
import os
import sys
from dataclasses import dataclass, field

import ray
import torch
from skyrl.train.config import AlgorithmConfig, SkyRLTrainConfig, TrainerConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils import initialize_ray, validate_cfg

from oma.integrations.skyrl.batch import (
    KEY,
    OMAConfig,
    check_config,
    mass_weights,
    row_accounted_advantages,
    stepwise_structure,
    write_audit_batch,
)

logger = logging.getLogger("oma.integrations.skyrl")
logger.setLevel(os.getenv("OMA_SKYRL_LOGGING_LEVEL", "INFO"))
if not logger.handlers and not logging.getLogger().handlers:
    logger.addHandler(logging.StreamHandler())

STRUCTURE_KEY = "oma_structure"
"""Training-batch metadata key under which the trajectory structure travels from the advantages to
the normalisation (SkyRL removes ``uids`` and ``is_last_step`` in between)."""


@dataclass
class OMAAlgorithmConfig(AlgorithmConfig):
    oma: OMAConfig = field(default_factory=OMAConfig)


@dataclass
class OMATrainerConfig(TrainerConfig):
    algorithm: OMAAlgorithmConfig = field(default_factory=OMAAlgorithmConfig)


@dataclass
class OMASkyRLTrainConfig(SkyRLTrainConfig):
    """SkyRL's root config with ``trainer.algorithm.oma``; ``from_cli_overrides`` reads
    ``trainer.algorithm.oma.mass=uniform`` like any SkyRL key."""

    trainer: OMATrainerConfig = field(default_factory=OMATrainerConfig)


class OMATrainerMixin:
    """Mix in before SkyRL's ``RayPPOTrainer`` (or a subclass of it)."""

    def __init__(self, *args, **kwargs) -> None:
        cfg = kwargs.get("cfg", args[0] if args else None)
        self.oma = check_config(cfg)  # refused by key before any model is built
        super().__init__(*args, **kwargs)
        logger.info("oma: SkyRL integration active in %s: %s.accounting=%s, mass=%s (loss_reduction=%s, policy "
                    "loss %s)", type(self).__name__, KEY, self.oma.accounting, self.oma.mass,
                    cfg.trainer.algorithm.loss_reduction, cfg.trainer.algorithm.policy_loss_type)

    def compute_advantages_and_returns(self, data):
        """SkyRL's, plus the trajectory structure; under ``accounting: row`` every step is a group member.
        With ``audit_dir`` the batch is also written for ``oma audit``."""
        if not (self.oma.active or self.oma.audit_dir):
            return super().compute_advantages_and_returns(data)
        structure = stepwise_structure(list(data.metadata["uids"]), data.metadata.get("is_last_step"))
        rewards = data["rewards"].cpu()
        if self.oma.audit_dir:
            write_audit_batch(self.oma.audit_dir, self.global_step, structure, rewards, data["loss_mask"].cpu(),
                              data.metadata.get("pad_size", 0))
        data = super().compute_advantages_and_returns(data)
        if not self.oma.active:
            return data
        if self.oma.accounting == "row":
            algo = self.cfg.trainer.algorithm
            adv = row_accounted_advantages(rewards, data["response_mask"], structure,
                                           estimator=str(algo.advantage_estimator), norm_by_std=algo.grpo_norm_by_std)
            data["advantages"], data["returns"] = adv, adv.clone()
            self._report_advantages(data)
        data.metadata[STRUCTURE_KEY] = structure
        return data

    def _report_advantages(self, data) -> None:
        """SkyRL's advantage metrics, for the row-accounted advantages that replaced its own."""
        rows = len(data["advantages"]) - data.metadata.get("pad_size", 0)
        valid = torch.masked_select(data["advantages"][:rows], data["response_mask"][:rows].bool())
        mean, mean_abs = valid.mean().item(), valid.abs().mean().item()
        data.metadata["metrics"].update({"avg_advantages": mean, "avg_advantages_abs": mean_abs})
        self.all_metrics.update({"loss/avg_raw_advantages": mean, "loss/avg_raw_advantages_abs": mean_abs})

    def _normalize_advantages(self, data, mini_batch_boundaries, prompt_boundaries=None):
        """``mass: native``: SkyRL's per-mini-batch reduction. Else A·W with W over the whole batch."""
        structure = data.metadata.pop(STRUCTURE_KEY, None)
        if self.oma.mass == "native":
            return super()._normalize_advantages(data, mini_batch_boundaries, prompt_boundaries)
        if structure is None:
            raise RuntimeError(f"oma: the training batch has no metadata[{STRUCTURE_KEY!r}]; "
                               "compute_advantages_and_returns must run on it first")
        algo = self.cfg.trainer.algorithm
        weights = mass_weights(data["loss_mask"], structure, mass=self.oma.mass, loss_reduction=algo.loss_reduction,
                               max_seq_len=algo.max_seq_len, n_minibatches=len(mini_batch_boundaries))
        data["advantages"] = data["advantages"] * weights.to(data["advantages"].dtype)
        return data


class OMARayPPOTrainer(OMATrainerMixin, RayPPOTrainer):
    """SkyRL's synchronous PPO trainer with OMA."""


class OMAFullyAsyncRayPPOTrainer(OMATrainerMixin, FullyAsyncRayPPOTrainer):
    """SkyRL's fully asynchronous trainer with OMA (``trainer.fully_async.enabled=true``)."""


class OMAPPOExp(BasePPOExp):
    """SkyRL's experiment with oma's trainers."""

    def get_trainer(self, cfg, tracker, tokenizer, train_dataset, eval_dataset, inference_engine_client, generator,
                    colocate_pg):
        trainer = OMAFullyAsyncRayPPOTrainer if cfg.trainer.fully_async.enabled else OMARayPPOTrainer
        return trainer(cfg=cfg, tracker=tracker, tokenizer=tokenizer, train_dataset=train_dataset,
                       eval_dataset=eval_dataset, inference_engine_client=inference_engine_client,
                       generator=generator, colocate_pg=colocate_pg)


@ray.remote(num_cpus=1)
def skyrl_entrypoint(cfg: OMASkyRLTrainConfig) -> None:
    OMAPPOExp(cfg).run()  # on a worker, not the head node, as SkyRL's own entry point does


def parse_config(argv: list[str]) -> OMASkyRLTrainConfig:
    """SkyRL's ``key.path=value`` overrides (``trainer.override_entrypoint`` dropped), validated by
    SkyRL and by oma (each refusal names its key)."""
    cfg = OMASkyRLTrainConfig.from_cli_overrides([a for a in argv if not a.startswith("trainer.override_entrypoint=")])
    validate_cfg(cfg)
    check_config(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
