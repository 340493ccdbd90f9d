"""oma's estimators in verl's registry (real verl 0.9.1): names, equivalence with verl, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oma.integrations.verl.plugin  # noqa: F401  (what `import verl` loads; idempotent)
from oma import core
from oma.integrations.verl import ESTIMATOR_NAMES
from oma.integrations.verl.estimators import ESTIMATOR_FUNCTIONS, rows_in_trajectory, terminal_step_rewards
from oma.integrations.verl.options import OMAOptions
from verl.trainer.ppo import core_algos

from test_verl_support import session_batch


def _random_rows(rows=40, length=6, groups=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.arange(rows) % groups  # every group has >= 2 rows
    mask = torch.rand(rows, length, generator=gen) < 0.8
    mask[:, 0] = True
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), length - 1] = torch.randint(0, 3, (rows,), generator=gen).float()
    uid = np.array([f"uid-{int(x)}" for x in g], dtype=object)
    return rewards, mask.float(), uid


def test_names_are_registered_to_oma_functions():
    for name in ESTIMATOR_NAMES:
        assert core_algos.get_adv_estimator_fn(name) is ESTIMATOR_FUNCTIONS[name]


@pytest.mark.parametrize("norm", [True, False])
def test_oma_grpo_with_row_accounting_equals_verl_grpo(norm):
    rewards, mask, uid = _random_rows()
    cfg = {"norm_adv_by_std_in_grpo": norm, "oma": {"accounting": "row", "mass": "native"}}
    ours, ours_ret = core_algos.get_adv_estimator_fn("oma_grpo")(
        token_level_rewards=rewards, response_mask=mask, config=cfg, index=uid
    )
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_ret, ours)


def test_oma_rloo_with_row_accounting_equals_verl_rloo():
    rewards, mask, uid = _random_rows(seed=1)
    cfg = {"oma": {"accounting": "row", "mass": "native"}}
    ours, _ = core_algos.get_adv_estimator_fn("oma_rloo")(token_level_rewards=rewards, response_mask=mask, config=cfg, index=uid)
    ref, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uid)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_singleton_group_differs_from_verl_by_design():
    rewards = torch.tensor([[0.0, 2.0]])
    mask = torch.ones(1, 2)
    ours, _ = ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, np.array(["a"], dtype=object), {"oma": {"accounting": "row", "mass": "native"}})
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, np.array(["a"], dtype=object))
    assert float(ours.abs().sum()) == 0.0 and float(ref.abs().sum()) > 0.0  # oma: 0 (DESIGN §3.1); verl: s/(1+ε)


def test_trajectory_accounting_with_traj_uid_equals_oma_core():
    keys, rewards, mask, g, t, _ = session_batch([[10] * 4 + [50] * 4, [3, 7, 7]], [[10] * 4 + [0] * 4, [1, 0, 1]])
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    traj_uid = np.array([f"traj-{int(x)}" for x in t], dtype=object)
    adv, _ = core_algos.get_adv_estimator_fn("oma_grpo")(
        token_level_rewards=rewards, response_mask=mask.float(), index=uid, config={"oma": {"mass": "native"}}, traj_uid=traj_uid
    )
    expected = core.outcome_advantages(rewards.sum(-1).double(), g, t).float()
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask.float())
    assert abs(float(adv[0, 0]) - 0.9354) < 1e-4  # DESIGN §3.5: ±0.9354 under trajectory accounting


def test_session_numbers_repeating_across_groups_are_distinct_trajectories():
    keys, rewards, mask, g, t, _ = session_batch([[2, 3], [4, 1]], [[1, 0], [0, 1]])
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    session = np.array([int(k.rsplit("_", 2)[1]) for k in keys])  # 0/1 in both groups
    adv, _ = ESTIMATOR_FUNCTIONS["oma_rloo"](rewards, mask.float(), uid, {"oma": {"mass": "native"}}, traj_index=session)
    expected = core.outcome_advantages(rewards.sum(-1).double(), g, t, estimator="rloo").float()
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask.float())


def test_oma_gigpo_with_anchor_obs_equals_oma_core():
    keys, rewards, mask, g, t, s = session_batch([[3, 4, 2], [5, 2]], [[1, 0, 1], [0, 1]])
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    obs = np.array([f"room{int(x) % 2}" for x in s], dtype=object)
    cfg = {"oma": {"mass": "native", "gamma": 0.9, "step_advantage_w": 0.5}}
    adv, _ = core_algos.get_adv_estimator_fn("oma_gigpo")(
        token_level_rewards=rewards, response_mask=mask.float(), index=uid, config=cfg,
        traj_uid=np.array([int(x) for x in t]), anchor_obs=obs,
    )
    scores = rewards.sum(-1).double()
    step_rewards = terminal_step_rewards(scores, t, s)
    expected = core.gigpo_advantages(
        scores, step_rewards, core.anchor_ids(list(obs)), g, t, s, gamma=0.9, step_advantage_w=0.5
    ).float()
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask.float())
    assert torch.equal(rows_in_trajectory(t), s)


def test_refuses_trajectory_accounting_without_trajectory_ids():
    rewards, mask, uid = _random_rows()
    with pytest.raises(ValueError, match="oma_sync"):
        core_algos.get_adv_estimator_fn("oma_grpo")(token_level_rewards=rewards, response_mask=mask, config={"oma": {"mass": "native"}}, index=uid)
    with pytest.raises(ValueError, match="traj"):
        ESTIMATOR_FUNCTIONS["oma_gigpo"](rewards, mask, uid, {"oma": {"mass": "native", "accounting": "row"}})


def test_refuses_mass_alignment_outside_oma_trainer():
    rewards, mask, uid = _random_rows()
    with pytest.raises(ValueError, match="Mass Alignment"):  # default mass=uniform
        ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, {"oma": {"accounting": "row"}})


def test_options_defaults_and_validation():
    opts = OMAOptions.from_algorithm_config(None)
    assert (opts.accounting, opts.mass, opts.reducer, opts.norm_by_std, opts.gamma, opts.step_advantage_w) == (
        "trajectory", "uniform", "token-mean", True, 0.95, 1.0,
    )
    assert OMAOptions.from_algorithm_config({"norm_adv_by_std_in_grpo": False}).norm_by_std is False
    assert OMAOptions.from_algorithm_config({"norm_adv_by_std_in_grpo": False, "oma": {"norm_by_std": True}}).norm_by_std
    with pytest.raises(ValueError, match="unknown key"):
        OMAOptions.from_algorithm_config({"oma": {"acounting": "row"}})
    with pytest.raises(ValueError, match="accounting"):
        OMAOptions.from_algorithm_config({"oma": {"accounting": "rows"}})
