"""oma.experiments.sweep.detectable and power: the paired design's detectable difference and its power, by hand,
against each other, and against a simulated t test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oma.experiments.stats import Estimate, t_quantile
from oma.experiments.sweep import detectable, power


def _design(sd: float, n: int) -> Estimate:
    """What mean_ci gives n paired seeds of spread sd (the mean does not enter power)."""
    return Estimate(0.0, t_quantile(0.975, n - 1) * sd / math.sqrt(n), n)


def test_by_hand_the_plans_numbers():
    """sd 0.043, 12 seeds: SE = 0.043/√12 = 0.01241; detectable = (2.201 + 0.876) · SE = 0.0382; at 0.03,
    0.03/SE − 2.201 = 0.216 and P(T_11 ≤ 0.216) = 0.583."""
    e = _design(0.043, 12)
    assert detectable(e) == pytest.approx(0.0382, abs=2e-4)
    assert power(0.03, e) == pytest.approx(0.583, abs=2e-3)


@pytest.mark.parametrize("sd,n", [(0.03, 12), (0.043, 32), (0.1, 5)])
def test_power_at_the_detectable_difference_is_eighty_percent_and_grows_with_the_difference(sd, n):
    e = _design(sd, n)
    assert power(detectable(e), e) == pytest.approx(0.8, abs=1e-9)
    assert power(-detectable(e), e) == pytest.approx(0.8, abs=1e-9)  # two-sided: the sign does not matter
    assert power(0.5 * detectable(e), e) < 0.8 < power(1.5 * detectable(e), e)


def test_power_is_close_to_a_simulated_t_test():
    """The shifted-t approximation against 40,000 simulated paired t tests (n 12, sd 0.032, Δ 0.03): within 0.03."""
    rng = np.random.default_rng(0)
    n, sd, delta = 12, 0.032, 0.03
    x = rng.normal(delta, sd, size=(40_000, n))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
    simulated = float(np.mean(np.abs(t) > t_quantile(0.975, n - 1)))
    assert power(delta, _design(sd, n)) == pytest.approx(simulated, abs=0.03)


def test_no_power_without_a_spread():
    assert math.isnan(power(0.03, Estimate(0.0, math.nan, 1))) and math.isnan(detectable(Estimate(0.0, math.nan, 1)))
