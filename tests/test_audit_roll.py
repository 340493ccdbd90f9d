"""``oma audit --from roll``: a ROLL batch dump (docs/roll.md#audit-your-run), built by tests/roll_sim.py."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import roll_sim as sim
from audit_cli import audit_json, fails
from oma.diagnostics.roll import roll_from_table


def dump(tmp_path, rows: dict, name: str = "batch.parquet") -> str:
    """The recipe's columns (docs/roll.md#audit-your-run): ids, episode_scores, sample_uuid, the loss mask's
    token count, and GiGPO's state_hash and step_rewards."""
    table = pa.table({"traj_group_id": rows["traj_group_id"], "traj_id": rows["traj_id"], "step": rows["step"],
                      "episode_scores": rows["episode_scores"], "sample_uuid": rows["sample_uuid"],
                      "state_hash": rows["state_hash"], "step_rewards": rows["step_rewards"],
                      "response_tokens": [sum(m[1:]) for m in rows["response_mask"]]})
    path = tmp_path / name
    pq.write_table(table, path)
    return str(path)


def rollout(seed: int) -> tuple[dict, list[bool]]:
    rows = sim.rollout(seed)
    rows["step_rewards"] = sim.discounted_returns(rows, 0.95)
    return sim.adjust_batch_copy(rows, 16, seed)


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_a_roll_dump_is_audited_with_its_copies(tmp_path, estimator):
    rows, is_copy = rollout(3)
    doc = audit_json(tmp_path, dump(tmp_path, rows), "--from", "roll", "--estimator", estimator)
    assert doc["settings"]["from"] == "roll" and doc["settings"]["row_identity"] == "sample_uuid"
    assert doc["padding_copies"]["rows"] == sum(is_copy) > 0
    assert doc["successes"] + doc["failures"] == len(set(rows["traj_id"]))


def test_copies_by_hand():
    """Two trajectories of one group; row 3 is a copy of row 1 (same sample_uuid). τa: 2 rows, 2 + 4 tokens,
    won; τb: 1 row, 3 tokens. Under trajectory+aligned (uniform, token-mean) τa is ½, its row 1 weighs
    ½·4/(2 + 4 + 4) — its copy's tokens count in τa's, since ROLL trains on the copy — so the copy carries
    ½·4/10 = 0.2 of the step."""
    table = pa.table({"traj_group_id": ["g", "g", "g", "g"], "traj_id": ["a", "a", "b", "a"],
                      "episode_scores": [1.0, 1.0, 0.0, 1.0], "sample_uuid": ["a_0", "a_1", "b_2", "a_1"],
                      "response_tokens": [2, 4, 3, 4]})
    from oma.diagnostics import audit

    b = roll_from_table(table)
    assert b.padding_copy.tolist() == [False, False, False, True]
    assert b.won.tolist() == [True, True, False, True]
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, won=b.won,
              padding_copy=b.padding_copy, dump=b.dump, traj_labels=b.traj_labels)
    assert r.padding_copies.rows == 1
    assert r.padding_copies.mass["trajectory+aligned"] == pytest.approx(0.5 * 4 / 10, rel=1e-12)


@pytest.mark.parametrize("change,args,needle", [
    (lambda t: t.drop_columns(["sample_uuid"]), (), "missing column 'sample_uuid'"),
    (lambda t: t.drop_columns(["traj_group_id"]), (), "missing column 'traj_group_id' (group_id)"),
    (lambda t: t.set_column(t.column_names.index("episode_scores"), "episode_scores",
                            pa.array([float(i % 3) for i in range(t.num_rows)])), (), "differs between rows of trajectory"),
    (lambda t: t, ("--estimator", "gigpo", "--gamma", "0.9"), "--gamma does not apply with --from roll"),
])
def test_bad_dumps_are_refused(tmp_path, capsys, change, args, needle):
    rows, _ = rollout(4)
    path = dump(tmp_path, rows)
    pq.write_table(change(pq.read_table(path)), path)
    assert needle in fails(tmp_path, capsys, path, "--from", "roll", *args)
