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
import pyarrow.compute as pc

from oma.diagnostics.figures import DumpInfo
from oma.diagnostics.tables import (
    ID_ROLES,
    AuditInputError,
    BatchColumns,
    Where,
    _bools,
    _nowhere,
    _nulls,
    batch_from_table,
    in_trajectory,
    label_of,
    read_table,
    release_arrow_memory,
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

ROW_IDENTITIES: tuple[str, ...] = ("row_hash", "row_id", "input_ids")
"""Columns that tell a padding copy from a step that merely looks the same, by preference: a value per row
written by the dump, the rows' numbering before ``adjust_batch`` (OMA's verl-agent patch, docs/verl-agent.md),
or the row's token ids (verl's prompt + response ``input_ids``). A copy repeats its original's identity."""

EXTRA_COLUMNS: tuple[str, ...] = ("is_action_valid", *ROW_IDENTITIES, "response_mask", "response_tokens")
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
    batch = verl_agent_from_table(
        table, columns, invalid_penalty=invalid_penalty, success_threshold=success_threshold, source=str(path),
        found=found,
    )
    del table
    release_arrow_memory()
    return batch


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
      batch divides the micro-batch sizes. With a row identity (:data:`ROW_IDENTITIES`), a row whose
      identity repeats an earlier row of its trajectory is flagged in ``padding_copy``; it stays in the
      batch, because verl-agent trains on it. Without one, ``padding_copy`` is None: a step that revisits
      a state with the same reward and length looks like a copy in every other column, so none is guessed.

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
    identity = next((n for n in ROW_IDENTITIES if n in names), None)
    return dataclasses.replace(
        b,
        scores=scores,
        won=won,
        success_rule=rule,
        padding_copy=None if identity is None else padding_copies(table[identity], b.traj_index, repr(identity), where),
        dump=DumpInfo(
            format="verl-agent",
            invalid_penalty=float(invalid_penalty),
            invalid_actions=None if invalid is None else int(invalid.sum()),
            row_identity=identity,
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


def padding_copies(identity: pa.ChunkedArray, traj_index: np.ndarray, what: str, where: Where = _nowhere) -> np.ndarray:
    """bool [R]: the row's ``identity`` (strings, integers or lists of token ids) equals an earlier row's in its
    trajectory, exactly.

    Each row's identity is hashed to 64 bits without a Python loop (:func:`_digests`); rows that share a
    (trajectory, hash) with another row are the candidates, and their identities are then compared exactly,
    so a hash collision can cost time but never a false copy.
    """
    _nulls(identity, what, where)
    key = np.empty(len(identity), dtype=np.uint64)  # filled chunk by chunk: one [R] uint64 at a time
    start = 0
    for chunk in identity.chunks:
        key[start : start + len(chunk)] = _digests(chunk, what)
        start += len(chunk)
    traj = traj_index.astype(np.uint64)
    traj += np.uint64(1)
    key ^= _mix(traj)
    del traj
    ordered = np.sort(key)
    shared = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])  # keys of two rows or more: few
    del ordered
    paired = np.zeros(key.shape[0], dtype=bool)
    if shared.size:
        for lo in range(0, key.shape[0], _SLICE_ROWS):  # a slice at a time: searchsorted's [R] int64 stays small
            part = key[lo : lo + _SLICE_ROWS]
            paired[lo : lo + _SLICE_ROWS] = shared[np.minimum(np.searchsorted(shared, part), shared.size - 1)] == part
    del key
    candidates = np.flatnonzero(paired)  # ascending: the first of equal rows is the original
    copy = np.zeros(paired.shape[0], dtype=bool)
    if candidates.size:
        exact = _byte_values(_rows(identity, candidates)).dictionary_encode()
        code = exact.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        pair = traj_index[candidates] * (int(code.max()) + 1) + code
        first = np.unique(pair, return_index=True)[1]
        repeat = np.ones(candidates.size, dtype=bool)
        repeat[first] = False
        copy[candidates[repeat]] = True
    return copy


def _rows(col: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """The values of ascending ``rows``, taken chunk by chunk: ``ChunkedArray.take`` concatenates every chunk
    first (at 10^7 rows of 40-character hashes, 440 MB for a few candidates)."""
    ends = np.cumsum([len(chunk) for chunk in col.chunks])
    cut = np.searchsorted(rows, ends)
    parts = np.split(rows, cut[:-1])
    return pa.concat_arrays([
        chunk.take(pa.array(part - (end - len(chunk)))) for chunk, part, end in zip(col.chunks, parts, ends, strict=True)
    ])


_SLICE_BYTES = 1 << 21
"""Rows are hashed about 2 MB of values at a time: the temporaries (a few int64s per byte where widths vary) stay
small whatever the batch."""

_SLICE_ROWS = 1 << 20
"""Rows whose hash is looked up among the shared hashes at a time."""


def _digests(arr: pa.Array, what: str) -> np.ndarray:
    """A 64-bit hash of each row's value (:func:`_byte_rows`), uint64 [n], vectorised over slices of rows."""
    offsets, data = _byte_rows(arr, what)
    out = np.empty(len(offsets) - 1, dtype=np.uint64)
    start = 0
    while start < out.shape[0]:
        end = int(np.searchsorted(offsets, offsets[start] + _SLICE_BYTES, side="right")) - 1
        end = min(max(end, start + 1), out.shape[0])
        out[start:end] = _digest_rows(offsets[start : end + 1], data)
        start = end
    return out


def _digest_rows(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Hash of each row's bytes ``data[offsets[i]:offsets[i + 1]]``: the bytes zero-padded to whole
    little-endian 64-bit words w_j, then mix(Σ_j mix(w_j ^ (j + 1)·K) + length·K'), so a row's hash depends
    on its value alone, not on where it lies in the buffer."""
    lengths = np.diff(offsets)
    n = lengths.shape[0]
    words_per_row = (lengths + 7) // 8
    if (lengths == lengths[0]).all():  # one width (hashes, uuids, padded token ids): a matrix, no scatter
        width = int(lengths[0])
        padded = np.zeros((n, 8 * int(words_per_row[0])), dtype=np.uint8)
        padded[:, :width] = data[offsets[0] : offsets[-1]].reshape(n, width)
        words = padded.view("<u8")
        total = np.zeros(n, dtype=np.uint64)
        for j in range(words.shape[1]):
            total += _mix(words[:, j] ^ np.uint64((j + 1) * _K1 % 2**64))
    else:
        word_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(words_per_row, out=word_offsets[1:])
        padded = np.zeros(8 * int(word_offsets[-1]), dtype=np.uint8)
        row_of_byte = np.repeat(np.arange(n), lengths)
        padded[np.arange(offsets[0], offsets[-1]) - offsets[row_of_byte] + 8 * word_offsets[row_of_byte]] = \
            data[offsets[0] : offsets[-1]]
        words = padded.view("<u8")
        position = np.arange(words.shape[0], dtype=np.uint64) - np.repeat(word_offsets[:-1], words_per_row).astype(
            np.uint64)
        running = np.zeros(words.shape[0] + 1, dtype=np.uint64)
        np.cumsum(_mix(words ^ ((position + np.uint64(1)) * np.uint64(_K1))), out=running[1:])
        total = running[word_offsets[1:]] - running[word_offsets[:-1]]  # sums mod 2^64
    return _mix(total + lengths.astype(np.uint64) * np.uint64(_K2))


_K1, _K2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (arithmetic mod 2^64), in place: ``x`` is a temporary."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _byte_rows(arr: pa.Array, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n + 1], bytes uint8) of each row's value, read from the Arrow buffers without a copy where
    possible: text and binary as they are; integers and lists of integers (token ids) as little-endian int64s."""
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(t):
        return _byte_rows(arr.dictionary_decode(), what)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        width = np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32
        buffers = arr.buffers()
        offsets = np.frombuffer(buffers[1], dtype=width)[arr.offset : arr.offset + n + 1].astype(np.int64)
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
        return offsets, data
    if pa.types.is_integer(t):
        values = arr.to_numpy(zero_copy_only=False).astype("<i8", copy=False)
        return np.arange(n + 1, dtype=np.int64) * 8, values.view(np.uint8)
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and pa.types.is_integer(
        t.value_type
    ):
        flat = arr.flatten()  # the values of these rows only, however the array was sliced
        if flat.null_count:
            raise AuditInputError(f"column {what} has {flat.null_count} null entries inside its lists")
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths * 8, out=offsets[1:])
        return offsets, flat.to_numpy(zero_copy_only=False).astype("<i8", copy=False).view(np.uint8)
    raise AuditInputError(
        f"column {what} (the row identity) must hold strings, integers or lists of token ids, found {t}"
    )


def _byte_values(arr: pa.Array) -> pa.Array:
    """The rows' values as one binary array of the bytes :func:`_byte_rows` reads, for exact comparison."""
    offsets, data = _byte_rows(arr, "")
    data = data[offsets[0] : offsets[-1]]
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(arr), [None, pa.py_buffer(offsets - offsets[0]), pa.py_buffer(data.copy())]
    )
