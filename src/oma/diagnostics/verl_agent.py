"""verl-agent's batch dumps (docs/audit.md#verl-agent-batches): its column names, and the rules by which it
trains on a batch (the invalid-action penalty on the score, success before it, padding copies), on top of
the readers of :mod:`oma.diagnostics.tables`."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from oma.diagnostics.figures import DumpInfo
from oma.diagnostics.tables import (
    ID_ROLES,
    AuditInputError,
    BatchColumns,
    _bools,
    batch_from_table,
    in_trajectory,
    label_of,
    read_table,
    unique_columns,
)

VERL_AGENT_COLUMNS: dict[str, str] = {
    "group_id": "uid",
    "traj_id": "traj_uid",
    "score": "episode_rewards",
    "anchor": "anchor_obs",
    "step_reward": "step_rewards",
}
"""verl-agent's name for each role (docs/audit.md#verl-agent-batches)."""

EXTRA_COLUMNS: tuple[str, ...] = ("is_action_valid", "row_hash", "response_mask", "response_tokens")
"""The other columns the reader uses: the penalty's, the row identity's and the tokens'."""

VERL_AGENT_PENALTY = 0.1
"""verl-agent's default ``actor_rollout_ref.actor.invalid_action_penalty_coef``."""


def read_verl_agent(
    path: str | os.PathLike,
    columns: Mapping[str, str] | None = None,
    *,
    invalid_penalty: float = VERL_AGENT_PENALTY,
    success_threshold: float | None = None,
    fmt: str | None = None,
) -> BatchColumns:
    """Read a verl-agent batch dump (docs/audit.md#verl-agent-batches) as verl-agent trains on it.

    See :func:`verl_agent_from_table`; ``columns`` overrides verl-agent's column names.
    """
    names = {**VERL_AGENT_COLUMNS, **(columns or {})}
    table, found = read_table(path, fmt, {*names.values(), *EXTRA_COLUMNS}, {names[r] for r in ID_ROLES if r in names})
    return verl_agent_from_table(
        table, columns, invalid_penalty=invalid_penalty, success_threshold=success_threshold, source=str(path),
        found=found,
    )


def verl_agent_from_table(
    table: pa.Table,
    columns: Mapping[str, str] | None = None,
    *,
    invalid_penalty: float = VERL_AGENT_PENALTY,
    success_threshold: float | None = None,
    source: str = "<table>",
    found: list[str] | None = None,
) -> BatchColumns:
    """A verl-agent batch (``uid``, ``traj_uid``, ``episode_rewards``, ``is_action_valid``, ``response_mask``
    or ``response_tokens``, and for GiGPO ``anchor_obs`` and ``step_rewards``) as verl-agent trains on it.

    * **Score.** Row r's score is ``episode_rewards_r − invalid_penalty·(1 − is_action_valid_r)``,
      verl-agent's ``token_level_rewards.sum(-1)`` after ``apply_invalid_action_penalty`` (the
      ``episode_rewards`` field itself never carries the penalty). ``step_rewards`` are read as
      dumped: after that call they already carry it (verl-agent subtracts it in place).
    * **Success** is decided before the penalty: ``episode_rewards > 0`` (or ``≥ success_threshold``),
      unless a ``won`` column is mapped.
    * **Padding copies.** ``adjust_batch(mode="copy")`` appends copies of random rows until the
      batch divides the micro-batch sizes. A row identical to an earlier row in every column read
      (and in ``row_hash`` when the dump has it) is flagged in ``padding_copy``; it stays in the
      batch, because verl-agent trains on it.

    ``found``: the columns of the file the table was read from, for messages (default: the table's).

    Raises:
        AuditInputError: one line naming the column, and the trajectory (``traj_uid``) where a row
            is at fault.
    """
    if not (isinstance(invalid_penalty, (int, float)) and math.isfinite(invalid_penalty) and invalid_penalty >= 0):
        raise AuditInputError(f"--invalid-penalty must be a finite number ≥ 0, got {invalid_penalty!r}")
    names = list(table.column_names)
    overrides = dict(columns or {})
    unique_columns(names, {*VERL_AGENT_COLUMNS.values(), *overrides.values(), *EXTRA_COLUMNS}, source)
    mapping = {role: col for role, col in VERL_AGENT_COLUMNS.items() if role not in overrides and col in names}
    for role in ("group_id", "traj_id", "score"):
        col = overrides.get(role, VERL_AGENT_COLUMNS[role])
        if col not in names and table.num_rows:
            raise AuditInputError(
                f"missing column {col!r} ({role}) in {source} (found: {', '.join(found or names) or 'no columns'}); "
                f"--from verl-agent reads verl-agent's columns (docs/audit.md#verl-agent-batches), or map it with "
                f"--col {role}=NAME"
            )
    mapping.update(overrides)
    b = batch_from_table(table, mapping, source=source, found=found)
    where = in_trajectory(b.traj_index, b.traj_labels)
    episode = b.scores
    _check_constant(episode, b.traj_index, b.traj_labels, f"'{mapping['score']}' (score)",
                    "verl-agent stamps one episode reward on every row of a trajectory (is it the per-step 'rewards'?)")
    invalid = None
    if "is_action_valid" in names:
        invalid = ~_bools(table["is_action_valid"], "'is_action_valid'", where)
    elif invalid_penalty > 0:
        raise AuditInputError(
            f"{source} has no column 'is_action_valid': verl-agent subtracts {invalid_penalty:g} per invalid action "
            "from the score (actor_rollout_ref.actor.invalid_action_penalty_coef); dump is_action_valid, or pass "
            "--invalid-penalty 0 if the run set use_invalid_action_penalty=False"
        )
    scores = episode - invalid_penalty * invalid if invalid is not None else episode
    won, rule = b.won, None
    if won is None:
        if success_threshold is None:
            won, rule = episode > 0, f"{mapping['score']} > 0 (before the invalid-action penalty)"
        else:
            won = episode >= success_threshold
            rule = f"{mapping['score']} >= {success_threshold:g} (before the invalid-action penalty)"
    key_columns = sorted({*mapping.values(), *EXTRA_COLUMNS} & set(names))
    return dataclasses.replace(
        b,
        scores=scores,
        won=won,
        success_rule=rule,
        padding_copy=_repeats(table, key_columns),
        dump=DumpInfo(
            format="verl-agent",
            invalid_penalty=float(invalid_penalty),
            invalid_actions=None if invalid is None else int(invalid.sum()),
        ),
    )


def _check_constant(values: np.ndarray, traj_index: np.ndarray, traj_labels: np.ndarray, what: str, why: str) -> None:
    n = int(traj_index.max(initial=-1)) + 1
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, traj_index, values)
    np.maximum.at(hi, traj_index, values)
    bad = np.flatnonzero(lo != hi)
    if bad.size:
        t = int(bad[0])
        raise AuditInputError(
            f"column {what} differs between rows of trajectory {label_of(traj_labels[t])!r} "
            f"({lo[t]:g} to {hi[t]:g}; {bad.size} trajectories): {why}"
        )


def _repeats(table: pa.Table, names: list[str]) -> np.ndarray:
    """bool [R]: the row equals an earlier row in every column of ``names`` (nested values included)."""
    codes = []
    for name in names:
        col = table[name].combine_chunks()
        try:
            enc = col.dictionary_encode()
        except pa.ArrowNotImplementedError:  # a mask, an observation as nested lists, a struct
            enc = pa.array([repr(v) for v in col.to_pylist()]).dictionary_encode()
        codes.append(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64))
    key = np.stack(codes, axis=1)
    _, first = np.unique(key, axis=0, return_index=True)
    repeat = np.ones(table.num_rows, dtype=bool)
    repeat[first] = False
    return repeat

