"""Small, fast draws from a ``random.Random``, built on ``rng.random()`` alone.

World generation makes thousands of tiny draws per reset; these avoid the per-call overhead of
``random.choice``/``sample`` (argument checks, ABC look-ups) and depend only on the generator's
core stream, not on helper algorithms Python may revise, so a seed keeps meaning the same task.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def pick(rng: random.Random, items: Sequence[T]) -> T:
    """One element, uniformly."""
    return items[int(rng.random() * len(items))]


def between(rng: random.Random, low: int, high: int) -> int:
    """An integer in ``[low, high]``, uniformly."""
    return low + int(rng.random() * (high - low + 1))


def sample(rng: random.Random, items: Sequence[T], k: int) -> list[T]:
    """``k`` distinct elements in random order (a partial Fisher–Yates shuffle)."""
    pool = list(items)
    for i in range(k):
        j = i + int(rng.random() * (len(pool) - i))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]


def shuffle(rng: random.Random, items: list[T]) -> None:
    """Shuffle ``items`` in place."""
    for i in range(len(items) - 1, 0, -1):
        j = int(rng.random() * (i + 1))
        items[i], items[j] = items[j], items[i]
