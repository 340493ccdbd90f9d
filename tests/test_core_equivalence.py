"""oma.core against a naive per-row loop (tests/reference.py); against verl itself: test_core_vs_verl.py."""

import numpy as np
import pytest
import torch

import reference as ref
from oma.core import (
    ACCOUNTINGS,
    ESTIMATORS,
    MASSES,
    REDUCERS,
    discounted_returns,
    gigpo_advantages,
    outcome_advantages,
    token_objective,
    token_weights,
    weighted_loss,
)

SEEDS = range(12)


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), rtol=tol, atol=tol
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("accounting", ACCOUNTINGS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_outcome_advantages_match_naive_loop(seed, accounting, estimator, norm_by_std):
    b = ref.make_batch(np.random.default_rng(seed), step_penalty=seed % 2 == 1)
    got = outcome_advantages(b.scores, b.group_index, b.traj_index, accounting=accounting, estimator=estimator, norm_by_std=norm_by_std)
    close(got, ref.outcome_advantages(b, accounting, estimator, norm_by_std))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("accounting", ACCOUNTINGS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_gigpo_matches_naive_loop(seed, accounting, norm_by_std):
    b = ref.make_batch(np.random.default_rng(seed), max_rows=9)
    got = gigpo_advantages(
        b.scores, b.step_rewards, b.anchor, b.group_index, b.traj_index, b.step_index,
        accounting=accounting, norm_by_std=norm_by_std, gamma=0.9, step_advantage_w=0.7,
    )
    close(got, ref.gigpo_advantages(b, accounting, norm_by_std, 0.9, 0.7))


@pytest.mark.parametrize("length", [1, 2, 3, 7, 40, 300])
def test_discounted_returns_long_and_short_trajectories(length):
    rng = np.random.default_rng(length)
    b = ref.make_batch(rng, max_rows=length, groups=2)
    close(discounted_returns(b.step_rewards, b.traj_index, b.step_index, gamma=0.95), ref.discounted_returns(b, 0.95))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.parametrize("mass", MASSES)
def test_weighted_loss_matches_naive_reducer(seed, reducer, mass):
    rng = np.random.default_rng(seed)
    b = ref.make_batch(rng)
    token_loss = torch.from_numpy(rng.normal(size=tuple(b.response_mask.shape)))
    w = token_weights(b.response_mask, b.group_index, b.traj_index, reducer=reducer, mass=mass)
    close(weighted_loss(token_loss, w), ref.total_loss(b, token_loss, reducer, mass))


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_gigpo_with_zero_step_weight_is_grpo(accounting, norm_by_std):
    b = ref.make_batch(np.random.default_rng(3))
    grpo = outcome_advantages(b.scores, b.group_index, b.traj_index, accounting=accounting, norm_by_std=norm_by_std)
    gigpo = gigpo_advantages(
        b.scores, b.step_rewards, b.anchor, b.group_index, b.traj_index, b.step_index,
        accounting=accounting, norm_by_std=norm_by_std, step_advantage_w=0.0,
    )
    assert torch.equal(grpo, gigpo)


def test_gigpo_one_step_per_trajectory_with_zero_weight_is_grpo():
    b = ref.make_batch(np.random.default_rng(5), max_rows=1)
    grpo = outcome_advantages(b.scores, b.group_index, b.traj_index)
    gigpo = gigpo_advantages(b.scores, b.step_rewards, b.anchor, b.group_index, b.traj_index, b.step_index, step_advantage_w=0.0)
    assert torch.equal(grpo, gigpo)


def _logps(rng, shape, spread=0.3):
    logp_old = torch.from_numpy(-rng.exponential(size=shape))
    logp = (logp_old + torch.from_numpy(rng.normal(scale=spread, size=shape))).requires_grad_(True)
    return logp, logp_old


@pytest.mark.parametrize("seed", range(5))
def test_gspo_with_one_token_per_row_is_ppo(seed):
    rng = np.random.default_rng(seed)
    logp, logp_old = _logps(rng, (20, 4))
    mask = torch.zeros(20, 4, dtype=torch.bool)
    mask[torch.arange(20), torch.from_numpy(rng.integers(0, 4, 20))] = True
    adv = torch.from_numpy(rng.normal(size=20))
    ppo = token_objective(logp, logp_old, adv, mask, objective="ppo")
    gspo = token_objective(logp, logp_old, adv, mask, objective="gspo")
    close(gspo, ppo)
    (g_ppo,) = torch.autograd.grad(ppo.sum(), logp)
    (g_gspo,) = torch.autograd.grad(gspo.sum(), logp)
    close(g_gspo, g_ppo)
