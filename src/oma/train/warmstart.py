"""The policy before RL: its kind's warm start (:meth:`oma.agent.kinds.PolicyKind.warm_start`: SFT on noisy
expert demonstrations, or the table's imitation of them), kept in a cache by a hash of the settings that
determine it, so a rerun (or every run of an `oma compare` sweep) starts from the same warm-started
policy in seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from rich.progress import Progress

import oma
from oma.agent.kinds import policy_kind
from oma.agent.prompt import step_prompt
from oma.envs import env_class
from oma.files import user_path
from oma.train.config import TrainConfig

# The packages whose numerics decide a run's figures: the tokenizer is trained by `tokenizers`, the
# policy is transformers' Qwen2 on torch. Another install of them can give another warm start from the
# same config (docs/training.md#reproducibility-and-resume).
VERSIONED = ("oma-rl", "torch", "transformers", "tokenizers", "numpy")


def library_versions() -> dict[str, str | None]:
    """Python's and each of :data:`VERSIONED`'s installed version (``None`` if not installed), and the CPU.

    The same install on another CPU can train another policy too: torch and MKL pick their kernels by
    instruction set (``cpu_capability``, e.g. ``AVX512`` or ``AVX2``), and kernels that sum in another order
    differ in the last bits, which SFT amplifies (docs/training.md#reproducibility-and-resume).
    """
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return {**out, **cpu_info()}


def cpu_info() -> dict[str, str]:
    """The CPU a run's numbers came from: its name (:func:`cpu_model`) and the instruction set torch's kernels
    use (``cpu_capability``)."""
    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's name as the OS reports it ("Intel(R) Xeon(R) Processor @ 2.60GHz"), or
    ``platform.processor()`` where ``/proc/cpuinfo`` has none (macOS, Windows)."""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def cache_key(cfg: TrainConfig) -> str:
    """Hash of everything that determines the warm-started policy, the installed versions and the CPU
    included (:func:`library_versions`: another install, or another CPU, can train another policy from the
    same config), and torch's thread count now, the one SFT runs with: on some CPUs the thread count
    changes the sums' last bits and SFT amplifies them (docs/training.md#reproducibility-and-resume).

    The environment's ``reward_only_options`` are left out: ``shop`` with ``reward=score`` and
    ``reward=success`` sees the same demonstrations, so it shares one warm start.
    """
    reward_only = env_class(cfg.env.name).reward_only_options
    relevant = {
        "oma": oma.__version__,
        "env": {"name": cfg.env.name, "history_length": cfg.env.history_length, "show_actions": cfg.env.show_actions,
                "options": {k: v for k, v in cfg.env.options.items() if k not in reward_only}},
        "policy": {k: v for k, v in asdict(cfg.policy).items() if k not in ("temperature", "lora_r", "lora_alpha", "table_size")},
        "warm_start": {k: v for k, v in asdict(cfg.warm_start).items() if k != "cache_dir"},
        "seed": cfg.seed,
        "versions": library_versions(),
        "threads": torch.get_num_threads(),
        # The prompt format decides what the policy was trained to read: a format change must miss the cache.
        "prompt": step_prompt("task", [("past observation", "past action")], "observation", ["a", "b"], 1),
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def cache_folder(cfg: TrainConfig) -> Path:
    """Where ``cfg``'s warm start is kept: ``warm_start.cache_dir/warmstart/<cache_key>``."""
    return user_path(cfg.warm_start.cache_dir) / "warmstart" / cache_key(cfg)


def build_policy(cfg: TrainConfig, make_env: Callable[[], object], progress: Progress | None = None):
    """(model, tokenizer or None, info): the policy after its kind's warm start, kept in :func:`cache_folder`
    where the kind keeps one (the LMs), so that a rerun loads it."""
    return policy_kind(cfg).warm_start(cfg, make_env, lambda: cache_folder(cfg), progress)
