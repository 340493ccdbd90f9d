"""oma.integrations.skyrl.batch without SkyRL: trajectory ids, row accounting, MA weights, refusals.

The tests against SkyRL itself (its trainer and worker) are in tests/skyrl/ (Python >= 3.12 env).
"""

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oma import core
from oma.diagnostics import audit, read_batch
from oma.integrations.skyrl.batch import (
    OMAConfig,
    check_config,
    mass_weights,
    row_accounted_advantages,
    stepwise_structure,
    write_audit_batch,
)


def _cfg(oma=None, **over):
    algo = dict(policy_loss_type="regular", advantage_estimator="grpo", loss_reduction="token_mean", max_seq_len=None,
                advantage_batch_normalize=False, oma=oma if oma is not None else OMAConfig())
    step_wise = over.pop("step_wise_trajectories", True)
    algo.update(over)
    return SimpleNamespace(trainer=SimpleNamespace(algorithm=SimpleNamespace(**algo)),
                           generator=SimpleNamespace(step_wise_trajectories=step_wise))


# ----------------------------------------------------------------------------------- structure


def test_structure_by_hand():
    # p0: trajectory 0 (3 steps), trajectory 1 (1 step); p1: trajectory 2 (2 steps); then one pad row
    s = stepwise_structure(["p0", "p0", "p0", "p0", "p1", "p1", "pad0"], [False, False, True, True, False, True, True])
    assert s.traj_index.tolist() == [0, 0, 0, 1, 2, 2, 3]
    assert s.group_index.tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert s.step_index.tolist() == [0, 1, 2, 0, 0, 1, 0]


@pytest.mark.parametrize(("uids", "last", "message"), [
    (["a", "a"], None, r"metadata\['is_last_step'\] is missing"),
    (["a", "a"], [True], r"has 1 entries for 2 rows"),
    (["a", "a"], [True, False], r"must be True on the batch's last row"),
    (["a", "b"], [False, True], r"row 1 \(uid 'b'\) continues a trajectory of uid 'a'"),
])
def test_structure_refusals_name_the_key(uids, last, message):
    with pytest.raises(ValueError, match=message):
        stepwise_structure(uids, last)


# ----------------------------------------------------------------------------- row accounting


def test_row_accounting_by_hand():
    # one group: trajectory A (3 steps, reward 1 on its last step), trajectory B (1 step, reward 0)
    s = stepwise_structure(["g"] * 4, [False, False, True, True])
    rewards = torch.zeros(4, 3)
    rewards[2, -1] = 1.0  # only the last step's reward counts in step-wise training
    rewards[0, 0] = 5.0  # an intermediate step's reward is ignored, as SkyRL's step-wise branch does
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    adv = row_accounted_advantages(rewards, mask, s, estimator="grpo", norm_by_std=True, eps=0.0)
    # members (rows) 1, 1, 1, 0: mean 3/4, unbiased std sqrt((3·(1/4)² + (3/4)²)/3) = 1/2
    expected_row = torch.tensor([0.5, 0.5, 0.5, -1.5])
    assert torch.allclose(adv, expected_row.unsqueeze(-1) * mask, atol=1e-7)
    adv_dr = row_accounted_advantages(rewards, mask, s, estimator="grpo", norm_by_std=False)
    assert torch.allclose(adv_dr, torch.tensor([0.25, 0.25, 0.25, -0.75]).unsqueeze(-1) * mask, atol=1e-7)
    # RLOO over rows: each row minus the mean of the 3 others
    adv_rloo = row_accounted_advantages(rewards, mask, s, estimator="rloo", norm_by_std=True)
    assert torch.allclose(adv_rloo, torch.tensor([1 / 3, 1 / 3, 1 / 3, -1.0]).unsqueeze(-1) * mask, atol=1e-6)


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
    mask = torch.ones(rows, 5, dtype=torch.long)
    adv = row_accounted_advantages(rewards, mask, stepwise_structure(uids, last), estimator="grpo", norm_by_std=True)
    traj_of_row = [t for t, n in enumerate(lengths) for _ in range(n)]
    for r in range(rows):
        members = [float(outcome[traj_of_row[q]]) for q in range(rows) if uids[q] == uids[r]]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
        assert adv[r, 0].item() == pytest.approx((float(outcome[traj_of_row[r]]) - mean) / (std + 1e-6), rel=1e-5)


# ------------------------------------------------------------------------------ mass weights


def _batch():
    # p0: A (3 steps: 2+1+3 tokens), B (1 step: 4 tokens); p1: C (2 steps: 1+1), D (1 step: 2); 1 pad row
    uids = ["p0"] * 4 + ["p1"] * 3 + ["pad0"]
    last = [False, False, True, True, False, True, True, True]
    tokens = [2, 1, 3, 4, 1, 1, 2, 0]
    mask = torch.zeros(len(uids), 4)
    for r, n in enumerate(tokens):
        mask[r, 4 - n:] = 1.0  # right-aligned, as SkyRL lays responses out
    return stepwise_structure(uids, last), mask


def _traj_totals(weights, structure):
    return core.segment_sum(weights.sum(-1), structure.traj_index, int(structure.traj_index.max()) + 1)


def test_mass_weights_by_hand():
    s, mask = _batch()
    w = mass_weights(mask, s, mass="uniform", loss_reduction="token_mean", max_seq_len=None, n_minibatches=2)
    # 4 trajectories with tokens: each k/4 = 0.5; token-mean inside: A's 6 tokens 0.5/6 each; pad row nothing
    assert _traj_totals(w, s).tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.0])
    assert w[0, 3].item() == pytest.approx(0.5 / 6) and w[3, 0].item() == pytest.approx(0.5 / 4)
    assert w[7].abs().sum().item() == 0.0
    wg = mass_weights(mask, s, mass="group", loss_reduction="sequence_mean", max_seq_len=None, n_minibatches=1)
    # 2 groups (the pad group has no trainable token) of 2 trajectories: 1/(2·2) each
    assert _traj_totals(wg, s).tolist() == pytest.approx([0.25, 0.25, 0.25, 0.25, 0.0])
    # sequence_mean inside A: each of its 3 rows 1/3 of A's mass, spread evenly over the row's tokens
    assert w.new_tensor([wg[r].sum().item() for r in range(3)]).tolist() == pytest.approx([0.25 / 3] * 3)
    assert wg[0, 2].item() == pytest.approx(0.25 / 3 / 2)


def test_mass_weights_seq_mean_token_sum_norm_uses_max_seq_len():
    s, mask = _batch()
    w = mass_weights(mask, s, mass="uniform", loss_reduction="seq_mean_token_sum_norm", max_seq_len=8, n_minibatches=1)
    # J_τ = Σ_τ mℓ / (R_τ·L_norm) keeps Dr. GRPO's constant normaliser: τ's total is w_τ·K_τ/(R_τ·8)
    # (A: 6 tokens, 3 rows; B: 4, 1; C: 2, 2; D: 2, 1), with w_τ = 1/4
    assert _traj_totals(w, s)[:4].tolist() == pytest.approx([0.25 * 6 / 24, 0.25 * 4 / 8, 0.25 * 2 / 16, 0.25 * 2 / 8])
    expected = core.token_weights(mask.bool(), s.group_index, s.traj_index, reducer="seq-mean-token-sum-norm",
                                  mass="uniform", loss_scale_factor=8.0)
    assert torch.allclose(w, expected)


def test_mass_weights_refuse_fractional_loss_mask_and_bad_mass():
    s, mask = _batch()
    mask[0, 3] = 0.5
    with pytest.raises(ValueError, match="loss_mask must be 0/1"):
        mass_weights(mask, s, mass="uniform", loss_reduction="token_mean", max_seq_len=None, n_minibatches=1)
    with pytest.raises(ValueError, match="mass='native' is not a valid option"):
        mass_weights(mask.round(), s, mass="native", loss_reduction="token_mean", max_seq_len=None, n_minibatches=1)


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
        return stepwise_structure(uids, last), mask
    order = list(range(len(trajs)))
    shuffled = order[:]
    rnd.shuffle(shuffled)
    s1, m1 = build(order)
    s2, m2 = build(shuffled)
    w1 = mass_weights(m1, s1, mass=mass, loss_reduction="token_mean", max_seq_len=None, n_minibatches=k)
    w2 = mass_weights(m2, s2, mass=mass, loss_reduction="token_mean", max_seq_len=None, n_minibatches=k)
    assert w1.sum().item() == pytest.approx(k)
    t1, t2 = _traj_totals(w1, s1), _traj_totals(w2, s2)
    for pos, t in enumerate(shuffled):
        assert t2[pos].item() == pytest.approx(t1[t].item(), abs=1e-12)


# ------------------------------------------------------------------------------------- audit


def test_audit_batch_round_trip(tmp_path):
    s, mask = _batch()
    rewards = torch.zeros(len(mask), 4)
    rewards[2, -1] = 1.0  # trajectory A wins
    rewards[5, -1] = 1.0  # trajectory C wins
    path = write_audit_batch(tmp_path, 7, s, rewards, mask, pad_size=1)
    assert path == tmp_path / "batches" / "iter_000007.parquet"
    b = read_batch(path)
    assert b.traj_index.tolist() == [0, 0, 0, 1, 2, 2, 3]  # the padding row is left out
    assert b.scores.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert b.response_tokens.tolist() == [2, 1, 3, 4, 1, 1, 2]
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens)
    # native token-mean: A holds 6 of the 14 tokens; aligned: each of 4 trajectories 1/4
    assert r.to_dict()["trajectories"] == 4
    assert r.mass_share_success["row+native"] == pytest.approx((6 + 2) / 14)


# ---------------------------------------------------------------------------------- refusals


def test_options_refuse_unknown_values_naming_the_key():
    with pytest.raises(ValueError, match=r"trainer\.algorithm\.oma\.mass='tokens' is not a valid option"):
        OMAConfig(mass="tokens")
    with pytest.raises(ValueError, match=r"trainer\.algorithm\.oma\.accounting='rows'"):
        OMAConfig(accounting="rows")


@pytest.mark.parametrize(("oma", "over", "message"), [
    (OMAConfig(), {"step_wise_trajectories": False}, r"generator\.step_wise_trajectories must be true"),
    (OMAConfig(), {"policy_loss_type": "sapo"}, r"trainer\.algorithm\.policy_loss_type must be one of"),
    (OMAConfig(accounting="row", mass="native"), {"advantage_estimator": "maxrl"},
     r"trainer\.algorithm\.advantage_estimator must be one of \['grpo', 'rloo'\]"),
    (OMAConfig(), {"loss_reduction": "prompt_mean"}, r"trainer\.algorithm\.loss_reduction must be one of"),
    (OMAConfig(), {"loss_reduction": "seq_mean_token_sum_norm"}, r"trainer\.algorithm\.max_seq_len must be set"),
    (OMAConfig(), {"advantage_batch_normalize": True}, r"trainer\.algorithm\.advantage_batch_normalize must be false"),
    ("uniform", {}, r"trainer\.algorithm\.oma must be an oma OMAConfig"),
])
def test_check_config_refuses_by_key(oma, over, message):
    with pytest.raises(ValueError, match=message):
        check_config(_cfg(oma, **over))


def test_check_config_lets_skyrl_semantics_through():
    # trajectory + native is SkyRL unmodified: nothing to refuse, even where OMA could not run
    off = OMAConfig(accounting="trajectory", mass="native")
    assert not off.active
    assert check_config(_cfg(off, step_wise_trajectories=False, policy_loss_type="sapo")) is off
    # row accounting with native mass needs no per-trajectory reducer
    assert check_config(_cfg(OMAConfig(accounting="row", mass="native"), loss_reduction="prompt_mean")).active
