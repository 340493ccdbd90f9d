"""The text-environment protocol and the episode bookkeeping shared by every environment.

The protocol is what the trainer (docs/training.md) relies on; anything with these four methods can be
trained on. :class:`EpisodeEnv` implements the parts every environment must get identically
right (step cap, invalid actions as no-ops, errors after the end, the ``info`` keys), so that
each environment only describes its world: how a task starts, which actions are admissible, what
they do, what the expert would do and how to name the state. :class:`DrawnEnv` adds what the
built-in environments share: a world drawn from the seed alone, redrawn until the expert wins.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from .options import describe, parse_options

Info = dict[str, Any]
"""``info`` of ``reset``/``step``: always ``admissible_actions`` (list[str]), ``won`` (bool) and
``task`` (str, the goal text); after ``step`` also ``valid`` (bool: the action was admissible)."""

StepResult = tuple[str, float, bool, bool, Info]
"""``(observation, reward, terminated, truncated, info)``, as in Gymnasium."""


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn text environment, as the trainer and :func:`oma.envs.coupling` use it.

    * ``reset(seed)`` starts the task instance ``seed``; the same seed gives the same task, and
      the same actions after it give the same observations (rollouts of a group share a seed).
    * ``step(action)`` applies one action. An action not in ``info["admissible_actions"]`` is a
      no-op that still uses a step, with reward 0 and ``info["valid"] = False`` (the trainer adds
      its own penalty). ``terminated`` means the task ended (won, or lost for good);
      ``truncated`` means the step cap was reached. Stepping after either raises ``RuntimeError``.
    * ``expert_action()`` is a scripted expert's next action from the *current* state, so it also
      recovers after other actions were taken (that is how noisy experts are built).
    * ``anchor()`` names the current state: equal states give equal strings in any process, for
      GiGPO's step-level groups (``oma.core.anchor_ids`` hashes them).
    """

    def reset(self, seed: int) -> tuple[str, Info]: ...

    def step(self, action: str) -> StepResult: ...

    def expert_action(self) -> str: ...

    def anchor(self) -> str: ...


Effect = Callable[[], str]
"""What an admissible action does: changes the state and returns the observation."""


W = TypeVar("W")


class EpisodeEnv(ABC):
    """Episode bookkeeping every environment must get identically right, built-in or adapted.

    The step cap, invalid actions as no-ops, errors after the end and the ``info`` keys live
    here. Subclasses start task ``seed`` in :meth:`_begin`, list the admissible actions of the
    current state with their effects in :meth:`_admissible`, and end an episode from inside an
    effect with :meth:`_finish`. Admissible actions are computed once per state change, so a
    policy that reads ``info["admissible_actions"]`` costs no extra work. The adapters to real
    engines (TextWorld, ScienceWorld, ALFWorld) subclass this directly; the built-in
    environments subclass :class:`DrawnEnv`.
    """

    name: ClassVar[str]
    options_class: ClassVar[type[Any]]  # a frozen dataclass with ``max_steps``; see options.py
    reward_only_options: ClassVar[frozenset[str]] = frozenset()
    """Options that change only the rewards, never an observation, admissible action or expert
    action: demonstrations, and so the warm-started policy, do not depend on them."""

    def __init__(self, **options: object) -> None:
        self.options = parse_options(self.options_class, self.name, options)
        self.max_steps: int = self.options.max_steps
        self._options_key = describe(self.options)
        self._seed: int | None = None
        self._steps = 0
        self._over = True
        self._won = False
        self._reward = 0.0
        self._terminated = False
        self._task = ""
        self._actions: dict[str, Effect] = {}

    # --- the protocol -----------------------------------------------------------------------

    def reset(self, seed: int) -> tuple[str, Info]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"{self.name}: seed must be an int; got {seed!r}")
        self._task, observation = self._begin(seed)
        self._seed, self._steps, self._over = seed, 0, False
        self._won, self._reward, self._terminated = False, 0.0, False
        self._actions = self._admissible()
        return observation, self._info()

    def step(self, action: str) -> StepResult:
        self._require_live()
        self._steps += 1
        effect = self._actions.get(action)
        if effect is None:
            observation = self._invalid_observation()
        else:
            observation = effect()
            self._actions = {} if self._terminated else self._admissible()
        truncated = not self._terminated and self._steps >= self.max_steps
        if self._terminated or truncated:
            self._over, self._actions = True, {}
        reward, self._reward = self._reward, 0.0
        info = self._info()
        info["valid"] = effect is not None
        return observation, reward, self._terminated, truncated, info

    def expert_action(self) -> str:
        self._require_live()
        return self._expert()

    def anchor(self) -> str:
        if self._seed is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before anchor()")
        return f"{self.name}[{self._options_key}]#{self._seed}|{self._state_key()}"

    # --- for subclasses ---------------------------------------------------------------------

    @abstractmethod
    def _begin(self, seed: int) -> tuple[str, str]:
        """Start task instance ``seed`` in its start state; return ``(task text, first observation)``."""

    @abstractmethod
    def _admissible(self) -> dict[str, Effect]:
        """The admissible actions of the current state, in a stable order, with their effects."""

    @abstractmethod
    def _expert(self) -> str:
        """The scripted expert's action in the current (live) state."""

    @abstractmethod
    def _state_key(self) -> str:
        """Everything that defines the current state, as a canonical string."""

    def _invalid_observation(self) -> str:
        """What an invalid action shows (ALFWorld's words)."""
        return "Nothing happens."

    def _finish(self, reward: float, won: bool) -> None:
        """End the episode from inside an effect (the step returns ``terminated=True``)."""
        self._terminated, self._reward, self._won = True, reward, won

    def _info(self) -> Info:
        return {"admissible_actions": list(self._actions), "won": self._won, "task": self._task}

    def _require_live(self) -> None:
        if self._seed is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before step() or expert_action()")
        if self._over:
            cap = f"truncated at the {self.max_steps}-step cap"
            how = "terminated" if self._terminated else cap
            raise RuntimeError(
                f"{self.name}: the episode of seed {self._seed} is over ({how}); "
                "call reset(seed) to start another"
            )


class DrawnEnv(EpisodeEnv, Generic[W]):
    """A built-in environment: a world drawn from ``random.Random(seed)`` alone.

    Subclasses draw a world in :meth:`_draw` and set it up in :meth:`_start`. Worlds the expert
    cannot solve within ``expert_step_bound`` steps are redrawn, so with a step cap at least that
    large every task can be won.
    """

    expert_step_bound: ClassVar[int]

    @abstractmethod
    def _draw(self, rng: random.Random) -> W:
        """Draw a world (layout, goal and start state) from ``rng`` alone."""

    @abstractmethod
    def _start(self, world: W) -> tuple[str, str]:
        """Put ``world`` in its start state; return ``(task text, first observation)``."""

    def _begin(self, seed: int) -> tuple[str, str]:
        rng = random.Random(seed)
        while True:  # redraw the rare worlds the expert cannot solve within its step bound
            world = self._draw(rng)
            self._start(world)
            if self._expert_solves_within(self.expert_step_bound):
                return self._start(world)

    def _expert_solves_within(self, bound: int) -> bool:
        """Run the expert from the start state (``_begin`` rewinds it afterwards)."""
        self._won = self._terminated = False
        for _ in range(bound):
            self._admissible()[self._expert()]()
            if self._terminated:
                return self._won
        return False
