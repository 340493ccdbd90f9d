"""Batch files for the audit: reading JSONL / CSV / Parquet dumps into :class:`BatchColumns`.

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
iteration), written by :func:`oma.batchfile.write_batch`. verl-agent's own dumps are read by
:mod:`oma.diagnostics.verl_agent`, on top of the readers here.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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

ID_ROLES: tuple[str, ...] = ("group_id", "traj_id", "anchor")
"""Roles whose values are ids: read exactly (never through float64), text dictionary-encoded."""

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
        if role in out and out[role] != source:  # the last one would win without a word
            raise AuditInputError(f"--col {item!r}: {role} is already read from column {out[role]!r}; give one --col "
                                  f"{role}=COLUMN")
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


def read_table(
    path: str | os.PathLike, fmt: str | None = None, wanted: Collection[str] | None = None, ids: Collection[str] = ()
) -> tuple[pa.Table, list[str]]:
    """The file's columns named in ``wanted`` (every column if None), those named in ``ids`` read as ids; and the
    names of all its columns (for messages).

    An id column of text comes back dictionary-encoded (an int32 per row instead of its text). A CSV id
    column is read as text, never through float64 (:func:`_csv_ids`). A name that appears twice among
    the columns read is refused; another column may repeat a name.
    """
    path = Path(path)
    if not path.exists():
        raise AuditInputError(f"no such file: {path}")
    if path.is_dir():
        raise AuditInputError(f"{path} is a directory, not a batch file")
    fmt = detect_format(path, fmt)
    if not path.is_file():  # a pipe (`<(cat b.jsonl)`) has no size to tell, and the readers read a file twice
        raise AuditInputError(f"{path} is not a regular file (a pipe or a device); save the batch to a file and audit it")
    if path.stat().st_size == 0:
        raise AuditInputError(f"{path} is empty (0 bytes)")
    readers = {"parquet": _read_parquet, "csv": _read_csv, "jsonl": _read_jsonl}
    try:
        read = readers[fmt](path, wanted, set(ids))
    except (pa.ArrowException, OSError) as err:
        bad = _bad_json_line(path) if fmt == "jsonl" else None
        raise AuditInputError(f"cannot read {path} as {fmt}: {bad or _first_line(err)}") from None
    release_arrow_memory()  # the readers' scratch buffers
    return read


def unique_columns(names: list[str], wanted: Collection[str] | None, source: object) -> list[str]:
    """The names in ``wanted`` (every name if None), in the file's order; one that appears twice is refused."""
    counts = Counter(names)
    picked = [n for n in counts if wanted is None or n in wanted]
    for name in picked:
        if counts[name] > 1:
            raise AuditInputError(
                f"column {name!r} appears {counts[name]} times in {source}; a column the audit reads needs a unique "
                "name"
            )
    return picked


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _read_parquet(path: Path, wanted: Collection[str] | None, ids: set[str]) -> tuple[pa.Table, list[str]]:
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)  # (pq.read_table would import pyarrow.dataset: +0.4 s)
    cols = unique_columns(schema.names, wanted, path)
    text_ids = [n for n in cols if n in ids and _is_text(schema.field(n).type)]
    # pre_buffer reads ahead whole column chunks: on a local file it only adds memory (+300 MB at 10^7 rows)
    pf = pq.ParquetFile(path, read_dictionary=text_ids, pre_buffer=False)
    meta = pf.metadata
    values = sum(  # leaf values of the columns read: a response_mask has one per token
        meta.row_group(g).column(c).num_values
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(g).column(c).path_in_schema.split(".")[0] in cols
    )
    # Batches of about _PARQUET_BATCH values: decoding a nested column whole takes ~8 bytes per value (its
    # levels), 800 MB for 10^5 masks of 1,024 tokens that are 12 MB as bits.
    rows = max(1, min(1 << 20, _PARQUET_BATCH * max(meta.num_rows, 1) // max(values, 1)))
    batches = pf.iter_batches(batch_size=rows, columns=cols)
    return pa.Table.from_batches(batches, schema=pa.schema([pf.schema_arrow.field(c) for c in cols])), schema.names


_PARQUET_BATCH = 1 << 23
"""Leaf values decoded at a time from Parquet."""


def _read_csv(path: Path, wanted: Collection[str] | None, ids: set[str]) -> tuple[pa.Table, list[str]]:
    import pyarrow.csv as pcsv

    with pcsv.open_csv(path) as head:  # the header (and the first block)
        names = head.schema.names
    cols = unique_columns(names, wanted, path)
    text = pa.dictionary(pa.int32(), pa.string())
    options = pcsv.ConvertOptions(include_columns=cols, column_types={n: text for n in cols if n in ids})
    table = pcsv.read_csv(path, convert_options=options)
    for i, name in enumerate(table.column_names):
        if name in ids:
            table = table.set_column(i, name, _csv_ids(table[name]))
    return table, names


def _csv_ids(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A CSV id column read as text, with int64 values when every id is an integer written plainly ("17", "-3";
    not "007" or "1e3") within int64: the ints a CSV reader infers, without the float64 it infers beyond int64,
    where 1e19 and 2e19 would become one id."""
    col = col.unify_dictionaries()
    if col.num_chunks == 0:
        return col
    text = col.chunk(0).dictionary
    if not pc.all(pc.match_substring_regex(text, r"^(0|-?[1-9][0-9]*)$")).as_py():
        return col
    try:
        values = text.cast(pa.int64())
    except pa.ArrowInvalid:  # an integer beyond int64: it stays text
        return col
    return pa.chunked_array([pa.DictionaryArray.from_arrays(c.indices, values) for c in col.chunks])


def _read_jsonl(path: Path, wanted: Collection[str] | None, ids: set[str]) -> tuple[pa.Table, list[str]]:
    import pyarrow.json as pjson

    # Block by block, keeping only the columns read, text ids as codes: 1.8 GB of verl-agent JSONL in 0.4 GB.
    # The streaming reader fixes every column's type from the first block; a later 1.5 in a column of ints, or a
    # key first seen later, stops it, and the whole file is read at once, its types inferred from every row.
    try:
        with pjson.open_json(path) as reader:
            names = reader.schema.names
            cols = unique_columns(names, wanted, path)
            batches = [_keep(batch, cols, ids) for batch in reader]
    except pa.ArrowInvalid:
        table = pjson.read_json(path)
        names = table.column_names
        cols = unique_columns(names, wanted, path)
        batches = [_keep(batch, cols, ids) for batch in table.to_batches()]
        del table
    if not batches:  # blank lines only
        return pa.table({name: pa.array([], pa.null()) for name in cols}), names
    return pa.Table.from_batches(batches), names


def _bad_json_line(path: Path) -> str | None:
    """``line N is not a JSON object (…)`` for the first line of ``path`` that is not, counting every line from 1
    as an editor does (pyarrow names a 0-based row among the non-blank lines); None when every line is one."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                return f"line {n} is not a JSON object ({_first_line(e)})"
            if not isinstance(value, dict):
                return f"line {n} is a JSON {type(value).__name__}, not an object"
    return None


def _keep(batch: pa.RecordBatch, cols: list[str], ids: set[str]) -> pa.RecordBatch:
    """The columns read of one block of a JSONL file, text ids dictionary-encoded."""
    columns = [batch.column(name) for name in cols]
    columns = [c.dictionary_encode() if name in ids and _is_text(c.type) else c for name, c in zip(cols, columns)]
    return pa.RecordBatch.from_arrays(columns, names=cols)


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
    table, names = read_table(path, fmt, set(mapping.values()), {mapping[role] for role in ID_ROLES})
    batch = batch_from_table(table, columns, source=str(path), found=names)
    del table
    release_arrow_memory()
    return batch


def release_arrow_memory() -> None:
    """Hand the memory of freed Arrow buffers back to the system. Arrow's allocator keeps it otherwise, and the
    audit's own arrays would come on top of the whole file's (at 10^7 rows, 1.2 GB more peak)."""
    pa.default_memory_pool().release_unused()


def batch_from_table(
    table: pa.Table,
    columns: Mapping[str, str] | None = None,
    *,
    source: str = "<table>",
    found: list[str] | None = None,
) -> BatchColumns:
    """Validate a pyarrow Table in the audit format (see module docstring) into :class:`BatchColumns`.

    ``found``: the columns of the file the table was read from, for messages (default: the table's)."""
    overrides = dict(columns or {})
    for role in overrides:
        if role not in ROLES:
            raise AuditInputError(f"unknown column role {role!r}; expected one of {', '.join(ROLES)}")
    names = list(table.column_names)
    unique_columns(names, {overrides.get(role, role) for role in ROLES}, source)
    found_names = names if found is None else found
    found_text = ", ".join(found_names) if found_names else "no columns"
    if table.num_rows == 0:  # before naming a missing column: a file of blank lines has no columns either
        raise AuditInputError(f"{source} has no rows")
    for role, src in overrides.items():
        if src == ROW_AS_TRAJ and role == "traj_id":
            continue
        if src not in names:
            raise AuditInputError(f"--col {role}={src}: {source} has no column {src!r} (found: {found_text})")

    def src_of(role: str) -> str | None:
        src = overrides.get(role, role)
        return src if (src in names or src == ROW_AS_TRAJ) else None

    for role in REQUIRED:
        if src_of(role) is None:
            hint = _hint(role, found_names)
            raise AuditInputError(f"missing column {role!r} in {source} (found: {found_text}){hint}")
    tok_src, mask_src = src_of("response_tokens"), src_of("response_mask")
    if tok_src is None and mask_src is None:
        hint = _hint("response_tokens", found_names)
        raise AuditInputError(
            f"{source} needs a column 'response_tokens' (count) or 'response_mask' (list per row); found: {found_text}"
            f"{hint}"
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
        first = int(np.flatnonzero(_numpy(col.is_null()))[0])
        raise AuditInputError(
            f"column {what} has {col.null_count} null value(s), first at row {first} (0-based){where(first)}"
        )


def _ids(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> tuple[np.ndarray, np.ndarray]:
    """int64 codes 0..n-1 and the original id of each code (ints, or text)."""
    _nulls(col, what, where)
    t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        raise AuditInputError(f"column {what} must hold integer or string ids, found {t} (text that is not UTF-8?)")
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or _is_text(t)):
        raise AuditInputError(f"column {what} must hold integer or string ids, found {t}")
    if pa.types.is_floating(t):
        col = pa.chunked_array([_integral_ids(_numpy(col), what, where)])
    col = _encoded(col).unify_dictionaries()
    dictionary = col.chunk(0).dictionary if col.num_chunks else pa.array([], t)
    codes = np.empty(len(col), dtype=np.int64)
    np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in col.chunks], out=codes, casting="unsafe")
    if _is_text(t):
        try:
            dictionary.validate(full=True)
        except pa.ArrowInvalid:
            raise AuditInputError(f"column {what} holds text that is not UTF-8") from None
    labels = dictionary.to_numpy(zero_copy_only=False)
    used = np.bincount(codes, minlength=len(labels)) > 0
    if not used.all():  # a dictionary built elsewhere may hold ids no row has: codes stay 0..n-1
        codes = (np.cumsum(used) - 1)[codes]
        labels = labels[used]
    return codes, labels


def _encoded(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """The column dictionary-encoded chunk by chunk, each chunk with its own dictionary, for
    ``unify_dictionaries``: encoding the whole column at once gives every chunk the final dictionary, and
    unifying ~900 JSON chunks × 500k trajectory ids then takes 30 s."""
    if pa.types.is_dictionary(col.type):
        return col
    return pa.chunked_array([c.dictionary_encode() for c in col.chunks], pa.dictionary(pa.int32(), col.type))


def _integral_ids(values: np.ndarray, what: str, where: Where) -> np.ndarray:
    """Float ids as int64: whole numbers below 2^53, where float64 still tells every integer from the next."""
    _refuse_first(~np.isfinite(values) | (values != np.round(values)), values, what, where,
                  "must hold integer or string ids")
    _refuse_first(np.abs(values) >= 2.0**53, values, what, where,
                  "must hold float64 ids below 2^53 (beyond, one float64 stands for several integers, so distinct ids "
                  "may have merged: write ids as strings, or as int64 in Parquet)")
    return values.astype(np.int64)


def _refuse_first(bad: np.ndarray, values: np.ndarray, what: str, where: Where, expected: str) -> None:
    """Raise naming the column, the first bad value as given and its row, if ``bad`` holds any row."""
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise AuditInputError(
            f"column {what} {expected}, found {label_of(values[first])!r} at row {first} (0-based){where(first)}"
        )


def _numpy(col: pa.ChunkedArray) -> np.ndarray:
    """The column as one numpy array (``ChunkedArray.to_numpy`` imports pandas: +0.4 s)."""
    return col.combine_chunks().to_numpy(zero_copy_only=False)


def _floats(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        raise AuditInputError(f"column {what} must be numeric, found {t}")
    # CSV readers turn "nan" into null, so null, NaN and inf are one complaint
    values = _numpy(col.cast(pa.float64()).fill_null(np.nan))
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise AuditInputError(
            f"column {what} has {int(bad.sum())} NaN/inf/null value(s), first at row {first} (0-based){where(first)}"
        )
    return values.astype(np.float64, copy=False)


def _ints(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    """int64 values: integers, or whole floats, within int64 (a cast would wrap 1e308 or 2^64 − 1 silently)."""
    if pa.types.is_integer(col.type):
        _nulls(col, what, where)
        values = _numpy(col)
        if values.dtype == np.uint64:
            _refuse_first(values > np.iinfo(np.int64).max, values, what, where, "must hold integers within int64")
        return values.astype(np.int64, copy=False)
    values = _floats(col, what, where)
    _refuse_first(values != np.round(values), values, what, where, "must hold integers")
    _refuse_first(np.abs(values) >= 2.0**63, values, what, where, "must hold integers within int64")
    return values.astype(np.int64)


def _counts(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    values = _ints(col, what, where)
    _refuse_first(values < 0, values, what, where, "must be ≥ 0 (a token count)")
    return values


def _mask_counts(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> tuple[np.ndarray, int]:
    """Trainable tokens per row and the longest mask of a list column, counted chunk by chunk and slice by slice
    from the Arrow buffers, so that a wide mask costs its own memory and nothing in proportion to it."""
    _nulls(col, what, where)
    t = col.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        extra = " (CSV cannot hold lists: write a response_tokens count instead)" if pa.types.is_string(t) else ""
        raise AuditInputError(f"column {what} must be a list of 0/1 or booleans per row, found {t}{extra}")
    vt = t.value_type
    if not (pa.types.is_boolean(vt) or pa.types.is_integer(vt) or pa.types.is_null(vt)):
        raise AuditInputError(f"column {what} must be a list of 0/1 or booleans per row, found list of {vt}")
    parts = [_chunk_mask_counts(chunk, what) for chunk in col.chunks]
    counts = np.concatenate([c for c, _ in parts]) if parts else np.zeros(0, dtype=np.int64)
    return counts, max((n for _, n in parts), default=0)


_MASK_SLICE = 1 << 21
"""Mask entries unpacked and summed at a time (2 MB of flags, 8 MB of running sum)."""


def _chunk_mask_counts(arr: pa.Array, what: str) -> tuple[np.ndarray, int]:
    t, rows = arr.type, len(arr)
    if pa.types.is_fixed_size_list(t):
        offsets = (np.arange(rows + 1, dtype=np.int64) + arr.offset) * t.list_size
    else:  # the offsets buffer itself (ListArray.offsets builds a new array)
        width = np.int64 if pa.types.is_large_list(t) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset : arr.offset + rows + 1].astype(np.int64)
    lengths = np.diff(offsets)
    counts = np.empty(rows, dtype=np.int64)
    start = 0
    while start < rows:
        end = int(np.searchsorted(offsets, offsets[start] + _MASK_SLICE, side="right")) - 1
        end = min(max(end, start + 1), rows)
        lo, hi = int(offsets[start]), int(offsets[end])
        running = np.zeros(hi - lo + 1, dtype=np.int32)  # a slice holds fewer than 2^31 entries
        np.cumsum(_flags(arr.values, lo, hi, what), out=running[1:])
        counts[start:end] = running[offsets[start + 1 : end + 1] - lo] - running[offsets[start:end] - lo]
        start = end
    return counts, int(lengths.max(initial=0))


def _flags(values: pa.Array, lo: int, hi: int, what: str) -> np.ndarray:
    """Entries ``lo:hi`` of a mask's values as 0/1 bytes."""
    piece = values.slice(lo, hi - lo)
    if pa.types.is_null(piece.type) or len(piece) == 0:
        return np.zeros(len(piece), dtype=np.uint8)
    if piece.null_count:
        raise AuditInputError(f"column {what} has null entries inside its lists")
    if pa.types.is_boolean(piece.type):  # unpack the bitmap directly (to_numpy of a BooleanArray is slow)
        bits = np.frombuffer(piece.buffers()[1], dtype=np.uint8)
        first = piece.offset
        return np.unpackbits(bits[first // 8 : (first + len(piece) + 7) // 8], bitorder="little")[
            first % 8 : first % 8 + len(piece)
        ]
    v = piece.to_numpy(zero_copy_only=False)
    bad = (v != 0) & (v != 1)
    if bad.any():
        raise AuditInputError(f"column {what} must hold only 0/1 or booleans, found {v[bad][0]}")
    return v.astype(np.uint8)


def _bools(col: pa.ChunkedArray, what: str, where: Where = _nowhere) -> np.ndarray:
    """true/false, or numbers that are exactly 0 or 1 (a rate or a score is not a flag)."""
    _nulls(col, what, where)
    if pa.types.is_boolean(col.type):
        return _numpy(col)
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

