"""The batch record the trainers write for `oma audit`: one Parquet file per iteration, in the audit's
format (docs/audit.md), at :func:`batch_path` ``(RUN, it)`` = ``RUN/batches/iter_000001.parquet``.

It lies below :mod:`oma.diagnostics` (whose :mod:`~oma.diagnostics.tables` reads it back), so that the
trainers, :mod:`oma.train` and :mod:`oma.integrations.skyrl`, write batches without importing the audit.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa

BATCH_DIR = "batches"
_BATCH_RE = re.compile(r"^iter_(\d{6,})\.parquet$")


def _as_numpy(name: str, x: object) -> np.ndarray:
    try:
        import torch

        if isinstance(x, torch.Tensor):
            return x.detach().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if x is None:
        raise TypeError(f"{name} is required")
    return np.asarray(x)


def write_batch(
    path: str | os.PathLike,
    *,
    group_index,
    traj_index,
    step_index,
    scores,
    response_mask,
    anchor=None,
    step_rewards=None,
    won=None,
) -> Path:
    """Write one batch as a Parquet file in the audit format, atomically.

    Columns written: ``group_id``, ``traj_id``, ``step`` (int64), ``score`` (float64),
    ``response_tokens`` (int64, Σ of each row's mask), and when given ``anchor`` (int64),
    ``step_reward`` (float64), ``won`` (bool). The file appears complete or not at all: it is
    written to a hidden temporary file in the same directory and renamed into place (parent
    directories are created). Inputs may be torch tensors or numpy arrays.

    Args:
        path: target file, by convention ``batch_path(run_dir, iteration)``.
        group_index, traj_index, step_index: integer [R].
        scores: float [R], finite.
        response_mask: bool [R, L], True = trainable token.
        anchor: integer [R], optional.
        step_rewards: float [R], optional.
        won: bool [R] (or 0/1), optional.

    Returns: the path written.
    """
    path = Path(path)
    mask = _as_numpy("response_mask", response_mask)
    if mask.dtype != np.bool_ or mask.ndim != 2:
        raise ValueError(
            f"response_mask must be a bool [R, L] array (True = trainable token), got {mask.dtype} {mask.shape}"
        )
    rows = mask.shape[0]

    def ids(name: str, x: object) -> np.ndarray:
        a = _as_numpy(name, x)
        if a.ndim != 1 or a.shape[0] != rows or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be an integer [{rows}] array, got {a.dtype} {a.shape}")
        return a.astype(np.int64, copy=False)

    def floats(name: str, x: object) -> np.ndarray:
        a = _as_numpy(name, x)
        if (
            a.ndim != 1
            or a.shape[0] != rows
            or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer))
        ):
            raise ValueError(f"{name} must be a float [{rows}] array, got {a.dtype} {a.shape}")
        a = a.astype(np.float64, copy=False)
        if not np.isfinite(a).all():
            raise ValueError(f"{name} has {int((~np.isfinite(a)).sum())} NaN/inf value(s)")
        return a

    data: dict[str, np.ndarray] = {
        "group_id": ids("group_index", group_index),
        "traj_id": ids("traj_index", traj_index),
        "step": ids("step_index", step_index),
        "score": floats("scores", scores),
        "response_tokens": mask.sum(axis=1, dtype=np.int64),
    }
    if anchor is not None:
        data["anchor"] = ids("anchor", anchor)
    if step_rewards is not None:
        data["step_reward"] = floats("step_rewards", step_rewards)
    if won is not None:
        w = _as_numpy("won", won)
        if w.ndim != 1 or w.shape[0] != rows:
            raise ValueError(f"won must be a [{rows}] array, got {w.dtype} {w.shape}")
        data["won"] = w.astype(bool)
    table = pa.table(data)
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def batch_path(run_dir: str | os.PathLike, iteration: int) -> Path:
    """``RUN/batches/iter_000001.parquet``: where the trainer writes iteration ``iteration``'s batch."""
    if int(iteration) < 0:
        raise ValueError(f"iteration must be ≥ 0, got {iteration}")
    return Path(run_dir) / BATCH_DIR / f"iter_{int(iteration):06d}.parquet"


def run_batches(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(iteration, path)`` of every batch of a run directory, by iteration (empty if none)."""
    folder = Path(run_dir) / BATCH_DIR
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _BATCH_RE.match(p.name)
        if m and (p.is_file() or p.is_symlink()):  # a dangling link is a batch that cannot be read: its reader names it
            found.append((int(m.group(1)), p))
    return sorted(found)
