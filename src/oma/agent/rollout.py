"""Stepwise rollout: G task seeds × n episodes, batched generation across active episodes, one row
per agent step (docs/training.md).

Finished episodes stop producing rows. Each row records the ids docs/math.md#the-batch asks for
(``group_index``, ``traj_index``, ``step_index``, ``anchor``) so that advantages and weights come
from :mod:`oma.core` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from oma.agent.policy import Generation, action_choices, generate, generate_actions
from oma.agent.prompt import project_action, step_prompt
from oma.core import anchor_ids


@dataclass
class Rows:
    """One row per agent step of a rollout batch.

    ``scores`` is the episode outcome stamped on each row minus that row's invalid-action penalty;
    ``step_rewards`` is the step's own reward minus the same penalty (GiGPO's step term).
    """

    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    group_index: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    traj_index: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    step_index: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    anchor: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    scores: Tensor = field(default_factory=lambda: torch.zeros(0))
    step_rewards: Tensor = field(default_factory=lambda: torch.zeros(0))
    valid: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    won: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))
    allowed: list[Tensor] | None = None
    """Constrained policies only, what each row's choice was made among (for its log-probs): the LM's
    allowed (position, token) pairs; the action-level LM's admissible actions
    (:func:`oma.agent.policy.choices_tensor`); the tabular policy's table slots of the admissible actions."""
    kind: str = "token"
    """The name of the policy kind whose rollout made the rows (:mod:`oma.agent.kinds`): what their ids and
    ``allowed`` encode, so how they are scored. ``token`` (an LM writing token by token), ``action`` (the
    action-level LM, ``policy.normalise=action``) or ``tabular`` (the table)."""
    logp: list[list[float]] = field(default_factory=list)
    """Each response token's log-prob under the rollout policy (temperature 1), recorded while sampling."""
    entropy: list[list[float]] = field(default_factory=list)
    """Each response token's entropy (nats) under the rollout policy."""

    def __len__(self) -> int:
        return len(self.prompt_ids)


@dataclass
class Episode:
    """What one trajectory did: its group (task seed), length, outcome and a short transcript."""

    seed: int
    group: int
    steps: int = 0
    invalid: int = 0
    outcome: float = 0.0
    won: bool = False
    transcript: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Rollout:
    rows: Rows
    episodes: list[Episode]
    generated_tokens: int

    @property
    def success_rate(self) -> float:
        return sum(e.won for e in self.episodes) / max(1, len(self.episodes))


@dataclass
class LiveEpisode:
    """An episode in progress: its environment, what the policy sees now, and its rows so far."""

    env: object
    episode: Episode
    obs: str
    info: dict
    history: list[tuple[str, str]]
    rewards: list[float]
    row_ids: list[int]


Act = Callable[[list[LiveEpisode]], tuple[list[list[int]], Generation]]
"""A policy acting on the live episodes of one lockstep step: ``(prompt_ids, generation)``, one
entry per episode, in order. The LM's is built by :func:`rollout`; the tabular policy's by
:func:`oma.agent.tabular.tabular_rollout`."""


def rollout(
    make_env: Callable[[], object],
    model,
    tokenizer,
    task_seeds: Sequence[int],
    *,
    group_size: int,
    history_length: int,
    max_prompt_tokens: int,
    max_new_tokens: int,
    temperature: float,
    invalid_penalty: float,
    generator: torch.Generator | None,
    constrained: bool = False,
    action_level: bool = False,
    show_actions: bool,
    traj_offset: int = 0,
    max_steps: int | None = None,
) -> Rollout:
    """Roll out ``group_size`` episodes of every task seed with the LM policy, stepping all in lockstep.

    Group g is task seed ``task_seeds[g]``; trajectory ids are ``traj_offset + g*group_size + i``.
    With ``constrained`` the policy samples only admissible actions (see :func:`generate`), with
    ``action_level`` from a softmax over whole actions (:func:`generate_actions`); ``show_actions``
    lists them in the prompt (:func:`oma.agent.prompt.step_prompt`). ``max_steps``: see :func:`run_episodes`.
    """
    encoded: dict = {}  # text -> token ids for this rollout: the n episodes of a task repeat prompts and actions

    def act(lives: list[LiveEpisode]) -> tuple[list[list[int]], Generation]:
        prompt_ids = [_encode_prompt(tokenizer, lv, history_length, max_prompt_tokens, encoded, show_actions) for lv in lives]
        choices = [_choices(tokenizer, lv.info["admissible_actions"], encoded) for lv in lives] if constrained else None
        if action_level:
            return prompt_ids, generate_actions(model, tokenizer, prompt_ids, temperature=temperature, generator=generator,
                                                choices=choices)
        return prompt_ids, generate(model, tokenizer, prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                    generator=generator, choices=choices)

    was_training = model.training
    model.eval()
    try:
        ro = run_episodes(make_env, act, task_seeds, group_size=group_size, invalid_penalty=invalid_penalty,
                          traj_offset=traj_offset, constrained=constrained, max_steps=max_steps)
        ro.rows.kind = "action" if action_level else "token"
        return ro
    finally:
        model.train(was_training)


def run_episodes(make_env: Callable[[], object], act: Act, task_seeds: Sequence[int], *, group_size: int,
                 invalid_penalty: float, traj_offset: int = 0, constrained: bool = True,
                 max_steps: int | None = None) -> Rollout:
    """The episode bookkeeping of a rollout, whatever the policy: ``act`` chooses, this steps and records.

    ``constrained``: the policy chooses only admissible actions, and ``Rows.allowed`` keeps what
    its generation allowed (for log-probs of the same distribution in training).
    ``max_steps``: an episode still running after this many steps ends there, as the environment
    ends one at its own cap: its outcome is the rewards it collected, and it is won only if its last
    step won (studies/default-job/journal.md#a-shorter-training-horizon). ``None``: only the environment ends episodes.
    """
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps: expected a positive number of steps or None, got {max_steps}")
    live: list[LiveEpisode] = []
    episodes: list[Episode] = []
    for g, seed in enumerate(task_seeds):
        for _ in range(group_size):
            env = make_env()
            obs, info = env.reset(int(seed))
            ep = Episode(seed=int(seed), group=g)
            episodes.append(ep)
            live.append(LiveEpisode(env, ep, obs, info, [], [], []))
    rows: dict[str, list] = {k: [] for k in ("prompt", "response", "group", "traj", "step", "anchor", "reward", "valid",
                                             "allowed", "logp", "entropy")}
    generated = 0
    active = list(range(len(live)))
    while active:
        prompt_ids, gen = act([live[i] for i in active])
        still = []
        for slot, i in enumerate(active):
            lv = live[i]
            action = project_action(gen.texts[slot], lv.info["admissible_actions"])
            anchor = lv.env.anchor()
            obs, reward, terminated, truncated, info = lv.env.step(action if action is not None else gen.texts[slot])
            penalty = 0.0 if action is not None else invalid_penalty
            lv.row_ids.append(len(rows["prompt"]))
            rows["prompt"].append(prompt_ids[slot])
            rows["response"].append(gen.response_ids[slot])
            rows["group"].append(lv.episode.group)
            rows["traj"].append(traj_offset + i)
            rows["step"].append(lv.episode.steps)
            rows["anchor"].append(anchor)
            rows["reward"].append(float(reward) - penalty)
            rows["valid"].append(action is not None)
            rows["allowed"].append(gen.allowed[slot] if gen.allowed is not None else None)
            rows["logp"].append(gen.logp[slot])
            rows["entropy"].append(gen.entropy[slot])
            generated += len(gen.response_ids[slot])
            lv.rewards.append(float(reward))
            lv.episode.steps += 1
            lv.episode.invalid += action is None
            lv.episode.transcript.append((lv.obs, gen.texts[slot]))
            lv.history.append((lv.obs, action if action is not None else gen.texts[slot]))
            lv.obs, lv.info = obs, info
            if terminated or truncated or lv.episode.steps == max_steps:
                lv.episode.won = bool(info["won"])
                lv.episode.outcome = sum(lv.rewards)
            else:
                still.append(i)
        active = still
    n = len(rows["prompt"])
    outcome = torch.zeros(n)
    won = torch.zeros(n, dtype=torch.bool)
    for lv in live:
        outcome[lv.row_ids] = lv.episode.outcome
        won[lv.row_ids] = lv.episode.won
    valid = torch.tensor(rows["valid"], dtype=torch.bool)
    out = Rows(
        prompt_ids=rows["prompt"],
        response_ids=rows["response"],
        group_index=torch.tensor(rows["group"], dtype=torch.long),
        traj_index=torch.tensor(rows["traj"], dtype=torch.long),
        step_index=torch.tensor(rows["step"], dtype=torch.long),
        anchor=anchor_ids(rows["anchor"]) if n else torch.zeros(0, dtype=torch.long),
        scores=outcome - invalid_penalty * (~valid).float(),
        step_rewards=torch.tensor(rows["reward"]),
        valid=valid,
        won=won,
        allowed=rows["allowed"] if constrained else None,
        logp=rows["logp"],
        entropy=rows["entropy"],
    )
    return Rollout(out, episodes, generated)


def _choices(tokenizer, actions: list[str], encoded: dict):
    key = ("choices", *actions)
    if key not in encoded:
        encoded[key] = action_choices(tokenizer, actions)
    return encoded[key]


def _encode_prompt(tokenizer, lv: LiveEpisode, history_length: int, max_tokens: int, encoded: dict,
                   show_actions: bool) -> list[int]:
    """The step prompt's token ids within ``max_tokens``: drop the oldest history pairs first, and
    only if the prompt is still too long cut it from the front (the end holds what the model acts on)."""
    for h in range(min(history_length, len(lv.history)), -1, -1):
        text = step_prompt(lv.info["task"], lv.history, lv.obs, lv.info["admissible_actions"], h, show_actions)
        if text not in encoded:
            encoded[text] = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = encoded[text]
        if len(ids) <= max_tokens:
            return ids
    return ids[-max_tokens:]
