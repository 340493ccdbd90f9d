"""The trainer hook: write_batch into RUN/batches/iter_NNNNNN.parquet, and `oma audit RUN`."""

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from oma.cli import main as oma_main
from oma.diagnostics import batch_path, read_batch, run_batches, write_batch


def worked_example_batch(tokens_per_row: int = 4, fail_rows: int = 50) -> dict:
    """docs/math.md#worked-example as trainer tensors; failures run `fail_rows` steps."""
    k = torch.tensor([10] * 4 + [fail_rows] * 4)
    traj = torch.repeat_interleave(torch.arange(8) + 100, k)
    step = torch.cat([torch.arange(int(n)) for n in k])
    won = torch.repeat_interleave(torch.tensor([True] * 4 + [False] * 4), k)
    mask = torch.zeros(traj.shape[0], 6, dtype=torch.bool)
    mask[:, :tokens_per_row] = True
    return dict(
        group_index=torch.full_like(traj, 7),
        traj_index=traj,
        step_index=step,
        scores=won.double() * 10,
        response_mask=mask,
        won=won,
    )


def test_batch_path_layout(tmp_path):
    assert batch_path(tmp_path, 1) == tmp_path / "batches" / "iter_000001.parquet"
    assert batch_path(tmp_path, 1234567).name == "iter_1234567.parquet"


def test_write_batch_roundtrip(tmp_path):
    b = worked_example_batch()
    rows = b["scores"].shape[0]
    b.update(anchor=torch.arange(rows) % 5, step_rewards=torch.zeros(rows))
    path = write_batch(batch_path(tmp_path, 3), **b)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == ["iter_000003.parquet"]  # no temp left
    t = pq.read_table(path)
    assert t.column_names == ["group_id", "traj_id", "step", "score", "response_tokens", "anchor", "step_reward", "won"]
    assert t.schema.field("traj_id").type == "int64" and t.schema.field("won").type == "bool"
    got = read_batch(path)
    assert got.response_tokens.tolist() == [4] * rows
    assert got.scores.tolist() == b["scores"].tolist()
    assert got.won.tolist() == b["won"].tolist()
    assert got.traj_labels.tolist() == list(range(100, 108))


def test_write_batch_validates_and_leaves_nothing(tmp_path):
    b = worked_example_batch()
    target = batch_path(tmp_path, 1)
    with pytest.raises(ValueError, match="response_mask must be a bool"):
        write_batch(target, **dict(b, response_mask=b["response_mask"].int()))
    with pytest.raises(ValueError, match="traj_index must be an integer"):
        write_batch(target, **dict(b, traj_index=b["traj_index"][:-1]))
    with pytest.raises(ValueError, match="scores has 1 NaN"):
        write_batch(target, **dict(b, scores=torch.where(torch.arange(240) == 3, float("nan"), b["scores"])))
    assert not target.exists()
    assert not target.parent.exists() or list(target.parent.iterdir()) == []
    # numpy inputs work as well
    write_batch(target, **{k: v.numpy() for k, v in b.items()})
    assert read_batch(target).rows == 240


def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    for it, fail_rows in ((1, 50), (2, 30), (3, 10)):  # failures shorten as training goes on
        write_batch(batch_path(run, it), **worked_example_batch(fail_rows=fail_rows))
    (run / "batches" / ".iter_000004.parquet.tmp-1-abc").write_text("partial")  # an unfinished write: ignored
    return run


def test_run_dir_latest_iter_and_all(tmp_path, capsys):
    run = make_run(tmp_path)
    assert [it for it, _ in run_batches(run)] == [1, 2, 3]
    latest = tmp_path / "latest.json"
    assert oma_main(["audit", str(run), "--json", str(latest), "--quiet"]) == 0
    doc = json.loads(latest.read_text())
    assert doc["source"].endswith("iter_000003.parquet") and doc["settings"]["success_rule"] == "won column"
    assert doc["expansion_ratio_fail_over_success"] == 1.0
    assert doc["mass_share_success"]["row+native"] == pytest.approx(0.5)

    one = tmp_path / "one.json"
    assert oma_main(["audit", str(run), "--iter", "1", "--json", str(one), "--quiet"]) == 0
    doc = json.loads(one.read_text())
    assert doc["expansion_ratio_fail_over_success"] == 5.0
    assert doc["mass_share_success"]["row+native"] == pytest.approx(1 / 6)

    every = tmp_path / "all.json"
    md = tmp_path / "md"
    assert oma_main(["audit", str(run), "--all", "--json", str(every), "--md", str(md)]) == 0
    out = capsys.readouterr().out
    assert "Per iteration" in out and "verdict" in out
    doc = json.loads(every.read_text())
    assert list(doc) == ["schema_version", "source", "iterations"]
    assert [d["iteration"] for d in doc["iterations"]] == [1, 2, 3]
    # success mass under token-mean grows as failures shorten: 40/240, 40/160, 40/80
    assert [d["mass_share_success"]["row+native"] for d in doc["iterations"]] == pytest.approx([1 / 6, 1 / 4, 1 / 2])
    assert [d["mass_share_success"]["trajectory+aligned"] for d in doc["iterations"]] == pytest.approx([0.5] * 3)
    assert [d["expansion_ratio_fail_over_success"] for d in doc["iterations"]] == [5.0, 3.0, 1.0]
    assert "per_group" not in doc["iterations"][0]
    names = sorted(p.name for p in md.iterdir())
    assert names == [
        "mass_share.png",
        "mass_share_over_iterations.png",
        "mu_shift.png",
        "report.md",
        "rows_per_trajectory.png",
    ]
    assert "### Per iteration" in (md / "report.md").read_text()


def test_run_dir_errors(tmp_path, capsys):
    run = make_run(tmp_path)
    assert oma_main(["audit", str(run), "--iter", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no batch for iteration 9" in err and "1..3" in err
    assert oma_main(["audit", str(tmp_path / "empty_dir_is_here"), "--quiet"]) == 2  # missing path
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "norun").mkdir()
    assert oma_main(["audit", str(tmp_path / "norun")]) == 2
    assert "without batches/iter_NNNNNN.parquet" in capsys.readouterr().err
    assert oma_main(["audit", str(run), "--iter", "1", "--all"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_verdict_for_one_sided_batch(tmp_path, capsys):
    b = worked_example_batch()
    b["won"] = torch.zeros_like(b["won"])
    write_batch(batch_path(tmp_path, 1), **b)
    assert oma_main(["audit", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "None of the 8 trajectories counts as a success" in out
    assert "docs/how-to-choose.md#no-ratio-yet." in out


@pytest.mark.parametrize("ratio,anchor", [(1.05, "failures-expand-more"), (1.04, "no-expansion"),
                                          (1 / 1.04, "no-expansion"), (1 / 1.05, "failures-expand-less")])
def test_the_verdict_links_the_section_of_how_to_choose_for_the_batchs_expansion(ratio, anchor):
    """The ±5% band the verdict calls 'about equally' is the no-expansion section; a one-sided batch has no ratio."""
    from types import SimpleNamespace

    from oma.diagnostics.figures import choose_anchor

    assert choose_anchor(SimpleNamespace(successes=3, failures=2, expansion_ratio_fail_over_success=ratio)) == anchor
    assert choose_anchor(SimpleNamespace(successes=0, failures=2, expansion_ratio_fail_over_success=ratio)) == "no-ratio-yet"


def test_help_lists_audit(capsys):
    assert oma_main(["--help"]) == 0
    assert "audit" in capsys.readouterr().out
    assert oma_main(["audit", "--help"]) == 0
    assert "--col ROLE=NAME" in capsys.readouterr().out


def test_np_and_torch_inputs_agree(tmp_path):
    b = worked_example_batch()
    p1 = write_batch(tmp_path / "a.parquet", **b)
    p2 = write_batch(tmp_path / "b.parquet", **{k: np.asarray(v) for k, v in b.items()})
    assert pq.read_table(p1).equals(pq.read_table(p2))


def test_all_names_the_batch_it_cannot_audit(tmp_path, capsys):
    """#69: `oma audit RUN --all` named neither the file holding a NaN nor that it skipped a batch behind a
    dangling symlink. Each is one line naming the batch."""
    import pyarrow as pa

    run = make_run(tmp_path)
    two = batch_path(run, 2)
    table = pq.read_table(two)
    scores = table.column("score").to_pylist()
    scores[3] = float("nan")
    pq.write_table(table.set_column(table.schema.get_field_index("score"), "score", pa.array(scores)), two)
    assert oma_main(["audit", str(run), "--all", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(two) in err and "NaN" in err, err

    two.unlink()
    dangling = batch_path(run, 5)
    dangling.symlink_to(tmp_path / "gone.parquet")
    assert oma_main(["audit", str(run), "--all", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(dangling) in err, err
