"""The expert: ScienceWorld's gold path, followed from the current state and repaired after simple deviations."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator

from .text import _HELD_FIRST, _ONE, _PART, _SYNONYMS, _TWO, _door_names, _two_object_splits


class _Expert:
    """The expert's methods of :class:`~oma.envs.scienceworld.env.ScienceWorldEnv` (its state lives there:
    ``_gold``, ``_pointer``, ``_rooms``, ``_doors``, ``_plan``, ``_valid``, ``_room``, ...)."""


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
