"""Shared builders for the verl integration tests: hand-built batches with verl's session keys (imported by the other test_verl_* modules)."""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf


def session_batch(rows_per_traj: list[list[int]], scores: list[list[float]], *, length: int = 4, seed: int = 0):
    """A stepwise batch: group g has trajectories with rows_per_traj[g][j] rows and outcome scores[g][j].

    Returns (keys, token_level_rewards [R, L] with the score on the row's last valid token,
    response_mask [R, L] bool with 1..length valid tokens, group_index, traj_index, step_index).
    Keys are verl's ``{uid}_{session_id}_{index}``; uids contain underscores on purpose.
    """
    gen = torch.Generator().manual_seed(seed)
    keys, rewards, masks, g_idx, t_idx, s_idx = [], [], [], [], [], []
    traj = 0
    for g, (rows, outs) in enumerate(zip(rows_per_traj, scores, strict=True)):
        uid = f"task_{g}_uuid{g:04d}"
        for session, (k, score) in enumerate(zip(rows, outs, strict=True)):
            for step in range(k):
                n_tok = int(torch.randint(1, length + 1, (1,), generator=gen))
                mask = torch.zeros(length, dtype=torch.bool)
                mask[:n_tok] = True
                reward = torch.zeros(length)
                reward[n_tok - 1] = score
                keys.append(f"{uid}_{session}_{step}")
                rewards.append(reward)
                masks.append(mask)
                g_idx.append(g)
                t_idx.append(traj)
                s_idx.append(step)
            traj += 1
    return (
        keys,
        torch.stack(rewards),
        torch.stack(masks),
        torch.tensor(g_idx),
        torch.tensor(t_idx),
        torch.tensor(s_idx),
    )


def test_session_batch_keys_round_trip():
    from oma.integrations.verl.batch import host_step

    keys, rewards, mask, g, t, s = session_batch([[2, 1], [3]], [[1.0, 0.0], [5.0]])
    step = host_step(keys, rewards, mask)
    assert torch.equal(step.group_index, g) and torch.equal(step.traj_index, t) and torch.equal(step.step_index, s)
    assert rewards.sum(-1).tolist() == [1.0, 1.0, 0.0, 5.0, 5.0, 5.0] and bool(mask.any(-1).all())


def random_rows(rows=40, length=6, groups=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.arange(rows) % groups  # every group has >= 2 rows
    mask = torch.rand(rows, length, generator=gen) < 0.8
    mask[:, 0] = True
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), length - 1] = torch.randint(0, 3, (rows,), generator=gen).float()
    uid = np.array([f"uid-{int(x)}" for x in g], dtype=object)
    return rewards, mask.float(), uid


def trainer_config(**actor):
    base = {
        "algorithm": {"adv_estimator": "oma_grpo", "use_kl_in_reward": False, "kl_penalty": "kl", "oma": {}},
        "actor_rollout_ref": {
            "actor": {"loss_agg_mode": "token-sum", "ppo_mini_batch_size": 2, "shuffle": False, "use_kl_loss": False,
                      "entropy_coeff": 0.0, "policy_loss": {"loss_mode": "vanilla"}, "loss_scale_factor": None},
            "rollout": {"n": 4},
        },
        "trainer": {"v1": {"trainer_mode": "oma_sync"}},
    }
    base["actor_rollout_ref"]["actor"].update(actor)
    return OmegaConf.create(base)
