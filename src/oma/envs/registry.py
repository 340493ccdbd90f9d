"""``make`` and ``names``: the environments by name.

The built-in environments are pure standard library. The adapters to real engines are imported
only when asked for, because each needs its optional extra (``pip install 'oma-rl[textworld]'``).
"""

from __future__ import annotations

import importlib

from .base import EpisodeEnv
from .chain import ChainEnv
from .household import HouseholdEnv
from .shop import ShopEnv

_ENVS: dict[str, type[EpisodeEnv]] = {env.name: env for env in (HouseholdEnv, ShopEnv, ChainEnv)}

_ADAPTERS: dict[str, str] = {
    "textworld": "oma.envs.textworld:TextWorldEnv",
    "scienceworld": "oma.envs.scienceworld:ScienceWorldEnv",
    "alfworld": "oma.envs.alfworld:ALFWorldEnv",
}
"""Adapter name -> ``module:class``; the module imports its engine lazily (see :func:`make`)."""


def names(builtin_only: bool = False) -> list[str]:
    """The names :func:`make` accepts: the built-in environments, then (unless ``builtin_only``) the adapters."""
    return list(_ENVS) if builtin_only else [*_ENVS, *_ADAPTERS]


def env_class(name: str) -> type[EpisodeEnv]:
    """The class :func:`make` would build for ``name``, without building it (no engine is started).

    Raises ``ValueError`` for an unknown name and ``ImportError`` naming the extra to install when
    an adapter's engine is missing.
    """
    env = _ENVS.get(name)
    if env is not None:
        return env
    if name not in _ADAPTERS:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(names())}")
    module, cls = _ADAPTERS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.startswith("oma."):
            raise
        raise ImportError(f"environment {name!r} needs the optional extra: pip install 'oma-rl[{name}]' "
                          f"(missing module {e.name!r})") from e


def make(name: str, **options: object) -> EpisodeEnv:
    """A new environment ``name`` with ``options`` (validated here, once).

    Raises ``ValueError`` for an unknown name, an unknown option or an invalid value (the message
    names the field and lists the valid values), and ``ImportError`` naming the extra to install
    when an adapter's engine is missing. Call ``reset(seed)`` before ``step``.
    """
    return env_class(name)(**options)
