"""A verl-agent batch built the way verl-agent builds one, and verl-agent's advantages recomputed
by plain loops: the independent reference of ``oma audit --from verl-agent``.

Written from verl-agent's documented pipeline (``RayPPOTrainer.fit``), not from oma:

1. rollout: one row per step, trajectories in order, ``episode_rewards`` (the episode's summed
   reward) stamped on every row, per-step ``rewards``, ``is_action_valid``, ``anchor_obs``;
2. ``compute_step_discounted_returns``: ``step_rewards`` = discounted return of the step inside its
   ``traj_uid``, before padding;
3. ``adjust_batch(mode="copy")``: copies of randomly chosen rows (without replacement) appended
   until the row count divides ``divisor``;
4. ``balance_batch``: the rows reordered;
5. ``apply_invalid_action_penalty``: each row's score (``token_level_scores.sum(-1)``) is
   ``episode_rewards − C·(1 − is_action_valid)``, and ``step_rewards`` lose C·(1 − valid) in place;
6. advantages: GRPO's mean/std over every row of a ``uid`` (copies included;
   ``compute_mean_std_cross_steps=True``), GiGPO's episode term the same and its step term over
   the rows of a ``uid`` with equal ``anchor_obs`` (a one-row step group gives 0). Sample std
   (n − 1), ε = 1e-6; ``mean_norm`` drops the division. RLOO: n/(n − 1)·(s − mean) over the rows of
   a ``uid``, a one-row ``uid`` keeping its score;
7. the actor (verl 0.3.1 ``DataParallelPPOActor.update_policy``): ``dp`` contiguous chunks; each
   rank cuts its chunk into mini-batches of ``mini_rows // dp`` rows (one optimizer step, the ranks'
   losses averaged) and those into micro-batches of ``micro_rows`` rows (``use_dynamic_bsz``: by
   tokens, here any partition); a micro-batch's loss is ``agg_loss(ℓ, mask, loss_agg_mode)`` over
   its rows, divided by the micro-batches per mini-batch (``use_dynamic_bsz``: times its rows over
   the mini-batch rows). ℓ is PPO-clip with dual clip, or GSPO's sequence ratio aggregated by
   ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6


def simulate(seed: int, *, groups: int = 6, n: int = 4, divisor: int = 16, coef: float = 0.1,
             gamma: float = 0.95, p_invalid: float = 0.15) -> dict[str, np.ndarray]:
    """Columns of one dumped batch (after step 5) plus ``score`` (verl-agent's row score), ``is_copy``
    (the appended rows) and ``row_id`` (each row's index before the padding), as numpy arrays."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("uid", "traj_uid", "episode_rewards", "rewards", "is_action_valid",
                                             "anchor_obs", "response_tokens", "row_hash", "step_rewards")}
    for g in range(groups):
        uid = f"{rng.integers(16**8):08x}-uid-{g}"
        for e in range(n):
            traj_uid = f"{rng.integers(16**8):08x}-traj-{g}-{e}"
            won = bool(rng.random() < 0.5)
            steps = int(rng.integers(2, 5)) if won else int(rng.integers(4, 9))
            rewards = [0.0] * steps
            if won:
                rewards[-1] = 10.0
            returns, running = [0.0] * steps, 0.0
            for k in reversed(range(steps)):
                running = rewards[k] + gamma * running
                returns[k] = running
            room = 0
            for k in range(steps):
                cols["uid"].append(uid)
                cols["traj_uid"].append(traj_uid)
                cols["episode_rewards"].append(sum(rewards))
                cols["rewards"].append(rewards[k])
                cols["is_action_valid"].append(bool(rng.random() >= p_invalid))
                cols["anchor_obs"].append(f"task {g}: you are in room {room}.")
                cols["response_tokens"].append(int(rng.integers(3, 30)))
                cols["row_hash"].append(f"{rng.integers(2**62):016x}")
                cols["step_rewards"].append(returns[k])
                room = int(rng.integers(0, 3))
    rows = len(cols["uid"])
    to_add = (divisor - rows % divisor) % divisor
    picked = rng.choice(rows, size=to_add, replace=False)
    order = np.concatenate([np.arange(rows), picked])
    is_copy = np.concatenate([np.zeros(rows, bool), np.ones(to_add, bool)])
    shuffle = rng.permutation(order.shape[0])
    out = {k: np.asarray(v)[order][shuffle] for k, v in cols.items()}
    out["is_copy"] = is_copy[shuffle]
    out["row_id"] = order[shuffle]  # the row's index before adjust_batch: a copy repeats its original's
    invalid = (~out["is_action_valid"]).astype(np.float64)
    out["score"] = out["episode_rewards"] - coef * invalid
    out["step_rewards"] = out["step_rewards"] - coef * invalid
    out["copies_added"] = np.asarray(to_add)
    return out


def _normalise(values: np.ndarray, keys: list, std: bool, singleton_mean: str) -> np.ndarray:
    buckets: dict[object, list[int]] = {}
    for i, k in enumerate(keys):
        buckets.setdefault(k, []).append(i)
    out = np.empty_like(values)
    for idx in buckets.values():
        v = values[idx]
        if len(idx) == 1:
            mean, sd = (0.0 if singleton_mean == "zero" else float(v[0])), 1.0
        else:
            mean, sd = float(np.mean(v)), float(np.std(v, ddof=1))
        out[idx] = (v - mean) / (sd + EPS) if std else v - mean
    return out


def grpo(batch: dict[str, np.ndarray], *, std: bool = True) -> np.ndarray:
    """verl-agent's ``compute_grpo_outcome_advantage`` per row (every row of a uid is a member)."""
    return _normalise(batch["score"], list(batch["uid"]), std, singleton_mean="zero")


def gigpo(batch: dict[str, np.ndarray], *, std: bool = False, w: float = 1.0) -> np.ndarray:
    """verl-agent's ``compute_gigpo_outcome_advantage`` per row (``mean_norm`` unless ``std``)."""
    episode = _normalise(batch["score"], list(batch["uid"]), std, singleton_mean="zero")
    keys = list(zip(batch["uid"], batch["anchor_obs"], strict=True))
    step = _normalise(batch["step_rewards"], keys, std, singleton_mean="own")
    return episode + w * step


def rloo(batch: dict[str, np.ndarray]) -> np.ndarray:
    """verl-agent's ``compute_rloo_outcome_advantage`` per row (every row of a uid is a member)."""
    members: dict[object, list[float]] = {}
    for uid, s in zip(batch["uid"], batch["score"], strict=True):
        members.setdefault(uid, []).append(float(s))
    out = np.empty(len(batch["score"]))
    for r, (uid, s) in enumerate(zip(batch["uid"], batch["score"], strict=True)):
        n = len(members[uid])
        out[r] = s * n / (n - 1) - np.mean(members[uid]) * n / (n - 1) if n > 1 else s
    return out


def _outcome_normalise(outcomes: dict, std: bool, rloo: bool = False) -> dict:
    """OA's group statistics over members {key: (group, value)}: each member once; a group of one member or
    of equal values gives 0 (its spread holds no comparison)."""
    by_group: dict[object, list] = {}
    for key, (g, v) in outcomes.items():
        by_group.setdefault(g, []).append((key, v))
    out = {}
    for members in by_group.values():
        values = np.asarray([v for _, v in members])
        n = len(values)
        for key, v in members:
            if n < 2 or values.max() == values.min():
                out[key] = 0.0
            elif rloo:
                out[key] = n / (n - 1) * (v - values.mean())
            else:
                out[key] = (v - values.mean()) / (np.std(values, ddof=1) + EPS) if std else v - values.mean()
    return out


def outcome_aligned(batch: dict[str, np.ndarray], estimator: str, *, std: bool = True, w: float = 1.0) -> np.ndarray:
    """OA on the batch by loops: the copies left out, each episode's outcome (the mean of its rows' scores)
    counted once in its ``uid``; GiGPO's step term over the rows of a ``uid`` in one ``anchor_obs``; a copy
    takes its original's advantage (``row_id``)."""
    keep = ~batch["is_copy"]
    rows: dict[object, list[float]] = {}
    for t, s in zip(batch["traj_uid"][keep], batch["score"][keep], strict=True):
        rows.setdefault(t, []).append(float(s))
    uid_of = dict(zip(batch["traj_uid"], batch["uid"], strict=True))
    episode = _outcome_normalise({t: (uid_of[t], float(np.mean(v))) for t, v in rows.items()}, std, estimator == "rloo")
    adv = {r: episode[t] for r, t, k in zip(batch["row_id"], batch["traj_uid"], keep, strict=True) if k}
    if estimator == "gigpo":
        step = _outcome_normalise({r: ((u, a), float(g)) for r, u, a, g, k in zip(
            batch["row_id"], batch["uid"], batch["anchor_obs"], batch["step_rewards"], keep, strict=True) if k}, std)
        adv = {r: a + w * step[r] for r, a in adv.items()}
    return np.asarray([adv[r] for r in batch["row_id"]])


def trajectory_mass(batch: dict[str, np.ndarray], mass: str, total: float) -> dict:
    """MA by loops: the step's ``total`` weight split equally over the episodes (``uniform``), or equally over
    the ``uid`` groups and then over each group's episodes (``group``); copies carry none."""
    keep = ~batch["is_copy"]
    episodes: dict[object, set] = {}
    for u, t in zip(batch["uid"][keep], batch["traj_uid"][keep], strict=True):
        episodes.setdefault(u, set()).add(t)
    count = sum(len(ts) for ts in episodes.values())
    return {t: total / count if mass == "uniform" else total / len(episodes) / len(ts)
            for ts in episodes.values() for t in ts}


def tensors(batch: dict[str, np.ndarray], width: int = 32) -> dict[str, np.ndarray]:
    """The batch's ``response_mask`` [R, width] (``response_tokens`` valid tokens, then padding) and
    ``token_level_rewards`` [R, width]: the reward manager puts ``episode_rewards`` on the last valid
    token, ``apply_invalid_action_penalty`` subtracts C·(1 − valid) there (``score`` holds the result),
    and ``input_ids`` [R, 16 + width]: a prompt of the row's 16 ``row_hash`` characters, then its response
    (a copy repeats its original token for token, two steps never do)."""
    rows = len(batch["score"])
    mask = np.zeros((rows, width), dtype=bool)
    rewards = np.zeros((rows, width))
    input_ids = np.zeros((rows, 16 + width), dtype=np.int64)
    for r in range(rows):
        n = int(batch["response_tokens"][r])
        mask[r, :n] = True
        rewards[r, n - 1] = batch["score"][r]
        input_ids[r, :16] = [ord(c) for c in batch["row_hash"][r]]
        input_ids[r, 16:16 + n] = 7
    return {"response_mask": mask, "token_level_rewards": rewards, "input_ids": input_ids}


def micro_batches(rows: int, *, mini_rows: int, micro_rows: int, dp: int, partition=None) -> list[list]:
    """The row lists of the micro-batches of step 7, over every rank and mini-batch.
    ``partition(mini) -> list of row lists`` replaces the fixed micro-batches (``use_dynamic_bsz``)."""
    per_rank, local = rows // dp, mini_rows // dp
    out = []
    for d in range(dp):
        chunk = list(range(d * per_rank, (d + 1) * per_rank))
        for start in range(0, per_rank, local):
            mini = chunk[start:start + local]
            out += partition(mini) if partition else [mini[i:i + micro_rows] for i in range(0, len(mini), micro_rows)]
    return out


def _agg_coefficients(mask: np.ndarray, rows: list, mode: str) -> dict[int, float]:
    """Per row of one micro-batch, the coefficient ``agg_loss`` gives each of its valid tokens."""
    n = {r: float(mask[r].sum()) for r in rows}
    if mode == "token-mean":
        return {r: 1.0 / (sum(n.values()) + 1e-8) for r in rows}
    if mode == "seq-mean-token-sum":
        return {r: 1.0 / len(rows) for r in rows}
    if mode == "seq-mean-token-mean":
        return {r: 1.0 / (n[r] * len(rows)) for r in rows}
    return {r: 1.0 / mask.shape[1] for r in rows}  # seq-mean-token-sum-norm


def actor_token_weights(mask: np.ndarray, *, mini_rows: int, micro_rows: int, dp: int, loss_agg_mode: str,
                        partition=None) -> np.ndarray:
    """W [R, L]: what the actor multiplies each token loss by over the step (its losses summed over the
    optimizer steps are Σ W·ℓ)."""
    local = mini_rows // dp
    w = np.zeros(mask.shape)
    for m in micro_batches(mask.shape[0], mini_rows=mini_rows, micro_rows=micro_rows, dp=dp, partition=partition):
        scale = len(m) / local if partition else 1.0 / (local // micro_rows)
        for r, c in _agg_coefficients(mask, m, loss_agg_mode).items():
            w[r] = mask[r] * c * scale / dp
    return w


def token_losses(adv: np.ndarray, mask: np.ndarray, log_ratio: np.ndarray, loss_mode: str,
                 clip: float = 0.2, clip_c: float = 3.0) -> np.ndarray:
    """ℓ [R, L] of verl-agent's ``compute_policy_loss`` (PPO-clip, dual clip) or ``compute_policy_loss_gspo``
    from per-token advantages and log-ratios log π/π_old."""
    out = np.zeros(adv.shape)
    for r in range(adv.shape[0]):
        n = max(mask[r].sum(), 1)
        seq = min(float((log_ratio[r] * mask[r]).sum() / n), 10.0)
        for t in range(adv.shape[1]):
            a = adv[r, t]
            if loss_mode == "gspo":
                s = np.exp(seq)
                out[r, t] = max(-a * s, -a * min(max(s, 1 - clip), 1 + clip))
                continue
            ratio = np.exp(log_ratio[r, t])
            clipped = max(-a * ratio, -a * min(max(ratio, 1 - clip), 1 + clip))
            out[r, t] = min(-a * clip_c, clipped) if a < 0 else clipped
    return out


def actor_loss(adv: np.ndarray, mask: np.ndarray, log_ratio: np.ndarray, *, mini_rows: int, micro_rows: int, dp: int,
               loss_agg_mode: str, loss_mode: str = "vanilla", partition=None) -> float:
    """The actor's loss summed over the step's optimizer steps, from the batch's ``advantages`` [R, L]: per
    optimizer step the mean over ranks of Σ_micro agg_loss(ℓ)/GA (``use_dynamic_bsz``: × rows/mini rows)."""
    ell = token_losses(adv, mask, log_ratio, loss_mode)
    mode = "seq-mean-token-mean" if loss_mode == "gspo" else loss_agg_mode
    local, total = mini_rows // dp, 0.0
    for m in micro_batches(mask.shape[0], mini_rows=mini_rows, micro_rows=micro_rows, dp=dp, partition=partition):
        scale = len(m) / local if partition else 1.0 / (local // micro_rows)
        if mode == "token-mean":
            agg = sum((ell[r] * mask[r]).sum() for r in m) / (sum(mask[r].sum() for r in m) + 1e-8)
        elif mode == "seq-mean-token-sum":
            agg = np.mean([(ell[r] * mask[r]).sum() for r in m])
        elif mode == "seq-mean-token-mean":
            agg = np.mean([(ell[r] * mask[r]).sum() / mask[r].sum() for r in m])
        else:
            agg = sum((ell[r] * mask[r]).sum() for r in m) / mask.shape[1]
        total += agg * scale / dp
    return float(total)


def figures(batch: dict[str, np.ndarray], adv: np.ndarray) -> dict[str, object]:
    """Token-mean figures of one advantage vector, by loops: each row's share ω_r = n_r / Σ n."""
    omega = batch["response_tokens"] / batch["response_tokens"].sum()
    success = {}
    push: dict[str, float] = {}
    adv_rows: dict[str, list[float]] = {}
    group_push: dict[str, float] = {}
    for r in range(len(adv)):
        t = batch["traj_uid"][r]
        success[t] = batch["episode_rewards"][r] > 0
        push[t] = push.get(t, 0.0) + omega[r] * adv[r]
        adv_rows.setdefault(t, []).append(adv[r])
        group_push[batch["uid"][r]] = group_push.get(batch["uid"][r], 0.0) + omega[r] * adv[r]
    mean_adv = {t: float(np.mean(v)) for t, v in adv_rows.items()}
    return {
        "traj_push": push,
        "mass_share_success": float(sum(omega[r] for r in range(len(adv)) if success[batch["traj_uid"][r]])),
        "advantage_success_mean": float(np.mean([mean_adv[t] for t in mean_adv if success[t]])),
        "advantage_failure_mean": float(np.mean([mean_adv[t] for t in mean_adv if not success[t]])),
        "net_push": float(sum(group_push.values())),
        "groups_pushed_up": sum(1 for v in group_push.values() if v > 1e-12),
        "groups_pushed_down": sum(1 for v in group_push.values() if v < -1e-12),
        "copy_mass": float(omega[batch["is_copy"]].sum()),
    }


def write(batch: dict[str, np.ndarray], path, *,
          drop: tuple[str, ...] = ("score", "is_copy", "copies_added", "row_id")) -> None:
    """The dump as docs/audit.md#verl-agent-batches writes it (Parquet or JSONL by extension)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    data = {k: v for k, v in batch.items() if k not in drop}
    if str(path).endswith(".parquet"):
        pq.write_table(pa.table(data), path)
    else:
        with open(path, "w", encoding="utf-8") as fh:
            for r in range(len(data["uid"])):
                fh.write(json.dumps({k: v[r].item() if hasattr(v[r], "item") else v[r] for k, v in data.items()}) + "\n")
