"""PNG plots of an audit (matplotlib, Agg canvas; no pyplot global state)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from oma.diagnostics.figures import AuditReport

SUCCESS_COLOR, FAILURE_COLOR = "#2a9d4b", "#d1495b"
ACC_COLORS = {
    "row+native": "#555555",
    "row+aligned": "#8ab6d6",
    "trajectory+native": "#e9a03b",
    "trajectory+aligned": "#1f5fa8",
}


def figure(width: float = 6.4, height: float = 4.0):
    """A matplotlib Figure on an Agg canvas (no pyplot global state), for every PNG oma writes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig, path: Path) -> None:
    """Lay ``fig`` out and write it to ``path`` as PNG."""
    fig.tight_layout()
    fig.savefig(path, format="png")


def rows_histogram(r: AuditReport, path: Path) -> None:
    """Rows per trajectory, successes and failures overlaid."""
    fig = figure()
    ax = fig.add_subplot()
    k = np.asarray(r.traj_rows)
    top = int(k.max())
    bins = np.arange(0.5, top + 1.5) if top <= 100 else np.linspace(0.5, top + 0.5, 51)
    for mask, label, color in ((r.traj_success, "success", SUCCESS_COLOR), (~r.traj_success, "failure", FAILURE_COLOR)):
        if mask.any():
            ax.hist(k[mask], bins=bins, alpha=0.6, color=color, label=f"{label} ({int(mask.sum())})")
    ax.set_xlabel("rows (steps) per trajectory")
    ax.set_ylabel("trajectories")
    ax.set_title("Rows per trajectory by outcome")
    ax.legend()
    save_png(fig, path)


def mass_share_bars(r: AuditReport, path: Path) -> None:
    """Objective-mass share of successes / failures per accounting, longest 10% as a marker."""
    fig = figure()
    ax = fig.add_subplot()
    names = list(r.accountings)
    x = np.arange(len(names))
    s = np.array([r.accountings[n].mass_share_success for n in names])
    f = np.array([r.accountings[n].mass_share_failure for n in names])
    lo = np.array([r.accountings[n].mass_share_longest10 for n in names])
    ax.bar(x - 0.12, s, width=0.6, color=SUCCESS_COLOR, label="successes")
    ax.bar(x - 0.12, f, width=0.6, bottom=s, color=FAILURE_COLOR, label="failures")
    # its own thin bar beside the outcome bar: the longest trajectories are mostly failures, and a marker on the
    # stacked bar would sit in whichever segment its height happens to reach
    ax.bar(x + 0.3, lo, width=0.16, color="black", label="longest 10% of trajectories")
    for xi, si in zip(x, s, strict=True):
        ax.text(xi - 0.12, si / 2, f"{100 * si:.0f}%", ha="center", va="center", color="white", fontsize=9)
    ax.set_xticks(x, [n.replace("+", "\n") for n in names])
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of objective mass")
    ax.set_title(f"Objective mass by outcome ({r.reducer}; aligned = {r.aligned_mass})")
    ax.legend(loc="upper right", fontsize=8)
    save_png(fig, path)


def mu_shift(r: AuditReport, path: Path) -> None:
    """Per-group μ_row − μ_traj against μ_traj."""
    fig = figure()
    ax = fig.add_subplot()
    shift = r.mu_row - r.mu_traj
    ax.axhline(0.0, color="#999999", lw=0.8)
    ax.scatter(r.mu_traj, shift, s=12 if r.groups > 200 else 30, alpha=0.7, color="#1f5fa8")
    ax.set_xlabel("μ_traj (trajectory accounting)")
    ax.set_ylabel("μ_row − μ_traj")
    ax.set_title(f"Per-group baseline shift of row accounting (mean {shift.mean():+.3g})")
    save_png(fig, path)


def mass_share_over_iterations(items: list[tuple[int, AuditReport]], path: Path) -> None:
    """Mass share of successes per accounting across a run's iterations."""
    fig = figure()
    ax = fig.add_subplot()
    from matplotlib.ticker import MaxNLocator

    its = [it for it, _ in items]
    # The mass share does not depend on the outcome accounting, so accountings that differ only there draw
    # the same line: draw each distinct line once, labelled with every accounting it stands for.
    drawn: list[tuple[list[float], list[str], str]] = []
    for name, color in ACC_COLORS.items():
        share = [r.accountings[name].mass_share_success for _, r in items]
        same = next((d for d in drawn if np.allclose(d[0], share, rtol=0, atol=1e-12)), None)
        if same is None:
            drawn.append((share, [name], color))
        else:
            same[1].append(name)
    for share, names, color in drawn:
        ax.plot(its, share, marker="o", color=color, label=" = ".join(names))
    ax.plot(its, [r.successes / r.trajectories for _, r in items], ls="--", color="black", label="success rate")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mass share of successes")
    ax.set_title("Objective mass of successes over iterations")
    ax.legend(fontsize=8)
    save_png(fig, path)


BATCH_PLOTS = (
    ("Rows per trajectory by outcome", "rows_per_trajectory.png", rows_histogram),
    ("Objective-mass share per accounting", "mass_share.png", mass_share_bars),
    ("Per-group μ shift (row − trajectory accounting)", "mu_shift.png", mu_shift),
)
"""(caption, file name, plot) of the plots of one batch."""

OVER_ITERATIONS = "mass_share_over_iterations.png"
"""The plot of a run folder's every batch (``oma audit RUN --all``)."""

PNGS: tuple[str, ...] = (*(name for _, name, _ in BATCH_PLOTS), OVER_ITERATIONS)
"""Every PNG an ``--html`` or ``--md`` report may write beside its page."""


def batch_plots(r: AuditReport, folder: Path) -> list[tuple[str, str]]:
    """Write the three batch plots into ``folder``; returns (caption, file name) pairs."""
    for _, name, fn in BATCH_PLOTS:
        fn(r, folder / name)
    return [(c, n) for c, n, _ in BATCH_PLOTS]
