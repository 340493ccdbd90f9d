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
then over seeds). Resumable like ``oma compare``: rerunning the command reuses finished runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oma.experiments.stats import Estimate, holm
from oma.experiments.variants import BASELINE

PRESET = "configs/chain-tabular-grpo.yaml"
"""The lane's preset (relative to the repository root, or the working directory)."""


@dataclass(frozen=True)
class Setting:
    name: str
    coupling: str
    """What the setting is, in words."""
    overrides: tuple[str, ...]
    """On top of the preset (which is `stay`: length 6, 4 signs, 4 actions, cap 18, GRPO)."""


def _chain(on_wrong: str, length: int, actions: int, *extra: str) -> tuple[str, ...]:
    return (f"env.options.on_wrong={on_wrong}", f"env.options.length={length}", f"env.options.actions={actions}", *extra)


GSPO = ("algo.objective=gspo", "algo.reducer=seq-mean-token-mean", "algo.clip_low=0.0003", "algo.clip_high=0.0004")
"""GSPO-token with the GSPO paper's sequence-ratio clip range (as configs/household-gspo-oma.yaml)."""

SETTINGS: tuple[Setting, ...] = (
    Setting("advance", "control: a wrong action moves on but cannot win; every episode lasts 4 steps",
            _chain("advance", 4, 2)),
    Setting("end", "dead ends: a wrong action ends the episode (failures shorter than successes)",
            _chain("end", 4, 2)),
    Setting("end-progress", "dead ends with partial credit (furthest position / length)",
            _chain("end", 4, 2, "env.options.reward=progress")),
    Setting("stay", "loops: a wrong action changes nothing, failures run to the 18-step cap", ()),
    Setting("stay-progress", "loops with partial credit", ("env.options.reward=progress",)),
    Setting("reset", "resets: a wrong action sends the agent back to the start, failures run to the cap",
            _chain("reset", 6, 2)),
    Setting("reset-gigpo", "resets, GiGPO (step-level groups by anchor, ω = 1, γ = 0.95)",
            (*_chain("reset", 6, 2), "algo.estimator=gigpo")),
    Setting("reset-gspo", "resets, GSPO-token (sequence ratio, seq-mean-token-mean, clip 3e-4/4e-4)",
            (*_chain("reset", 6, 2), *GSPO)),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)

COMPARED = ("row+MA", "OA+native", "OA+MA")
DIFFS = (("diff_endpoint", "endpoint"), ("diff_nauc", "nAUC"))


class MapError(ValueError):
    """A bad argument; the message says which."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise MapError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oma coupling-map", description="Map OMA's effect (OA+MA − row+native, and OA or MA alone) "
                "against measured expansion–outcome coupling with the tabular policy (docs/experiments.md).")
    p.add_argument("--seeds", type=int, default=30, metavar="S", help="seeds per cell (default 30)")
    p.add_argument("--horizon", type=int, default=None, metavar="H", help="matched horizon (default: the preset's 30)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="parallel runs (default 1)")
    p.add_argument("--out", default="runs/coupling-map", metavar="DIR", help="output (default runs/coupling-map)")
    p.add_argument("--settings", default=",".join(SETTING_NAMES), metavar="A,B",
                   help=f"comma-separated subset of {', '.join(SETTING_NAMES)} (default all)")
    p.add_argument("--preset", default=PRESET, metavar="YAML", help=f"the lane's preset (default {PRESET})")
    p.add_argument("overrides", nargs="*", help="dotted overrides applied to every setting (e.g. env.eval_tasks=32)")
    return p


def _estimate(d: dict | None) -> Estimate | None:
    if not d or d.get("mean") is None:
        return None
    hw = d["half_width"]
    return Estimate(d["mean"], math.nan if hw is None else hw, d["n"], d["level"], math.nan if d["p"] is None else d["p"])


def collect(out: Path, names: list[str]) -> dict[str, Any]:
    """Every setting's figures from its report's results.json and compare.json, and Holm across the map."""
    settings = {}
    for name in names:
        folder = out / name
        res = json.loads((folder / "results.json").read_text())
        doc = json.loads((folder / "compare.json").read_text())
        pv = res["variants"]
        entry = {"ratio": _estimate(pv[BASELINE]["coupling"]["expansion_ratio"]),
                 "baseline_endpoint": _estimate(pv[BASELINE]["endpoint"]),
                 "baseline_nauc": _estimate(pv[BASELINE]["nauc"]),
                 "n_seeds": pv[BASELINE]["n_seeds"],
                 "wall_time_s": sum(h.get("wall_time_s") or 0.0 for h in doc.get("history", [])),
                 "machine": (f"{doc['machine'].get('cpu_count')} CPUs, {doc['jobs']} parallel runs × "
                             f"{doc['machine'].get('threads_per_run')} thread(s)"),
                 "overrides": doc.get("overrides", []), "diffs": {}}
        for v in COMPARED:
            if v in pv:
                entry["diffs"][v] = {label: _estimate(pv[v].get(key)) for key, label in DIFFS}
        settings[name] = entry
    family = [(s, v, m, e) for s, entry in settings.items() for v, ms in entry["diffs"].items() for m, e in ms.items()
              if e is not None and math.isfinite(e.p)]
    kept = holm([e.p for *_, e in family]) if family else []
    survivors = {(s, v, m) for (s, v, m, _), k in zip(family, kept) if k}
    return {"settings": settings, "family_size": len(family), "holm": survivors}


def detectable(e: Estimate) -> float:
    """The smallest true difference this paired design detects with 80% power at two-sided 5%:
    (t_0.975 + t_0.8) · SE with n − 1 degrees of freedom, SE = half_width / t_0.975 (≈ 2.90 · SE at n = 30)."""
    from oma.experiments.stats import t_quantile

    if e.n < 2 or not math.isfinite(e.half_width):
        return math.nan
    t = t_quantile(0.975, e.n - 1)
    return (t + t_quantile(0.8, e.n - 1)) * e.half_width / t


def _fmt(e: Estimate | None, digits: int = 3, signed: bool = True) -> str:
    if e is None:
        return "—"
    sign = "+" if signed else ""
    return f"{e.mean:{sign}.{digits}f} [{e.lo:{sign}.{digits}f}, {e.hi:{sign}.{digits}f}]"


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
            text = _fmt(d)
            if d is not None and d.significant:
                text = f"**{text}**"
            if (name, v, metric) in m["holm"]:
                text += " ✱"
            cells.append(text)
        power = detectable(e["diffs"]["OA+MA"]["endpoint"]) if e["diffs"].get("OA+MA", {}).get("endpoint") else math.nan
        out.append(f"| {name} | {_fmt(e['ratio'], 2, signed=False)} | {_fmt(e['baseline_endpoint'], signed=False)} | "
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
    from oma.experiments import compare

    try:
        args = _parser().parse_args(argv)
        names = [n for n in args.settings.split(",") if n]
        unknown = [n for n in names if n not in SETTING_NAMES]
        if unknown or not names:
            raise MapError(f"--settings: unknown setting(s) {unknown}; valid: {', '.join(SETTING_NAMES)}")
        if args.seeds < 2:
            raise MapError(f"--seeds must be >= 2 (a CI needs two seeds), got {args.seeds}")
    except SystemExit as done:  # --help
        return int(done.code or 0) if isinstance(done.code, int) else 0
    except MapError as e:
        print(f"oma coupling-map: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    t0 = time.perf_counter()
    for name in names:
        setting = next(s for s in SETTINGS if s.name == name)
        cmd = [args.preset, *setting.overrides, *args.overrides, "--variants", "2x2", "--seeds", str(args.seeds),
               "--metric", "sampled", "--jobs", str(args.jobs), "--out", str(out / name)]
        if args.horizon is not None:
            cmd += ["--horizon", str(args.horizon)]
        print(f"oma coupling-map: setting {name}: oma compare {' '.join(cmd)}", flush=True)
        rc = compare.main(cmd)
        if rc != 0:
            print(f"oma coupling-map: setting {name} failed (oma compare exit {rc}); rerun to resume", file=sys.stderr)
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
