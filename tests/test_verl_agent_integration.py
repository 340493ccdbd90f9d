"""oma.integrations.verl_agent: against verl-agent's computation redone by loops (tests/verl_agent_sim.py,
which shares no code with oma), against oma.core on the batch without its padding copies, by hand, and its
refusals (nothing written before one)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import verl_agent_sim as sim
from omegaconf import OmegaConf

from oma import core, hosts
from oma.integrations.verl_agent import ActorLoss, VerlAgentConfigError, align_batch, check_config, compute_advantage
from oma.integrations.verl_agent.__main__ import main as check_main
from oma.integrations.verl_agent.batch import ids

SEEDS = (0, 1, 2)
LAYOUTS = {  # the sim's batches have a multiple of 16 rows, as adjust_batch would make them
    "dp2-mini48-micro8": {"mini_rows": 48, "micro_rows": 8, "dp": 2},
    "dp2-mini32-micro4": {"mini_rows": 32, "micro_rows": 4, "dp": 2},
    "dp1-mini64-micro16": {"mini_rows": 64, "micro_rows": 16, "dp": 1},
}
VERL_AGENT = {  # estimator → (oma options, verl-agent's advantages by loops)
    "grpo": ({"estimator": "grpo"}, lambda b: sim.grpo(b, std=True)),
    "grpo-no-std": ({"estimator": "grpo", "norm_by_std": False}, lambda b: sim.grpo(b, std=False)),
    "rloo": ({"estimator": "rloo"}, sim.rloo),
    "gigpo-mean_norm": ({"estimator": "gigpo", "norm_by_std": False}, lambda b: sim.gigpo(b, std=False)),
    "gigpo-mean_std_norm": ({"estimator": "gigpo", "norm_by_std": True}, lambda b: sim.gigpo(b, std=True)),
}


def columns(batch: dict, *, scores: str = "token_level_rewards", copies: str | None = "row_id") -> dict:
    """The batch by verl-agent's column names, its score as the trainer holds it or as dumped."""
    t = sim.tensors(batch)
    cols = {k: batch[k] for k in ("uid", "traj_uid", "episode_rewards", "is_action_valid", "anchor_obs", "step_rewards")}
    cols["response_mask"] = t["response_mask"]
    if scores == "token_level_rewards":
        cols["token_level_rewards"] = t["token_level_rewards"]
    if copies:
        cols[copies] = batch[copies]
    return cols


def actor(layout: dict, **kw) -> ActorLoss:
    return ActorLoss(mini_batch_rows=layout["mini_rows"], micro_batch_rows=layout["micro_rows"], dp=layout["dp"], **kw)


def per_trajectory(traj_uid, values) -> dict:
    out: dict = {}
    for t, v in zip(traj_uid, values, strict=True):
        out[t] = out.get(t, 0.0) + float(v)
    return out


# ---- row accounting, native mass: verl-agent's own numbers --------------------------------------


@pytest.mark.parametrize("scores", ["token_level_rewards", "episode_rewards"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("estimator", VERL_AGENT)
@pytest.mark.parametrize("seed", SEEDS)
def test_row_native_equals_verl_agent(seed, estimator, layout, scores):
    batch = sim.simulate(seed)
    assert batch["copies_added"] > 0 and (~batch["is_action_valid"]).any()
    opts, reference = VERL_AGENT[estimator]
    r = align_batch(columns(batch, scores=scores, copies=None), {**opts, "accounting": "row", "mass": "native"},
                    actor=actor(LAYOUTS[layout]))
    ref = reference(batch)
    mask = sim.tensors(batch)["response_mask"]
    assert r.adv.numpy() == pytest.approx(ref, abs=1e-6)
    assert r.advantages.numpy() == pytest.approx(ref[:, None] * mask, abs=1e-6)
    assert r.weights.numpy() == pytest.approx(sim.actor_token_weights(mask, **LAYOUTS[layout], loss_agg_mode="token-mean"),
                                              rel=1e-6, abs=1e-12)
    assert r.metrics["oma/padding_copies"] == 0  # no copy column: the baseline does not need one


# ---- the loss verl-agent's actor computes from oma's advantages ---------------------------------


def _partition(seed: int):
    """use_dynamic_bsz: the actor's micro-batches follow the tokens; any partition of a mini-batch."""
    rng = np.random.default_rng(seed)

    def cut(mini: list) -> list:
        edges = sorted(rng.choice(np.arange(1, len(mini)), size=min(2, len(mini) - 1), replace=False).tolist())
        return [part for part in np.split(np.asarray(mini), edges) if len(part)]
    return cut


CARRIERS = [  # (loss_agg_mode, loss_mode, dynamic_bsz)
    *[(mode, "vanilla", False) for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")],
    ("token-mean", "gspo", False),
    ("seq-mean-token-sum", "vanilla", True), ("seq-mean-token-mean", "vanilla", True), ("token-mean", "gspo", True),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("carrier", "mass"), [(c, m) for c in CARRIERS for m in ("uniform", "group", "native")
                                               if not (c[2] and m == "native")],  # dynamic: native W is approximate
                         ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple) else x)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_actor_minimises_sum_w_l(seed, carrier, mass, layout):
    """Σ over the step's optimizer steps of the loss verl-agent's actor makes from ``advantages`` equals
    Σ W·ℓ(A) with PPO-clip (dual clip) or GSPO token losses, for every aggregation it can carry."""
    mode, loss_mode, dynamic = carrier
    batch = sim.simulate(seed)
    mask = sim.tensors(batch)["response_mask"]
    r = align_batch(columns(batch), {"estimator": "gigpo", "mass": mass},
                    actor=actor(LAYOUTS[layout], loss_agg_mode=mode, loss_mode=loss_mode, dynamic_bsz=dynamic))
    log_ratio = np.random.default_rng(seed).normal(0.0, 0.3, mask.shape)
    got = sim.actor_loss(r.advantages.double().numpy(), mask, log_ratio, **LAYOUTS[layout], loss_agg_mode=mode,
                         loss_mode=loss_mode, partition=_partition(seed) if dynamic else None)
    adv = np.repeat(r.adv.numpy()[:, None], mask.shape[1], axis=1)
    want = float((r.weights.numpy() * sim.token_losses(adv, mask, log_ratio, loss_mode)).sum())
    assert got == pytest.approx(want, rel=1e-6, abs=1e-9)


# ---- OMA on: oma.core on the batch without its copies -------------------------------------------


def _without_copies(batch: dict) -> tuple[dict, np.ndarray]:
    keep = ~batch["is_copy"]
    return {k: np.asarray(v)[keep] for k, v in columns(batch).items()}, keep


@pytest.mark.parametrize("mass", ["uniform", "group"])
@pytest.mark.parametrize("reducer", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("seed", SEEDS)
def test_each_trajectorys_mass_is_oma_cores_whatever_the_minibatches(seed, reducer, mass):
    batch = sim.simulate(seed)
    kept, keep = _without_copies(batch)
    group, traj = ids(kept["uid"])[0], ids(kept["traj_uid"])[0]
    w = core.token_weights(torch.as_tensor(kept["response_mask"]), group, traj, reducer=reducer, mass=mass)
    want = per_trajectory(kept["traj_uid"], w.sum(-1))
    rows = len(batch["score"])
    for name, layout in LAYOUTS.items():
        r = align_batch(columns(batch), {"mass": mass, "reducer": reducer}, actor=actor(layout))
        assert not r.weights[r.is_copy].any(), name  # one row of each duplicate pair, either
        got = per_trajectory(batch["traj_uid"], r.weights.sum(-1))
        scale = rows / (layout["mini_rows"] // layout["dp"] * layout["dp"])  # the step's native total
        assert got.keys() == want.keys()
        for t in want:
            assert got[t] == pytest.approx(want[t] * scale, rel=1e-9), (name, t)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
@pytest.mark.parametrize("seed", SEEDS)
def test_oa_advantages_are_oma_cores_without_the_copies(seed, estimator):
    batch = sim.simulate(seed)
    kept, keep = _without_copies(batch)
    r = align_batch(columns(batch), {"estimator": estimator, "accounting": "trajectory"})
    group, traj = ids(kept["uid"])[0], ids(kept["traj_uid"])[0]
    s = torch.as_tensor(kept["token_level_rewards"]).sum(-1)
    if estimator == "gigpo":
        want = core.gigpo_advantages(s, torch.as_tensor(kept["step_rewards"]), core.anchor_ids(list(kept["anchor_obs"])),
                                     group, traj, torch.arange(len(s)), gamma=0.0)
    else:
        want = core.outcome_advantages(s, group, traj, estimator=estimator)
    assert r.adv[torch.as_tensor(keep)].numpy() == pytest.approx(want.numpy(), abs=1e-12)
    by_row_id: dict = {}
    for rid, a in zip(batch["row_id"], r.adv.tolist(), strict=True):
        by_row_id.setdefault(rid, set()).add(a)
    assert all(len(a) == 1 for a in by_row_id.values())  # a copy takes its original's advantage
    assert r.is_copy.sum() == batch["copies_added"] == r.metrics["oma/padding_copies"]


@pytest.mark.parametrize("estimator", ["grpo", "grpo-no-std", "rloo", "gigpo-mean_norm", "gigpo-mean_std_norm"])
@pytest.mark.parametrize("seed", SEEDS)
def test_oa_advantages_equal_an_independent_loop(seed, estimator):
    batch = sim.simulate(seed)
    opts = VERL_AGENT[estimator][0]
    r = align_batch(columns(batch), {**opts, "accounting": "trajectory"})
    want = sim.outcome_aligned(batch, opts["estimator"], std=opts.get("norm_by_std", opts["estimator"] != "gigpo"))
    assert r.adv.numpy() == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("mass", ["uniform", "group"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_each_trajectorys_mass_equals_an_independent_loop(seed, layout, mass):
    batch = sim.simulate(seed)
    lay = LAYOUTS[layout]
    r = align_batch(columns(batch), {"mass": mass}, actor=actor(lay))
    total = len(batch["score"]) / (lay["mini_rows"] // lay["dp"] * lay["dp"])  # the step's native total
    got, want = per_trajectory(batch["traj_uid"], r.weights.sum(-1)), sim.trajectory_mass(batch, mass, total)
    assert got.keys() == want.keys() and all(got[t] == pytest.approx(want[t], rel=1e-9) for t in want)


# ---- by hand ------------------------------------------------------------------------------------

# u1: episode A wins in 2 steps, episode B fails in 1 with an invalid action; u2: C wins in 1, D fails in 2.
# Row 6 is adjust_batch's copy of row 2.
BY_HAND = {
    "uid": ["u1", "u1", "u1", "u2", "u2", "u2", "u1"],
    "traj_uid": ["A", "A", "B", "C", "D", "D", "B"],
    "episode_rewards": [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0],
    "is_action_valid": [True, True, False, True, True, True, False],
    "response_mask": [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]],
    "row_id": [0, 1, 2, 3, 4, 5, 2],
}


def test_by_hand_the_baseline_counts_rows_and_copies():
    r = align_batch(BY_HAND, {"accounting": "row", "mass": "native"})
    # u1 over rows: 1, 1, -0.1, -0.1 (the copy counts): μ = 0.45, σ = 0.55·√(4/3); u2: 1, 0, 0: μ = 1/3, σ = 1/√3
    u1, u2 = 0.55 / (0.55 * (4 / 3) ** 0.5), 3**-0.5
    assert r.adv.tolist() == pytest.approx([u1, u1, -u1, (2 / 3) / u2, -(1 / 3) / u2, -(1 / 3) / u2, -u1], abs=1e-5)
    assert r.weights.unique().tolist() == pytest.approx([0.0, 1 / 17])  # token-mean over the 17 tokens, the copy's too


def test_by_hand_oma_counts_trajectories_and_gives_copies_no_mass():
    r = align_batch(BY_HAND, {})
    assert r.adv.tolist() == pytest.approx([2**-0.5, 2**-0.5, -(2**-0.5), 2**-0.5, -(2**-0.5), -(2**-0.5), -(2**-0.5)], abs=1e-5)
    # each of the 4 episodes carries 1/4 of the step (one optimizer step), spread over its tokens; the copy nothing
    assert r.weights.sum(-1).tolist() == pytest.approx([1 / 8, 1 / 8, 1 / 4, 1 / 4, 1 / 8, 1 / 8, 0.0])
    # the whole step is one micro-batch of 17 tokens: verl-agent's token-mean multiplies each by 1/(17 + 1e-8)
    assert r.advantages.double().numpy() == pytest.approx((r.adv.unsqueeze(-1) * r.weights * (17 + 1e-8)).numpy(), rel=1e-6)
    assert r.is_copy.tolist() == [False] * 6 + [True]
    assert (r.metrics["oma/padding_copies"], r.metrics["oma/trajectories"], r.metrics["oma/effective_trajectories"]) == \
        (1.0, 4.0, pytest.approx(4.0))


def test_by_hand_the_penalty_from_episode_rewards_equals_the_token_level_rewards():
    tlr = np.zeros((7, 4))
    for r, (reward, valid, mask) in enumerate(zip(BY_HAND["episode_rewards"], BY_HAND["is_action_valid"],
                                                  BY_HAND["response_mask"], strict=True)):
        tlr[r, sum(mask) - 1] = reward - 0.1 * (not valid)
    a = align_batch(BY_HAND, {}, invalid_penalty=0.1)
    b = align_batch({**BY_HAND, "token_level_rewards": tlr, "episode_rewards": [9.0] * 7}, {})
    assert torch.equal(a.adv, b.adv) and torch.equal(a.weights, b.weights)
    c = align_batch({k: v for k, v in BY_HAND.items() if k != "is_action_valid"}, {}, invalid_penalty=0)
    assert c.adv[2].item() == pytest.approx(-(2**-0.5), abs=1e-5) and c.adv[4].item() < 0
    with pytest.raises(VerlAgentConfigError, match="invalid_action_penalty_coef must be a finite number >= 0, got -1"):
        align_batch(BY_HAND, {}, invalid_penalty=-1)


def test_columns_as_lists_arrays_or_tensors_give_one_result():
    batch = sim.simulate(4)
    cols = columns(batch)
    as_lists = {k: np.asarray(v).tolist() for k, v in cols.items()}
    as_tensors = {k: (torch.as_tensor(v) if np.asarray(v).dtype.kind in "biuf" else np.asarray(v, dtype=object))
                  for k, v in cols.items()}
    results = [align_batch(c, {"estimator": "gigpo"}) for c in (cols, as_lists, as_tensors)]
    for r in results[1:]:
        assert torch.equal(r.adv, results[0].adv) and torch.equal(r.weights, results[0].weights)


def test_the_layout_is_verl_agents():
    a = ActorLoss(mini_batch_rows=12, micro_batch_rows=2, dp=2)
    # ranks take rows 0-9 and 10-19; each cuts mini-batches of 6 (the last of 4) and micro-batches of 2
    assert [s.tolist() for s in a.slots(20)][:5] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert len(a.slots(20)) == 10 and a.local_rows(20) == 6
    assert [m.tolist() for m in a.minibatches(20)] == [[0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15], [6, 7, 8, 9, 16, 17, 18, 19]]
    assert [s.tolist() for s in ActorLoss(mini_batch_rows=12, dp=2, dynamic_bsz=True).slots(20)] == \
        [list(range(6)), list(range(6, 10)), list(range(10, 16)), list(range(16, 20))]


# ---- refusals -----------------------------------------------------------------------------------


def _gone(cols: dict, name: str) -> dict:
    return {k: v for k, v in cols.items() if k != name}


REFUSED = [
    (lambda c: _gone(c, "traj_uid"), {}, None, "missing column 'traj_uid': the episode id verl-agent's rollout sets"),
    (lambda c: _gone(c, "response_mask"), {}, None, "missing column 'response_mask'"),
    (lambda c: {**c, "uid": np.where(np.arange(len(c["uid"])) == 0, "elsewhere", c["uid"])}, {}, None,
     "appears under two uid values ("),
    (lambda c: c, {"mass": "unifrom"}, None, "algorithm.oma.mass must be one of ['native', 'uniform', 'group'], got 'unifrom'"),
    (lambda c: c, {"masss": "uniform"}, None, "algorithm.oma.masss is not an option; known: ["),
    (lambda c: c, {"gamma": 0.9}, None, "algorithm.oma.gamma is not an option here: verl-agent discounts step_rewards"),
    (lambda c: c, {"outcome": "final"}, None, "algorithm.oma.outcome='final': verl-agent's rows carry no step order"),
    (lambda c: _gone(c, "anchor_obs"), {"estimator": "gigpo"}, None,
     "missing column 'anchor_obs': algorithm.oma.estimator=gigpo needs it"),
    (lambda c: _gone(c, "step_rewards"), {"estimator": "gigpo"}, None,
     "missing column 'step_rewards': algorithm.oma.estimator=gigpo needs it"),
    (lambda c: _gone(c, "row_id"), {}, None, "no 'row_id' or 'is_copy' column: verl-agent's adjust_batch pads"),
    (lambda c: _gone(_gone(c, "token_level_rewards"), "is_action_valid"), {"mass": "native"}, None,
     "missing column 'is_action_valid': verl-agent subtracts invalid_action_penalty_coef=0.1"),
    (lambda c: {**c, "is_copy": c["traj_uid"] == c["traj_uid"][0]}, {}, None,
     "is marked as a padding copy, but no other row of its trajectory"),
    (lambda c: c, {}, ActorLoss(loss_agg_mode="token-mean", dynamic_bsz=True),
     "actor_rollout_ref.actor.use_dynamic_bsz=True with loss_agg_mode=token-mean"),
    (lambda c: c, {}, ActorLoss(dp=3), "rows do not split over dp=3 ranks"),
    (lambda c: c, {}, ActorLoss(micro_batch_rows=3, mini_batch_rows=48), "no whole number of micro-batches"),
]


@pytest.mark.parametrize(("change", "given", "layout", "message"), REFUSED, ids=[m[:40] for *_, m in REFUSED])
def test_a_refusal_names_the_column_or_key_and_writes_nothing(tmp_path, change, given, layout, message):
    batch = sim.simulate(0)
    assert len(batch["score"]) % 3  # so that dp=3 does not split it
    cols = change(columns(batch))
    with pytest.raises(ValueError) as e:
        align_batch(cols, {**given, "dump_dir": str(tmp_path)}, actor=layout, iteration=1)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not list(tmp_path.iterdir())


def test_the_dump_is_written_when_nothing_is_refused(tmp_path):
    batch = sim.simulate(0)
    align_batch(columns(batch), {"dump_dir": str(tmp_path)}, iteration=1)
    dumped = pq.read_table(tmp_path / "batches" / "iter_000001.parquet")
    assert dumped.num_rows == len(batch["score"]) - batch["copies_added"]  # oma audit counts trajectories


def test_an_actor_verl_agent_would_not_run_is_refused():
    with pytest.raises(VerlAgentConfigError, match="ppo_micro_batch_size_per_gpu=5 must divide"):
        ActorLoss(mini_batch_rows=48, micro_batch_rows=5, dp=2)
    with pytest.raises(VerlAgentConfigError, match=r"loss_agg_mode must be one of \['token-mean'"):
        ActorLoss(loss_agg_mode="token-sum")  # verl-agent's agg_loss has no token-sum


# ---- the trainer hook ---------------------------------------------------------------------------


class DataProto:
    """verl's DataProto as the hook uses it: tensors in ``batch`` (a TensorDict: keys(), get/set), numpy
    arrays in ``non_tensor_batch``."""

    def __init__(self, batch: dict) -> None:
        t = sim.tensors(batch)
        self.batch = {"response_mask": torch.as_tensor(t["response_mask"]).long(),
                      "token_level_rewards": torch.as_tensor(t["token_level_rewards"], dtype=torch.float32),
                      "step_rewards": torch.as_tensor(batch["step_rewards"], dtype=torch.float32),
                      "input_ids": torch.as_tensor(t["input_ids"])}
        self.non_tensor_batch = {k: np.asarray(batch[k], dtype=object) for k in
                                 ("uid", "traj_uid", "episode_rewards", "is_action_valid", "anchor_obs", "row_id")}


WHOLE_OBJECTIVE = {"actor_rollout_ref__actor__use_kl_loss": False, "actor_rollout_ref__actor__entropy_coeff": 0.0,
                   "algorithm__use_kl_in_reward": True}
"""The recipe's KL loss moved into the reward and no entropy bonus: Mass Alignment then reaches the whole objective."""


def config(oma: dict | None = None, **changes) -> OmegaConf:
    """verl-agent's config as its GiGPO ALFWorld recipe sets it (KL loss 0.01, entropy bonus 0.001), on 2 GPUs."""
    cfg = OmegaConf.create({
        "algorithm": {"adv_estimator": "gigpo", "gamma": 0.95, "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
                      "gigpo": {"step_advantage_w": 1.0, "mode": "mean_std_norm", "enable_similarity": False}},
        "actor_rollout_ref": {
            "actor": {"strategy": "fsdp", "ppo_mini_batch_size": 48, "ppo_micro_batch_size": None,
                      "ppo_micro_batch_size_per_gpu": 8, "use_dynamic_bsz": False, "loss_agg_mode": "token-mean",
                      "entropy_coeff": 0.001, "use_kl_loss": True, "kl_loss_coef": 0.01, "use_invalid_action_penalty": True,
                      "invalid_action_penalty_coef": 0.1, "ulysses_sequence_parallel_size": 1,
                      "policy_loss": {"loss_mode": "vanilla"}},
            "rollout": {"n": 1, "multi_turn": {"enable": False}}},
        "trainer": {"n_gpus_per_node": 2, "nnodes": 1}})
    if oma is not None:
        OmegaConf.update(cfg, "algorithm.oma", oma, force_add=True)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg


def test_the_hook_writes_what_align_batch_computes():
    batch = sim.simulate(2)
    data, metrics = DataProto(batch), {"actor/x": 1.0}
    setup = check_config(config(**WHOLE_OBJECTIVE))
    assert str(setup).startswith("oma: verl-agent integration active — gigpo, accounting=trajectory, mass=uniform")
    assert "NOT under Mass Alignment" not in str(setup) and setup.unaligned == ()
    assert setup.options.norm_by_std and setup.options.gamma == 0.0 and setup.invalid_penalty == 0.1
    assert setup.actor == ActorLoss(mini_batch_rows=48, micro_batch_rows=8, dp=2)
    out = compute_advantage(data, config(**WHOLE_OBJECTIVE), metrics, iteration=3)
    r = align_batch(columns(batch), setup.options, actor=setup.actor)
    assert out is data  # its scores and step rewards in float32, as verl-agent keeps them
    assert data.batch["advantages"].numpy() == pytest.approx(r.advantages.numpy(), rel=1e-5, abs=1e-7)
    assert torch.allclose(data.batch["returns"], (r.adv.unsqueeze(-1) * data.batch["response_mask"]).float())
    assert metrics["oma/trajectories"] == 24 and metrics["actor/x"] == 1.0 and metrics["oma/optimizer_steps"] == 3
    assert metrics["oma/padding_copies"] == batch["copies_added"] > 0 and "oma/unaligned_share" not in metrics


def test_the_hook_baseline_is_verl_agents_compute_advantage():
    batch = sim.simulate(1)
    data = DataProto(batch)
    compute_advantage(data, config({"accounting": "row", "mass": "native"}))
    ref = sim.gigpo(batch, std=True)
    assert data.batch["advantages"].numpy() == pytest.approx(ref[:, None] * sim.tensors(batch)["response_mask"], abs=1e-6)
    assert check_config(config({"mass": "native"}, actor_rollout_ref__actor__policy_loss__loss_mode="gspo")
                        ).options.reducer == "seq-mean-token-mean"
    grpo = check_config(config({"mass": "native"}, algorithm__adv_estimator="grpo", algorithm__norm_adv_by_std_in_grpo=False))
    assert (grpo.options.estimator, grpo.options.norm_by_std, grpo.options.reducer) == ("grpo", False, "token-mean")


CONFIG_REFUSED = [
    ({}, {"algorithm__adv_estimator": "gae"}, "algorithm.adv_estimator=gae has no OMA form"),
    ({}, {"algorithm__gigpo__enable_similarity": True}, "algorithm.gigpo.enable_similarity=True"),
    ({}, {"algorithm__gigpo__mode": "std"}, "algorithm.gigpo.mode must be one of ['mean_norm', 'mean_std_norm']"),
    ({"estimator": "grpo"}, {}, "algorithm.oma.estimator is not an option here: algorithm.adv_estimator picks it"),
    ({"mass": "native", "reducer": "seq-mean-token-mean"}, {}, "algorithm.oma.reducer=seq-mean-token-mean with mass=native"),
    ({}, {"actor_rollout_ref__actor__strategy": "megatron"}, "actor_rollout_ref.actor.strategy=megatron with algorithm.oma.mass"),
    ({}, {"actor_rollout_ref__rollout__multi_turn__enable": True}, "actor_rollout_ref.rollout.multi_turn.enable=True"),
    ({}, {"actor_rollout_ref__actor__use_dynamic_bsz": True}, "use_dynamic_bsz=True with loss_agg_mode=token-mean"),
    ({}, {"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": None}, "ppo_micro_batch_size_per_gpu is not set"),
    ({"mass": "unifrom"}, {}, "algorithm.oma.mass must be one of"),
    ({}, {}, "actor_rollout_ref.actor.use_kl_loss=True (kl_loss_coef=0.01): verl-agent's actor adds the KL loss by "
     "loss_agg_mode with no per-trajectory weight, so Mass Alignment would not reach it; set "
     "actor_rollout_ref.actor.use_kl_loss=False and algorithm.use_kl_in_reward=True"),
    ({"mass": "group"}, {"actor_rollout_ref__actor__use_kl_loss": False},
     "actor_rollout_ref.actor.entropy_coeff=0.001: verl-agent's actor adds the entropy bonus by loss_agg_mode"),
    ({}, {**WHOLE_OBJECTIVE, "actor_rollout_ref__actor__entropy_coeff": -0.01},
     "or +algorithm.oma.allow_unaligned=true to train with it outside Mass Alignment (algorithm.oma.mass=uniform)"),
    ({"allow_unaligned": "yes"}, {}, "algorithm.oma.allow_unaligned must be true or false, got 'yes'"),
]


@pytest.mark.parametrize(("oma", "changes", "message"), CONFIG_REFUSED, ids=[m[:40] for *_, m in CONFIG_REFUSED])
def test_the_hook_refuses_before_it_writes(oma, changes, message):
    data, metrics = DataProto(sim.simulate(0)), {}
    before = set(data.batch)
    with pytest.raises(hosts.HostConfigError) as e:  # VerlAgentConfigError is one
        compute_advantage(data, config(oma, **changes), metrics)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert set(data.batch) == before and not metrics


def test_the_hook_refuses_dynamic_batches_of_images():
    data = DataProto(sim.simulate(0))
    data.non_tensor_batch["multi_modal_inputs"] = np.asarray([{}] * len(data.non_tensor_batch["uid"]), dtype=object)
    cfg = config(actor_rollout_ref__actor__use_dynamic_bsz=True, actor_rollout_ref__actor__loss_agg_mode="seq-mean-token-sum",
                 **WHOLE_OBJECTIVE)
    with pytest.raises(VerlAgentConfigError, match="scales each micro-batch's loss by the number of its keys"):
        compute_advantage(data, cfg)
    assert "advantages" not in data.batch


# ---- the offline check --------------------------------------------------------------------------


def test_the_check_command_reads_the_audit_dump(tmp_path, capsys):
    batch = sim.simulate(3)
    sim.write(batch, tmp_path / "b.parquet")  # docs/audit.md's dump: response_tokens and row_hash
    assert check_main(["check", str(tmp_path / "b.parquet"), "--mini-batch-rows", "48", "--micro-batch-rows", "8",
                       "--dp", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"({batch['copies_added']} padding copies), 24 trajectories" in lines[0]
    assert lines[1].split() == ["uid", "traj_uid", "rows", "tokens", "A", "row", "A", "traj", "mass", "native", "mass", "uniform"]
    uniform = [float(line.split()[-1]) for line in lines[2:-2]]
    assert len(uniform) == 24 and uniform == pytest.approx([1 / 24] * 24, abs=1e-4)
    assert lines[-2].startswith("padding copies carry ")
    assert lines[-1].startswith("float32 zero spread: 0 of ")  # the sim's groups always differ
    sim.write(batch, tmp_path / "bad.jsonl", drop=("score", "is_copy", "copies_added", "row_id", "traj_uid"))
    assert check_main(["check", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing column 'traj_uid'" in err


# ---- the whole objective: KL loss and entropy bonus refused under MA, or opted in and measured ----------


def _tokens(value):
    def damage(batch):
        batch["response_tokens"] = batch["response_tokens"].astype(float)
        batch["response_tokens"][1] = value
    return damage


def _no_tokens(batch):
    batch["response_tokens"] = np.zeros_like(batch["response_tokens"])


@pytest.mark.parametrize("damage, name, says", [
    (_tokens(-3), "b.parquet", "column 'response_tokens' must hold whole numbers >= 0, found -3.0 at row 1"),
    (_tokens(2.5), "b.parquet", "column 'response_tokens' must hold whole numbers >= 0, found 2.5 at row 1"),
    (_no_tokens, "b.parquet", "no row has a response token"),
    (None, "missing.parquet", "missing.parquet: no such file"),
])
def test_69_the_check_command_refuses_what_the_audit_refuses(tmp_path, capsys, damage, name, says):
    """#69: `check` took negative token counts as 0, truncated fractional ones, printed `nan` for an all-zero mask
    and named a missing file by its path alone; each is one line saying what is wrong (exit 2)."""
    if damage is not None:
        batch = sim.simulate(3)
        damage(batch)
        sim.write(batch, tmp_path / name)
    assert check_main(["check", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_69_the_check_command_reads_parquet_whatever_its_name(tmp_path, capsys):
    """#69: a Parquet file named `.pq` was read as JSON."""
    sim.write(sim.simulate(3), tmp_path / "b.parquet")
    (tmp_path / "b.parquet").rename(tmp_path / "b.pq")
    assert check_main(["check", str(tmp_path / "b.pq")]) == 0
    assert "24 trajectories" in capsys.readouterr().out.splitlines()[0]

def test_the_actors_other_terms_are_refused_under_mass_alignment_unless_opted_in():
    for mass in ("uniform", "group"):
        with pytest.raises(VerlAgentConfigError, match=r"use_kl_loss=True \(kl_loss_coef=0.01\)"):
            check_config(config({"mass": mass}))
    assert check_config(config({"mass": "native"})).unaligned == ()  # verl-agent's own loss: nothing to align
    assert check_config(config(**WHOLE_OBJECTIVE)).unaligned == ()
    opted = check_config(config({"allow_unaligned": True}))
    assert opted.unaligned == (("kl_loss", 0.01), ("entropy", 0.001))
    assert str(opted).endswith("; NOT under Mass Alignment (algorithm.oma.allow_unaligned=true): kl_loss ×0.01, "
                               "entropy ×0.001, their share of the objective logged each step as oma/unaligned_share")
    entropy_only = check_config(config({"allow_unaligned": True}, actor_rollout_ref__actor__use_kl_loss=False))
    assert entropy_only.unaligned == (("entropy", 0.001),)


def _two_trajectories() -> dict:
    """By hand: one group; trajectory a is one row of 2 tokens, b two rows of 3 and 5 tokens."""
    mask = np.arange(5) < np.array([[2], [3], [5]])
    rewards = np.zeros((3, 5))
    rewards[0, 1] = 1.0  # a wins, b fails
    return {"uid": ["g", "g", "g"], "traj_uid": ["a", "b", "b"], "response_mask": mask, "token_level_rewards": rewards,
            "row_id": [0, 1, 2]}


def test_by_hand_the_unaligned_share_and_the_mass_it_moves():
    # one micro-batch, token-mean: the KL and entropy terms weigh each of the 10 tokens 1/(10 + 1e-8), so
    # trajectory a holds 2/10 of their mass and b 8/10; uniform MA gives a and b 1/2 each, 1 in all.
    r = align_batch(_two_trajectories(), {"mass": "uniform"}, unaligned_coef=0.011)
    outside = 0.011 * 10 / (10 + 1e-8)
    assert r.metrics["oma/unaligned_share"] == pytest.approx(outside / (1 + outside), rel=1e-12)
    assert r.metrics["oma/unaligned_mass_moved"] == pytest.approx(0.5 * (abs(0.2 - 0.5) + abs(0.8 - 0.5)), rel=1e-9)
    assert "oma/unaligned_share" not in align_batch(_two_trajectories(), {"mass": "uniform"}).metrics
    assert "oma/unaligned_share" not in align_batch(_two_trajectories(), {"mass": "native"}, unaligned_coef=0.011).metrics


@pytest.mark.parametrize("layout", list(LAYOUTS.values()), ids=list(LAYOUTS))
@pytest.mark.parametrize("seed", SEEDS)
def test_the_mass_moved_is_the_distance_from_verl_agents_own_actor_weights(seed, layout):
    batch = sim.simulate(seed)
    r = align_batch(columns(batch), {"mass": "group"}, actor=actor(layout), unaligned_coef=0.01)
    native = sim.actor_token_weights(sim.tensors(batch)["response_mask"], loss_agg_mode="token-mean", **layout).sum(-1)
    theirs, ours = per_trajectory(batch["traj_uid"], native), per_trajectory(batch["traj_uid"], r.weights.sum(-1).numpy())
    moved = 0.5 * sum(abs(theirs[t] / sum(theirs.values()) - ours[t] / sum(ours.values())) for t in theirs)
    assert r.metrics["oma/unaligned_mass_moved"] == pytest.approx(moved, rel=1e-9)
    share = 0.01 * sum(theirs.values()) / (sum(ours.values()) + 0.01 * sum(theirs.values()))
    assert r.metrics["oma/unaligned_share"] == pytest.approx(share, rel=1e-9)


def test_an_opted_in_run_logs_its_unaligned_share_each_step():
    data, metrics = DataProto(sim.simulate(4)), {}
    compute_advantage(data, config({"allow_unaligned": True}), metrics)
    assert 0.0 < metrics["oma/unaligned_share"] < 0.011 and 0.0 < metrics["oma/unaligned_mass_moved"] < 1.0
    data, metrics = DataProto(sim.simulate(4)), {}
    compute_advantage(data, config({"allow_unaligned": True, "mass": "native"}), metrics)
    assert "oma/unaligned_share" not in metrics


# ---- the patch checks itself: row_id set after adjust_batch -------------------------------------


def test_a_row_id_set_after_adjust_batch_is_refused():
    batch = sim.simulate(5)
    data, metrics = DataProto(batch), {}
    rows = len(batch["score"])
    data.non_tensor_batch["row_id"] = np.arange(rows)  # numbered after the copies: every id unique
    with pytest.raises(VerlAgentConfigError) as e:
        compute_advantage(data, config(**WHOLE_OBJECTIVE), metrics)
    message = str(e.value)
    assert message.startswith(f"{batch['copies_added']} rows repeat another row of their trajectory token for token")
    assert "put batch.non_tensor_batch['row_id'] = np.arange(len(batch)) on the line just before " \
           "batch = adjust_batch(self.config, batch)" in message and "\n" not in message
    assert "advantages" not in data.batch and not metrics
    cols = {**columns(batch), "row_id": np.arange(rows), "input_ids": sim.tensors(batch)["input_ids"]}
    with pytest.raises(VerlAgentConfigError, match="the row_id line runs after adjust_batch"):
        align_batch(cols, {"accounting": "row", "mass": "native"})  # the patch is wrong whatever the mode
    cols["row_id"] = batch["row_id"]  # before adjust_batch: the copies are found and nothing is refused
    assert int(align_batch(cols).is_copy.sum()) == batch["copies_added"]


def test_a_row_id_that_is_not_an_integer_per_row_is_refused():
    data = DataProto(sim.simulate(5))
    data.non_tensor_batch["row_id"] = np.asarray([str(v) for v in data.non_tensor_batch["row_id"]], dtype=object)
    with pytest.raises(VerlAgentConfigError, match=r"^batch.non_tensor_batch\['row_id'\] must hold one integer per row"):
        compute_advantage(data, config(**WHOLE_OBJECTIVE))
    assert "advantages" not in data.batch


# ---- float32 zero spread: what stock verl-agent's arithmetic gives a group of equal scores ----------


def _stock_float32(scores: list[float], eps: float = 1e-6) -> list[float]:
    """verl-agent's GRPO step by hand, as its loop does it: a list of 0-d float32 scores, torch.mean and
    torch.std of the stacked list, then (s − mean)/(std + ε)."""
    items = [torch.tensor(s, dtype=torch.float32) for s in scores]
    mean, std = torch.mean(torch.tensor(items)), torch.std(torch.tensor([items]))
    return [float((s - mean) / (std + eps)) for s in items]


def test_by_hand_equal_scores_give_verl_agent_a_rounding_advantage_and_oma_zero():
    from oma.integrations.verl_agent.batch import float32_zero_spread
    scores = [9.9] * 6 + [0.5, 0.5] + [9.9] * 4 + [3.0]  # groups: 6 × 9.9, 2 × 0.5, 4 × 9.9, 1 × 3.0
    group = torch.tensor([0] * 6 + [1, 1] + [2] * 4 + [3])
    residue = float32_zero_spread(torch.tensor(scores, dtype=torch.float32), group)
    stock = _stock_float32([9.9] * 6)[0]
    assert abs(stock) > 0.4  # float32 cannot hold 6 × 9.9's mean: μ̂ is an ulp off, σ̂ ≈ 1e-6
    assert residue[:6].tolist() == pytest.approx([stock] * 6, abs=0) and residue[6:].abs().sum() == 0
    assert _stock_float32([0.5, 0.5]) == [0.0, 0.0] and _stock_float32([9.9] * 4) == [0.0] * 4
    r = align_batch({"uid": group.tolist(), "traj_uid": list(range(13)), "response_mask": np.ones((13, 2), bool),
                     "token_level_rewards": np.stack([np.asarray(scores), np.zeros(13)], -1)},
                    {"accounting": "row", "mass": "native"}, invalid_penalty=0)
    assert r.adv[:12].abs().max() == 0  # oma: a group without spread has advantage 0


def test_the_check_command_counts_the_rows_stock_verl_agent_rounds(tmp_path, capsys):
    batch = sim.simulate(3)
    first = batch["uid"] == batch["uid"][0]  # one group: every row scores 10 − 0.1, 9.9 in float32
    batch["episode_rewards"] = np.where(first, 10.0, batch["episode_rewards"])
    batch["is_action_valid"] = np.where(first, False, batch["is_action_valid"])
    batch["score"] = np.where(first, 10.0 - 0.1, batch["score"])
    sim.write(batch, tmp_path / "b.parquet")
    assert check_main(["check", str(tmp_path / "b.parquet")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    stock = _stock_float32([float(np.float32(np.float32(10.0) - np.float32(0.1)))] * int(first.sum()))[0]
    assert stock != 0, "the group's size must be one whose float32 mean is inexact"
    assert last.startswith(f"float32 zero spread: {int(first.sum())} of {len(first)} rows sit in groups of equal scores")
    assert f"|A| up to {abs(stock):.3f}" in last
    assert check_main(["check", str(tmp_path / "b.parquet"), "--no-std"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("float32 zero spread: none without the std")
