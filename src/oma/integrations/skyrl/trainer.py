r"""oma inside SkyRL's step-wise trainer (``skyrl`` 0.4.0): config, trainers, entry point.

* :class:`OMASkyRLTrainConfig`: SkyRL's config with ``trainer.algorithm.oma`` (a mapping of the
  contract's options, :func:`oma.integrations.skyrl.batch.host_options`), the way SkyRL asks integrations
  to add fields (subclassing its config dataclasses).
* :class:`OMATrainerMixin` overrides two methods of SkyRL's ``RayPPOTrainer``:

  - ``compute_advantages_and_returns``: reads the batch into an :class:`oma.hosts.HostStep`
    (``uids``, ``is_last_step``) before SkyRL drops them, writes it under ``dump_dir``
    (:func:`oma.hosts.dump`), keeps SkyRL's advantages under ``accounting: trajectory`` (its step-wise
    branch already computes one outcome per trajectory) and takes :func:`oma.hosts.advantages` under
    ``accounting: row``;
  - ``_normalize_advantages``: ``mass: native`` is SkyRL's per-mini-batch ``loss_reduction``;
    ``uniform``/``group`` multiply the advantages by :func:`oma.hosts.weights` over the whole training
    batch, times its number of mini-batches; either way it logs :func:`oma.hosts.metrics`.

  :class:`OMARayPPOTrainer` and :class:`OMAFullyAsyncRayPPOTrainer` (``trainer.fully_async.enabled``)
  apply it to SkyRL's two trainers.
* :func:`main`: SkyRL's entry point with oma's config and trainers, reached from SkyRL's own command
  with ``trainer.override_entrypoint=oma.integrations.skyrl.trainer`` or as
  ``python -m oma.integrations.skyrl``. docs/skyrl.md.
"""

# No `from __future__ import annotations`: SkyRL's config builder reads the dataclass field types
# (OMATrainerConfig, OMAAlgorithmConfig) as classes, not strings.
import logging
import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import ray
import torch
from skyrl.train.config import AlgorithmConfig, SkyRLTrainConfig, TrainerConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils import initialize_ray, validate_cfg

from oma import hosts
from oma.integrations.skyrl.batch import (
    KEY,
    REDUCER_OF_LOSS_REDUCTION,
    changes_skyrl,
    check_binary,
    check_config,
    check_version,
    host_step,
    minibatches,
)

logger = logging.getLogger("oma.integrations.skyrl")
logger.setLevel(os.getenv("OMA_SKYRL_LOGGING_LEVEL", "INFO"))
if not logger.handlers and not logging.getLogger().handlers:
    logger.addHandler(logging.StreamHandler())

STEP_KEY = "oma_step"
"""Training-batch metadata key under which the step (:class:`oma.hosts.HostStep`) travels from the
advantages to the normalisation (SkyRL removes ``uids`` and ``is_last_step`` in between)."""


@dataclass
class OMAAlgorithmConfig(AlgorithmConfig):
    oma: dict[str, Any] = field(default_factory=dict)
    """``accounting``, ``mass``, ``dump_dir`` (docs/skyrl.md#configuration-reference); read and checked by
    :func:`oma.integrations.skyrl.batch.host_options`."""


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
        check_version()
        self.oma = check_config(cfg)  # refused by key before any model is built
        super().__init__(*args, **kwargs)
        logger.info("oma: SkyRL integration active in %s: %s.accounting=%s, mass=%s (loss_reduction=%s, policy "
                    "loss %s)", type(self).__name__, KEY, self.oma.accounting, self.oma.mass,
                    cfg.trainer.algorithm.loss_reduction, cfg.trainer.algorithm.policy_loss_type)

    def compute_advantages_and_returns(self, data):
        """SkyRL's, plus the batch in oma's ids; under ``accounting: row`` every step is a group member.
        With ``dump_dir`` the batch is also written for ``oma audit``."""
        if not (changes_skyrl(self.oma) or self.oma.dump_dir):
            return super().compute_advantages_and_returns(data)
        pad_size = data.metadata.get("pad_size", 0)
        step = host_step(list(data.metadata["uids"]), data.metadata.get("is_last_step"), data["rewards"].cpu(),
                         data["loss_mask"].cpu(), pad_size)
        if self.oma.dump_dir:
            hosts.dump(step, self.oma, self.global_step)
        data = super().compute_advantages_and_returns(data)
        if self.oma.accounting == "row":
            rows_adv = torch.zeros(len(data["advantages"]), dtype=torch.float64)
            rows_adv[:step.rows] = hosts.advantages(step, self.oma)
            adv = rows_adv.to(data["rewards"].dtype).unsqueeze(-1) * data["response_mask"].to(data["rewards"].dtype)
            data["advantages"], data["returns"] = adv, adv.clone()
            self._report_advantages(data)
        data.metadata[STEP_KEY] = step
        return data

    def _report_advantages(self, data) -> None:
        """SkyRL's advantage metrics, for the row-accounted advantages that replaced its own."""
        rows = len(data["advantages"]) - data.metadata.get("pad_size", 0)
        valid = torch.masked_select(data["advantages"][:rows], data["response_mask"][:rows].bool())
        mean, mean_abs = valid.mean().item(), valid.abs().mean().item()
        data.metadata["metrics"].update({"avg_advantages": mean, "avg_advantages_abs": mean_abs})
        self.all_metrics.update({"loss/avg_raw_advantages": mean, "loss/avg_raw_advantages_abs": mean_abs})

    def _normalize_advantages(self, data, mini_batch_boundaries, prompt_boundaries=None):
        """``mass: native``: SkyRL's per-mini-batch reduction. Else A·W with W over the whole batch
        (:func:`oma.hosts.weights`). With a step (OMA on, or ``dump_dir``) the ``oma/*`` metrics too."""
        step = data.metadata.pop(STEP_KEY, None)
        if step is None:
            if changes_skyrl(self.oma):
                raise RuntimeError(f"oma: the training batch has no metadata[{STEP_KEY!r}]; "
                                   "compute_advantages_and_returns must run on it first")
            return super()._normalize_advantages(data, mini_batch_boundaries, prompt_boundaries)
        step = replace(step, minibatches=minibatches(mini_batch_boundaries, step.rows))
        if self.oma.mass == "native":
            data = super()._normalize_advantages(data, mini_batch_boundaries, prompt_boundaries)
            # SkyRL's own normaliser, as oma's reducer writes it; prompt_mean / token_mean_legacy have none:
            # no weights, so the metrics leave the mass figures out
            known = self.cfg.trainer.algorithm.loss_reduction in REDUCER_OF_LOSS_REDUCTION
            w = hosts.weights(step, self.oma) if known else torch.zeros(step.response_mask.shape, dtype=torch.float64)
        else:
            check_binary(data["loss_mask"])
            w = hosts.weights(step, self.oma)
            weights = torch.zeros(data["advantages"].shape, dtype=torch.float64)
            weights[:step.rows] = w
            data["advantages"] = data["advantages"] * weights.to(data["advantages"].dtype)
        self.all_metrics.update(hosts.metrics(step, self.oma, w))
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
    SkyRL and by oma (each refusal names its key), on the SkyRL version oma was tested on."""
    check_version()
    cfg = OMASkyRLTrainConfig.from_cli_overrides([a for a in argv if not a.startswith("trainer.override_entrypoint=")])
    check_config(cfg)  # oma's keys first: SkyRL's own checks may stop at something else (a logger's key)
    validate_cfg(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    initialize_ray(cfg)
    ray.get(skyrl_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
