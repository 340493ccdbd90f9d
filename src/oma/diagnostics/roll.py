"""ROLL's agentic batch dumps (docs/roll.md#audit-your-run): its column names and its padding copies, on top of
the readers of :mod:`oma.diagnostics.tables` and the copy finder of :mod:`oma.diagnostics.verl_agent`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from oma.diagnostics.figures import DumpInfo
from oma.diagnostics.tables import (ID_ROLES, AuditInputError, BatchColumns, batch_from_table, in_trajectory,
                                    read_table, release_arrow_memory, unique_columns)
from oma.diagnostics.verl_agent import _check_constant, padding_copies

ROLL_COLUMNS: dict[str, str] = {
    "group_id": "traj_group_id",
    "traj_id": "traj_id",
    "score": "episode_scores",
    "anchor": "state_hash",
    "step_reward": "step_rewards",
}
"""ROLL's name for each role (docs/roll.md#audit-your-run)."""

ROW_IDENTITY = "sample_uuid"
"""``AgenticPipeline.run`` sets it per row before ``adjust_batch``; a padding copy repeats its original's."""

EXTRA_COLUMNS: tuple[str, ...] = (ROW_IDENTITY, "response_mask", "response_tokens")


def read_roll(path: str | os.PathLike, columns: Mapping[str, str] | None = None, *,
              success_threshold: float | None = None, fmt: str | None = None) -> BatchColumns:
    """Read a ROLL batch dump (:func:`roll_from_table`); ``columns`` overrides ROLL's column names."""
    names = {**ROLL_COLUMNS, **(columns or {})}
    table, found = read_table(path, fmt, {*names.values(), *EXTRA_COLUMNS}, {names[r] for r in ID_ROLES if r in names})
    batch = roll_from_table(table, columns, success_threshold=success_threshold, source=str(path), found=found)
    del table
    release_arrow_memory()
    return batch


def roll_from_table(table: pa.Table, columns: Mapping[str, str] | None = None, *, success_threshold: float | None = None,
                    source: str = "<table>", found: list[str] | None = None) -> BatchColumns:
    """A ROLL batch (``traj_group_id``, ``traj_id``, ``episode_scores``, ``sample_uuid``, ``response_tokens`` or
    ``response_mask``; for GiGPO ``state_hash`` and ``step_rewards``) as the audit reads it.

    * **Score**: ``episode_scores``, the episode's outcome on each of its rows (one value per trajectory).
    * **Success**: ``episode_scores > 0`` (or ``≥ success_threshold``), unless a ``won`` column is mapped.
    * **Padding copies**: a row whose ``sample_uuid`` repeats an earlier row's of its trajectory
      (``adjust_batch(mode="copy")``); kept, since ROLL trains on it. ``sample_uuid`` is required.

    Raises:
        AuditInputError: one line naming the column.
    """
    names = list(table.column_names)
    overrides = dict(columns or {})
    unique_columns(names, {*ROLL_COLUMNS.values(), *overrides.values(), *EXTRA_COLUMNS}, source)
    mapping = {role: col for role, col in ROLL_COLUMNS.items() if role not in overrides and col in names}
    for role in ("group_id", "traj_id", "score"):
        col = overrides.get(role, ROLL_COLUMNS[role])
        if col not in names and table.num_rows:
            raise AuditInputError(
                f"missing column {col!r} ({role}) in {source} (found: {', '.join(found or names) or 'no columns'}); "
                f"--from roll reads ROLL's columns (docs/roll.md#audit-your-run), or map it with --col {role}=NAME")
    if ROW_IDENTITY not in names and table.num_rows:
        raise AuditInputError(
            f"missing column {ROW_IDENTITY!r} in {source}: ROLL's adjust_batch pads the batch with copies that repeat it; "
            "dump batch.non_tensor_batch['sample_uuid'] (docs/roll.md#audit-your-run)")
    mapping.update(overrides)
    b = batch_from_table(table, mapping, source=source, found=found)
    _check_constant(b.scores, b.traj_index, b.traj_labels, f"'{mapping['score']}' (score)",
                    "ROLL stamps one episode outcome on every row of a trajectory (is it the per-step 'step_scores'?)")
    won, rule = b.won, None
    if won is None:
        if success_threshold is None:
            won, rule = b.scores > 0, f"{mapping['score']} > 0"
        else:
            won, rule = b.scores >= success_threshold, f"{mapping['score']} >= {success_threshold:g}"
    where = in_trajectory(b.traj_index, b.traj_labels)
    copies = padding_copies(table[ROW_IDENTITY], b.traj_index, repr(ROW_IDENTITY), where)
    # ROLL's step_rewards are returns already (the audit's γ is 0) and its copies repeat their step: the audit needs
    # no step order, and a (traj_id, step) pair twice would read as a malformed batch
    return dataclasses.replace(b, won=np.asarray(won), success_rule=rule, padding_copy=copies, step_index=None,
                               dump=DumpInfo(format="roll", row_identity=ROW_IDENTITY))
