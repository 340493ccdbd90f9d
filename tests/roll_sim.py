"""A ROLL agentic batch built the way ROLL's pipeline builds one, and what ROLL computes from it, by plain
loops: the independent reference of oma's ROLL integration. Shares no code with oma.

Written from ROLL's source at commit 8eb27cc2dc34c4d1310b169d9b86d339004d811a (``roll/pipeline/agentic``):

1. rollout (``StepEnvManager``): one row per agent step; ``traj_group_id`` (the group), ``traj_id`` (the
   episode), ``step``, ``episode_scores`` (the episode's outcome on every row), ``step_scores`` (the env's
   reward for the step), ``state_hash``, the tensor ``scores`` (0 but the step's reward on the row's last
   token), ``response_mask`` over ``input_ids`` (the loss reads ``[:, 1:]``);
2. ``sample_uuid = f"{traj_id}_{i}"`` for row i (``AgenticPipeline.run``, right after ``get_batch``);
3. ``compute_discounted_returns`` (GiGPO): ``step_rewards`` = Σ_{j≥k} γ^{j−k} step_scores_j in its ``traj_id``
   ordered by ``step``, with ``step_reward_gamma``;
4. ``adjust_batch(mode="copy")``: copies of random rows (without replacement while enough) appended;
5. ``compute_response_level_rewards`` → ``agentic_reward_norm``: grpo/reinforce normalise each row's
   ``scores.sum(-1)`` over the rows of its ``traj_group_id`` (copies included): (x − μ)/(σ + 1e-6) with the
   sample σ, 0 when σ ≤ 1e-6 or the group has one row (``mean_std``); x − μ (``mean``). GiGPO: episode term
   the same on ``episode_scores``; step term on ``step_rewards`` over rows with equal ``state_hash``, whatever
   their group (``build_state_group`` then grouping by ``state_group_id`` = the hash); summed with
   ``episode_reward_weight`` and ``step_reward_weight``;
6. ``compute_token_reward`` + ``agentic_compute_advantage``: the response-level reward on the row's last
   token, ``compute_reinforce_return`` with γ (1 by default) back over the row, times the loss mask;
7. the actor (``ActorWorker.train_step`` → strategy ``train_step`` → ``loss_func`` → ``agg_loss``): the rows
   shuffled, cut into backward batches of ``dp × per_device × GA`` rows (one optimizer step); on each rank
   micro-batches of ``per_device`` rows; each micro-batch's loss is ``agg_loss`` with the backward batch's
   token count T and valid-row count G, times ``loss_scale`` = GA·dp, over GA, and the ranks' gradients
   averaged.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch

NORM_EPS = 1e-6
COUNT_EPS = 1e-8


def rollout(seed: int, *, groups: int = 3, n: int = 3, max_steps: int = 4, length: int = 6, string_ids: bool = True,
            binary: bool = True, shared_states: bool = False) -> dict[str, list]:
    """Rows of one rollout, in ROLL's order (trajectories one after another). ``shared_states``: state hashes
    that recur across groups (the same start state in two tasks)."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {k: [] for k in ("traj_group_id", "traj_id", "step", "episode_scores", "step_scores",
                                             "state_hash", "response_mask", "scores")}
    for g in range(groups):
        gid = f"sokoban_{g}_0_{1000 + g}" if string_ids else g
        for e in range(n):
            tid = f"{gid}_{e}" if string_ids else g * 100 + e
            steps = int(rng.integers(1, max_steps + 1))
            outcome = float(rng.integers(0, 2)) if binary else float(np.round(rng.normal(), 3))
            for k in range(steps):
                reward = float(np.round(rng.normal(scale=0.5), 3))
                n_tokens = int(rng.integers(1, length))
                mask = [0] * (1 + length)  # one prompt position first: the loss reads [:, 1:]
                start = int(rng.integers(1, 1 + length - n_tokens + 1))
                for t in range(start, start + n_tokens):
                    mask[t] = 1
                score = [0.0] * (1 + length)
                score[start + n_tokens - 1] = reward
                state = f"s{k}_{int(rng.integers(0, 2))}" if shared_states else f"{gid}|s{k}_{int(rng.integers(0, 2))}"
                for key, value in (("traj_group_id", gid), ("traj_id", tid), ("step", k), ("episode_scores", outcome),
                                   ("step_scores", reward), ("state_hash", state), ("response_mask", mask),
                                   ("scores", score)):
                    rows[key].append(value)
    rows["sample_uuid"] = [f"{t}_{i}" for i, t in enumerate(rows["traj_id"])]
    return rows


def discounted_returns(rows: dict[str, list], gamma: float) -> list[float]:
    out = [0.0] * len(rows["traj_id"])
    for tid in dict.fromkeys(rows["traj_id"]):
        members = sorted((rows["step"][i], i) for i in range(len(out)) if rows["traj_id"][i] == tid)
        running = 0.0
        for _, i in reversed(members):
            running = rows["step_scores"][i] + gamma * running
            out[i] = running
    return out


def adjust_batch_copy(rows: dict[str, list], divisor: int, seed: int) -> tuple[dict[str, list], list[bool]]:
    size = len(rows["traj_id"])
    threshold = size % divisor
    if threshold == 0:
        return rows, [False] * size
    to_add = divisor - threshold
    rng = np.random.default_rng(seed + 7)
    picks = rng.choice(size, to_add, replace=to_add > size)
    out = {k: list(v) + [v[int(i)] for i in picks] for k, v in rows.items()}
    return out, [False] * size + [True] * to_add


def reward_norm(values: list[float], keys: list, mean_type: str | None, std_type: str | None) -> list[float]:
    """``agentic_reward_norm`` with group statistics (grouping by ``keys``)."""
    out = [0.0] * len(values)
    for key in dict.fromkeys(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        xs = [values[i] for i in idx]
        mean = sum(xs) / len(xs) if mean_type == "group" else 0.0
        if std_type == "group":
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
            for i, x in zip(idx, xs):
                out[i] = (x - mean) / (std + NORM_EPS) if len(xs) > 1 and std > NORM_EPS else 0.0
        else:
            for i, x in zip(idx, xs):
                out[i] = x - mean
    return out


def roll_response_rewards(rows: dict[str, list], estimator: str, method: str, *, step_weight: float = 1.0,
                          episode_weight: float = 1.0) -> list[float]:
    """``compute_response_level_rewards`` with ``grouping: traj_group_id`` and ``method`` mean or mean_std."""
    std = "group" if method == "mean_std" else None
    if estimator in ("grpo", "reinforce"):
        return reward_norm([sum(s) for s in rows["scores"]], rows["traj_group_id"], "group", std)
    episode = reward_norm(list(rows["episode_scores"]), rows["traj_group_id"], "group", std)
    step = reward_norm(list(rows["step_rewards"]), rows["state_hash"], "group", std)
    return [episode_weight * e + step_weight * s for e, s in zip(episode, step)]


def roll_token_advantages(rows: dict[str, list], response: list[float], gamma: float = 1.0) -> list[list[float]]:
    """The reward on the row's last response token, discounted back with γ, on the loss mask."""
    out = []
    for mask, r in zip(rows["response_mask"], response):
        m = mask[1:]
        last = max(t for t, v in enumerate(m) if v)
        rewards = [0.0] * len(m)
        rewards[last] = r
        running, adv = 0.0, [0.0] * len(m)
        for t in reversed(range(len(m))):
            running = rewards[t] + gamma * running
            adv[t] = running * m[t]
        out.append(adv)
    return out


def oa_response_rewards(rows: dict[str, list], is_copy: list[bool], estimator: str, method: str, *,
                        step_weight: float = 1.0) -> list[float]:
    """Outcome Alignment by hand: the group statistics over unique trajectories (each counted once, by its
    ``episode_scores``), copies left out; GiGPO's step term over the non-copy rows of a group in one state; a
    copy takes its original's advantage."""
    std = method == "mean_std"
    kept = [i for i, c in enumerate(is_copy) if not c]
    episode: dict = {}
    for gid in dict.fromkeys(rows["traj_group_id"][i] for i in kept):
        trajs = list(dict.fromkeys(rows["traj_id"][i] for i in kept if rows["traj_group_id"][i] == gid))
        outcome = {t: next(rows["episode_scores"][i] for i in kept if rows["traj_id"][i] == t) for t in trajs}
        xs = list(outcome.values())
        mean = sum(xs) / len(xs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        for t, x in outcome.items():
            flat = len(xs) < 2 or max(xs) == min(xs)
            episode[t] = 0.0 if flat else ((x - mean) / (sd + NORM_EPS) if std else x - mean)
    out = {i: episode[rows["traj_id"][i]] for i in kept}
    if estimator == "gigpo":
        for i in kept:
            same = [j for j in kept if rows["traj_group_id"][j] == rows["traj_group_id"][i]
                    and rows["state_hash"][j] == rows["state_hash"][i]]
            xs = [rows["step_rewards"][j] for j in same]
            mean = sum(xs) / len(xs)
            sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
            flat = len(xs) < 2 or max(xs) == min(xs)
            x = rows["step_rewards"][i]
            out[i] += step_weight * (0.0 if flat else ((x - mean) / (sd + NORM_EPS) if std else x - mean))
    first = {rows["sample_uuid"][i]: i for i in kept}
    return [out[i] if i in out else out[first[rows["sample_uuid"][i]]] for i in range(len(is_copy))]


def proto(rows: dict[str, list], order: list[int] | None = None) -> SimpleNamespace:
    """The batch as ROLL's ``DataProto`` holds it: tensors in ``batch``, numpy object arrays in
    ``non_tensor_batch``; rows in ``order`` (a reordering, as ``batch_balance`` makes one)."""
    order = list(range(len(rows["traj_id"]))) if order is None else order
    pick = lambda key: [rows[key][i] for i in order]  # noqa: E731
    tensors = {"response_mask": torch.tensor(pick("response_mask"), dtype=torch.int64),
               "scores": torch.tensor(pick("scores"), dtype=torch.float32)}
    if "step_rewards" in rows:
        tensors["step_rewards"] = torch.tensor(pick("step_rewards"), dtype=torch.float32)
    non_tensor = {k: np.array(pick(k), dtype=object) for k in ("traj_group_id", "traj_id", "step", "episode_scores",
                                                                "step_scores", "state_hash", "sample_uuid")}
    return SimpleNamespace(batch=tensors, non_tensor_batch=non_tensor, meta_info={})


def actor_layout(rows: int, *, dp: int, per_device: int, ga: int, seed: int) -> list[list[list[int]]]:
    """Backward batches (optimizer steps), each a list of micro-batches of row indices: the rows shuffled
    (``make_iterator(shuffle=True)``), cut into ``dp·per_device·ga`` rows; rank r holds a contiguous share."""
    perm = list(np.random.default_rng(seed).permutation(rows))
    step = dp * per_device * ga
    assert rows % step == 0, "adjust_batch pads the batch to a multiple of the backward batch"
    out = []
    for b in range(rows // step):
        chunk = perm[b * step:(b + 1) * step]
        local = [chunk[r * per_device * ga:(r + 1) * per_device * ga] for r in range(dp)]
        out.append([part[m * per_device:(m + 1) * per_device] for part in local for m in range(ga)])
    return out


def actor_factor(mask: list[list[int]], micro: list[int], backward: list[list[int]], mode: str, dp: int, ga: int) -> list[list[float]]:
    """Per token of micro-batch ``micro``, what the optimizer step multiplies its loss by: ``agg_loss``'s
    coefficient (counts over the backward batch) × loss_scale (ga·dp) / ga, over dp ranks averaged."""
    rows = [i for part in backward for i in part]
    tokens = sum(sum(mask[i]) for i in rows) or 1
    valid = sum(1 for i in rows if any(mask[i]))
    out = []
    for i in micro:
        n = sum(mask[i])
        if mode == "token-mean":
            c = 1.0 / tokens
        elif mode == "seq-mean-token-sum":
            c = 1.0 / (valid + COUNT_EPS)
        elif mode == "seq-mean-token-mean":
            c = 1.0 / (n + COUNT_EPS) / (valid + COUNT_EPS)
        else:
            c = 1.0 / len(mask[i])
        scale = (ga * dp) / ga / dp
        out.append([c * scale * v for v in mask[i]])
    return out


def micro_batch(batch: SimpleNamespace, micro: list[int], backward: list[list[int]]) -> SimpleNamespace:
    """A micro-batch as the strategy hands it to ``loss_func``: its rows, and the backward batch's counts
    (``_get_batch_num_tokens``, ``_get_global_valid_samples``: over response_mask[:, 1:], all ranks)."""
    rows = [i for part in backward for i in part]
    mask = batch.batch["response_mask"][:, 1:]
    tokens = int(sum(int(mask[i].sum()) for i in rows)) or 1
    valid = sum(1 for i in rows if bool(mask[i].any()))
    idx = torch.tensor(micro)
    return SimpleNamespace(batch={k: v.index_select(0, idx) for k, v in batch.batch.items()},
                           meta_info={"batch_num_tokens": {"response_mask": tokens},
                                      "global_valid_samples": {"default": len(rows), "response_mask": valid}})
