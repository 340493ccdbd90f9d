"""oma: Outcome-Mass Alignment for multi-turn LLM agent reinforcement learning.

See docs/math.md for the equations. The pure math lives in :mod:`oma.core`.
"""

__version__ = "0.1.0"
