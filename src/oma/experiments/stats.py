r"""The statistics of a comparison (docs/experiments.md#the-metrics), as small pure functions on plain numbers.

* :func:`endpoint` — mean of the last 3 evaluations at iterations ≤ H.
* :func:`nauc` — trapezoid area under the success curve on [0, H], divided by H.
* :func:`mean_ci` — mean and 95% Student-t confidence interval over seeds.
* :func:`paired_diff` — the same for per-seed differences (variant − baseline).
* :func:`welch_diff` — the difference of two independent estimates (two studies, a study and a line), Welch's t.
* :func:`t_quantile` — Student-t quantiles (no scipy: a bisection on the t CDF, computed with the
  regularised incomplete beta function).

Only the standard library and numpy are used; nothing here reads files.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ENDPOINT_EVALS = 3
"""docs/experiments.md#the-metrics: the endpoint is the mean of the last 3 evaluations up to the horizon."""


# ------------------------------------------------------------------------------------------------
# Student t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    r"""Regularised incomplete beta function I_x(a, b) = B(x; a, b) / B(a, b), for a, b > 0, x ∈ [0, 1]."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs x in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    r"""P(T ≤ t) for Student's t with ``df`` degrees of freedom: 1 − ½·I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    r"""The p-quantile of Student's t with ``df`` degrees of freedom: t such that P(T ≤ t) = p.

    Found by bisection on :func:`t_cdf` to ~1e-12 relative accuracy; e.g. t(0.975, 2) = 4.303,
    t(0.975, 4) = 2.776, t(0.975, ∞) → 1.960.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------------------------------------
# Success curves


def _curve(iterations: Sequence[float], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(iterations, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"a success curve needs as many iterations as values, got {x.shape} and {y.shape}")
    if x.size == 0:
        raise ValueError("the success curve is empty (no evaluation)")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("the success curve has NaN/inf iterations or values")
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"the success curve's iterations must increase strictly, got {x.tolist()}")
    return x, y


def _check_horizon(horizon: float) -> float:
    if not (isinstance(horizon, (int, float)) and math.isfinite(horizon) and horizon > 0):
        raise ValueError(f"horizon must be a number > 0, got {horizon!r}")
    return float(horizon)


def endpoint_iterations(iterations: Sequence[float], horizon: float, last: int = ENDPOINT_EVALS) -> list[float]:
    """The evaluation iterations that :func:`endpoint` averages: the last ``last`` ones that are ≤ horizon."""
    h = _check_horizon(horizon)
    x = [float(i) for i in iterations if i <= h]
    if not x:
        raise ValueError(f"no evaluation at an iteration <= the horizon {horizon:g}")
    return x[-last:]


def endpoint(iterations: Sequence[float], values: Sequence[float], horizon: float, last: int = ENDPOINT_EVALS) -> float:
    r"""Endpoint success (docs/experiments.md#the-metrics): the mean of the last ``last`` (3) evaluations at iterations ≤ H.

        endpoint = (1/k) Σ_{j=n−k+1..n} s(i_j),  i_1 < … < i_n the evaluation iterations ≤ H, k = min(3, n)

    Evaluations after H are ignored; when fewer than 3 fall at or before H, all of them are averaged.
    No value is interpolated: the endpoint only averages evaluations that were made.
    """
    if last < 1:
        raise ValueError(f"last must be >= 1, got {last}")
    x, y = _curve(iterations, values)
    h = _check_horizon(horizon)
    keep = y[x <= h]
    if keep.size == 0:
        raise ValueError(f"no evaluation at an iteration <= the horizon {horizon:g} (first at {x[0]:g})")
    return float(keep[-last:].mean())


def curve_to_horizon(
    iterations: Sequence[float], values: Sequence[float], horizon: float
) -> tuple[np.ndarray, np.ndarray]:
    """The curve on [0, H]: its points at iterations ≤ H, plus the value at H by linear interpolation
    between the neighbouring evaluations when H is not itself an evaluation iteration.

    Raises ValueError when the curve does not start at iteration 0 or ends before H.
    """
    x, y = _curve(iterations, values)
    h = _check_horizon(horizon)
    if x[0] != 0:
        raise ValueError(f"the success curve must start at iteration 0 (the warm start), got {x[0]:g}")
    if x[-1] < h:
        raise ValueError(f"the success curve ends at iteration {x[-1]:g}, before the horizon {horizon:g}")
    inside = x <= h
    xs, ys = x[inside], y[inside]
    if xs[-1] < h:
        xs = np.append(xs, h)
        ys = np.append(ys, np.interp(h, x, y))
    return xs, ys


def nauc(iterations: Sequence[float], values: Sequence[float], horizon: float) -> float:
    r"""Normalised area under the success curve (docs/experiments.md#the-metrics): trapezoid area on [0, H] divided by H.

        nAUC = (1/H) Σ_j (i_{j+1} − i_j) · (s(i_j) + s(i_{j+1})) / 2

    over the evaluation iterations 0 = i_1 < … < i_n = H of :func:`curve_to_horizon` (H added by
    linear interpolation when it is not an evaluation iteration). A time-averaged success in [0, 1].
    """
    xs, ys = curve_to_horizon(iterations, values, horizon)
    area = float(np.sum(np.diff(xs) * (ys[1:] + ys[:-1]) / 2.0))
    return area / float(horizon)


# ------------------------------------------------------------------------------------------------
# Over seeds


@dataclass(frozen=True)
class Estimate:
    """A mean over n samples with its confidence interval ``mean ± half_width``.

    ``half_width`` is NaN when n = 1 (no spread to estimate): the interval is then undefined and
    nothing is significant. ``p`` is the two-sided p-value of the one-sample t test of mean = 0,
    the same t as the interval (so ``p < 1 − level`` exactly when the CI excludes 0); NaN when n = 1.
    """

    mean: float
    half_width: float
    n: int
    level: float = 0.95
    p: float = math.nan

    def __str__(self) -> str:
        """``+0.122 ± 0.035`` as the reports write it; ``+0.122 (one seed)`` when there is no interval."""
        return f"{self.mean:+.3f} (one seed)" if self.n < 2 else f"{self.mean:+.3f} ± {self.half_width:.3f}"

    @property
    def lo(self) -> float:
        return self.mean - self.half_width

    @property
    def hi(self) -> float:
        return self.mean + self.half_width

    @property
    def significant(self) -> bool:
        """The CI excludes 0 (False when the CI is undefined)."""
        return bool(math.isfinite(self.half_width) and (self.lo > 0 or self.hi < 0))

    def to_dict(self) -> dict:
        def num(v: float) -> float | None:
            return float(v) if math.isfinite(v) else None

        return {"mean": num(self.mean), "half_width": num(self.half_width), "lo": num(self.lo), "hi": num(self.hi),
                "n": self.n, "level": self.level, "significant": self.significant, "p": num(self.p)}


def mean_ci(samples: Sequence[float], level: float = 0.95) -> Estimate:
    r"""Mean and Student-t confidence interval of ``samples`` (one value per seed):

        x̄ = (1/n) Σ x_k,   s = √( Σ (x_k − x̄)² / (n − 1) ),
        half-width = t_{(1+level)/2, n−1} · s / √n

    and the two-sided p-value of mean = 0, p = 2 · P(T_{n−1} ≤ −|x̄| / (s/√n)) (0 when s = 0 and
    x̄ ≠ 0, 1 when both are 0).

    e.g. [1, 2, 3] → 2 ± 4.303 · 1/√3 at level 0.95, p = 0.0742. One sample: half-width and p NaN.
    """
    x = np.asarray(samples, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("mean_ci needs at least one sample")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"mean_ci samples must be finite, got {x.tolist()}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    n = int(x.size)
    mean = float(x.mean())
    if n == 1:
        return Estimate(mean, math.nan, 1, level)
    se = float(x.std(ddof=1)) / math.sqrt(n)
    p = 2.0 * t_cdf(-abs(mean) / se, n - 1) if se > 0 else float(mean == 0.0)
    return Estimate(mean, t_quantile((1.0 + level) / 2.0, n - 1) * se, n, level, p)


def holm(p_values: Sequence[float], alpha: float = 0.05) -> list[bool]:
    r"""Holm–Bonferroni step-down test: which of m hypotheses are rejected at family-wise level ``alpha``.

    Sort the p-values, p_(1) ≤ … ≤ p_(m); reject H_(1) … H_(j−1), where j is the first index with
    p_(j) > alpha / (m − j + 1) (Holm 1979, *Scand. J. Statist.* 6:65–70). It controls the chance
    of any false rejection among the m at ``alpha`` under any dependence between the tests, and
    rejects everything plain Bonferroni (p ≤ alpha/m) rejects, and possibly more.

    NaN p-values (undefined tests, e.g. one seed) are never rejected and do not count in m.
    Returns one bool per input, in input order; e.g. [0.01, 0.04, 0.03] → [True, False, False]
    (0.01 ≤ 0.05/3, then 0.03 > 0.05/2 stops).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    defined = sorted((pv, i) for i, pv in enumerate(p_values) if math.isfinite(pv))
    rejected = [False] * len(p_values)
    for rank, (pv, i) in enumerate(defined):
        if pv > alpha / (len(defined) - rank):
            break
        rejected[i] = True
    return rejected


def paired_diff(variant: Sequence[float], baseline: Sequence[float], level: float = 0.95) -> Estimate:
    r"""Paired difference over seeds: :func:`mean_ci` of d_k = variant_k − baseline_k.

    The k-th entries must come from the same seed (same warm start and task seeds), so seed-to-seed
    variation common to both cancels; significance = the CI of the mean difference excludes 0.
    """
    v = np.asarray(variant, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if v.shape != b.shape:
        raise ValueError(f"paired_diff needs one value per seed on both sides, got {v.size} and {b.size}")
    return mean_ci(v - b, level)


def welch_diff(a: Estimate, b: Estimate, df_a: float | None = None, df_b: float | None = None) -> Estimate:
    r"""The difference a − b of two independent estimates, with Welch's CI and p: the direct test of whether two
    results agree (two overlapping CIs are not one).

        se_x = half-width_x / t_{(1+level)/2, df_x},   se = √(se_a² + se_b²),
        ν = se⁴ / (se_a⁴/df_a + se_b⁴/df_b)   (Welch–Satterthwaite),
        half-width = t_{(1+level)/2, ν} · se,   p = 2 · P(T_ν ≤ −|a − b| / se)

    ``df_x`` defaults to n − 1 (a :func:`mean_ci` over n seeds); give n − 2 for a line's prediction. Both must share
    one level. e.g. a = mean_ci([1, 2, 3]), b = mean_ci([0, 0, 1, 1]): 1.5 ± t_{0.975, 3} · √(1/3 + 1/12) = 1.5 ± 2.054
    (ν = 3), p = 0.103, as Welch's t on the raw samples gives.
    An undefined interval on either side gives an undefined difference (NaN half-width and p).
    """
    if a.level != b.level:
        raise ValueError(f"welch_diff needs one level on both sides, got {a.level} and {b.level}")
    dfs = [a.n - 1 if df_a is None else df_a, b.n - 1 if df_b is None else df_b]
    n = a.n + b.n
    if not (all(df > 0 for df in dfs) and math.isfinite(a.half_width) and math.isfinite(b.half_width)):
        return Estimate(a.mean - b.mean, math.nan, n, a.level)
    q = (1.0 + a.level) / 2.0
    se_a, se_b = (e.half_width / t_quantile(q, df) for e, df in zip((a, b), dfs))
    se = math.sqrt(se_a**2 + se_b**2)
    diff = a.mean - b.mean
    if se == 0.0:
        return Estimate(diff, 0.0, n, a.level, float(diff == 0.0))
    df = se**4 / (se_a**4 / dfs[0] + se_b**4 / dfs[1])
    return Estimate(diff, t_quantile(q, df) * se, n, a.level, 2.0 * t_cdf(-abs(diff) / se, df))
