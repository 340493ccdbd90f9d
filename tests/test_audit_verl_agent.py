"""`oma audit --from verl-agent`: the batch verl-agent trains on (padding copies, invalid-action
penalty, its own step_rewards), checked against verl-agent's computation redone by loops
(tests/verl_agent_sim.py), by hand, and against the generic reader; and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import verl_agent_sim as sim
from audit_cli import audit_json, fails

from oma.cli import main as oma_main
from oma.diagnostics.tables import AuditInputError
from oma.diagnostics import verl_agent
from oma.diagnostics.verl_agent import _digests, padding_copies, verl_agent_from_table

SEEDS = (0, 1, 2)


def dump(tmp_path: Path, batch: dict, name: str = "dump.parquet", **kw) -> str:
    path = tmp_path / name
    sim.write(batch, path, **kw)
    return str(path)


def traj_push(doc_or_report) -> dict:
    return dict(zip(doc_or_report.traj_labels.tolist(), doc_or_report.accountings["row+native"].traj_push.tolist(),
                    strict=True))


def audit_table(batch: dict, **kw):
    from oma.diagnostics import audit

    data = {k: v for k, v in batch.items() if k not in ("score", "is_copy", "copies_added")}
    b = verl_agent_from_table(pa.table(data))
    std = kw.pop("norm_by_std", kw.get("estimator") != "gigpo")
    return b, audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, anchor=b.anchor,
                    step_rewards=b.step_rewards, won=b.won, success_rule=b.success_rule, padding_copy=b.padding_copy,
                    dump=b.dump, gamma=0.0, norm_by_std=std, group_labels=b.group_labels, traj_labels=b.traj_labels,
                    **kw)


# ---- equal to verl-agent's own computation ------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("estimator,std", [("grpo", True), ("grpo", False), ("gigpo", False), ("gigpo", True)])
def test_row_native_equals_verl_agent(seed, estimator, std):
    batch = sim.simulate(seed)
    assert batch["copies_added"] > 0 and (~batch["is_action_valid"]).any()
    ref_adv = sim.grpo(batch, std=std) if estimator == "grpo" else sim.gigpo(batch, std=std)
    ref = sim.figures(batch, ref_adv)
    _, r = audit_table(batch, estimator=estimator, norm_by_std=std)
    fig = r.accountings["row+native"]
    got = traj_push(r)
    assert set(got) == set(ref["traj_push"])
    for t, p in ref["traj_push"].items():
        assert got[t] == pytest.approx(p, rel=1e-9, abs=1e-12)
    for key in ("mass_share_success", "advantage_success_mean", "advantage_failure_mean", "net_push"):
        assert getattr(fig, key) == pytest.approx(ref[key], rel=1e-9, abs=1e-12), key
    assert (fig.groups_pushed_up, fig.groups_pushed_down) == (ref["groups_pushed_up"], ref["groups_pushed_down"])
    assert r.padding_copies.rows == batch["copies_added"]
    assert r.padding_copies.mass["row+native"] == pytest.approx(ref["copy_mass"], rel=1e-12)


def test_cli_equals_python_and_reference(tmp_path):
    batch = sim.simulate(3)
    ref = sim.figures(batch, sim.gigpo(batch))
    doc = audit_json(tmp_path, dump(tmp_path, batch), "--from", "verl-agent", "--estimator", "gigpo")
    assert doc["net_push"]["row+native"] == pytest.approx(ref["net_push"], rel=1e-9, abs=1e-12)
    assert doc["mass_share_success"]["row+native"] == pytest.approx(ref["mass_share_success"], rel=1e-9)
    assert doc["settings"]["from"] == "verl-agent" and doc["settings"]["invalid_penalty"] == 0.1
    assert doc["settings"]["norm_by_std"] is False  # verl-agent's GiGPO default: mean_norm
    assert doc["settings"]["success_rule"] == "episode_rewards > 0 (before the invalid-action penalty)"
    assert doc["invalid_actions"] == int((~batch["is_action_valid"]).sum())
    copies = doc["padding_copies"]
    assert copies["rows"] == batch["copies_added"]
    assert copies["trajectories"] == len(set(batch["traj_uid"][batch["is_copy"]]))
    assert copies["mass"]["row+native"] == pytest.approx(ref["copy_mass"], rel=1e-9)
    assert f"{copies['rows']} rows are padding copies" in doc["verdict"]


def test_jsonl_dump_reads_the_same(tmp_path):
    batch = sim.simulate(4)
    a = audit_json(tmp_path, dump(tmp_path, batch), "--from", "verl-agent", "--estimator", "gigpo")
    b = audit_json(tmp_path, dump(tmp_path, batch, "dump.jsonl"), "--from", "verl-agent", "--estimator", "gigpo")
    assert {k: v for k, v in a.items() if k != "source"} == {k: v for k, v in b.items() if k != "source"}


# ---- by hand ------------------------------------------------------------------------------------


def test_penalty_and_copies_by_hand():
    """Two tasks × two episodes; one invalid action; one padding copy of row 1.

    Task a: t1 = 2 steps, won (10), step 2 invalid → scores 10, 9.9; t2 = 1 step, lost → 0.
    Task b: t3, t4 = 1 step each, lost, 0. Copy of row 1 (t1 step 2): scores a = 10, 9.9, 0, 9.9.
    Row accounting, mean_norm: μ_a = 29.8/4 = 7.45 → A = 2.55, 2.45, −7.45, 2.45; μ_b = 0 → 0, 0.
    """
    table = pa.table({
        "uid": ["a", "a", "a", "b", "b", "a"],
        "traj_uid": ["t1", "t1", "t2", "t3", "t4", "t1"],
        "episode_rewards": [10.0, 10.0, 0.0, 0.0, 0.0, 10.0],
        "is_action_valid": [True, False, True, True, True, False],
        "response_tokens": [4, 6, 5, 5, 5, 6],
        "row_hash": ["h1", "h2", "h3", "h4", "h5", "h2"],
    })
    from oma.diagnostics import audit

    b = verl_agent_from_table(table)
    np.testing.assert_allclose(b.scores, [10, 9.9, 0, 0, 0, 9.9])
    assert b.padding_copy.tolist() == [False, False, False, False, False, True]
    assert b.won.tolist() == [True, True, False, False, False, True]
    assert b.dump.invalid_actions == 2
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, won=b.won,
              padding_copy=b.padding_copy, norm_by_std=False, traj_labels=b.traj_labels)
    # ω = tokens/31; p_t1 = (4·2.55 + 6·2.45 + 6·2.45)/31, p_t2 = 5·(−7.45)/31
    push = traj_push(r)
    assert push["t1"] == pytest.approx((4 * 2.55 + 12 * 2.45) / 31, rel=1e-12)
    assert push["t2"] == pytest.approx(-5 * 7.45 / 31, rel=1e-12)
    assert push["t3"] == push["t4"] == 0
    assert r.padding_copies.rows == 1 and r.padding_copies.trajectories == 1
    assert r.padding_copies.mass["row+native"] == pytest.approx(6 / 31, rel=1e-12)
    assert r.padding_copies.mass["trajectory+aligned"] == pytest.approx(0.25 * 6 / 16, rel=1e-12)  # t1 = 1/4, row 6/16


def test_row_hash_tells_identical_steps_apart():
    """#58 item 9: two genuine steps that look alike in every other column are not copies when their row_hash
    differs; without a row identity no copy is guessed (padding_copy is None, not all False)."""
    cols = {"uid": ["a"] * 4, "traj_uid": ["t1", "t1", "t2", "t2"], "episode_rewards": [0.0, 0.0, 10.0, 10.0],
            "is_action_valid": [True] * 4, "response_tokens": [5] * 4}
    b = verl_agent_from_table(pa.table(cols))
    assert b.padding_copy is None and b.dump.row_identity is None
    with_hash = verl_agent_from_table(pa.table({**cols, "row_hash": ["h1", "h2", "h3", "h4"]}))
    assert with_hash.padding_copy.tolist() == [False] * 4 and with_hash.dump.row_identity == "row_hash"


# ---- padding copies only from a row identity (#58 item 9) -----------------------------------------


def look_alike_batch(seed: int) -> dict:
    """A simulated dump where every step has the same length, so a failed episode that revisits a room repeats an
    earlier step in every column but the row identity: the look-alikes of issue #58 item 9."""
    batch = sim.simulate(seed, groups=12, n=8)
    batch["response_tokens"] = np.full_like(batch["response_tokens"], 5)
    return batch


def look_alikes(batch: dict, columns: list[str]) -> int:
    """Rows equal to an earlier row in every one of ``columns`` (by a loop: the old rule)."""
    seen, n = set(), 0
    for r in range(len(batch["uid"])):
        key = tuple(batch[c][r].item() if hasattr(batch[c][r], "item") else batch[c][r] for c in columns)
        n += key in seen
        seen.add(key)
    return n


def test_copies_only_from_a_row_identity(tmp_path, capsys):
    """#58 item 9: without row_hash, look-alike steps were reported as padding copies and the verdict stated it as
    fact; now the audit says it cannot tell, and how to dump so that it can. With row_hash the count is exact."""
    batch = look_alike_batch(7)
    columns = ["uid", "traj_uid", "episode_rewards", "rewards", "is_action_valid", "anchor_obs", "response_tokens",
               "step_rewards"]
    assert look_alikes(batch, columns) > batch["copies_added"] > 0  # what the old rule counted, and the truth
    args = ("--from", "verl-agent", "--estimator", "gigpo")
    exact = audit_json(tmp_path, dump(tmp_path, batch), *args)
    assert exact["padding_copies"]["rows"] == batch["copies_added"]
    assert exact["padding_copies"]["trajectories"] == len(set(batch["traj_uid"][batch["is_copy"]]))
    assert exact["settings"]["row_identity"] == "row_hash"
    path = dump(tmp_path, batch, "no_hash.parquet", drop=("score", "is_copy", "copies_added", "row_id", "row_hash"))
    blind = audit_json(tmp_path, path, *args)
    assert blind["padding_copies"] is None and blind["settings"]["row_identity"] is None
    assert "cannot tell verl-agent's padding copies" in blind["verdict"]
    assert "docs/audit.md#verl-agent-batches" in blind["verdict"] and "rows are padding copies" not in blind["verdict"]
    skip = {"padding_copies", "verdict", "settings", "source"}
    assert {k: v for k, v in exact.items() if k not in skip} == {k: v for k, v in blind.items() if k not in skip}
    assert oma_main(["audit", path, *args]) == 0
    assert "cannot tell: no row_hash, row_id or input_ids column" in capsys.readouterr().out


@pytest.mark.parametrize("shape", ["ragged", "padded"])
def test_token_ids_are_a_row_identity(tmp_path, shape):
    """#58 item 9: the token ids of prompt + response (verl's input_ids) tell copies apart as row_hash does, ragged
    or padded, in Parquet and JSONL."""
    batch = look_alike_batch(8)
    width = {"ragged": lambda r: 3 + r % 5, "padded": lambda r: 12}[shape]
    batch["input_ids"] = [[int(r) % 97, int(r) // 97, 151643, *([7] * (width(int(r)) - 3))] for r in batch["row_id"]]
    drop = ("score", "is_copy", "copies_added", "row_id", "row_hash")
    for name in ("ids.parquet", "ids.jsonl"):
        doc = audit_json(tmp_path, dump(tmp_path, batch, name, drop=drop), "--from", "verl-agent")
        assert doc["padding_copies"]["rows"] == batch["copies_added"], name
        assert doc["settings"]["row_identity"] == "input_ids"


def test_the_rows_numbering_is_a_row_identity(tmp_path):
    """#58 item 9: row_id, the numbering OMA's verl-agent patch gives the rows before adjust_batch (a copy carries its
    original's), tells copies apart as row_hash does."""
    batch = look_alike_batch(9)
    doc = audit_json(tmp_path, dump(tmp_path, batch, drop=("score", "is_copy", "copies_added", "row_hash")), "--from",
              "verl-agent")
    assert doc["padding_copies"]["rows"] == batch["copies_added"] and doc["settings"]["row_identity"] == "row_id"


def test_a_hash_collision_is_never_a_copy(monkeypatch):
    """#58 item 9: rows are paired by a 64-bit hash and then compared exactly: with every hash equal, only true
    repeats inside a trajectory are copies."""
    monkeypatch.setattr(verl_agent, "_digests", lambda chunk, what: np.zeros(len(chunk), dtype=np.uint64))
    col = pa.chunked_array([["a", "b", "a", "c"], ["b", "a"]])
    traj = np.array([0, 0, 0, 1, 1, 0])
    assert padding_copies(col, traj, "'row_hash'").tolist() == [False, False, True, False, False, True]


def test_a_rows_hash_is_its_value_alone():
    """#58 item 9: a row's hash depends on its value only, not on its chunk, slice, neighbours' widths or integer
    width, so a copy is found whichever chunk it lands in."""
    h = "0123456789abcdef0123456789abcdef01234567"
    one_width = pa.array([h, h[::-1]])
    mixed = pa.array(["zz", h, "q" * 17]).slice(1)
    assert _digests(one_width, "")[0] == _digests(mixed, "")[0] != _digests(one_width, "")[1]
    ids = [[5, 6, 7], [1, 2, 3]]
    lists = [pa.array(ids, pa.list_(pa.int32())), pa.array(ids, pa.large_list(pa.int64())),
             pa.array(ids, pa.list_(pa.int64(), 3)), pa.array([[9], *ids], pa.list_(pa.int64())).slice(1)]
    digests = [_digests(a, "").tolist() for a in lists]
    assert all(d == digests[0] for d in digests) and digests[0][0] != digests[0][1]
    col = pa.chunked_array([one_width, pa.array(["x", h, "y" * 9])])
    assert padding_copies(col, np.zeros(5, dtype=np.int64), "'row_hash'").tolist() == [False] * 3 + [True, False]


@pytest.mark.parametrize("value,needle", [(None, "1 null value(s)"),
                                          ({"a": 1}, "must hold strings, integers or lists")])
def test_bad_row_identity(tmp_path, capsys, value, needle):
    """#58 item 9: a row identity that is missing on a row, or of a kind that cannot be compared, is one line."""
    batch = sim.simulate(0)
    path = tmp_path / "dump.jsonl"
    sim.write(batch, path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[3]["row_hash"] = value
    if value is not None:
        rows = [dict(r, row_hash=value) for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = fails(tmp_path, capsys, str(path), "--from", "verl-agent")
    assert "column 'row_hash'" in err and needle in err


# ---- equivalences -------------------------------------------------------------------------------


def test_without_penalty_equals_the_generic_reader(tmp_path):
    """--from verl-agent --invalid-penalty 0 is the generic reader with the columns mapped and γ = 0."""
    batch = sim.simulate(5, coef=0.0)
    path = dump(tmp_path, batch)
    a = audit_json(tmp_path, path, "--from", "verl-agent", "--invalid-penalty", "0", "--estimator", "gigpo", "--std")
    b = audit_json(tmp_path, path, "--col", "group_id=uid", "--col", "traj_id=traj_uid", "--col", "score=episode_rewards",
            "--col", "anchor=anchor_obs", "--col", "step_reward=step_rewards", "--estimator", "gigpo", "--gamma", "0")
    skip = {"settings", "padding_copies", "invalid_actions", "verdict"}
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


def test_penalty_spreads_all_fail_groups():
    """All-fail groups are zero-advantage without the penalty; invalid actions give them spread with it."""
    from oma.diagnostics import audit

    batch = sim.simulate(6)
    data = {k: v for k, v in batch.items() if k not in ("score", "is_copy", "copies_added")}
    data["episode_rewards"] = np.zeros_like(batch["episode_rewards"])
    reports = []
    for penalty in (0.0, 0.1):
        b = verl_agent_from_table(pa.table(data), invalid_penalty=penalty)
        reports.append(audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, won=b.won))
    assert reports[0].zero_spread_groups["row"] == reports[0].groups == 6
    valid = {u: set(data["is_action_valid"][data["uid"] == u].tolist()) for u in set(data["uid"])}
    uniform = sum(len(v) == 1 for v in valid.values())  # every action valid (or none): no spread
    assert uniform < 6
    assert reports[1].zero_spread_groups["row"] == uniform
    assert reports[0].accountings["row+native"].degenerate_mass_share == pytest.approx(1.0)
    assert reports[1].accountings["row+native"].degenerate_mass_share < 1.0


# ---- bad input ----------------------------------------------------------------------------------


def test_missing_is_action_valid_names_the_fix(tmp_path, capsys):
    batch = sim.simulate(0)
    path = dump(tmp_path, batch, drop=("score", "is_copy", "copies_added", "is_action_valid"))
    err = fails(tmp_path, capsys, path, "--from", "verl-agent")
    assert "'is_action_valid'" in err and "--invalid-penalty 0" in err
    assert audit_json(tmp_path, path, "--from", "verl-agent", "--invalid-penalty", "0")["invalid_actions"] is None


@pytest.mark.parametrize("column", ["uid", "traj_uid", "episode_rewards"])
def test_missing_id_column(tmp_path, capsys, column):
    path = dump(tmp_path, sim.simulate(0), drop=("score", "is_copy", "copies_added", column))
    err = fails(tmp_path, capsys, path, "--from", "verl-agent")
    assert f"missing column '{column}'" in err and "--col" in err


def test_traj_uid_in_two_uids(tmp_path, capsys):
    batch = sim.simulate(0)
    batch["uid"] = batch["uid"].copy()
    t = batch["traj_uid"][0]
    rows = np.flatnonzero(batch["traj_uid"] == t)
    other = next(u for u in batch["uid"] if u != batch["uid"][rows[0]])
    batch["uid"][rows[-1]] = other
    err = fails(tmp_path, capsys, dump(tmp_path, batch), "--from", "verl-agent")
    assert repr(str(t)) in err and "'traj_uid' (traj_id)" in err and "two groups" in err


@pytest.mark.parametrize("column", ["episode_rewards", "step_rewards"])
def test_nan_names_column_and_trajectory(tmp_path, capsys, column):
    batch = sim.simulate(0)
    batch[column] = batch[column].astype(float).copy()
    batch[column][7] = np.nan
    args = ["--estimator", "gigpo"] if column == "step_rewards" else []
    err = fails(tmp_path, capsys, dump(tmp_path, batch), "--from", "verl-agent", *args)
    assert f"'{column}'" in err and "NaN" in err and f"in trajectory '{batch['traj_uid'][7]}'" in err


def test_won_that_is_a_rate(tmp_path, capsys):
    batch = sim.simulate(0)
    batch["success_rate"] = np.full(batch["uid"].shape, 0.4)
    err = fails(tmp_path, capsys, dump(tmp_path, batch), "--from", "verl-agent", "--col", "won=success_rate")
    assert "'success_rate' (won)" in err and "0/1" in err and f"in trajectory '{batch['traj_uid'][0]}'" in err


def test_won_not_constant_in_a_trajectory(tmp_path, capsys):
    batch = sim.simulate(0)
    batch["won"] = batch["episode_rewards"] > 0
    t = batch["traj_uid"][0]
    batch["won"][np.flatnonzero(batch["traj_uid"] == t)[0]] ^= True
    err = fails(tmp_path, capsys, dump(tmp_path, batch), "--from", "verl-agent", "--col", "won=won")
    assert "'won'" in err and repr(str(t)) in err


def test_episode_rewards_that_vary_inside_a_trajectory(tmp_path, capsys):
    batch = sim.simulate(0)
    err = fails(tmp_path, capsys, dump(tmp_path, batch), "--from", "verl-agent", "--col", "score=rewards")
    assert "'rewards' (score) differs between rows of trajectory" in err


@pytest.mark.parametrize("args,needle", [
    (["--invalid-penalty", "0.1"], "add --from verl-agent"),
    (["--from", "verl-agent", "--invalid-penalty", "-1"], "argument --invalid-penalty: expected a finite number ≥ 0"),
    (["--from", "verl-agent", "--invalid-penalty", "nan"], "argument --invalid-penalty: expected a finite number ≥ 0"),
    (["--from", "verl-agent", "--estimator", "gigpo", "--gamma", "0.9"], "--gamma does not apply"),
    (["--from", "webshop"], "invalid choice"),
])
def test_bad_options(tmp_path, capsys, args, needle):
    assert needle in fails(tmp_path, capsys, dump(tmp_path, sim.simulate(0)), *args)


def test_gigpo_step_twice_names_the_trajectory(tmp_path, capsys):
    """The generic reader with a step column: a padding copy repeats a step; the message names the traj_uid."""
    batch = sim.simulate(0)
    copy = int(np.flatnonzero(batch["is_copy"])[0])
    t = batch["traj_uid"][copy]
    step = np.zeros(len(batch["uid"]), dtype=np.int64)
    for tau in set(batch["traj_uid"]):
        rows = np.flatnonzero(batch["traj_uid"] == tau)
        step[rows] = np.arange(rows.size)
    original = next(r for r in np.flatnonzero(batch["traj_uid"] == t) if r != copy
                    and batch["row_hash"][r] == batch["row_hash"][copy])
    step[copy] = step[original]
    batch["step"] = step
    err = fails(tmp_path, capsys, dump(tmp_path, batch), "--col", "group_id=uid", "--col", "traj_id=traj_uid",
                "--col", "score=episode_rewards", "--col", "anchor=anchor_obs", "--col", "step_reward=step_rewards",
                "--estimator", "gigpo")
    assert f"trajectory '{t}' has step {step[copy]} twice" in err and "--from verl-agent" in err


def test_reader_errors_are_audit_input_errors():
    with pytest.raises(AuditInputError, match="no rows"):
        verl_agent_from_table(pa.table({"uid": pa.array([], pa.string())}))
