"""``make`` and ``names``: the built-in environments by name."""

from __future__ import annotations

from .base import EpisodeEnv
from .household import HouseholdEnv
from .shop import ShopEnv

_ENVS: dict[str, type[EpisodeEnv]] = {env.name: env for env in (HouseholdEnv, ShopEnv)}


def names() -> list[str]:
    """The names :func:`make` accepts."""
    return list(_ENVS)


def make(name: str, **options: object) -> EpisodeEnv:
    """A new environment ``name`` with ``options`` (validated here, once).

    Raises ``ValueError`` for an unknown name, an unknown option or an invalid value; the message
    names the field and lists the valid values. Call ``reset(seed)`` before ``step``.
    """
    env = _ENVS.get(name)
    if env is None:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(_ENVS)}")
    return env(**options)
