"""Reading a host's batch columns into oma's ids, shared by the integrations that take a framework's batch
by its column names (verl-agent, ROLL, rLLM): one line naming the column for anything unusable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor


def missing(batch: Mapping[str, Any], name: str, what: str) -> str:
    return f"missing column {name!r}: {what}; found {sorted(map(str, batch)) or 'no columns'}"


def array(batch: Mapping[str, Any], name: str, rows: int, what: str) -> np.ndarray:
    """Column ``name`` as a numpy array with R rows (tensors, lists and object arrays alike)."""
    if name not in batch:
        raise ValueError(missing(batch, name, what))
    value = batch[name]
    out = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value, dtype=object if
                                                                                   ragged(value) else None)
    if out.ndim == 0 or out.shape[0] != rows:
        raise ValueError(f"column {name!r} must have one entry per row ({rows} rows), got shape {out.shape}")
    return out


def ragged(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and any(
        isinstance(v, np.ndarray | list | tuple) for v in value)


def floats(batch: Mapping[str, Any], name: str, rows: int, what: str) -> Tensor:
    values = array(batch, name, rows, what)
    try:
        out = torch.as_tensor(values.astype(np.float64))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"column {name!r} must hold numbers ({what}): {exc}") from None
    return finite(name, out)


def finite(name: str, values: Tensor) -> Tensor:
    bad = (~torch.isfinite(values)).nonzero()
    if bad.numel():
        raise ValueError(f"column {name!r} has a NaN or infinite value at row {int(bad[0, 0])}")
    return values


def matrix(batch: Mapping[str, Any], name: str, rows: int) -> Tensor:
    """Column ``name`` as an [R, L] tensor (a tensor, an array or equal-length lists)."""
    value = batch[name]
    try:
        out = value.detach().cpu() if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"column {name!r} must be [R, L], one equal-length list per row: {exc}") from None
    if out.dim() != 2 or out.shape[0] != rows:
        raise ValueError(f"column {name!r} must be [R, L] with R = {rows} rows, got shape {tuple(out.shape)}")
    return out


def hashable(value: Any) -> Any:
    """An equality key for one cell: strings and numbers as they are, arrays and lists by their contents."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    return value.item() if isinstance(value, np.generic) else value


def ids(values: Sequence[Any] | np.ndarray | Tensor) -> tuple[Tensor, list[Any]]:
    """Dense int64 codes of equal values, in order of first appearance, and the value of each code."""
    codes: dict[Any, int] = {}
    labels: list[Any] = []
    out = []
    for v in values:
        key = hashable(v)
        if key not in codes:
            codes[key] = len(codes)
            labels.append(v.item() if isinstance(v, np.generic) else v)
        out.append(codes[key])
    return torch.tensor(out, dtype=torch.int64), labels


def groups(batch: Mapping[str, Any], rows: int, *, group: tuple[str, str], traj: tuple[str, str],
           hint: str = "") -> tuple[Tensor, Tensor]:
    """(group_index, traj_index) from the columns ``group`` and ``traj`` (each (name, what it is)); a trajectory
    under two groups is refused, naming both (``hint``: what to pass instead)."""
    group_index, group_labels = ids(array(batch, group[0], rows, group[1]))
    traj_index, traj_labels = ids(array(batch, traj[0], rows, traj[1]))
    first = torch.full((len(traj_labels),), -1, dtype=torch.int64).scatter_reduce(
        0, traj_index, group_index, reduce="amin", include_self=False)
    split = (group_index != first.index_select(0, traj_index)).nonzero()
    if split.numel():
        r = int(split[0, 0])
        raise ValueError(f"{traj[0]} {traj_labels[int(traj_index[r])]!r} appears under two {group[0]} values "
                         f"({group_labels[int(first[traj_index[r]])]!r} and {group_labels[int(group_index[r])]!r}): an "
                         f"episode lies in one group{hint}")
    return group_index, traj_index


def repeats(traj_index: Tensor, identity: Sequence[Any] | np.ndarray) -> Tensor:
    """bool [R]: the rows that repeat an earlier row's (trajectory, ``identity``): the padding copies, where
    ``identity`` is the row identity the host set before it padded the batch (a copy carries its original's)."""
    rows = len(traj_index)
    key, _ = ids(list(zip(traj_index.tolist(), (hashable(v) for v in identity), strict=True)))
    first = torch.full((rows,), rows, dtype=torch.int64).scatter_reduce(0, key, torch.arange(rows), reduce="amin")
    return first.index_select(0, key) != torch.arange(rows)
