"""Noisy-expert demonstrations and supervised learning from them: what every policy kind's warm start
learns from (docs/training.md). The LMs fit them by :func:`sft`; the table by the closed-form
:func:`oma.agent.tabular.imitate`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from rich.progress import Progress

from oma.agent.policy import (EOS, action_choices, action_response_logprobs, allowed_positions, checked_step, choices_tensor,
                              response_logprobs)
from oma.agent.prompt import step_prompt
from oma.core import micro_batches

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
            checked_step(optimizer, model.parameters(), f"warm start (SFT) step {len(losses) + 1}", "warm_start.lr")
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if progress:
                progress.update(task, advance=1, description=f"warm start (SFT) loss {losses[-1]:.3f}")
    return losses

