r"""SkyRL 0.4.0 with oma's trainer on the CPU (docs/skyrl.md#skyrl-on-cpu): ``python -m
oma.integrations.skyrl.cpu [--metrics FILE] key.path=value ...`` trains as ``python -m
oma.integrations.skyrl`` does, with no GPU and no vLLM. ``oma skyrl-smoke`` runs it.

SkyRL's own code runs: its config and validation, Ray set-up (``initialize_ray``; Ray's GPU slots
are declared by the caller with ``RAY_OVERRIDE_RESOURCES``: nothing uses a GPU), datasets,
``SkyRLGymGenerator`` and skyrl_gym environments, the step-wise batch, dispatch, its FSDP policy
worker (forward, loss, backward, optimizer step; FSDP2 over gloo) and its training loop, with oma's
``OMARayPPOTrainer`` on top. What differs from a GPU run, each through SkyRL's public extension
points:

* :class:`CPUPPOExp` (SkyRL's ``BasePPOExp`` hooks): the inference engine is a Hugging Face model
  in a Ray actor (:mod:`oma.integrations.skyrl.hf_generator`) instead of vLLM servers; datasets are
  filtered in-process (SkyRL spawns 8 processes for it);
* :class:`CPUOMARayPPOTrainer` (``RayPPOTrainer.build_models``): oma's trainer with the CPU workers
  below, and, as metrics, each trajectory's mass in the step's objective (:class:`MassProbeMixin`)
  and the weights' version that generated the step's rollouts;
* the workers (:class:`CPUWorkerMixin`): SkyRL's FSDP workers, with the CUDA-only parts of their
  process pointed at the CPU (:mod:`oma.integrations.skyrl.cpu_patches`, the only patches), a gloo
  process group, and the policy's weights sent to the Hugging Face engine after every update (SkyRL's
  weight-sync engines are vLLM's).

``--metrics FILE`` appends each step's logged metrics to FILE as one JSON object a line (a SkyRL
``TrainingCallback``).
"""

# No `from __future__ import annotations`: SkyRL's config builder reads dataclass field types as classes.
import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from oma.integrations.skyrl import cpu_patches

cpu_patches.stub_flash_attn()  # before SkyRL's FSDP worker module is imported, here or in a Ray worker

import ray  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from skyrl.backends.skyrl_train.distributed.fsdp_utils import fsdp2_get_full_state_dict  # noqa: E402
from skyrl.backends.skyrl_train.inference_servers.utils import resolve_policy_model_name  # noqa: E402
from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch  # noqa: E402
from skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker import (  # noqa: E402
    FSDPCriticWorkerBase,
    FSDPPolicyWorkerBase,
    FSDPRefWorkerBase,
)
from skyrl.env_vars import SKYRL_WORKER_NCCL_TIMEOUT_IN_S  # noqa: E402
from skyrl.train.dataset import PromptDataset  # noqa: E402
from skyrl.train.utils import initialize_ray  # noqa: E402
from skyrl.train.utils.callbacks import TrainingCallback  # noqa: E402

from oma import core  # noqa: E402
from oma.integrations.skyrl.batch import host_step  # noqa: E402
from oma.integrations.skyrl.hf_generator import HFInferenceClient, start_engine  # noqa: E402
from oma.integrations.skyrl.trainer import OMAPPOExp, OMARayPPOTrainer, OMASkyRLTrainConfig, parse_config  # noqa: E402

# ---------------------------------------------------------------------------------------- workers


class CPUWorkerMixin:
    """Mix in before one of SkyRL's FSDP workers: its Ray actor process computes on the CPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cpu_patches.install()
        torch.set_num_threads(1)
        super().__init__(*args, **kwargs)

    def init_worker_process_group(self) -> None:
        """SkyRL's, on a gloo process group (SkyRL asks for ``cpu:gloo,cuda:nccl``)."""
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo", timeout=timedelta(seconds=SKYRL_WORKER_NCCL_TIMEOUT_IN_S))
        super().init_worker_process_group()

    def offload_to_cpu(self, offload_optimizer: bool = True, offload_model: bool = True) -> None:
        """Nothing to move: the model and optimizer live in CPU memory (SkyRL's picks a NUMA node per GPU)."""

    def backload_to_gpu(self, backload_optimizer: bool = True, backload_model: bool = True) -> None:
        """Nothing to move (see :meth:`offload_to_cpu`)."""


class CPUPolicyWorkerBase(CPUWorkerMixin, FSDPPolicyWorkerBase):
    """SkyRL's FSDP policy worker on the CPU; its weights go to the Hugging Face engine."""

    async def init_weight_sync_state(self, inference_engine_client, inference_engine_cfg) -> None:
        """Keep the client (SkyRL builds a vLLM transfer engine here)."""
        if not isinstance(inference_engine_client, HFInferenceClient):
            raise TypeError("oma's CPU policy worker syncs weights to oma's Hugging Face engine only, got "
                            f"{type(inference_engine_client).__name__}")
        self._weight_sync_inference_client = inference_engine_client
        dist.barrier()

    async def broadcast_to_inference_engines(self, inference_engine_client, inference_engine_cfg, model_id=None) -> None:
        """Gather the full state dict (every rank takes part) and send it from rank 0."""
        client = inference_engine_client or self._weight_sync_inference_client
        if self._is_lora:
            raise NotImplementedError("LoRA weight sync to the Hugging Face engine (CPU runs train full weights)")
        state = fsdp2_get_full_state_dict(self.model.model, cpu_offload=True, rank0_only=True)
        if dist.get_rank() == 0:
            await client.update_named_weights({"named_tensors": {k: v.detach().cpu() for k, v in state.items()}})
        dist.barrier()


class CPURefWorkerBase(CPUWorkerMixin, FSDPRefWorkerBase):
    """SkyRL's FSDP reference worker on the CPU."""


class CPUCriticWorkerBase(CPUWorkerMixin, FSDPCriticWorkerBase):
    """SkyRL's FSDP critic worker on the CPU."""


# Ray actors as SkyRL declares its own (one GPU slot each: Ray's, declared by the caller; no GPU is used)
CPUPolicyWorker = ray.remote(num_gpus=1)(CPUPolicyWorkerBase)
CPURefWorker = ray.remote(num_gpus=1)(CPURefWorkerBase)
CPUCriticWorker = ray.remote(num_gpus=1)(CPUCriticWorkerBase)


# ---------------------------------------------------------------------------------------- trainer


def trajectory_masses(weights: torch.Tensor, loss_mask: torch.Tensor, uids, is_last_step) -> torch.Tensor:
    """Each trajectory's total weight Σ W over its trainable tokens, float64, for the trajectories
    that have one (SkyRL's padding rows have none)."""
    traj_index = host_step(list(uids), is_last_step, torch.zeros(loss_mask.shape), loss_mask).traj_index
    n = int(traj_index.max()) + 1
    mass = core.segment_sum((weights.double() * (loss_mask != 0)).sum(-1), traj_index, n)
    tokens = core.segment_sum((loss_mask != 0).sum(-1).double(), traj_index, n)
    return mass[tokens > 0]


class MassProbeMixin:
    """Measures each trajectory's mass in the step's objective, whatever computes it.

    The policy losses oma accepts are ℓ(A′) with A′ = A·W, so a trajectory's share of the step's
    objective is Σ W over its tokens. The probe runs the trainer's own ``_normalize_advantages``
    (oma's under ``mass: uniform``/``group``, SkyRL's under ``native``) once more on a copy of the
    batch whose advantages are 1 on every trainable token: what comes out is W. Logged:
    ``probe/trajectories`` (T, with a trainable token) and ``probe/effective_trajectories``
    ((Σ m)² / Σ m², Kish; T exactly when every trajectory weighs the same).
    """

    def compute_advantages_and_returns(self, data):
        uids = list(data.metadata["uids"])
        last = data.metadata.get("is_last_step")  # not step-wise: one row per trajectory
        self._probe_rows = (uids, list(last) if last is not None else [True] * len(uids))
        return super().compute_advantages_and_returns(data)

    def _normalize_advantages(self, data, mini_batch_boundaries, prompt_boundaries=None):
        probe = TrainingInputBatch(dict(data))
        probe.metadata = dict(data.metadata)
        probe["advantages"] = (data["loss_mask"] != 0).to(data["advantages"].dtype)
        weights = super()._normalize_advantages(probe, mini_batch_boundaries, prompt_boundaries)["advantages"]
        mass = trajectory_masses(weights, data["loss_mask"], *self._probe_rows)
        total, square = float(mass.sum()), float((mass * mass).sum())
        self.all_metrics.update({"probe/trajectories": float(len(mass)),
                                 "probe/effective_trajectories": total * total / square if square > 0 else math.nan})
        return super()._normalize_advantages(data, mini_batch_boundaries, prompt_boundaries)


class CPUTrainerMixin:
    """SkyRL's trainer on the CPU workers; logs ``cpu/rollout_weight_version`` (the engine's weights
    version that generated the step's rollouts: step s runs on version s when every update arrived)."""

    def build_models(self, PolicyWorker, CriticWorker, RefWorker):
        return super().build_models(CPUPolicyWorker, CPUCriticWorker, CPURefWorker)

    async def generate(self, input_batch):
        self.inference_engine_client.take_versions()
        out = await super().generate(input_batch)
        versions = self.inference_engine_client.take_versions()
        if versions:
            self.all_metrics["cpu/rollout_weight_version"] = float(min(versions))
        return out


class CPUOMARayPPOTrainer(CPUTrainerMixin, MassProbeMixin, OMARayPPOTrainer):
    """oma's ``OMARayPPOTrainer`` on the CPU (see the module docstring)."""


# ---------------------------------------------------------------------------------------- experiment


class MetricsFile(TrainingCallback):
    """Appends each step's logged metrics (numbers only) to a JSON-lines file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def on_log(self, trainer, callback_input, control) -> None:
        logs = {k: float(v) for k, v in (callback_input.logs or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": callback_input.global_step, **logs}) + "\n")


class CPUPPOExp(OMAPPOExp):
    """SkyRL's experiment with oma's trainer on the CPU (see the module docstring)."""

    def __init__(self, cfg: OMASkyRLTrainConfig, metrics_path: str | None = None) -> None:
        if cfg.trainer.fully_async.enabled:
            raise ValueError("trainer.fully_async.enabled must be false on the CPU (the Hugging Face engine "
                             "cannot pause in-flight requests)")
        self.metrics_path = metrics_path
        super().__init__(cfg)

    def _prompts(self, files) -> PromptDataset:
        return PromptDataset(datasets=files, tokenizer=self.tokenizer, max_prompt_length=self.cfg.trainer.max_prompt_length,
                             num_workers=1)

    def get_train_dataset(self) -> PromptDataset:
        dataset = self._prompts(self.cfg.data.train_data)
        if len(dataset) < self.cfg.trainer.train_batch_size:
            raise ValueError(f"dataset should be at least as large as `train_batch_size` "
                             f"{self.cfg.trainer.train_batch_size}, got size {len(dataset)}")
        return dataset

    def get_eval_dataset(self):
        if self.cfg.trainer.eval_interval > 0 and self.cfg.data.val_data:
            return self._prompts(self.cfg.data.val_data)
        return None

    def get_inference_client(self) -> HFInferenceClient:
        engine = start_engine(self.cfg.trainer.policy.model.path, seed=self.cfg.trainer.seed)
        return HFInferenceClient(engine, resolve_policy_model_name(self.cfg))

    def get_trainer(self, cfg, tracker, tokenizer, train_dataset, eval_dataset, inference_engine_client, generator,
                    colocate_pg):
        trainer = CPUOMARayPPOTrainer(cfg=cfg, tracker=tracker, tokenizer=tokenizer, train_dataset=train_dataset,
                                      eval_dataset=eval_dataset, inference_engine_client=inference_engine_client,
                                      generator=generator, colocate_pg=colocate_pg)
        if self.metrics_path:
            trainer.add_callback(MetricsFile(self.metrics_path))
        return trainer


@ray.remote(num_cpus=1)
def cpu_entrypoint(cfg: OMASkyRLTrainConfig, metrics_path: str | None, env_modules: list[str]) -> None:
    import importlib

    for module in env_modules:  # skyrl_gym registrations live in the process that runs the generator
        importlib.import_module(module).register()
    CPUPPOExp(cfg, metrics_path).run()


def main(argv: list[str] | None = None) -> None:
    """``[--metrics FILE] [--env MODULE ...] key.path=value ...``: parse, start Ray, train, shut Ray down.
    ``--env MODULE``: a module whose ``register()`` registers a skyrl_gym environment."""
    args = list(sys.argv[1:] if argv is None else argv)
    metrics, envs, overrides = None, [], []
    while args:
        arg = args.pop(0)
        if arg == "--metrics":
            metrics = args.pop(0)
        elif arg == "--env":
            envs.append(args.pop(0))
        else:
            overrides.append(arg)
    cfg = parse_config(overrides)
    initialize_ray(cfg)
    try:
        ray.get(cpu_entrypoint.remote(cfg, metrics, envs))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    # by its module name: Ray then ships cpu_entrypoint by reference, and each worker imports this module
    # (and its patches) before anything of SkyRL's
    from oma.integrations.skyrl.cpu import main as _main

    _main()
