"""oma.core on small cases written out as arithmetic (docs/math.md#worked-example and friends)."""

import math

import pytest
import torch

from oma.core import (
    clipped_tokens,
    discounted_returns,
    gigpo_advantages,
    group_outcome_stats,
    implicit_mass,
    kl_k3,
    outcome_advantages,
    token_entropy,
    token_objective,
    token_weights,
    weighted_loss,
)


def close(actual, expected, abs=1e-12):
    torch.testing.assert_close(actual.to(torch.float64), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=abs)


def worked_example():
    """One group, 8 trajectories: 4 successes (R=10, 10 rows), 4 failures (R=0, 50 rows), 1 token/row."""
    rows = torch.tensor([10] * 4 + [50] * 4)
    traj = torch.repeat_interleave(torch.arange(8), rows)
    scores = torch.tensor([10.0] * 4 + [0.0] * 4, dtype=torch.float64).repeat_interleave(rows)
    group = torch.zeros_like(traj)
    mask = torch.ones(traj.shape[0], 3, dtype=torch.bool)
    return scores, group, traj, mask


def test_worked_example_outcome_statistics():
    scores, group, traj, _ = worked_example()
    row = group_outcome_stats(scores, group, traj, accounting="row")
    assert row.mean.item() == pytest.approx(400 / 240)
    # unbiased std over 240 rows: 40 tens, 200 zeros
    mu = 400 / 240
    assert row.std.item() == pytest.approx(math.sqrt((40 * (10 - mu) ** 2 + 200 * mu**2) / 239))
    assert row.std.item() == pytest.approx(3.735, abs=5e-4)
    t = group_outcome_stats(scores, group, traj, accounting="trajectory")
    assert t.mean.item() == 5.0
    assert t.std.item() == pytest.approx(math.sqrt(8 * 25 / 7))
    assert t.members.tolist() == [8] and row.members.tolist() == [240]


def test_worked_example_advantages():
    scores, group, traj, _ = worked_example()
    a_row = outcome_advantages(scores, group, traj, accounting="row")
    a_traj = outcome_advantages(scores, group, traj, accounting="trajectory")
    assert a_row[0].item() == pytest.approx(2.231, abs=5e-4)
    assert a_row[-1].item() == pytest.approx(-0.446, abs=5e-4)
    assert a_traj[0].item() == pytest.approx(0.9354, abs=5e-5)
    assert a_traj[-1].item() == pytest.approx(-0.9354, abs=5e-5)


def test_worked_example_masses_and_net_push():
    scores, group, traj, mask = worked_example()
    m_native = implicit_mass(mask, group, traj, reducer="token-mean", mass="native")
    m_aligned = implicit_mass(mask, group, traj, reducer="token-mean", mass="uniform")
    assert m_native.tolist() == pytest.approx([10 / 240] * 4 + [50 / 240] * 4)
    assert m_aligned.tolist() == pytest.approx([1 / 8] * 8)
    first_row = torch.cumsum(torch.tensor([0] + [10] * 4 + [50] * 3), 0)  # first row of each trajectory
    push = {}
    for acc in ("row", "trajectory"):
        adv = outcome_advantages(scores, group, traj, accounting=acc)[first_row]
        for name, m in (("native", m_native), ("aligned", m_aligned)):
            push[f"{acc}+{name}"] = float((m * adv).sum())
    assert push["row+native"] == pytest.approx(0.0, abs=1e-9)
    assert push["trajectory+native"] == pytest.approx(-0.624, abs=5e-4)
    assert push["row+aligned"] == pytest.approx(0.893, abs=5e-4)
    assert push["trajectory+aligned"] == pytest.approx(0.0, abs=1e-9)


def test_worked_example_same_direction_different_scale():
    """docs/math.md#worked-example note: row+native and trajectory+aligned give success:failure token coefficient 5:1."""
    scores, group, traj, mask = worked_example()
    for acc, mass in (("row", "native"), ("trajectory", "uniform")):
        coef = outcome_advantages(scores, group, traj, accounting=acc) * token_weights(mask, group, traj, mass=mass)[:, 0]
        assert (coef[0] / -coef[-1]).item() == pytest.approx(5.0)


def test_rloo_by_hand():
    # group 7: trajectories of outcomes 1, 2, 6 (one row each); group 3: one trajectory (singleton)
    scores = torch.tensor([1.0, 2.0, 6.0, 4.0])
    group = torch.tensor([7, 7, 7, 3])
    traj = torch.tensor([0, 1, 2, 9])
    adv = outcome_advantages(scores, group, traj, estimator="rloo")
    assert adv.tolist() == pytest.approx([1 - 4, 2 - 3.5, 6 - 1.5, 0.0])


def test_dr_grpo_and_zero_spread():
    scores = torch.tensor([1.0, 3.0, 0.1, 0.1, 0.1])
    group = torch.tensor([0, 0, 1, 1, 1])
    traj = torch.tensor([0, 1, 2, 3, 4])
    adv = outcome_advantages(scores, group, traj, norm_by_std=False)
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0])
    assert adv[2:].eq(0).all()  # exactly 0 although 0.1·3/3 ≠ 0.1 in floating point


def test_row_scores_with_step_penalty():
    """Trajectory accounting uses R_τ = mean of its rows' scores; row accounting each row's own."""
    scores = torch.tensor([1.0, 0.8, 0.0, 0.0])  # τ0: outcome 1 with a −0.2 penalty on step 2
    group = torch.zeros(4, dtype=torch.long)
    traj = torch.tensor([0, 0, 1, 1])
    a = outcome_advantages(scores, group, traj, accounting="trajectory", norm_by_std=False)
    assert a.tolist() == pytest.approx([0.45, 0.45, -0.45, -0.45])
    a = outcome_advantages(scores, group, traj, accounting="row", norm_by_std=False)
    assert a.tolist() == pytest.approx([0.55, 0.35, -0.45, -0.45])


def test_discounted_returns_by_hand():
    r = torch.tensor([1.0, 0.0, 2.0, 5.0])
    traj = torch.tensor([4, 4, 4, 1])
    step = torch.tensor([0, 1, 2, 0])
    g = discounted_returns(r, traj, step, gamma=0.5)
    assert g.tolist() == pytest.approx([1 + 0.5 * 0 + 0.25 * 2, 0 + 0.5 * 2, 2.0, 5.0])


def test_gigpo_step_term_by_hand():
    # one group, two trajectories; both start in state 11 (anchor group of 2), then differ.
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0])
    step_rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    anchor = torch.tensor([11, 12, 11, 13])
    group = torch.zeros(4, dtype=torch.long)
    traj = torch.tensor([0, 0, 1, 1])
    step = torch.tensor([0, 1, 0, 1])
    a = gigpo_advantages(scores, step_rewards, anchor, group, traj, step, norm_by_std=False, gamma=0.5)
    # episode: ±0.5; step: returns at state 11 are 0.5 and 0 → ±0.25; other states are singletons.
    assert a.tolist() == pytest.approx([0.75, 0.5, -0.75, -0.5])


def test_token_weights_by_hand():
    # τ0: rows with 2 and 1 tokens; τ1: one row with 3 tokens; all in group 0.
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    group = torch.zeros(3, dtype=torch.long)
    traj = torch.tensor([0, 0, 1])
    w = token_weights(mask, group, traj, reducer="token-mean", mass="native")
    close(w, [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0], [1 / 6] * 3])
    w = token_weights(mask, group, traj, reducer="token-mean", mass="uniform")
    close(w, [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0], [1 / 6] * 3])
    w = token_weights(mask, group, traj, reducer="seq-mean-token-mean", mass="native")
    close(w, [[1 / 6, 1 / 6, 0], [1 / 3, 0, 0], [1 / 9] * 3])
    w = token_weights(mask, group, traj, reducer="seq-mean-token-mean", mass="uniform")
    close(w, [[1 / 8, 1 / 8, 0], [1 / 4, 0, 0], [1 / 6] * 3])
    w = token_weights(mask, group, traj, reducer="seq-mean-token-sum-norm", mass="native", loss_scale_factor=4)
    close(w, [[1 / 12, 1 / 12, 0], [1 / 12, 0, 0], [1 / 12] * 3])


def test_group_mass_by_hand():
    # group 0 has 1 trajectory, group 1 has 3: group mass gives 1/2 and 1/6 each.
    mask = torch.ones(4, 2, dtype=torch.bool)
    group = torch.tensor([0, 1, 1, 1])
    traj = torch.tensor([0, 1, 2, 3])
    m = implicit_mass(mask, group, traj, mass="group")
    assert m.tolist() == pytest.approx([1 / 2, 1 / 6, 1 / 6, 1 / 6])
    assert implicit_mass(mask, group, traj, mass="uniform").tolist() == pytest.approx([1 / 4] * 4)


def test_ppo_objective_by_hand():
    logp_old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 9.0]]))
    adv = torch.tensor([[1.0, 1.0, -2.0, -1.0]])
    mask = torch.tensor([[True, True, True, False]])
    loss = token_objective(logp, logp_old, adv, mask, clip_low=0.2, clip_high=0.28)
    # ρ=1.5, A=1: −min(1.5, 1.28) = −1.28;  ρ=0.5, A=1: −min(0.5, 0.8) = −0.5;
    # ρ=1.1, A=−2: −min(−2.2, −2.2) = 2.2;  masked → 0
    close(loss, [[-1.28, -0.5, 2.2, 0.0]])


def test_dual_clip_by_hand():
    logp = torch.log(torch.tensor([[5.0]]))
    loss = token_objective(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1, dtype=torch.bool), clip_ratio_c=3.0)
    assert loss.item() == pytest.approx(3.0)  # min(max(5, 1.28)·1, 3·1)


def test_gspo_sequence_ratio_by_hand():
    logp_old = torch.zeros(1, 3)
    logp = torch.tensor([[math.log(2.0), 0.0, 0.0]])  # mean log-ratio = log(2)/2 → s = √2 on both valid tokens
    mask = torch.tensor([[True, True, False]])
    loss = token_objective(logp, logp_old, torch.tensor([1.0]), mask, objective="gspo", clip_low=0.2, clip_high=0.5)
    close(loss, [[-math.sqrt(2), -math.sqrt(2), 0.0]])


def test_clipped_tokens_by_hand():
    # ppo, token ratios 1.5 (A=+1, above 1.28: clipped), 0.5 (A=+1: below, not clipped),
    # 0.7 (A=−2, below 0.8: clipped), 1.5 (A=−1: above, not clipped), masked
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.7, 1.5, 9.0]]))
    adv = torch.tensor([[1.0, 1.0, -2.0, -1.0, 1.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    got = clipped_tokens(logp, torch.zeros(1, 5), adv, mask, clip_low=0.2, clip_high=0.28)
    assert got.tolist() == [[True, False, True, False, False]]
    # gspo clips the sequence ratio: tokens 2.0 and 1.0 give s = √2 > 1.28, so both valid tokens
    # are clipped though the second token's own ratio is 1; with ε_high = 0.5 neither is
    logp = torch.tensor([[math.log(2.0), 0.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    got = clipped_tokens(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, objective="gspo", clip_low=0.2, clip_high=0.28)
    assert got.tolist() == [[True, True, False]]
    got = clipped_tokens(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, objective="gspo", clip_low=0.2, clip_high=0.5)
    assert got.tolist() == [[False, False, False]]
    # ppo on the same row clips the first token alone
    assert clipped_tokens(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask).tolist() == [[True, False, False]]


def test_clipped_tokens_are_where_the_objective_has_no_gradient():
    torch.manual_seed(0)
    logp_old = torch.randn(6, 5)
    logp = (logp_old + 0.5 * torch.randn(6, 5)).requires_grad_()
    adv = torch.randn(6)
    mask = torch.rand(6, 5) > 0.2
    for objective in ("ppo", "gspo"):
        token_objective(logp, logp_old, adv, mask, objective=objective).sum().backward()
        clipped = clipped_tokens(logp, logp_old, adv, mask, objective=objective)
        if objective == "ppo":  # per token: clipped ⇔ zero gradient (on valid tokens)
            assert torch.equal(clipped, (logp.grad == 0) & mask)
        else:  # a clipped row has zero gradient on all its tokens
            assert bool((logp.grad[clipped] == 0).all())
        logp.grad = None


def test_kl_and_entropy_by_hand():
    logp = torch.log(torch.tensor([[0.5, 0.25]]))
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    kl = kl_k3(logp, ref, torch.tensor([[True, True]]))
    close(kl, [[0.5 - math.log(0.5) - 1, 0.0]])
    logits = torch.log(torch.tensor([[[0.5, 0.5], [1.0, 1e-30]]]))
    h = token_entropy(logits, torch.tensor([[True, True]]))
    close(h, [[math.log(2), 0.0]], abs=1e-6)


def test_weighted_loss_by_hand():
    w = torch.tensor([[0.5, 0.25, 0.0]], dtype=torch.float64)
    loss = torch.tensor([[2.0, 4.0, float("nan")]])  # NaN at a zero-weight (padding) token is ignored
    assert weighted_loss(loss, w).item() == pytest.approx(2.0)


def test_batch_structure_by_hand():
    """Rows of trajectories 7, 3, 7, 9, 3 in groups 1, 0, 1, 1, 0: trajectories sorted 3, 7, 9."""
    from oma.core import batch_structure

    s = batch_structure(torch.tensor([1, 0, 1, 1, 0]), torch.tensor([7, 3, 7, 9, 3]))
    assert s.traj.ids.tolist() == [3, 7, 9] and s.traj.counts.tolist() == [2, 2, 1]
    assert s.traj_group.tolist() == [0, 1, 1] and s.row_group.tolist() == [1, 0, 1, 1, 0]
    assert s.trajectories_per_group().tolist() == [1, 2]
    assert s.position_in_trajectory().tolist() == [0, 0, 1, 0, 1]  # order of appearance inside each trajectory


def test_structure_argument_changes_nothing():
    """Passing the batch's own structure gives the same numbers as letting each function compute it."""
    from oma.core import batch_structure

    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    t = torch.tensor([0, 0, 1, 1, 2, 3, 4])
    st = batch_structure(g, t)
    for acc in ("row", "trajectory"):
        assert torch.equal(outcome_advantages(scores, g, t, accounting=acc, structure=st),
                           outcome_advantages(scores, g, t, accounting=acc))
        a, b = group_outcome_stats(scores, g, t, accounting=acc, structure=st), group_outcome_stats(scores, g, t, accounting=acc)
        assert torch.equal(a.mean, b.mean) and torch.equal(a.std, b.std)
        anchor, k = torch.tensor([0, 1, 0, 1, 0, 0, 0]), st.position_in_trajectory()
        assert torch.equal(gigpo_advantages(scores, scores, anchor, g, t, k, accounting=acc, structure=st),
                           gigpo_advantages(scores, scores, anchor, g, t, k, accounting=acc))
