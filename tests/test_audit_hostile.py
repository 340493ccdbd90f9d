"""`oma audit` against a hostile user (issue #58): options that are not numbers, ids that float64 would merge,
duplicated columns, counts beyond int64, and every other input that ended in a traceback. Each test failed
before its fix; its docstring names the item of the issue."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from audit_cli import audit_json, fails

from oma.cli import main as oma_main
from oma.diagnostics import audit, batch_from_table, read_batch

HEADER = "group_id,traj_id,score,response_tokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = [{"group_id": 0, "traj_id": t, "score": float(t % 2), "response_tokens": 3} for t in range(4)]


# ---- #58 item 8: options -------------------------------------------------------------------------


@pytest.mark.parametrize("flag,value", [
    ("--success-threshold", "nan"),
    ("--success-threshold", "inf"),
    ("--eps", "inf"),
    ("--eps", "nan"),
    ("--eps", "-1"),
    ("--step-advantage-w", "inf"),
    ("--step-advantage-w", "-inf"),
    ("--gamma", "nan"),
    ("--gamma", "2"),
    ("--invalid-penalty", "inf"),
    ("--eps", "many"),
])
def test_number_options_are_finite(tmp_path, capsys, flag, value):
    """#58 item 8: --success-threshold nan, --eps inf and --step-advantage-w inf (and their kin) are refused in one
    line naming the flag; they were accepted and gave n/a or all-zero figures."""
    path = write(tmp_path, "ok.jsonl", jsonl(GOOD))
    extra = ["--from", "verl-agent"] if flag == "--invalid-penalty" else []
    err = fails(tmp_path, capsys, str(path), f"{flag}={value}", *extra)
    assert f"argument {flag}: " in err and repr(value) in err


@pytest.mark.parametrize("name,value", [("success_threshold", float("nan")), ("eps", float("inf")),
                                        ("step_advantage_w", float("inf")), ("gamma", float("nan"))])
def test_audit_refuses_non_finite_settings(name, value):
    """#58 item 8, from Python: the same settings passed to audit() raise a ValueError naming the argument."""
    with pytest.raises(ValueError, match=f"^{name} must be a finite number"):
        audit([1.0, 0.0], [0, 0], [0, 1], response_tokens=[1, 1], **{name: value})


# ---- #58 item 8: ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [("1e19", "2e19"), ("10000000000000000000", "20000000000000000000"),
                                 ("9007199254740993", "9007199254740992")])
def test_csv_ids_beyond_float64_stay_apart(tmp_path, a, b):
    """#58 item 8: trajectory ids 1e19 and 2e19 in a CSV are two trajectories (they were merged into one through
    float64); so are 2^53 + 1 and 2^53, which float64 cannot tell apart either."""
    path = write(tmp_path, "big.csv", HEADER + f"g,{a},1,3\ng,{b},0,3\n")
    doc = audit_json(tmp_path, str(path))
    assert doc["trajectories"] == 2 and doc["successes"] == 1
    labels = read_batch(path).traj_labels.tolist()
    assert len(set(labels)) == 2


def test_csv_integer_ids_are_integers_and_other_text_stays_text(tmp_path):
    """#58 item 8: CSV id columns are read as text, exactly: plain integers that fit int64 become ints (as before),
    anything else (leading zeros, exponents) stays the text it is, so "007" and "7" are two ids."""
    b = read_batch(write(tmp_path, "ints.csv", HEADER + "1,-3,1,3\n1,4,0,3\n"))
    assert b.traj_labels.tolist() == [-3, 4] and b.group_labels.tolist() == [1]
    b = read_batch(write(tmp_path, "text.csv", HEADER + "1,007,1,3\n1,7,0,3\n1,1e3,0,3\n"))
    assert b.traj_labels.tolist() == ["007", "7", "1e3"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_float_ids_beyond_2_53_are_refused(tmp_path, capsys, fmt):
    """#58 item 8: an id that reached the file as a float64 beyond 2^53 may already stand for several integers; it is
    refused naming the column and the value, instead of being merged through an int64 cast."""
    rows = [dict(r, traj_id=1e19 + 2**12 * r["traj_id"]) for r in GOOD]  # distinct float64s
    if fmt == "jsonl":
        rows = [dict(r, traj_id=10**19 + r["traj_id"]) for r in GOOD]  # JSON integers beyond int64: read as float64
        path = write(tmp_path, "big.jsonl", jsonl(rows))
    else:
        path = tmp_path / "big.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    err = fails(tmp_path, capsys, str(path))
    assert "column 'traj_id'" in err and "2^53" in err and "1e+19" in err and "as strings" in err


# ---- #58 item 8: duplicated columns ------------------------------------------------------------


def test_duplicated_csv_column_is_one_line(tmp_path, capsys):
    """#58 item 8: a duplicated CSV column is one line naming it (it was a KeyError traceback), in every reader."""
    path = write(tmp_path, "dup.csv", "group_id,traj_id,score,score,response_tokens\n1,1,1,1,3\n1,2,0,0,3\n")
    assert "column 'score' appears 2 times in" in fails(tmp_path, capsys, str(path))
    path = write(tmp_path, "dupva.csv", "uid,traj_uid,episode_rewards,is_action_valid,is_action_valid,response_tokens\n"
                                        "a,1,1,1,1,3\na,2,0,1,1,3\n")
    assert "column 'is_action_valid' appears 2 times in" in fails(tmp_path, capsys, str(path), "--from", "verl-agent")
    table = pa.Table.from_arrays([pa.array([0, 0]), pa.array([0, 1]), pa.array([1.0, 0.0]), pa.array([3, 3]),
                                  pa.array([3, 3])], names=["group_id", "traj_id", "score", "response_tokens",
                                                            "response_tokens"])
    pq.write_table(table, tmp_path / "dup.parquet")
    assert "column 'response_tokens' appears 2 times in" in fails(tmp_path, capsys, str(tmp_path / "dup.parquet"))
    with pytest.raises(ValueError, match="column 'response_tokens' appears 2 times"):
        batch_from_table(table)


def test_an_unused_duplicated_column_is_harmless(tmp_path):
    """#58 item 8: only the columns the audit reads must be unique."""
    path = write(tmp_path, "dup.csv", "group_id,traj_id,score,note,note,response_tokens\n1,1,1,a,b,3\n1,2,0,c,d,3\n")
    assert audit_json(tmp_path, str(path))["trajectories"] == 2


# ---- #58 item 8: counts beyond int64 ------------------------------------------------------------


def test_response_tokens_beyond_int64_name_the_value(tmp_path, capsys):
    """#58 item 8: response_tokens 1e308 is refused naming the column and the value as given (it said
    "found -9223372036854775808"); so is a uint64 count beyond int64 (it said "found -1")."""
    err = fails(tmp_path, capsys, str(write(tmp_path, "t.csv", HEADER + "1,1,1,1e308\n1,2,0,3\n")))
    assert "column 'response_tokens'" in err and "1e+308" in err and "-9223372036854775808" not in err
    table = pa.table({"group_id": [0, 0], "traj_id": [0, 1], "score": [1.0, 0.0],
                      "response_tokens": pa.array([2**64 - 1, 3], pa.uint64())})
    pq.write_table(table, tmp_path / "u.parquet")
    err = fails(tmp_path, capsys, str(tmp_path / "u.parquet"))
    assert "column 'response_tokens'" in err and str(2**64 - 1) in err


def test_steps_beyond_int64_name_the_value(tmp_path, capsys):
    """#58 item 8: a uint64 step beyond int64 was read as a negative step; it is refused naming the value."""
    table = pa.table({"group_id": [0, 0], "traj_id": [0, 1], "score": [1.0, 0.0], "response_tokens": [3, 3],
                      "step": pa.array([2**64 - 1, 3], pa.uint64())})
    pq.write_table(table, tmp_path / "u.parquet")
    err = fails(tmp_path, capsys, str(tmp_path / "u.parquet"))
    assert "column 'step'" in err and str(2**64 - 1) in err


# ---- #58 item 7: other inputs that ended in a traceback or in figures without a word ---------------


def test_steps_far_apart(tmp_path):
    """#58 item 7: steps −2^63 and 2^63 − 1 overflowed the (trajectory, step) key (an OverflowError traceback); the
    repeats are still counted."""
    rows = [dict(r, step=-(2**63) if r["traj_id"] % 2 else 2**63 - 1) for r in GOOD]
    doc = audit_json(tmp_path, str(write(tmp_path, "far.jsonl", jsonl(rows + [rows[1]]))))
    assert doc["duplicated_rows"] == 1 and doc["trajectories"] == 4


@pytest.mark.parametrize("column,args", [("score", ()), ("step_reward", ("--estimator", "gigpo", "--std"))])
def test_values_whose_squares_overflow(tmp_path, capsys, column, args):
    """#58 item 7: scores (or step rewards) of ±1e308 are finite, but their group std overflows float64: the audit
    printed n/a or 0 for every push without a word. They are refused, naming them."""
    rows = [dict(r, anchor=0, step_reward=0.0) for r in GOOD]
    rows = [dict(r, **{column: 1e308 if r["traj_id"] % 2 else -1e308}) for r in rows]
    err = fails(tmp_path, capsys, str(write(tmp_path, "big.jsonl", jsonl(rows))), *args)
    assert f"{column}s reach -1e+308" in err and "rescale" in err


def test_text_ids_that_are_not_utf8(tmp_path, capsys):
    """#58 item 7: a JSONL id in Latin-1 was an ArrowException traceback; it is one line naming the column."""
    path = tmp_path / "latin1.jsonl"
    text = jsonl([dict(r, traj_id=f"t{r['traj_id']}") for r in GOOD]).replace('"t0"', '"t-latin1"')
    path.write_bytes(text.encode().replace(b"-latin1", b"\xe9"))  # "té" in Latin-1: not UTF-8
    assert "column 'traj_id' holds text that is not UTF-8" in fails(tmp_path, capsys, str(path))


def test_json_target_that_is_not_a_file(tmp_path, capsys):
    """#58 item 7: --json onto a FIFO (or a device) renamed the report over it; it is refused, the FIFO left as is."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert oma_main(["audit", str(write(tmp_path, "ok.jsonl", jsonl(GOOD))), "--json", str(fifo), "--quiet"]) == 2
    assert f"--json {fifo}: exists and is not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("flag", ["--json", "--md"])
def test_write_errors_name_the_target(tmp_path, capsys, monkeypatch, flag):
    """#58 item 7: a full disk or an unwritable folder named a temporary file ('.x.json.tmp-k3j2') in an OSError;
    the line names the option and its target, and nothing is left behind."""
    import errno

    from oma.diagnostics import cli

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cli.tempfile, "mkstemp" if flag == "--json" else "mkdtemp", full)
    target = tmp_path / "out" / "report"
    target.parent.mkdir()
    assert oma_main(["audit", str(write(tmp_path, "ok.jsonl", jsonl(GOOD))), flag, str(target), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"oma audit: error: {flag} {target}: cannot write: No space left on device\n"
    assert list(target.parent.iterdir()) == []


# ---- #69: outputs never land on inputs or foreign files ------------------------------------------------------


def _refused(tmp_path: Path, capsys, *args: str) -> str:
    assert oma_main(["audit", *args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("oma audit: error: ") and "Traceback" not in err, err
    assert not [p for p in tmp_path.rglob(".*") if ".tmp-" in p.name]  # no staged report left behind
    return err.strip()


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, capsys):
    """#69: `oma audit b.jsonl --json b.jsonl` replaced the batch with its report."""
    batch = write(tmp_path, "b.jsonl", jsonl(GOOD))
    before = batch.read_bytes()
    err = _refused(tmp_path, capsys, str(batch), "--json", str(batch))
    assert f"--json {batch}: {batch} is one of this command's inputs" in err
    assert batch.read_bytes() == before


@pytest.mark.parametrize("flag, page", [("--html", "index.html"), ("--md", "report.md"), ("--md", "mu_shift.png")])
def test_a_page_the_audit_did_not_write_is_refused_and_kept(tmp_path, capsys, flag, page):
    """#69: `echo mine > site/index.html; oma audit b.jsonl --html site` replaced the user's index.html (and --md
    notes/report.md, and a PNG of the same name beside it)."""
    batch = write(tmp_path, "b.jsonl", jsonl(GOOD))
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / page).write_text("mine\n")
    err = _refused(tmp_path, capsys, str(batch), flag, str(folder))
    assert f"{flag} {folder}: {folder / page} exists and was not written by this command" in err
    assert [p.name for p in folder.iterdir()] == [page] and (folder / page).read_text() == "mine\n"


def test_a_json_the_audit_did_not_write_is_refused_and_its_own_replaced(tmp_path, capsys):
    """#69: --json onto a user's JSON is refused; onto the audit's own JSON, and its pages onto their own (both
    pages in one folder, written again), it writes as before."""
    batch = write(tmp_path, "b.jsonl", jsonl(GOOD))
    mine = write(tmp_path, "mine.json", '{"my": 1}\n')
    assert "exists and was not written by this command" in _refused(tmp_path, capsys, str(batch), "--json", str(mine))
    assert mine.read_text() == '{"my": 1}\n'
    out, pages = tmp_path / "a.json", tmp_path / "pages"
    for _ in range(2):
        assert oma_main(["audit", str(batch), "--json", str(out), "--html", str(pages), "--md", str(pages),
                         "--quiet"]) == 0
    assert json.loads(out.read_text())["rows"] == 4
    assert {p.name for p in pages.iterdir()} == {"index.html", "report.md", "rows_per_trajectory.png",
                                                   "mass_share.png", "mu_shift.png"}


def test_a_role_given_two_columns_is_refused(tmp_path, capsys):
    """#69: `--col score=A --col score=B` read B without a word."""
    path = write(tmp_path, "ok.jsonl", jsonl([dict(r, other=1.0) for r in GOOD]))
    err = fails(tmp_path, capsys, str(path), "--col", "score=score", "--col", "score=other")
    assert "--col 'score=other': score is already read from column 'score'" in err


def test_a_broken_jsonl_line_is_named_by_its_line_number(tmp_path, capsys):
    """#69: a broken JSONL line was reported as pyarrow's "row 18" (0-based, blank lines skipped), not its line."""
    lines = [json.dumps(r) for r in GOOD] * 5
    lines.insert(3, "")
    lines[18] = '{"group_id": 0, "traj_id": '  # line 19 of the file
    path = write(tmp_path, "b.jsonl", "\n".join(lines) + "\n")
    assert f"cannot read {path} as jsonl: line 19 is not a JSON object" in fails(tmp_path, capsys, str(path))


def test_a_pipe_is_named_as_one_not_as_an_empty_file(tmp_path, capsys):
    """#69: `oma audit <(cat b.jsonl)` was reported as an empty file."""
    read, write_end = os.pipe()
    try:
        err = fails(tmp_path, capsys, f"/dev/fd/{read}", "--format", "jsonl")
    finally:
        os.close(read)
        os.close(write_end)
    assert f"/dev/fd/{read} is not a regular file (a pipe or a device)" in err
