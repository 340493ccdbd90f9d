"""``oma dose-response``: OMA's effect against the expansion ratio, swept by the step cap (docs/experiments.md#dose-response).

For each kind of failure of ``chain`` (:data:`KINDS`: loops, resets, dead ends) under GRPO and GiGPO (a *setting*,
``<kind>-<estimator>``), each step cap N of ``--caps`` is a cell: one ``oma compare`` of the lane's preset (2x2,
``--metric sampled``, S seeds, ``--no-dump`` unless ``--dump``) with ``env.options.max_steps=N``. A longer cap
makes failures longer (they run to it) while successes stay as long as the policy makes them, so the cap sets the
expansion ratio, which each cell measures (row+native's rollouts, failure rows / success rows per trajectory).
Layout::

    DIR/<kind>-<estimator>-cap<N>/   one `oma compare` each (its report, runs, results.json)
    DIR/README.md                    command, machine, wall time, the cells, the fitted slopes, the figure
    DIR/dose_response.json           every figure, the fits and how to predict from them
    DIR/dose_response.png            Δ against the measured ratio, one panel per component and metric
    DIR/pilot/                       --pilot: row+native alone per cap, the measured ratio per cap

Per setting, component (OA alone, MA alone, OA+MA) and metric (endpoint, nAUC), :func:`fit_line` regresses the
per-seed paired differences of all its cells on the cells' measured ratios; :func:`predict` gives the Δ the line
expects at a ratio, with its CI. Resumable: every cell is an ``oma compare`` that reuses its finished runs.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oma.experiments.compare import RESERVED as COMPARE_RESERVED
from oma.experiments.plan import check_overrides
from oma.experiments.stats import Estimate, holm, t_cdf, t_quantile
from oma.experiments.sweep import (PRESET, chain, check_args, detectable, fmt, holm_across, parser, read_cell,
                                  run_cell)
from oma.files import atomic_write_text, read_json_object

PROG = "oma dose-response"


@dataclass(frozen=True)
class Kind:
    """A kind of failure: a ``chain`` setting whose failures run to the step cap (or, for dead ends, stay there)."""

    name: str
    """``env.options.on_wrong``."""
    label: str
    what: str
    """What a wrong action does, in words."""
    length: int
    actions: int
    caps: tuple[int, ...]
    """The default caps (docs/experiments.md#dose-response says how they were chosen)."""
    options: tuple[str, ...] = ()
    """Further ``env.options`` overrides of the kind's chain."""

    @property
    def overrides(self) -> tuple[str, ...]:
        return chain(self.name, self.length, self.actions, *self.options)


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("stay", "loops", "changes nothing: failures loop to the cap", 6, 4, (12, 18, 24, 30)),
    Kind("reset", "resets", "sends the agent back to the start: failures loop to the cap", 6, 2, (8, 12, 24, 60)),
    Kind("trap", "traps", "traps the agent, unable to win, until the cap", 4, 2, (5, 8, 12, 18)),
    Kind("stuck", "sticky loops", "sticks the agent where it is, each later action taking effect with probability "
         "0.01: failures loop to the cap, a late win stays possible", 4, 2, (5, 8, 12, 24), ("env.options.escape=0.01",)),
)}
"""``stay`` and ``reset`` are the coupling map's `stay` (the preset) and `reset` chains (at cap 18 a cell is the map's
setting), ``trap`` its dead-end chain (`end`'s) with failures that run to the cap, ``stuck`` the dead ends' chain with
a loop left only by chance (``escape`` 0.01: the pilot in studies/dose-response/evidence/pilot-sticky-loops), which carries loops past the ratio of about 1.7 where ``stay`` stops. The default caps follow the pilot's
rule (docs/experiments.md#dose-response): measured ratios near 1.2, 2, 3 and 4+ where row+native still has room."""

ESTIMATORS: dict[str, tuple[str, ...]] = {"grpo": (), "gigpo": ("algo.estimator=gigpo",)}
"""Estimators and their overrides (the preset's is GRPO; GiGPO with the lane's γ 0.95, ω 1)."""

SETTINGS = tuple(f"{k}-{e}" for k in KINDS for e in ESTIMATORS)

COMPONENTS: tuple[tuple[str, str], ...] = (("OA", "OA+native"), ("MA", "row+MA"), ("OA+MA", "OA+MA"))
"""(component, the variant whose paired difference to row+native measures it)."""

METRICS = ("endpoint", "nAUC")

RESERVED: dict[str, str] = {
    "env.options.max_steps": "--caps sets it per cell",
    "env.train_max_steps": "each cell sets it: training episodes run to the cell's cap",
    "env.eval_max_steps": "--eval-cap sets it",
    "env.options.on_wrong": "the kind sets it (--settings)",
    "env.options.length": "the kind sets it (--settings)",
    "env.options.actions": "the kind sets it (--settings)",
    "algo.estimator": "the setting sets it (--settings)",
}
"""Overrides the sweep sets itself, and why; those ``oma compare`` sets are refused too, before any cell runs."""


class DoseError(ValueError):
    """A bad argument; the message says which flag."""


def cell_name(setting: str, cap: int, eval_cap: int | None = None) -> str:
    return f"{setting}-cap{cap}" + (f"-eval{eval_cap}" if eval_cap is not None else "")


def held_out_cap(eval_caps: dict[str, int] | None, setting: str) -> int | None:
    """The held-out cap of ``setting``'s kind under ``--eval-cap`` (None: the cell's cap bounds both)."""
    return (eval_caps or {}).get(setting.rsplit("-", 1)[0])


def cell_overrides(setting: str, cap: int, eval_cap: int | None = None) -> list[str]:
    """The overrides of one cell on top of the preset (the user's come after). Without ``eval_cap`` the cap is the
    environment's and bounds training and held-out episodes alike. With it, held-out episodes end at ``eval_cap``
    in every cell and only training episodes end at ``cap``: a longer cap then lengthens failures without also
    giving held-out episodes more steps to recover in, which filled the loops' held-out success to its ceiling."""
    kind, estimator = setting.rsplit("-", 1)
    chain = [*KINDS[kind].overrides, *ESTIMATORS[estimator]]
    if eval_cap is None:
        return [*chain, f"env.options.max_steps={cap}", "env.train_max_steps=null"]
    return [*chain, f"env.options.max_steps={max(cap, eval_cap)}", f"env.train_max_steps={cap}",
            f"env.eval_max_steps={eval_cap}"]


# ------------------------------------------------------------------------------------------------
# The regression


@dataclass(frozen=True)
class Fit:
    r"""The OLS line y = a + b·x through n points (x_i, y_i), with what its CIs and predictions need:

        x̄ = Σ x_i / n,  Sxx = Σ (x_i − x̄)²,  b = Σ (x_i − x̄)(y_i − ȳ) / Sxx,  a = ȳ − b·x̄,
        s² = Σ (y_i − a − b·x_i)² / (n − 2)   (the residual variance, n − 2 degrees of freedom)

    Here y_i are per-seed paired differences and x_i their cell's measured expansion ratio.
    """

    slope: float
    intercept: float
    n: int
    x_mean: float
    sxx: float
    s: float
    """Residual standard deviation (NaN when n = 2: no degree of freedom left)."""
    x_min: float
    x_max: float
    level: float = 0.95

    @property
    def df(self) -> int:
        return self.n - 2

    def _estimate(self, value: float, se: float) -> Estimate:
        """``value`` with its Student-t CI on n − 2 degrees of freedom and the two-sided p of value = 0."""
        if not (self.df > 0 and math.isfinite(se)):
            return Estimate(value, math.nan, self.n, self.level)
        p = 2.0 * t_cdf(-abs(value) / se, self.df) if se > 0 else float(value == 0.0)
        return Estimate(value, t_quantile((1.0 + self.level) / 2.0, self.df) * se, self.n, self.level, p)

    @property
    def slope_ci(self) -> Estimate:
        """b ± t_{0.975, n−2} · s / √Sxx."""
        return self._estimate(self.slope, self.s / math.sqrt(self.sxx))

    @property
    def intercept_ci(self) -> Estimate:
        """a ± t_{0.975, n−2} · s · √(1/n + x̄² / Sxx): the line at ratio 0, outside any data."""
        return self._estimate(self.intercept, self.s * math.sqrt(1.0 / self.n + self.x_mean**2 / self.sxx))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (an undefined ``s`` is null)."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fit:
        return cls(**{k: math.nan if d[k] is None else d[k] for k in cls.__dataclass_fields__})


def fit_line(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> Fit:
    """OLS of ``y`` on ``x`` (:class:`Fit`). ValueError when there are fewer than 2 points, or when x does not
    vary (Sxx = 0: one ratio cannot give a slope)."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.ndim != 1 or xs.shape != ys.shape or xs.size < 2:
        raise ValueError(f"a line needs at least 2 points (x, y) of equal count, got {xs.size} and {ys.size}")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("a line's points must be finite")
    n = int(xs.size)
    x_mean = float(xs.mean())
    sxx = float(((xs - x_mean) ** 2).sum())
    if sxx == 0.0:
        raise ValueError(f"the ratios do not vary (all {x_mean:g}): no slope")
    slope = float(((xs - x_mean) * (ys - ys.mean())).sum() / sxx)
    intercept = float(ys.mean() - slope * x_mean)
    rss = float(((ys - intercept - slope * xs) ** 2).sum())
    s = math.sqrt(rss / (n - 2)) if n > 2 else math.nan
    return Fit(slope, intercept, n, x_mean, sxx, s, float(xs.min()), float(xs.max()), level)


def predict(fit: Fit, ratio: float) -> Estimate:
    r"""The Δ the line expects at expansion ratio ``ratio``, with the CI of that mean:

        Δ̂(r) = a + b·r,   half-width = t_{0.975, n−2} · s · √(1/n + (r − x̄)² / Sxx)

    A confidence interval for the expected Δ of a cell at ratio r (not a prediction interval for one seed's
    difference, which would add s² under the root). It holds under the fit's model (docs/experiments.md#dose-response);
    outside the swept ratios [x_min, x_max] it is an extrapolation of a straight line."""
    if not math.isfinite(ratio):
        raise ValueError(f"ratio must be a finite number, got {ratio!r}")
    return fit._estimate(fit.intercept + fit.slope * ratio,
                         fit.s * math.sqrt(1.0 / fit.n + (ratio - fit.x_mean) ** 2 / fit.sxx))


def load_fits(path: str | Path) -> dict[str, dict[str, dict[str, Fit]]]:
    """The fits of a ``dose_response.json``: ``fits[setting][component][metric]``, e.g.
    ``predict(load_fits("runs/dose/dose_response.json")["trap-grpo"]["OA+MA"]["endpoint"], 2.5)``."""
    doc = read_json_object(path)
    return {setting: {c: {m: Fit.from_dict(f["fit"]) for m, f in ms.items()} for c, ms in cs.items()}
            for setting, cs in doc["fits"].items()}


# ------------------------------------------------------------------------------------------------
# Collecting the cells and fitting


def collect(out: Path, caps: dict[str, list[int]], settings: list[str], predict_at: list[float],
            eval_caps: dict[str, int] | None = None) -> dict[str, Any]:
    """Every cell's figures (:func:`oma.experiments.sweep.read_cell`), Holm across every difference of the sweep, and
    per setting × component × metric the line through the per-seed differences of its cells, with Holm across the
    slopes."""
    cells = {}
    for setting in settings:
        for cap in caps[setting.rsplit("-", 1)[0]]:
            name = cell_name(setting, cap, held_out_cap(eval_caps, setting))
            entry = read_cell(out / name)
            if entry["ratio"] is None:
                raise DoseError(f"cell {name}: no expansion ratio measured (no iteration with both a "
                                "success and a failure); choose other --caps")
            cells[name] = {**entry, "setting": setting, "cap": cap}
    family_size, survivors = holm_across(cells)
    fits: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for setting in settings:
        mine = [c for c in cells.values() if c["setting"] == setting]
        fits[setting] = {}
        for component, variant in COMPONENTS:
            fits[setting][component] = {}
            for metric in METRICS:
                x = [c["ratio"].mean for c in mine for _ in c["paired"][variant][metric]]
                y = [d for c in mine for d in c["paired"][variant][metric]]
                try:
                    f = fit_line(x, y)
                except ValueError as e:
                    raise DoseError(f"--caps: {setting} {component} {metric}: {e}") from None
                fits[setting][component][metric] = {"fit": f, "slope": f.slope_ci, "intercept": f.intercept_ci,
                                                    "at_ratio_1": predict(f, 1.0),
                                                    "predictions": {r: predict(f, r) for r in predict_at}}
    slopes = [(s, c, m, f["slope"]) for s, cs in fits.items() for c, ms in cs.items() for m, f in ms.items()]
    kept = holm([e.p for *_, e in slopes])
    return {"cells": cells, "family_size": family_size, "holm": survivors, "fits": fits,
            "slopes_holm": {(s, c, m) for (s, c, m, _), k in zip(slopes, kept) if k}, "slope_family": len(slopes),
            "predict_at": predict_at}


# ------------------------------------------------------------------------------------------------
# Writing


def _mark(e: Estimate | None, survives: bool) -> str:
    text = fmt(e)
    if e is not None and e.significant:
        text = f"**{text}**"
    return text + (" ✱" if survives else "")


MODEL = ("Δ_{c,k} = a + b · r_c + ε_{c,k}: the paired difference of seed k in cell c (a component's variant − "
         "row+native, endpoint or nAUC) is a straight line in the cell's measured expansion ratio r_c (row+native's "
         "mean over seeds) plus independent errors of one variance, normal for the t intervals. OLS over every seed "
         "of every cap of the setting; 95% CIs from Student's t with n − 2 degrees of freedom. What it assumes and "
         "the data may not give: a straight line over the swept ratios (the cells' Δ beside the line show how far "
         "it holds); one error variance at every cap (a cell's spread can differ); independent errors, while the "
         "caps of a setting reuse seeds 0..S−1 (same seed numbers, different tasks and rollouts once the cap "
         "differs); and a ratio known exactly, while it is measured (its CI is narrow beside the swept range). "
         "Outside the swept ratios a prediction extrapolates the line.")


def render(m: dict[str, Any], command: str, wall: float, caps: dict[str, list[int]], args_line: str,
           eval_caps: dict[str, int] | None = None) -> str:
    cells, fits = m["cells"], m["fits"]
    first = next(iter(cells.values()))
    out = ["# Dose–response: OMA's effect against the expansion ratio", "",
           "The expansion ratio of each kind of failure swept by the step cap, with the tabular policy "
           "(docs/experiments.md#dose-response).", "", "## Command", "", "```", command, "```", "",
           "## Design", "",
           (f"Each cell is one `oma compare` of `{PRESET}` ({args_line}; its report is in its folder) with the "
            "kind's chain and `env.options.max_steps` = the cap, `env.train_max_steps=null`: the cap bounds training "
            "and held-out episodes alike; or, for a kind with a held-out cap E of its own (`--eval-cap`), training "
            "episodes ended at the cap (`env.train_max_steps`) and held-out episodes at E in every cell "
            "(`env.eval_max_steps`, `env.options.max_steps` = the larger of the two), so the cap lengthens training "
            "failures while the held-out tasks stay as hard. Ratio = failure rows / success rows per trajectory of "
            "the row+native runs' own rollouts (mean over iterations, then seeds, 95% CI)."), "",
           "| failures | `on_wrong` | a wrong action | chain | caps | held-out cap |", "|---|---|---|---|---|---|"]
    for kind in KINDS.values():
        if kind.name in caps:
            out.append(f"| {kind.label} | `{kind.name}` | {kind.what} | {kind.length} long, {kind.actions} actions, "
                       f"4 signs | {', '.join(map(str, caps[kind.name]))} | "
                       f"{(eval_caps or {}).get(kind.name, 'the cap')} |")
    out += ["", "Estimators: GRPO (`grpo`), GiGPO (`gigpo`: step-level groups by anchor, γ 0.95, ω 1).", ""]
    for metric, key in (("endpoint", "baseline_endpoint"), ("nAUC", "baseline_nauc")):
        gain = metric == "endpoint"  # what row+native's endpoint gained over its warm start
        out += [f"## The cells: {metric}", "",
                (f"Δ = paired difference to row+native (same seed, same tasks), mean [95% CI]. OA = OA+native, MA = "
                 f"row+MA, OA+MA = both, each − row+native. **Bold** = the CI excludes 0; ✱ = it survives Holm over all "
                 f"{m['family_size']} differences of the sweep (both metrics, family-wise 5%)."
                 + (" Gain = row+native's endpoint − its iteration-0 success." if gain else "")), "",
                f"| cell | ratio | row+native {metric} | " + ("row+native gain | " if gain else "")
                + "Δ OA | Δ MA | Δ OA+MA | detectable Δ OA+MA (80% power) |", "|" + "---|" * (7 + gain)]
        for name, c in cells.items():
            ds = [_mark(c["diffs"][v][metric], (name, v, metric) in m["holm"]) for _, v in COMPONENTS]
            d = c["diffs"]["OA+MA"][metric]
            power = detectable(d) if d is not None else math.nan
            out.append(f"| [{name}]({name}/report.md) | {fmt(c['ratio'], 2, signed=False)} | "
                       f"{fmt(c[key], signed=False)} | " + (f"{fmt(c['baseline_gain'])} | " if gain else "")
                       + " | ".join(ds) + f" | {power:.3f} |")
        out.append("")
    out += ["## The slopes", "", MODEL, "",
            (f"Slope = change of Δ per unit of expansion ratio; Δ at ratio 1 = the line where failures are as long as "
             f"successes. **Bold** = the CI excludes 0; ✱ = the slope survives Holm over the {m['slope_family']} "
             "slopes (family-wise 5%); † = a ratio outside the setting's swept ratios, where the line is extrapolated."),
            ""]
    extra = [f"Δ at ratio {r:g}" for r in m["predict_at"]]
    out += ["| setting | component | metric | slope | intercept | Δ at ratio 1 | " + " | ".join([*extra, "ratios", "n"])
            + " |", "|" + "---|" * (8 + len(extra))]
    for setting, cs in fits.items():
        for component, ms in cs.items():
            for metric, f in ms.items():
                fit = f["fit"]

                def at(ratio: float, e: Estimate) -> str:
                    return fmt(e) + (" †" if not fit.x_min <= ratio <= fit.x_max else "")

                preds = [at(r, f["predictions"][r]) for r in m["predict_at"]]
                out.append(f"| {setting} | {component} | {metric} | "
                           f"{_mark(f['slope'], (setting, component, metric) in m['slopes_holm'])} | "
                           f"{fmt(f['intercept'])} | {at(1.0, f['at_ratio_1'])} | " + " | ".join(preds)
                           + (" | " if preds else "") + f"{fit.x_min:.2f}–{fit.x_max:.2f} | {fit.n} |")
    out += ["", "![Δ against the measured expansion ratio](dose_response.png)", "",
            "## Predicting from the fits", "",
            "`dose_response.json` holds every fit (`fits[setting][component][metric].fit`); in Python:", "",
            "```python", "from oma.experiments.dose_response import load_fits, predict", "",
            'fits = load_fits("DIR/dose_response.json")',
            'predict(fits["trap-grpo"]["OA+MA"]["endpoint"], 2.5)  # Estimate: mean, half_width, lo, hi', "```", "",
            ("Δ̂(r) = a + b·r ± t_{0.975, n−2} · s · √(1/n + (r − x̄)² / Sxx), the CI of the expected Δ of a cell at "
             "ratio r (`x_mean`, `sxx`, `s`, `n` in the fit)."), ""]
    compares = sum(c["wall_time_s"] for c in cells.values())
    out += ["## Machine and wall time", "",
            (f"This invocation: {wall / 60:.1f} min, reports included. The cells' `oma compare` runs took "
             f"{compares / 60:.1f} min of wall time over all their invocations (compare.json `history`), on "
             f"{first['machine']}."), ""]
    return "\n".join(out)


def plot(m: dict[str, Any], path: Path) -> None:
    """Δ against the measured ratio: rows endpoint / nAUC, columns OA, MA, OA+MA; per setting its cells (95% CI bars
    both ways, filled when the Δ's CI excludes 0) and its fitted line over its ratios."""
    from oma.diagnostics.plots import figure, save_png

    colors = {"stay": "#1f4e9c", "reset": "#c0392b", "trap": "#27ae60", "stuck": "#8e44ad"}
    styles = {"grpo": ("o", "-"), "gigpo": ("s", "--")}
    fig = figure(14.0, 8.0)
    for i, metric in enumerate(METRICS):
        for j, (component, variant) in enumerate(COMPONENTS):
            ax = fig.add_subplot(len(METRICS), len(COMPONENTS), i * len(COMPONENTS) + j + 1)
            for setting, cs in m["fits"].items():
                kind, estimator = setting.rsplit("-", 1)
                marker, line = styles[estimator]
                color = colors[kind]
                for c in (c for c in m["cells"].values() if c["setting"] == setting):
                    d, r = c["diffs"][variant][metric], c["ratio"]
                    if d is None:
                        continue
                    ax.errorbar(r.mean, d.mean, xerr=np.nan_to_num(r.half_width), yerr=np.nan_to_num(d.half_width),
                                fmt=marker, color=color, capsize=3, mfc=color if d.significant else "white")
                fit = cs[component][metric]["fit"]
                xs = np.linspace(fit.x_min, fit.x_max, 2)
                ax.plot(xs, fit.intercept + fit.slope * xs, line, color=color, lw=1.2,
                        label=f"{KINDS[kind].label}, {estimator}" if i == j == 0 else None)
            ax.axhline(0.0, color="#999999", lw=0.8)
            if i == j == 0:
                ax.legend(fontsize=7)
            ax.set_title(f"{component}: Δ {metric}", fontsize=9)
            if i == len(METRICS) - 1:
                ax.set_xlabel("expansion ratio (row+native)")
            if j == 0:
                ax.set_ylabel(f"Δ {metric} vs row+native")
    fig.suptitle("Dose–response: Δ to row+native against the expansion ratio (95% CIs; filled: the Δ's CI excludes 0; "
                 "lines: OLS per setting)", fontsize=10)
    save_png(fig, path)


def to_json(m: dict[str, Any], command: str, wall: float, caps: dict[str, list[int]],
            eval_caps: dict[str, int] | None = None) -> dict[str, Any]:
    def est(e):
        return e.to_dict() if isinstance(e, Estimate) else None

    return {
        "command": command, "wall_time_s": wall, "caps": caps, "eval_caps": eval_caps or {},
        "family_size": m["family_size"],
        "holm_significant": sorted("/".join(k) for k in m["holm"]),
        "model": MODEL,
        "predict": "Δ(r) = fit.intercept + fit.slope·r ± t_{0.975, fit.n − 2} · fit.s · √(1/fit.n + (r − fit.x_mean)² / "
                   "fit.sxx); in Python oma.experiments.dose_response.predict(Fit.from_dict(fit), r)",
        "cells": {n: {"setting": c["setting"], "cap": c["cap"], "ratio": est(c["ratio"]),
                      "baseline_endpoint": est(c["baseline_endpoint"]), "baseline_nauc": est(c["baseline_nauc"]),
                      "baseline_gain": est(c["baseline_gain"]), "n_seeds": c["n_seeds"], "wall_time_s": c["wall_time_s"],
                      "diffs": {comp: {k: est(x) for k, x in c["diffs"][v].items()} for comp, v in COMPONENTS},
                      "per_seed": {comp: c["paired"][v] for comp, v in COMPONENTS}}
                  for n, c in m["cells"].items()},
        "slope_family": m["slope_family"], "slopes_holm_significant": sorted("/".join(k) for k in m["slopes_holm"]),
        "fits": {s: {c: {metric: {"fit": f["fit"].to_dict(), "slope": est(f["slope"]), "intercept": est(f["intercept"]),
                                  "at_ratio_1": est(f["at_ratio_1"]),
                                  "predictions": {f"{r:g}": est(p) for r, p in f["predictions"].items()}}
                         for metric, f in ms.items()} for c, ms in cs.items()} for s, cs in m["fits"].items()},
    }


def write(out: Path, caps: dict[str, list[int]], settings: list[str], predict_at: list[float], command: str,
          wall: float, args_line: str, eval_caps: dict[str, int] | None = None) -> None:
    """README.md, dose_response.json and dose_response.png of the finished cells under ``out``."""

    m = collect(out, caps, settings, predict_at, eval_caps)
    plot(m, out / "dose_response.png")
    doc = to_json(m, command, wall, caps, eval_caps)
    atomic_write_text(out / "dose_response.json", json.dumps(doc, indent=2, allow_nan=False))
    atomic_write_text(out / "README.md", render(m, command, wall, caps, args_line, eval_caps))


# ------------------------------------------------------------------------------------------------
# The pilot


def pilot_table(rows: list[tuple[str, int, dict[str, Any]]]) -> list[str]:
    """The pilot's Markdown table: per setting and cap, row+native's measured ratio, endpoint and gain."""
    lines = ["| setting | cap | ratio | row+native endpoint | row+native gain | seeds |", "|---|---|---|---|---|---|"]
    for setting, cap, c in rows:
        lines.append(f"| {setting} | {cap} | {fmt(c['ratio'], 2, signed=False)} | {fmt(c['baseline_endpoint'], signed=False)}"
                     f" | {fmt(c['baseline_gain'])} | {c['n_seeds']} |")
    return lines


def run_pilot(out: Path, caps: dict[str, list[int]], settings: list[str], flags: list[str], overrides: list[str],
              preset: str, command: str, eval_caps: dict[str, int] | None = None) -> int:
    """row+native alone on every cap of ``settings``, into ``out/pilot``; prints and writes the ratio per cap."""

    folder = out / "pilot"
    todo = [(s, cap) for s in settings for cap in caps[s.rsplit("-", 1)[0]]]
    t0 = time.perf_counter()
    for i, (setting, cap) in enumerate(todo, 1):
        held_out = held_out_cap(eval_caps, setting)
        name = cell_name(setting, cap, held_out)
        rc = run_cell(PROG, f"pilot {i}/{len(todo)} {name}", preset,
                      [*cell_overrides(setting, cap, held_out), *overrides], flags, folder / name)
        if rc != 0:
            return rc
    rows = [(s, cap, read_cell(folder / cell_name(s, cap, held_out_cap(eval_caps, s)))) for s, cap in todo]
    table = pilot_table(rows)
    wall = time.perf_counter() - t0
    page = ["# Dose–response pilot: the expansion ratio per cap", "", "```", command, "```", "",
            ("row+native alone, per setting and step cap: its measured expansion ratio (failure rows / success rows "
             "per trajectory of its rollouts, mean over iterations, then seeds, 95% CI), its endpoint and its gain over "
             "its warm start. Choose each kind's caps for the sweep from it (docs/experiments.md#dose-response). "
             "Ratio — : no iteration had both a success and a failure."
             + "".join(f" Held-out episodes of `{k}` end at {n} steps in every cell (`--eval-cap`)."
                       for k, n in sorted((eval_caps or {}).items()))), "",
            *table, "", f"Wall time: {wall / 60:.1f} min.", ""]
    atomic_write_text(folder / "README.md", "\n".join(page))
    atomic_write_text(folder / "pilot.json", json.dumps(
        {"command": command, "wall_time_s": wall, "eval_caps": eval_caps or {},
         "cells": [{"setting": s, "cap": cap, "ratio": c["ratio"].to_dict() if c["ratio"] else None,
                    "baseline_endpoint": c["baseline_endpoint"].to_dict(),
                    "baseline_gain": c["baseline_gain"].to_dict() if c["baseline_gain"] else None, "n_seeds": c["n_seeds"]}
                   for s, cap, c in rows]}, indent=2))
    print("\n".join(table))
    print(f"{PROG}: pilot written to {folder / 'README.md'}")
    return 0


# ------------------------------------------------------------------------------------------------
# The command


def _parser():
    p = parser(DoseError, prog=PROG, description="Sweep the expansion ratio by the step cap for loops, resets and dead "
               "ends under GRPO and GiGPO, one `oma compare` per cell, and fit OMA's effect against the measured ratio "
               "(docs/experiments.md#dose-response).")
    p.add_argument("--caps", nargs="+", action="extend", default=[], metavar="KIND=N,N",
                   help="step caps per kind, e.g. stay=8,12,18,30 reset=8,12 (default: "
                   + " ".join(f"{k.name}={','.join(map(str, k.caps))}" for k in KINDS.values()) + ")")
    p.add_argument("--settings", default=",".join(SETTINGS), metavar="A,B",
                   help=f"comma-separated subset of {', '.join(SETTINGS)} (default all)")
    p.add_argument("--seeds", type=int, default=30, metavar="S", help="seeds per cell (default 30)")
    p.add_argument("--horizon", type=int, default=None, metavar="H", help="matched horizon (default: the preset's 30)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="parallel runs (default 1)")
    p.add_argument("--out", default="runs/dose-response", metavar="DIR", help="output (default runs/dose-response)")
    p.add_argument("--dump", action="store_true", help="keep every run's batches and audit them (default: --no-dump, "
                   "the coupling from each run's metrics)")
    p.add_argument("--eval-cap", nargs="+", action="extend", default=[], metavar="KIND=N",
                   help="end the kind's held-out episodes at N steps in every cell (env.eval_max_steps), so that only "
                   "training episodes end at the cell's cap, e.g. stay=12 (default: the cap bounds both)")
    p.add_argument("--pilot", action="store_true", help="run row+native alone on --pilot-seeds seeds per cap and print "
                   "the measured ratio per cap, to choose --caps before any comparison is run")
    p.add_argument("--pilot-seeds", type=int, default=4, metavar="K", help="seeds per cap of --pilot (default 4)")
    p.add_argument("--predict-at", default="", metavar="R,R", help="also give each line's Δ at these ratios")
    p.add_argument("--preset", default=PRESET, metavar="YAML", help=f"the lane's preset (default {PRESET})")
    p.add_argument("overrides", nargs="*", help="dotted overrides applied to every cell (e.g. env.eval_tasks=32); put "
                   "them before --caps")
    return p


def parse_caps(items: list[str], settings: list[str], least: int) -> dict[str, list[int]]:
    """``--caps`` items ``KIND=N,N,...`` over the kinds' defaults: each kind of ``settings`` gets its caps, sorted
    and distinct, each at least the kind's chain length (a shorter cap wins nothing), at least ``least`` of them."""
    caps = {k.name: list(k.caps) for k in KINDS.values()}
    for item in items:
        kind, sep, values = item.partition("=")
        if not sep or kind not in KINDS:
            raise DoseError(f"--caps {item!r}: expected KIND=N,N,... with KIND one of {', '.join(KINDS)} "
                            "(put config overrides before --caps)")
        try:
            caps[kind] = sorted({int(v) for v in values.split(",")})
        except ValueError:
            raise DoseError(f"--caps {item!r}: the caps must be integers, e.g. {kind}=8,12,18") from None
    used = {s.rsplit("-", 1)[0] for s in settings}
    for kind in used:
        short = [c for c in caps[kind] if c < KINDS[kind].length]
        if short:
            raise DoseError(f"--caps {kind}: cap {short[0]} is below the chain's length {KINDS[kind].length}, where "
                            "nothing can be won")
        if len(caps[kind]) < least:
            raise DoseError(f"--caps {kind}: a slope needs at least {least} caps, got {caps[kind]}")
    return {k: v for k, v in caps.items() if k in used}


def parse_eval_caps(items: list[str], caps: dict[str, list[int]]) -> dict[str, int]:
    """``--eval-cap`` items ``KIND=N``: a held-out cap per kind swept, at least the kind's chain length."""
    eval_caps: dict[str, int] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or kind not in caps:
            raise DoseError(f"--eval-cap {item!r}: expected KIND=N with KIND one of the kinds swept "
                            f"({', '.join(caps)})")
        try:
            eval_caps[kind] = int(value)
        except ValueError:
            raise DoseError(f"--eval-cap {item!r}: the cap must be an integer, e.g. {kind}=12") from None
        if eval_caps[kind] < KINDS[kind].length:
            raise DoseError(f"--eval-cap {kind}: {eval_caps[kind]} is below the chain's length {KINDS[kind].length}, "
                            "where nothing can be won")
    return eval_caps


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        settings = check_args(args, SETTINGS, DoseError)
        if args.pilot_seeds < 1:
            raise DoseError(f"--pilot-seeds must be >= 1, got {args.pilot_seeds}")
        try:
            predict_at = [float(r) for r in args.predict_at.split(",") if r]
        except ValueError:
            raise DoseError(f"--predict-at {args.predict_at!r}: expected ratios R,R (numbers)") from None
        if any(not (math.isfinite(r) and r > 0) for r in predict_at):
            raise DoseError(f"--predict-at {args.predict_at!r}: ratios must be finite numbers > 0")
        caps = parse_caps(args.caps, settings, 1 if args.pilot else 2)
        eval_caps = parse_eval_caps(args.eval_cap, caps)
        check_overrides(args.overrides, {**RESERVED, **COMPARE_RESERVED}, DoseError)
    except SystemExit as done:  # --help
        return int(done.code or 0) if isinstance(done.code, int) else 0
    except DoseError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    command = f"{PROG} " + " ".join(argv)
    horizon = ["--horizon", str(args.horizon)] if args.horizon is not None else []
    dump = [] if args.dump else ["--no-dump"]
    if args.pilot:
        flags = ["--variants", "baseline", "--seeds", str(args.pilot_seeds), "--metric", "sampled", "--jobs",
                 str(args.jobs), *horizon, *dump]
        return run_pilot(out, caps, settings, flags, args.overrides, args.preset, command, eval_caps)
    flags = ["--variants", "2x2", "--seeds", str(args.seeds), "--metric", "sampled", "--jobs", str(args.jobs), *horizon,
             *dump]
    todo = [(s, cap) for s in settings for cap in caps[s.rsplit("-", 1)[0]]]
    t0 = time.perf_counter()
    for i, (setting, cap) in enumerate(todo, 1):
        held_out = held_out_cap(eval_caps, setting)
        name = cell_name(setting, cap, held_out)
        rc = run_cell(PROG, f"cell {i}/{len(todo)} {name}", args.preset,
                      [*cell_overrides(setting, cap, held_out), *args.overrides], flags, out / name)
        if rc != 0:
            return rc
    args_line = (f"2x2, {args.seeds} seeds, held-out sampled success, "
                 + ("batches dumped and audited" if args.dump else "`--no-dump`: coupling from each run's metrics"))
    try:
        write(out, caps, settings, predict_at, command, time.perf_counter() - t0, args_line, eval_caps)
    except DoseError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"{PROG}: wrote {out / 'README.md'}")
    return 0
