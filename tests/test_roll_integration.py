"""oma's ROLL integration against tests/roll_sim.py, an independent plain-loop reimplementation of what ROLL's
agentic pipeline computes (docs/roll.md#what-is-exact). No ROLL import: batches are duck types."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import roll_sim as sim
from oma import hosts
from oma.integrations.roll import RollConfigError, check_config, install
from oma.integrations.roll.batch import WORKER_CLS, align_batch, carry
from oma.integrations.roll.hook import columns, compute_advantage

GAMMA = 0.95


def config(estimator: str = "grpo", method: str = "mean_std", **over) -> dict:
    """ROLL's AgenticConfig keys a run sets (nested dicts stand for its dataclasses)."""
    cfg = {"adv_estimator": estimator, "reward_normalization": {"grouping": "traj_group_id", "method": method},
           "step_reward_gamma": GAMMA, "step_reward_weight": 1.0, "episode_reward_weight": 1.0,
           "loss_agg_mode": "seq-mean-token-mean",
           "actor_train": {"worker_cls": WORKER_CLS, "strategy_args": {"strategy_name": "megatron_train"}}}
    cfg.update(over)
    return cfg


def batch(seed: int, estimator: str, *, divisor: int = 16, string_ids: bool = True, shared_states: bool = False,
          binary: bool = True) -> tuple[dict, list[bool]]:
    rows = sim.rollout(seed, string_ids=string_ids, shared_states=shared_states, binary=binary)
    if estimator == "gigpo":
        rows["step_rewards"] = sim.discounted_returns(rows, GAMMA)  # before adjust_batch, as ROLL does
    return sim.adjust_batch_copy(rows, divisor, seed)


def oma_token_adv(rows: dict, cfg: dict, node: dict, order: list[int] | None = None) -> torch.Tensor:
    setup = check_config(cfg, node)
    return align_batch(columns(sim.proto(rows, order)), setup.options).token_adv


@pytest.mark.parametrize("estimator", ["grpo", "reinforce", "gigpo"])
@pytest.mark.parametrize("method", ["mean_std", "mean"])
@pytest.mark.parametrize("seed,divisor,string_ids", [(0, 16, True), (1, 7, False), (2, 32, True), (3, 5, True)])
def test_row_native_equals_roll(estimator, method, seed, divisor, string_ids):
    """accounting=row mass=native: oma's advantages are ROLL's own, padding copies counted as ROLL counts them."""
    rows, is_copy = batch(seed, estimator, divisor=divisor, string_ids=string_ids, binary=seed % 2 == 0)
    assert any(is_copy) or len(is_copy) % divisor == 0
    theirs = torch.tensor(sim.roll_token_advantages(rows, sim.roll_response_rewards(rows, estimator, method)))
    ours = oma_token_adv(rows, config(estimator, method), {"accounting": "row", "mass": "native"})
    assert (ours.double() - theirs).abs().max() <= 1e-6


def test_row_order_does_not_matter():
    """The advantages follow the rows: reordering the batch (ROLL's batch_balance) reorders them, nothing else."""
    rows, _ = batch(4, "gigpo", divisor=16)
    order = list(np.random.default_rng(0).permutation(len(rows["traj_id"])))
    for node in ({"accounting": "row", "mass": "native"}, {"accounting": "trajectory", "mass": "uniform"}):
        base = oma_token_adv(rows, config("gigpo"), node)
        moved = oma_token_adv(rows, config("gigpo"), node, order)
        assert torch.equal(moved, base[order])


def test_gigpo_states_shared_across_groups_differ_from_roll():
    """ROLL's step groups pool a state_hash across groups (build_state_group, then grouping by the hash); oma's
    stay inside a group (docs/roll.md#what-is-exact). Rows whose state recurs in another group differ."""
    rows, _ = batch(5, "gigpo", shared_states=True)
    theirs = torch.tensor(sim.roll_token_advantages(rows, sim.roll_response_rewards(rows, "gigpo", "mean_std")))
    ours = oma_token_adv(rows, config("gigpo"), {"accounting": "row", "mass": "native"})
    assert (ours.double() - theirs).abs().max() > 1e-3


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
@pytest.mark.parametrize("method", ["mean_std", "mean"])
@pytest.mark.parametrize("seed", [0, 1, 6])
def test_trajectory_accounting_counts_each_trajectory_once(estimator, method, seed):
    """OA: a group's statistics over its unique trajectories' episode_scores; copies take their original's."""
    rows, is_copy = batch(seed, estimator, divisor=16, binary=seed != 1)
    theirs = torch.tensor(sim.roll_token_advantages(rows, sim.oa_response_rewards(rows, is_copy, estimator, method)))
    ours = oma_token_adv(rows, config(estimator, method), {"accounting": "trajectory", "mass": "native"})
    assert (ours.double() - theirs).abs().max() <= 1e-6


def intended_mass(rows: dict, is_copy: list[bool], mass: str, k: int) -> dict:
    """Each trajectory's share of the step's objective, times the k optimizer steps: uniform k/T, group k/(G·T_g)."""
    kept = [i for i, c in enumerate(is_copy) if not c]
    trajs = list(dict.fromkeys(rows["traj_id"][i] for i in kept))
    group_of = {rows["traj_id"][i]: rows["traj_group_id"][i] for i in kept}
    groups = list(dict.fromkeys(group_of.values()))
    if mass == "uniform":
        return {t: k / len(trajs) for t in trajs}
    return {t: k / len(groups) / sum(1 for u in trajs if group_of[u] == group_of[t]) for t in trajs}


@pytest.mark.parametrize("mass", ["uniform", "group"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("dp,per_device,ga,seed", [(1, 16, 1, 0), (2, 2, 2, 1), (4, 1, 4, 2), (1, 4, 2, 3), (2, 4, 1, 4)])
def test_mass_reaches_the_loss_under_every_split(mass, mode, dp, per_device, ga, seed):
    """MA: through ROLL's actor (rows shuffled, backward batches, micro-batches, agg_loss with the backward batch's
    counts), each trajectory's total weight is its intended share; copies carry none."""
    rows, is_copy = batch(seed, "grpo", divisor=dp * per_device * ga)
    cfg = config("grpo", loss_agg_mode=mode)
    setup = check_config(cfg, {"accounting": "trajectory", "mass": mass})
    data = sim.proto(rows)
    result = align_batch(columns(data), setup.options)
    mask = data.batch["response_mask"][:, 1:]
    # A' is linear in A: carrying A = 1 on every token reads off W/f, the weight per unit of ROLL's token factor
    data.batch.update(oma_adv=mask.float(), oma_weights=result.weights)
    per_traj = dict.fromkeys(rows["traj_id"], 0.0)
    layout = sim.actor_layout(len(is_copy), dp=dp, per_device=per_device, ga=ga, seed=seed)
    for backward in layout:
        for micro in backward:
            part = sim.micro_batch(data, micro, backward)
            carry(part, mode)
            factor = sim.actor_factor(mask.tolist(), micro, backward, mode, dp, ga)
            for j, i in enumerate(micro):
                w = sum(f * a for f, a in zip(factor[j], part.batch["advantages"][j].tolist()))
                per_traj[rows["traj_id"][i]] += w
                if is_copy[i]:
                    assert w == 0.0
    want = intended_mass(rows, is_copy, mass, len(layout))
    for t, w in want.items():
        assert per_traj[t] == pytest.approx(w, rel=1e-5, abs=1e-9)


BY_HAND = {  # one group: trajectory a wins in 2 steps, b fails in 1; the last row is adjust_batch's copy of b's
    "traj_group_id": ["g", "g", "g", "g"], "traj_id": ["a", "a", "b", "b"], "step": [0, 1, 0, 0],
    "episode_scores": [1.0, 1.0, 0.0, 0.0], "step_scores": [0.0, 1.0, 0.0, 0.0],
    "state_hash": ["x", "y", "x", "x"], "sample_uuid": ["a_0", "a_1", "b_2", "b_2"],
    "response_mask": [[0, 1, 0, 0], [0, 1, 1, 1], [0, 0, 1, 0], [0, 0, 1, 0]],
    "scores": [[0, 0, 0, 0], [0, 0, 0, 1.0], [0, 0, 0, 0], [0, 0, 0, 0]]}


def test_by_hand_grpo_trajectory_uniform():
    """One group, two trajectories: τa wins in 2 steps, τb loses in 1 step; adjust_batch copies τb's step.

    OA: outcomes {1, 0}: mean 0.5, sample std √0.5 ≈ 0.70711 → A(τa) = 0.5/(0.70711 + 1e-6) ≈ 0.70711,
    A(τb) ≈ −0.70711, the copy −0.70711 too. Under ROLL's rows the copy would count: rows {1, 1, 0, 0}.
    MA uniform: τa and τb ½ each; τa's rows split its ½ by tokens (token-mean reducer: 1 and 3 tokens →
    1/8 and 3/8 per row), τb's one token ½; the copy 0. The hook writes W·R (R = 4 rows): 0.5, 1.5, 2, 0.
    """
    rows = BY_HAND
    setup = check_config(config("grpo"), {"accounting": "trajectory", "mass": "uniform"})
    result = align_batch(columns(sim.proto(rows)), setup.options)
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    assert result.adv.tolist() == pytest.approx([a, a, -a, -a], abs=1e-9)
    assert result.is_copy.tolist() == [False, False, False, True]
    assert result.weights.sum(-1).tolist() == pytest.approx([0.5, 1.5, 2.0, 0.0])
    assert result.metrics["oma/padding_copies"] == 1.0
    assert result.metrics["oma/trajectories"] == 2.0


def test_by_hand_row_native_counts_the_copy():
    """ROLL's own (row, native) on the same batch: row scores are the step rewards {0, 1, 0, 0} (grpo reads
    ``scores``, not ``episode_scores``): mean ¼, sample std ½ → A = (0 − ¼)/½ = −0.5, (1 − ¼)/½ = 1.5, −0.5, −0.5."""
    rows = BY_HAND
    setup = check_config(config("grpo"), {"accounting": "row", "mass": "native"})
    result = align_batch(columns(sim.proto(rows)), setup.options)
    assert result.adv.tolist() == pytest.approx([-0.5 / 1.000002, 1.5 / 1.000002, -0.5 / 1.000002, -0.5 / 1.000002])
    assert result.weights is None


# ------------------------------------------------------------------------------------------ refusals


def test_refused_configurations_name_the_key():
    cases = [
        (config("gae"), {}, "adv_estimator=gae"),
        (config("step_reinforce"), {}, "adv_estimator=step_reinforce"),
        (config(method="identity"), {}, "reward_normalization resolves"),
        (config(reward_normalization={"grouping": "batch", "method": "mean_std"}), {}, "reward_normalization.grouping=batch"),
        (config(gamma=0.9), {}, "gamma=0.9"),
        (config(whiten_advantages=True), {}, "whiten_advantages=True"),
        (config(advantage_clip=2.0), {}, "advantage_clip=2.0"),
        (config(batch_adjust_mode="delete"), {}, "batch_adjust_mode=delete"),
        (config("gigpo", episode_reward_weight=0.5), {}, "episode_reward_weight=0.5"),
        (config("gigpo", reward_normalization={"grouping": "traj_group_id", "method": "mean",
                                               "norm_std_type": "group"}), {}, "norm_std_type differ"),
        (config(loss_agg_mode="token-sum"), {}, "loss_agg_mode must be one of"),
        (config(actor_train={}), {"mass": "uniform"}, "actor_train.worker_cls=None"),
        (config(actor_train={"worker_cls": WORKER_CLS, "strategy_args": {"strategy_name": "deepspeed_train"}}),
         {"mass": "uniform"}, "strategy_name=deepspeed_train"),
        (config(use_kl_loss=True, kl_loss_coef=0.01), {"mass": "uniform"}, "use_kl_loss=True"),
        (config(actor_train={"worker_cls": WORKER_CLS, "strategy_args": {"strategy_name": "fsdp2_train"},
                             "use_dynamic_batching_in_train": True}), {"mass": "uniform"},
         "actor_train.use_dynamic_batching_in_train=true"),
        (config(train_infer_correction={"filters": [{"enabled": True}]}), {"mass": "uniform"},
         "train_infer_correction.filters"),
        (config(entropy_loss_coef=0.01), {"mass": "group"}, "entropy_loss_coef=0.01"),
        (config(), {"mass": "nonsense"}, "oma.mass must be one of"),
        (config(), {"accounting": "rows"}, "oma.accounting must be one of"),
        (config(), {"massive": 1}, "oma.massive is not an option"),
        (config(), {"gamma": 0.5}, "oma.gamma is not an option here"),
        (config(), {"mass": "native", "reducer": "token-mean"}, "oma.reducer=token-mean with mass=native"),
    ]
    for cfg, node, words in cases:
        with pytest.raises(hosts.HostConfigError) as info:  # RollConfigError, or hosts' own for oma's keys
            check_config(cfg, node)
        assert words in str(info.value) and "\n" not in str(info.value), (words, str(info.value))
    # the same settings pass where they are allowed
    check_config(config(use_kl_loss=True, kl_loss_coef=0.01), {"mass": "native"})
    check_config(config(actor_train={}), {"accounting": "trajectory", "mass": "native"})


def _proto(**changes):
    rows, _ = batch(0, "gigpo")
    for key, fn in changes.items():
        rows[key] = fn(rows[key])
    return sim.proto(rows)


@pytest.mark.parametrize("change,drop,words", [
    ({}, "traj_id", "missing column 'traj_id'"),
    ({}, "traj_group_id", "missing column 'traj_group_id'"),
    ({}, "sample_uuid", "missing column 'sample_uuid'"),
    ({"traj_group_id": lambda v: ["other"] + v[1:]}, None, "appears under two traj_group_id values"),
    ({"sample_uuid": lambda v: [None] + v[1:]}, None, "'sample_uuid' has no value at row 0"),
    ({"sample_uuid": lambda v: ["same"] * len(v)}, None, "is under two traj_id values"),
    ({"episode_scores": lambda v: [float("nan")] + v[1:]}, None, "'episode_scores' has a NaN"),
])
def test_bad_batches_are_refused_before_anything_is_written(change, drop, words):
    data = _proto(**change)
    if drop:
        data.non_tensor_batch.pop(drop)
    before = {k: v.clone() for k, v in data.batch.items()}
    setup = check_config(config("gigpo"), {"accounting": "trajectory", "mass": "uniform"})
    called = []
    with pytest.raises(ValueError) as info:
        compute_advantage(data, setup=setup, original=lambda data, **kw: called.append(1) or data)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert not called and set(data.batch) == set(before)
    assert all(torch.equal(data.batch[k], before[k]) for k in before)


def test_a_copy_that_is_no_copy_is_refused():
    """A row repeating an earlier row's sample_uuid but with another state is no adjust_batch copy."""
    rows, is_copy = batch(0, "gigpo")
    j = is_copy.index(True)
    rows["state_hash"][j] = "elsewhere"
    setup = check_config(config("gigpo"), {"accounting": "trajectory", "mass": "uniform"})
    with pytest.raises(ValueError, match="repeats an earlier row's sample_uuid"):
        align_batch(columns(sim.proto(rows)), setup.options)


# ------------------------------------------------------------------------------------------ the hook


def test_install_wraps_the_pipeline_function_and_writes_the_batch():
    seen = []

    def agentic_compute_advantage(data, **kwargs):  # ROLL's: here it only records its call
        seen.append(kwargs)
        data.batch["returns"] = torch.zeros_like(data.batch["scores"])
        return data

    module = SimpleNamespace(agentic_compute_advantage=agentic_compute_advantage,
                             compute_response_level_rewards=lambda **kw: None,
                             AgenticPipeline=type("AgenticPipeline", (), {"adjust_batch": lambda self: None}))
    install({"accounting": "trajectory", "mass": "uniform"}, config(), module=module)
    install({"accounting": "trajectory", "mass": "uniform"}, config(), module=module)  # no double wrap
    rows, _ = batch(1, "grpo")
    data = module.agentic_compute_advantage(data=sim.proto(rows), gamma=1.0, lambd=0.95)
    assert seen == [{"gamma": 1.0, "lambd": 0.95}]
    assert {"advantages", "oma_adv", "oma_weights", "returns"} <= set(data.batch)
    assert data.meta_info["metrics"]["oma/trajectories"] == 9.0
    with pytest.raises(RollConfigError, match="written for ROLL at commit 8eb27cc"):
        install({}, config(), module=SimpleNamespace(agentic_compute_advantage=agentic_compute_advantage))


def test_importing_oma_imports_no_roll():
    code = ("import sys, oma, oma.integrations.roll, oma.integrations.roll.batch, oma.integrations.roll.hook; "
            "assert not [m for m in sys.modules if m == 'roll' or m.startswith('roll.')]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_options_reach_hosts():
    setup = check_config(config("gigpo", method="mean", step_reward_weight=0.3), {})
    o = setup.options
    assert (o.estimator, o.norm_by_std, o.step_advantage_w, o.gamma, o.accounting, o.mass) == (
        "gigpo", False, 0.3, 0.0, "trajectory", "uniform")
    assert isinstance(o, hosts.HostOptions)


def test_check_install_refuses_a_folder_that_is_no_checkout(tmp_path, capsys):
    from oma.integrations.roll.__main__ import main

    assert main(["check-install", str(tmp_path)]) == 2
    assert "not a ROLL checkout: expected roll/pipeline/agentic/agentic_pipeline.py" in capsys.readouterr().err
    assert main([]) == 2


def test_the_driver_lines_read_hydras_node_and_rolls_dataclasses():
    """``install(cfg.get("oma"), ppo_config)``: the node is an OmegaConf DictConfig, the config ROLL's dataclasses
    (attributes, here namespaces), with ``reward_normalization`` resolved as ROLL resolves it."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"oma": {"accounting": "trajectory", "mass": "group"}, "adv_estimator": "gigpo"})
    ppo_config = SimpleNamespace(
        adv_estimator="gigpo", loss_agg_mode="token-mean", gamma=1, step_reward_weight=0.5, episode_reward_weight=1.0,
        reward_normalization=SimpleNamespace(grouping="traj_group_id", method="mean_std", norm_mean_type="group",
                                             norm_std_type="group"),
        actor_train=SimpleNamespace(worker_cls=WORKER_CLS, strategy_args=SimpleNamespace(strategy_name="fsdp2_train"),
                                    apply_loss_scale=True, use_dynamic_batching_in_train=False),
        train_infer_correction=SimpleNamespace(filters=[SimpleNamespace(enabled=False)]), use_kl_loss=False,
        entropy_loss_coef=0)
    module = SimpleNamespace(agentic_compute_advantage=lambda data, **kw: data,
                             compute_response_level_rewards=lambda **kw: None,
                             AgenticPipeline=type("AgenticPipeline", (), {"adjust_batch": lambda self: None}))
    setup = install(cfg.get("oma"), ppo_config, module=module)
    o = setup.options
    assert (o.accounting, o.mass, o.estimator, o.step_advantage_w, o.norm_by_std) == ("trajectory", "group", "gigpo", 0.5, True)


def test_dump_dir_writes_each_step_for_the_audit(tmp_path):
    """``oma.dump_dir``: the hook numbers the steps it sees and writes each for ``oma audit``, copies left out."""
    module = SimpleNamespace(agentic_compute_advantage=lambda data, **kw: data,
                             compute_response_level_rewards=lambda **kw: None,
                             AgenticPipeline=type("AgenticPipeline", (), {"adjust_batch": lambda self: None}))
    install({"accounting": "trajectory", "mass": "native", "dump_dir": str(tmp_path)}, config(), module=module)
    rows, is_copy = batch(2, "grpo")
    for _ in range(2):
        module.agentic_compute_advantage(data=sim.proto(rows))
    import pyarrow.parquet as pq

    from oma.batchfile import batch_path

    assert sorted((tmp_path / "batches").iterdir()) == [batch_path(tmp_path, 0), batch_path(tmp_path, 1)]
    assert pq.read_table(batch_path(tmp_path, 0)).num_rows == len(is_copy) - sum(is_copy)
