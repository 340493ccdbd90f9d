"""The ``scienceworld`` environment: one task of ScienceWorld behind the TextEnv protocol."""

from __future__ import annotations

import re
import weakref
from functools import partial

from ..base import Effect, EpisodeEnv, Info, StepResult
from .engine import _GOLD, _VARIATIONS, _Engine, _give_back, _take_engine
from .expert import _Expert
from .options import ELECTRICAL_TASKS, ScienceWorldOptions
from .text import _DOOR, _ROOM, _compact

def _act(ref: weakref.ref[ScienceWorldEnv], action: str) -> str:
    """An admissible action's effect (holds the environment weakly: no cycle keeps it alive)."""
    env = ref()
    assert env is not None
    return env._do(action)


class ScienceWorldEnv(_Expert, EpisodeEnv):
    """ScienceWorld's tasks behind the TextEnv protocol (module docstring; docs/real-envs.md)."""

    name = "scienceworld"
    options_class = ScienceWorldOptions
    options: ScienceWorldOptions

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        chosen = self.options.simplifications
        for alone in ("none", "easy"):
            if alone in chosen and len(chosen) > 1:
                raise ValueError(
                    f"scienceworld: option 'simplifications' cannot combine {alone!r} with others; got {list(chosen)}"
                )
        if self.options.task in ELECTRICAL_TASKS and "noElectricalAction" in chosen:
            raise ValueError(
                f"scienceworld: option 'simplifications' includes 'noElectricalAction', which removes the connect "
                f"actions task {self.options.task!r} needs; use e.g. simplifications=none or easy"
            )
        self._simplifications = "" if chosen == ("none",) else ",".join(chosen)
        self._engine: _Engine | None = None
        self._release: weakref.finalize | None = None
        self._ref = weakref.ref(self)
        self._variation = -1
        self._score = 0.0
        self._look = self._inventory = ""
        self._room = ""
        self._valid: list[str] = []  # the admissible actions
        self._engine_valid: list[str] = []  # the engine's valid actions they were chosen from
        self._referents: list[list[str]] | None = None  # every object's referents, fetched when needed
        # the expert
        self._gold: tuple[str, ...] = ()
        self._pointer = 0
        self._rooms: dict[int, str] = {}  # gold index -> the room it was reached in
        self._doors: dict[str, set[str]] = {}  # room -> rooms its doors lead to (seen so far)
        self._plan: tuple[str, int, bool] | None = None  # (action, pointer after it, a gold action)

    # --- EpisodeEnv -------------------------------------------------------------------------------

    def step(self, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = super().step(action)
        if truncated and self.options.reward == "score":
            reward = max(self._score, 0.0)  # the partial credit reached by the cap
        return observation, reward, terminated, truncated, info

    def _begin(self, seed: int) -> tuple[str, str]:
        task, simplifications = self.options.task, self._simplifications
        engine = self._engine_for_episode()
        variations = self._variations_of(engine)
        self._variation = variation = variations[seed % len(variations)]
        key = (task, variation, simplifications)
        if key not in _GOLD:
            engine.load(task, variation, simplifications, gold=True)
            _GOLD[key] = tuple(engine.server.getGoldActionSequence())
        engine.load(task, variation, simplifications)  # always a plain load: the same world for every seed
        observation = engine.server.step("look around")
        self._gold, self._pointer, self._plan = _GOLD[key], 0, None
        self._doors = {}
        self._refresh()
        self._rooms = {0: self._room}
        description = engine.server.getTaskDescription()
        return re.sub(r"^\s*Your task is to\s+", "", description).strip(), observation

    def _admissible(self) -> dict[str, Effect]:
        return {a: partial(_act, self._ref, a) for a in self._valid}

    def _state_key(self) -> str:
        return " ".join(f"{self._look} | {self._inventory} | score={self._score:g}".split())

    def _info(self) -> Info:
        info = super()._info()
        info["score"] = max(self._score, 0.0)
        info["variation"] = self._variation
        return info

    # --- the engine ---------------------------------------------------------------------------------

    def _engine_for_episode(self) -> _Engine:
        if self._engine is None or not self._engine.alive():
            if self._release is not None:
                self._release.detach()
            self._engine = _take_engine()
            self._release = weakref.finalize(self, _give_back, self._engine)
        return self._engine

    def _variations_of(self, engine: _Engine) -> tuple[int, ...]:
        key = (self.options.task, self.options.split)
        if key not in _VARIATIONS:
            engine.load(self.options.task, 0, self._simplifications)  # the split needs a loaded task
            server = engine.server
            listed = {"train": server.getVariationsTrain, "dev": server.getVariationsDev,
                      "test": server.getVariationsTest}[self.options.split]()
            _VARIATIONS[key] = tuple(sorted(int(v) for v in listed))
        return _VARIATIONS[key]

    def _do(self, action: str) -> str:
        server = self._engine.server
        plan = self._plan  # the expert's choice here, if it was asked (the warm start asks every step)
        if plan is None and self._pointer < len(self._gold) and action == self._gold[self._pointer]:
            plan = (action, self._pointer + 1, True)
        observation = server.step(action)
        if observation.startswith("Ambiguous request"):
            observation = server.step("0")  # the engine's first reading
        want = self._rooms.get(self._pointer, "")
        self._refresh()
        if plan is not None and action == plan[0]:
            self._pointer = plan[1]
            # the room the gold path is in at the new pointer: here after a gold action; after a
            # repair (walking back, opening, picking up) still the room it wanted
            self._rooms[self._pointer] = self._room if plan[2] else want
        completed = bool(server.getCompleted())
        if completed or self._score < 0:
            won = completed and self._score >= 0
            self._finish(float(won) if self.options.reward == "success" else max(self._score, 0.0), won)
        return observation

    def _refresh(self) -> None:
        """Read the new state off the engine (its free actions do not advance the simulation)."""
        server = self._engine.server
        self._plan, self._referents = None, None
        self._score = float(server.getScore())
        self._look, self._inventory = server.freeActionLook(), server.freeActionInventory()
        room = _ROOM.search(self._look)
        self._room = room.group(1) if room else ""
        self._doors.setdefault(self._room, set()).update(_DOOR.findall(self._look))
        for other in self._doors[self._room]:
            self._doors.setdefault(other, set()).add(self._room)
        if bool(server.getCompleted()) or self._score < 0:
            self._valid = self._engine_valid = []
            return
        self._engine_valid = sorted(set(server.getValidActionObjectCombinations()) - {"reset task"})
        self._valid = _compact(self._engine_valid) if self.options.actions == "compact" else self._engine_valid

    # --- lifetime ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut this environment's engine down now (a later ``reset`` starts another)."""
        if self._release is not None:
            self._release.detach()
        if self._engine is not None:
            self._engine.close()
        self._engine, self._release = None, None
        self._seed, self._over, self._actions, self._valid = None, True, {}, []
