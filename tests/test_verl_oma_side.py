"""oma's side of the verl integration, with no verl needed: session keys, the trainer's batch
computation, the config checks and the estimators' options (the verl-free tests of
the integration; the ones against verl itself are in the other test_verl_* modules)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oma import core
from oma.integrations.verl.batch import (
    UnsupportedConfigError,
    check_trainer_config,
    compute_oma_batch,
    parse_session_keys,
)
from oma.integrations.verl.estimators import ESTIMATOR_FUNCTIONS
from oma.integrations.verl.options import OMAOptions

from test_verl_support import random_rows, session_batch, trainer_config


def test_parse_session_keys():
    ids = parse_session_keys(["a_b_0", "a_b_1", "my_uid_1_0", "a_c_0", "my_uid_0_3"])
    assert ids.uids == ["a", "a", "my_uid", "a", "my_uid"]
    assert ids.sessions == ["a_b", "a_b", "my_uid_1", "a_c", "my_uid_0"]
    assert ids.group_index.tolist() == [0, 0, 1, 0, 1]
    assert ids.traj_index.tolist() == [0, 0, 1, 2, 3]
    assert ids.step_index.tolist() == [0, 1, 0, 0, 3]
    with pytest.raises(ValueError, match="uid"):
        parse_session_keys(["nounderscore"])
    with pytest.raises(ValueError, match="duplicated"):
        parse_session_keys(["a_0_1", "a_0_1"])


def test_worked_example_gives_oma_core_values():
    """docs/math.md#worked-example (4 successes × 10 rows, 4 failures × 50 rows) plus a second group, by session keys."""
    keys, rewards, mask, g, t, _ = session_batch([[10] * 4 + [50] * 4, [3, 7, 7, 1]], [[10] * 4 + [0] * 4, [1, 0, 1, 1]])
    out = compute_oma_batch(rewards, mask, keys, trainer_config().algorithm)
    per_row = out.advantages[torch.arange(len(keys)), mask.float().argmax(-1)]
    assert per_row[:40].tolist() == pytest.approx([0.9354] * 40, abs=1e-4)
    assert per_row[40:240].tolist() == pytest.approx([-0.9354] * 200, abs=1e-4)
    expected_adv = core.outcome_advantages(rewards.sum(-1).double(), g, t)
    torch.testing.assert_close(out.advantages, (expected_adv.unsqueeze(-1) * mask).float())
    expected_w = core.token_weights(mask, g, t, reducer="token-mean", mass="uniform")
    torch.testing.assert_close(out.weights, expected_w)
    torch.testing.assert_close(out.weighted_advantages, (expected_adv.unsqueeze(-1) * expected_w).float())
    mass = core.implicit_mass(mask, g, t, reducer="token-mean", mass="uniform")
    torch.testing.assert_close(mass, torch.full((12,), 1 / 12, dtype=torch.float64))
    assert out.metrics["oma/trajectories"] == 12 and out.metrics["oma/optimizer_steps"] == 1


def test_native_weights_per_minibatch_aligned_weights_over_the_step():
    """mass native is verl's reducer on each mini-batch; Mass Alignment is the whole step's weights × k, so
    a trajectory cut by a mini-batch boundary keeps its mass (docs/verl.md#exact-mass)."""
    keys, rewards, mask, g, t, _ = session_batch([[2, 3, 1, 2], [1, 3, 2, 2]], [[1, 0, 0, 1], [0, 1, 1, 0]])
    cfg = trainer_config().algorithm
    cfg.oma.reducer = "seq-mean-token-mean"
    cfg.oma.mass = "native"
    out = compute_oma_batch(rewards, mask, keys, cfg, dp_size=2, mini_batch_rows=8)
    assert len(out.minibatches) == 2
    for idx in out.minibatches:
        torch.testing.assert_close(out.weights[idx], core.token_weights(mask[idx], g[idx], t[idx], reducer="seq-mean-token-mean", mass="native"))
        assert float(out.weights[idx].sum()) == pytest.approx(1.0)  # verl's normaliser: total 1 per optimizer step
    cfg.oma.mass = "group"
    out = compute_oma_batch(rewards, mask, keys, cfg, dp_size=2, mini_batch_rows=8)
    torch.testing.assert_close(out.weights, 2 * core.token_weights(mask, g, t, reducer="seq-mean-token-mean", mass="group"))
    group_mass = core.segment_sum(out.weights.sum(-1), g, 2)
    torch.testing.assert_close(group_mass, torch.ones(2, dtype=torch.float64))  # each group 1/G of k = 2


def test_check_trainer_config_accepts_the_supported_setup():
    opts = check_trainer_config(trainer_config())
    assert opts.accounting == "trajectory" and opts.mass == "uniform"
    check_trainer_config(trainer_config(policy_loss={"loss_mode": "gspo"}))


@pytest.mark.parametrize(
    "change,match",
    [
        ({"loss_agg_mode": "token-mean"}, "token-sum"),
        ({"policy_loss": {"loss_mode": "dppo_tv"}}, "loss_mode"),
        ({"policy_loss": {"loss_mode": "clip_cov"}}, "loss_mode"),
        ({"policy_loss": {"loss_mode": "bypass_mode"}}, "loss_mode"),
        ({"use_kl_loss": True}, "use_kl_in_reward"),
        ({"entropy_coeff": 0.01}, "entropy"),
        ({"shuffle": True}, "shuffle"),
    ],
)
def test_check_trainer_config_refuses_inexact_combinations(change, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        check_trainer_config(trainer_config(**change))


def test_check_trainer_config_refuses_non_oma_estimator_and_pf_ppo():
    cfg = trainer_config()
    cfg.algorithm.adv_estimator = "grpo"
    with pytest.raises(UnsupportedConfigError, match="adv_estimator"):
        check_trainer_config(cfg)
    cfg = trainer_config()
    cfg.algorithm.use_pf_ppo = True
    with pytest.raises(UnsupportedConfigError, match="pf_ppo"):
        check_trainer_config(cfg)


def test_session_numbers_repeating_across_groups_are_distinct_trajectories():
    keys, rewards, mask, g, t, _ = session_batch([[2, 3], [4, 1]], [[1, 0], [0, 1]])
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    session = np.array([int(k.rsplit("_", 2)[1]) for k in keys])  # 0/1 in both groups
    adv, _ = ESTIMATOR_FUNCTIONS["oma_rloo"](rewards, mask.float(), uid, {"oma": {"mass": "native"}}, traj_index=session)
    expected = core.outcome_advantages(rewards.sum(-1).double(), g, t, estimator="rloo").float()
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask.float())


def test_refuses_mass_alignment_outside_oma_trainer():
    rewards, mask, uid = random_rows()
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


def test_check_trainer_config_refuses_a_critic():
    cfg = trainer_config()
    cfg.critic = {"enable": True}
    with pytest.raises(UnsupportedConfigError, match="critic.enable=True"):
        check_trainer_config(cfg)
    cfg.critic.enable = False
    check_trainer_config(cfg)


def test_outcome_final_is_verls_final_row_rule():
    """Trajectory a: rows scored 0, 0, 1 (a reward model scoring every row); b: 0, 0; c: 1; d: 0.5, 0.
    mean: R = 1/3, 0, 1, 0.25. final: R = 1, 0, 1, 0 (the last row's score, broadcast)."""
    from oma.integrations.verl.estimators import final_row_scores

    rewards = torch.zeros(8, 3)
    rewards[:, -1] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    mask = torch.ones(8, 3)
    uid = np.array(["g"] * 8, dtype=object)
    traj = np.array(["a", "a", "a", "b", "b", "c", "d", "d"], dtype=object)
    step = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1])
    g = torch.zeros(8, dtype=torch.int64)
    t = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    scores = rewards.sum(-1).double()
    assert final_row_scores(scores, t, step).tolist() == [1, 1, 1, 0, 0, 1, 0, 0]
    assert final_row_scores(scores, t, torch.tensor([2, 1, 0, 0, 1, 0, 1, 0])).tolist() == [0, 0, 0, 0, 0, 1, 0.5, 0.5]
    for outcome, r in (("mean", [1 / 3, 0, 1, 0.25]), ("final", [1, 0, 1, 0])):
        cfg = {"oma": {"mass": "native", "outcome": outcome}}
        adv, _ = ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, cfg, traj_index=traj, step_index=step)
        expected = core.outcome_advantages(torch.tensor(r, dtype=torch.float64)[t], g, t).float()
        torch.testing.assert_close(adv[:, 0], expected)
    adv_rows, _ = ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, {"oma": {"mass": "native", "outcome": "final"}},
                                                  traj_index=traj)  # no step_index: the row order
    torch.testing.assert_close(adv_rows, adv)
    with pytest.raises(ValueError, match="algorithm.oma.outcome"):
        OMAOptions.from_algorithm_config({"oma": {"outcome": "last"}})
