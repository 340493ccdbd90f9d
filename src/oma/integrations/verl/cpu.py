"""verl 0.9.1 on CPU: a CPU platform (gloo) and a Hugging Face rollout, so a verl + oma configuration
can be debugged on a laptop before it runs on GPUs (docs/verl.md#verl-on-cpu).

Stock verl 0.9.1 cannot train on CPU: it registers the platforms ``nvidia``, ``huawei`` and ``amd``
only (its device helpers turn ``cpu`` back into ``cuda``, and the first error is "Distributed package
doesn't have NCCL built in"), its FSDP engine is registered for ``cuda`` and ``npu``, and its rollouts
are vLLM, SGLang and TensorRT-LLM. This module, imported in every process through verl's
``VERL_USE_EXTERNAL_MODULES`` hook (:func:`environment` sets it), adds:

* the platform ``cpu`` (selected with ``VERL_PLATFORM=cpu``): device ``cpu``, collectives over
  ``gloo``, and Ray's ``GPU`` resource as the slot each worker holds (declare slots with
  ``ray_kwargs.ray_init.num_gpus``; nothing uses a GPU);
* verl's FSDP engine for the device ``cpu`` (``actor.strategy=fsdp2``), and process groups on
  ``cpu:gloo`` alone (verl names the device twice, ``cpu:gloo,cpu:gloo``, which torch refuses);
* the rollout ``hf`` (:mod:`oma.integrations.verl.hf_rollout`): one Ray actor per replica running
  Hugging Face ``generate``, which receives the actor's weights after every update.

:func:`overrides` lists the verl config lines a CPU run needs besides the model and data.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from oma.integrations.verl import _hooks, _verl_private

MODULE = "oma.integrations.verl.cpu"
PLATFORM = "cpu"


class _CPUDevice:
    """What verl calls on ``get_torch_device()``, for the CPU: torch.cpu's functions, and memory
    queries that answer 0 (nothing is cached on a CPU device)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, os.sysconf("SC_PHYS_PAGES") * size

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU (select it with ``VERL_PLATFORM=cpu``)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return _CPUDevice()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: a CPU run is asked for by VERL_PLATFORM=cpu

    def current_device(self) -> str:
        # verl writes tensor.to(get_device_id()) and torch.device(get_device_id()): an int would mean cuda:N
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the GPU slots; ignored by CPU torch

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # the slot each worker holds: ray_init.num_gpus declares them

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _register_engine(module) -> None:
    from verl.workers.engine.base import EngineRegistry

    if _verl_private.engine_registered(EngineRegistry, "language_model", ("fsdp", "fsdp2"), PLATFORM):
        return
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM)(
        module.FSDPEngineWithLMHead
    )


def _register_rollout_adapter(module) -> None:
    _verl_private.register_rollout(module, "hf", "oma.integrations.verl.hf_rollout.HFServerAdapter")


def _register_replica(module) -> None:
    def load():
        from oma.integrations.verl.hf_rollout import HFReplica

        return HFReplica

    module.RolloutReplicaRegistry.register("hf", load)


def _single_backend(module) -> None:
    """verl's workers build their process group's backend as ``cpu:gloo,<device>:<backend>``: on the
    CPU that names the device twice, which torch refuses; pass ``cpu:gloo`` alone instead."""
    original = module.initialize_global_process_group_ray
    if getattr(original, "_oma_cpu", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._oma_cpu = True
    initialize_global_process_group_ray.__doc__ = original.__doc__
    module.initialize_global_process_group_ray = initialize_global_process_group_ray


def install() -> None:
    """Register the engine and the ``hf`` rollout when verl imports their registries (idempotent); refuse a
    verl other than 0.9.x, whose privates these registrations use."""
    _verl_private.check_version()
    _hooks.when_imported("verl.utils.distributed", _single_backend)
    _hooks.when_imported("verl.workers.engine.fsdp.transformer_impl", _register_engine)
    _hooks.when_imported("verl.workers.rollout.base", _register_rollout_adapter)
    _hooks.when_imported("verl.workers.rollout.replica", _register_replica)


def environment() -> dict[str, str]:
    """Environment variables of every process of a CPU run (the driver's, and Ray's runtime_env)."""
    return {
        "VERL_PLATFORM": PLATFORM,
        "VERL_USE_EXTERNAL_MODULES": MODULE,
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


def overrides(dp: int = 1) -> list[str]:
    """verl config lines of a CPU run with ``dp`` data-parallel workers (each a Ray actor holding one slot)."""
    return [
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={dp}",
        "trainer.nnodes=1",
        f"++ray_kwargs.ray_init.num_gpus={dp}",
        f"ray_kwargs.ray_init.num_cpus={8 * dp + 8}",  # logical: verl's bundles ask 3 CPUs per slot
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    ]


install()
