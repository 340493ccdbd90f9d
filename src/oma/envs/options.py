"""Validation of environment options, done once in :func:`oma.envs.make`.

Each environment declares its options as a frozen dataclass whose field annotations say what is
accepted: a ``Literal`` (one of its strings), ``bool``, ``int`` (with an optional ``min`` in the
field's metadata), ``float`` (finite, within the metadata's ``min`` and ``max``), ``str`` (any non-empty string, e.g. a path) or ``tuple[Literal[...], ...]`` (a
non-empty selection; a single string is a one-element selection). Reading the rules from the
annotations keeps the documented type, the default and the check in one place, and lets every error
name the field and list what is valid.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

O = TypeVar("O")


def parse_options(cls: type[O], env: str, given: Mapping[str, Any]) -> O:
    """Build the options dataclass ``cls`` from keyword options, or raise a ``ValueError``.

    The message names the environment and the field and lists the valid values, so a typo in a
    config file is fixed without reading the source.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = [name for name in given if name not in fields]
    if unknown:
        raise ValueError(
            f"{env}: unknown option {unknown[0]!r}; valid options: {', '.join(sorted(fields))}"
        )
    hints = typing.get_type_hints(cls)
    values = {
        name: _check(f"{env}: option {name!r}", hints[name], value, fields[name].metadata)
        for name, value in given.items()
    }
    return cls(**values)


def _check(where: str, hint: Any, value: Any, metadata: Mapping[str, Any]) -> Any:
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"{where} must be one of {_listing(choices)}; got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false; got {value!r}")
        return value
    if hint is int:
        low = metadata.get("min", None)
        too_low = low is not None and isinstance(value, int) and value < low
        if isinstance(value, bool) or not isinstance(value, int) or too_low:
            bound = f" >= {low}" if low is not None else ""
            raise ValueError(f"{where} must be an integer{bound}; got {value!r}")
        return value
    if hint is float:
        low, high = metadata.get("min", -math.inf), metadata.get("max", math.inf)
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"{where} must be a number in [{low}, {high}]; got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{where} must be a non-empty string; got {value!r}")
        return value
    if get_origin(hint) is tuple:
        choices = get_args(get_args(hint)[0])
        items = (value,) if isinstance(value, str) else tuple(value) if _iterable(value) else None
        if not items or any(not isinstance(v, str) or v not in choices for v in items):
            raise ValueError(
                f"{where} must be a non-empty selection of {_listing(choices)}; got {value!r}"
            )
        return tuple(c for c in choices if c in items)  # canonical order, duplicates dropped
    raise TypeError(f"{where}: unsupported annotation {hint!r}")  # a bug in an options class


def _iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _listing(choices: tuple[Any, ...]) -> str:
    return ", ".join(repr(c) for c in choices)


def describe(options: object) -> str:
    """A stable ``key=value,...`` string of an options dataclass (part of every anchor)."""
    return ",".join(
        f"{f.name}={getattr(options, f.name)!r}"
        for f in dataclasses.fields(options)  # type: ignore[arg-type]
    )
