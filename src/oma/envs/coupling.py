"""Measuring expansion–outcome coupling: how episode length depends on success under a policy.

OMA matters when the number of rows (steps) an episode expands into is coupled to its outcome
(docs/math.md#worked-example). :func:`coupling` rolls a policy out over many task instances and reports the
success rate, the step counts of successes and failures, and their ratio, the same figure as
the audit's "mean K of failures / mean K of successes" (docs/audit.md).

Policies are scripted stand-ins for agents of different skill: the environment's expert with
probability ``1 - epsilon``, a uniformly random admissible action otherwise (``epsilon = 1`` is
the uniformly random policy).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from .base import Info, TextEnv
from .registry import make

Policy = Callable[[TextEnv, Info, random.Random], str]
"""Chooses an action from the environment (for its expert), the last ``info`` (for the
admissible actions) and a random generator seeded per episode."""

PolicySpec = Union[str, tuple[str, float], Policy]
"""``"expert"``, ``"random"``, ``("noisy_expert", epsilon)``, ``"noisy_expert:<epsilon>"``, or
a :data:`Policy`."""


@dataclass(frozen=True)
class NoisyExpert:
    """The expert's action with probability ``1 - epsilon``, else a uniformly random admissible
    action (which may happen to be the expert's)."""

    epsilon: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"policy: epsilon must be in [0, 1]; got {self.epsilon!r}")

    def __call__(self, env: TextEnv, info: Info, rng: random.Random) -> str:
        if self.epsilon and rng.random() < self.epsilon:
            actions = info["admissible_actions"]
            return actions[int(rng.random() * len(actions))]
        return env.expert_action()

    def __str__(self) -> str:
        if self.epsilon == 0.0:
            return "expert"
        if self.epsilon == 1.0:
            return "random"
        return f"noisy_expert(eps={self.epsilon:g})"


_NAMED = {"expert": 0.0, "random": 1.0}


def policy_from_spec(spec: PolicySpec) -> Policy:
    """Turn a :data:`PolicySpec` into a policy; ``ValueError`` names what is wrong."""
    if callable(spec):
        return spec
    if isinstance(spec, str) and spec in _NAMED:
        return NoisyExpert(_NAMED[spec])
    if isinstance(spec, str) and spec.startswith("noisy_expert:"):
        spec = ("noisy_expert", _parse_epsilon(spec.partition(":")[2]))
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "noisy_expert":
        return NoisyExpert(_parse_epsilon(spec[1]))
    raise ValueError(
        f"policy: unknown policy {spec!r}; valid: 'expert', 'random', ('noisy_expert', epsilon), "
        "'noisy_expert:<epsilon>' or a callable (env, info, rng) -> action"
    )


def _parse_epsilon(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"policy: epsilon must be a number in [0, 1]; got {value!r}") from None


@dataclass(frozen=True)
class Episode:
    """One rolled-out episode."""

    seed: int
    steps: int
    won: bool
    truncated: bool  # ran to the step cap
    total_reward: float


def rollout(env: TextEnv, policy: Policy, seed: int, policy_seed: int = 0) -> Episode:
    """Play task ``seed`` to its end with ``policy``; the policy's generator is seeded from
    ``(policy_seed, seed)``, so the result is reproducible."""
    rng = random.Random(f"policy:{policy_seed}:{seed}")
    _, info = env.reset(seed)
    steps, total = 0, 0.0
    while True:
        _, reward, terminated, truncated, info = env.step(policy(env, info, rng))
        steps, total = steps + 1, total + reward
        if terminated or truncated:
            return Episode(seed, steps, bool(info["won"]), truncated, total)


@dataclass(frozen=True)
class Coupling:
    """Length–outcome statistics of a policy on an environment.

    Means and medians are over the episodes of each outcome (``nan`` when there are none).
    ``ratio`` > 1 means failures expand into more rows than successes (ALFWorld-like, where OMA's
    Mass Alignment matters most); < 1 means failures are shorter (WebShop-like).
    """

    env: str
    options: str  # the non-default options, "k=v, ..."
    policy: str
    episodes: int
    success_rate: float
    mean_steps_success: float
    mean_steps_failure: float
    ratio: float  # mean_steps_failure / mean_steps_success
    median_steps_success: float
    median_steps_failure: float
    failures_at_cap: float  # share of failures that ran to the step cap ("loops")
    mean_steps_dead_end: float  # mean steps of failures that ended before the cap ("dead ends")
    mean_reward: float  # mean episode return


def coupling(
    env_name: str,
    policy: PolicySpec,
    seeds: int | Iterable[int],
    *,
    policy_seed: int = 0,
    **options: object,
) -> Coupling:
    """Roll ``policy`` out on task ``seeds`` (``n`` means ``range(n)``) of ``make(env_name,
    **options)`` and summarise how episode length is coupled to success."""
    env = make(env_name, **options)
    act = policy_from_spec(policy)
    chosen = range(seeds) if isinstance(seeds, int) else seeds
    episodes = [rollout(env, act, seed, policy_seed) for seed in chosen]
    if not episodes:
        raise ValueError("seeds: no task seeds given")
    wins = [e.steps for e in episodes if e.won]
    losses = [e for e in episodes if not e.won]
    fails = [e.steps for e in losses]
    mean_success, mean_failure = _mean(wins), _mean(fails)
    return Coupling(
        env=env_name,
        options=", ".join(f"{k}={v}" for k, v in sorted(options.items())),
        policy=str(act),
        episodes=len(episodes),
        success_rate=len(wins) / len(episodes),
        mean_steps_success=mean_success,
        mean_steps_failure=mean_failure,
        ratio=mean_failure / mean_success,
        median_steps_success=_median(wins),
        median_steps_failure=_median(fails),
        failures_at_cap=_mean([float(e.truncated) for e in losses]),
        mean_steps_dead_end=_mean([e.steps for e in losses if not e.truncated]),
        mean_reward=statistics.fmean(e.total_reward for e in episodes),
    )


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


def coupling_table(rows: Iterable[Coupling]) -> str:
    """A Markdown table of :class:`Coupling` rows (``—`` where a figure is undefined)."""
    header = (
        "| env | options | policy | episodes | success | steps success (mean / median) "
        "| steps failure (mean / median) | failure/success | failures at cap "
        "| steps failure before cap | mean reward |"
    )
    lines = [header, "|" + "---|" * 11]
    for c in rows:
        lines.append(
            f"| {c.env} | {c.options or 'defaults'} | {c.policy} | {c.episodes} "
            f"| {c.success_rate:.1%} "
            f"| {_fmt(c.mean_steps_success)} / {_fmt(c.median_steps_success)} "
            f"| {_fmt(c.mean_steps_failure)} / {_fmt(c.median_steps_failure)} | {_fmt(c.ratio, 2)} "
            f"| {_fmt(c.failures_at_cap * 100, 0)}{'' if math.isnan(c.failures_at_cap) else '%'} "
            f"| {_fmt(c.mean_steps_dead_end)} | {c.mean_reward:.3f} |"
        )
    return "\n".join(lines)


def _fmt(value: float, digits: int = 1) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"
