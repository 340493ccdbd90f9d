"""oma.integrations.skyrl.batch without SkyRL: SkyRL's batch and config read into the host contract
(trajectory ids, row accounting, MA weights, the dump) and the refusals.

The tests against SkyRL itself (its trainer and worker) are in tests/with_skyrl/ (Python >= 3.12 env).
"""

import importlib.metadata
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oma import core, hosts
from oma.diagnostics import audit, read_batch
from oma.hosts import HostConfigError
from oma.integrations.skyrl.batch import (
    changes_skyrl,
    check_binary,
    check_config,
    check_version,
    host_options,
    host_step,
    minibatches,
)


def _algo(oma=None, **over):
    algo = dict(policy_loss_type="regular", advantage_estimator="grpo", loss_reduction="token_mean", max_seq_len=None,
                advantage_batch_normalize=False, grpo_norm_by_std=True, oma=oma if oma is not None else {})
    algo.update(over)
    return SimpleNamespace(**algo)


def _cfg(oma=None, **over):
    step_wise = over.pop("step_wise_trajectories", True)
    return SimpleNamespace(trainer=SimpleNamespace(algorithm=_algo(oma, **over)),
                           generator=SimpleNamespace(step_wise_trajectories=step_wise))


def _step(uids, last, rewards=None, mask=None, pad_size=0):
    rows = len(uids)
    rewards = torch.zeros(rows, 3) if rewards is None else rewards
    return host_step(uids, last, rewards, torch.ones(rows, 3) if mask is None else mask, pad_size)


# ----------------------------------------------------------------------------------- structure


def test_structure_by_hand():
    # p0: trajectory 0 (3 steps), trajectory 1 (1 step); p1: trajectory 2 (2 steps); then one pad row
    uids, last = ["p0", "p0", "p0", "p0", "p1", "p1", "pad0"], [False, False, True, True, False, True, True]
    s = _step(uids, last)
    assert s.traj_index.tolist() == [0, 0, 0, 1, 2, 2, 3]
    assert s.group_index.tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert s.step_index.tolist() == [0, 1, 2, 0, 0, 1, 0]
    padded = _step(uids, last, pad_size=1)  # SkyRL's padding rows (metadata['pad_size']) are no trajectory's
    assert padded.rows == 6 and padded.traj_index.tolist() == [0, 0, 0, 1, 2, 2]


@pytest.mark.parametrize(("uids", "last", "message"), [
    (["a", "a"], None, r"metadata\['is_last_step'\] is missing"),
    (["a", "a"], [True], r"has 1 entries for 2 rows"),
    (["a", "a"], [True, False], r"must be True on the batch's last row"),
    (["a", "b"], [False, True], r"row 1 \(uid 'b'\) continues a trajectory of uid 'a'"),
])
def test_structure_refusals_name_the_key(uids, last, message):
    with pytest.raises(ValueError, match=message):
        _step(uids, last)


# ----------------------------------------------------------------------------- row accounting


def _row_options(estimator="grpo", norm=True, eps=None):
    options = host_options(_algo({"accounting": "row"}, advantage_estimator=estimator, grpo_norm_by_std=norm))
    return options if eps is None else replace(options, eps=eps)


def test_row_accounting_by_hand():
    # one group: trajectory A (3 steps, reward 1 on its last step), trajectory B (1 step, reward 0)
    rewards = torch.zeros(4, 3)
    rewards[2, -1] = 1.0  # only the last step's reward counts in step-wise training
    rewards[0, 0] = 5.0  # an intermediate step's reward is ignored, as SkyRL's step-wise branch does
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    s = _step(["g"] * 4, [False, False, True, True], rewards, mask)
    adv = hosts.advantages(s, _row_options(eps=0.0))
    # members (rows) 1, 1, 1, 0: mean 3/4, unbiased std sqrt((3·(1/4)² + (3/4)²)/3) = 1/2
    assert adv.tolist() == pytest.approx([0.5, 0.5, 0.5, -1.5], abs=1e-7)
    adv_dr = hosts.advantages(s, _row_options(norm=False))
    assert adv_dr.tolist() == pytest.approx([0.25, 0.25, 0.25, -0.75], abs=1e-7)
    # RLOO over rows: each row minus the mean of the 3 others
    adv_rloo = hosts.advantages(s, _row_options("rloo"))
    assert adv_rloo.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, -1.0], abs=1e-6)


def test_row_accounting_equals_a_naive_loop():
    torch.manual_seed(0)
    lengths = [3, 1, 2, 4, 1, 2]
    groups = ["a", "a", "a", "b", "b", "b"]
    uids, last = [], []
    for g, n in zip(groups, lengths, strict=True):
        uids += [g] * n
        last += [False] * (n - 1) + [True]
    rows = len(uids)
    rewards = torch.zeros(rows, 5)
    outcome = torch.rand(len(lengths))
    ends = [i for i, x in enumerate(last) if x]
    for t, e in enumerate(ends):
        rewards[e, torch.randint(5, ()).item()] = outcome[t]
    adv = hosts.advantages(_step(uids, last, rewards, torch.ones(rows, 5)), _row_options())
    traj_of_row = [t for t, n in enumerate(lengths) for _ in range(n)]
    for r in range(rows):
        members = [float(outcome[traj_of_row[q]]) for q in range(rows) if uids[q] == uids[r]]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
        assert adv[r].item() == pytest.approx((float(outcome[traj_of_row[r]]) - mean) / (std + 1e-6), rel=1e-5)


# ------------------------------------------------------------------------------ mass weights


def _batch(pad_size=1):
    # p0: A (3 steps: 2+1+3 tokens), B (1 step: 4 tokens); p1: C (2 steps: 1+1), D (1 step: 2); 1 pad row
    uids = ["p0"] * 4 + ["p1"] * 3 + ["pad0"]
    last = [False, False, True, True, False, True, True, True]
    tokens = [2, 1, 3, 4, 1, 1, 2, 0]
    mask = torch.zeros(len(uids), 4)
    for r, n in enumerate(tokens):
        mask[r, 4 - n:] = 1.0  # right-aligned, as SkyRL lays responses out
    return _step(uids, last, torch.zeros(len(uids), 4), mask, pad_size), mask


def _weights(step, k=1, **algo):
    return hosts.weights(replace(step, minibatches=list(torch.arange(step.rows).tensor_split(k))),
                         host_options(_algo(**algo)))


def _traj_totals(weights, step):
    return core.segment_sum(weights.sum(-1), step.traj_index, int(step.traj_index.max()) + 1)


def test_mass_weights_by_hand():
    s, mask = _batch()
    assert s.rows == 7  # the pad row is left out: no trajectory, no weight
    w = _weights(s, 2)
    # 4 trajectories with tokens: each k/4 = 0.5; token-mean inside: A's 6 tokens 0.5/6 each
    assert _traj_totals(w, s).tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5])
    assert w[0, 3].item() == pytest.approx(0.5 / 6) and w[3, 0].item() == pytest.approx(0.5 / 4)
    wg = _weights(s, 1, oma={"mass": "group"}, loss_reduction="sequence_mean")
    # 2 groups of 2 trajectories: 1/(2·2) each
    assert _traj_totals(wg, s).tolist() == pytest.approx([0.25, 0.25, 0.25, 0.25])
    # sequence_mean inside A: each of its 3 rows 1/3 of A's mass, spread evenly over the row's tokens
    assert w.new_tensor([wg[r].sum().item() for r in range(3)]).tolist() == pytest.approx([0.25 / 3] * 3)
    assert wg[0, 2].item() == pytest.approx(0.25 / 3 / 2)


def test_mass_weights_seq_mean_token_sum_norm_uses_max_seq_len():
    s, mask = _batch()
    w = _weights(s, 1, loss_reduction="seq_mean_token_sum_norm", max_seq_len=8)
    # J_τ = Σ_τ mℓ / (R_τ·L_norm) keeps Dr. GRPO's constant normaliser: τ's total is w_τ·K_τ/(R_τ·8)
    # (A: 6 tokens, 3 rows; B: 4, 1; C: 2, 2; D: 2, 1), with w_τ = 1/4
    assert _traj_totals(w, s).tolist() == pytest.approx([0.25 * 6 / 24, 0.25 * 4 / 8, 0.25 * 2 / 16, 0.25 * 2 / 8])
    expected = core.token_weights(mask[:7].bool(), s.group_index, s.traj_index, reducer="seq-mean-token-sum-norm",
                                  mass="uniform", loss_scale_factor=8.0)
    assert torch.allclose(w, expected)


def test_native_mass_is_skyrls_reduction_per_mini_batch():
    s, mask = _batch()
    cut = minibatches([(0, 4), (4, 8)], s.rows)  # SkyRL's boundaries cover its padding row too: cut to the step
    assert [idx.tolist() for idx in cut] == [[0, 1, 2, 3], [4, 5, 6]]
    w = hosts.weights(replace(s, minibatches=cut), host_options(_algo({"mass": "native"})))
    for idx in cut:  # token_mean: every token of a mini-batch 1 / its tokens
        assert w[idx].sum().item() == pytest.approx(1.0) and set(w[idx][mask[idx] > 0].tolist()) == {1 / mask[idx].sum().item()}


def test_a_fractional_loss_mask_is_refused_under_mass_alignment():
    _, mask = _batch()
    check_binary(mask)
    mask[0, 3] = 0.5
    with pytest.raises(ValueError, match=r"loss_mask must be 0/1 with trainer\.algorithm\.oma\.mass != native"):
        check_binary(mask)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 5), min_size=1, max_size=4)), min_size=1,
                max_size=8), st.sampled_from(["uniform", "group"]), st.integers(1, 4), st.randoms(use_true_random=False))
def test_mass_weights_invariant_to_trajectory_order(trajs, mass, k, rnd):
    """Reordering whole trajectories permutes the weights with their rows; totals stay the targets."""
    if not any(sum(steps) for _, steps in trajs):
        return
    def build(order):
        uids, last, tokens = [], [], []
        for t in order:
            g, steps = trajs[t]
            uids += [f"p{g}"] * len(steps)
            last += [False] * (len(steps) - 1) + [True]
            tokens += steps
        mask = torch.zeros(len(tokens), 5)
        for r, n in enumerate(tokens):
            mask[r, 5 - n:] = 1.0
        return _step(uids, last, torch.zeros(len(tokens), 5), mask)
    order = list(range(len(trajs)))
    shuffled = order[:]
    rnd.shuffle(shuffled)
    s1, s2 = build(order), build(shuffled)
    w1 = _weights(s1, k, oma={"mass": mass})
    w2 = _weights(s2, k, oma={"mass": mass})
    assert w1.sum().item() == pytest.approx(k)
    t1, t2 = _traj_totals(w1, s1), _traj_totals(w2, s2)
    for pos, t in enumerate(shuffled):
        assert t2[pos].item() == pytest.approx(t1[t].item(), abs=1e-12)


# ------------------------------------------------------------------------------------- audit


def test_the_dump_round_trip(tmp_path):
    s, mask = _batch(pad_size=0)
    rewards = torch.zeros(len(mask), 4)
    rewards[2, -1] = 1.0  # trajectory A wins
    rewards[5, -1] = 1.0  # trajectory C wins
    uids = ["p0"] * 4 + ["p1"] * 3 + ["pad0"]
    last = [False, False, True, True, False, True, True, True]
    path = hosts.dump(host_step(uids, last, rewards, mask, 1), host_options(_algo({"dump_dir": str(tmp_path)})), 7)
    assert path == tmp_path / "batches" / "iter_000007.parquet"
    b = read_batch(path)
    assert b.traj_index.tolist() == [0, 0, 0, 1, 2, 2, 3]  # the padding row is left out
    assert b.scores.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]  # each trajectory's last step's reward
    assert b.response_tokens.tolist() == [2, 1, 3, 4, 1, 1, 2]
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens)
    # native token-mean: A holds 6 of the 14 tokens; aligned: each of 4 trajectories 1/4
    assert r.to_dict()["trajectories"] == 4
    assert r.mass_share_success["row+native"] == pytest.approx((6 + 2) / 14)


# ---------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("node", "message"), [
    ({"mass": "tokens"}, "trainer.algorithm.oma.mass must be one of ['native', 'uniform', 'group'], got 'tokens'"),
    ({"accounting": "rows"}, "trainer.algorithm.oma.accounting must be one of ['row', 'trajectory'], got 'rows'"),
    ({"masss": "uniform"}, "trainer.algorithm.oma.masss is not an option; known: ['accounting', 'mass', 'dump_dir']"),
    ({"audit_dir": "/x"}, "trainer.algorithm.oma.audit_dir was renamed trainer.algorithm.oma.dump_dir: set that instead"),
    ({"estimator": "rloo"}, "trainer.algorithm.oma.estimator is set by trainer.algorithm.advantage_estimator: set that "
                            "instead"),
    ({"reducer": "token-sum"}, "trainer.algorithm.oma.reducer is set by trainer.algorithm.loss_reduction: set that "
                               "instead"),
    ({"norm_by_std": False}, "trainer.algorithm.oma.norm_by_std is set by trainer.algorithm.grpo_norm_by_std"),
    ({"gamma": 0.9}, "trainer.algorithm.oma.gamma is GiGPO's, which SkyRL does not run: not an option here"),
])
def test_options_refuse_in_one_line_naming_the_key(node, message):
    with pytest.raises(HostConfigError) as e:
        check_config(_cfg(node))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_options_take_skyrls_own_settings():
    o = host_options(_algo({"accounting": "row", "dump_dir": "/runs/x"}, advantage_estimator="rloo",
                           grpo_norm_by_std=False, loss_reduction="seq_mean_token_sum_norm", max_seq_len=512))
    assert (o.prefix, o.accounting, o.mass, o.dump_dir) == ("trainer.algorithm.oma", "row", "uniform", "/runs/x")
    assert (o.estimator, o.norm_by_std, o.reducer, o.loss_scale_factor, o.outcome) == (
        "rloo", False, "seq-mean-token-sum-norm", 512.0, "final")


def test_another_skyrl_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.0")
    with pytest.raises(HostConfigError) as e:
        check_version()
    assert str(e.value) == ("oma's skyrl integration supports skyrl 0.4.x (tested on 0.4.0); the installed skyrl is "
                            "0.5.0: pip install 'skyrl==0.4.0'")


@pytest.mark.parametrize(("oma", "over", "message"), [
    ({}, {"step_wise_trajectories": False}, r"generator\.step_wise_trajectories must be true"),
    ({}, {"policy_loss_type": "sapo"}, r"trainer\.algorithm\.policy_loss_type must be one of"),
    ({"accounting": "row", "mass": "native"}, {"advantage_estimator": "maxrl"},
     r"trainer\.algorithm\.advantage_estimator must be one of \['grpo', 'rloo'\]"),
    ({}, {"loss_reduction": "prompt_mean"}, r"trainer\.algorithm\.loss_reduction must be one of"),
    ({}, {"loss_reduction": "seq_mean_token_sum_norm"}, r"trainer\.algorithm\.max_seq_len must be set"),
    ({}, {"advantage_batch_normalize": True}, r"trainer\.algorithm\.advantage_batch_normalize must be false"),
    ("uniform", {}, r"trainer\.algorithm\.oma must be a mapping of options \(accounting, mass, dump_dir\), got str"),
])
def test_check_config_refuses_by_key(oma, over, message):
    with pytest.raises(ValueError, match=message):
        check_config(_cfg(oma, **over))


def test_check_config_lets_skyrl_semantics_through():
    # trajectory + native is SkyRL unmodified: nothing to refuse, even where OMA could not run
    off = {"accounting": "trajectory", "mass": "native"}
    options = check_config(_cfg(off, step_wise_trajectories=False, policy_loss_type="sapo"))
    assert not changes_skyrl(options) and (options.accounting, options.mass) == ("trajectory", "native")
    # row accounting with native mass needs no per-trajectory reducer
    assert changes_skyrl(check_config(_cfg({"accounting": "row", "mass": "native"}, loss_reduction="prompt_mean")))
