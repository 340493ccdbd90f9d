"""OA and MA apart and together, per tabular cell: writes studies/dose-response/components.md and components.json.

OA+MA − row+native is not the sum of OA alone and MA alone. Per cell and seed k (same warm start, same tasks):

    I_k = (OA+MA_k − row_k) − (OA_k − row_k) − (MA_k − row_k) = OA+MA_k − OA_k − MA_k + row_k

the interaction: how much more (or less) OA+MA gives than its two parts added. Its mean and 95% t CI over seeds,
with Holm across every cell's interaction (a family of its own, family-wise 5%). Then, per swept setting, how each
component's Δ changes from the lowest-ratio cell to the highest (Welch's difference of the two cells' means: the
caps of a setting reuse seed numbers, but once the cap differs the tasks and rollouts do, so the cells are taken
as independent).

Reads only committed evidence (each cell's ``oma compare`` results.json and compare.json):

* the tabular coupling map's settings, ``tabular-coupling-map/map/<setting>/``;
* the dose–response sweep's cells, ``dose-response/sweep/<cell>/``, and, once committed, the sticky loops' cells,
  ``dose-response/sweep-sticky/<cell>/``.

Run by hand after either changes; the tests regenerate the page byte for byte:

    .venv/bin/python studies/tools/components.py
"""

import math
import sys
from pathlib import Path
from typing import Any

from oma.experiments.stats import Estimate, holm, mean_ci, welch_diff
from oma.experiments.sweep import read_cell
from oma.files import read_json_object
from pages import page_main

SOURCES = (("map", "tabular-coupling-map/map"), ("sweep", "dose-response/sweep"),
           ("sweep", "dose-response/sweep-sticky"))
"""(kind, folder under studies/): a map folder lists its settings in map.json; a sweep folder holds one folder a cell,
named ``<setting>-cap<N>[-eval<E>]``. A sweep folder not (yet) committed is skipped."""
PARTS = (("OA", "OA+native"), ("MA", "row+MA"), ("OA+MA", "OA+MA"))
ALPHA = 0.05


def cell_folders(studies: Path) -> list[tuple[str, str, Path]]:
    """(source kind, setting, folder) of every committed cell, in the order of :data:`SOURCES` and then caps."""
    out = []
    for kind, rel in SOURCES:
        folder = studies / rel
        if kind == "map":
            out += [(kind, name, folder / name) for name in read_json_object(folder / "map.json")["settings"]]
        elif folder.is_dir():
            cells = [p for p in folder.iterdir() if (p / "results.json").is_file()]
            for p in sorted(cells, key=lambda p: (p.name.split("-cap")[0], int(p.name.split("-cap")[1].split("-")[0]))):
                out.append((kind, p.name.split("-cap")[0], p))
    return out


def cell_components(folder: Path) -> dict[str, Any]:
    """The cell's ratio, each part's per-seed Δ (endpoint) and the interaction, paired on the seeds all four share."""
    cell = read_cell(folder)
    res = read_json_object(folder / "results.json")
    seeds = [res["variants"][v]["paired_seeds"] for _, v in PARTS]
    if any(s != seeds[0] for s in seeds):
        raise ValueError(f"{folder / 'results.json'}: the variants were paired on different seeds")
    d = {part: cell["paired"][v]["endpoint"] for part, v in PARTS}
    inter = [both - oa - ma for both, oa, ma in zip(d["OA+MA"], d["OA"], d["MA"])]
    return {"ratio": cell["ratio"], "seeds": seeds[0], "parts": {p: mean_ci(x) for p, x in d.items()},
            "interaction": mean_ci(inter), "interaction_per_seed": inter,
            "ma_minus_both": mean_ci([ma - both for ma, both in zip(d["MA"], d["OA+MA"])])}


def collect(studies: Path) -> dict[str, Any]:
    cells = []
    for kind, setting, folder in cell_folders(studies):
        cells.append({"kind": kind, "setting": setting, "cell": folder.name,
                      "source": str(folder.relative_to(studies)), **cell_components(folder)})
    for c, kept in zip(cells, holm([c["interaction"].p for c in cells], ALPHA)):
        c["holm"] = kept
    changes = []
    for setting in dict.fromkeys(c["setting"] for c in cells if c["kind"] == "sweep"):
        mine = sorted((c for c in cells if c["kind"] == "sweep" and c["setting"] == setting),
                      key=lambda c: c["ratio"].mean)
        low, high = mine[0], mine[-1]
        changes.append({"setting": setting, "from": low["cell"], "to": high["cell"],
                        "ratios": [low["ratio"].mean, high["ratio"].mean],
                        "change": {p: welch_diff(high["parts"][p], low["parts"][p]) for p, _ in PARTS}
                        | {"interaction": welch_diff(high["interaction"], low["interaction"])}})
    return {"cells": cells, "changes": changes}


def _e(e: Estimate) -> str:
    text = f"{e.mean:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]" if math.isfinite(e.half_width) else f"{e.mean:+.3f} [n/a]"
    return f"**{text}**" if e.significant else text


def render(c: dict[str, Any]) -> str:
    cells = c["cells"]
    kept = sum(x["holm"] for x in cells)
    out = ["# OA and MA apart and together", "",
           "Written by `studies/tools/components.py` from the committed cells (numbers in "
           "[components.json](components.json)); do not edit by hand.", "",
           ("Per cell, held-out sampled success at the endpoint (mean of the last 3 evaluations up to H = 30), each "
            "accounting − row+native paired by seed, mean [95% CI]: OA = OA+native, MA = row+MA. **Interaction** = "
            "(OA+MA − row+native) − (OA − row+native) − (MA − row+native) per seed: what OA+MA gives beyond its two "
            "parts added (0 = additive). **MA − OA+MA** = MA alone against both, paired by seed: which of the two to "
            "switch on. **Bold** = the CI excludes 0; ✱ = the interaction survives Holm across "
            f"all {len(cells)} cells (family-wise {ALPHA:.0%}); {kept} do. Ratio = row+native's K fail / K success."), "",
           "## Per cell", "",
           "| cell | source | ratio | Δ OA | Δ MA | Δ OA+MA | interaction | Holm | MA − OA+MA |",
           "|---|---|---|---|---|---|---|---|---|"]
    for x in cells:
        out.append(f"| {x['cell']} | [{x['kind']}](../{x['source']}/report.md) | {x['ratio'].mean:.2f} | "
                   + " | ".join(_e(x["parts"][p]) for p, _ in PARTS)
                   + f" | {_e(x['interaction'])} | {'✱' if x['holm'] else ''} | {_e(x['ma_minus_both'])} |")
    out += ["", "## From the lowest ratio to the highest, per swept setting", "",
            ("The change of each Δ from the setting's lowest-ratio cell to its highest: Δ(high) − Δ(low), Welch's "
             "difference of two independent cells, mean [95% CI]. **Bold** = the CI excludes 0."), "",
            "| setting | ratios | OA | MA | OA+MA | interaction |", "|---|---|---|---|---|---|"]
    for ch in c["changes"]:
        out.append(f"| {ch['setting']} | {ch['ratios'][0]:.2f} → {ch['ratios'][1]:.2f} | "
                   + " | ".join(_e(ch["change"][p]) for p in ("OA", "MA", "OA+MA", "interaction")) + " |")
    out += ["", "## Reproduce", "", "```", ".venv/bin/python studies/tools/components.py", "```", "",
            "`tests/test_study_components.py` checks that this page and components.json regenerate byte for byte.", ""]
    return "\n".join(out)


def to_json(c: dict[str, Any]) -> dict[str, Any]:
    return {"generated_by": "studies/tools/components.py", "alpha": ALPHA,
            "cells": [{"cell": x["cell"], "setting": x["setting"], "kind": x["kind"], "source": x["source"],
                       "seeds": x["seeds"], "ratio": x["ratio"].to_dict(),
                       "parts": {p: e.to_dict() for p, e in x["parts"].items()},
                       "interaction": x["interaction"].to_dict(), "interaction_per_seed": x["interaction_per_seed"],
                       "ma_minus_both": x["ma_minus_both"].to_dict(),
                       "holm": x["holm"]} for x in c["cells"]],
            "changes": [{**{k: ch[k] for k in ("setting", "from", "to", "ratios")},
                         "change": {p: e.to_dict() for p, e in ch["change"].items()}} for ch in c["changes"]]}


def main(argv: list[str]) -> int:
    return page_main(argv, "components.py", __doc__.split("\n\n")[0], "dose-response", "components", collect, render, to_json)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
