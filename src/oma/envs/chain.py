"""``chain``: a tiny text chain for tabular studies of expansion–outcome coupling.

The agent walks a chain of ``length`` positions. At each one it sees a sign (a colour) and must
take the action that sign calls for there; the right action depends only on the position and
the sign, never on the task, so a policy that learns the table (position, sign) -> action solves
every task, and tasks differ only in which sign stands where. What a wrong action does is the
knob: it decides whether failures are longer than successes (``stay``, ``reset``: the agent
loops to the step cap; ``stuck``: a loop it leaves only by chance; ``trap``: a dead end it wanders
in until the cap), shorter (``end``: a dead
end that stops at once) or exactly as long (``advance``: the control, no coupling), with the
policy's skill held fixed (docs/envs.md#chain-a-table-to-learn). The admissible actions differ
widely in length (1 to 9 words), so a token-mean loss weights them very differently; with
``equal_actions`` they all have 3 words, the control for that difference.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from .base import DrawnEnv, Effect, StepResult
from .sampling import pick

OnWrong = Literal["stay", "reset", "end", "advance", "trap", "stuck"]
Reward = Literal["success", "progress"]

SIGNS = ("red", "green", "blue", "yellow", "white", "black")
ACTIONS = (
    "go",
    "turn the small brass key slowly to the left",
    "push the gate",
    "wait here",
    "climb the old wooden rope ladder",
    "knock on the door",
)
"""The admissible actions, the first ``actions`` of them in this order. Their word counts (1, 9,
3, 2, 6, 4) all differ, so the rows of one step differ in tokens by the action taken."""
EQUAL_ACTIONS = (
    "go straight ahead",
    "turn the key",
    "push the gate",
    "wait right here",
    "climb the ladder",
    "ring the bell",
)
"""The admissible actions under ``equal_actions``: the same task (action ``i`` is right where
``ACTIONS[i]`` is), every phrase 3 words, so every row of a step has the same tokens."""

TASK = "Reach the end of the chain: at each step, take the action the sign calls for."


@dataclass(frozen=True)
class ChainOptions:
    """Knobs of ``chain`` (docs/envs.md has their measured effect on coupling).

    * ``max_steps``: step cap; ``stay`` and ``reset`` failures run to it, so it sets their
      length. Worlds do not depend on it: below ``length`` no task can be won.
    * ``length``: correct actions needed to reach the end, and the expert's path length.
    * ``signs``: sign colours drawn from (at most 6); the table to learn has ``length * signs``
      entries.
    * ``actions``: admissible actions in every state (2 to 6); a random one is right with
      probability ``1 / actions``.
    * ``on_wrong``: what an admissible but wrong action does. ``stay``: nothing, so failures loop
      to the cap (longer than successes). ``reset``: back to the first position, so failures
      loop to the cap and successes must be nearly clean. ``end``: the episode ends at once as a
      failure, a dead end (failures shorter than successes). ``advance``: the agent moves on but
      can no longer win, so every episode of admissible actions lasts exactly ``length`` steps
      (no coupling: the control). ``trap``: a dead end that does not stop: the agent stays where
      it went wrong, told it cannot reach the end, and every action leaves it there until the cap
      (failures run to the cap, successes last exactly ``length`` steps: the ratio is
      ``max_steps / length``). ``stuck``: a loop the agent leaves only by chance: it stays where
      it went wrong, told it is stuck, and each later action there takes effect with probability
      ``escape`` (else nothing changes), so failures loop to the cap, successes are mostly clean, and
      a late win stays possible (unlike ``trap``); the ratio grows with the cap past what ``stay``
      reaches, where a looping policy soon finds the right action.
    * ``escape``: under ``stuck``, the chance that an action taken while stuck takes effect (the
      draws come from the task seed, so an episode is reproducible from its seed and actions).
    * ``reward``: ``success`` (1 on the step that reaches the end, else 0) or ``progress``
      (partial credit on the episode's last step, truncated or not: the furthest position
      reached over ``length``, or under ``advance`` the correct actions taken over ``length``; a
      win pays 1). ``won`` is reaching the end without a wrong turn either way.
    * ``equal_actions``: the actions of :data:`EQUAL_ACTIONS` (3 words each) instead of
      :data:`ACTIONS` (1 to 9 words); the same task otherwise.
    """

    max_steps: int = field(default=15, metadata={"min": 1})
    length: int = field(default=5, metadata={"min": 1})
    signs: int = field(default=3, metadata={"min": 1})
    actions: int = field(default=4, metadata={"min": 2})
    on_wrong: OnWrong = "stay"
    escape: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    reward: Reward = "success"
    equal_actions: bool = False

    def __post_init__(self) -> None:
        # options.py checks lower bounds only; the upper bounds are the sizes of the vocabularies.
        for name, most in (("signs", len(SIGNS)), ("actions", len(ACTIONS))):
            value = getattr(self, name)
            if value > most:
                raise ValueError(f"chain: option {name!r} must be an integer <= {most}; got {value!r}")


@functools.cache
def correct_action(position: int, sign: str, actions: int) -> int:
    """The index of the right action at ``position`` under ``sign``: the same in every task and
    every process (a generator seeded with a string is), so a learned table carries over."""
    return pick(random.Random(f"chain:{position}:{sign}"), range(actions))


class ChainEnv(DrawnEnv[list[int]]):
    """Chain tasks; see the module docstring and docs/envs.md.

    A world is the sign index at each position. Observations show the position and its sign
    (and, under ``advance`` and ``trap``, that the agent went wrong), never a sign further on.
    """

    name = "chain"
    options_class = ChainOptions
    reward_only_options = frozenset({"reward"})
    options: ChainOptions

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        length, actions = self.options.length, self.options.actions
        # The expert wins every world in exactly ``length`` steps, so nothing is ever redrawn.
        self.expert_step_bound = length
        self._phrases = (EQUAL_ACTIONS if self.options.equal_actions else ACTIONS)[:actions]
        self._effects: dict[str, Effect] = {phrase: partial(self._take, i) for i, phrase in enumerate(self._phrases)}
        self._correct = [
            [correct_action(p, sign, actions) for sign in SIGNS[: self.options.signs]]
            for p in range(length)
        ]

    def anchor(self) -> str:
        """The state without the task seed: ``chain[<options>]|<state>``.

        A state (position, sign, whether the agent went wrong, and under ``progress`` the credit
        earned) means the same in every task (a trapped state is never a live one: it names that
        the agent went wrong), since the right action depends on position and
        sign alone; so a table keyed by anchors generalises across tasks. Within one task (the
        rollouts of a GRPO/GiGPO group share a seed) equal anchors are still equal states, which
        is all GiGPO's step-level groups need.
        """
        if self._seed is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before anchor()")
        return f"{self.name}[{self._options_key}]|{self._state_key()}"

    def step(self, action: str) -> StepResult:
        """:meth:`EpisodeEnv.step`, plus the partial credit of ``progress`` on a truncated last
        step: the truncation is decided after the action's effect, and an invalid action has no
        effect, so the credit cannot be paid from inside one."""
        observation, reward, terminated, truncated, info = super().step(action)
        if truncated and self.options.reward == "progress":
            reward = self._payoff(won=False)
        return observation, reward, terminated, truncated, info

    # --- generation and state ---

    def _begin(self, seed: int) -> tuple[str, str]:
        self._task_seed = seed  # what ``stuck``'s escapes are drawn from, set before the world starts
        return super()._begin(seed)

    def _draw(self, rng: random.Random) -> list[int]:
        return [pick(rng, range(self.options.signs)) for _ in range(self.options.length)]

    def _start(self, signs: list[int]) -> tuple[str, str]:
        self._signs = signs
        self._position = 0
        self._strayed = False  # advance, trap: went wrong and cannot win; end: fell off the chain; stuck: stuck
        self._escapes = random.Random(f"chain-escape:{self._task_seed}")  # stuck: whether an action takes effect
        self._credit = 0  # the furthest position reached, or under advance the correct actions
        return TASK, self._view()

    def _state_key(self) -> str:
        """Position and sign; whether the agent strayed; under ``progress`` the credit earned,
        which the rewards still to come depend on (under ``reset`` it can exceed the position,
        under ``advance`` fall behind it)."""
        key = f"{self._position}:{self._sign()}"
        if self._strayed:
            key += ":strayed"
        if self.options.reward == "progress":
            key += f":credit={self._credit}"
        return key

    def _sign(self) -> str:
        """The sign at the agent's position (``end`` past the last one)."""
        at_end = self._position == self.options.length
        return "end" if at_end else SIGNS[self._signs[self._position]]

    def _view(self) -> str:
        view = f"Step {self._position + 1} of {self.options.length}. The sign is {self._sign()}."
        if self._strayed and self.options.on_wrong == "stuck":
            view += " You went wrong and are stuck here; most actions do nothing."
        elif self._strayed:
            view += " You went wrong; this path cannot reach the end."
        return view

    def _invalid_observation(self) -> str:
        """The position again, so an agent that typed something invalid still sees where it is."""
        return f"Nothing happens.\n{self._view()}"

    def _payoff(self, won: bool) -> float:
        """The reward the episode ends with (``won`` implies full credit under ``progress``)."""
        if self.options.reward == "progress":
            return self._credit / self.options.length
        return float(won)

    # --- actions ---

    def _admissible(self) -> dict[str, Effect]:
        return self._effects  # the same actions in every state (never mutated by the base class)

    def _take(self, action: int) -> str:
        length, on_wrong = self.options.length, self.options.on_wrong
        right = action == self._correct[self._position][self._signs[self._position]]
        if on_wrong == "trap" and self._strayed:  # nothing leads out: the episode runs to the cap
            return self._view()
        if on_wrong == "stuck" and self._strayed and self._escapes.random() >= self.options.escape:
            return self._view()  # the action slips: the agent loops where it is
        if on_wrong == "advance":
            self._position += 1
            self._credit += int(right)
            self._strayed = self._strayed or not right
            if self._position < length:
                return self._view()
            won = not self._strayed
            self._finish(self._payoff(won), won)
            if won:
                return "You reached the end of the chain."
            return "You reached the end of the path, but it was the wrong path."
        if right:
            self._position += 1
            self._strayed = False  # stuck: a right action that takes effect frees the agent
            self._credit = max(self._credit, self._position)
            if self._position < length:
                return self._view()
            self._finish(self._payoff(True), True)
            return "You reached the end of the chain."
        if on_wrong == "end":
            self._strayed = True
            self._finish(self._payoff(False), False)
            return "Wrong way: the chain breaks here."
        if on_wrong in ("trap", "stuck"):
            self._strayed = True  # where it went wrong: its furthest position is the credit it keeps
        if on_wrong == "reset":
            self._position = 0
        return self._view()

    def _expert(self) -> str:
        """The action the sign calls for; under ``advance`` after a wrong turn it still earns
        ``progress`` credit, in a ``trap`` it changes nothing (no action does). The expert knows
        the table, not the signs further on."""
        return self._phrases[self._correct[self._position][self._signs[self._position]]]
