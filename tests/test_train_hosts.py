"""`oma train` on the host contract (oma.hosts): the hosts' oma/* metrics in metrics.jsonl, the dumped batch
`oma audit` reads, each mini-batch's weights as oma.core's, and a bad option refused by its key."""

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from oma import core
from oma.cli import main as oma_main
from oma.train import ConfigError, load_config, read_metrics, train
from oma.train.loop import Batch, minibatch_weights

ROOT = Path(__file__).resolve().parents[1]
TINY_TABULAR = ["iterations=2", "env.eval_tasks=4", "env.tasks_per_iter=4", "optim.num_minibatches=2"]


def test_a_run_logs_the_hosts_metrics_and_dumps_what_oma_audit_reads(tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(ROOT / "configs" / "chain-tabular-grpo.yaml",
                      [*TINY_TABULAR, "dump_batches=true", f"out_dir={run_dir}"])
    train(cfg, run_dir, console=Console(file=io.StringIO()))
    records = read_metrics(run_dir)[1:]
    trajectories = cfg.env.tasks_per_iter * cfg.env.group_size
    for r in records:
        assert r["oma/trajectories"] == trajectories and r["oma/groups"] == cfg.env.tasks_per_iter
        assert r["oma/optimizer_steps"] == 2 and r["oma/padding_copies"] == 0
        assert r["oma/rows_per_trajectory/mean"] == pytest.approx(r["rows_per_traj"])
        assert r["oma/zero_spread_groups"] == pytest.approx(r["zero_spread_groups"])  # the loop's own figure
        assert 0 < r["oma/effective_trajectories"] <= trajectories
    report = tmp_path / "audit.json"
    assert oma_main(["audit", str(run_dir), "--all", "--quiet", "--json", str(report)]) == 0
    iterations = json.loads(report.read_text())["iterations"]
    assert [(it["iteration"], it["trajectories"]) for it in iterations] == [(1, trajectories), (2, trajectories)]
    assert iterations[-1]["settings"]["success_rule"] == "won column"


@pytest.mark.parametrize("mass", ["native", "uniform", "group"])
@pytest.mark.parametrize("reducer", ["token-mean", "seq-mean-token-sum-norm"])
def test_a_mini_batchs_weights_are_oma_cores_on_its_rows_bit_for_bit(mass, reducer):
    """oma train's mini-batches hold whole trajectories, so each is weighted on its own, as before the contract."""
    from oma.agent.rollout import Rows

    cfg = load_config(ROOT / "configs" / "chain-tabular-grpo.yaml", [f"algo.mass={mass}", f"algo.reducer={reducer}"])
    g = torch.Generator().manual_seed(0)
    traj = torch.repeat_interleave(torch.arange(8), torch.randint(1, 5, (8,), generator=g))
    rows = Rows(group_index=traj // 4, traj_index=traj, scores=torch.rand(traj.shape[0], generator=g))
    mask = torch.arange(6).unsqueeze(0) < torch.randint(1, 7, (traj.shape[0], 1), generator=g)
    batch = Batch(rows, mask, torch.zeros(traj.shape[0]), torch.zeros(mask.shape), None)
    idx = (traj % 2 == 1).nonzero().squeeze(-1)  # whole trajectories 1, 3, 5, 7
    expected = core.token_weights(mask[idx], rows.group_index[idx], rows.traj_index[idx], reducer=reducer, mass=mass)
    assert torch.equal(minibatch_weights(cfg, batch, idx), expected)


def test_a_bad_step_advantage_weight_is_refused_by_its_key():
    with pytest.raises(ConfigError, match=r"algo\.step_advantage_w must be >= 0, got -1"):
        load_config(ROOT / "configs" / "chain-tabular-grpo.yaml", ["algo.step_advantage_w=-1"])
