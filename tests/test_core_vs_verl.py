"""oma.core against verl 0.9.1 itself (the `verl` extra): advantages, native aggregation, policy losses, KL.
The naive-loop equivalences, which need no verl, are in test_core_equivalence.py."""

import numpy as np
import pytest
import torch
from verl.trainer.ppo import core_algos

import reference as ref
from oma.core import ACCOUNTINGS, REDUCERS, kl_k3, outcome_advantages, token_objective, token_weights, weighted_loss
from test_core_equivalence import _logps, close


def _verl_group_batch(seed, rows=64):
    """Rows = trajectories (one row each) in groups of ≥2 members, as verl's single-turn GRPO."""
    rng = np.random.default_rng(seed)
    n_groups = rows // 4
    group = torch.from_numpy(rng.integers(0, n_groups, size=rows))
    group[: 2 * n_groups] = torch.arange(n_groups).repeat(2)  # every group has ≥2 members
    scores = torch.from_numpy(rng.integers(0, 3, size=rows).astype(np.float32)) + 0.5 * (seed % 2)
    mask = torch.from_numpy(rng.random((rows, 6)) < 0.7)
    mask[:, 0] = True
    rewards = torch.zeros(rows, 6)
    rewards[torch.arange(rows), mask.sum(-1) - 1] = scores  # outcome on the last valid token
    return scores, group, mask, rewards


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("verl_fn", ["compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage"])
def test_row_accounting_equals_verl_grpo(seed, norm_by_std, verl_fn):
    scores, group, mask, rewards = _verl_group_batch(seed)
    # verl indexes groups by uid strings; keep that realistic
    uid = np.array([f"uid-{int(g)}" for g in group], dtype=object)
    verl_adv, _ = getattr(core_algos, verl_fn)(rewards, mask.float(), uid, norm_adv_by_std_in_grpo=norm_by_std)
    traj = torch.arange(scores.shape[0])
    for accounting in ACCOUNTINGS:  # one row per trajectory: both accountings must agree with verl
        ours = outcome_advantages(scores, group, traj, accounting=accounting, norm_by_std=norm_by_std)
        close(ours.unsqueeze(-1) * mask, verl_adv, tol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("verl_fn", ["compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage"])
def test_rloo_equals_verl_rloo(seed, verl_fn):
    scores, group, mask, rewards = _verl_group_batch(seed)
    verl_adv, _ = getattr(core_algos, verl_fn)(rewards, mask.float(), group.numpy(), config=None)
    ours = outcome_advantages(scores, group, torch.arange(scores.shape[0]), accounting="row", estimator="rloo")
    close(ours.unsqueeze(-1) * mask, verl_adv, tol=1e-5)


def test_row_accounting_multi_row_trajectories_equals_verl_on_rows():
    """verl-agent's stepwise GRPO is verl's GRPO over rows: our row accounting must be it, row by row."""
    b = ref.make_batch(np.random.default_rng(11), max_rows=8)
    keep = torch.bincount(torch.unique(b.group_index, return_inverse=True)[1])[torch.unique(b.group_index, return_inverse=True)[1]] >= 2
    b = b.take(keep.nonzero().squeeze(-1))
    rewards = b.scores.unsqueeze(-1) * torch.nn.functional.one_hot(torch.zeros(b.rows, dtype=torch.long), 3)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(rewards.float(), torch.ones(b.rows, 3), b.group_index.numpy())
    ours = outcome_advantages(b.scores.float(), b.group_index, b.traj_index, accounting="row")
    close(ours, verl_adv[:, 0], tol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", REDUCERS)
def test_native_weights_equal_verl_agg_loss(seed, mode):
    rng = np.random.default_rng(seed)
    b = ref.make_batch(rng, length=9)
    loss_mat = torch.from_numpy(rng.normal(size=tuple(b.response_mask.shape)))
    w = token_weights(b.response_mask, b.group_index, b.traj_index, reducer=mode, mass="native")
    verl = core_algos.agg_loss(loss_mat, b.response_mask.to(loss_mat.dtype), mode)
    close(weighted_loss(loss_mat, w), verl, tol=1e-7)


def _actor_config(**fields):
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=4, **fields)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("objective,verl_name", [("ppo", "vanilla"), ("gspo", "gspo")])
@pytest.mark.parametrize("mode", REDUCERS)
def test_token_objective_equals_verl_policy_loss(seed, objective, verl_name, mode):
    rng = np.random.default_rng(seed)
    b = ref.make_batch(rng, length=7)
    logp, logp_old = _logps(rng, tuple(b.response_mask.shape), spread=0.5)
    adv = torch.from_numpy(rng.normal(size=b.rows)).unsqueeze(-1).expand(-1, 7)
    cfg = _actor_config(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    verl_loss, _ = core_algos.get_policy_loss_fn(verl_name)(
        old_log_prob=logp_old, log_prob=logp, advantages=adv, response_mask=b.response_mask.double(),
        loss_agg_mode=mode, config=cfg,
    )
    c = 3.0 if objective == "ppo" else None
    ell = token_objective(logp, logp_old, adv, b.response_mask, objective=objective, clip_ratio_c=c)
    ours = weighted_loss(ell, token_weights(b.response_mask, b.group_index, b.traj_index, reducer=mode, mass="native"))
    close(ours, verl_loss, tol=1e-7)
    close(torch.autograd.grad(ours, logp)[0], torch.autograd.grad(verl_loss, logp)[0], tol=1e-7)


def test_kl_k3_equals_verl_low_var_kl():
    rng = np.random.default_rng(0)
    logp, ref_logp = _logps(rng, (8, 5), spread=2.0)
    mask = torch.ones(8, 5, dtype=torch.bool)
    close(kl_k3(logp, ref_logp, mask), core_algos.kl_penalty(logp, ref_logp, "low_var_kl"))
