"""The options of ``scienceworld`` and the task facts they are checked against (docs/real-envs.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

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
