"""Every patch SkyRL 0.4.0 needs to train on the CPU, and why (docs/skyrl.md#skyrl-on-cpu).

SkyRL's trainer, generator, datasets, dispatch and policy loss are device-agnostic, and its public
extension points cover the inference engine (``BasePPOExp.get_inference_client``), the worker
classes (``RayPPOTrainer.build_models``), environments (``skyrl_gym.register``) and metrics
(``TrainingCallback``): :mod:`oma.integrations.skyrl.cpu` uses those. What has no public way is
SkyRL's FSDP worker (``skyrl.backends.skyrl_train.workers.fsdp`` and its strategy), written for CUDA
only, with no device option:

1. its model wrapper imports ``flash_attn.bert_padding`` at module level; flash-attn is a CUDA build
   that a CPU install cannot build (:func:`stub_flash_attn`);
2. it moves every tensor to ``torch.cuda.current_device()`` and calls ``torch.cuda.set_device`` and
   ``torch.cuda.synchronize``; it builds its device meshes with ``init_device_mesh("cuda", ...)``
   (``DistributedTorchRayActor.init_worker_process_group``, ``fsdp_utils.create_device_mesh``); and
   it broadcasts the model's non-persistent buffers through ``.cuda()``
   (``fsdp_utils._sync_non_persistent_buffers``) (:func:`cpu_device`).

:func:`install` applies both, in the process that calls it: oma's CPU workers call it first thing
in their Ray actor (only there does ``torch.cuda`` mean the CPU). The SkyRL internals these patches
rely on are pinned by tests/with_skyrl/test_skyrl_cpu.py::test_the_skyrl_internals_the_patches_rely_on.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
import warnings
from typing import Any

FLASH_ATTN_REFUSAL = ("flash-attn is not installed (a CPU run); SkyRL needs it only to unpad micro-batches: "
                      "set trainer.remove_microbatch_padding=false")


def stub_flash_attn() -> bool:
    """Register a stand-in ``flash_attn`` package when flash-attn is not installed; True when it did.

    SkyRL's model wrapper needs two names from ``flash_attn.bert_padding``, ``pad_input`` and
    ``unpad_input``, and calls them only with ``trainer.remove_microbatch_padding=true``: in the
    stand-in they refuse with :data:`FLASH_ATTN_REFUSAL`. Every other ``flash_attn`` submodule stays
    missing (SkyRL's optional imports of them fall back, as on any machine without flash-attn).
    """
    if "flash_attn" in sys.modules:
        return False
    if importlib.machinery.PathFinder.find_spec("flash_attn") is not None:
        return False

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(FLASH_ATTN_REFUSAL)

    package = types.ModuleType("flash_attn", "oma's stand-in for flash-attn on the CPU (oma.integrations.skyrl.cpu_patches)")
    package.__path__ = []  # a package without files: `import flash_attn.ops...` raises ModuleNotFoundError
    package.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None, is_package=True)
    padding = types.ModuleType("flash_attn.bert_padding")
    padding.__spec__ = importlib.machinery.ModuleSpec("flash_attn.bert_padding", None)
    padding.pad_input = padding.unpad_input = refuse
    package.bert_padding = padding
    sys.modules["flash_attn"] = package
    sys.modules["flash_attn.bert_padding"] = padding
    return True


def _on_cpu(init_device_mesh):
    def init_device_mesh_on_cpu(device_type: str, *args: Any, **kwargs: Any):
        return init_device_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    init_device_mesh_on_cpu._oma_cpu = True
    return init_device_mesh_on_cpu


def _sync_non_persistent_buffers_on_cpu(model, loaded_sd: dict) -> None:
    """SkyRL's ``fsdp_utils._sync_non_persistent_buffers`` with the buffers broadcast from the CPU."""
    import torch
    from torch import distributed as dist

    for module in model.modules():
        for key in sorted(getattr(module, "_non_persistent_buffers_set", set())):
            buf = module._buffers.get(key)
            if buf is None:
                continue
            src = buf.detach().clone() if dist.get_rank() == 0 else torch.empty(buf.shape, dtype=buf.dtype)
            dist.broadcast(src, src=0)
            module._buffers[key] = src


def cpu_device() -> None:
    """Point what SkyRL's FSDP worker asks of CUDA at the CPU, in this process (idempotent).

    ``torch.cuda.current_device()`` answers ``"cpu"`` (SkyRL only moves tensors to it),
    ``set_device`` and ``synchronize`` do nothing, device meshes asked for ``"cuda"`` are built on
    ``"cpu"`` (collectives over gloo), and non-persistent buffers are broadcast from the CPU.
    ``torch.cuda.is_available()`` stays False, so SkyRL's guarded CUDA calls (allocator settings,
    CUDA RNG state, memory stats) are skipped as SkyRL intends; its ``torch.autocast("cuda")``
    is disabled by torch, so the worker computes in the parameters' dtype.
    """
    import torch
    import torch.distributed.device_mesh as device_mesh
    from skyrl.backends.skyrl_train.distributed import fsdp_utils

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
    for module in (device_mesh, fsdp_utils):
        if not getattr(module.init_device_mesh, "_oma_cpu", False):
            module.init_device_mesh = _on_cpu(module.init_device_mesh)
    fsdp_utils._sync_non_persistent_buffers = _sync_non_persistent_buffers_on_cpu
    warnings.filterwarnings("ignore", message="User provided device_type of 'cuda', but CUDA is not available")


def install() -> None:
    """Both patches, in this process."""
    stub_flash_attn()
    cpu_device()
