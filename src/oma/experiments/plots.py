"""PNG figures of a comparison report (matplotlib, Agg canvas; no pyplot global state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from oma.diagnostics.plots import ACC_COLORS, figure, save_png
from oma.experiments.stats import Estimate
from oma.experiments.variants import VARIANTS


def color(variant: str) -> str:
    """The audit report's colour of the variant's accounting (row+native grey … OA+MA dark blue)."""
    return ACC_COLORS.get(VARIANTS[variant].audit_name, "#333333") if variant in VARIANTS else "#333333"


def success_curves(curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, int]], horizon: int, path: Path,
                   ylabel: str = "held-out greedy success") -> None:
    """Mean held-out success per variant with its 95% CI band over seeds.

    ``curves[variant] = (iterations, mean, half_width, n_seeds)``; a NaN half-width draws no band.
    """
    fig = figure(7.0, 4.2)
    ax = fig.add_subplot()
    for name, (x, mean, hw, n) in curves.items():
        c = color(name)
        ax.plot(x, mean, marker="o", ms=3, color=c, label=f"{name} (n={n})")
        if np.all(np.isfinite(hw)):
            ax.fill_between(x, np.clip(mean - hw, 0, 1), np.clip(mean + hw, 0, 1), color=c, alpha=0.18, lw=0)
    ax.set_xlim(0, horizon)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(f"Success curves, mean and 95% CI over seeds (horizon {horizon})")
    ax.legend(fontsize=8)
    save_png(fig, path)


def metric_bars(estimates: dict[str, Estimate], per_seed: dict[str, list[float]], title: str, ylabel: str,
                path: Path) -> None:
    """One bar per variant (mean over seeds) with 95% CI error bars and the per-seed values as dots."""
    fig = figure(6.4, 4.0)
    ax = fig.add_subplot()
    names = list(estimates)
    x = np.arange(len(names))
    means = np.array([estimates[n].mean for n in names])
    err = np.array([estimates[n].half_width if np.isfinite(estimates[n].half_width) else 0.0 for n in names])
    ax.bar(x, means, yerr=err, capsize=6, color=[color(n) for n in names], alpha=0.85, ecolor="black")
    for xi, n in zip(x, names, strict=True):
        vals = per_seed.get(n, [])
        ax.scatter(np.full(len(vals), xi) + np.linspace(-0.12, 0.12, max(len(vals), 1))[: len(vals)], vals,
                   color="black", s=14, zorder=3)
    ax.set_xticks(x, names)
    ax.set_ylim(0, max(1.0, float(np.nanmax(means + err)) if len(names) else 1.0) * 1.02)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    save_png(fig, path)


def paired_differences(diffs: dict[str, dict[str, Estimate]], path: Path) -> None:
    """Paired differences to the baseline (mean and 95% CI) of each metric, one panel per metric."""
    metrics = list(next(iter(diffs.values())).keys()) if diffs else []
    fig = figure(7.0, 1.2 + 0.5 * max(len(diffs), 1) * max(len(metrics), 1))
    for j, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), j + 1)
        names = list(diffs)
        y = np.arange(len(names))[::-1]
        for yi, n in zip(y, names, strict=True):
            e = diffs[n][metric]
            hw = e.half_width if np.isfinite(e.half_width) else 0.0
            ax.errorbar(e.mean, yi, xerr=hw, fmt="o", color=color(n), capsize=5,
                        mfc=color(n) if e.significant else "white")
        ax.axvline(0.0, color="#999999", lw=0.8)
        ax.set_yticks(y, names if j == 0 else [""] * len(names))
        ax.set_title(f"Δ {metric} vs row+native")
        ax.set_ylim(-0.7, len(names) - 0.3)
    if metrics:
        fig.suptitle("Paired differences, mean and 95% CI over seeds (filled = CI excludes 0)", fontsize=10)
    save_png(fig, path)
