"""CPU shim for verl-agent's vendored verl 0.3.1 (oma's own code; no verl-agent code in it).

Loaded in every Python process of the venv by a .pth line when VA_CPU_SHIM=1 (driver, Ray's
TaskRunner and the FSDP workers). Patches, each applied when the named module is imported:

* torch.distributed.init_process_group: verl asks for "cpu:gloo,npu:hccl" (no CUDA, so it assumes an
  Ascend NPU) or "hccl"; on the CPU every collective goes over gloo.
* verl.utils.device.get_torch_device: verl returns ``torch.cpu`` on a CPU machine, which lacks the
  memory queries, empty_cache, rng state... that verl calls on it; return a CPU stand-in instead.
* verl.utils.fsdp_utils calls torch.cuda.current_device() / empty_cache() directly (6 call sites: FSDP2
  state-dict load, buffer placement, grad-norm, offload): its module-global ``torch`` is replaced by
  a proxy whose ``cuda`` is the same CPU stand-in (everything else is torch).
* verl.workers.rollout.hf_rollout.HFRollout passes the prompt's ``position_ids`` to ``generate``; with
  transformers 4.51 these are sliced to the last prompt position at every decoding step and never
  advanced, so every generated token after the first gets the same position (the tiny policy then
  emits garbage). The shim drops them; ``generate`` derives them from the left-padded attention mask.
"""
import os

if os.environ.get("VA_CPU_SHIM") == "1":
    from oma.integrations.verl import _hooks

    class _CPUDevice:
        def __getattr__(self, name):
            import torch
            return getattr(torch.cpu, name)

        is_available = staticmethod(lambda: True)
        empty_cache = ipc_collect = staticmethod(lambda: None)
        set_device = staticmethod(lambda device=None: None)
        current_device = staticmethod(lambda: "cpu")
        device_count = staticmethod(lambda: 1)
        get_device_name = staticmethod(lambda device=None: "cpu")
        synchronize = staticmethod(lambda device=None: None)
        memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(lambda device=None: 0)
        reset_peak_memory_stats = staticmethod(lambda device=None: None)

        @staticmethod
        def manual_seed(seed):
            import torch
            torch.manual_seed(seed)

        manual_seed_all = manual_seed

        @staticmethod
        def get_rng_state(device=None):
            import torch
            return torch.get_rng_state()

        @staticmethod
        def set_rng_state(state, device=None):
            import torch
            torch.set_rng_state(state)

        @staticmethod
        def mem_get_info(device=None):
            pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            return pages * size, os.sysconf("SC_PHYS_PAGES") * size

    _DEVICE = _CPUDevice()

    def _dist(module):
        original = module.init_process_group
        if getattr(original, "_va_cpu", False):
            return

        def init_process_group(*args, **kwargs):
            kwargs["backend"] = "gloo"
            return original(*args[1:], **kwargs)

        init_process_group._va_cpu = True
        module.init_process_group = init_process_group

    def _device(module):
        module.get_torch_device = lambda: _DEVICE

    class _TorchWithCPUCuda:
        """The torch module as a module global sees it, with ``torch.cuda`` the CPU stand-in."""

        def __getattr__(self, name):
            import torch
            return _DEVICE if name == "cuda" else getattr(torch, name)

    def _module_torch(module):
        module.torch = _TorchWithCPUCuda()

    def _hf_rollout(module):
        original = module.HFRollout._generate_minibatch

        def _generate_minibatch(self, prompts):
            inner = self.module.generate

            def generate(*args, **kwargs):
                kwargs.pop("position_ids", None)  # transformers then derives them from the attention mask, step by step
                return inner(*args, **kwargs)

            self.module.generate = generate
            try:
                return original(self, prompts)
            finally:
                del self.module.generate

        module.HFRollout._generate_minibatch = _generate_minibatch

    _hooks.when_imported("torch.distributed", _dist)
    _hooks.when_imported("verl.workers.rollout.hf_rollout", _hf_rollout)
    _hooks.when_imported("verl.utils.fsdp_utils", _module_torch)
    _hooks.when_imported("verl.utils.device", _device)
