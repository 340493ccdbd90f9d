"""``household``: an ALFWorld-like home in text, generated per seed.

A home is a chain of rooms (kitchen, bathroom, bedroom, ...); each room holds numbered
receptacles (``cabinet 2``, ``fridge 1``), some of which open and close, and objects lie in them.
The agent sees only the room it is in, or the receptacle it stands at, and carries one object.
Goals follow ALFWorld's six task types: put an object somewhere, put two, clean/heat/cool it
first, or look at it under a lamp. Nothing ever ends an episode early except winning, so a
policy that does not finish runs to the step cap: failures are long, successes short, which is
the expansion–outcome coupling OMA is about (docs/math.md#worked-example).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from .base import DrawnEnv, Effect, Info, StepResult
from .sampling import pick, sample, shuffle

GoalKind = Literal["place", "two", "clean", "heat", "cool", "examine"]
Size = Literal["small", "medium", "large", "mixed"]
Distractors = Literal["few", "many", "mixed"]
Text = Literal["alfworld", "terse"]
Transform = Literal["clean", "heat", "cool"]

GOAL_KINDS: tuple[GoalKind, ...] = ("place", "two", "clean", "heat", "cool", "examine")


@dataclass(frozen=True)
class HouseholdOptions:
    """Knobs of ``household`` (docs/envs.md has their measured effect on coupling).

    * ``max_steps``: step cap. Every failure lasts exactly this long, so it sets the failure
      length; a larger cap also lets noisy policies recover more often. Worlds do not depend on
      it: with a cap below 30 (the expert's bound) some tasks cannot be won.
    * ``size``: rooms (3/4/6) and the share of optional receptacles they get (30/50/70%);
      larger homes mean longer searches and deliveries. ``mixed`` draws one per seed.
    * ``distractors``: extra objects (about one per three receptacles, or one per receptacle):
      longer observations and more ``take`` actions to choose among; little effect on a noisy
      expert. ``mixed`` draws one per seed.
    * ``goals``: the goal kinds drawn from (one per seed, uniformly): ``place`` and ``examine``
      are short, ``two`` and the transforms long.
    * ``notes``: every observation ends with a line of what the agent itself has found so far
      (what it carries, the receptacles it has searched, where it saw objects of the goal's
      kind). It is a memory aid for small policies with a short history window: every fact in
      it was in an earlier observation of the episode, so nothing hidden is revealed, but a
      policy no longer has to remember the whole episode to search without going in circles.
    * ``hint``: the task also says where one goal object lies at the start ("Hint: the lettuce 1
      is in/on fridge 1 in the kitchen."), so no search is needed and episodes become
      navigation and handling; the expert uses the hint as if it had seen that receptacle.
      With ``notes`` it makes the task Markov in the current observation, for CPU-sized
      policies (the quickstart); failures still run to the cap.
    * ``text``: how observations, notes and the hint are worded. ``alfworld`` uses ALFWorld's
      sentences ("You arrive at cabinet 1. On the cabinet 1, you see a mug 1, and a cup 2.");
      ``terse`` states the same facts in fewer words ("At cabinet 1. On it: mug 1, cup 2."):
      about 20% fewer prompt tokens, a CPU policy's passes cheaper and the default job of
      2026-12-04 1.5× faster, with the same gains per RL iteration (docs/training.md, "Terse
      observations"); today's default job uses it.
      Actions, rewards, the expert and the states are the same under both; only the first
      observation differs by more than wording: ``terse`` leaves out ALFWorld's "Your task is
      to: ..." there, since the task is in every prompt anyway.
    """

    max_steps: int = field(default=30, metadata={"min": 1})
    size: Size = "mixed"
    distractors: Distractors = "mixed"
    goals: tuple[GoalKind, ...] = GOAL_KINDS
    notes: bool = False
    hint: bool = False
    text: Text = "alfworld"


# --- the world's vocabulary ------------------------------------------------------------------


@dataclass(frozen=True)
class ReceptacleKind:
    name: str
    openable: bool = False
    inside: bool = False  # "in" rather than "on" in goal texts
    transform: Transform | None = None  # the appliance of a transform: sinkbasin, microwave, fridge
    food_only: bool = False  # generation only: fridges and microwaves start with food and dishes


@dataclass(frozen=True)
class RoomKind:
    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]  # each may be added; a name listed twice may appear twice
    lamp: tuple[str, str] | None = None  # (lamp, the receptacle it stands on)


@dataclass(frozen=True)
class ObjectKind:
    name: str
    rooms: tuple[str, ...]  # where it is found at the start
    transforms: tuple[Transform, ...] = ()  # the transform goals it can appear in
    examinable: bool = False  # can appear in "look at X under the lamp" goals


RECEPTACLES = {
    k.name: k
    for k in (
        ReceptacleKind("countertop"),
        ReceptacleKind("cabinet", openable=True, inside=True),
        ReceptacleKind("drawer", openable=True, inside=True),
        ReceptacleKind("fridge", openable=True, inside=True, transform="cool", food_only=True),
        ReceptacleKind("microwave", openable=True, inside=True, transform="heat", food_only=True),
        ReceptacleKind("sinkbasin", inside=True, transform="clean"),
        ReceptacleKind("safe", openable=True, inside=True),
        ReceptacleKind("garbagecan", inside=True),
        ReceptacleKind("bathtubbasin", inside=True),
        *(
            ReceptacleKind(name)
            for name in (
                "diningtable", "shelf", "toilet", "towelholder", "bed", "desk", "dresser",
                "sidetable", "sofa", "armchair", "coffeetable", "tvstand",
            )
        ),
    )
}

ROOMS = (
    RoomKind(
        "kitchen",
        ("cabinet", "countertop", "drawer", "fridge", "microwave", "sinkbasin"),
        ("cabinet", "cabinet", "cabinet", "drawer", "drawer", "countertop", "shelf", "garbagecan"),
    ),
    RoomKind(
        "bathroom",
        ("cabinet", "countertop", "sinkbasin", "toilet"),
        ("cabinet", "drawer", "drawer", "towelholder", "bathtubbasin", "garbagecan"),
    ),
    RoomKind(
        "bedroom",
        ("bed", "desk"),
        ("drawer", "drawer", "drawer", "dresser", "shelf", "safe", "garbagecan"),
        lamp=("desklamp", "desk"),
    ),
    RoomKind(
        "livingroom",
        ("sofa", "sidetable"),
        ("coffeetable", "armchair", "cabinet", "shelf", "tvstand", "drawer"),
        lamp=("floorlamp", "sidetable"),
    ),
    RoomKind(
        "office",
        ("desk", "shelf"),
        ("drawer", "drawer", "drawer", "safe", "cabinet", "garbagecan", "armchair"),
        lamp=("desklamp", "desk"),
    ),
    RoomKind(
        "diningroom",
        ("diningtable", "cabinet"),
        ("cabinet", "cabinet", "shelf", "sidetable", "countertop", "garbagecan"),
    ),
)

_ALL: tuple[Transform, ...] = ("clean", "heat", "cool")
OBJECTS = (
    *(ObjectKind(n, ("kitchen",), _ALL) for n in ("potato", "lettuce", "egg")),
    *(ObjectKind(n, ("kitchen", "diningroom"), _ALL) for n in ("apple", "tomato", "bread")),
    *(ObjectKind(n, ("kitchen", "diningroom"), _ALL) for n in ("plate", "bowl")),
    *(
        ObjectKind(n, ("kitchen", "diningroom", "livingroom", "office"), _ALL)
        for n in ("mug", "cup")
    ),
    *(ObjectKind(n, ("kitchen",), ("clean", "cool")) for n in ("pan", "pot")),
    ObjectKind("spatula", ("kitchen",), ("clean",)),
    *(ObjectKind(n, ("kitchen", "diningroom"), ("clean",)) for n in ("knife", "fork", "spoon")),
    *(ObjectKind(n, ("bathroom",), ("clean",)) for n in ("soapbar", "cloth", "sponge")),
    *(ObjectKind(n, ("bathroom",)) for n in ("towel", "toiletpaper", "spraybottle", "candle")),
    *(
        ObjectKind(n, ("bedroom", "livingroom", "office"), examinable=True)
        for n in ("book", "pen", "pencil", "cd", "cellphone", "keychain", "creditcard", "watch")
    ),
    *(
        ObjectKind(n, ("livingroom",), examinable=True)
        for n in ("remotecontrol", "newspaper", "statue", "vase", "box")
    ),
    ObjectKind("pillow", ("bedroom", "livingroom")),
)

_ROOM_COUNT = {"small": 3, "medium": 4, "large": 6}
_OPTIONAL_SHARE = {"small": 0.3, "medium": 0.5, "large": 0.7}
_OBJECTS_PER_RECEPTACLE = {"few": 1 / 3, "many": 1.0}
_PUT_AWAY_SHARE = 0.6  # objects that start in a closed receptacle (where their room has one)
_STATE_BIT = {"clean": 1, "heat": 2, "cool": 4}
_STATE_WORD = {"clean": "clean", "heat": "hot", "cool": "cool"}
_NOWHERE = -1  # "at" value in the middle of a room; "holding"/object location when in hand
EXPERT_STEP_BOUND = 30
"""Homes whose goal the expert cannot reach within this many steps are redrawn (see docs)."""


@dataclass(frozen=True)
class Wording:
    """The sentences of one ``text`` option; each is a ``str.format`` template of the named fields."""

    room: str  # {room} {receps} {exits}: a room seen from its middle
    start: str  # {room_text} {task}: the first observation
    middle: str  # {room_text}: "look" in the middle of a room
    enter: str  # {room_text}
    arrive: str  # {recep} {view}
    at: str  # {recep} {room} {view}: "look" at a receptacle
    closed: str  # {recep}
    on: str  # {recep} {things}: what lies on an open surface
    inside: str  # {recep} {things}: what lies in an opened receptacle
    opened: str  # {recep} {view}
    shut: str  # {recep}
    take: str  # {obj} {recep}
    put: str  # {obj} {recep}
    transform: str  # {transform} {obj} {recep}
    lamp: str  # {lamp}
    empty_handed: str
    carrying: str  # {obj} {state}
    notes: str  # {held} {searched}
    saw: str  # {found}
    hint: str  # {obj} {recep} {room}
    articles: bool  # list things as "a mug 1, and a cup 2" (ALFWorld) or "mug 1, cup 2"

    def listing(self, names: list[str]) -> str:
        """ALFWorld's way of listing things ("a mug 1, and a cup 2") or the bare names; "nothing"."""
        if not names:
            return "nothing"
        if not self.articles:
            return ", ".join(names)
        if len(names) == 1:
            return f"a {names[0]}"
        return ", ".join(f"a {n}" for n in names[:-1]) + f", and a {names[-1]}"


WORDINGS: dict[Text, Wording] = {
    "alfworld": Wording(
        room="the {room}. Looking quickly around you, you see {receps}. Exits: {exits}.",
        start="You are in the middle of {room_text}\nYour task is to: {task}",
        middle="You are in the middle of {room_text}",
        enter="You enter {room_text}",
        arrive="You arrive at {recep}. {view}",
        at="You are at {recep} in the {room}. {view}",
        closed="The {recep} is closed.",
        on="On the {recep}, you see {things}.",
        inside="The {recep} is open. In it, you see {things}.",
        opened="You open the {recep}. {view}",
        shut="You close the {recep}.",
        take="You pick up the {obj} from the {recep}.",
        put="You put the {obj} in/on the {recep}.",
        transform="You {transform} the {obj} using the {recep}.",
        lamp="You turn on the {lamp}.",
        empty_handed="You are not carrying anything.",
        carrying="You are carrying: a {obj}{state}.",
        notes="Notes: carrying {held}; searched {searched}",
        saw="; saw {found}.",
        hint=" Hint: the {obj} is in/on {recep} in the {room}.",
        articles=True,
    ),
    # The same facts with the filler words out; "In" and "Entered" keep apart looking and arriving.
    "terse": Wording(
        room="{room}: {receps}. Exits: {exits}.",
        start="In {room_text}",
        middle="In {room_text}",
        enter="Entered {room_text}",
        arrive="At {recep}. {view}",
        at="At {recep} in {room}. {view}",
        closed="Closed.",
        on="On it: {things}.",
        inside="In it: {things}.",
        opened="Opened {recep}. {view}",
        shut="Closed {recep}.",
        take="Took {obj} from {recep}.",
        put="Put {obj} in/on {recep}.",
        transform="{transform}ed {obj} with {recep}.",
        lamp="Turned on {lamp}.",
        empty_handed="Carrying nothing.",
        carrying="Carrying {obj}{state}.",
        notes="Carrying {held}; searched {searched}",
        saw="; saw {found}.",
        hint=" Hint: {obj} in/on {recep} in {room}.",
        articles=False,
    ),
}


@dataclass(frozen=True)
class Goal:
    """What must hold for a win; ``text`` is the task the agent is given."""

    kind: GoalKind
    obj: str  # object kind
    recep: str  # receptacle kind ("" for examine)
    lamp: str  # lamp kind, e.g. "desklamp" ("" unless examine)
    text: str

    @property
    def state_bit(self) -> int:
        return _STATE_BIT.get(self.kind, 0)


@dataclass
class Home:
    """One generated home: the fixed layout plus the starting state."""

    rooms: list[str]
    recep_name: list[str]
    recep_kind: list[ReceptacleKind]
    recep_room: list[int]
    recep_lamp: list[str]  # the lamp standing on it ("desklamp 2"), or ""
    obj_name: list[str]
    obj_kind: list[str]
    obj_loc: list[int]
    start_room: int
    goal: Goal


# --- generation ------------------------------------------------------------------------------


def generate_home(rng: random.Random, options: HouseholdOptions) -> Home:
    """Draw a home and a goal. Everything depends only on ``rng`` and ``options``.

    The goal is drawn first and the home is built so that it is solvable: the rooms it needs are
    present, enough goal objects exist, and none starts where the goal wants it.
    """
    size = pick(rng, ("small", "medium", "large")) if options.size == "mixed" else options.size
    level = pick(rng, ("few", "many")) if options.distractors == "mixed" else options.distractors
    kind = pick(rng, options.goals)

    others = sample(rng, ROOMS[1:], _ROOM_COUNT[size] - 1)
    if kind == "examine" and not any(r.lamp for r in others):
        others[0] = pick(rng, [r for r in ROOMS if r.lamp])
    room_kinds = [ROOMS[0], *others]
    shuffle(rng, room_kinds)
    rooms = [r.name for r in room_kinds]

    numbered: dict[str, int] = {}
    recep_name: list[str] = []
    recep_kind: list[ReceptacleKind] = []
    recep_room: list[int] = []
    recep_lamp: list[str] = []
    for index, room in enumerate(room_kinds):
        kinds = [*room.required]
        kinds += [k for k in room.optional if rng.random() < _OPTIONAL_SHARE[size]]
        for name in sorted(kinds):
            numbered[name] = numbered.get(name, 0) + 1
            recep_name.append(f"{name} {numbered[name]}")
            recep_kind.append(RECEPTACLES[name])
            recep_room.append(index)
            lamp = room.lamp[0] if room.lamp and room.lamp[1] == name else ""
            if lamp:
                numbered[lamp] = numbered.get(lamp, 0) + 1
                lamp = f"{lamp} {numbered[lamp]}"
            recep_lamp.append(lamp)

    goal = _draw_goal(rng, kind, rooms, recep_kind, recep_lamp)
    start_room = pick(rng, range(len(rooms)))
    home = Home(rooms, recep_name, recep_kind, recep_room, recep_lamp, [], [], [], start_room, goal)

    spots: dict[str, tuple[list[int], list[int]]] = {}  # per object kind: anywhere, closed

    def place(kind: ObjectKind, avoid: str) -> None:
        """Add an object of ``kind``; half of them start put away where their room allows."""
        if kind.name not in spots:
            anywhere = starting_spots(home, kind, avoid)
            spots[kind.name] = anywhere, [r for r in anywhere if recep_kind[r].openable]
        anywhere, closed = spots[kind.name]
        number = home.obj_kind.count(kind.name) + 1
        home.obj_name.append(f"{kind.name} {number}")
        home.obj_kind.append(kind.name)
        put_away = closed and rng.random() < _PUT_AWAY_SHARE
        home.obj_loc.append(pick(rng, closed if put_away else anywhere))

    goal_kind = next(o for o in OBJECTS if o.name == goal.obj)
    for _ in range(2 if kind == "two" else 1):
        place(goal_kind, avoid=goal.recep)
    candidates = [o for o in OBJECTS if o.name != goal.obj and set(o.rooms) & set(rooms)]
    for _ in range(max(2, round(len(recep_name) * _OBJECTS_PER_RECEPTACLE[level]))):
        place(pick(rng, candidates), avoid="")
    return home


def _draw_goal(
    rng: random.Random,
    kind: GoalKind,
    rooms: list[str],
    recep_kind: list[ReceptacleKind],
    recep_lamp: list[str],
) -> Goal:
    present = [o for o in OBJECTS if set(o.rooms) & set(rooms)]
    if kind == "examine":
        obj = pick(rng, [o for o in present if o.examinable]).name
        lamp = pick(rng, sorted({_kind_of(lamp) for lamp in recep_lamp if lamp}))
        return Goal(kind, obj, "", lamp, f"look at {obj} under the {lamp}.")
    if kind in _STATE_BIT:
        obj = pick(rng, [o for o in present if kind in o.transforms]).name
    else:
        obj = pick(rng, present).name
    targets = sorted(
        {k.name for k in recep_kind if k.transform is None or k.transform != kind} - {"garbagecan"}
    )
    recep = pick(rng, targets)
    where = "in" if RECEPTACLES[recep].inside else "on"
    if kind == "two":
        text = f"put two {obj} {where} {recep}."
    elif kind == "place":
        text = f"put a {obj} {where} {recep}."
    else:
        text = f"put a {_STATE_WORD[kind]} {obj} {where} {recep}."
    return Goal(kind, obj, recep, "", text)


def starting_spots(home: Home, kind: ObjectKind, avoid: str) -> list[int]:
    """The receptacles an object of ``kind`` may start in: in a room it belongs in, not of kind
    ``avoid``, and fridges and microwaves only for food and dishes. Also the expert's common
    sense of where to look."""
    food = "heat" in kind.transforms or "cool" in kind.transforms
    return [
        r
        for r, recep in enumerate(home.recep_kind)
        if home.rooms[home.recep_room[r]] in kind.rooms
        and recep.name != avoid
        and (food or not recep.food_only)
    ]


def _kind_of(name: str) -> str:
    """``"desklamp 2"`` -> ``"desklamp"``."""
    return name.rsplit(" ", 1)[0]


# --- the environment -------------------------------------------------------------------------


class HouseholdEnv(DrawnEnv[Home]):
    """ALFWorld-like household tasks; see the module docstring and docs/envs.md.

    Reward is 1 at the step that completes the goal (then ``terminated``), 0 otherwise; an
    episode that does not win is truncated at ``max_steps``.
    """

    name = "household"
    options_class = HouseholdOptions
    expert_step_bound = EXPERT_STEP_BOUND
    options: HouseholdOptions

    def reset(self, seed: int) -> tuple[str, Info]:
        observation, info = super().reset(seed)
        return self._noted(observation), info

    def step(self, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = super().step(action)
        return self._noted(observation), reward, terminated, truncated, info

    def _noted(self, observation: str) -> str:
        """``observation`` with the ``notes`` line when that option is on."""
        if not self.options.notes:
            return observation
        home = self._home
        held = home.obj_name[self._holding] if self._holding != _NOWHERE else "nothing"
        searched = [home.recep_name[r] for r, seen in enumerate(self._seen) if seen]
        found = [
            f"{home.obj_name[o]} in/on {home.recep_name[self._obj_loc[o]]}"
            for o in self._goal_objects
            if self._obj_loc[o] != _NOWHERE and self._seen[self._obj_loc[o]]
        ]
        words = self._words
        line = words.notes.format(held=held, searched=", ".join(searched) or "nothing")
        return f"{observation}\n{line}" + (words.saw.format(found=", ".join(found)) if found else ".")

    # --- generation and state ---

    def _draw(self, rng: random.Random) -> Home:
        return generate_home(rng, self.options)

    @property
    def _words(self) -> Wording:
        return WORDINGS[self.options.text]

    def _start(self, home: Home) -> tuple[str, str]:
        self._home, self._goal = home, home.goal
        n_rooms, n_receps = len(home.rooms), len(home.recep_name)
        self._room_receps = [
            [r for r in range(n_receps) if home.recep_room[r] == i] for i in range(n_rooms)
        ]
        self._exits = [[j for j in (i - 1, i + 1) if 0 <= j < n_rooms] for i in range(n_rooms)]
        self._room_text = [self._describe_room(i) for i in range(n_rooms)]
        kind = next(o for o in OBJECTS if o.name == self._goal.obj)
        self._goal_objects = [o for o, k in enumerate(home.obj_kind) if k == kind.name]
        self._hiding_places = starting_spots(home, kind, self._goal.recep)
        if self._goal.kind == "examine":
            self._targets = [
                r for r, lamp in enumerate(home.recep_lamp) if _kind_of(lamp) == self._goal.lamp
            ]
        else:
            self._targets = [r for r, k in enumerate(home.recep_kind) if k.name == self._goal.recep]
        self._appliances = [
            r for r, k in enumerate(home.recep_kind) if k.transform == self._goal.kind
        ]

        self._room, self._at, self._holding = home.start_room, _NOWHERE, _NOWHERE
        self._obj_loc = list(home.obj_loc)
        self._obj_state = [0] * len(home.obj_loc)
        self._is_open = [not k.openable for k in home.recep_kind]
        self._seen = [False] * n_receps
        self._contents: list[list[int]] = [[] for _ in range(n_receps)]
        for o, r in enumerate(self._obj_loc):
            self._contents[r].append(o)
        task = self._goal.text
        if self.options.hint:
            o = self._goal_objects[0]
            r = self._obj_loc[o]
            self._seen[r] = True
            hint = self._words.hint.format(obj=home.obj_name[o], recep=home.recep_name[r],
                                           room=home.rooms[home.recep_room[r]])
            task = f"{task}{hint}"
        return task, self._words.start.format(room_text=self._room_text[self._room], task=task)

    def _describe_room(self, i: int) -> str:
        home = self._home
        receps = self._words.listing([home.recep_name[r] for r in self._room_receps[i]])
        exits = ", ".join(home.rooms[j] for j in self._exits[i])
        return self._words.room.format(room=home.rooms[i], receps=receps, exits=exits)

    def _state_key(self) -> str:
        """The physical state. What the agent has seen so far is its history, not the state."""
        opened = "".join("1" if o else "0" for o in self._is_open)
        placed = ",".join(map(str, self._obj_loc))
        states = "".join(map(str, self._obj_state))
        return f"{self._room}.{self._at}.{self._holding}|{opened}|{placed}|{states}"

    # --- actions ---

    def _admissible(self) -> dict[str, Effect]:
        home, r, held = self._home, self._at, self._holding
        actions: dict[str, Effect] = {}
        for other in self._room_receps[self._room]:
            if other != r:
                actions[f"go to {home.recep_name[other]}"] = partial(self._go, other)
        for room in self._exits[self._room]:
            actions[f"go to {home.rooms[room]}"] = partial(self._enter, room)
        if r != _NOWHERE:
            name = home.recep_name[r]
            kind = home.recep_kind[r]
            if kind.openable:
                verb = "close" if self._is_open[r] else "open"
                actions[f"{verb} {name}"] = self._toggle
            if self._is_open[r] and held == _NOWHERE:
                for o in self._contents[r]:
                    actions[f"take {home.obj_name[o]} from {name}"] = partial(self._take, o)
            elif self._is_open[r]:
                actions[f"put {home.obj_name[held]} in/on {name}"] = self._put
            if held != _NOWHERE and kind.transform:
                actions[f"{kind.transform} {home.obj_name[held]} with {name}"] = self._transform
            if home.recep_lamp[r]:
                actions[f"use {home.recep_lamp[r]}"] = self._use_lamp
        actions["look"] = self._look
        actions["inventory"] = self._inventory
        return actions

    def _go(self, r: int) -> str:
        self._at = r
        return self._words.arrive.format(recep=self._home.recep_name[r], view=self._view(r))

    def _enter(self, room: int) -> str:
        self._room, self._at = room, _NOWHERE
        return self._words.enter.format(room_text=self._room_text[room])

    def _toggle(self) -> str:
        r = self._at
        name = self._home.recep_name[r]
        self._is_open[r] = not self._is_open[r]
        if self._is_open[r]:
            return self._words.opened.format(recep=name, view=self._view(r))
        return self._words.shut.format(recep=name)

    def _take(self, o: int) -> str:
        r = self._at
        self._contents[r].remove(o)
        self._obj_loc[o], self._holding = _NOWHERE, o
        return self._words.take.format(obj=self._home.obj_name[o], recep=self._home.recep_name[r])

    def _put(self) -> str:
        r, o = self._at, self._holding
        self._contents[r].append(o)
        self._obj_loc[o], self._holding = r, _NOWHERE
        if sum(map(self._delivered, self._goal_objects)) >= (2 if self._goal.kind == "two" else 1):
            self._finish(1.0, won=True)
        return self._words.put.format(obj=self._home.obj_name[o], recep=self._home.recep_name[r])

    def _delivered(self, o: int) -> bool:
        """Whether goal object ``o`` lies in a target receptacle in the wanted state."""
        goal, loc = self._goal, self._obj_loc[o]
        return (
            loc != _NOWHERE
            and self._home.recep_kind[loc].name == goal.recep
            and self._obj_state[o] & goal.state_bit == goal.state_bit
        )

    def _transform(self) -> str:
        r, o = self._at, self._holding
        transform = self._home.recep_kind[r].transform
        assert transform is not None  # only admissible at an appliance
        state = self._obj_state[o] | _STATE_BIT[transform]
        if transform != "clean":  # hot and cool exclude each other
            state &= ~_STATE_BIT["cool" if transform == "heat" else "heat"]
        self._obj_state[o] = state
        return self._words.transform.format(transform=transform, obj=self._home.obj_name[o],
                                            recep=self._home.recep_name[r])

    def _use_lamp(self) -> str:
        lamp, held = self._home.recep_lamp[self._at], self._holding
        if _kind_of(lamp) == self._goal.lamp and held != _NOWHERE:
            if self._home.obj_kind[held] == self._goal.obj:
                self._finish(1.0, won=True)
        return self._words.lamp.format(lamp=lamp)

    def _look(self) -> str:
        r = self._at
        if r == _NOWHERE:
            return self._words.middle.format(room_text=self._room_text[self._room])
        return self._words.at.format(recep=self._home.recep_name[r], room=self._home.rooms[self._room],
                                     view=self._view(r))

    def _inventory(self) -> str:
        o = self._holding
        if o == _NOWHERE:
            return self._words.empty_handed
        words = [_STATE_WORD[t] for t in _ALL if self._obj_state[o] & _STATE_BIT[t]]
        state = f" ({', '.join(words)})" if words else ""
        return self._words.carrying.format(obj=self._home.obj_name[o], state=state)

    def _view(self, r: int) -> str:
        """What is visible at receptacle ``r`` (nothing inside a closed one); marks it seen."""
        home = self._home
        name = home.recep_name[r]
        if not self._is_open[r]:
            return self._words.closed.format(recep=name)
        self._seen[r] = True
        things = [home.obj_name[o] for o in self._contents[r]]
        if home.recep_lamp[r]:
            things.insert(0, home.recep_lamp[r])
        template = self._words.inside if home.recep_kind[r].openable else self._words.on
        return template.format(recep=name, things=self._words.listing(things))

    # --- the expert ---

    def _expert(self) -> str:
        """Search like a person who knows the home but not where things are, then deliver.

        It looks for the goal object only where such objects start (common sense), nearest
        receptacle first, remembers what it has seen, puts down a wrong object in hand first,
        and never needs a particular history, so noisy experts recover. No state is a dead end.
        """
        home, goal, held = self._home, self._goal, self._holding
        if held != _NOWHERE and home.obj_kind[held] != goal.obj:
            here = self._at
            if here == _NOWHERE:
                here = self._nearest(self._room_receps[self._room])
            return self._reach(here) or f"put {home.obj_name[held]} in/on {self._here()}"
        if held == _NOWHERE:
            known = [
                o
                for o in self._goal_objects
                if self._seen[self._obj_loc[o]] and not (goal.kind == "two" and self._delivered(o))
            ]
            if not known:
                unseen = [r for r in self._hiding_places if not self._seen[r]]
                return self._reach(self._nearest(unseen))
            o = min(known, key=lambda o: (self._cost(self._obj_loc[o]), o))
            return self._reach(self._obj_loc[o]) or f"take {home.obj_name[o]} from {self._here()}"
        bit = goal.state_bit
        if self._obj_state[held] & bit != bit:
            at = self._reach(self._nearest(self._appliances), need_open=False)
            return at or f"{goal.kind} {home.obj_name[held]} with {self._here()}"
        target = self._nearest(self._targets)
        if goal.kind == "examine":
            return self._reach(target) or f"use {home.recep_lamp[target]}"
        return self._reach(target) or f"put {home.obj_name[held]} in/on {self._here()}"

    def _reach(self, r: int, need_open: bool = True) -> str:
        """The next action towards standing at ``r`` (opened), or "" when already there."""
        home = self._home
        if self._at != r:
            target_room = home.recep_room[r]
            if target_room == self._room:
                return f"go to {home.recep_name[r]}"
            step = 1 if target_room > self._room else -1
            return f"go to {home.rooms[self._room + step]}"
        if need_open and not self._is_open[r]:
            return f"open {home.recep_name[r]}"
        return ""

    def _cost(self, r: int) -> int:
        """Steps to stand at ``r`` with it open (rooms form a chain)."""
        distance = 0 if self._at == r else abs(self._home.recep_room[r] - self._room) + 1
        return distance + (0 if self._is_open[r] else 1)

    def _nearest(self, receps: list[int]) -> int:
        return min(receps, key=lambda r: (self._cost(r), r))

    def _here(self) -> str:
        return self._home.recep_name[self._at]
