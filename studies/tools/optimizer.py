"""Does MA's sign depend on the optimizer? Writes studies/optimizer/README.md's generated part, results.md and
results.json.

The tabular lane's committed cells take normalised-SGD steps (θ −= lr · g/‖g‖); verl, verl-agent and SkyRL use Adam.
The same cells rerun with AdamW at a step size tuned on row+native alone are compared here, cell by cell: each
component's Δ (OA = OA+native, MA = row+MA, OA+MA, each − row+native, paired by seed, held-out sampled success at
the endpoint) under each optimizer, and the difference between the two optimizers, Adam − normalised SGD, with
Welch's 95% CI (two independent sets of runs: the same seed numbers, but another optimizer takes other rollouts).
*Same sign* = both Δ resolved (CI excludes 0) with one sign; *flips* = both resolved with opposite signs;
otherwise *not resolved* under one of them.

Reads only committed evidence: the pairs of :data:`PAIRS` (a map folder lists its cells in map.json; a sweep folder
holds one folder a cell). A pair whose Adam folder is not committed yet is skipped. Run by hand; the tests
regenerate the page byte for byte:

    .venv/bin/python studies/tools/optimizer.py
"""

import math
import sys
from pathlib import Path
from typing import Any

from oma.experiments.stats import Estimate, mean_ci, welch_diff
from oma.experiments.sweep import read_cell
from oma.files import read_json_object
from pages import page_main

PAIRS = (("the coupling map", "tabular-coupling-map/map", "optimizer/map-adam"),
         ("sticky loops", "dose-response/sweep-sticky", "optimizer/sweep-sticky-adam"))
"""(what the cells are, the normalised-SGD folder, the Adam folder), under studies/."""
PARTS = (("OA", "OA+native"), ("MA", "row+MA"), ("OA+MA", "OA+MA"))


def cells(folder: Path) -> list[str]:
    """The cell folders' names: map.json's settings, or every subfolder holding a results.json."""
    if (folder / "map.json").is_file():
        return list(read_json_object(folder / "map.json")["settings"])
    return sorted((p.name for p in folder.iterdir() if (p / "results.json").is_file()),
                  key=lambda n: (n.split("-cap")[0], int(n.split("-cap")[1].split("-")[0])))


def deltas(folder: Path) -> dict[str, Estimate]:
    """Each component's paired Δ (endpoint) in one cell."""
    cell = read_cell(folder)
    return {part: mean_ci(cell["paired"][v]["endpoint"]) for part, v in PARTS}


def reading(sgd: Estimate, adam: Estimate) -> str:
    if not (sgd.significant and adam.significant):
        return "not resolved"
    return "same sign" if (sgd.mean > 0) == (adam.mean > 0) else "flips"


def collect(studies: Path) -> list[dict[str, Any]]:
    rows = []
    for what, sgd_rel, adam_rel in PAIRS:
        if not (studies / adam_rel).is_dir():
            continue
        for name in cells(studies / sgd_rel):
            sgd, adam = deltas(studies / sgd_rel / name), deltas(studies / adam_rel / name)
            rows.append({"cells": what, "cell": name, "sgd_source": f"{sgd_rel}/{name}", "adam_source": f"{adam_rel}/{name}",
                         "parts": {p: {"sgd": sgd[p], "adam": adam[p], "adam_minus_sgd": welch_diff(adam[p], sgd[p]),
                                       "reading": reading(sgd[p], adam[p])} for p, _ in PARTS}})
    if not rows:
        raise ValueError(f"{studies / PAIRS[0][2]}: missing (no Adam cells committed)")
    return rows


def _e(e: Estimate) -> str:
    text = f"{e.mean:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]" if math.isfinite(e.half_width) else f"{e.mean:+.3f} [n/a]"
    return f"**{text}**" if e.significant else text


def render(rows: list[dict[str, Any]]) -> str:
    out = ["# MA, OA and OA+MA under normalised SGD and under Adam", "",
           "Written by `studies/tools/optimizer.py` from the committed cells ([results.json](results.json)); do not "
           "edit by hand.", "",
           ("Per cell and component: Δ to row+native (paired by seed, held-out sampled success, endpoint, mean [95% "
            "CI]) under normalised SGD (the lane's committed cells) and under AdamW at the tuned step size, and Adam − "
            "SGD (Welch). **Bold** = the CI excludes 0."), ""]
    for part, _ in PARTS:
        mine = [r["parts"][part] for r in rows]
        counts = {k: sum(m["reading"] == k for m in mine) for k in ("same sign", "flips", "not resolved")}
        out += [f"## {part}", "",
                (f"{counts['same sign']} of {len(rows)} cells keep their sign, {counts['flips']} flip, "
                 f"{counts['not resolved']} {'is' if counts['not resolved'] == 1 else 'are'} not resolved under one optimizer or "
                 "both."), "",
                "| cells | cell | normalised SGD | Adam | Adam − SGD | reading |", "|---|---|---|---|---|---|"]
        out += [f"| {r['cells']} | [{r['cell']}](../{r['adam_source']}/report.md) | {_e(m['sgd'])} | {_e(m['adam'])} | "
                f"{_e(m['adam_minus_sgd'])} | {m['reading']} |" for r, m in zip(rows, mine)]
        out.append("")
    out += ["## Reproduce", "", "```", ".venv/bin/python studies/tools/optimizer.py", "```", ""]
    return "\n".join(out)


def to_json(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"generated_by": "studies/tools/optimizer.py",
            "rows": [{**{k: r[k] for k in ("cells", "cell", "sgd_source", "adam_source")},
                      "parts": {p: {k: (v.to_dict() if isinstance(v, Estimate) else v) for k, v in m.items()}
                                for p, m in r["parts"].items()}} for r in rows]}


def main(argv: list[str]) -> int:
    return page_main(argv, "optimizer.py", __doc__.split("\n\n")[0], "optimizer", "results", collect, render, to_json)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
