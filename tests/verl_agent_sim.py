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
   (n − 1), ε = 1e-6; ``mean_norm`` drops the division.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6


def simulate(seed: int, *, groups: int = 6, n: int = 4, divisor: int = 16, coef: float = 0.1,
             gamma: float = 0.95, p_invalid: float = 0.15) -> dict[str, np.ndarray]:
    """Columns of one dumped batch (after step 5) plus ``score`` (verl-agent's row score) and
    ``is_copy`` (the appended rows), as numpy arrays."""
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


def write(batch: dict[str, np.ndarray], path, *, drop: tuple[str, ...] = ("score", "is_copy", "copies_added")) -> None:
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
