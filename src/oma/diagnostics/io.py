"""Batch files for the audit: reading JSONL / CSV / Parquet dumps, writing the trainer's batches.

File format (one row per agent step; see docs/audit.md):

==================  ========  ==========================================================
column              required  meaning
==================  ========  ==========================================================
``group_id``        yes       group (task instance rolled out n times); int or string id
``traj_id``         yes       trajectory, unique across the batch; int or string id
``score``           yes       episode outcome stamped on the row (float, finite)
``response_tokens`` one of    trainable response tokens of the row (int ≥ 0)
``response_mask``   these     per-row list of 0/1 or booleans (True = trainable token)
``step``            no        step number inside the trajectory (int)
``anchor``          no        id of the environment state acted in (int or string; GiGPO)
``step_reward``     no        the row's own step reward (float; GiGPO)
``won``             no        episode success (bool or number, nonzero = success)
==================  ========  ==========================================================

Any column can be read from another name (``columns={"traj_id": "traj_uid"}``; on the command
line ``--col traj_id=traj_uid``), and ``traj_id=@row`` makes every row its own trajectory
(single-turn verl batches). String ids (verl's uuid ``uid``) are mapped to int64 codes.

Run directories written by the trainer hold ``RUN/batches/iter_000001.parquet`` (6-digit
iteration), written by :func:`write_batch`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from oma.diagnostics.figures import DumpInfo

ROLES: tuple[str, ...] = (
    "group_id",
    "traj_id",
    "step",
    "score",
    "response_tokens",
    "response_mask",
    "anchor",
    "step_reward",
    "won",
)
"""Logical column names of the audit's input format."""

REQUIRED: tuple[str, ...] = ("group_id", "traj_id", "score")

# Names under which verl / verl-agent batches carry each role: used only to suggest a --col.
_HINTS: dict[str, tuple[str, ...]] = {
    "group_id": ("uid", "group_index", "group"),
    "traj_id": ("traj_uid", "traj_index", "trajectory"),
    "score": ("episode_rewards", "scores", "reward", "outcome"),
    "step": ("step_index", "steps"),
    "response_tokens": ("response_length", "n_tokens"),
    "anchor": ("anchor_obs",),
    "step_reward": ("rewards", "step_rewards"),
    "won": ("success", "is_success"),
}

SOURCES: tuple[str, ...] = ("oma", "verl-agent")
"""Input formats of ``oma audit --from``: the audit's own columns, or a verl-agent batch dump."""

VERL_AGENT_COLUMNS: dict[str, str] = {
    "group_id": "uid",
    "traj_id": "traj_uid",
    "score": "episode_rewards",
    "anchor": "anchor_obs",
    "step_reward": "step_rewards",
}
"""verl-agent's name for each role (docs/audit.md#verl-agent-batches)."""

VERL_AGENT_PENALTY = 0.1
"""verl-agent's default ``actor_rollout_ref.actor.invalid_action_penalty_coef``."""

ROW_AS_TRAJ = "@row"
"""Source name meaning "every row is its own trajectory" (``--col traj_id=@row``)."""

FORMATS: tuple[str, ...] = ("jsonl", "csv", "parquet")
_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}

BATCH_DIR = "batches"
_BATCH_RE = re.compile(r"^iter_(\d{6,})\.parquet$")


class AuditInputError(ValueError):
    """Unusable audit input. The message is one line naming the column and what was found."""


@dataclass(frozen=True)
class BatchColumns:
    """One batch read from a file, as arrays ready for :func:`oma.diagnostics.audit`.

    Attributes:
        group_index: int64 code of each row's group (codes in order of first appearance), [R].
        traj_index: int64 code of each row's trajectory, [R].
        scores: float64 [R].
        response_tokens: int64 trainable tokens per row, [R].
        response_length: padded length L (longest mask, else most tokens in a row).
        step_index, anchor, step_rewards, won: optional [R] arrays (int64, int64, float64, bool).
        group_labels: the original group id of each code, [G].
        traj_labels: the original trajectory id of each code, [T].
        source: where the batch came from.
        padding_copy: bool [R], rows that repeat an earlier row (``--from verl-agent`` only).
        success_rule: how ``won`` was decided when the reader decided it (``--from verl-agent``).
        dump: the input's format and the invalid-action penalty applied to ``scores``.
    """

    group_index: np.ndarray
    traj_index: np.ndarray
    scores: np.ndarray
    response_tokens: np.ndarray
    response_length: int
    step_index: np.ndarray | None
    anchor: np.ndarray | None
    step_rewards: np.ndarray | None
    won: np.ndarray | None
    group_labels: np.ndarray
    traj_labels: np.ndarray
    source: str
    padding_copy: np.ndarray | None = None
    success_rule: str | None = None
    dump: DumpInfo = DumpInfo()

    @property
    def rows(self) -> int:
        return int(self.scores.shape[0])


# --------------------------------------------------------------------------------------------
# reading


def parse_col_args(items: list[str] | None) -> dict[str, str]:
    """``["traj_id=traj_uid", ...]`` → ``{"traj_id": "traj_uid"}``, validating the role names."""
    out: dict[str, str] = {}
    for item in items or []:
        role, sep, source = item.partition("=")
        role, source = role.strip(), source.strip()
        if not sep or not role or not source:
            raise AuditInputError(f"--col {item!r} is not ROLE=COLUMN (e.g. --col traj_id=traj_uid)")
        if role not in ROLES:
            raise AuditInputError(f"--col {item!r}: unknown role {role!r}; expected one of {', '.join(ROLES)}")
        out[role] = source
    return out


def detect_format(path: Path, fmt: str | None = None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise AuditInputError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        return fmt
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise AuditInputError(
            f"cannot tell the format of {path} from its extension {path.suffix!r}; "
            f"use .jsonl, .csv or .parquet, or pass --format {{{','.join(FORMATS)}}}"
        )
    return found


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def read_table(path: str | os.PathLike, fmt: str | None = None, wanted: set[str] | None = None) -> pa.Table:
    """The file as a pyarrow Table (Parquet: only the ``wanted`` source columns, if given)."""
    path = Path(path)
    if not path.exists():
        raise AuditInputError(f"no such file: {path}")
    if path.is_dir():
        raise AuditInputError(f"{path} is a directory, not a batch file")
    fmt = detect_format(path, fmt)
    if path.stat().st_size == 0:
        raise AuditInputError(f"{path} is empty (0 bytes)")
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)  # (pq.read_table would import pyarrow.dataset: +0.4 s)
            names = pf.schema_arrow.names
            cols = None if wanted is None else [n for n in names if n in wanted]
            return pf.read(columns=cols)
        if fmt == "csv":
            import pyarrow.csv as pcsv

            return pcsv.read_csv(path)
        import pyarrow.json as pjson

        return pjson.read_json(path)
    except (pa.ArrowException, OSError) as err:
        raise AuditInputError(f"cannot read {path} as {fmt}: {_first_line(err)}") from None


def read_batch(
    path: str | os.PathLike, columns: Mapping[str, str] | None = None, *, fmt: str | None = None
) -> BatchColumns:
    """Read and validate a batch file (JSONL, CSV or Parquet) into :class:`BatchColumns`.

    Args:
        path: the file.
        columns: role → source column name overrides (``{"traj_id": "traj_uid"}``).
        fmt: ``"jsonl"``, ``"csv"`` or ``"parquet"``; default from the extension.

    Raises:
        AuditInputError: one line naming the column and what was found (missing or misnamed
            column, null or NaN values, a trajectory in two groups, an empty file, ...).
    """
    mapping = {role: role for role in ROLES}
    mapping.update(columns or {})
    table = read_table(path, fmt, set(mapping.values()))
    return batch_from_table(table, columns, source=str(path))


def batch_from_table(
    table: pa.Table, columns: Mapping[str, str] | None = None, *, source: str = "<table>"
) -> BatchColumns:
    """Validate a pyarrow Table in the audit format (see module docstring) into :class:`BatchColumns`."""
    overrides = dict(columns or {})
    for role in overrides:
        if role not in ROLES:
            raise AuditInputError(f"unknown column role {role!r}; expected one of {', '.join(ROLES)}")
    names = list(table.column_names)
    found = ", ".join(names) if names else "no columns"
    if table.num_rows == 0:  # before naming a missing column: a file of blank lines has no columns either
        raise AuditInputError(f"{source} has no rows")
    for role, src in overrides.items():
        if src == ROW_AS_TRAJ and role == "traj_id":
            continue
        if src not in names:
            raise AuditInputError(f"--col {role}={src}: {source} has no column {src!r} (found: {found})")

    def src_of(role: str) -> str | None:
        src = overrides.get(role, role)
        return src if (src in names or src == ROW_AS_TRAJ) else None

    for role in REQUIRED:
        if src_of(role) is None:
            raise AuditInputError(f"missing column {role!r} in {source} (found: {found}){_hint(role, names)}")
    tok_src, mask_src = src_of("response_tokens"), src_of("response_mask")
    if tok_src is None and mask_src is None:
        hint = _hint("response_tokens", names)
        raise AuditInputError(
            f"{source} needs a column 'response_tokens' (count) or 'response_mask' (list per row); found: {found}{hint}"
        )
    rows = table.num_rows

    def label(role: str) -> str:
        src = src_of(role)
        return f"'{role}'" if src == role else f"'{src}' ({role})"

    if src_of("traj_id") == ROW_AS_TRAJ:
        traj_index = np.arange(rows, dtype=np.int64)
        traj_labels = traj_index.copy()
    else:
        traj_index, traj_labels = _ids(table[src_of("traj_id")], label("traj_id"))
    where = in_trajectory(traj_index, traj_labels)
    group_index, group_labels = _ids(table[src_of("group_id")], label("group_id"), where)
    scores = _floats(table[src_of("score")], label("score"), where)
    if tok_src is not None:
        tokens = _counts(table[tok_src], label("response_tokens"), where)
        length = int(tokens.max(initial=0))
    else:
        tokens, length = _mask_counts(table[mask_src], label("response_mask"), where)
    step = _ints(table[src_of("step")], label("step"), where) if src_of("step") else None
    anchor = _anchor_ids(table[src_of("anchor")], label("anchor"), where) if src_of("anchor") else None
    step_rewards = (
        _floats(table[src_of("step_reward")], label("step_reward"), where) if src_of("step_reward") else None
    )
    won = _bools(table[src_of("won")], label("won"), where) if src_of("won") else None
    check_one_group_per_traj(group_index, traj_index, group_labels, traj_labels, label("traj_id"))
    if not tokens.any():
        raise AuditInputError(
            f"{label('response_tokens' if tok_src else 'response_mask')} has no trainable token in any row"
        )
    return BatchColumns(
        group_index=group_index,
        traj_index=traj_index,
        scores=scores,
        response_tokens=tokens,
        response_length=max(length, 1),
        step_index=step,
        anchor=anchor,
        step_rewards=step_rewards,
        won=won,
        group_labels=group_labels,
        traj_labels=traj_labels,
        source=source,
    )


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
    table = read_table(path, fmt)
    return verl_agent_from_table(
        table, columns, invalid_penalty=invalid_penalty, success_threshold=success_threshold, source=str(path)
    )


def verl_agent_from_table(
    table: pa.Table,
    columns: Mapping[str, str] | None = None,
    *,
    invalid_penalty: float = VERL_AGENT_PENALTY,
    success_threshold: float | None = None,
    source: str = "<table>",
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

    Raises:
        AuditInputError: one line naming the column, and the trajectory (``traj_uid``) where a row
            is at fault.
    """
    if not (isinstance(invalid_penalty, (int, float)) and math.isfinite(invalid_penalty) and invalid_penalty >= 0):
        raise AuditInputError(f"--invalid-penalty must be a finite number ≥ 0, got {invalid_penalty!r}")
    names = list(table.column_names)
    overrides = dict(columns or {})
    mapping = {role: col for role, col in VERL_AGENT_COLUMNS.items() if role not in overrides and col in names}
    for role in ("group_id", "traj_id", "score"):
        col = overrides.get(role, VERL_AGENT_COLUMNS[role])
        if col not in names and table.num_rows:
            raise AuditInputError(
                f"missing column {col!r} ({role}) in {source} (found: {', '.join(names) or 'no columns'}); "
                f"--from verl-agent reads verl-agent's columns (docs/audit.md#verl-agent-batches), or map it with "
                f"--col {role}=NAME"
            )
    mapping.update(overrides)
    b = batch_from_table(table, mapping, source=source)
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
    key_columns = sorted({*mapping.values(), "is_action_valid", "row_hash", "response_mask", "response_tokens"} & set(names))
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


def _hint(role: str, names: list[str]) -> str:
    for alt in _HINTS.get(role, ()):
        if alt in names:
            return f"; use --col {role}={alt}"
    return f"; use --col {role}=NAME"


Where = Callable[[int], str]
"""Row → where it lies, for messages (``", in trajectory 't3'"``); ``_nowhere`` before ids are read."""


def _nowhere(row: int) -> str:
    return ""


def _nulls(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> None:
    if col.null_count:
        first = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise AuditInputError(
            f"column {what} has {col.null_count} null value(s), first at row {first} (0-based){where(first)}"
        )


def _ids(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> tuple[np.ndarray, np.ndarray]:
    """int64 codes (order of first appearance) and the original id of each code."""
    _nulls(col, what, where)
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.cast(t.value_type)
        t = col.type
    if pa.types.is_floating(t):
        values = col.to_numpy()
        if not np.all(np.isfinite(values)) or not np.all(values == np.round(values)):
            raise AuditInputError(f"column {what} must hold integer or string ids, found non-integer {t} values")
        col = pa.chunked_array([pa.array(values.astype(np.int64))])
        t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise AuditInputError(f"column {what} must hold integer or string ids, found {t}")
    enc = col.combine_chunks().dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    labels = enc.dictionary.to_numpy(zero_copy_only=False)
    return codes, labels


def _floats(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        raise AuditInputError(f"column {what} must be numeric, found {t}")
    # CSV readers turn "nan" into null, so null, NaN and inf are one complaint
    values = col.cast(pa.float64()).fill_null(np.nan).to_numpy()
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise AuditInputError(
            f"column {what} has {int(bad.sum())} NaN/inf/null value(s), first at row {first} (0-based){where(first)}"
        )
    return values.astype(np.float64, copy=False)


def _ints(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    values = _floats(col, what, where) if not pa.types.is_integer(col.type) else None
    if values is None:
        _nulls(col, what, where)
        return col.to_numpy().astype(np.int64, copy=False)
    frac = values != np.round(values)
    if frac.any():
        first = int(np.flatnonzero(frac)[0])
        raise AuditInputError(
            f"column {what} must hold integers, found {values[first]} at row {first} (0-based){where(first)}"
        )
    return values.astype(np.int64)


def _counts(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    values = _ints(col, what, where)
    neg = values < 0
    if neg.any():
        first = int(np.flatnonzero(neg)[0])
        raise AuditInputError(
            f"column {what} must be ≥ 0 (a token count), found {values[first]} at row {first} (0-based){where(first)}"
        )
    return values


def _mask_counts(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> tuple[np.ndarray, int]:
    """Trainable tokens per row and the longest mask of a list column."""
    _nulls(col, what, where)
    t = col.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        extra = " (CSV cannot hold lists: write a response_tokens count instead)" if pa.types.is_string(t) else ""
        raise AuditInputError(f"column {what} must be a list of 0/1 or booleans per row, found {t}{extra}")
    vt = t.value_type
    if not (pa.types.is_boolean(vt) or pa.types.is_integer(vt) or pa.types.is_null(vt)):
        raise AuditInputError(f"column {what} must be a list of 0/1 or booleans per row, found list of {vt}")
    arr = col.combine_chunks()
    rows = len(arr)
    if pa.types.is_fixed_size_list(t):
        offsets = np.arange(rows + 1, dtype=np.int64) * t.list_size + arr.offset * t.list_size
    else:  # the offsets buffer itself (ListArray.offsets builds a new array)
        width = np.int64 if pa.types.is_large_list(t) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset : arr.offset + rows + 1].astype(np.int64)
    values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    if values.null_count:
        raise AuditInputError(f"column {what} has {values.null_count} null entries inside its lists")
    if pa.types.is_null(vt) or len(values) == 0:
        flags = np.zeros(0, dtype=np.uint8)
    elif pa.types.is_boolean(vt):  # unpack the bitmap directly (to_numpy of a BooleanArray is slow)
        bits = np.frombuffer(values.buffers()[1], dtype=np.uint8)
        flags = np.unpackbits(bits, bitorder="little")[values.offset : values.offset + len(values)]
    else:
        v = values.to_numpy(zero_copy_only=False)
        bad = (v != 0) & (v != 1)
        if bad.any():
            raise AuditInputError(f"column {what} must hold only 0/1 or booleans, found {v[bad][0]}")
        flags = v.astype(bool).view(np.uint8)
    lengths = np.diff(offsets)
    longest = int(lengths.max(initial=0))
    if rows and longest and (lengths == longest).all():  # padded masks: one width for every row
        counts = flags.reshape(rows, longest).sum(axis=1, dtype=np.int64)
    else:  # Σ of each list's flags from one running sum (offsets are contiguous)
        running = np.zeros(len(flags) + 1, dtype=np.int32 if len(flags) < 2**31 else np.int64)
        np.cumsum(flags, out=running[1:])
        counts = (running[offsets[1:]] - running[offsets[:-1]]).astype(np.int64)
    return counts, longest


def _bools(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    """true/false, or numbers that are exactly 0 or 1 (a rate or a score is not a flag)."""
    _nulls(col, what, where)
    if pa.types.is_boolean(col.type):
        return col.to_numpy(zero_copy_only=False).astype(bool)
    values = _floats(col, what, where)
    bad = (values != 0) & (values != 1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise AuditInputError(f"column {what} must be 0/1 or true/false per row; row {first} (0-based){where(first)} "
                              f"has {values[first]:g} ({int(bad.sum())} rows are neither): is it a rate or a score?")
    return values == 1


def _anchor_ids(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    """Anchor codes: ids as :func:`_ids` reads them, or any other value (an image as nested lists, bytes)
    by the SHA-256 of its canonical JSON, so equal observations get equal codes."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_dictionary(t):
        return _ids(col, what, where)[0]
    import hashlib
    import json

    _nulls(col, what, where)
    digests = [hashlib.sha256(json.dumps(v, sort_keys=True, default=repr).encode()).hexdigest()
               for v in col.to_pylist()]
    return _ids(pa.chunked_array([pa.array(digests)]), what)[0]


def in_trajectory(traj_index: np.ndarray, traj_labels: np.ndarray) -> Where:
    """Where a row lies, for messages: ``", in trajectory 'abc'"`` (its original id)."""
    return lambda row: f", in trajectory {label_of(traj_labels[traj_index[row]])!r}"


def label_of(x: object) -> object:
    """A plain Python id for messages (numpy scalars print as ``np.int64(3)`` otherwise)."""
    return x.item() if isinstance(x, np.generic) else x


def check_one_group_per_traj(
    group_index: np.ndarray,
    traj_index: np.ndarray,
    group_labels: np.ndarray,
    traj_labels: np.ndarray,
    what: str = "'traj_id'",
) -> None:
    """Raise AuditInputError naming (by original ids) the first trajectory whose rows carry two group ids.

    The check is :func:`oma.core.batch_structure`'s; this only puts the file's ids in its message.
    """
    import torch

    from oma.core import TrajectorySplitError, batch_structure

    try:
        batch_structure(torch.from_numpy(group_index), torch.from_numpy(traj_index))
    except TrajectorySplitError as err:
        g0, g1 = (label_of(group_labels[g]) for g in err.group_ids)
        raise AuditInputError(
            f"trajectory {label_of(traj_labels[err.traj_id])!r} (column {what}) lies in two groups, {g0!r} and "
            f"{g1!r}; every trajectory must lie in exactly one group ({err.n_split} trajectories do not)"
        ) from None


# --------------------------------------------------------------------------------------------
# writing (the trainer hook) and run directories


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
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)
