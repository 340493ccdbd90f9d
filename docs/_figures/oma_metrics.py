"""The `oma/*` metrics of a healthy run, plotted from its metrics.jsonl (docs/hosts.md#metrics shows the figure).

The run: the default job (`oma train`, household, GiGPO with OA + MA), seed 0, with `dump_batches=true`; its
config.json, summary.json and metrics.jsonl.gz are committed in docs/evidence/default-job-seed0/. Rerun:

    python docs/_figures/oma_metrics.py            # writes docs/_figures/oma_metrics.png

tests/test_docs_figures.py checks that the figure's series are the run's own.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUN = HERE.parent / "evidence" / "default-job-seed0"
OUT = HERE / "oma_metrics.png"
# (metric, panel title): what a reader checks on each step of a healthy run (docs/hosts.md#metrics)
PANELS = [
    (("oma/rows_per_trajectory/mean", "oma/rows_per_trajectory/max"), "rows per trajectory (mean, max)"),
    (("oma/expansion_ratio",), "expansion ratio (failure rows / success rows)"),
    (("oma/zero_spread_groups",), "zero-spread groups (share)"),
    (("oma/failure_mass_share",), "failure mass share"),
    (("oma/effective_trajectories", "oma/trajectories"), "effective trajectories, trajectories"),
    (("success",), "training success"),
]


def series(run: Path = RUN) -> dict[str, list[tuple[int, float]]]:
    """Each plotted metric's (iteration, value) pairs, from the run's metrics.jsonl(.gz); iterations that do not
    define a metric (no success yet: no expansion ratio) are left out, as the trainer leaves them out."""
    path = run / "metrics.jsonl.gz"
    lines = gzip.open(path, "rt").read().splitlines() if path.exists() else (run / "metrics.jsonl").read_text().splitlines()
    out: dict[str, list[tuple[int, float]]] = {name: [] for names, _ in PANELS for name in names}
    for line in lines:
        record = json.loads(line)
        for name in out:
            if record.get(name) is not None and record.get("iteration", 0) > 0:
                out[name].append((int(record["iteration"]), float(record[name])))
    return out


def plot(run: Path = RUN, out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(run)
    fig, axes = plt.subplots(2, 3, figsize=(10.5, 5.2), sharex=True)
    for ax, (names, title) in zip(axes.flat, PANELS):
        for name, style in zip(names, ("-", "--")):
            its, values = zip(*data[name])
            ax.plot(its, values, style, lw=1.4, label=name.removeprefix("oma/"))
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if len(names) > 1:
            ax.legend(fontsize=7, frameon=False)
    for ax in axes[1]:
        ax.set_xlabel("iteration")
    fig.suptitle("oma/* metrics of a healthy run: the default job, seed 0 (docs/evidence/default-job-seed0)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot(Path(sys.argv[1]) if len(sys.argv) > 1 else RUN))
