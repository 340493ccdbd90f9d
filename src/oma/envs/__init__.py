"""Text environments for multi-turn agent training, with measurable length–outcome coupling.

* ``make(name, **options)`` builds one of ``names()`` (``household``: ALFWorld-like, failures
  run to the step cap; ``shop``: WebShop-like, wrong purchases end episodes early; ``chain``: a
  tiny chain whose ``on_wrong`` option makes failures longer, shorter or as long as successes,
  for tabular studies). Everything it returns follows :class:`TextEnv`.
* ``coupling(env_name, policy, seeds, **options)`` measures how episode length is coupled to
  success under a scripted policy (docs/math.md#worked-example).

See docs/envs.md.
"""

from .base import Info, StepResult, TextEnv
from .coupling import Coupling, Episode, NoisyExpert, coupling, coupling_table, rollout
from .registry import env_class, make, names

__all__ = [
    "Coupling",
    "Episode",
    "Info",
    "NoisyExpert",
    "StepResult",
    "TextEnv",
    "coupling",
    "coupling_table",
    "env_class",
    "make",
    "names",
    "rollout",
]
