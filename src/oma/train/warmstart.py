"""The policy before RL: tokenizer, model, and supervised warm start on noisy expert demonstrations.

Everything here is cached by a hash of the settings that determine it, so a rerun (or every run of
an `oma compare` sweep) starts from the same warm-started policy in seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.progress import Progress

import oma
from oma.agent.policy import (EOS, action_choices, action_response_logprobs, allowed_positions, choices_tensor, load_model,
                              load_tokenizer, response_logprobs, tiny_model, train_tokenizer)
from oma.agent.prompt import step_prompt
from oma.agent.tabular import TabularPolicy, imitate
from oma.core import micro_batches
from oma.envs import env_class
from oma.train.config import ConfigError, TrainConfig

DEMO_SEED_OFFSET = 2_000_000
"""Demonstration seeds are ``DEMO_SEED_OFFSET + k``: disjoint from training (< eval offset) and evaluation."""


@dataclass
class Demo:
    prompt: str
    action: str
    admissible: list[str]
    anchor: str = field(compare=False)
    """The environment's name of the state (what the tabular policy is keyed by). Not part of a demonstration's
    identity: anchors name every option, reward-only ones too, which leave the demonstration itself alone."""


def demonstrations(make_env: Callable[[], object], episodes: int, noise: float, history_length: int,
                   show_actions: bool = True) -> list[Demo]:
    """(prompt, expert action) at every step of ``episodes`` noisy-expert episodes (ε = ``noise``).

    Noise is injected into what the demonstrator *does* (with probability ε a uniformly random
    admissible action), while every step is labelled with the expert's action in that state — DART
    (Laskey et al. 2017, "Noise Injection for Robust Imitation Learning"). The policy so learns to
    recover from the off-path states it will visit itself; labelling the random actions instead
    would teach the noise and drown the rare decisive actions (take, put) in it.
    """
    demos: list[Demo] = []
    for k in range(episodes):
        seed = DEMO_SEED_OFFSET + k
        rng = random.Random(seed)
        env = make_env()
        obs, info = env.reset(seed)
        history: list[tuple[str, str]] = []
        done = False
        while not done:
            admissible = info["admissible_actions"]
            expert = env.expert_action()
            demos.append(Demo(step_prompt(info["task"], history, obs, admissible, history_length, show_actions), expert, admissible,
                              env.anchor()))
            action = rng.choice(admissible) if rng.random() < noise else expert
            history.append((obs, action))
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
    return demos


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


def sft(model, tokenizer, demos: list[Demo], *, epochs: int, lr: float, batch_rows: int, max_prompt_tokens: int,
        seed: int, constrained: bool, action_level: bool = False, progress: Progress | None = None) -> list[float]:
    """Token-mean cross-entropy on the demonstrated actions (+EOS); returns the loss per step.

    With ``constrained`` the likelihood is that of constrained decoding (renormalised over the
    tokens that continue an admissible action), the distribution the policy will sample from. With
    ``action_level`` it is the action-level policy's, −log π(a* | s) over the state's admissible
    actions (:func:`oma.agent.policy.action_response_logprobs`; a row's tokens all carry it, so the
    token mean weighs a demonstration by its action's length, as RL's token-mean does).
    """
    prompts = [ids[-max_prompt_tokens:] for ids in tokenizer([d.prompt for d in demos], add_special_tokens=False)["input_ids"]]
    actions = tokenizer([d.action for d in demos], add_special_tokens=False)["input_ids"]
    responses = [a + [tokenizer.convert_tokens_to_ids(EOS)] for a in actions]
    # what each demonstration's likelihood is normalised over, built once, not every epoch
    if action_level:
        allowed = [choices_tensor(action_choices(tokenizer, d.admissible)) for d in demos]
    elif constrained:
        allowed = [allowed_positions(action_choices(tokenizer, d.admissible), r) for d, r in zip(demos, responses)]
    else:
        allowed = None
    score = action_response_logprobs if action_level else response_logprobs
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    steps = epochs * len(micro_batches(len(demos), batch_rows))
    # Linear warm-up over the first 5% of steps, then cosine decay to 10% of lr: a constant rate
    # leaves the last epochs' noise in the weights, and greedy evaluation is sensitive to it.
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, max(0, k - warmup) / max(1, steps - warmup))))))
    task = progress.add_task("warm start (SFT)", total=steps) if progress else None
    for _ in range(epochs):
        order = torch.randperm(len(demos), generator=generator)
        for chunk in micro_batches(len(demos), batch_rows):
            idx = order[chunk].tolist()
            logp, mask, _ = score(model, [prompts[i] for i in idx], [responses[i] for i in idx],
                                  allowed=[allowed[i] for i in idx] if allowed else None, pad_id=tokenizer.pad_token_id)
            loss = -(logp * mask).sum() / mask.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if progress:
                progress.update(task, advance=1, description=f"warm start (SFT) loss {losses[-1]:.3f}")
    return losses


def build_policy(cfg: TrainConfig, make_env: Callable[[], object], progress: Progress | None = None):
    """(model, tokenizer, info) after the warm start, from the cache when it holds this config."""
    ws = cfg.warm_start
    if cfg.policy.model == "tabular":
        return _tabular_policy(cfg, make_env), None, {"cache": None, "cached": False}
    key = cache_key(cfg)
    cache = Path(ws.cache_dir).expanduser() / "warmstart" / key
    info = {"cache": str(cache), "cached": False}
    if (cache / "done.json").is_file():
        info.update(json.loads((cache / "done.json").read_text()), cached=True)
        return load_model(cache / "model"), load_tokenizer(cache / "tokenizer"), info
    t0 = time.perf_counter()
    tiny = cfg.policy.model == "tiny"
    if not tiny:  # fail on a bad path before spending time on demonstrations
        model, tokenizer = load_model(cfg.policy.model), _user_tokenizer(cfg.policy.model)
    need_demos = ws.enabled or tiny  # the tiny policy's tokenizer is trained on demonstration text
    demos = demonstrations(make_env, max(ws.episodes, 1), ws.noise, cfg.env.history_length, cfg.env.show_actions) if need_demos else []
    if tiny:
        tokenizer = train_tokenizer((t for d in demos for t in (d.prompt, d.action)), cfg.policy.vocab_size)
        p = cfg.policy
        model = tiny_model(len(tokenizer), hidden=p.hidden, layers=p.layers, heads=p.heads,
                           max_positions=max(512, p.max_prompt_tokens + p.max_new_tokens), seed=cfg.seed)
    t_demos = time.perf_counter() - t0
    t0 = time.perf_counter()
    losses = sft(model, tokenizer, demos, epochs=ws.epochs, lr=ws.lr, batch_rows=ws.batch_rows,
                 max_prompt_tokens=cfg.policy.max_prompt_tokens, seed=cfg.seed, constrained=cfg.policy.constrained,
                 action_level=cfg.policy.normalise == "action", progress=progress) if ws.enabled else []
    info.update(demo_rows=len(demos), sft_steps=len(losses), sft_loss_first=losses[0] if losses else None,
                sft_loss_last=losses[-1] if losses else None)
    _save(cache, model, tokenizer, {k: v for k, v in info.items() if k not in ("cache", "cached")})
    # this run's seconds, not cached: a run that loads the warm start did not spend them
    info.update(time_demos=t_demos, time_sft=time.perf_counter() - t0)
    return model, tokenizer, info


def _tabular_policy(cfg: TrainConfig, make_env: Callable[[], object]) -> TabularPolicy:
    """A uniform table, or (``warm_start.enabled``) the imitation of ``warm_start.episodes`` demonstrations."""
    env = make_env()
    env.reset(DEMO_SEED_OFFSET)
    try:
        env.anchor()
    except (AttributeError, NotImplementedError) as e:
        raise ConfigError(f"policy.model=tabular needs env.anchor() (the table is keyed by the state it names), and "
                          f"env.name={cfg.env.name!r} has none: {e}") from None
    policy = TabularPolicy(cfg.policy.table_size)
    if cfg.warm_start.enabled:
        demos = demonstrations(make_env, cfg.warm_start.episodes, cfg.warm_start.noise, 0, False)
        imitate(policy, [(d.anchor, d.action, d.admissible) for d in demos])
    return policy


def _user_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.eos_token is None:
        raise ValueError(f"policy.model: the tokenizer in {path!r} has no eos_token; the policy needs one to end an action")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _save(cache: Path, model, tokenizer, info: dict) -> None:
    """Write the warm-started policy to ``cache`` atomically (temporary folder, then rename)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=f".{cache.name}-"))
    try:
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "tokenizer")  # its own folder: no model config.json beside it
        (tmp / "done.json").write_text(json.dumps(info))
        if cache.exists():
            shutil.rmtree(cache)
        tmp.rename(cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

