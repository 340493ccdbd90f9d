"""``scienceworld``: ScienceWorld's elementary-science tasks, played by its Java engine.

ScienceWorld (Wang et al. 2022, ``pip install 'oma-rl[scienceworld]'``, needs Java 17 on the
``PATH``) simulates a house with a kitchen, greenhouse, workshop, outside and more, with
thermodynamics, electricity, plants and animals; its 30 tasks (``boil``, ``find-living-thing``,
``grow-plant``, ...) each come in many seeded *variations*. This adapter plays one task behind
the :class:`~oma.envs.base.TextEnv` protocol:

* **Seed -> variation.** ``task`` names the task (ScienceWorld's names); ``split`` picks its
  ``train``/``dev``/``test`` variations (ScienceWorld's own 50/25/25 split). Seed ``s`` plays
  variation ``variations[s mod len(variations)]`` of that list (sorted), so the same seed is the
  same world on every machine. Seeds ``s`` and ``s + len(variations)`` are the same task.
* **Observations** are the engine's own; the first is ``look around``'s. The task text is the
  engine's task description without its ``Your task is to`` lead-in.
* **Admissible actions.** The engine's valid action-object combinations are hundreds of strings
  (every verb on every object in reach), far more than a prompt can list; ``actions`` chooses
  how they are reduced (see :class:`ScienceWorldOptions` and docs/real-envs.md for counts). Every rule
  reads the current state only (the list itself, the room and door names) and applies in every
  state and task alike; none looks at the gold path. ``reset task`` is always dropped (it would
  restart the task inside an episode; ``reset(seed)`` does that). An admissible action the engine
  finds ambiguous is resolved to its first reading (the engine's ``0`` answer).
* **Reward.** ``score`` (default): the step that ends the episode pays the engine's score in
  [0, 1] (its partial credit for the subgoals reached), at termination or at the step cap;
  ``success``: 1 only when the task is completed. A failed task (the engine scores it -1, e.g.
  after focusing on the wrong thing) ends the episode with 0. Every other step pays 0.
  ``won`` is task completion; ``info["score"]`` is the engine's current score (a failure counts
  0), ``info["variation"]`` the variation played.
* **Expert.** ScienceWorld's gold action sequence for the variation, followed from the *current*
  state with a pointer that advances when the action taken is the expert's; see
  :meth:`ScienceWorldEnv._expert` for how it maps gold actions to admissible ones and what it
  does after other actions. It always returns an admissible action, but recovers only from
  simple deviations (a wrong room, a closed door, a dropped object); after others it may stall.
* **Anchor.** The engine's ``look around`` text (the room, what is in it, the doors' states),
  the inventory and the score (which records the subgoals reached, e.g. what the agent focused
  on), whitespace-collapsed. States that differ only out of sight (a door closed in another
  room) share an anchor.

**Engines.** One Java engine (a JVM) serves one live environment at a time; it is started on the
first ``reset`` and reused by later resets (each loads its variation). When an environment is
garbage-collected its engine goes back to a process-wide pool for the next environment (the
trainer makes one environment per episode); :meth:`ScienceWorldEnv.close` shuts its engine down
now, :func:`shutdown` shuts down the idle ones, and every engine exits with the Python process.
An engine holds one simulation, since ScienceWorld keeps global state in the JVM (its random
generator, which drives animals and the gold path, and its object-id counter); about 150-250 MB
each. ScienceWorld's gold-path generator is not reproducible (two loads of a variation can give
different, equally winning paths), so each variation's gold path is generated once per process
and cached: the expert is deterministic within a process, observations and rewards in every
process.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import re
import subprocess
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, get_args

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JError
from scienceworld.constants import BASEPATH, JAR_PATH

from .base import Effect, EpisodeEnv, Info, StepResult

Task = Literal[
    "boil",
    "change-the-state-of-matter-of",
    "chemistry-mix",
    "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color",
    "find-animal",
    "find-living-thing",
    "find-non-living-thing",
    "find-plant",
    "freeze",
    "grow-fruit",
    "grow-plant",
    "identify-life-stages-1",
    "identify-life-stages-2",
    "inclined-plane-determine-angle",
    "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces",
    "lifespan-longest-lived",
    "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived",
    "measure-melting-point-known-substance",
    "measure-melting-point-unknown-substance",
    "melt",
    "mendelian-genetics-known-plant",
    "mendelian-genetics-unknown-plant",
    "power-component",
    "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity",
    "test-conductivity-of-unknown-substances",
    "use-thermometer",
]
Split = Literal["train", "dev", "test"]
Simplification = Literal[
    "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction", "easy", "none"
]
Actions = Literal["compact", "all"]
Reward = Literal["score", "success"]

TASKS: tuple[str, ...] = get_args(Task)
"""ScienceWorld 1.2's 30 task names (``ScienceWorldEnv.get_task_names()``), in its order."""

ELECTRICAL_TASKS = frozenset(t for t in TASKS if "power-component" in t or "conductivity" in t)
"""Tasks that need the ``connect`` actions ``noElectricalAction`` removes."""

ROOMS = frozenset({
    "art studio", "bathroom", "bedroom", "foundry", "greenhouse", "hallway", "kitchen", "living room", "outside",
    "workshop",
})
"""ScienceWorld's locations (the house is the same in every task)."""

JAVA_OPTIONS = ("-Xms32m", "-Xmx512m", "-XX:+UseSerialGC")
"""A lean JVM: one simulation needs far less than Java's default heap (a quarter of the RAM), and
the serial collector spares the cores (the trainer may hold dozens of engines)."""


@dataclass(frozen=True)
class ScienceWorldOptions:
    """Options of ``scienceworld`` (docs/real-envs.md).

    * ``max_steps``: step cap. ScienceWorld ends an episode early only on success or on a
      failure (e.g. focusing on the wrong thing); wanderers run to the cap.
    * ``task``: the task (ScienceWorld's names). ``find-living-thing`` (default) is short: its
      expert needs 6 to 13 steps (walk to the outside, focus on an animal, carry it to a box).
    * ``split``: whose variations the seeds map to (``train`` is 50% of them, ``dev`` and
      ``test`` 25% each, ScienceWorld's split).
    * ``simplifications``: ScienceWorld's simplifications, any of ``teleportAction``,
      ``selfWateringFlowerPots``, ``openContainers``, ``openDoors``, ``noElectricalAction``; or
      alone ``easy`` (ScienceWorld's preset: all but ``openContainers``, and without
      ``noElectricalAction`` on the electrical tasks) or ``none``. ``noElectricalAction``
      (default) removes the ``connect``/``disconnect`` actions, about 300 of the 400 valid
      actions at the start; the electrical tasks (``power-component*``, ``*conductivity*``) need
      them, so they take ``none`` or ``easy``.
    * ``actions``: ``compact`` (default) or ``all`` (the engine's valid list, deduplicated and
      sorted, without ``reset task``). ``compact`` also drops, in every state: ``task`` (the task
      is in every prompt); any action on the agent, the air or the inventory object (the
      ``inventory`` command stays), and on a room except ``go to``/``teleport to`` it; on doors,
      everything but ``open``/``close``; ``move``/``pour``/``dunk``/``use`` unless their first
      object is held (``put down X`` is valid), and ``move``/``pour``/``dunk`` into something
      that is not a container (no ``look in Y``); ``mix`` of a non-container. So things are
      picked up before they are moved, as in ALFWorld; the expert does that too.
    * ``reward``: ``score`` (partial credit in [0, 1] at the end of the episode) or ``success``.
    """

    max_steps: int = field(default=30, metadata={"min": 1})
    task: Task = "find-living-thing"
    split: Split = "train"
    simplifications: tuple[Simplification, ...] = ("noElectricalAction",)
    actions: Actions = "compact"
    reward: Reward = "score"


# --- engines ------------------------------------------------------------------------------------


class _Engine:
    """A JVM running ScienceWorld's ``PythonInterface`` over py4j: one simulation at a time."""

    running = 0  # engines started and not closed, in this process

    def __init__(self) -> None:
        port, proc = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH,
                                    javaopts=list(JAVA_OPTIONS), return_proc=True)
        self.process = proc
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port),
                                   java_process=proc)
        self.server: Any = self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        self.closed = False
        _Engine.running += 1

    def load(self, task: str, variation: int, simplifications: str, gold: bool = False) -> None:
        error = self.server.load(task, variation, simplifications, gold)
        if error:
            raise ValueError(f"scienceworld: loading {task!r} variation {variation} failed: {error}")

    def alive(self) -> bool:
        return not self.closed and self.process.poll() is None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _Engine.running -= 1
        with contextlib.suppress(Py4JError, OSError):  # already gone
            self.gateway.shutdown()
        try:  # die_on_exit: the JVM exits when its stdin gets a line or closes (py4j issue 320)
            if self.process.poll() is None:
                self.process.stdin.write(b"\n")
                self.process.stdin.flush()
            self.process.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


_COLLECT_AT = 8
"""With this many engines running, collect garbage before starting another."""

_IDLE: list[_Engine] = []
"""Started engines no environment holds (reused before a new JVM is started)."""

_VARIATIONS: dict[tuple[str, str], tuple[int, ...]] = {}
"""(task, split) -> its variations, sorted."""

_GOLD: dict[tuple[str, int, str], tuple[str, ...]] = {}
"""(task, variation, simplifications) -> the gold action sequence generated first in this process."""


def _take_engine() -> _Engine:
    """An idle engine, else a new one (after a garbage collection, if many are running: an
    environment dropped in a reference cycle gives its engine back only when collected)."""
    for attempt in range(2):
        while _IDLE:
            engine = _IDLE.pop()
            if engine.alive():
                return engine
        if attempt == 0 and _Engine.running >= _COLLECT_AT:
            gc.collect()
    return _Engine()


def _give_back(engine: _Engine) -> None:
    if engine.alive():
        _IDLE.append(engine)


def shutdown() -> None:
    """Shut down the idle engines now (the live ones stay with their environments)."""
    while _IDLE:
        _IDLE.pop().close()


atexit.register(shutdown)


# --- reading the engine's text --------------------------------------------------------------------

_ROOM = re.compile(r"This (?:room|outside location) is called the (.+?)\.")
_DOOR = re.compile(r"A door to the (.+?) \(that is (?:open|closed)\)")
_ONE = ("focus on", "look at", "look in", "pick up", "put down", "go to", "teleport to", "open", "close",
        "activate", "deactivate", "eat", "read", "flush", "mix", "disconnect")
_TWO = (("move", ("to",)), ("pour", ("in", "into")), ("dunk", ("into", "in")), ("use", ("on",)),
        ("connect", ("to",)))
_HELD_FIRST = ("move", "pour", "dunk", "use")  # compact: the first object must be held
_INTO = ("move", "pour", "dunk")  # compact: ... and the second a container
_SYNONYMS = (("examine ", "look at "), ("drop ", "put down "), ("take ", "pick up "), ("get ", "pick up "))
_SELF = frozenset({"agent", "air", "inventory"})
_PART = re.compile(r"^(.+) terminal \d+$|^(?:anode|cathode) in (.+)$|^(.+) (?:anode|cathode)$")
"""A terminal of an electrical part, and the part (``orange wire terminal 1``, ``anode in battery``)."""


def _is_door(name: str) -> bool:
    """ScienceWorld names a door ``door`` (the room's only one), ``door to <room>`` or ``<room> door``."""
    return name == "door" or name.startswith("door to ") or name.endswith(" door")


def _door_names(room: str) -> tuple[str, ...]:
    """What the admissible list may call the door to ``room``."""
    return (f"door to {room}", f"{room} door", "door")


def _two_object_splits(action: str) -> tuple[str, tuple[str, ...], list[tuple[str, str]]] | None:
    """For an action with a two-object verb: the verb, its separators and every ``(first, second)``
    split of the rest at a separator, in order (object names may contain a separator word, so
    only the caller knows which split names real objects); None for any other verb."""
    for verb, seps in _TWO:
        if action.startswith(verb + " "):
            rest = action[len(verb) + 1:]
            splits = []
            for sep in seps:
                marker = f" {sep} "
                at = rest.find(marker)
                while at != -1:
                    splits.append((rest[:at], rest[at + len(marker):]))
                    at = rest.find(marker, at + 1)
            return verb, seps, splits
    return None


def _parse(action: str, names: set[str]) -> tuple[str, tuple[str, ...]] | None:
    """``(verb, objects)`` of an action string, splitting on known object ``names``; None if unknown."""
    two = _two_object_splits(action)
    if two is not None:
        verb, _, splits = two
        return next(((verb, pair) for pair in splits if pair[0] in names and pair[1] in names), None)
    for verb in _ONE:
        if action.startswith(verb + " "):
            return verb, (action[len(verb) + 1:],)
    return None


def _compact(valid: list[str]) -> list[str]:
    """The ``compact`` reduction of the engine's valid list (see :class:`ScienceWorldOptions`).

    Everything it needs is read off the list itself: objects in reach are those with a valid
    ``look at X``, held ones those with ``put down X``, containers those with ``look in X``.
    """
    names = {a[len("look at "):] for a in valid if a.startswith("look at ")}
    held = {a[len("put down "):] for a in valid if a.startswith("put down ")}
    containers = {a[len("look in "):] for a in valid if a.startswith("look in ")}
    kept = []
    for action in valid:
        if action == "task":
            continue
        parsed = _parse(action, names)
        if parsed is not None:
            verb, objects = parsed
            if any(o in _SELF for o in objects):
                continue
            if any(o in ROOMS for o in objects) and verb not in ("go to", "teleport to"):
                continue
            if any(_is_door(o) for o in objects) and verb not in ("open", "close"):
                continue
            if verb in _HELD_FIRST and objects[0] not in held:
                continue
            if verb in _INTO and objects[1] not in containers:
                continue
            if verb == "mix" and objects[0] not in containers:
                continue
        kept.append(action)
    return kept


def _act(ref: weakref.ref[ScienceWorldEnv], action: str) -> str:
    """An admissible action's effect (holds the environment weakly: no cycle keeps it alive)."""
    env = ref()
    assert env is not None
    return env._do(action)


# --- the environment ------------------------------------------------------------------------------


class ScienceWorldEnv(EpisodeEnv):
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

    # --- the expert -----------------------------------------------------------------------------------

    def _expert(self) -> str:
        """The gold path's next action from here, made admissible.

        A pointer into the variation's gold path advances when the action taken is the one the
        expert chose in that state (when it was not asked, when the action is exactly the gold
        one). The pointer's gold action is mapped to an admissible string: as is; with
        ``examine``/``drop`` read as ``look at``/``put down``; or with its objects renamed to the
        names the admissible list uses (the gold path says ``move egg dove egg in inventory to
        red box``, ``open door to hallway`` and ``pour cup containing blue paint in art studio in
        bowl`` where the list says ``move dove to red box``, ``open door`` and ``pour cup
        containing blue paint in inventory into bowl``). Gold actions that need no doing are
        skipped (see :meth:`_done`). If the gold action still does not map, the expert repairs
        what it can: it walks back (through doors seen this episode) to the room the gold path
        was in at the pointer, opens a closed door the gold path goes through, and picks up an
        object the gold path moves (``compact`` lists moves of held objects only); else it says
        ``look around``. So it stalls until the cap after deviations it cannot repair: an object
        carried elsewhere, something eaten or poured away, or a focus on another object
        (ScienceWorld's tasks grade what the agent focuses on, and a second focus can leave the
        task unwinnable without failing it). Replanning would need ScienceWorld's solver, and
        reloading and replaying costs seconds, so neither is tried.
        """
        return self._expert_plan()[0]

    def _expert_plan(self) -> tuple[str, int, bool]:
        """(the expert's action, where the pointer goes if it is taken, whether it is a gold action)."""
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan

    def _make_plan(self) -> tuple[str, int, bool]:
        admissible = set(self._valid)
        gold, i = self._gold, self._pointer
        while i < len(gold):
            action = gold[i]
            mapped = self._map(action, admissible)
            if mapped is not None:
                return mapped, i + 1, True
            if not self._done(action, admissible):
                break
            i += 1
        if i < len(gold):
            want = self._rooms.get(self._pointer, "")
            if want and self._room and want != self._room:
                step = self._towards(want, admissible)
                if step is not None:
                    return step, i, False
            repair = self._repair(gold[i], admissible)
            if repair is not None:
                return repair, i, False
        fallback = "look around" if "look around" in admissible else self._valid[0]
        return fallback, self._pointer, False

    def _done(self, action: str, admissible: set[str]) -> bool:
        """Whether gold ``action`` needs no doing here: a number (an answer to the engine's
        ambiguity question, which the effects give themselves), or its effect already holds
        (opening what is open, closing what is closed, (de)activating what is, going where the
        agent is, picking up what it holds)."""
        if action.strip().isdigit():
            return True
        opposite = {"open ": "close ", "close ": "open ", "activate ": "deactivate ", "deactivate ": "activate "}
        for verb, other in opposite.items():
            if action.startswith(verb):
                return self._map(other + action[len(verb):], set(self._engine_valid)) is not None
        if action.startswith("go to "):
            return action[len("go to "):] == self._room
        if action.startswith("pick up "):
            return any(f"put down {name}" in self._engine_valid for name in self._names_for(action[len("pick up "):]))
        return False

    def _map(self, action: str, admissible: set[str]) -> str | None:
        """The admissible string for gold ``action``, or None."""
        if action in admissible:
            return action
        for old, new in _SYNONYMS:
            if action.startswith(old) and new + action[len(old):] in admissible:
                return new + action[len(old):]
        two = _two_object_splits(action)
        if two is not None:
            verb, seps, splits = two
            for a, b in splits:
                for first in self._names_for(a):
                    for second in self._names_for(b):
                        for out in seps:
                            candidate = f"{verb} {first} {out} {second}"
                            if candidate in admissible:
                                return candidate
            return None
        for old, new in (*_SYNONYMS, ("", "")):
            if action.startswith(old):
                action = new + action[len(old):]
                break
        for verb in _ONE:
            if action.startswith(verb + " "):
                for name in self._names_for(action[len(verb) + 1:]):
                    if f"{verb} {name}" in admissible:
                        return f"{verb} {name}"
                return None
        return None

    def _names_for(self, text: str) -> Iterator[str]:
        """Names in the admissible list's vocabulary for an object the gold path calls ``text``.

        The list names an object by its shortest unique referent, with where it is when that
        is needed (``cup containing blue paint in inventory``); the gold path may use another
        referent (``egg dove egg``) and where the object was then (``... in art studio``). So:
        ``text`` itself; then names in reach that are ``text`` without, or with another, place
        (at the place ``text`` names first, then held objects), and (asking the engine for every
        object's referents, once per state) the same for the object's other referents; first for
        all of ``text``, then for it without its last ``in ...``, and so on.
        """
        in_reach = sorted({a[len("look at "):] for a in self._engine_valid if a.startswith("look at ")},
                          key=lambda name: (not name.endswith(" in inventory"), name))
        if text.startswith("door to "):
            bases = list(_door_names(text[len("door to "):]))
        else:
            bases = [text]
            at = text.rfind(" in ")
            while at != -1:
                bases.append(text[:at])
                at = text.rfind(" in ", 0, at)
            part = _PART.match(text)  # a terminal of an object: the list may name the object itself
            if part:
                bases.append(next(whole for whole in part.groups() if whole))
        seen: set[str] = set()

        def placed(base: str) -> Iterator[str]:
            """Names of ``base`` here: at the place ``text`` names first, then held ones."""
            found = [n for n in in_reach if n not in seen and (n == base or n.startswith((base + " in ", base + " on ")))]
            found.sort(key=lambda n: n[len(base):] not in text)  # stable: held ones stay ahead
            for name in found:
                seen.add(name)
                yield name

        if text in in_reach:
            seen.add(text)
            yield text
        for base in bases:  # the most specific first
            yield from placed(base)
            if self._referents is None:
                lut = json.loads(self._engine.server.getAllObjectIdsTypesReferentsLUTJSON())
                self._referents = [list(v.get("referents", ())) for _, v in sorted(lut.items())]
            matching = [referents for referents in self._referents if base in referents]
            for referents in matching:  # the object's own names before names shared with others
                for referent in referents:
                    if referent in in_reach and referent not in seen:
                        seen.add(referent)
                        yield referent
            for referents in matching:
                for referent in referents:
                    yield from placed(referent)

    def _towards(self, room: str, admissible: set[str]) -> str | None:
        """The next step back to ``room`` through doors seen this episode, or None."""
        if f"teleport to {room}" in admissible:
            return f"teleport to {room}"
        previous = {self._room: self._room}
        queue = deque([self._room])
        while queue:
            here = queue.popleft()
            if here == room:
                break
            for there in sorted(self._doors.get(here, ())):
                if there not in previous:
                    previous[there] = here
                    queue.append(there)
        if room not in previous:
            return None
        hop = room
        while previous[hop] != self._room:
            hop = previous[hop]
        return self._through(hop, admissible)

    def _through(self, room: str, admissible: set[str]) -> str | None:
        """``go to`` the next ``room``, or open the door to it first."""
        if f"go to {room}" in admissible:
            return f"go to {room}"
        for door in _door_names(room):
            if f"open {door}" in admissible:
                return f"open {door}"
        return None

    def _repair(self, action: str, admissible: set[str]) -> str | None:
        """What makes gold ``action`` possible here: open the door it goes through, pick up what it moves."""
        if action.startswith("go to "):
            return self._through(action[len("go to "):], admissible)
        for verb, seps in _TWO:
            if verb in _HELD_FIRST and action.startswith(verb + " "):
                rest = action[len(verb) + 1:]
                for sep in seps:
                    at = rest.find(f" {sep} ")
                    while at != -1:
                        for name in self._names_for(rest[:at]):
                            if f"pick up {name}" in admissible:
                                return f"pick up {name}"
                        at = rest.find(f" {sep} ", at + 1)
        return None

    # --- lifetime ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut this environment's engine down now (a later ``reset`` starts another)."""
        if self._release is not None:
            self._release.detach()
        if self._engine is not None:
            self._engine.close()
        self._engine, self._release = None, None
        self._seed, self._over, self._actions, self._valid = None, True, {}, []
