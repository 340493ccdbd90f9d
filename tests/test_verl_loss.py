"""Weighted advantages through verl's own policy losses equal oma.core.weighted_loss (values and gradients).

oma's trainer hands verl ``A·W`` (W = oma.core.token_weights on the PPO mini-batch) with
``loss_agg_mode=token-sum``. These tests run verl 0.9.1's registered ``vanilla`` (PPO-clip with dual
clip) and ``gspo`` losses and ``agg_loss`` — and verl's worker loss ``ppo_loss`` — over micro-batch
splits and simulated data-parallel ranks, and compare with oma.core.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from oma import core
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPActorConfig
from verl.workers.config.actor import PolicyLossConfig
from verl.workers.utils.losses import ppo_loss

CLIP = {"vanilla": (0.2, 0.28), "gspo": (0.05, 0.08)}
OBJECTIVE = {"vanilla": "ppo", "gspo": "gspo"}


def _minibatch(seed=0, rows=24, length=7):
    gen = torch.Generator().manual_seed(seed)
    traj = torch.sort(torch.randint(0, 8, (rows,), generator=gen)).values  # 8 trajectories, uneven rows
    traj = torch.unique(traj, return_inverse=True)[1]
    group = traj % 3
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    mask[::5, 0] = False  # holes (e.g. observation tokens inside a response)
    mask[:, 0] |= lengths > 1
    old = -torch.rand(rows, length, generator=gen, dtype=torch.float64) * 2 - 0.1
    noise = 0.4 * torch.randn(rows, length, generator=gen, dtype=torch.float64)
    noise[:, 1] += 1.5  # ratio > clip_ratio_c = 3 on some tokens: the dual clip is exercised
    logp = (old + noise).requires_grad_(True)
    scores = torch.randint(0, 2, (rows,), generator=gen).double() * 10.0
    scores = core.outcome_advantages(scores, group, traj)  # any per-row advantage will do
    return logp, old, scores, mask, group, traj


def _config(loss_mode):
    low, high = CLIP[loss_mode]
    cfg = FSDPActorConfig(
        strategy="fsdp", rollout_n=1, loss_agg_mode="token-sum", ppo_micro_batch_size_per_gpu=4,
        clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=3.0,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )
    return cfg


def _oma_reference(loss_mode, logp, old, adv, mask, weights, is_weights=None):
    low, high = CLIP[loss_mode]
    ell = core.token_objective(
        logp, old, adv, mask, objective=OBJECTIVE[loss_mode], clip_low=low, clip_high=high,
        clip_ratio_c=3.0 if loss_mode == "vanilla" else None,
    )
    if is_weights is not None:
        ell = ell * is_weights
    loss = core.weighted_loss(ell, weights)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def _splits(rows, seed):
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    cuts = sorted({3, 10, 11, 17})
    return [perm[a:b] for a, b in zip([0, *cuts], [*cuts, rows], strict=True)]


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo"])
@pytest.mark.parametrize(
    "reducer,mass",
    [("token-mean", "uniform"), ("seq-mean-token-mean", "group"), ("seq-mean-token-sum-norm", "uniform"), ("token-mean", "native")],
)
def test_registered_policy_loss_with_weighted_advantages_equals_weighted_loss(loss_mode, reducer, mass):
    logp, old, adv, mask, group, traj = _minibatch(seed=1)
    weights = core.token_weights(mask, group, traj, reducer=reducer, mass=mass)
    expected, expected_grad = _oma_reference(loss_mode, logp, old, adv, mask, weights)

    fn, cfg = get_policy_loss_fn(loss_mode), _config(loss_mode)
    adv_w = adv.unsqueeze(-1) * weights  # what oma's trainer writes to verl's "advantages"
    total = torch.zeros((), dtype=torch.float64)
    for idx in _splits(mask.shape[0], seed=2):  # micro-batches in any order
        cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=mask.shape[0])
        loss, _ = fn(old_log_prob=old[idx], log_prob=logp[idx], advantages=adv_w[idx], response_mask=mask[idx],
                     loss_agg_mode="token-sum", config=cfg, rollout_is_weights=None)
        total = total + loss
    (grad,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total.detach(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_rollout_is_weights_multiply_the_token_loss():
    logp, old, adv, mask, group, traj = _minibatch(seed=3)
    weights = core.token_weights(mask, group, traj)
    is_w = torch.rand(mask.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.5
    expected, expected_grad = _oma_reference("vanilla", logp, old, adv, mask, weights, is_weights=is_w)
    cfg = _config("vanilla")
    loss, _ = get_policy_loss_fn("vanilla")(old, logp, adv.unsqueeze(-1) * weights, mask, "token-sum", cfg, is_w)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def _worker_micro_batch(logp, old, adv_w, mask, rows, dp_size, prompt_len=3):
    """verl's worker-side TensorDict for ppo_loss, with log-probs packed like the model's unpadded output."""
    b, length = len(rows), mask.shape[1]
    td = TensorDict(
        {
            "prompts": torch.ones(b, prompt_len, dtype=torch.long),
            "responses": torch.ones(b, length, dtype=torch.long),
            "attention_mask": torch.ones(b, prompt_len + length, dtype=torch.long),
            "response_mask": mask[rows].long(),
            "old_log_probs": old[rows],
            "advantages": adv_w[rows],
        },
        batch_size=[b],
    )
    tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=int(mask.sum()), global_batch_size=mask.shape[0])
    pos = (torch.arange(b).unsqueeze(1) * (prompt_len + length) + prompt_len - 1 + torch.arange(length)).reshape(-1)
    packed = torch.zeros(b * (prompt_len + length), dtype=logp.dtype).index_put((pos,), logp[rows].reshape(-1))
    return {"log_probs": packed}, td


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo"])
def test_worker_ppo_loss_over_ranks_and_micro_batches_equals_weighted_loss(loss_mode):
    """verl's ``ppo_loss`` (the actor worker's loss): 2 data-parallel ranks × micro-batches, grads averaged."""
    logp, old, adv, mask, group, traj = _minibatch(seed=5)
    weights = core.token_weights(mask, group, traj, reducer="seq-mean-token-mean", mass="uniform")
    expected, expected_grad = _oma_reference(loss_mode, logp, old, adv, mask, weights)
    adv_w = adv.unsqueeze(-1) * weights
    dp = 2
    ranks = torch.arange(mask.shape[0]).chunk(dp)  # verl dispatches contiguous chunks
    cfg = _config(loss_mode)
    objective = torch.zeros((), dtype=torch.float64)
    for rank_rows in ranks:
        for micro in rank_rows.split(5):
            out, td = _worker_micro_batch(logp, old, adv_w, mask, micro, dp)
            loss, _ = ppo_loss(cfg, out, td)
            objective = objective + loss / dp  # DDP/FSDP average gradients over ranks
    (grad,) = torch.autograd.grad(objective, logp)
    torch.testing.assert_close(objective.detach(), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


def test_native_mass_through_token_sum_reproduces_verls_own_aggregation():
    """mass=native: the weights are exactly verl's agg_loss over the mini-batch (global normalisers)."""
    logp, old, adv, mask, group, traj = _minibatch(seed=6)
    mask[:, 0] = True  # verl's seq-mean divides by global_batch_size, which counts empty rows too
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        ell = torch.randn(mask.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
        weights = core.token_weights(mask, group, traj, reducer=mode, mass="native")
        verl_total = sum(
            agg_loss(ell[idx], mask[idx], mode, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=mask.shape[0])
            for idx in _splits(mask.shape[0], seed=8)
        )
        ours = sum(agg_loss(ell[idx] * weights[idx], mask[idx], "token-sum") for idx in _splits(mask.shape[0], seed=9))
        torch.testing.assert_close(ours, verl_total, rtol=1e-6, atol=1e-9)  # verl adds 1e-8 to n_r in seq-mean-token-mean


def test_per_micro_batch_normalisation_is_not_exact():
    """Why oma refuses other loss_agg_modes: verl's local token-mean renormalises each micro-batch."""
    logp, old, adv, mask, group, traj = _minibatch(seed=10)
    weights = core.token_weights(mask, group, traj)
    expected, _ = _oma_reference("vanilla", logp, old, adv, mask, weights)
    cfg = _config("vanilla")
    cfg.global_batch_info.clear()
    total = sum(
        get_policy_loss_fn("vanilla")(old[idx], logp[idx], adv.unsqueeze(-1)[idx] * weights[idx], mask[idx], "token-mean", cfg)[0]
        for idx in _splits(mask.shape[0], seed=11)
    )
    assert not torch.allclose(total.detach(), expected, rtol=1e-3)
