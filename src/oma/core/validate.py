"""Input checks shared by every public function of :mod:`oma.core` and by its callers (the audit,
the integrations), so that every layer words a bad argument the same way.

Each check raises ``ValueError`` (or ``TypeError`` for a non-tensor) whose message names the
offending argument, what was found and what was expected, so a bad batch fails at the door
instead of becoming NaN three functions later.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor


def check_option(name: str, value: object, valid: Sequence[str]) -> None:
    """Raise if ``value`` is not one of the ``valid`` option strings."""
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not a valid option; expected one of {list(valid)}")


def check_tensor(name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_index(name: str, t: object, rows: int | None = None) -> Tensor:
    """An id array: 1-D integer tensor (any integer dtype, not bool), optionally of length ``rows``."""
    t = check_tensor(name, t)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise ValueError(f"{name} must have an integer dtype (ids), got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D [R], got shape {tuple(t.shape)}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{name} has {t.shape[0]} rows, expected {rows} (one per row of the batch)")
    return t


def check_float(name: str, t: object, shape: tuple[int, ...] | None = None, *, finite: bool = True) -> Tensor:
    """A floating tensor of the given shape whose values are all finite."""
    t = check_tensor(name, t)
    if not t.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if finite:
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            first = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name} has {int(bad.sum())} non-finite value(s) (NaN or inf), first at index {first}"
            )
    return t


def check_mask(name: str, t: object) -> Tensor:
    """The response mask: bool [R, L], True = trainable token (one convention everywhere)."""
    t = check_tensor(name, t)
    if t.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor (True = trainable token), got {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [R, L], got shape {tuple(t.shape)}")
    return t


def check_same_device(**tensors: Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """``value`` is a finite real number > 0 (>= 0 with ``allow_zero``): an inf ``eps`` or weight turns every
    advantage into 0 or NaN, and a string fails later in an error that does not name the argument."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} and finite, got {value}")


def check_count(name: str, value: int, lo: int) -> None:
    """``value`` is an integer >= ``lo`` (a float count gives float indices or a TypeError naming nothing)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")


def check_finite_where(name: str, t: Tensor, mask: Tensor) -> None:
    """Raise if ``t`` is NaN/inf at a position where ``mask`` is True (padding may hold anything)."""
    bad = mask & ~torch.isfinite(t)
    if bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} has {int(bad.sum())} non-finite value(s) at trainable tokens, first at index {first}")
