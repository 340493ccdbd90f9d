"""studies/tools/reset_pushes.py: the push split by trajectory outcome and action, by hand, and a one-update run."""

from __future__ import annotations

import pytest
import torch

import benchmark_scripts
from oma.envs import make
from oma.envs.chain import ACTIONS
from oma.hosts import HostOptions, HostStep


def _module():
    return benchmark_scripts.load("reset_pushes")


def test_the_right_actions_of_a_replayed_episode():
    """Reset chain of 3: right, right, wrong (back to the start), right: the expert is asked before each step."""
    m = _module()
    env = make("chain", length=3, on_wrong="reset", actions=2)
    env.reset(5)
    actions = []
    for want_right in (True, True, False, True):
        expert = env.expert_action()
        actions.append(expert if want_right else next(a for a in ACTIONS[:2] if a != expert))
        env.step(actions[-1])
    assert m.right_actions(5, actions, lambda: make("chain", length=3, on_wrong="reset", actions=2)) == [
        True, True, False, True]


def test_the_split_by_hand():
    """One group: a success of 2 rows (right, right) and a failure of 3 (right, wrong, right), one token each,
    scores 1 and 0, no std normalisation. Row statistics: mean 2/5, so A = +0.6 on the success's rows and −0.4 on
    the failure's; trajectory statistics: mean 1/2, A = ±0.5. Native token-mean mass: 1/5 per row."""
    m = _module()
    step = HostStep(group_index=torch.zeros(5, dtype=torch.long), traj_index=torch.tensor([0, 0, 1, 1, 1]),
                    scores=torch.tensor([1.0, 1, 0, 0, 0]), response_mask=torch.ones(5, 1, dtype=torch.bool))
    q = m.pushes(step, HostOptions(norm_by_std=False))
    assert q["row"].tolist() == pytest.approx([0.12, 0.12, -0.08, -0.08, -0.08])
    assert q["trajectory"].tolist() == pytest.approx([0.1, 0.1, -0.1, -0.1, -0.1])
    right = torch.tensor([True, True, True, False, True])
    success = torch.tensor([True, True, False, False, False])
    row, traj = m.split(q["row"], right, success), m.split(q["trajectory"], right, success)
    assert row == pytest.approx({("success", "right"): 0.24, ("success", "wrong"): 0.0, ("failure", "right"): -0.16,
                                 ("failure", "wrong"): -0.08})
    assert traj == pytest.approx({("success", "right"): 0.2, ("success", "wrong"): 0.0, ("failure", "right"): -0.2,
                                  ("failure", "wrong"): -0.1})
    # shares of Σ |q| (0.48 under row, 0.5 under trajectory): OA puts 40% of its push on the failure's right
    # actions, against 33% under row statistics
    total = m.add([{"row": row | {"abs": 0.48}, "trajectory": traj | {"abs": 0.5}}])
    sh = m.shares(total)
    assert sh["row"][("failure", "right")] == pytest.approx(-1 / 3)
    assert sh["trajectory"][("failure", "right")] == pytest.approx(-0.4)
    page = m.report(total, 1, "cmd", None)
    assert "| failure | right | -0.1600 | -0.2000 | -0.333 | -0.400 | -0.067 |" in page


def test_the_native_mass_follows_tokens():
    """Token-mean: a row of 9 tokens carries 9 times the mass of a row of 1; the push scales with it."""
    m = _module()
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, :1] = True
    mask[1, :9] = True
    step = HostStep(group_index=torch.zeros(2, dtype=torch.long), traj_index=torch.tensor([0, 1]),
                    scores=torch.tensor([1.0, 0.0]), response_mask=mask)
    q = m.pushes(step, HostOptions(norm_by_std=False))
    assert q["trajectory"].tolist() == pytest.approx([0.5 * 0.1, -0.5 * 0.9])


def test_one_update_of_the_reset_chain(tmp_path):
    m = _module()
    out, work = tmp_path / "pushes.md", tmp_path / "work"
    assert m.main(["env.eval_tasks=4", "--iterations", "1", "--work", str(work), "--out", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("# Where OA loses on resets") and "1 updates of row+native runs" in page
    assert (tmp_path / "pushes.png").read_bytes()[:4] == b"\x89PNG"
    run = work / "seed-0"
    assert '"accounting": "row"' in (run / "config.json").read_text()
    [(it, path)] = m.run_batches(run)
    split = m.batch_split(run, it, path, HostOptions(), m.env_factory(m.load_config(str(m.PRESET), m.RESET)))
    sh = m.shares(m.add([split]))
    for acc in m.ACCOUNTINGS:  # the cells partition the batch: their |Σ q| add up to at most Σ |q|
        assert sum(abs(split[acc][c]) for c in m.CELLS) <= split[acc]["abs"] + 1e-12
        assert split[acc][("success", "wrong")] >= 0.0  # a success's detours are pushed up, as its right actions
        assert f"| failure | right | {split['row'][('failure', 'right')]:+.4f} |" in page
        assert sh[acc][("failure", "right")] <= 0.0
