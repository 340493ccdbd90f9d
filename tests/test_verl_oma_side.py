"""oma's side of the verl integration, with no verl needed: session keys, the trainer's batch
computation, the config checks, the estimators' options and the refusals (the verl-free tests of
the integration; the ones against verl itself are in the other test_verl_* modules)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oma import core, hosts
from oma.diagnostics import read_batch
from oma.hosts import HostConfigError
from oma.integrations.verl.batch import (
    UnsupportedConfigError,
    check_trainer_config,
    compute_oma_batch,
    host_step,
)
from oma.integrations.verl.estimators import ESTIMATOR_FUNCTIONS
from oma.integrations.verl.options import host_options

from test_verl_support import random_rows, session_batch, trainer_config


def _keys_step(keys, **kw):
    rows = len(keys)
    return host_step(keys, torch.zeros(rows, 2), torch.ones(rows, 2, dtype=torch.bool), **kw)


def test_session_keys_are_the_steps_ids():
    # groups a, a, my_uid, a, my_uid; trajectories a_b, a_b, my_uid_1, a_c, my_uid_0 (split from the right)
    step = _keys_step(["a_b_0", "a_b_1", "my_uid_1_0", "a_c_0", "my_uid_0_3"], padding=[False, False, False, True, False])
    assert step.group_index.tolist() == [0, 0, 1, 0, 1]
    assert step.traj_index.tolist() == [0, 0, 1, 2, 3]
    assert step.step_index.tolist() == [0, 1, 0, 0, 3]
    assert step.copies.tolist() == [False, False, False, True, False]  # verl's is_padding tag
    with pytest.raises(ValueError, match="uid"):
        _keys_step(["nounderscore"])
    with pytest.raises(ValueError, match="duplicated"):
        _keys_step(["a_0_1", "a_0_1"])


def test_worked_example_gives_oma_core_values():
    """docs/math.md#worked-example (4 successes × 10 rows, 4 failures × 50 rows) plus a second group, by session keys."""
    keys, rewards, mask, g, t, _ = session_batch([[10] * 4 + [50] * 4, [3, 7, 7, 1]], [[10] * 4 + [0] * 4, [1, 0, 1, 1]])
    out = compute_oma_batch(rewards, mask, keys, trainer_config().algorithm)
    per_row = out.advantages[torch.arange(len(keys)), mask.float().argmax(-1)]
    assert per_row[:40].tolist() == pytest.approx([0.9354] * 40, abs=1e-4)
    assert per_row[40:240].tolist() == pytest.approx([-0.9354] * 200, abs=1e-4)
    expected_adv = core.outcome_advantages(rewards.sum(-1).double(), g, t)
    torch.testing.assert_close(out.advantages, (expected_adv.unsqueeze(-1) * mask).float())
    expected_w = core.token_weights(mask, g, t, reducer="token-mean", mass="uniform")
    torch.testing.assert_close(out.weights, expected_w)
    torch.testing.assert_close(out.weighted_advantages, (expected_adv.unsqueeze(-1) * expected_w).float())
    mass = core.implicit_mass(mask, g, t, reducer="token-mean", mass="uniform")
    torch.testing.assert_close(mass, torch.full((12,), 1 / 12, dtype=torch.float64))
    assert out.metrics["oma/trajectories"] == 12 and out.metrics["oma/optimizer_steps"] == 1


def test_native_weights_per_minibatch_aligned_weights_over_the_step():
    """mass native is verl's reducer on each mini-batch; Mass Alignment is the whole step's weights × k, so
    a trajectory cut by a mini-batch boundary keeps its mass (docs/verl.md#exact-mass)."""
    keys, rewards, mask, g, t, _ = session_batch([[2, 3, 1, 2], [1, 3, 2, 2]], [[1, 0, 0, 1], [0, 1, 1, 0]])
    cfg = trainer_config().algorithm
    cfg.oma.reducer = "seq-mean-token-mean"
    cfg.oma.mass = "native"
    out = compute_oma_batch(rewards, mask, keys, cfg, dp_size=2, mini_batch_rows=8)
    assert len(out.step.layout) == 2
    for idx in out.step.layout:
        torch.testing.assert_close(out.weights[idx], core.token_weights(mask[idx], g[idx], t[idx], reducer="seq-mean-token-mean", mass="native"))
        assert float(out.weights[idx].sum()) == pytest.approx(1.0)  # verl's normaliser: total 1 per optimizer step
    cfg.oma.mass = "group"
    out = compute_oma_batch(rewards, mask, keys, cfg, dp_size=2, mini_batch_rows=8)
    torch.testing.assert_close(out.weights, 2 * core.token_weights(mask, g, t, reducer="seq-mean-token-mean", mass="group"))
    group_mass = core.segment_sum(out.weights.sum(-1), g, 2)
    torch.testing.assert_close(group_mass, torch.ones(2, dtype=torch.float64))  # each group 1/G of k = 2


def test_check_trainer_config_accepts_the_supported_setup():
    opts = check_trainer_config(trainer_config())
    assert opts.accounting == "trajectory" and opts.mass == "uniform"
    check_trainer_config(trainer_config(policy_loss={"loss_mode": "gspo"}))


@pytest.mark.parametrize(
    "change,match",
    [
        ({"loss_agg_mode": "token-mean"}, "token-sum"),
        ({"policy_loss": {"loss_mode": "dppo_tv"}}, "loss_mode"),
        ({"policy_loss": {"loss_mode": "clip_cov"}}, "loss_mode"),
        ({"policy_loss": {"loss_mode": "bypass_mode"}}, "loss_mode"),
        ({"use_kl_loss": True}, "use_kl_in_reward"),
        ({"entropy_coeff": 0.01}, "entropy"),
        ({"shuffle": True}, "shuffle"),
    ],
)
def test_check_trainer_config_refuses_inexact_combinations(change, match):
    with pytest.raises(UnsupportedConfigError, match=match):
        check_trainer_config(trainer_config(**change))


def test_check_trainer_config_refuses_non_oma_estimator_and_pf_ppo():
    cfg = trainer_config()
    cfg.algorithm.adv_estimator = "grpo"
    with pytest.raises(UnsupportedConfigError, match="adv_estimator"):
        check_trainer_config(cfg)
    cfg = trainer_config()
    cfg.algorithm.use_pf_ppo = True
    with pytest.raises(UnsupportedConfigError, match="pf_ppo"):
        check_trainer_config(cfg)


def test_session_numbers_repeating_across_groups_are_distinct_trajectories():
    keys, rewards, mask, g, t, _ = session_batch([[2, 3], [4, 1]], [[1, 0], [0, 1]])
    uid = np.array([k.rsplit("_", 2)[0] for k in keys], dtype=object)
    session = np.array([int(k.rsplit("_", 2)[1]) for k in keys])  # 0/1 in both groups
    adv, _ = ESTIMATOR_FUNCTIONS["oma_rloo"](rewards, mask.float(), uid, {"oma": {"mass": "native"}}, traj_index=session)
    expected = core.outcome_advantages(rewards.sum(-1).double(), g, t, estimator="rloo").float()
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask.float())


def test_refuses_mass_alignment_outside_oma_trainer():
    rewards, mask, uid = random_rows()
    with pytest.raises(ValueError, match="Mass Alignment"):  # default mass=uniform
        ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, {"oma": {"accounting": "row"}})


def test_options_defaults_and_validation():
    opts = host_options(None)
    assert (opts.accounting, opts.mass, opts.reducer, opts.norm_by_std, opts.gamma, opts.step_advantage_w) == (
        "trajectory", "uniform", "token-mean", True, 0.95, 1.0,
    )
    assert opts.prefix == "algorithm.oma" and opts.dump_dir is None and opts.estimator == "grpo"
    assert host_options({"adv_estimator": "oma_rloo"}).estimator == "rloo"
    assert host_options({"adv_estimator": "oma_rloo"}, estimator="oma_gigpo").estimator == "gigpo"
    assert host_options({"norm_adv_by_std_in_grpo": False}).norm_by_std is False
    assert host_options({"norm_adv_by_std_in_grpo": False, "oma": {"norm_by_std": True}}).norm_by_std
    assert host_options({"oma": {}}, loss_scale_factor=8).loss_scale_factor == 8.0
    assert host_options({"oma": {"loss_scale_factor": 4}}, loss_scale_factor=8).loss_scale_factor == 4


@pytest.mark.parametrize(("node", "message"), [
    ({"acounting": "row"}, "algorithm.oma.acounting is not an option; known: ['accounting', 'mass', 'reducer', "),
    ({"accounting": "rows"}, "algorithm.oma.accounting must be one of ['row', 'trajectory'], got 'rows'"),
    ({"mass": "tokens"}, "algorithm.oma.mass must be one of ['native', 'uniform', 'group'], got 'tokens'"),
    ({"estimator": "rloo"}, "algorithm.oma.estimator is not an option: algorithm.adv_estimator names it (oma_grpo, "),
    ({"outcome": "last"}, "algorithm.oma.outcome must be one of ['mean', 'final'], got 'last'"),
    ({"dump_dir": None, "gamma": 2}, "algorithm.oma.gamma must be a finite number in [0, 1], got 2"),
])
def test_a_bad_option_is_refused_in_one_line_naming_the_key(node, message):
    with pytest.raises(HostConfigError) as e:
        host_options({"oma": node})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    with pytest.raises(HostConfigError, match="algorithm.oma"):  # at the trainer's start-up, before anything
        cfg = trainer_config()
        cfg.algorithm.oma = node
        check_trainer_config(cfg)


def test_check_trainer_config_refuses_a_critic():
    cfg = trainer_config()
    cfg.critic = {"enable": True}
    with pytest.raises(UnsupportedConfigError, match="critic.enable=True"):
        check_trainer_config(cfg)
    cfg.critic.enable = False
    check_trainer_config(cfg)


def test_outcome_final_is_verls_final_row_rule():
    """Trajectory a: rows scored 0, 0, 1 (a reward model scoring every row); b: 0, 0; c: 1; d: 0.5, 0.
    mean: R = 1/3, 0, 1, 0.25. final: R = 1, 0, 1, 0 (the last row's score, broadcast)."""
    rewards = torch.zeros(8, 3)
    rewards[:, -1] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0])
    mask = torch.ones(8, 3)
    uid = np.array(["g"] * 8, dtype=object)
    traj = np.array(["a", "a", "a", "b", "b", "c", "d", "d"], dtype=object)
    step = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1])
    g = torch.zeros(8, dtype=torch.int64)
    t = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3])
    scores = rewards.sum(-1).double()

    def final_row_scores(step_index):
        step = hosts.HostStep(group_index=g, traj_index=t, scores=scores, response_mask=mask.bool(), step_index=step_index)
        return hosts.outcome_scores(step, host_options({"oma": {"outcome": "final"}}))

    assert final_row_scores(step).tolist() == [1, 1, 1, 0, 0, 1, 0, 0]
    assert final_row_scores(torch.tensor([2, 1, 0, 0, 1, 0, 1, 0])).tolist() == [0, 0, 0, 0, 0, 1, 0.5, 0.5]
    for outcome, r in (("mean", [1 / 3, 0, 1, 0.25]), ("final", [1, 0, 1, 0])):
        cfg = {"oma": {"mass": "native", "outcome": outcome}}
        adv, _ = ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, cfg, traj_index=traj, step_index=step)
        expected = core.outcome_advantages(torch.tensor(r, dtype=torch.float64)[t], g, t).float()
        torch.testing.assert_close(adv[:, 0], expected)
    adv_rows, _ = ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, {"oma": {"mass": "native", "outcome": "final"}},
                                                  traj_index=traj)  # no step_index: the row order
    torch.testing.assert_close(adv_rows, adv)
    with pytest.raises(ValueError, match="algorithm.oma.outcome"):
        ESTIMATOR_FUNCTIONS["oma_grpo"](rewards, mask, uid, {"oma": {"mass": "native", "outcome": "last"}}, traj_index=traj)


def _padded(keys, rewards, mask, pads=2):
    """verl's synthetic padding rows appended: keys pad<hex>_{i}_0, an empty response, tag is_padding."""
    keys = keys + [f"padfeed_{i}_0" for i in range(pads)]
    rewards = torch.cat([rewards, torch.zeros(pads, rewards.shape[1])])
    mask = torch.cat([mask, torch.zeros(pads, mask.shape[1], dtype=torch.bool)])
    return keys, rewards, mask, [k.startswith("pad") for k in keys]


def test_dump_dir_writes_what_the_trainer_trains_without_verls_padding_rows(tmp_path):
    keys, rewards, mask, g, t, s = session_batch([[2, 3], [1, 2]], [[1, 0], [0, 1]])
    keys, rewards, mask, padding = _padded(keys, rewards, mask)
    cfg = trainer_config().algorithm
    cfg.oma.dump_dir = str(tmp_path)
    out = compute_oma_batch(rewards, mask, keys, cfg, dp_size=1, mini_batch_rows=5, padding=padding, iteration=5)
    b = read_batch(tmp_path / "batches" / "iter_000005.parquet")
    assert (b.group_index.tolist(), b.traj_index.tolist(), b.step_index.tolist()) == (g.tolist(), t.tolist(), s.tolist())
    assert b.scores.tolist() == rewards[:8].sum(-1).tolist() and b.response_tokens.tolist() == mask[:8].sum(-1).tolist()
    assert out.metrics["oma/padding_copies"] == 2 and out.metrics["oma/trajectories"] == 4
    assert out.metrics["oma/optimizer_steps"] == 2 and out.metrics["oma/zero_spread_groups"] == 0.0
    assert "oma/degenerate_groups" not in out.metrics  # renamed: the hosts' name, a share of the groups


def test_a_refused_step_writes_nothing(tmp_path):
    keys, rewards, mask, *_ = session_batch([[2, 3], [1, 2]], [[1, 0], [0, 1]])
    cfg = trainer_config().algorithm
    cfg.oma.dump_dir = str(tmp_path)
    with pytest.raises(ValueError, match="algorithm.oma.dump_dir is set: align\\(\\) needs the step's iteration"):
        compute_oma_batch(rewards, mask, keys, cfg)
    cfg.adv_estimator = "oma_gigpo"
    with pytest.raises(ValueError, match="oma_gigpo needs anchor ids"):
        compute_oma_batch(rewards, mask, keys, cfg, iteration=1)
    cfg.adv_estimator = "grpo"
    with pytest.raises(ValueError, match="algorithm.adv_estimator must be one of"):
        compute_oma_batch(rewards, mask, keys, cfg, iteration=1)
    assert not any(tmp_path.iterdir())


def test_the_cpu_rollout_engine_loads_local_files_only(tmp_path, monkeypatch):
    """#58 item 11: the engine of verl's CPU rollout (hf_rollout.py) and of SkyRL's, oma.integrations.tiny_model.Sampler,
    passes local_files_only=True to from_pretrained: a path that is not a local folder fails, it never reaches the Hub."""
    from transformers import AutoModelForCausalLM

    from oma.integrations.tiny_model import Sampler, build

    build(tmp_path / "model")
    calls = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    threads = torch.get_num_threads()
    try:
        Sampler(str(tmp_path / "model"))
    finally:
        torch.set_num_threads(threads)  # the engine takes one thread for its process; this one is the suite's
    assert [kwargs.get("local_files_only") for kwargs in calls] == [True]


def test_every_from_pretrained_in_oma_loads_local_files_only():
    """#58 item 11: no `from_pretrained` call in src/oma can reach the Hub (docs/guarantees.md says every one passes
    local_files_only=True), read from the source with ``ast``."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "oma"
    calls = [(path, node) for path in sorted(src.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained"]
    assert len(calls) >= 5  # the policy's model and tokenizers, the CPU engines' model and tokenizer
    online = [f"{path.relative_to(src)}:{node.lineno}" for path, node in calls
              if not any(k.arg == "local_files_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                         for k in node.keywords)]
    assert online == []
