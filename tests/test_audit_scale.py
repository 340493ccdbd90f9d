"""`oma audit` at scale (issue #58 item 13): memory that does not grow with a wide response_mask beyond the mask
itself, and padding copies found without a Python object per row. Timings are on benchmarks/audit.md; these tests
bound the numpy memory a step allocates (tracemalloc), which no load changes, and check that counting slice by
slice gives what counting at once gives."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from oma.diagnostics import tables, verl_agent
from oma.diagnostics.tables import _mask_counts
from oma.diagnostics.verl_agent import padding_copies, verl_agent_from_table

MB = 2**20


def peak_of(fn, *args, **kwargs) -> tuple[object, int]:
    """fn's result and the most memory Python and numpy held at once while it ran (bytes)."""
    tracemalloc.start()
    try:
        out = fn(*args, **kwargs)
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def wide_mask(rows: int, width: int, seed: int = 0) -> tuple[pa.ChunkedArray, np.ndarray]:
    """A padded boolean mask [rows, width] straight from random bits (no unpacked copy), and its counts."""
    bits = np.random.default_rng(seed).integers(0, 256, rows * width // 8, dtype=np.uint8)
    values = pa.BooleanArray.from_buffers(pa.bool_(), rows * width, [None, pa.py_buffer(bits)])
    counts = np.unpackbits(bits, bitorder="little").reshape(rows, width).sum(axis=1)
    return pa.chunked_array([pa.FixedSizeListArray.from_arrays(values, width).cast(pa.list_(pa.bool_()))]), counts


def test_a_wide_mask_costs_no_memory_in_proportion_to_it():
    """#58 item 13: a 50,000 × 2,048 boolean mask (12.5 MB of bits) was unpacked whole (99 MB of numpy memory); it is
    counted a slice at a time, under 32 MB whatever its width (19 MB here)."""
    col, expected = wide_mask(50_000, 2_048)
    (counts, longest), peak = peak_of(_mask_counts, col, "'response_mask'")
    assert counts.tolist() == expected.tolist() and longest == 2_048
    assert peak < 32 * MB, f"{peak / MB:.0f} MB"


def test_list_columns_are_never_python_objects():
    """#58 item 13: the padding-copy detection turned every list column (here a mask of 1,000 entries and 200 token
    ids per row) into Python lists and their repr(), row by row: 296 MB of Python objects for 20,000 rows. The mask
    is now counted from its bitmap and the token ids hashed from their buffer: 20 MB."""
    rows, width = 20_000, 1_000
    mask, _ = wide_mask(rows, width)
    rng = np.random.default_rng(1)
    ids = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(1_000, 150_000, rows * 200)), 200)
    table = pa.table({
        "uid": np.repeat(np.arange(rows // 8), 8).astype(str),
        "traj_uid": np.arange(rows).astype(str),
        "episode_rewards": rng.random(rows),
        "is_action_valid": np.ones(rows, dtype=bool),
        "response_mask": mask,
        "input_ids": ids.cast(pa.list_(pa.int64())),
    })
    batch, peak = peak_of(verl_agent_from_table, table)
    assert batch.dump.row_identity == "input_ids" and not batch.padding_copy.any()
    assert peak < 48 * MB, f"{peak / MB:.0f} MB"


def test_slices_change_no_count(monkeypatch):
    """#58 item 13: counting masks and hashing row identities a slice at a time gives what one slice gives, whatever
    the slice boundaries (ragged rows, rows wider than a slice)."""
    rng = np.random.default_rng(2)
    lists = [rng.integers(0, 2, int(n)).astype(bool).tolist() for n in rng.integers(0, 40, 300)]
    col = pa.chunked_array([pa.array(lists[:120], pa.list_(pa.bool_())), pa.array(lists[120:], pa.list_(pa.bool_()))])
    hashes = pa.chunked_array([pa.array([f"h{int(i)}" * int(1 + i % 7) for i in rng.integers(0, 40, 300)])])
    traj = rng.integers(0, 30, 300)
    whole = (_mask_counts(col, "'m'")[0], padding_copies(hashes, traj, "'row_hash'"))
    monkeypatch.setattr(tables, "_MASK_SLICE", 7)
    monkeypatch.setattr(verl_agent, "_SLICE_BYTES", 5)
    monkeypatch.setattr(verl_agent, "_SLICE_ROWS", 7)
    sliced = (_mask_counts(col, "'m'")[0], padding_copies(hashes, traj, "'row_hash'"))
    assert whole[0].tolist() == sliced[0].tolist() == [sum(x) for x in lists]
    assert whole[1].tolist() == sliced[1].tolist() and whole[1].any()
    seen, expected = set(), []
    for t, h in zip(traj.tolist(), hashes.to_pylist(), strict=True):
        expected.append((t, h) in seen)
        seen.add((t, h))
    assert whole[1].tolist() == expected


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_text_ids_are_read_as_codes(tmp_path, fmt):
    """#58 item 13: text ids arrive dictionary-encoded (an int32 per row instead of a uuid string), and only the
    columns the audit reads are kept."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    table = pa.table({"uid": ["a", "a", "b"], "traj_uid": ["x", "y", "z"], "episode_rewards": [1.0, 0.0, 1.0],
                      "response_tokens": [3, 3, 3], "observation": ["long text"] * 3})
    path = tmp_path / f"dump.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        pcsv.write_csv(table, path)
    else:
        path.write_text("".join(f'{{"uid": "{u}", "traj_uid": "{t}", "episode_rewards": {s}, "response_tokens": 3, '
                                f'"observation": "long text"}}\n' for u, t, s in zip(*table.columns[:3], strict=True)))
    read, names = tables.read_table(path, wanted={"uid", "traj_uid", "episode_rewards", "response_tokens"},
                                    ids={"uid", "traj_uid"})
    assert names == table.column_names and read.column_names == names[:4]
    assert pa.types.is_dictionary(read["uid"].type) and pa.types.is_dictionary(read["traj_uid"].type)


@pytest.mark.parametrize("late", ["a float in a column of ints", "a key first seen late"])
def test_jsonl_streamed_or_read_whole(tmp_path, late):
    """#58 item 13: JSONL is read block by block, keeping only the columns read; a block whose types differ from
    the first block's (the streaming reader fixes them there) makes the reader take the whole file at once, so the
    figures are those of the whole file either way."""
    import json

    rows = [{"group_id": t // 4, "traj_id": t, "score": t % 2, "response_tokens": 3, "note": "x" * 40}
            for t in range(40_000)]  # ~3 MB: three blocks of 1 MB
    if late == "a float in a column of ints":
        rows[-1]["score"] = 0.5
    else:
        rows[-1]["comment"] = "the streaming reader stops at a key it has not seen"
    path = tmp_path / "late.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = tables.read_batch(path)
    assert b.rows == 40_000 and b.scores[-1] == rows[-1]["score"] and b.traj_labels[-1] == 39_999
