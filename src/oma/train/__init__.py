"""oma.train: the stepwise multi-turn RL trainer of `oma train` (docs/training.md), as a library.

A run, as `oma train` makes it::

    from pathlib import Path
    from oma.train import load_config, read_metrics, train

    cfg = load_config("configs/chain-tabular-grpo.yaml", ["iterations=2"])
    summary = train(cfg, Path(cfg.out_dir))  # resume=True continues it from its latest checkpoint
    records = read_metrics(Path(cfg.out_dir))  # metrics.jsonl (or metrics.jsonl.gz), one record per line

* The config: :class:`TrainConfig`, :func:`load_config` (defaults ← YAML ← ``key=value``),
  :func:`load_run_config` (a run folder's, validated; :func:`saved_config` as saved), :func:`validate`,
  :func:`to_dict`, :func:`config_diff`, :class:`ConfigError`, :data:`SEED_MAX` (the largest |seed|).
* A run and its parts: :func:`train`, :func:`read_metrics`, :func:`make_env` (a config's environment
  factory), :func:`build_policy` (the warm start, cached by :func:`cache_key`), :func:`trainable_policy`
  (with LoRA when asked), :func:`cpu_info`, :func:`load_checkpoint` (:class:`CheckpointError`,
  :data:`EMA_FILE`), :func:`held` (the lock a process holds on the folder it writes into, on its :data:`CLAIM` file).
* One iteration's phases in the loop's order, for scripts that time or probe them (benchmarks/):
  :func:`task_seeds`, :func:`training_rollout` (:func:`policy_rollout` on any seeds),
  :func:`episode_scores`, :func:`advantages`, :func:`response_mask_of`, :func:`per_token`,
  :func:`batch_logprobs` (:func:`row_logprobs` of some rows, as :func:`forward_plan` groups them),
  :class:`Batch`, :func:`make_optimizer`, :class:`WeightAverage`, :func:`update`, :func:`evaluates`.

The submodules (``loop``, ``warmstart``, ``checkpoint``, ``config``, ``lock``, ``cli``) are the implementation:
code outside this package imports these names from here.
"""

from oma.train.checkpoint import EMA_FILE, CheckpointError, load_checkpoint
from oma.train.config import (SEED_MAX, ConfigError, TrainConfig, config_diff, load_config, load_run_config, saved_config,
                              to_dict, validate)
from oma.train.lock import CLAIM, held
from oma.train.loop import (
    Batch,
    WeightAverage,
    advantages,
    batch_logprobs,
    episode_scores,
    evaluates,
    forward_plan,
    make_env,
    make_optimizer,
    per_token,
    policy_rollout,
    read_metrics,
    response_mask_of,
    row_logprobs,
    task_seeds,
    train,
    trainable_policy,
    training_rollout,
    update,
)
from oma.train.warmstart import build_policy, cache_key, cpu_info

__all__ = [
    "CLAIM",
    "EMA_FILE",
    "SEED_MAX",
    "Batch",
    "CheckpointError",
    "ConfigError",
    "TrainConfig",
    "WeightAverage",
    "advantages",
    "batch_logprobs",
    "build_policy",
    "cache_key",
    "config_diff",
    "cpu_info",
    "episode_scores",
    "evaluates",
    "forward_plan",
    "held",
    "load_checkpoint",
    "load_config",
    "load_run_config",
    "make_env",
    "make_optimizer",
    "per_token",
    "policy_rollout",
    "read_metrics",
    "response_mask_of",
    "row_logprobs",
    "saved_config",
    "task_seeds",
    "to_dict",
    "train",
    "trainable_policy",
    "training_rollout",
    "update",
    "validate",
]
