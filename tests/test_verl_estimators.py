"""oma's estimators in verl's registry (real verl 0.9.1): names, equivalence with verl, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oma.integrations.verl.plugin  # noqa: F401  (what `import verl` loads; idempotent)
from oma import core
from oma.integrations.verl import ESTIMATOR_NAMES
from oma.integrations.verl.estimators import ESTIMATOR_FUNCTIONS, terminal_step_rewards
from verl.trainer.ppo import core_algos

from test_verl_support import random_rows, session_batch


def test_names_are_registered_to_oma_functions():
    for name in ESTIMATOR_NAMES:
        assert core_algos.get_adv_estimator_fn(name) is ESTIMATOR_FUNCTIONS[name]


@pytest.mark.parametrize("norm", [True, False])
def test_oma_grpo_with_row_accounting_equals_verl_grpo(norm):
    rewards, mask, uid = random_rows()
    cfg = {"norm_adv_by_std_in_grpo": norm, "oma": {"accounting": "row", "mass": "native"}}
    ours, ours_ret = core_algos.get_adv_estimator_fn("oma_grpo")(
        token_level_rewards=rewards, response_mask=mask, config=cfg, index=uid
    )
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_ret, ours)


def test_oma_rloo_with_row_accounting_equals_verl_rloo():
    rewards, mask, uid = random_rows(seed=1)
    cfg = {"oma": {"accounting": "row", "mass": "native"}}
    ours, _ = core_algos.get_adv_estimator_fn("oma_rloo")(token_level_rewards=rewards, response_mask=mask, config=cfg, index=uid)
    ref, _ = core_algos.compute_rloo_outcome_advantage(rewards, mask, uid)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_singleton_group_differs_from_verl_by_design():
    rewards = torch.tensor([[0.0, 2.0]])
    mask = torch.ones(1, 2)
    ours, _ = ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, np.array(["a"], dtype=object), {"oma": {"accounting": "row", "mass": "native"}})
    ref, _ = core_algos.compute_grpo_outcome_advantage(rewards, mask, np.array(["a"], dtype=object))
    assert float(ours.abs().sum()) == 0.0 and float(ref.abs().sum()) > 0.0  # oma: 0 (docs/math.md#outcome-statistics-and-advantages-outcome-alignment); verl: s/(1+ε)


def test_trajectory_accounting_with_traj_uid_equals_oma_core():
    keys, rewards, mask, g, t, _ = session_batch([[10] * 4 + [50] * 4, [3, 7, 7]], [[10] * 4 + [0] * 4, [1, 0, 1]])
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    traj_uid = np.array([f"traj-{int(x)}" for x in t], dtype=object)
    adv, _ = core_algos.get_adv_estimator_fn("oma_grpo")(
        token_level_rewards=rewards, response_mask=mask.float(), index=uid, config={"oma": {"mass": "native"}}, traj_uid=traj_uid
    )
    expected = core.outcome_advantages(rewards.sum(-1).double(), g, t).float()
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask.float())
    assert abs(float(adv[0, 0]) - 0.9354) < 1e-4  # docs/math.md#worked-example: ±0.9354 under trajectory accounting


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
    assert torch.equal(core.batch_structure(g, t).position_in_trajectory(), s)


def test_refuses_trajectory_accounting_without_trajectory_ids():
    rewards, mask, uid = random_rows()
    with pytest.raises(ValueError, match="oma_sync"):
        core_algos.get_adv_estimator_fn("oma_grpo")(token_level_rewards=rewards, response_mask=mask, config={"oma": {"mass": "native"}}, index=uid)
    with pytest.raises(ValueError, match="traj"):
        ESTIMATOR_FUNCTIONS["oma_gigpo"](rewards, mask, uid, {"oma": {"mass": "native", "accounting": "row"}})


