"""One batch's expansion, from a real audit: the rows each trajectory became, and each trajectory's share of the
objective under the loss's native mass and under Mass Alignment (docs/glossary.md#expansion-expansion-ratio).

The batch is iteration 1 of the default job (`oma train dump_batches=true`, seed 0), committed as
docs/evidence/default-job-seed0/iter_000001.parquet. It is audited with the audit's own reader and code, as
`oma audit BATCH` does (token-mean, aligned mass uniform). Rerun:

    python docs/_figures/expansion.py              # writes docs/_figures/expansion.png

tests/test_docs_figures.py checks the figure's numbers against `oma audit --json` of the same batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BATCH = HERE.parent / "evidence" / "default-job-seed0" / "iter_000001.parquet"
OUT = HERE / "expansion.png"


def trajectories(batch: Path = BATCH) -> dict[str, np.ndarray]:
    """Per trajectory, in the order the figure draws them (by group, then successes before failures, then rows):
    its group, rows, success, and its mass under ``row+native`` (token-mean) and ``trajectory+aligned`` (uniform)."""
    from oma.diagnostics.audit import audit
    from oma.diagnostics.tables import read_batch

    b = read_batch(batch)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens,
              response_length=b.response_length, step_index=b.step_index, anchor=b.anchor,
              step_rewards=b.step_rewards, won=b.won, success_rule=b.success_rule, padding_copy=b.padding_copy,
              dump=b.dump, group_labels=b.group_labels, traj_labels=b.traj_labels, source=str(batch))
    out = {"group": np.asarray(r.traj_group), "rows": np.asarray(r.traj_rows), "success": np.asarray(r.traj_success),
           "native": np.asarray(r.accountings["row+native"].mass),
           "aligned": np.asarray(r.accountings["trajectory+aligned"].mass)}
    order = np.lexsort((out["rows"], ~out["success"].astype(bool), out["group"]))
    return {k: v[order] for k, v in out.items()}


def plot(batch: Path = BATCH, out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = trajectories(batch)
    x = np.arange(len(t["rows"]))
    colour = np.where(t["success"], "#2e7d32", "#c62828")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.4), sharex=True, height_ratios=[1, 1.1])
    top.bar(x, t["rows"], color=colour, width=0.85)
    top.set_ylabel("rows (agent steps)")
    fail, win = t["rows"][~t["success"].astype(bool)], t["rows"][t["success"].astype(bool)]
    ratio = fail.mean() / win.mean() if len(fail) and len(win) else float("nan")
    top.set_title(f"One batch of the default job: {len(x)} trajectories in {len(np.unique(t['group']))} groups "
                  f"(green: success, red: failure); expansion ratio {ratio:.2f}", fontsize=10)
    bottom.bar(x - 0.2, 100 * t["native"], width=0.4, color=colour, alpha=0.55,
               label="native mass (token-mean, row+native; coloured by outcome)")
    bottom.bar(x + 0.2, 100 * t["aligned"], width=0.4, color="#1565c0", label="Mass Alignment (uniform, OA+MA)")
    share = lambda m: 100 * m[~t["success"].astype(bool)].sum()
    bottom.set_ylabel("share of the objective (%)")
    bottom.set_title(f"failures' share of the objective: {share(t['native']):.0f}% native, "
                     f"{share(t['aligned']):.0f}% under Mass Alignment", fontsize=10)
    bottom.legend(fontsize=8, frameon=False, loc="upper left")
    edges = np.flatnonzero(np.diff(t["group"])) + 0.5
    for ax in (top, bottom):
        for e in edges:
            ax.axvline(e, color="0.75", lw=0.8)
        ax.grid(axis="y", alpha=0.3)
    bottom.set_xlabel("trajectory (grouped by task: the lines separate groups)")
    bottom.set_xticks([])
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(plot(Path(sys.argv[1]) if len(sys.argv) > 1 else BATCH))
