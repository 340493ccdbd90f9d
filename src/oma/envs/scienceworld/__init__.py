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

from .engine import _IDLE, JAVA_OPTIONS, _Engine, shutdown  # noqa: F401  (the pool, for tests and tools)
from .env import ScienceWorldEnv
from .options import ELECTRICAL_TASKS, ROOMS, TASKS, Actions, Reward, ScienceWorldOptions, Simplification, Split, Task

__all__ = [
    "ELECTRICAL_TASKS",
    "JAVA_OPTIONS",
    "ROOMS",
    "TASKS",
    "Actions",
    "Reward",
    "ScienceWorldEnv",
    "ScienceWorldOptions",
    "Simplification",
    "Split",
    "Task",
    "shutdown",
]
