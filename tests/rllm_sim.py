"""An independent reimplementation of what rLLM (commit 9beb6e0f) and verl 0.8.0's engine loss compute on one
step, written from their source in plain loops; it shares no code with oma.core, oma.hosts or
oma.integrations.rllm, so the integration's tests compare two implementations.

* :func:`transform`: ``rllm/trainer/verl/transform.py``'s ``_process_trajectory``: a step whose prompt extends
  the running sequence merges into the row (its observation tokens masked 0), else it starts a new row;
  every row carries ``step_ids`` = the trajectory's uid and ``trajectory_ids`` = ``f"{task_id}_{name}"``;
  ``traj_rewards`` puts the trajectory's reward on the row's last response token.
* :func:`advantages_by_uid`: ``rllm/trainer/algorithms/advantage.py`` and ``rl_algo.py``: groups by
  ``f"{task_id}:{name}"``, one reward per trajectory; GRPO with the population std (``np.std``) and a
  singleton group's mean 0, std 1; RLOO; REINFORCE.
* :func:`broadcast`: ``update_dataproto_with_advantages``: the trajectory's scalar on each row's response mask.
* :func:`pad`: verl's ``pad_dataproto_to_divisor`` (repeats the first rows) and rLLM's neutralising of them.
* :func:`loss_coefficients`: d(loss)/d(ℓ) of verl 0.8.0's actor over the step: contiguous rank chunks,
  mini-batches, micro-batches, ``agg_loss`` with the global token count / ``global_batch_size`` times
  ``dp_size``, ranks' gradients averaged; by autograd through that loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Step:
    prompt: list[int]
    completion: list[int]


@dataclass
class Trajectory:
    uid: str
    name: str
    reward: float
    steps: list[Step] = field(default_factory=list)


@dataclass
class Episode:
    task_id: str
    trajectories: list[Trajectory]


def transform(episodes: list[Episode], width: int) -> dict:
    rows: dict = {"step_ids": [], "trajectory_ids": [], "mask": [], "reward": [], "steps_per_row": []}
    for ep in episodes:
        for traj in ep.trajectories:
            if not traj.steps:
                continue
            segments = []
            seg = None
            for step in traj.steps:
                if seg is not None and len(step.prompt) >= len(seg["full"]) and step.prompt[:len(seg["full"])] == seg["full"]:
                    obs = step.prompt[len(seg["full"]):]
                    seg["mask"] += [0] * len(obs) + [1] * len(step.completion)
                    seg["full"] += obs + step.completion
                    seg["steps"] += 1
                else:
                    seg = {"mask": [1] * len(step.completion), "full": step.prompt + step.completion, "steps": 1}
                    segments.append(seg)
            for seg in segments:
                rows["step_ids"].append(traj.uid)
                rows["trajectory_ids"].append(f"{ep.task_id}_{traj.name}")
                rows["mask"].append(seg["mask"])
                rows["reward"].append(traj.reward)
                rows["steps_per_row"].append(seg["steps"])
    n = len(rows["mask"])
    mask = torch.zeros(n, width)
    rewards = torch.zeros(n, width)
    for i, m in enumerate(rows["mask"]):
        assert len(m) <= width
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.float32)
        rewards[i, len(m) - 1] = rows["reward"][i]
    return {"step_ids": list(rows["step_ids"]), "trajectory_ids": list(rows["trajectory_ids"]),
            "response_mask": mask, "traj_rewards": rewards, "is_pad_step": [False] * n,
            "steps_per_row": rows["steps_per_row"]}


def _pstd(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def advantages_by_uid(episodes: list[Episode], estimator: str = "grpo", norm_by_std: bool = True) -> dict[str, float]:
    groups: dict[str, list[Trajectory]] = {}
    for ep in episodes:
        for traj in ep.trajectories:
            if traj.steps:
                groups.setdefault(f"{ep.task_id}:{traj.name}", []).append(traj)
    out = {}
    for trajs in groups.values():
        r = [t.reward for t in trajs]
        n = len(r)
        for t, x in zip(trajs, r, strict=True):
            if estimator == "grpo":
                mean, std = (0.0, 1.0) if n <= 1 else (sum(r) / n, _pstd(r))
                out[t.uid] = (x - mean) / (std + 1e-6) if norm_by_std else x - mean
            elif estimator == "rloo":
                out[t.uid] = x if n <= 1 else n / (n - 1) * (x - sum(r) / n)
            else:  # reinforce
                out[t.uid] = x
    return out


def broadcast(batch: dict, adv: dict[str, float]) -> torch.Tensor:
    a = torch.zeros(batch["response_mask"].shape)
    for i, uid in enumerate(batch["step_ids"]):
        a[i] = (0.0 if batch["is_pad_step"][i] else adv.get(str(uid), 0.0)) * batch["response_mask"][i]
    return a


def pad(batch: dict, divisor: int) -> dict:
    n = len(batch["step_ids"])
    extra = (divisor - n % divisor) % divisor
    take = [i % n for i in range(extra)]
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = torch.cat([value, value[take]]) if extra else value.clone()
        else:
            out[key] = list(value) + [value[i] for i in take]
    out["response_mask"][n:] = 0
    out["is_pad_step"] = [False] * n + [True] * extra
    return out


def _agg(loss: torch.Tensor, mask: torch.Tensor, mode: str, dp: int, tokens: float, gbs: float, lsf: float | None):
    if mode == "token-mean":
        return (loss * mask).sum() / tokens * dp
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq = (loss * mask).sum(-1)
        seq_mask = (mask.sum(-1) > 0).float()
        out = (seq * seq_mask).sum() / gbs * dp
        return out / (lsf if lsf is not None else mask.shape[-1]) if mode == "seq-mean-token-sum-norm" else out
    n = mask.sum(-1)
    seq = (loss * mask).sum(-1) / (n + 1e-8)
    return (seq * (n > 0).float()).sum() / gbs * dp


def loss_coefficients(mask: torch.Tensor, *, mode: str, dp: int, mini_rows: int, micro_rows: int, gbs: int,
                      lsf: float | None = None) -> torch.Tensor:
    rows = mask.shape[0]
    ell = torch.ones(mask.shape, dtype=torch.float64, requires_grad=True)
    per_rank = rows // dp
    local_mini = mini_rows // dp
    total = torch.zeros((), dtype=torch.float64)
    for j in range(per_rank // local_mini):  # optimizer step j
        ranks = [list(range(d * per_rank + j * local_mini, d * per_rank + (j + 1) * local_mini)) for d in range(dp)]
        tokens = float(sum(mask[i].sum() for rk in ranks for i in rk))  # all-reduced over the dp group
        for rk in ranks:
            rank_loss = torch.zeros((), dtype=torch.float64)
            for s in range(0, len(rk), micro_rows):
                idx = rk[s:s + micro_rows]
                rank_loss = rank_loss + _agg(ell[idx], mask[idx].double(), mode, dp, tokens, gbs, lsf)
            total = total + rank_loss / dp  # the ranks' gradients are averaged
    total.backward()
    return ell.grad
