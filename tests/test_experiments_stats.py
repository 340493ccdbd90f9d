"""oma.experiments.stats: Student-t quantiles, endpoint, nAUC, CIs and paired differences by hand (docs/experiments.md#the-metrics)."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from oma.experiments.stats import (
    Estimate,
    betainc,
    curve_to_horizon,
    endpoint,
    endpoint_iterations,
    holm,
    mean_ci,
    nauc,
    paired_diff,
    t_cdf,
    t_quantile,
    welch_diff,
)

# two-sided 95% critical values t(0.975, df) from a printed Student-t table
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 8: 2.306, 10: 2.228, 15: 2.131, 20: 2.086,
           30: 2.042, 60: 2.000, 120: 1.980}


@pytest.mark.parametrize("df,value", sorted(T_TABLE.items()))
def test_t_quantile_matches_the_table(df, value):
    assert t_quantile(0.975, df) == pytest.approx(value, abs=6e-4)


def test_t_quantile_other_levels_symmetry_and_normal_limit():
    assert t_quantile(0.95, 3) == pytest.approx(2.353, abs=6e-4)  # one-sided 5% table value
    assert t_quantile(0.995, 4) == pytest.approx(4.604, abs=6e-4)
    assert t_quantile(0.025, 2) == pytest.approx(-t_quantile(0.975, 2))
    assert t_quantile(0.5, 7) == 0.0
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)  # the normal quantile
    # df = 1 is the Cauchy distribution: quantile tan(π(p − ½))
    assert t_quantile(0.9, 1) == pytest.approx(math.tan(math.pi * 0.4), rel=1e-9)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="p must be in"):
            t_quantile(bad, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.975, 0)


def test_betainc_and_t_cdf_closed_forms():
    for x in (0.1, 0.37, 0.9):
        assert betainc(1.0, 1.0, x) == pytest.approx(x)  # uniform
        assert betainc(3.0, 1.0, x) == pytest.approx(x**3)  # I_x(a, 1) = x^a
        assert betainc(1.0, 2.0, x) == pytest.approx(1 - (1 - x) ** 2)  # I_x(1, b) = 1 − (1−x)^b
    # df = 2: F(t) = ½ + t / (2√(2 + t²))
    for t in (-3.0, -0.5, 0.0, 1.2, 4.0):
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)))


def test_endpoint_on_hand_made_curves():
    its, vals = [0, 5, 10, 15, 20], [0.1, 0.2, 0.4, 0.5, 0.9]
    assert endpoint(its, vals, 20) == pytest.approx((0.4 + 0.5 + 0.9) / 3)
    # H between evaluations: the last three at iterations ≤ 17, no interpolation
    assert endpoint(its, vals, 17) == pytest.approx((0.2 + 0.4 + 0.5) / 3)
    assert endpoint_iterations(its, 17) == [5.0, 10.0, 15.0]
    # fewer than three evaluations up to H: all of them
    assert endpoint(its, vals, 5) == pytest.approx((0.1 + 0.2) / 2)
    assert endpoint(its, vals, 4) == pytest.approx(0.1)
    # evaluations after H are ignored even when H is past the end
    assert endpoint(its, vals, 100) == pytest.approx((0.4 + 0.5 + 0.9) / 3)
    with pytest.raises(ValueError, match="no evaluation"):
        endpoint([5, 10], [0.1, 0.2], 3)
    with pytest.raises(ValueError, match="horizon"):
        endpoint(its, vals, 0)
    with pytest.raises(ValueError, match="increase"):
        endpoint([0, 10, 5], [0.1, 0.2, 0.3], 10)


def test_nauc_on_hand_made_curves():
    # trapezoids on [0, 10]: 5·(0 + 0.5)/2 + 5·(0.5 + 1)/2 = 1.25 + 3.75 = 5 → /10
    assert nauc([0, 5, 10], [0.0, 0.5, 1.0], 10) == pytest.approx(0.5)
    # H = 7: s(7) = 0.5 + (2/5)·0.5 = 0.7 by interpolation; area 1.25 + 2·(0.5 + 0.7)/2 = 2.45 → /7
    assert nauc([0, 5, 10], [0.0, 0.5, 1.0], 7) == pytest.approx(2.45 / 7)
    x, y = curve_to_horizon([0, 5, 10], [0.0, 0.5, 1.0], 7)
    assert x.tolist() == [0, 5, 7] and y.tolist() == pytest.approx([0.0, 0.5, 0.7])
    # uneven spacing: [0,1]: (0.2+0.4)/2 = 0.3; [1,4]: 3·(0.4+0.1)/2 = 0.75 → 1.05 / 4
    assert nauc([0, 1, 4], [0.2, 0.4, 0.1], 4) == pytest.approx(1.05 / 4)
    assert nauc([0, 3, 6], [0.25, 0.25, 0.25], 6) == pytest.approx(0.25)  # a constant curve averages to itself
    with pytest.raises(ValueError, match="start at iteration 0"):
        nauc([1, 5], [0.1, 0.2], 5)
    with pytest.raises(ValueError, match="before the horizon"):
        nauc([0, 5], [0.1, 0.2], 6)
    with pytest.raises(ValueError, match="as many"):
        nauc([0, 5], [0.1], 5)


def test_mean_ci_on_known_samples():
    e = mean_ci([1.0, 2.0, 3.0])  # s = 1
    assert e.mean == pytest.approx(2.0) and e.n == 3
    assert e.half_width == pytest.approx(4.303 * 1 / math.sqrt(3), rel=2e-4)
    assert (e.lo, e.hi) == pytest.approx((2 - 2.4843, 2 + 2.4843), abs=5e-4)


def test_mean_ci_significance_and_edge_cases():
    e = mean_ci([1.0, 2.0, 3.0])
    assert e.lo < 0 < e.hi and not e.significant
    f = mean_ci([0.4, 0.3, 0.5, 0.4, 0.6])  # mean 0.44, s = √(0.053/4)
    s = math.sqrt(((0.4 - 0.44) ** 2 * 2 + 0.14**2 + 0.06**2 + 0.16**2) / 4)
    assert f.mean == pytest.approx(0.44) and f.half_width == pytest.approx(2.776 * s / math.sqrt(5), rel=2e-4)
    assert f.significant
    one = mean_ci([0.7])
    assert one.mean == 0.7 and math.isnan(one.half_width) and not one.significant
    assert mean_ci([0.2, 0.2, 0.2]).half_width == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="at least one"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite"):
        mean_ci([0.1, float("nan")])


def test_paired_differences():
    d = paired_diff([0.5, 0.6, 0.7], [0.1, 0.3, 0.2])  # d = [0.4, 0.3, 0.5]: mean 0.4, s = 0.1
    assert d.mean == pytest.approx(0.4) and d.n == 3
    assert d.half_width == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=2e-4)
    assert d.lo > 0 and d.significant
    # pairing matters: the same values unpaired would have a far wider spread
    e = paired_diff([0.2, 0.4, 0.3], [0.1, 0.5, 0.0])  # d = [0.1, −0.1, 0.3]: mean 0.1, s = 0.2
    assert e.mean == pytest.approx(0.1) and e.half_width == pytest.approx(4.303 * 0.2 / math.sqrt(3), rel=2e-4)
    assert not e.significant
    neg = paired_diff([0.1, 0.1, 0.2, 0.0], [0.5, 0.6, 0.6, 0.5])  # d = [−0.4, −0.5, −0.4, −0.5]
    assert neg.hi < 0 and neg.significant
    with pytest.raises(ValueError, match="one value per seed"):
        paired_diff([0.1, 0.2], [0.1])


def test_p_value_by_hand_and_edge_cases():
    # df = 2 has a closed form: P(|T| > t) = 1 − t / √(2 + t²); [1, 2, 3]: t = 2 / (1/√3) = √12
    assert mean_ci([1.0, 2.0, 3.0]).p == pytest.approx(1 - math.sqrt(12) / math.sqrt(14), rel=1e-9)
    # df = 1 (Cauchy): P(|T| > t) = 1 − (2/π)·atan(t); [1, 3]: mean 2, s = √2, se = 1, t = 2
    assert mean_ci([1.0, 3.0]).p == pytest.approx(1 - 2 / math.pi * math.atan(2.0), rel=1e-9)
    assert mean_ci([0.5, 0.5, 0.5]).p == 0.0  # no spread (exactly), non-zero mean
    assert mean_ci([0.0, 0.0]).p == 1.0
    assert math.isnan(mean_ci([0.7]).p)
    assert paired_diff([0.5, 0.6, 0.7], [0.1, 0.3, 0.2]).p == pytest.approx(mean_ci([0.4, 0.3, 0.5]).p)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=8),
       st.sampled_from([0.9, 0.95, 0.99]))
def test_p_value_agrees_with_the_confidence_interval(xs, level):
    e = mean_ci(xs, level)
    if abs(e.p - (1 - level)) > 1e-9:  # away from the boundary the two decisions are the same t test
        assert (e.p < 1 - level) == e.significant


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]  # 0.01 ≤ 0.05/3; 0.03 > 0.05/2 stops
    assert holm([0.01, 0.02, 0.04]) == [True, True, True]  # 0.01 ≤ 0.05/3, 0.02 ≤ 0.05/2, 0.04 ≤ 0.05
    assert holm([0.04, 0.2]) == [False, False]  # 0.04 > 0.05/2, though below 0.05 alone
    assert holm([0.04, float("nan")]) == [True, False]  # an undefined test is not counted in m
    assert holm([]) == []
    assert holm([0.02, 0.03], alpha=0.1) == [True, True]
    with pytest.raises(ValueError, match="alpha"):
        holm([0.01], alpha=0.0)


def _holm_adjusted(ps):
    """The same test through Holm's adjusted p-values: p̃_(j) = max_{i ≤ j} min(1, (m − i + 1) p_(i))."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = running
    return adj


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=10), st.randoms(use_true_random=False))
def test_holm_equals_adjusted_p_values_and_lies_between_bonferroni_and_uncorrected(ps, rng):
    alpha = 0.05
    got = holm(ps, alpha)
    assert got == [a <= alpha for a in _holm_adjusted(ps)]
    assert all(g for p, g in zip(ps, got) if p <= alpha / len(ps))  # Bonferroni's rejections are Holm's
    assert all(p <= alpha for p, g in zip(ps, got) if g)  # Holm rejects nothing the uncorrected test keeps
    perm = list(range(len(ps)))
    rng.shuffle(perm)
    assert holm([ps[i] for i in perm], alpha) == [got[i] for i in perm]  # order of the tests does not matter


def test_an_estimate_reads_as_the_reports_write_it():
    assert str(mean_ci([1.0, 2.0, 3.0])) == "+2.000 ± 2.484"  # t(0.975, 2) · 1/√3 = 4.303 · 0.577
    assert str(mean_ci([-0.25])) == "-0.250 (one seed)"  # no interval from one sample


# ------------------------------------------------------------------------------------------------
# welch_diff: two independent estimates


def test_welch_diff_by_hand():
    """a = [1, 2, 3], b = [0, 0, 1, 1]: se² = 1/3 + 1/12 = 5/12, ν = (5/12)² / ((1/3)²/2 + (1/12)²/3) = 3."""
    e = welch_diff(mean_ci([1.0, 2.0, 3.0]), mean_ci([0.0, 0.0, 1.0, 1.0]))
    assert e.mean == pytest.approx(1.5)
    assert e.half_width == pytest.approx(t_quantile(0.975, 3) * math.sqrt(5 / 12), rel=1e-9)
    assert e.p == pytest.approx(2 * t_cdf(-1.5 / math.sqrt(5 / 12), 3), rel=1e-9)
    assert e.half_width == pytest.approx(2.0543, abs=1e-4) and e.p == pytest.approx(0.1027, abs=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=3, max_size=12), st.lists(st.floats(-1, 1), min_size=3, max_size=12))
def test_welch_diff_equals_welch_on_the_raw_samples_and_flips_sign_when_swapped(a, b):
    """Equivalence: from two mean_ci estimates it is Welch's t on the samples, computed here in a plain loop;
    invariance: b − a is the negated difference with the same interval and p."""
    assume(np.std(a) > 1e-3 and np.std(b) > 1e-3)
    ea, eb = mean_ci(a), mean_ci(b)
    d = welch_diff(ea, eb)
    va = sum((x - sum(a) / len(a)) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - sum(b) / len(b)) ** 2 for x in b) / (len(b) - 1) / len(b)
    nu = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    assert d.mean == pytest.approx(ea.mean - eb.mean, abs=1e-12)
    assert d.half_width == pytest.approx(t_quantile(0.975, nu) * math.sqrt(va + vb), rel=1e-7)
    back = welch_diff(eb, ea)
    assert back.mean == pytest.approx(-d.mean, abs=1e-12)
    assert back.half_width == pytest.approx(d.half_width, rel=1e-12) and back.p == pytest.approx(d.p, rel=1e-12)


def test_welch_diff_takes_a_lines_degrees_of_freedom_and_refuses_mixed_levels():
    """A prediction of a line on 30 points has 28 degrees of freedom, not 29; an undefined side gives NaN."""
    line = Estimate(0.1, t_quantile(0.975, 28) * 0.02, 30, 0.95)
    lm = mean_ci([0.0, 0.02, 0.04, 0.01, 0.03])
    d = welch_diff(lm, line, df_b=28)
    se = math.sqrt((lm.half_width / t_quantile(0.975, 4)) ** 2 + 0.02**2)
    assert d.mean == pytest.approx(0.02 - 0.1) and d.half_width / se > t_quantile(0.975, 1000)
    assert math.isnan(welch_diff(mean_ci([1.0]), lm).half_width)
    with pytest.raises(ValueError, match="one level"):
        welch_diff(lm, Estimate(0.0, 0.1, 5, 0.9))
