"""``oma coupling-map [--seeds S] [--jobs N] [--out DIR] [--settings a,b,...]``: OMA's effect against coupling.

The tabular lane (docs/experiments.md#the-tabular-lane) runs ``oma compare`` of
``configs/chain-tabular-grpo.yaml`` once per *setting*: a way the ``chain`` environment couples
episode length to outcome (docs/envs.md#chain-a-table-to-learn), with GRPO, and GiGPO and GSPO on the setting whose
failures expand the most. Each setting gets its own full report in ``DIR/<setting>/``; this module
then writes the map:

    DIR/README.md            the table, the map, what survives Holm across the whole map, wall time
    DIR/coupling_map.png     OA+MA − row+native (endpoint and nAUC) against the measured expansion ratio
    DIR/map.json             every figure of the map

The expansion ratio of a setting is measured, not assumed: the row+native runs' own training
batches, audited (failure rows per trajectory / success rows per trajectory, mean over iterations,
then over seeds). Resumable like ``oma compare``: rerunning the command reuses finished runs. A setting
is a cell of :mod:`oma.experiments.sweep`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oma.experiments.stats import Estimate
from oma.experiments.sweep import (PRESET, chain, check_args, detectable, fmt, holm_across, parser, read_cell,
                                  run_cell)


@dataclass(frozen=True)
class Setting:
    name: str
    coupling: str
    """What the setting is, in words."""
    overrides: tuple[str, ...]
    """On top of the preset (which is `stay`: length 6, 4 signs, 4 actions, cap 18, GRPO)."""


GSPO = ("algo.objective=gspo", "algo.reducer=seq-mean-token-mean", "algo.clip_low=0.0003", "algo.clip_high=0.0004")
"""GSPO-token with the GSPO paper's sequence-ratio clip range (as configs/household-gspo-oma.yaml)."""

SETTINGS: tuple[Setting, ...] = (
    Setting("advance", "control: a wrong action moves on but cannot win; every episode lasts 4 steps",
            chain("advance", 4, 2)),
    Setting("end", "dead ends: a wrong action ends the episode (failures shorter than successes)",
            chain("end", 4, 2)),
    Setting("end-progress", "dead ends with partial credit (furthest position / length)",
            chain("end", 4, 2, "env.options.reward=progress")),
    Setting("stay", "loops: a wrong action changes nothing, failures run to the 18-step cap", ()),
    Setting("stay-progress", "loops with partial credit", ("env.options.reward=progress",)),
    Setting("reset", "resets: a wrong action sends the agent back to the start, failures run to the cap",
            chain("reset", 6, 2)),
    Setting("reset-gigpo", "resets, GiGPO (step-level groups by anchor, ω = 1, γ = 0.95)",
            (*chain("reset", 6, 2), "algo.estimator=gigpo")),
    Setting("reset-gspo", "resets, GSPO-token (sequence ratio, seq-mean-token-mean, clip 3e-4/4e-4)",
            (*chain("reset", 6, 2), *GSPO)),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)


class MapError(ValueError):
    """A bad argument; the message says which."""


def _parser():
    p = parser(MapError, prog="oma coupling-map", description="Map OMA's effect (OA+MA − row+native, and OA or MA "
               "alone) against measured expansion–outcome coupling with the tabular policy (docs/experiments.md).")
    p.add_argument("--seeds", type=int, default=30, metavar="S", help="seeds per cell (default 30)")
    p.add_argument("--horizon", type=int, default=None, metavar="H", help="matched horizon (default: the preset's 30)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="parallel runs (default 1)")
    p.add_argument("--out", default="runs/coupling-map", metavar="DIR", help="output (default runs/coupling-map)")
    p.add_argument("--settings", default=",".join(SETTING_NAMES), metavar="A,B",
                   help=f"comma-separated subset of {', '.join(SETTING_NAMES)} (default all)")
    p.add_argument("--preset", default=PRESET, metavar="YAML", help=f"the lane's preset (default {PRESET})")
    p.add_argument("overrides", nargs="*", help="dotted overrides applied to every setting (e.g. env.eval_tasks=32)")
    return p


def collect(out: Path, names: list[str]) -> dict[str, Any]:
    """Every setting's figures (:func:`oma.experiments.sweep.read_cell`), and Holm across the map."""
    settings = {name: read_cell(out / name) for name in names}
    family_size, survivors = holm_across(settings)
    return {"settings": settings, "family_size": family_size, "holm": survivors}


def render(m: dict[str, Any], command: str, wall: float) -> str:
    s = m["settings"]
    out = ["# The tabular coupling map", "",
           "OMA's effect against expansion–outcome coupling, with the tabular policy (docs/experiments.md#the-tabular-lane).",
           "", "## Command", "", "```", command, "```", ""]
    out += ["## Settings", "",
            f"Each setting is one `oma compare` of `{PRESET}` (2x2 accountings, {next(iter(s.values()))['n_seeds']} "
            "seeds, held-out *sampled* success; its full report is in the setting's folder) with these overrides:", "",
            "| setting | coupling | overrides |", "|---|---|---|"]
    for name, e in s.items():
        setting = next(x for x in SETTINGS if x.name == name)
        out.append(f"| [{name}]({name}/report.md) | {setting.coupling} | `{' '.join(setting.overrides) or '(the preset)'}` |")
    out += ["", "## The map", "", "![OA+MA − row+native against the expansion ratio](coupling_map.png)", "",
            ("Δ = paired difference to row+native (same seed: same tasks), mean [95% CI]. **Bold** = the CI excludes 0; "
             f"✱ = it survives Holm–Bonferroni over all {m['family_size']} differences of this map (family-wise 5%). "
             "Ratio = failure rows / success rows per trajectory of the row+native runs' own batches."), "",
            "| setting | ratio | row+native endpoint | Δ endpoint OA+MA | Δ nAUC OA+MA | Δ endpoint OA alone | "
            "Δ endpoint MA alone | detectable Δ endpoint (80% power) |", "|---|---|---|---|---|---|---|---|"]
    for name, e in s.items():
        cells = []
        for v, metric in (("OA+MA", "endpoint"), ("OA+MA", "nAUC"), ("OA+native", "endpoint"), ("row+MA", "endpoint")):
            d = e["diffs"].get(v, {}).get(metric)
            text = fmt(d)
            if d is not None and d.significant:
                text = f"**{text}**"
            if (name, v, metric) in m["holm"]:
                text += " ✱"
            cells.append(text)
        power = detectable(e["diffs"]["OA+MA"]["endpoint"]) if e["diffs"].get("OA+MA", {}).get("endpoint") else math.nan
        out.append(f"| {name} | {fmt(e['ratio'], 2, signed=False)} | {fmt(e['baseline_endpoint'], signed=False)} | "
                   + " | ".join(cells) + f" | {power:.3f} |")
    out += ["", "## What each component does", ""]
    out += statements(m)
    compares = sum(e["wall_time_s"] for e in s.values())
    out += ["", "## Wall time", "",
            f"This invocation of the command: {wall / 60:.1f} min, reports included. The settings' `oma compare` runs "
            f"took {compares / 60:.1f} min of wall time over all their invocations (compare.json `history`), "
            f"on {_machine(s)}.", ""]
    return "\n".join(out)


def _machine(settings: dict[str, Any]) -> str:
    return next(iter(settings.values()))["machine"]


def statements(m: dict[str, Any]) -> list[str]:
    """Per setting, what OA alone, MA alone and both do to endpoint / nAUC: helps, hurts or — (CI includes 0)."""
    names = (("OA+native", "OA alone"), ("row+MA", "MA alone"), ("OA+MA", "OA+MA"))
    lines = [("Each cell: endpoint / nAUC against row+native; **helps** or **hurts** when the 95% CI excludes 0 "
              "(✱: it also survives Holm over the map), — when it includes 0."), "",
             "| setting | " + " | ".join(label for _, label in names) + " |", "|---|---|---|---|"]
    for name, e in m["settings"].items():
        cells = []
        for v, _ in names:
            parts = []
            for metric, d in e["diffs"].get(v, {}).items():
                if d is None or not d.significant:
                    parts.append("—")
                else:
                    star = " ✱" if (name, v, metric) in m["holm"] else ""
                    parts.append(f"**{'helps' if d.mean > 0 else 'hurts'}**{star} ({d.mean:+.3f})")
            cells.append(" / ".join(parts))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def plot(m: dict[str, Any], path: Path) -> None:
    """Δ (OA+MA − row+native) against the measured expansion ratio, endpoint and nAUC, 95% CI bars."""
    from oma.diagnostics.plots import figure, save_png

    fig = figure(10.0, 4.2)
    for j, metric in enumerate(("endpoint", "nAUC")):
        ax = fig.add_subplot(1, 2, j + 1)
        for name, e in m["settings"].items():
            d, r = e["diffs"].get("OA+MA", {}).get(metric), e["ratio"]
            if d is None or r is None:
                continue
            color = "#1f4e9c" if "gigpo" not in name and "gspo" not in name else ("#c0392b" if "gigpo" in name else "#27ae60")
            ax.errorbar(r.mean, d.mean, xerr=np.nan_to_num(r.half_width), yerr=np.nan_to_num(d.half_width), fmt="o",
                        color=color, capsize=4, mfc=color if d.significant else "white")
            ax.annotate(name, (r.mean, d.mean), textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.axhline(0.0, color="#999999", lw=0.8)
        ax.axvline(1.0, color="#bbbbbb", lw=0.8, ls="--")
        ax.set_xlabel("expansion ratio (failure rows / success rows per trajectory)")
        ax.set_ylabel(f"Δ {metric}, OA+MA − row+native")
        ax.set_title(f"{metric} (filled: 95% CI excludes 0)")
    fig.suptitle("The tabular coupling map: GRPO (blue), GiGPO (red), GSPO (green)", fontsize=10)
    save_png(fig, path)


def to_json(m: dict[str, Any], wall: float) -> dict[str, Any]:
    def est(e):
        return e.to_dict() if isinstance(e, Estimate) else None

    return {"wall_time_s": wall, "family_size": m["family_size"],
            "holm_significant": sorted("/".join(k) for k in m["holm"]),
            "settings": {n: {"ratio": est(e["ratio"]), "baseline_endpoint": est(e["baseline_endpoint"]),
                             "baseline_nauc": est(e["baseline_nauc"]), "n_seeds": e["n_seeds"],
                             "wall_time_s": e["wall_time_s"],
                             "diffs": {v: {k: est(x) for k, x in ms.items()} for v, ms in e["diffs"].items()}}
                         for n, e in m["settings"].items()}}


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        names = check_args(args, SETTING_NAMES, MapError)
    except SystemExit as done:  # --help
        return int(done.code or 0) if isinstance(done.code, int) else 0
    except MapError as e:
        print(f"oma coupling-map: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    t0 = time.perf_counter()
    flags = ["--variants", "2x2", "--seeds", str(args.seeds), "--metric", "sampled", "--jobs", str(args.jobs)]
    if args.horizon is not None:
        flags += ["--horizon", str(args.horizon)]
    for name in names:
        setting = next(s for s in SETTINGS if s.name == name)
        rc = run_cell("oma coupling-map", f"setting {name}", args.preset, [*setting.overrides, *args.overrides], flags,
                      out / name)
        if rc != 0:
            return rc
    write_map(out, names, "oma coupling-map " + " ".join(argv), time.perf_counter() - t0)
    print(f"oma coupling-map: wrote {out / 'README.md'}")
    return 0


def write_map(out: Path, names: list[str], command: str, wall: float) -> None:
    """The map of the finished settings ``names`` under ``out``: README.md, coupling_map.png, map.json.
    ``wall`` is the wall time of the command that ran them (the README reports it)."""
    from oma.files import atomic_write_text

    m = collect(out, names)
    plot(m, out / "coupling_map.png")
    atomic_write_text(out / "map.json", json.dumps({"command": command, **to_json(m, wall)}, indent=2))
    atomic_write_text(out / "README.md", render(m, command, wall))
