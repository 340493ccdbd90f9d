"""Typed configuration of `oma train`: dataclasses, YAML presets and dotted overrides.

A preset is a YAML file whose keys are a subset of :class:`TrainConfig`; ``key=value`` overrides
on the command line are merged on top (``algo.mass=native``). Unknown keys are rejected with the
list of valid ones; option strings are checked once, here.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from oma.agent.imitation import DEMO_SEED_OFFSET
from oma.agent.kinds import policy_kind
from oma.core import ACCOUNTINGS, MASSES, OBJECTIVES, REDUCERS, Accounting, Estimator, Mass, Objective, Reducer
from oma.errors import ConfigError
from oma.files import read_json_object

TrainEstimator = Literal[Estimator, "gigpo"]
"""``oma.core.Estimator`` plus GiGPO (:func:`oma.core.gigpo_advantages`)."""

ESTIMATORS: tuple[str, ...] = get_args(Estimator) + ("gigpo",)

if TYPE_CHECKING:  # type checkers see oma.core's Literals
    _Estimator, _Accounting, _Objective, _Reducer, _Mass = TrainEstimator, Accounting, Objective, Reducer, Mass
else:  # OmegaConf's structured configs (2.3) take no Literal: it sees str; values are checked in validate()
    _Estimator = _Accounting = _Objective = _Reducer = _Mass = str


DEFAULT_JOB_ENV_OPTIONS: dict[str, Any] = {"size": "small", "goals": ["place"], "distractors": "few", "notes": True, "hint": True,
                                           "text": "terse"}
"""household options of the default job: notes + hint make the right action depend on the current
observation alone, so a 0.5M CPU policy needs no history window, and terse text says the same facts
in about 20% fewer prompt tokens (docs/envs.md, studies/default-job/journal.md#where-the-default-job-stands-measured)."""


@dataclass
class EnvConfig:
    name: str = "household"
    """Environment, one of ``oma.envs.names()`` (the adapters ``textworld``, ``scienceworld`` and ``alfworld`` need their extra)."""
    options: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_JOB_ENV_OPTIONS))
    """Keyword options for ``oma.envs.make`` (e.g. ``max_steps``); see docs/envs.md. A preset that sets them
    replaces them whole, and another ``env.name`` starts from none (:func:`load_config`)."""
    tasks_per_iter: int = 8
    """G: task instances (seeds) rolled out per iteration; each is one group."""
    group_size: int = 8
    """n: episodes per task instance (same seed), the group-relative baseline's sample."""
    history_length: int = 0
    """(observation, action) pairs of recent history in each step prompt."""
    show_actions: bool | None = None
    """List the admissible actions in each step prompt (a ``Can:`` line). ``None`` (default): only when
    ``policy.constrained`` is false. A constrained policy can write nothing else, and on household the
    line cost a quarter of the prompt and 37 points of warm-start greedy success (docs/training.md)."""
    invalid_penalty: float = 0.1
    """Subtracted from a row's score and step reward when the model's text is not an admissible action."""
    eval_tasks: int = 128
    """Held-out task seeds for evaluation (fixed for the whole run); 128 tasks leave ±4–9 points of binomial noise."""
    eval_seed_offset: int = 1_000_000
    """Held-out seeds are ``eval_seed_offset + k`` (k < ``eval_tasks``); training seeds stay below it (they are taken
    modulo it), demonstration seeds above them (from 2,000,000): 1 ≤ it ≤ 2,000,000 − ``eval_tasks``."""
    train_max_steps: int | None = 20
    """Training episodes end after this many steps if the environment has not ended them (unwon unless
    the last step won); evaluation keeps the environment's own cap. ``None``: the environment's cap
    alone. Fewer steps per failed episode make an iteration cheaper: 20 (household's cap is 30) made
    the default job's iterations 1.5x faster with the same gains per iteration
    (studies/default-job/journal.md#a-shorter-training-horizon). Like ``options`` it belongs to one environment: a
    layer that names another ``env.name`` starts from ``None`` (:func:`load_config`)."""
    eval_max_steps: int | None = None
    """Held-out episodes end after this many steps if the environment has not ended them (unwon unless the last
    step won). ``None`` (default): the environment's cap. With it the training cap can be varied while the
    held-out tasks stay as hard as before: raising ``env.options.max_steps`` alone would also give held-out
    episodes more steps to recover in (docs/experiments.md#dose-response). Like ``train_max_steps`` it belongs to
    one environment. Neither may exceed the environment's cap, which ends every episode first."""


@dataclass
class PolicyConfig:
    model: str = "tiny"
    """``tiny`` (a small Qwen2 built from this config, tokenizer trained on env text), a local HF model folder, or
    ``tabular``: a softmax table over (``env.anchor()`` state, admissible action) logits, the fast lane for
    studying the accounting itself (docs/experiments.md#the-tabular-lane); the LM-only options below are refused."""
    hidden: int = 128
    """tiny: hidden size."""
    layers: int = 2
    """tiny: transformer layers."""
    heads: int = 4
    """tiny: attention heads."""
    vocab_size: int = 1024
    """tiny: BPE vocabulary trained on environment text."""
    max_prompt_tokens: int = 320
    """Step prompts longer than this drop their oldest history first."""
    max_new_tokens: int = 16
    """Longest action the model may write (tokens, EOS included)."""
    temperature: float = 1.0
    """T: training rollouts sample from π_T = softmax(z / T), and RL trains that same π_T (``logp``,
    ``logp_old``, the KL reference and the entropy are all at T, verl's convention, so the importance
    ratios are exact). The sampled evaluation uses T too; the greedy one is argmax z at any T."""
    constrained: bool = True
    """Constrained decoding: sample only admissible action strings (a token trie over the admissible
    list), with log-probs renormalised over the allowed tokens in training too. It lets a tiny CPU
    model act validly from the first iteration. False = free text projected to an action; invalid
    text is a no-op that costs ``env.invalid_penalty`` (verl-agent's setup, what larger models use)."""
    normalise: str = "token"
    """What a constrained policy's probabilities are normalised over. ``token``: constrained decoding,
    each token renormalised over the tokens that continue an admissible action (the policy writes the
    action a token at a time; an early token, such as a receptacle's type, decides for the rest).
    ``action``: GLAM (Carta et al. 2023), π(a | s) = softmax over the admissible actions of the LM's
    whole-string log-likelihood, in rollouts, SFT and RL alike; every action of every state is scored
    (the default job's SFT takes twice as long; studies/action-level-policy/journal.md#an-action-level-policy-glam)."""
    lora_r: int = 0
    """LoRA rank via peft (0 = full fine-tuning)."""
    lora_alpha: int = 16
    """LoRA alpha."""
    table_size: int = 65536
    """tabular: entries of the logit table, one per (state, action) pair met; a run that meets more stops
    with an error naming this key."""


@dataclass
class WarmStartConfig:
    enabled: bool | None = None
    """Supervised fine-tuning on noisy expert demonstrations before RL (how good the start is: ``episodes``, ``epochs``).
    ``None`` (default): on for LM policies, off for ``policy.model=tabular`` (a uniform start). On for the tabular
    policy, it is the closed-form imitation of ``episodes`` demonstration episodes (:func:`oma.agent.tabular.imitate`)."""
    episodes: int = 600
    """Demonstration episodes (their seeds are disjoint from training and evaluation seeds)."""
    noise: float = 0.3
    """ε: the demonstrator takes a uniformly random admissible action with probability ε; every step is
    labelled with the expert's action (DART), so ε widens the states seen, not the labels' noise."""
    epochs: int = 2
    """Passes over the demonstration rows (cosine-decayed learning rate after a 5% warm-up)."""
    lr: float = 1e-3
    """AdamW learning rate of the warm start."""
    batch_rows: int = 16
    """Rows per SFT step (small: the tiny policy needs many steps more than large batches)."""
    cache_dir: str = "~/.cache/oma"
    """Warm-started policies are cached here by config hash, so reruns skip the warm start."""


@dataclass
class AlgoConfig:
    estimator: _Estimator = "gigpo"
    """``grpo`` | ``rloo`` | ``gigpo`` (see docs/math.md)."""
    accounting: _Accounting = "trajectory"
    """``row`` (verl-agent's stepwise baseline) | ``trajectory`` (Outcome Alignment)."""
    objective: _Objective = "ppo"
    """``ppo`` (clip-higher) | ``gspo`` (GSPO-token)."""
    reducer: _Reducer = "token-mean"
    """Native loss aggregation (verl's ``loss_agg_mode`` names)."""
    mass: _Mass = "uniform"
    """``native`` | ``uniform`` | ``group``: Mass Alignment target."""
    norm_by_std: bool = True
    """Divide group-relative advantages by the group std (False: Dr. GRPO)."""
    score: str = "discounted"
    """The episode score that outcome statistics compare: ``return`` (verl-agent's: the sum of the episode's
    rewards) | ``discounted`` (Σ_t γ^t r_t from the first step, with ``algo.gamma``: a win pays more the
    earlier it comes, so an episode that loops before it wins scores below one that does not; it raised the
    default job's sampled gain by 4 points, studies/what-limits-learning/journal.md#what-limited-learning). An invalid action's
    penalty stays on its own row in both."""
    gamma: float = 0.95
    """Discount of GiGPO's step returns, and of the episode score under ``algo.score=discounted``."""
    step_advantage_w: float = 1.0
    """GiGPO: ω, weight of the step-level advantage."""
    clip_low: float = 0.2
    """ε_low of the ratio clip."""
    clip_high: float = 0.28
    """ε_high of the ratio clip."""
    kl_coef: float = 0.0
    """β of the k3 KL penalty to the warm-start policy (0 = none, no reference model kept)."""
    entropy_coef: float = 0.0
    """Coefficient of the entropy bonus."""


OPTIMIZERS = ("adamw", "sgd", "normalized-sgd")
SCORES = ("return", "discounted")


@dataclass
class OptimConfig:
    optimizer: str = "adamw"
    """``adamw`` | ``sgd`` (plain gradient descent) | ``normalized-sgd`` (θ −= lr · g/‖g‖: every step has length
    ``lr``). The tabular lane uses ``normalized-sgd``: a table entry gets gradient from its own state's rows only,
    so Adam's per-parameter normalisation would rescale each state's step and erase the allocation between
    states that the accounting decides, while plain SGD would let an accounting that merely scales the
    gradient win by taking larger steps (docs/experiments.md#the-tabular-lane). ``weight_decay`` and
    ``adam_eps`` do not apply to ``normalized-sgd``."""
    lr: float = 3e-4
    """AdamW learning rate of RL (1e-3 undid the warm start of the tiny policy within 8 iterations)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_eps: float = 1e-8
    """AdamW ε, added to √v. A large ε (≈ the typical gradient entry) makes AdamW move parameters whose
    gradients are tiny by far less than ``lr`` (SGD-like there) instead of by ≈ ``lr`` (Adam's sign-like first steps)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    num_minibatches: int = 4
    """Optimizer steps per epoch; mini-batches hold whole trajectories."""
    micro_batch_rows: int = 64
    """Rows per forward/backward; gradients accumulate exactly (weights are per mini-batch)."""
    ema: float = 0.97
    """β of an exponential moving average of the weights, θ̄ ← β·θ̄ + (1 − β)·θ after every optimizer step,
    starting at the warm start (Polyak averaging; Polyak & Juditsky 1992). 0 = off. When on, every
    evaluation, the final table and ``summary.json`` measure the averaged policy θ̄, which is the run's
    output; rollouts and updates use the live weights θ, so the PPO ratios are unchanged. Its memory is
    one more copy of the weights; checkpoints keep θ̄ (``ema.safetensors``), so resuming is exact. A β of
    0.97 (the default job's) gives the last 33 steps (8 iterations at 4 mini-batches) 1 − 0.97^33 ≈ 63%
    of the average (studies/weight-average/journal.md#an-average-of-the-weights)."""


@dataclass
class TrainConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment and how tasks are sampled."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The language-model policy."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """Supervised warm start."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantage estimator, OMA switches, objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and batching."""
    iterations: int = 75
    """RL iterations (rollout + update). 75: what fits the default job's 5 minutes on 2 cores with terse text
    and the training cap (studies/default-job/journal.md#where-the-default-job-stands-measured)."""
    seed: int = 0
    """Seeds model init, task sampling and rollouts; a run is reproducible from it."""
    eval_every: int = 75
    """Evaluation on the held-out tasks every this many iterations (and at 0 and the end). 75: the default job
    evaluates before and after RL only (each evaluation of 128 tasks, greedy and sampled, takes 5–8 s there)."""
    checkpoint_every: int = 5
    """Write a resumable checkpoint every this many iterations (and at the end); at most every ``iterations // 2``,
    so a short run killed halfway can resume too."""
    out_dir: str = "runs/household-gigpo-oma"
    """Run directory (an existing one gets a numbered sibling unless resuming). A path: an override of it is taken
    as written, and ``~`` is the home folder (:data:`PATH_KEYS`)."""
    dump_batches: bool = False
    """Write each iteration's batch as Parquet under out_dir/batches for `oma audit`."""
    samples_per_iter: int = 2
    """Episodes per iteration written to samples.jsonl."""
    log_kl_warm_start: bool = True
    """Log ``kl_warm_start`` (k3 KL of the rollout policy to the warm start) every iteration; it keeps a
    frozen copy of the warm-start policy and costs one forward pass over the batch's distinct rows."""
    threads: int = 2
    """torch CPU threads. The warm start's cache key names them: on some CPUs another thread count trains
    another warm start (docs/training.md#reproducibility-and-resume)."""
    tensorboard: bool = True
    """Also write TensorBoard scalars (when the tensorboard package is installed)."""


def _check(key: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; expected one of {list(valid)}")


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check option strings and ranges once; return ``cfg``."""
    from oma.envs import names

    _check_numbers(cfg)
    _check("env.name", cfg.env.name, tuple(names()))
    _check("algo.estimator", cfg.algo.estimator, ESTIMATORS)
    _check("algo.accounting", cfg.algo.accounting, ACCOUNTINGS)
    _check("algo.objective", cfg.algo.objective, OBJECTIVES)
    _check("algo.reducer", cfg.algo.reducer, REDUCERS)
    _check("algo.mass", cfg.algo.mass, MASSES)
    _check("algo.score", cfg.algo.score, SCORES)
    _check("optim.optimizer", cfg.optim.optimizer, OPTIMIZERS)
    if cfg.optim.optimizer == "normalized-sgd" and cfg.optim.weight_decay:
        raise ConfigError(f"optim.weight_decay={cfg.optim.weight_decay} does not apply to optim.optimizer=normalized-sgd "
                          "(its steps have length optim.lr); remove it")
    positive = {
        "env.tasks_per_iter": cfg.env.tasks_per_iter, "env.group_size": cfg.env.group_size,
        "env.eval_tasks": cfg.env.eval_tasks, "policy.max_prompt_tokens": cfg.policy.max_prompt_tokens,
        "policy.max_new_tokens": cfg.policy.max_new_tokens, "optim.ppo_epochs": cfg.optim.ppo_epochs,
        "optim.num_minibatches": cfg.optim.num_minibatches, "optim.micro_batch_rows": cfg.optim.micro_batch_rows,
        "eval_every": cfg.eval_every, "checkpoint_every": cfg.checkpoint_every, "threads": cfg.threads,
        "optim.lr": cfg.optim.lr, "optim.adam_eps": cfg.optim.adam_eps, "warm_start.batch_rows": cfg.warm_start.batch_rows,
        "optim.grad_clip": cfg.optim.grad_clip, "policy.temperature": cfg.policy.temperature, "warm_start.lr": cfg.warm_start.lr,
    }
    for key, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{key} must be > 0, got {value}")
    for key, value in {"iterations": cfg.iterations, "env.history_length": cfg.env.history_length,
                       "samples_per_iter": cfg.samples_per_iter,
                       "warm_start.episodes": cfg.warm_start.episodes, "warm_start.epochs": cfg.warm_start.epochs,
                       "algo.kl_coef": cfg.algo.kl_coef, "algo.step_advantage_w": cfg.algo.step_advantage_w,
                       "env.invalid_penalty": cfg.env.invalid_penalty,
                       "algo.clip_low": cfg.algo.clip_low, "algo.clip_high": cfg.algo.clip_high,
                       "optim.weight_decay": cfg.optim.weight_decay}.items():
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")
    _check_seed_ranges(cfg)
    _check_paths(cfg)
    if cfg.policy.temperature < TEMPERATURE_MIN:
        raise ConfigError(f"policy.temperature must be >= {TEMPERATURE_MIN:g}, got {cfg.policy.temperature}: the policy "
                          "divides its float32 logits by it, and a smaller one makes them inf")
    for key, value in {"env.train_max_steps": cfg.env.train_max_steps,
                       "env.eval_max_steps": cfg.env.eval_max_steps}.items():
        if value is not None and not value > 0:
            raise ConfigError(f"{key} must be > 0 or null, got {value}")
    if not 0.0 <= cfg.warm_start.noise <= 1.0:
        raise ConfigError(f"warm_start.noise must be in [0, 1], got {cfg.warm_start.noise}")
    if not 0.0 <= cfg.optim.ema < 1.0:
        raise ConfigError(f"optim.ema must be in [0, 1) (0 = off), got {cfg.optim.ema}")
    if not 0.0 <= cfg.algo.gamma <= 1.0:
        raise ConfigError(f"algo.gamma must be in [0, 1], got {cfg.algo.gamma}")
    if cfg.env.group_size < 2:
        raise ConfigError(f"env.group_size must be >= 2, got {cfg.env.group_size}: a group-relative advantage of one "
                          "episode is 0, so nothing would be learnt")
    policy_kind(cfg)  # refuses a policy.normalise that names no kind
    if cfg.policy.normalise == "action" and not cfg.policy.constrained:
        raise ConfigError("policy.normalise=action needs policy.constrained=true: it scores the admissible actions")
    if cfg.policy.model == "tabular":
        _check_tabular(cfg)
    if cfg.warm_start.enabled is None:
        cfg.warm_start.enabled = cfg.policy.model != "tabular"
    if cfg.env.show_actions is None:
        cfg.env.show_actions = not cfg.policy.constrained
    if not cfg.env.show_actions and not cfg.policy.constrained:
        raise ConfigError("env.show_actions=false needs policy.constrained=true: a free-text policy must be shown "
                          "the admissible actions to write one")
    if cfg.optim.num_minibatches > cfg.env.tasks_per_iter * cfg.env.group_size:
        raise ConfigError(
            f"optim.num_minibatches={cfg.optim.num_minibatches} exceeds the trajectories per iteration "
            f"({cfg.env.tasks_per_iter * cfg.env.group_size}); mini-batches hold whole trajectories"
        )
    return cfg


LM_ONLY: dict[str, str] = {
    "policy.lora_r": "LoRA adapts a neural network", "policy.lora_alpha": "LoRA adapts a neural network",
    "policy.constrained": "the table chooses among the admissible actions only",
    "policy.normalise": "the table is a softmax over the admissible actions already",
    "policy.hidden": "it shapes the tiny LM", "policy.layers": "it shapes the tiny LM", "policy.heads": "it shapes the tiny LM",
    "policy.vocab_size": "the table has no tokenizer", "policy.max_prompt_tokens": "the table reads no prompt",
    "policy.max_new_tokens": "the table writes no text", "env.history_length": "the table reads no prompt",
    "env.show_actions": "the table reads no prompt",
}
"""Options only an LM policy has: ``policy.model=tabular`` refuses any of them set away from its default."""


def _check_tabular(cfg: TrainConfig) -> None:
    defaults = TrainConfig()
    for key, why in LM_ONLY.items():
        section, name = key.split(".")
        value, default = getattr(getattr(cfg, section), name), getattr(getattr(defaults, section), name)
        if value != default and not (key == "env.show_actions" and value is False):
            raise ConfigError(f"{key}={value!r} does not apply to policy.model=tabular ({why}); remove it")
    if cfg.policy.table_size < 1:
        raise ConfigError(f"policy.table_size must be >= 1, got {cfg.policy.table_size}")


def _check_seed_ranges(cfg: TrainConfig) -> None:
    """Training, held-out and demonstration task seeds never meet: training seeds are (seed·100000 + k) mod
    ``env.eval_seed_offset``, so in [0, offset); held-out seeds are offset + k for k < ``env.eval_tasks``;
    demonstration seeds start at :data:`oma.agent.imitation.DEMO_SEED_OFFSET`."""
    offset, top = cfg.env.eval_seed_offset, DEMO_SEED_OFFSET - cfg.env.eval_tasks
    if not 1 <= offset <= top:
        raise ConfigError(f"env.eval_seed_offset must be in [1, {top}] (held-out seeds are it + k for k < "
                          f"env.eval_tasks={cfg.env.eval_tasks}, training seeds are taken modulo it, demonstration seeds "
                          f"start at {DEMO_SEED_OFFSET}), got {offset}")


ROW_BYTES = 1024
"""A lower bound on the memory one agent step (a row) takes while a run holds it: its prompt text, token ids and
per-token log-probabilities, or for the tabular policy its state, its admissible actions and its transcript
entry, are each more than 1 KiB in Python objects. :func:`check_sizes` refuses what cannot fit even at this."""


def memory_bytes() -> int | None:
    """This machine's physical memory (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _size(n: float) -> str:
    for unit, scale in (("EB", 2**60), ("PB", 2**50), ("TB", 2**40), ("GiB", 2**30)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n / 2**20:.3g} MiB"


def check_sizes(cfg: TrainConfig, cap: int | None, memory: int | None = None) -> None:
    """Refuse options whose rows cannot fit in this machine's memory (``memory``, default :func:`memory_bytes`),
    before anything runs: a training batch holds env.tasks_per_iter × env.group_size episodes, an evaluation
    env.eval_tasks, the warm start's demonstrations warm_start.episodes, each of up to its step cap (``cap``, the
    environment's; ``env.train_max_steps`` / ``env.eval_max_steps`` where lower) rows of at least
    :data:`ROW_BYTES`. The estimate is a lower bound, so a run it lets through may still need more."""
    memory = memory_bytes() if memory is None else memory
    if memory is None:
        return
    env = cfg.env

    def steps(key: str | None) -> tuple[int, str]:
        """An episode's most steps there and the setting that caps them (1 step when none is known: a lower bound)."""
        limit = None if key is None else _flat(to_dict(cfg))[key]
        if limit is not None and (cap is None or limit < cap):
            return limit, f"{key}={limit}"
        if cap is None:
            return 1, "1 step (no step cap known)"
        return cap, f"env.options.max_steps={cap}" if "max_steps" in env.options else f"{env.name}'s step cap {cap}"

    (train, train_key), (evals, eval_key), (demo, demo_key) = (steps(k) for k in ("env.train_max_steps",
                                                                                   "env.eval_max_steps", None))
    batches = [  # (what, where, rows)
        (f"env.tasks_per_iter={env.tasks_per_iter} × env.group_size={env.group_size} × {train_key}",
         "one training batch", env.tasks_per_iter * env.group_size * train),
        (f"env.eval_tasks={env.eval_tasks} × {eval_key}", "one evaluation", env.eval_tasks * evals),
    ]
    if cfg.warm_start.enabled:
        batches.append((f"warm_start.episodes={cfg.warm_start.episodes} × {demo_key}",
                        "the warm start's demonstrations", cfg.warm_start.episodes * demo))
    for what, where, rows in batches:
        need = float(rows) * ROW_BYTES
        if need > memory:
            raise ConfigError(f"{what} steps need about {_size(need)} for {where} (at least {ROW_BYTES} bytes a step); "
                              f"this machine has {_size(memory)}: lower them")


def _check_paths(cfg: TrainConfig) -> None:
    """A path setting (:data:`PATH_KEYS`) names something: not empty, and no control character (a newline or a tab
    in a folder's name is a typo, or a value pasted whole)."""
    for key in PATH_KEYS:
        value = _flat(to_dict(cfg))[key]
        if not value.strip():
            raise ConfigError(f"{key} must not be empty; give a path")
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(f"{key}={value!r} holds a control character (a newline, a tab, …); give a path without one")


TEMPERATURE_MIN = 1e-3
"""The lowest ``policy.temperature``: π_T divides float32 logits by T, so logits of a few hundred stay far from
float32's overflow at it, while ``1e-300`` is 0 in float32 (the rollouts then sample from NaN)."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: the policy's weights, logits and scores are float32, so a larger option overflows in them."""

SEED_MAX = 2**40
"""The largest |seed|: the loop seeds its generators with seed·1000003 + iteration·7919, which must stay an int64."""

THREADS_MAX = 1024
"""The most torch threads a run may ask for (torch refuses 2**31 with an overflow, and starts what it is given)."""


def _check_numbers(cfg: TrainConfig) -> None:
    """Every float option is a finite number the policy's float32 tensors can hold (NaN would pass every range
    check and fail much later; 1e308 overflows the first time torch applies it), every integer one fits torch's
    int64, and the seed and thread count stay inside what torch is handed (both were tracebacks beyond it)."""
    for key, value in _flat(to_dict(cfg)).items():
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
            raise ConfigError(f"{key} must be a finite number within float32's range (|x| <= {FLOAT32_MAX:.4g}), "
                              f"got {value}")
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise ConfigError(f"{key} must fit in 64 bits (|x| < 2**63), got {value}")
    if abs(cfg.seed) > SEED_MAX:
        raise ConfigError(f"seed must be in [-2**40, 2**40], got {cfg.seed}")
    if not 1 <= cfg.threads <= THREADS_MAX:
        raise ConfigError(f"threads must be in [1, {THREADS_MAX}], got {cfg.threads}")


def _valid_keys(node: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(node)
    keys = []
    for f in dataclasses.fields(node):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            keys += _valid_keys(kind, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Defaults (the default job) ← YAML preset ``path`` ← dotted ``overrides``; validated.

    ``env.options`` belongs to one environment, so it is not merged key by key across layers: a
    preset that sets it replaces it whole, and a layer that names another ``env.name`` starts from
    no options and no ``env.train_max_steps`` (``oma train env.name=shop`` is shop with its own
    defaults and its own episode cap). Dotted overrides of single options (``env.options.max_steps=20``)
    add to the options in force.
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    layers = []  # (layer, whether setting env.options replaces it whole)
    if path is not None:
        p = Path(path)
        if not p.exists():  # not is_file(): a pipe (`oma train /dev/stdin`, `<(...)`) is a preset too
            raise ConfigError(f"config file {str(path)!r} does not exist")
        if p.is_dir():
            raise ConfigError(f"config file {str(path)!r} is a folder; give a YAML preset such as configs/x.yaml")
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {str(path)!r} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                              f"{e.start})") from None
        try:
            _check_document(str(path), yaml.compose(text, Loader=yaml.SafeLoader))
            layers.append((OmegaConf.load(io.StringIO(text)), True))
        except RecursionError:  # PyYAML composes nested collections recursively
            raise ConfigError(f"config file {str(path)!r} nests its YAML collections too deep to read; a preset needs a "
                              "few levels") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: "
                              f"{getattr(e, 'problem', None) or str(e).splitlines()[0]}") from None
        except OmegaConfBaseException as e:  # a key OmegaConf cannot hold: `? null`, a float
            raise ConfigError(f"config file {str(path)!r}: {str(e).splitlines()[0]}; a preset's keys are names, such as "
                              "algo or iterations") from None
    try:
        layers.append((_override_layer(overrides), False))
        merged = OmegaConf.structured(TrainConfig)
        for layer, replaces in layers:
            name = OmegaConf.select(layer, "env.name")
            other_env = name is not None and name != merged.env.name
            if (replaces and OmegaConf.select(layer, "env.options") is not None) or other_env:
                merged.env.options = {}
            if other_env:
                merged.env.train_max_steps = merged.env.eval_max_steps = None
            merged = OmegaConf.merge(merged, layer)
        cfg = OmegaConf.to_object(merged)
    except ConfigKeyError as e:
        key = getattr(e, "full_key", None) or str(e).splitlines()[0]
        raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(_valid_keys(TrainConfig))}") from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "?")
        raise ConfigError(f"bad value for config key {key!r}: {str(e).splitlines()[0]}") from None
    return validate(cfg)


PATH_KEYS: tuple[str, ...] = ("out_dir", "warm_start.cache_dir", "policy.model")
"""Keys whose value is a path: an override of one is taken as written, not read as YAML (which would turn
``out_dir=od/x #1`` into ``od/x`` and a newline into a space), and the path is read by
:func:`oma.files.user_path` wherever it is opened (``~`` is the home folder, from a preset or the command line)."""


def _override_layer(overrides: list[str] | tuple[str, ...]):
    """The ``key=value`` overrides as one OmegaConf layer: a value is YAML (``iterations=5``, ``env.options={a: 1}``)
    except for :data:`PATH_KEYS`, kept as text; ConfigError naming the override whose value is not YAML."""
    import yaml
    from omegaconf import OmegaConf

    layer = OmegaConf.create()
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. algo.mass=native)")
        if key.strip() in PATH_KEYS:
            OmegaConf.update(layer, key.strip(), value, merge=True)
            continue
        try:
            layer.merge_with_dotlist([item])
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(e)}); quote it or "
                              "write it as in a preset (e.g. iterations=5, env.options.goals=[place])") from None
    return layer


def _yaml_problem(e) -> str:
    """What PyYAML says is wrong, in one line, with no source excerpt."""
    mark = getattr(e, "problem_mark", None)
    where = f" at column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(e, 'problem', None) or str(e).splitlines()[0]}{where}"


ALIAS_BUDGET = 10_000
"""The most YAML nodes a config file may expand to through its aliases (``*name``): a preset has about 60,
while a few hundred bytes of nested aliases expand to billions (an alias bomb) and exhaust the memory."""


def _check_document(path: str, root) -> None:
    """Refuse a YAML document (``yaml.compose``'s node graph, where an alias is the very node it names) that is not
    a mapping of keys, whose aliases expand it past :data:`ALIAS_BUDGET` nodes, or that holds an alias inside the
    node it names (a self-reference, which expands forever). Walks the expansion without building it, so it stops
    in :data:`ALIAS_BUDGET` steps whatever the file."""
    import yaml

    if root is not None and not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"config file {path!r} must be a YAML mapping of keys (e.g. `algo: {{mass: native}}`), "
                          f"got a {'list' if isinstance(root, yaml.SequenceNode) else 'single value'}")
    stack = [(root, frozenset())] if root is not None else []  # (node, ids of the collections that hold it)
    seen = 0
    while stack:
        node, outer = stack.pop()
        seen += 1
        if seen > ALIAS_BUDGET:
            raise ConfigError(f"config file {path!r} expands to more than {ALIAS_BUDGET} YAML nodes through its aliases "
                              "(*name); write the values out")
        if isinstance(node, yaml.CollectionNode):
            if id(node) in outer:
                raise ConfigError(f"config file {path!r}: the YAML node at line {node.start_mark.line + 1} contains an "
                                  "alias of itself, so it never ends; write the values out")
            children = node.value if isinstance(node, yaml.SequenceNode) else [x for kv in node.value for x in kv]
            stack += [(child, outer | {id(node)}) for child in children]


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "options":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


ADDED_KEYS: dict[str, Any] = {"optim.ema": 0.0, "env.eval_max_steps": None}
"""Keys added after runs were saved, each with the value that does what the code did before it existed;
:func:`config_diff` reads a saved config without the key as having that value."""


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The config a run folder was trained with (its ``config.json``), validated; a key of
    :data:`ADDED_KEYS` missing from it reads as its value before it existed, not as today's default."""
    path = Path(run_dir) / "config.json"
    saved = _flat(saved_config(run_dir))
    return load_config(path, [f"{k}={'null' if v is None else v}" for k, v in ADDED_KEYS.items() if k not in saved])


def saved_config(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's ``config.json`` as saved; ConfigError naming the file when there is none or it is
    damaged (cut short, not UTF-8, not a JSON object)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run folder (no config.json)")
    try:
        return read_json_object(path)
    except ValueError as e:
        raise ConfigError(f"{e}; it holds the config the run was trained with") from None


def config_diff(saved: dict, now: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """``key (saved X, now Y)`` for every dotted key whose value differs, ``ignore`` aside (a key of
    :data:`ADDED_KEYS` missing from ``saved`` reads as its value before it existed)."""
    a, b = {**ADDED_KEYS, **_flat(json.loads(json.dumps(saved)))}, _flat(json.loads(json.dumps(now)))
    return [f"{k} (saved {a.get(k)!r}, now {b.get(k)!r})" for k in sorted(set(a) | set(b))
            if k not in ignore and a.get(k) != b.get(k)]
