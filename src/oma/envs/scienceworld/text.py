"""Reading the engine's text: rooms and doors, and the ``compact`` reduction of its valid actions."""

from __future__ import annotations

import re

from .options import ROOMS


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
