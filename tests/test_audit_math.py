"""The audit's figures on small batches worked out by hand, and against oma.core's public functions."""

import math
import zlib

import numpy as np
import pytest
import torch

from oma.core import (
    MASSES,
    REDUCERS,
    gigpo_advantages,
    group_outcome_stats,
    implicit_mass,
    row_coefficients,
    outcome_advantages,
    token_weights,
)
from oma.core.segments import batch_structure
from oma.diagnostics import ACCOUNTING_NAMES, audit


def expand(k, scores, groups, tokens=None):
    """Rows of trajectories with k[i] rows each, outcome scores[i], group groups[i] (1 token per row)."""
    traj = np.repeat(np.arange(len(k)), k)
    return dict(
        scores=np.asarray(scores, dtype=np.float64)[traj],
        group_index=np.asarray(groups)[traj],
        traj_index=traj,
        response_tokens=np.ones(len(traj), dtype=np.int64) if tokens is None else np.asarray(tokens),
    )


def run(batch, **kw):
    b = dict(batch)
    return audit(b.pop("scores"), b.pop("group_index"), b.pop("traj_index"), **b, **kw)


def test_direction_split_between_groups_by_hand():
    """Group 0: a 1-row success and a 1-row failure; group 1: a 3-row success and a 3-row failure.
    Rows are uniform inside each group, so every accounting pushes the same direction *within* a
    group (cos_within = 1) and the whole difference is *between* groups.

    row+native: W = 1/8 per token; A = ±1/√2 in group 0 (σ over 2 rows), ±0.5/√0.3 in group 1
    (σ over 6 rows) → s = (1/8, √5/8). trajectory+aligned: W = 1/4 (group 0), 1/12 (group 1),
    A = ±1/√2 → s = (1/4, √3/12). cos_between = ⟨s^a, s^b⟩/(‖s^a‖‖s^b‖) = (3 + √15)/√72.
    Group masses: native (2/8, 6/8), aligned (1/2, 1/2) → total variation 1/4.
    """
    r = run(expand([1, 1, 3, 3], [1, 0, 1, 0], [0, 0, 1, 1]), eps=0.0)
    d = r.direction_split["trajectory+aligned"]
    assert d.cos_within == pytest.approx(1.0)
    assert d.cos_between == pytest.approx((3 + math.sqrt(15)) / math.sqrt(72))
    assert d.cos_total == pytest.approx(d.cos_between)
    assert d.cos_per_group.tolist() == pytest.approx([1.0, 1.0])
    # ‖c^a‖ = √6/8, ‖c^b‖ = 1/√12
    assert d.scale_ratio == pytest.approx((1 / math.sqrt(12)) / (math.sqrt(6) / 8))
    assert r.group_mass_native.tolist() == pytest.approx([0.25, 0.75])
    assert r.group_mass_aligned.tolist() == pytest.approx([0.5, 0.5])
    assert r.group_mass_shift_tv == pytest.approx(0.25)
    assert r.mu_row_minus_mu_traj.tolist() == pytest.approx([0.0, 0.0])
    # every accounting is balanced inside each group (symmetric outcomes, uniform rows)
    for name in ACCOUNTING_NAMES:
        assert r.accountings[name].net_push_per_group.tolist() == [0.0, 0.0]
    # row+aligned vs row+native: same A, different group magnitudes only
    d = r.direction_split["row+aligned"]
    assert d.cos_within == pytest.approx(1.0)
    s_a = np.array([1 / 8, math.sqrt(5) / 8])
    s_b = np.array([1 / 4, math.sqrt(6) * (0.5 / math.sqrt(0.3)) / 12])
    assert d.cos_between == pytest.approx(s_a @ s_b / np.linalg.norm(s_a) / np.linalg.norm(s_b))


def test_direction_split_is_within_times_between_on_a_random_batch():
    rng = np.random.default_rng(3)
    k = rng.integers(1, 9, size=24)
    batch = expand(k, rng.choice([0.0, 1.0, 0.4], size=24), np.repeat(np.arange(6), 4))
    batch["response_tokens"] = rng.integers(0, 7, size=int(k.sum()))
    r = run(batch)
    for d in r.direction_split.values():
        assert d.cos_total == pytest.approx(d.cos_within * d.cos_between, rel=1e-12)
        assert -1 <= d.cos_total <= 1


def test_coupling_by_hand():
    """Group A: K = (2, 4), R = (1, 0); group B: K = (3, 3, 6), R = (1, 1, 0). Centred on group means:
    x = (−1, 1 | −1, −1, 2), y = (½, −½ | ⅓, ⅓, −⅔) → Σxy = −3, Σx² = 8, Σy² = 7/6 → r = −3/√(28/3)."""
    r = run(expand([2, 4, 3, 3, 6], [1, 0, 1, 1, 0], [0, 0, 1, 1, 1]))
    assert r.coupling_rows_outcome == pytest.approx(-3 / math.sqrt(28 / 3))
    assert r.coupling_tokens_outcome == pytest.approx(-3 / math.sqrt(28 / 3))  # one token per row
    assert r.expansion_ratio_fail_over_success == pytest.approx(5 / (8 / 3))  # failures (4, 6), successes (2, 3, 3)
    assert r.rows_per_traj_mean == pytest.approx(18 / 5)
    # μ_row: A = 2/6, B = 6/12 ; μ_traj: A = 1/2, B = 2/3
    assert r.mu_row.tolist() == pytest.approx([1 / 3, 1 / 2])
    assert r.mu_traj.tolist() == pytest.approx([1 / 2, 2 / 3])
    assert r.mu_row_minus_mu_traj_mean == pytest.approx(-1 / 6)
    assert (r.mu_row_minus_mu_traj_min, r.mu_row_minus_mu_traj_max) == (pytest.approx(-1 / 6), pytest.approx(-1 / 6))


def test_longest_ten_percent_and_kish_by_hand():
    """12 trajectories of 1..12 rows in one group: ⌈1.2⌉ = 2 longest (12 and 11 rows) hold 23/78 of
    token-mean mass; Kish ESS = 78²/Σk² = 6084/650."""
    k = np.arange(1, 13)
    r = run(expand(k, [1, 0] * 6, [0] * 12))
    native = r.accountings["row+native"]
    assert native.mass_share_longest10 == pytest.approx(23 / 78)
    assert native.kish_ess == pytest.approx(6084 / 650)
    assert native.kish_ess_fraction == pytest.approx(6084 / 650 / 12)
    assert r.accountings["trajectory+aligned"].mass_share_longest10 == pytest.approx(2 / 12)
    # successes are the odd lengths 1, 3, ..., 11 → 36 of 78 rows
    assert native.mass_share_success == pytest.approx(36 / 78)


def test_longest_ties_break_by_tokens():
    # four 5-row trajectories; the one with more tokens is "longest"
    batch = expand([5, 5, 5, 5], [1, 0, 1, 0], [0, 0, 0, 0])
    batch["response_tokens"] = np.array([1] * 15 + [3] * 5)
    r = run(batch)
    m = r.accountings["row+native"]
    assert m.mass_share_longest10 == pytest.approx(15 / 30)


def test_success_rules():
    batch = expand([2, 2, 2], [0.5, 0.2, -0.1], [0, 0, 0])
    assert run(batch).successes == 2 and run(batch).success_rule == "score > 0"
    r = run(batch, success_threshold=0.5)
    assert (r.successes, r.failures, r.success_rule) == (1, 2, "score >= 0.5")
    won = np.array([False, False, True, True, False, False])  # the 0.2 trajectory won
    r = run(batch, won=won)
    assert (r.successes, r.success_rule) == (1, "won column")
    assert r.rows_per_traj_success_mean == 2.0
    with pytest.raises(ValueError, match="won"):
        run(batch, won=np.array([True, False, True, True, False, False]))


def test_degenerate_groups_and_duplicates():
    # group 0: one trajectory (singleton); group 1: two trajectories, same outcome (zero spread);
    # group 2: a normal group.
    batch = expand([2, 3, 1, 1, 1], [1, 0, 0, 1, 0], [0, 1, 1, 2, 2])
    r = run(batch, step_index=np.array([0, 1, 0, 1, 2, 0, 0, 0]))
    assert r.singleton_groups == {"row": 0, "trajectory": 1}
    # under row accounting group 0 has 2 members (rows) of one score: zero spread, not a singleton
    assert r.zero_spread_groups == {"row": 2, "trajectory": 1}
    # token-mean native mass of groups 0 and 1: 6 of 8 rows
    assert r.accountings["trajectory+native"].degenerate_mass_share == pytest.approx(6 / 8)
    assert r.accountings["trajectory+aligned"].degenerate_mass_share == pytest.approx(3 / 5)
    assert r.accountings["row+native"].degenerate_mass_share == pytest.approx(6 / 8)
    assert r.duplicated_rows == 0
    dup = run(batch, step_index=np.array([0, 0, 0, 1, 2, 0, 0, 0]))  # trajectory 0 has step 0 twice
    assert dup.duplicated_rows == 1
    assert run(batch).duplicated_rows is None
    assert "groups have one trajectory or one outcome" in r.verdict


def test_zero_token_rows_carry_no_mass():
    batch = expand([2, 2], [1, 0], [0, 0])
    batch["response_tokens"] = np.array([3, 0, 1, 1])
    r = run(batch)
    assert r.accountings["row+native"].mass.tolist() == pytest.approx([0.6, 0.4])
    assert r.tokens_per_traj_success_mean == 3.0
    with pytest.raises(ValueError, match="no row has a trainable token"):
        run(dict(batch, response_tokens=np.zeros(4, dtype=np.int64)))


def test_gigpo_without_step_term_equals_grpo():
    batch = expand([2, 4, 3, 1], [1, 0, 1, 0], [0, 0, 1, 1])
    rows = len(batch["scores"])
    rng = np.random.default_rng(0)
    kw = dict(anchor=rng.integers(0, 3, rows), step_rewards=rng.random(rows))
    a = run(batch, estimator="gigpo", step_advantage_w=0.0, **kw)
    b = run(batch)
    assert a.net_push == pytest.approx(b.net_push)
    g = run(batch, estimator="gigpo", **kw)
    assert g.estimator == "gigpo"
    with pytest.raises(ValueError, match="anchor"):
        run(batch, estimator="gigpo")


def test_gigpo_matches_core():
    batch = expand([2, 3, 3, 1], [1, 0, 1, 0], [0, 0, 1, 1])
    rows = len(batch["scores"])
    rng = np.random.default_rng(1)
    anchor, step_r = rng.integers(0, 2, rows), rng.random(rows)
    step = np.concatenate([np.arange(k) for k in (2, 3, 3, 1)])
    r = run(batch, estimator="gigpo", anchor=anchor, step_rewards=step_r, step_index=step)
    # without step_index the row order inside each trajectory is the step order: same result
    r2 = run(batch, estimator="gigpo", anchor=anchor, step_rewards=step_r)
    assert r.net_push == pytest.approx(r2.net_push)
    t = lambda x: torch.as_tensor(x)  # noqa: E731
    adv = gigpo_advantages(
        t(batch["scores"]),
        t(step_r),
        t(anchor),
        t(batch["group_index"]),
        t(batch["traj_index"]),
        t(step),
        accounting="row",
    )
    mask = torch.ones(rows, 1, dtype=torch.bool)
    w = token_weights(mask, t(batch["group_index"]), t(batch["traj_index"]), mass="native").sum(-1)
    assert r.net_push["row+native"] == pytest.approx(float((w * adv.double()).sum()), abs=1e-12)


@pytest.mark.parametrize("reducer", REDUCERS)
@pytest.mark.parametrize("mass", MASSES)
def test_row_coefficients_equal_core_token_weights(reducer, mass):
    """n_r·row_coefficients (what the audit uses) equals oma.core.token_weights(...).sum(-1) and implicit_mass."""
    rng = np.random.default_rng(zlib.crc32(f"{reducer}/{mass}".encode()))  # the same draw in every process
    rows, L = 60, 9
    traj = torch.as_tensor(np.sort(rng.integers(0, 14, rows)))
    group = traj // 3 + 100
    mask = torch.as_tensor(rng.random((rows, L)) < rng.random((rows, 1)))
    mask[torch.as_tensor(rng.random(rows) < 0.1)] = False  # some rows without a trainable token
    structure = batch_structure(group, traj)
    got = mask.sum(-1).double() * row_coefficients(mask.sum(-1), structure, reducer=reducer, mass=mass, length=L)
    want = token_weights(mask, group, traj, reducer=reducer, mass=mass).sum(-1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    m = implicit_mass(mask, group, traj, reducer=reducer, mass=mass)
    per_traj = torch.zeros(structure.n_traj, dtype=torch.float64).index_add_(0, structure.traj.inverse, got)
    torch.testing.assert_close(per_traj / per_traj.sum(), m, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("reducer", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_audit_equals_public_core(reducer, estimator):
    """Masses, μ and net push of every accounting against oma.core's public functions on a random batch
    with step penalties (rows of one trajectory differ in score) and uneven tokens."""
    rng = np.random.default_rng(7)
    k = rng.integers(1, 12, size=40)
    traj = np.repeat(rng.permutation(1000)[:40] * 3, k)  # non-contiguous ids
    group = np.repeat(np.repeat(np.arange(10) * 7 + 5, 4), k)
    scores = np.repeat(rng.choice([0.0, 10.0], size=40), k) - 0.1 * (rng.random(k.sum()) < 0.2)
    L = 8
    mask = rng.random((k.sum(), L)) < 0.6
    perm = rng.permutation(k.sum())  # rows in any order
    traj, group, scores, mask = traj[perm], group[perm], scores[perm], mask[perm]
    r = audit(scores, group, traj, response_mask=mask, reducer=reducer, estimator=estimator)
    T = lambda x: torch.as_tensor(x)  # noqa: E731
    s, g, t, m = T(scores), T(group), T(traj), T(mask)
    for acc in ("row", "trajectory"):
        st = group_outcome_stats(s, g, t, accounting=acc)
        assert (r.mu_row if acc == "row" else r.mu_traj).tolist() == pytest.approx(st.mean.tolist(), rel=1e-12)
        adv = outcome_advantages(s, g, t, accounting=acc, estimator=estimator).double()
        for rule, mass in (("native", "native"), ("aligned", "uniform")):
            fig = r.accountings[f"{acc}+{rule}"]
            assert fig.mass.tolist() == pytest.approx(
                implicit_mass(m, g, t, reducer=reducer, mass=mass).tolist(), rel=1e-10
            )
            w = token_weights(m, g, t, reducer=reducer, mass=mass)
            push = float((w.sum(-1) * adv).sum() / w.sum())
            assert fig.net_push == pytest.approx(push, abs=1e-9)


def test_group_mass_rule_differs_from_uniform_only_with_unequal_groups():
    batch = expand([1, 1, 1, 1], [1, 0, 1, 0], [0, 1, 1, 1])
    r = run(batch, aligned_mass="group")
    assert r.accountings["trajectory+aligned"].mass.tolist() == pytest.approx([1 / 2, 1 / 6, 1 / 6, 1 / 6])
    assert run(batch).accountings["trajectory+aligned"].mass.tolist() == pytest.approx([1 / 4] * 4)


def test_bad_arguments():
    batch = expand([1, 1], [1, 0], [0, 0])
    with pytest.raises(ValueError, match="reducer"):
        run(batch, reducer="mean")
    with pytest.raises(ValueError, match="aligned_mass"):
        run(batch, aligned_mass="native")
    with pytest.raises(ValueError, match="exactly one"):
        run(dict(batch, response_mask=np.ones((2, 2), dtype=bool)))
    with pytest.raises(ValueError, match="spans groups"):
        run(dict(batch, group_index=np.array([0, 1]), traj_index=np.array([0, 0])))
    with pytest.raises(ValueError, match="non-finite"):
        run(dict(batch, scores=np.array([np.nan, 0.0])))
