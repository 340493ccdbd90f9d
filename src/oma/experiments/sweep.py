"""What the tabular lane's sweeps share (``oma coupling-map``, ``oma dose-response``; docs/experiments.md#the-tabular-lane).

A sweep is a set of *cells*; a cell is one ``oma compare`` of the lane's preset with its own overrides, run into
its own folder, so it is resumable and its full report stays beside the sweep's. The sweep reads each finished
cell back from its ``results.json`` and ``compare.json`` (:func:`read_cell`) and applies Holm across every paired
difference of all its cells (:func:`holm_across`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from oma.experiments.stats import Estimate, holm, t_cdf, t_quantile
from oma.experiments.variants import BASELINE
from oma.files import read_json_object

PRESET = "configs/chain-tabular-grpo.yaml"
"""The lane's preset (relative to the repository root, or the working directory)."""

COMPARED = ("row+MA", "OA+native", "OA+MA")
"""The variants compared to row+native in every cell."""

DIFFS = (("diff_endpoint", "endpoint"), ("diff_nauc", "nAUC"))
"""(results.json key, label) of the paired differences of a cell."""

PER_SEED = (("endpoint", "endpoint"), ("nauc", "nAUC"))
"""(results.json run key, label) of the per-seed figures whose paired differences :func:`read_cell` lists."""


def parser(error: type[Exception], **kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser whose errors raise ``error`` (one line, no usage block), for a command's ``main``."""

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise error(message)

    return _Parser(**kwargs)


def check_args(args: argparse.Namespace, valid: tuple[str, ...], error: type[Exception]) -> list[str]:
    """The sweep's common flags checked before any cell runs, each refused in one line naming it: the
    ``--settings`` chosen (each one of ``valid``), ``--seeds`` >= 2 (a CI needs two), ``--horizon`` and ``--jobs`` >= 1.
    Returns the settings."""
    names = [n for n in args.settings.split(",") if n]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise error(f"--settings: unknown setting(s) {unknown}; valid: {', '.join(valid)}")
    if args.seeds < 2:
        raise error(f"--seeds must be >= 2 (a CI needs two seeds), got {args.seeds}")
    for flag, value in (("--horizon", args.horizon), ("--jobs", args.jobs)):
        if value is not None and value < 1:
            raise error(f"{flag} must be >= 1, got {value}")
    return names


def chain(on_wrong: str, length: int, actions: int, *extra: str) -> tuple[str, ...]:
    """The overrides of a ``chain`` setting on top of the preset."""
    return (f"env.options.on_wrong={on_wrong}", f"env.options.length={length}", f"env.options.actions={actions}", *extra)


def estimate(d: dict | None) -> Estimate | None:
    """An :class:`Estimate` back from its ``to_dict`` form (None for a missing or undefined one)."""
    if not d or d.get("mean") is None:
        return None
    hw = d["half_width"]
    return Estimate(d["mean"], math.nan if hw is None else hw, d["n"], d["level"], math.nan if d["p"] is None else d["p"])


def read_cell(folder: Path) -> dict[str, Any]:
    """A finished cell's figures, from its report's results.json and its compare.json:

    * ``ratio``: row+native's measured expansion ratio (mean and CI over seeds); ``baseline_endpoint``,
      ``baseline_nauc``, ``baseline_gain`` (None when the report predates it), ``n_seeds``;
    * ``diffs[variant][label]``: the paired difference to row+native of each compared variant;
    * ``paired[variant][label]``: its per-seed differences d_k = variant_k − row+native_k, seeds in order;
    * ``wall_time_s`` (every invocation of its compare), ``machine``, ``overrides``.
    """
    res = read_json_object(folder / "results.json")
    doc = read_json_object(folder / "compare.json")
    pv = res["variants"]
    runs = {(r["variant"], r["seed"]): r for r in res["runs"]}
    entry = {"ratio": estimate(pv[BASELINE]["coupling"]["expansion_ratio"]),
             "baseline_endpoint": estimate(pv[BASELINE]["endpoint"]),
             "baseline_nauc": estimate(pv[BASELINE]["nauc"]),
             "baseline_gain": estimate(res.get("baseline_gain")),
             "n_seeds": pv[BASELINE]["n_seeds"],
             "wall_time_s": sum(h.get("wall_time_s") or 0.0 for h in doc.get("history", [])),
             "machine": (f"{doc['machine'].get('cpu_count')} CPUs, {doc['jobs']} parallel runs × "
                         f"{doc['machine'].get('threads_per_run')} thread(s)"),
             "overrides": doc.get("overrides", []), "diffs": {}, "paired": {}}
    for v in COMPARED:
        if v in pv:
            entry["diffs"][v] = {label: estimate(pv[v].get(key)) for key, label in DIFFS}
            seeds = pv[v].get("paired_seeds", [])
            entry["paired"][v] = {label: [runs[(v, k)][key] - runs[(BASELINE, k)][key] for k in seeds]
                                  for key, label in PER_SEED}
    return entry


def holm_across(cells: dict[str, dict[str, Any]]) -> tuple[int, set[tuple[str, str, str]]]:
    """Holm at family-wise 5% across every defined paired difference of the sweep: the family's size and the
    (cell, variant, label) that survive."""
    family = [(c, v, m, e) for c, entry in cells.items() for v, ms in entry["diffs"].items() for m, e in ms.items()
              if e is not None and math.isfinite(e.p)]
    kept = holm([e.p for *_, e in family]) if family else []
    return len(family), {(c, v, m) for (c, v, m, _), k in zip(family, kept) if k}


def detectable(e: Estimate) -> float:
    """The smallest true difference this paired design detects with 80% power at two-sided 5%:
    (t_0.975 + t_0.8) · SE with n − 1 degrees of freedom, SE = half_width / t_0.975 (≈ 2.90 · SE at n = 30)."""
    if e.n < 2 or not math.isfinite(e.half_width):
        return math.nan
    t = t_quantile(0.975, e.n - 1)
    return (t + t_quantile(0.8, e.n - 1)) * e.half_width / t


def power(delta: float, e: Estimate) -> float:
    """The chance this paired design resolves a true difference ``delta`` at two-sided 5%, by the same shifted
    central t as :func:`detectable` (so ``power(detectable(e), e)`` is 0.8): P(T_{n−1} ≤ |delta| / SE − t_0.975)."""
    if e.n < 2 or not math.isfinite(e.half_width) or e.half_width <= 0:
        return math.nan
    t = t_quantile(0.975, e.n - 1)
    return t_cdf(abs(delta) / (e.half_width / t) - t, e.n - 1)


def fmt(e: Estimate | None, digits: int = 3, signed: bool = True) -> str:
    """``+0.021 [+0.014, +0.028]``; ``—`` for a missing estimate."""
    if e is None:
        return "—"
    sign = "+" if signed else ""
    return f"{e.mean:{sign}.{digits}f} [{e.lo:{sign}.{digits}f}, {e.hi:{sign}.{digits}f}]"


def run_cell(prog: str, name: str, preset: str, overrides: list[str], flags: list[str], out: Path) -> int:
    """``oma compare PRESET OVERRIDES FLAGS --out OUT`` for cell ``name``, announced on stdout; its exit status."""
    from oma.experiments import compare

    cmd = [preset, *overrides, *flags, "--out", str(out)]
    print(f"{prog}: {name}: oma compare {' '.join(cmd)}", flush=True)
    rc = compare.main(cmd)
    if rc != 0:
        print(f"{prog}: {name} failed (oma compare exit {rc}); rerun to resume", file=sys.stderr)
    return rc
