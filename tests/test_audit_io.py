"""Reading batch files: verl-agent column names, string ids, masks, and every kind of bad input."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from audit_cli import audit_json

from oma.cli import main as oma_main
from oma.diagnostics import AuditInputError, batch_from_table, read_batch

FIXTURES = Path(__file__).parent / "fixtures" / "audit"
WORKED = FIXTURES / "worked_example.jsonl"
VERL = FIXTURES / "verl_agent_worked_example.jsonl"
REMAP = ["--col", "group_id=uid", "--col", "traj_id=traj_uid", "--col", "score=episode_rewards"]


def test_verl_agent_dump_reads_with_remapping(tmp_path):
    """uuid strings for uid/traj_uid, episode_rewards, a padded boolean response_mask: same figures as
    the worked example written with int ids and token counts."""
    got = audit_json(tmp_path, str(VERL), *REMAP)
    want = audit_json(tmp_path, str(WORKED))
    assert got["per_group"].pop("group_id") == ["5d0c6f5e-2b7e-4a34-9e31-0a4cf1f0b7a2"]
    assert want["per_group"].pop("group_id") == [0]
    # without a step column there is no duplicate check
    assert got.pop("duplicated_rows") is None and want.pop("duplicated_rows") == 0
    for d in (got, want):
        d.pop("source")
    assert got == want
    b = read_batch(VERL, {"group_id": "uid", "traj_id": "traj_uid", "score": "episode_rewards"})
    assert b.response_tokens.tolist() == [4] * 240 and b.response_length == 6
    assert b.group_index.dtype == np.int64 and b.traj_index.dtype == np.int64
    assert len(b.traj_labels) == 8 and b.traj_labels[0] == "00000000-0000-0000-0000-000000001000"


def test_verl_agent_gigpo_with_string_anchors(tmp_path):
    doc = audit_json(
        tmp_path,
        str(VERL),
        *REMAP,
        "--col",
        "anchor=anchor_obs",
        "--col",
        "step_reward=rewards",
        "--estimator",
        "gigpo",
    )
    assert doc["settings"]["estimator"] == "gigpo"
    assert doc["mass_share_success"]["row+native"] == pytest.approx(1 / 6)


def test_row_as_trajectory(tmp_path):
    """--col traj_id=@row: single-turn batches (verl), every row its own trajectory."""
    path = tmp_path / "single.jsonl"
    path.write_text(
        "".join(
            json.dumps({"uid": u, "score": s, "response_tokens": n}) + "\n"
            for u, s, n in [("a", 1.0, 10), ("a", 0.0, 30), ("b", 1.0, 5), ("b", 1.0, 5)]
        )
    )
    doc = audit_json(tmp_path, str(path), "--col", "group_id=uid", "--col", "traj_id=@row")
    assert (doc["rows"], doc["trajectories"], doc["groups"]) == (4, 4, 2)
    assert doc["zero_spread_groups"] == {"row": 1, "trajectory": 1}
    assert doc["mass_share_success"]["row+native"] == pytest.approx(20 / 50)


def test_mask_as_int_lists_and_parquet_list_column(tmp_path):
    table = pa.table(
        {
            "group_id": [0, 0, 0],
            "traj_id": [1, 1, 2],
            "score": [1.0, 1.0, 0.0],
            "response_mask": pa.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], pa.list_(pa.int8())),
        }
    )
    pq.write_table(table, tmp_path / "m.parquet")
    b = read_batch(tmp_path / "m.parquet")
    assert b.response_tokens.tolist() == [2, 1, 3] and b.response_length == 3


@pytest.mark.parametrize("list_type", [pa.list_(pa.bool_()), pa.large_list(pa.bool_()), pa.list_(pa.int64())])
def test_mask_counts_ragged_sliced_and_chunked(list_type):
    from oma.diagnostics.tables import _mask_counts

    lists = [[1, 0, 1], [], [0], [1] * 5, [1] * 9, [0, 1]]
    if list_type.value_type == pa.bool_():
        lists = [[bool(v) for v in x] for x in lists]
    arr = pa.array(lists, list_type)
    col = pa.chunked_array([arr.slice(1, 4), arr.slice(0, 1), arr.slice(5)])  # odd offsets, several chunks
    counts, longest = _mask_counts(col, "'response_mask'")
    assert counts.tolist() == [0, 0, 5, 9, 2, 1] and longest == 9
    rows = [x + [0] * (4 - len(x)) for x in ([1, 1], [0], [1, 1, 1, 1])]
    padded = pa.chunked_array([pa.array(rows, pa.list_(pa.int8()))])
    assert _mask_counts(padded.slice(1), "'m'")[0].tolist() == [0, 4]


def test_integral_float_ids_are_ids():
    b = batch_from_table(
        pa.table({"group_id": [1.0, 1.0], "traj_id": [3.0, 4.0], "score": [1, 0], "response_tokens": [1, 1]})
    )
    assert b.group_labels.tolist() == [1] and b.traj_labels.tolist() == [3, 4]


# ------------------------------------------------------------------------------------------------
# bad input: non-zero exit, one line naming the column and what was found, nothing written


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / "in" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return p


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


GOOD = [{"group_id": 0, "traj_id": t, "score": float(t % 2), "response_tokens": 3} for t in range(4)]


def fails(tmp_path: Path, capsys, path: Path | str, *args: str) -> str:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    rc = oma_main(
        ["audit", str(path), *args, "--json", str(out / "a.json"), "--html", str(out / "html"), "--md", str(out / "md")]
    )
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oma audit: error: "), captured.err
    assert list(out.iterdir()) == []  # nothing written, no temporary left behind
    return lines[0]


def test_missing_column(tmp_path, capsys):
    p = write(
        tmp_path, "a.jsonl", jsonl([{k: v for k, v in r.items() if k != "traj_id"} | {"traj_uid": "x"} for r in GOOD])
    )
    msg = fails(tmp_path, capsys, p)
    assert "missing column 'traj_id'" in msg and "found: group_id, score, response_tokens, traj_uid" in msg
    assert "--col traj_id=traj_uid" in msg


def test_missing_response_columns(tmp_path, capsys):
    p = write(tmp_path, "a.jsonl", jsonl([{k: v for k, v in r.items() if k != "response_tokens"} for r in GOOD]))
    msg = fails(tmp_path, capsys, p)
    assert "'response_tokens'" in msg and "'response_mask'" in msg and "found: group_id, traj_id, score" in msg


def test_misnamed_col_argument(tmp_path, capsys):
    p = write(tmp_path, "a.jsonl", jsonl(GOOD))
    msg = fails(tmp_path, capsys, p, "--col", "traj_id=traj_uidx")
    assert "--col traj_id=traj_uidx" in msg and "no column 'traj_uidx'" in msg and "found: group_id, traj_id" in msg
    msg = fails(tmp_path, capsys, p, "--col", "trajid=traj_id")
    assert "unknown role 'trajid'" in msg
    msg = fails(tmp_path, capsys, p, "--col", "traj_id")
    assert "ROLE=COLUMN" in msg


def test_trajectory_in_two_groups(tmp_path, capsys):
    rows = [dict(r, group_id="task-a", traj_id=f"t{r['traj_id']}") for r in GOOD]
    rows.append(dict(GOOD[0], group_id="task-b", traj_id="t0"))
    p = write(tmp_path, "a.jsonl", jsonl(rows))
    msg = fails(tmp_path, capsys, p)
    assert "trajectory 't0'" in msg and "'task-a'" in msg and "'task-b'" in msg and "two groups" in msg


def test_nan_score(tmp_path, capsys):
    p = write(tmp_path, "a.csv", "group_id,traj_id,score,response_tokens\n0,0,1.0,3\n0,1,0.0,3\n0,2,nan,3\n")
    msg = fails(tmp_path, capsys, p)
    assert "column 'score' has 1 NaN/inf/null value(s), first at row 2" in msg
    table = pa.table({"g": [0, 0], "traj_id": [0, 1], "score": [1.0, float("inf")], "response_tokens": [1, 1]})
    pq.write_table(table, tmp_path / "in" / "b.parquet")
    msg = fails(tmp_path, capsys, tmp_path / "in" / "b.parquet", "--col", "group_id=g")
    assert "column 'score' has 1 NaN/inf/null value(s), first at row 1" in msg


def test_empty_inputs(tmp_path, capsys):
    assert "is empty (0 bytes)" in fails(tmp_path, capsys, write(tmp_path, "e.jsonl", ""))
    assert "has no rows" in fails(
        tmp_path, capsys, write(tmp_path, "h.csv", "group_id,traj_id,score,response_tokens\n")
    )
    schema = pa.schema(
        [("group_id", pa.int64()), ("traj_id", pa.int64()), ("score", pa.float64()), ("response_tokens", pa.int64())]
    )
    pq.write_table(schema.empty_table(), tmp_path / "in" / "z.parquet")
    assert "has no rows" in fails(tmp_path, capsys, tmp_path / "in" / "z.parquet")
    assert "no trainable token" in fails(
        tmp_path, capsys, write(tmp_path, "t.jsonl", jsonl([dict(r, response_tokens=0) for r in GOOD]))
    )


def test_bad_values(tmp_path, capsys):
    rows = [dict(r) for r in GOOD]
    del rows[2]["group_id"]
    assert "column 'group_id' has 1 null value(s), first at row 2" in fails(
        tmp_path, capsys, write(tmp_path, "n.jsonl", jsonl(rows))
    )
    msg = fails(tmp_path, capsys, write(tmp_path, "s.jsonl", jsonl([dict(r, score="high") for r in GOOD])))
    assert "column 'score' must be numeric, found string" in msg
    msg = fails(
        tmp_path, capsys, write(tmp_path, "f.jsonl", jsonl([dict(r, traj_id=r["traj_id"] + 0.5) for r in GOOD]))
    )
    assert "column 'traj_id' must hold integer or string ids" in msg
    msg = fails(tmp_path, capsys, write(tmp_path, "neg.jsonl", jsonl([dict(r, response_tokens=-1) for r in GOOD])))
    assert "column 'response_tokens' must be ≥ 0" in msg
    msg = fails(tmp_path, capsys, write(tmp_path, "m.csv", "group_id,traj_id,score,response_mask\n0,0,1,1 1 0\n"))
    assert "column 'response_mask' must be a list" in msg and "CSV cannot hold lists" in msg
    won = [dict(r, won=bool(i % 2)) for i, r in enumerate(GOOD)] + [dict(GOOD[1], won=False)]
    msg = fails(tmp_path, capsys, write(tmp_path, "w.jsonl", jsonl(won)))
    assert "column 'won' differs between rows of trajectory 1" in msg


def test_unreadable_inputs(tmp_path, capsys):
    assert "no such file" in fails(tmp_path, capsys, tmp_path / "nope.parquet")
    msg = fails(tmp_path, capsys, write(tmp_path, "a.txt", "x"))
    assert "cannot tell the format" in msg and "'.txt'" in msg
    msg = fails(tmp_path, capsys, write(tmp_path, "bad.jsonl", '{"group_id": 0,\n'))
    assert "cannot read" in msg and "as jsonl" in msg
    msg = fails(tmp_path, capsys, write(tmp_path, "ok.jsonl", jsonl(GOOD)), "--iter", "3")
    assert "need a run directory" in msg
    msg = fails(tmp_path, capsys, write(tmp_path, "ok2.jsonl", jsonl(GOOD)), "--reducer", "mean")
    assert "--reducer" in msg and "invalid choice" in msg
    msg = fails(tmp_path, capsys, write(tmp_path, "ok3.jsonl", jsonl(GOOD)), "--estimator", "gigpo")
    assert "needs column 'anchor'" in msg


def test_output_target_problems(tmp_path, capsys):
    p = write(tmp_path, "ok.jsonl", jsonl(GOOD))
    (tmp_path / "file").write_text("x")
    assert oma_main(["audit", str(p), "--html", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert oma_main(["audit", str(p), "--json", str(tmp_path / "no" / "dir" / "a.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_read_batch_raises_audit_input_error():
    with pytest.raises(AuditInputError, match="missing column 'score'"):
        batch_from_table(pa.table({"group_id": [0], "traj_id": [0], "response_tokens": [1]}))


def test_existing_html_dir_is_updated_in_place(tmp_path, capsys):
    p = write(tmp_path, "ok.jsonl", jsonl(GOOD))
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "keep.txt").write_text("mine")
    assert oma_main(["audit", str(p), "--md", str(tmp_path / "rep"), "--quiet"]) == 0
    assert sorted(x.name for x in (tmp_path / "rep").iterdir()) == [
        "keep.txt",
        "mass_share.png",
        "mu_shift.png",
        "report.md",
        "rows_per_trajectory.png",
    ]
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]
