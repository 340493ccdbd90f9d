"""oma's rLLM hook (oma.integrations.rllm) against an independent reimplementation of rLLM + verl 0.8.0
(tests/rllm_sim.py); no rLLM or verl import. Batches are plain dicts of tensors and lists, as rLLM's
DataProto holds them (``batch`` tensors + ``non_tensor_batch`` arrays)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import rllm_sim as sim
from oma.integrations.rllm import ActorLoss, RllmConfigError, align_batch
from oma.integrations.rllm.backend import check_config

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LSF = 16.0


def episodes(seed: int, tasks: int = 3, n: int = 3) -> list[sim.Episode]:
    """Tasks rolled out n times; each trajectory 1-4 steps, each later step either extending the running
    sequence (rLLM merges it) or re-rendering it (a new row); distinct rewards so every A ≠ 0."""
    rng = random.Random(seed)
    out = []
    for t in range(tasks):
        trajs = []
        for k in range(n):
            full = [rng.randrange(10, 99) for _ in range(rng.randint(1, 3))]
            steps = []
            for s in range(rng.randint(1, 4)):
                completion = [rng.randrange(10, 99) for _ in range(rng.randint(1, 3))]
                if s and rng.random() < 0.4:  # merge breaks: the prompt no longer extends the sequence
                    full = [7] + full
                prompt = full + [rng.randrange(10, 99) for _ in range(rng.randint(0, 2))] if s else full
                steps.append(sim.Step(list(prompt), completion))
                full = list(prompt) + completion
            trajs.append(sim.Trajectory(uid=f"u-{t}-{k}-{seed}", name="solver", reward=round(rng.uniform(-1, 2), 3) + k * 1e-3,
                                        steps=steps))
        out.append(sim.Episode(task_id=f"task{t}", trajectories=trajs))
    return out


def rllm_batch(eps: list[sim.Episode], divisor: int, estimator: str = "grpo") -> dict:
    batch = sim.pad(sim.transform(eps, width=40), divisor)
    batch["advantages"] = sim.broadcast(batch, sim.advantages_by_uid(eps, estimator))
    return batch


SPLITS = [  # (dp, mini-batch rows over all ranks, micro-batch rows per rank, pad divisor)
    (1, None, 1, 1), (1, 4, 2, 4), (2, 4, 1, 4), (2, 6, 3, 6), (3, 6, 2, 6)]


def _actor(batch, mode, dp, mini, gbs):
    return ActorLoss(mini_batch_rows=mini, global_batch_size=gbs, dp=dp, loss_agg_mode=mode,
                     loss_scale_factor=LSF if mode == "seq-mean-token-sum-norm" else None)


def _check_shape(batch):
    steps = batch["steps_per_row"]
    uids = batch["step_ids"][:len(steps)]
    assert any(s > 1 for s in steps), "the batch must hold a merged row"
    assert len(set(uids)) < len(uids), "the batch must hold a trajectory split into several rows"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_native_equals_rllm(mode, split, estimator):
    """mass=native: the batch's advantages stay rLLM's own, and W is verl's own loss coefficient."""
    dp, mini, micro, divisor = split
    eps = episodes(seed=hash((mode, split, estimator)) % 1000)
    batch = rllm_batch(eps, divisor, estimator)
    _check_shape(batch)
    rows = batch["response_mask"].shape[0]
    gbs = 9  # rLLM's rollout count per update: 3 tasks × 3
    coef = sim.loss_coefficients(batch["response_mask"], mode=mode, dp=dp, mini_rows=mini or rows,
                                 micro_rows=micro, gbs=gbs, lsf=LSF)
    out = align_batch(batch, {"mass": "native"}, actor=_actor(batch, mode, dp, mini, gbs))
    torch.testing.assert_close(out.advantages.double(), batch["advantages"].double(), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.weights, coef, rtol=1e-6, atol=1e-9)


def _trajectory_mass(batch, written, coef):
    """Each trajectory's weight in verl's loss: Σ coef·A' / A_τ over its tokens (A_τ ≠ 0 by construction)."""
    out = {}
    for i, uid in enumerate(batch["step_ids"]):
        if batch["is_pad_step"][i]:
            continue
        m = batch["response_mask"][i].bool()
        a = float(batch["advantages"][i][m][0])
        out[uid] = out.get(uid, 0.0) + float((coef[i][m].double() * written[i][m].double()).sum()) / a
    return out


def _intended(batch, reducer: str, k: int, t: int) -> torch.Tensor:
    """W of mass=uniform written from docs/math.md#mass-alignment: trajectory τ carries k/T, spread over its
    rows by ``reducer`` (n_τ its tokens, R_τ its rows, n_r a row's tokens, L = loss_scale_factor)."""
    mask = batch["response_mask"].double()
    out = torch.zeros_like(mask)
    live = [i for i in range(len(batch["step_ids"])) if not batch["is_pad_step"][i]]
    for i in live:
        uid = batch["step_ids"][i]
        mine = [j for j in live if batch["step_ids"][j] == uid]
        n_tau, r_tau, n_r = float(sum(mask[j].sum() for j in mine)), len(mine), float(mask[i].sum())
        per_token = {"token-mean": 1 / n_tau, "seq-mean-token-mean": 1 / (r_tau * n_r),
                     "seq-mean-token-sum": 1 / r_tau, "seq-mean-token-sum-norm": 1 / (r_tau * LSF)}[reducer]
        out[i] = mask[i] * per_token * k / t
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("split", SPLITS)
def test_uniform_mass_per_trajectory(mode, split):
    """mass=uniform: whatever rows merging made, verl's own loss with the written advantages weighs each
    token as the reducer inside its trajectory says, each of the T trajectories carrying k/T (k optimizer
    steps, 1 each on average), under every split and aggregation."""
    dp, mini, micro, divisor = split
    eps = episodes(seed=7 + len(mode))
    batch = rllm_batch(eps, divisor)
    rows = batch["response_mask"].shape[0]
    k = rows // (mini or rows)
    coef = sim.loss_coefficients(batch["response_mask"], mode=mode, dp=dp, mini_rows=mini or rows, micro_rows=micro,
                                 gbs=9, lsf=LSF)
    for reducer in MODES:
        out = align_batch(batch, {"mass": "uniform", "reducer": reducer, "loss_scale_factor": LSF},
                          actor=_actor(batch, mode, dp, mini, 9))
        a = batch["advantages"].double()
        effective = coef * out.advantages.double() / torch.where(a != 0, a, torch.ones_like(a))
        torch.testing.assert_close(effective, _intended(batch, reducer, k, 9), rtol=1e-5, atol=1e-9)
        if reducer in ("token-mean", "seq-mean-token-mean"):  # the mean reducers: each trajectory k/T in all
            mass = _trajectory_mass(batch, out.advantages, coef)
            assert len(mass) == 9 and all(v == pytest.approx(k / 9, rel=1e-5) for v in mass.values())
    # the native run does not: a split trajectory carries more (seq-mean) or mass ∝ tokens (token-mean)
    native = _trajectory_mass(batch, batch["advantages"], coef)
    assert max(native.values()) / min(native.values()) > 1.5


def test_group_mass_and_string_ids():
    """mass=group: each group (task × agent name) carries k/G; ids are strings, as rLLM's uids are."""
    eps = episodes(seed=3, tasks=2, n=4)
    eps[1].trajectories = eps[1].trajectories[:2]  # uneven groups
    batch = rllm_batch(eps, 4)
    batch["step_ids"] = np.asarray(batch["step_ids"], dtype=object)
    rows = batch["response_mask"].shape[0]
    coef = sim.loss_coefficients(batch["response_mask"], mode="seq-mean-token-mean", dp=2, mini_rows=4, micro_rows=1, gbs=3)
    out = align_batch(batch, {"mass": "group"}, actor=_actor(batch, "seq-mean-token-mean", 2, 4, 3))
    mass = _trajectory_mass(batch, out.advantages, coef)
    k = rows // 4
    by_group = {}
    for ep in eps:
        by_group[ep.task_id] = sum(mass[t.uid] for t in ep.trajectories)
    for value in by_group.values():
        assert value == pytest.approx(k / 2, rel=1e-5)


def test_advantages_count_each_trajectory_once():
    """OA: the advantage under A' = A·W/f is rLLM's per-trajectory GRPO over trajectory rewards, which differs
    from a GRPO over rows when one trajectory spans several rows."""
    eps = episodes(seed=11)
    batch = rllm_batch(eps, 1)
    out = align_batch(batch, {"mass": "uniform"}, actor=ActorLoss(loss_agg_mode="seq-mean-token-sum", global_batch_size=9))
    f = 1 / 9
    recovered = out.advantages.double() * f / torch.where(out.weights > 0, out.weights, torch.ones_like(out.weights))
    by_traj = sim.advantages_by_uid(eps)
    for i, uid in enumerate(batch["step_ids"]):
        m = batch["response_mask"][i].bool()
        torch.testing.assert_close(recovered[i][m], torch.full((int(m.sum()),), by_traj[uid], dtype=torch.float64),
                                   rtol=1e-5, atol=1e-6)
    # over rows instead: a split trajectory's reward counts once per row, which moves the group mean
    row_rewards = {}
    for uid, tid in zip(batch["step_ids"], batch["trajectory_ids"], strict=True):
        row_rewards.setdefault(tid, []).append(next(t.reward for e in eps for t in e.trajectories if t.uid == uid))
    by_traj_means = {f"{e.task_id}_solver": sum(t.reward for t in e.trajectories) / 3 for e in eps}
    assert any(abs(sum(v) / len(v) - by_traj_means[k]) > 1e-3 for k, v in row_rewards.items())


def test_by_hand():
    """One group of two trajectories, seq-mean-token-sum, G = 2 rollouts, one mini-batch (k = 1):
    τa merged into one row of 2 action tokens, reward 1; τb split into two rows of 1 token each, reward 0.
    rLLM's GRPO over the 2 trajectories: mean 0.5, population std 0.5, A_a = 0.5/(0.5+1e-6) ≈ +1, A_b ≈ −1.
    native: verl gives every token f = 1/G = 1/2.
    uniform, reducer seq-mean-token-mean: τa and τb 1/2 each; τa's 2 tokens 1/4 each, τb's rows 1/2·1/2 each
    → W = 1/4 on every token, and the carrier writes A' = A·W/f = A/2."""
    batch = {"step_ids": ["a", "b", "b"], "trajectory_ids": ["g", "g", "g"],
             "response_mask": torch.tensor([[1, 1], [1, 0], [1, 0]]),
             "traj_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]),
             "advantages": torch.tensor([[1.0, 1.0], [-1.0, 0.0], [-1.0, 0.0]]) * (0.5 / (0.5 + 1e-6))}
    actor = ActorLoss(loss_agg_mode="seq-mean-token-sum", global_batch_size=2)
    native = align_batch(batch, {"mass": "native"}, actor=actor)
    assert native.weights.tolist() == [[0.5, 0.5], [0.5, 0.0], [0.5, 0.0]]
    uniform = align_batch(batch, {"mass": "uniform", "reducer": "seq-mean-token-mean"}, actor=actor)
    assert uniform.weights.tolist() == [[0.25, 0.25], [0.25, 0.0], [0.25, 0.0]]
    torch.testing.assert_close(uniform.advantages, batch["advantages"] / 2 * batch["response_mask"])
    assert uniform.metrics["oma/trajectories"] == 2.0 and uniform.metrics["oma/rows_per_trajectory/max"] == 2.0


def test_row_order_invariance():
    """Permuting the rows (one mini-batch, so the layout does not move them between optimizer steps)
    permutes the result and changes nothing else."""
    eps = episodes(seed=5)
    batch = rllm_batch(eps, 1)
    perm = torch.randperm(batch["response_mask"].shape[0], generator=torch.Generator().manual_seed(0))
    shuffled = {k: (v[perm] if isinstance(v, torch.Tensor) else [v[i] for i in perm.tolist()]) for k, v in batch.items()}
    for mode in ("token-mean", "seq-mean-token-mean"):
        actor = ActorLoss(loss_agg_mode=mode, global_batch_size=9)
        a = align_batch(batch, {"mass": "uniform"}, actor=actor)
        b = align_batch(shuffled, {"mass": "uniform"}, actor=actor)
        torch.testing.assert_close(b.weights, a.weights[perm])
        torch.testing.assert_close(b.advantages, a.advantages[perm])
        assert a.metrics == pytest.approx(b.metrics)


def test_padding_rows_weigh_nothing():
    eps = episodes(seed=2)
    batch = rllm_batch(eps, 8)
    pads = torch.tensor(batch["is_pad_step"])
    assert bool(pads.any())
    out = align_batch(batch, {"mass": "uniform"}, actor=ActorLoss(mini_batch_rows=8, loss_agg_mode="token-mean"))
    assert float(out.weights[pads].abs().sum()) == 0.0 and out.metrics["oma/padding_copies"] == float(pads.sum())


# ------------------------------------------------------------------------------------------ refusals

def _small():
    return rllm_batch(episodes(seed=1, tasks=1, n=2), 1)


@pytest.mark.parametrize("drop,expected", [("step_ids", "missing column 'step_ids'"),
                                           ("trajectory_ids", "missing column 'trajectory_ids'"),
                                           ("advantages", "missing column 'advantages'")])
def test_missing_columns(drop, expected):
    batch = _small()
    del batch[drop]
    with pytest.raises(ValueError, match=expected):
        align_batch(batch, {"mass": "uniform"})


def test_trajectory_in_two_groups(tmp_path):
    batch = _small()
    batch["trajectory_ids"] = list(batch["trajectory_ids"])
    batch["step_ids"] = [batch["step_ids"][0]] * len(batch["step_ids"])
    batch["trajectory_ids"][-1] = "other_task"
    with pytest.raises(ValueError, match="'step_ids' must be unique per trajectory.*two 'trajectory_ids'"):
        align_batch(batch, {"mass": "uniform", "dump_dir": str(tmp_path)}, iteration=1)
    assert not any(tmp_path.iterdir())  # nothing written before the refusal


@pytest.mark.parametrize("options,expected", [
    ({"mass": "all"}, r"rllm\.algorithm\.oma\.mass must be one of"),
    ({"accounting": "row"}, r"rllm\.algorithm\.oma\.accounting must be 'trajectory'"),
    ({"estimator": "grpo"}, r"rllm\.algorithm\.oma\.estimator is rLLM's own"),
    ({"masss": "uniform"}, r"rllm\.algorithm\.oma\.masss is not an option"),
])
def test_bad_options(options, expected):
    with pytest.raises(ValueError, match=expected):
        align_batch(_small(), options)


@pytest.mark.parametrize("actor,expected", [
    (dict(loss_agg_mode="token-sum"), r"actor_rollout_ref\.actor\.loss_agg_mode must be one of"),
    (dict(loss_mode="gspo"), r"actor_rollout_ref\.actor\.policy_loss\.loss_mode must be one of"),
    (dict(loss_agg_mode="seq-mean-token-sum-norm"), r"actor_rollout_ref\.actor\.loss_scale_factor must be set"),
])
def test_refused_actor(actor, expected):
    with pytest.raises(RllmConfigError, match=expected):
        ActorLoss(**actor)


def test_refused_shuffled_token_mean():
    batch = rllm_batch(episodes(seed=4), 4)
    with pytest.raises(RllmConfigError, match=r"actor_rollout_ref\.actor\.shuffle=True with loss_agg_mode=token-mean"):
        align_batch(batch, {"mass": "uniform"}, actor=ActorLoss(mini_batch_rows=4, shuffle=True))
    # the seq-mean modes do not see the split: exact under shuffling
    align_batch(batch, {"mass": "uniform"}, actor=ActorLoss(mini_batch_rows=4, shuffle=True, loss_agg_mode="seq-mean-token-mean"))


def test_check_config_refusals(monkeypatch):
    monkeypatch.setattr("oma.hosts.require_version", lambda *a: None)  # verl 0.8 is not installed in CI
    base = {"actor_rollout_ref": {"actor": {"loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "vanilla"}}},
            "rllm": {"algorithm": {"oma": {"mass": "uniform"}}}}
    opts, actor = check_config(base)
    assert opts.mass == "uniform" and opts.reducer == "token-mean" and actor.loss_agg_mode == "token-mean"
    bad = {**base, "rllm": {"algorithm": {"loss_fn_map": {"solver": "gspo"}, "oma": {}}}}
    with pytest.raises(RllmConfigError, match=r"rllm\.algorithm\.loss_fn_map must be empty"):
        check_config(bad)
    bad = {**base, "rllm": {"mask_truncated_samples": True, "algorithm": {"oma": {}}}}
    with pytest.raises(RllmConfigError, match=r"rllm\.mask_truncated_samples must be false"):
        check_config(bad)
    bad = {**base, "rllm": {"algorithm": {"loss_agg_mode": "seq-mean-token-mean", "oma": {"mass": "nope"}}}}
    with pytest.raises(ValueError, match=r"rllm\.algorithm\.oma\.mass must be one of"):
        check_config(bad)


def test_check_config_refuses_other_verl():
    """The installed verl here is 0.9.1; rLLM's commit pins 0.8.0."""
    with pytest.raises(ValueError, match="supports verl 0.8.x"):
        check_config({"rllm": {"algorithm": {"oma": {}}}})


def test_check_config_refuses_unaligned_terms(monkeypatch):
    """Under Mass Alignment the KL loss and the entropy bonus would keep rLLM's row mass: refused by key."""
    monkeypatch.setattr("oma.hosts.require_version", lambda *a: None)
    for actor, key in (({"use_kl_loss": True}, "use_kl_loss must be false"), ({"entropy_coeff": 0.01}, "entropy_coeff must be 0")):
        with pytest.raises(RllmConfigError, match=rf"actor_rollout_ref\.actor\.{key}"):
            check_config({"actor_rollout_ref": {"actor": actor}, "rllm": {"algorithm": {"oma": {"mass": "uniform"}}}})
        check_config({"actor_rollout_ref": {"actor": actor}, "rllm": {"algorithm": {"oma": {"mass": "native"}}}})


def test_layout_without_padding_meta():
    """trainer.balance_batch=false: rLLM stashes no sizes; both are ppo_mini_batch_size × rollout.n."""
    from oma.integrations.rllm.backend import actor_for, default_mini_batch_rows

    rows = default_mini_batch_rows({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 4}}})
    assert rows == 8
    actor = actor_for({}, ActorLoss(), dp=2, default_rows=rows)
    assert (actor.mini_batch_rows, actor.global_batch_size, actor.dp) == (8, 8, 2)
    actor = actor_for({"rllm_actor_mini_batch_size": 6, "rllm_actor_global_batch_size": 3}, ActorLoss(), dp=2, default_rows=rows)
    assert (actor.mini_batch_rows, actor.global_batch_size) == (6, 3)


def test_check_install_refuses_a_non_checkout(tmp_path, capsys):
    from oma.integrations.rllm.__main__ import main

    assert main(["check-install", str(tmp_path)]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not an rLLM checkout: expected rllm/trainer/verl/transform.py" in out[0]


def test_backend_wiring(monkeypatch):
    """backend_class() subclasses rLLM's VerlBackend (a stand-in module here): its compute_advantages runs
    rLLM's own first, then writes A·W/f into the batch and the oma/* metrics, with the layout from meta_info."""
    import asyncio
    import sys
    import types

    from oma.integrations.rllm.backend import backend_class

    eps = episodes(seed=9)
    batch = rllm_batch(eps, 6)
    rllm_adv = batch.pop("advantages")

    class VerlBackend:  # what the hook relies on: config, compute_advantages, _get_dp_size, actor_rollout_wg
        def __init__(self, config, **kwargs):
            self.config, self.actor_rollout_wg = config, None

        async def compute_advantages(self, trainer_state, algorithm_config, **kwargs):
            trainer_state.backend_batch.batch["advantages"] = rllm_adv.clone()

        def _get_dp_size(self, worker_group, mesh_name):
            return 2

    module = types.ModuleType("rllm.trainer.verl.verl_backend")
    module.VerlBackend = VerlBackend
    monkeypatch.setitem(sys.modules, "rllm.trainer.verl.verl_backend", module)
    monkeypatch.setattr("oma.hosts.require_version", lambda *a: None)
    config = {"actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-mean"}},
              "rllm": {"algorithm": {"oma": {"mass": "uniform"}}}}
    backend = backend_class()(config)
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    proto = types.SimpleNamespace(batch=tensors, meta_info={"rllm_actor_mini_batch_size": 6, "rllm_actor_global_batch_size": 9},
                                  non_tensor_batch={k: np.asarray(v, dtype=object) for k, v in batch.items() if k not in tensors})
    state = types.SimpleNamespace(backend_batch=proto, metrics={}, global_step=1)
    asyncio.run(backend.compute_advantages(state, None))
    expected = align_batch({**batch, "advantages": rllm_adv}, {"mass": "uniform"},
                           actor=ActorLoss(mini_batch_rows=6, global_batch_size=9, dp=2, loss_agg_mode="seq-mean-token-mean"))
    torch.testing.assert_close(proto.batch["advantages"], expected.advantages)
    assert not torch.equal(proto.batch["advantages"], rllm_adv)
    assert state.metrics["oma/trajectories"] == 9.0
