"""Every effect the studies measured beside the paper's, with Holm across them: writes
studies/results/README.md (the page) and studies/results/results.json (every number on it).

Run by hand after a study that feeds the page reports (the test suite regenerates the page from the
committed evidence and compares it byte for byte):

    .venv/bin/python studies/tools/results_table.py

It reads only committed evidence under studies/ (``--studies`` points elsewhere, for the tests):

* the tabular coupling map: ``tabular-coupling-map/map/map.json`` (which settings) and each setting's
  ``oma compare`` folder (per-seed endpoints and curves in its results.json);
* the LM lane at training cap 20: the runs of ``lm-accounting/evidence/2026-12-05-accounting-75``;
* the longer preset: the runs of ``longer-preset/evidence/2026-12-06-grpo-420-ema``;
* the LM test at the ALFWorld-like cap 50: ``dose-response/lm-test/`` when it has reported;
* the dose–response slopes: ``dose-response/sweep/dose_response.json``;
* the 2026-11-30 reports, as history: ``compare-2026-11-30/*/``.

Every Δ, CI and p-value is recomputed from per-seed numbers with :mod:`oma.experiments.stats`; the
baseline's gain over its warm start with :func:`oma.experiments.report.gain`. A missing or damaged
source stops the script with one line naming the file.

It also writes the README's results table (between the markers :data:`README_START` and :data:`README_END`):
every OA+MA row of the page, named as docs/glossary.md names the settings, and the paper's; the test suite checks
that the README's block equals what this script writes.

``--add-baseline-gain`` instead writes ``baseline_gain`` into each 2026-11-30 report's results.json,
which predate the field (:func:`add_baseline_gain`).
"""

# No `from __future__ import annotations`: the tests load this script without registering it in sys.modules, where
# dataclasses would look up string annotations.
import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oma.experiments.report import BASELINE, RunResult, gain, load_run
from oma.experiments.stats import Estimate, holm, mean_ci
from oma.experiments.sweep import estimate, read_cell
from oma.files import atomic_write_text, read_json_object

ROOT = Path(__file__).resolve().parents[2]
OMA = "OA+MA"
ALPHA = 0.05
"""Family-wise level of the Holm family of the tested differences (the slopes' is the sweep's own, also 5%)."""

MAP = "tabular-coupling-map/map"
LM_CAP20 = "lm-accounting/evidence/2026-12-05-accounting-75"
LONGER = "longer-preset/evidence/2026-12-06-grpo-420-ema"
LM_CAP50 = "dose-response/lm-test"
DOSE = "dose-response/sweep/dose_response.json"
HISTORY = "compare-2026-11-30"
COMPONENTS = (("OA+MA", "OA+MA"), ("OA alone", "OA+native"), ("MA alone", "row+MA"))
"""(what the row calls the compared accounting, the variant that measures it against row+native)."""

PAPER = (
    ("ALFWorld", "success", "+0.070 to +0.094", "failures expand much more than successes", "+"),
    ("WebShop", "success", "mixed", "", "mixed"),
    ("WebShop-SOL", "nAUC", "+0.112 (0.399 → 0.511)", "", "+"),
)
"""The paper's numbers (arXiv 2611.16816), OA+MA against its baseline, and their sign: all we have of them (no CI,
seeds or p)."""


NAMES = {"advance": "no-expansion control", "end": "early ends", "end-progress": "early ends, partial credit",
         "stay": "loops", "stay-progress": "loops, partial credit", "reset": "resets", "reset-gigpo": "resets",
         "reset-gspo": "resets"}
"""Each map setting's one name (docs/glossary.md#the-failure-kinds); the estimator is said beside it."""
ESTIMATOR = {"reset-gigpo": "GiGPO", "reset-gspo": "GSPO-token"}
"""The map's settings run GRPO unless named here."""
README = ROOT / "README.md"
README_START = "<!-- results table: written by studies/tools/results_table.py; do not edit by hand -->"
README_END = "<!-- end of results table -->"


class SourceError(ValueError):
    """A source file is missing or damaged; the message names it."""


def _read(path: Path) -> dict:
    """A source JSON object; SourceError naming the file when it is missing or damaged."""
    try:
        return read_json_object(path)
    except FileNotFoundError:
        raise SourceError(f"{path}: missing") from None
    except ValueError as e:
        raise SourceError(str(e)) from None


def _with_file(path: Path, read: Callable[[], Any]) -> Any:
    """``read()``, with what a file without the fields expected raises (KeyError, TypeError, …) turned into one line
    naming ``path``."""
    try:
        return read()
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise SourceError(f"{path}: damaged (not the fields expected: {type(e).__name__} {e})") from None
    except FileNotFoundError as e:
        raise SourceError(f"{e.filename}: missing") from None
    except ValueError as e:
        raise SourceError(str(e)) from None


# ------------------------------------------------------------------------------------------------
# The baseline's gain over its warm start


def stored_run(run: dict, folder: Path) -> RunResult:
    """A run of an ``oma compare`` results.json as the RunResult :func:`gain` reads (curve and endpoint)."""
    return RunResult(run["variant"], run["seed"], folder / run["variant"] / f"seed-{run['seed']}",
                     run["eval_iterations"], run["eval_success"], run["endpoint"], run["endpoint_iterations"],
                     run["nauc"], run["env_steps"])


def gain_estimate(runs: list[RunResult], source: Path) -> Estimate:
    """Mean and CI over seeds of :func:`gain` (endpoint − success at iteration 0): what ``oma compare`` records as
    ``baseline_gain``. Every committed run was evaluated at 0, so a NaN gain means a damaged source."""
    gains = [gain(r) for r in runs]
    if not gains or not all(math.isfinite(g) for g in gains):
        raise SourceError(f"{source}: a {BASELINE} run has no evaluation at iteration 0")
    return mean_ci(gains)


def baseline_gain(res: dict, results_json: Path) -> Estimate:
    """The report's ``baseline_gain``, or, for a report that predates the field, computed from its runs' curves."""
    if res.get("baseline_gain") is not None:
        return estimate(res["baseline_gain"])
    return gain_estimate([stored_run(r, results_json.parent) for r in res["runs"] if r["variant"] == BASELINE],
                         results_json)


def add_baseline_gain(results_json: Path) -> Estimate:
    """Write ``baseline_gain`` (the mean and CI of :func:`gain` over the report's own row+native runs) into an
    ``oma compare`` results.json, where today's ``oma report`` puts it (after ``variants``, as
    :meth:`Estimate.to_dict`, ``json.dumps(indent=2)``); every other byte stays. Returns the estimate."""
    res = _read(results_json)
    g = _with_file(results_json, lambda: gain_estimate(
        [stored_run(r, results_json.parent) for r in res["runs"] if r["variant"] == BASELINE], results_json))
    out: dict[str, Any] = {}
    for key, value in res.items():
        if key != "baseline_gain":
            out[key] = value
        if key == "variants":
            out["baseline_gain"] = g.to_dict()
    atomic_write_text(results_json, json.dumps(out, indent=2))
    return g


# ------------------------------------------------------------------------------------------------
# Rows: one tested difference each


@dataclass
class Row:
    """One paired difference (compared − row+native, per seed) and what the page says beside it; its estimate is
    :func:`mean_ci` of the per-seed differences (what :func:`oma.experiments.stats.paired_diff` computes)."""

    block: str
    where: str
    label: str
    """Its short name in the sign pattern's paragraph."""
    measure: str
    compared: str
    study: str
    """Link to the study, relative to studies/results/."""
    source: str
    """The evidence it was computed from, relative to studies/."""
    differences: list[float]
    seeds: list[int]
    ratio: Estimate | None
    """row+native's expansion ratio (K fail / K success), mean over seeds."""
    gain: Estimate
    diff: Estimate = field(init=False)
    holm: bool = False

    def __post_init__(self) -> None:
        self.diff = mean_ci(self.differences)


def sign(d: Estimate, survives: bool) -> str:
    """The sign pattern's reading: + or − once the difference survives Holm, ``(CI only)`` when only its own CI
    excludes 0, otherwise not resolved."""
    if not d.significant:
        return "not resolved"
    s = "+" if d.mean > 0 else "−"
    return s if survives else f"{s} (CI only)"


def map_rows(studies: Path) -> list[Row]:
    """The coupling map: per setting, OA+MA, OA alone and MA alone against row+native on held-out sampled endpoint."""
    folder = studies / MAP
    names = list(_with_file(folder / "map.json", lambda: _read(folder / "map.json")["settings"]))
    if not names:
        raise SourceError(f"{folder / 'map.json'}: damaged (no settings)")
    unknown = [name for name in names if name not in NAMES]
    if unknown:
        raise SourceError(f"{folder / 'map.json'}: setting {unknown[0]!r} has no name in NAMES (docs/glossary.md)")
    return [row for name in names
            for row in compare_rows(studies, f"{MAP}/{name}", "tabular",
                                    f"tabular, {NAMES[name]} (`{name}`), {ESTIMATOR.get(name, 'GRPO')}",
                                    f"tabular `{name}`", "../tabular-coupling-map/README.md", COMPONENTS)]


def run_folder_rows(studies: Path, evidence: str, where: str, label: str, study: str, horizon: int) -> list[Row]:
    """OA+MA − row+native on held-out success at iteration ``horizon`` (the pre-registered reading), greedy and
    sampled, from run folders ``evidence/<variant>/seed-K`` trained one by one."""
    folder = studies / evidence
    seeds = sorted(int(p.name.split("-")[1]) for p in (folder / BASELINE).glob("seed-*"))
    seeds = [k for k in seeds if (folder / OMA / f"seed-{k}").is_dir()]
    if not seeds:
        raise SourceError(f"{folder}: missing (no seed run under both {BASELINE}/ and {OMA}/)")

    def run(v: str, k: int, metric: str) -> RunResult:
        run_dir = folder / v / f"seed-{k}"
        _read(run_dir / "summary.json")  # a finished run's record: load_run only asks that it exist
        if not any((run_dir / name).is_file() for name in ("metrics.jsonl.gz", "metrics.jsonl")):
            raise SourceError(f"{run_dir / 'metrics.jsonl.gz'}: missing")  # load_run would read no evaluation
        got = _with_file(run_dir / "metrics.jsonl.gz", lambda: load_run(run_dir, v, k, horizon, metric, "metrics"))
        if isinstance(got, str):
            raise SourceError(f"{run_dir}: {got}")
        if horizon not in got.eval_iterations:
            raise SourceError(f"{run_dir / 'metrics.jsonl.gz'}: damaged (no {metric} evaluation at {horizon})")
        return got

    def at_horizon(r: RunResult) -> float:
        return r.eval_success[r.eval_iterations.index(horizon)]

    rows = []
    for metric in ("greedy", "sampled"):
        base = [run(BASELINE, k, metric) for k in seeds]
        oma = [run(OMA, k, metric) for k in seeds]
        rows.append(Row("lm", where, f"{label} ({metric})",
                        f"held-out {metric} success at iteration {horizon} (pre-registered)", OMA, study, evidence,
                        [at_horizon(o) - at_horizon(b) for o, b in zip(oma, base)], seeds,
                        mean_ci([r.coupling["expansion_ratio"] for r in base]), gain_estimate(base, folder / BASELINE)))
    return rows


def compare_rows(studies: Path, folder_name: str, block: str, where: str, label: str, study: str,
                 components: tuple[tuple[str, str], ...]) -> list[Row]:
    """The paired endpoint differences of one ``oma compare`` folder, per compared variant it holds."""
    folder = studies / folder_name
    path = folder / "results.json"

    def rows() -> list[Row]:
        cell = read_cell(folder)  # per-seed differences, row+native's ratio
        res = _read(path)
        g = baseline_gain(res, path)
        its = sorted({tuple(r["endpoint_iterations"]) for r in res["runs"]})
        measure = (f"held-out {res.get('metric', 'greedy')} success, mean of iterations "
                   + "; ".join(", ".join(f"{i:g}" for i in t) for t in its))
        return [Row(block, where, label, measure, compared, study, folder_name, cell["paired"][variant]["endpoint"],
                    res["variants"][variant]["paired_seeds"], cell["ratio"], g)
                for compared, variant in components if variant in cell["paired"]]

    return _with_file(path, rows)


def slope_rows(studies: Path) -> list[dict[str, Any]]:
    """The dose–response slopes, one per setting × component × metric the file holds, each with the sweep's own
    Holm decision across them (``slopes_holm_significant``: `oma dose-response` decides it, at 5% family-wise)."""
    path = studies / DOSE
    doc = _read(path)

    def rows() -> list[dict[str, Any]]:
        kept = set(doc["slopes_holm_significant"])
        out = [{"setting": s, "component": c, "metric": m, "slope": estimate(f["slope"]),
                "ratios": [f["fit"]["x_min"], f["fit"]["x_max"]], "points": f["fit"]["n"],
                "holm": f"{s}/{c}/{m}" in kept}
               for s, cs in doc["fits"].items() for c, ms in cs.items() for m, f in ms.items()]
        if not out:
            raise SourceError(f"{path}: damaged (no fits)")
        return out

    return _with_file(path, rows)


def mark_holm(rows: list[Row]) -> None:
    """Holm–Bonferroni at family-wise :data:`ALPHA` across ``rows``: each row's ``holm`` says whether it survives."""
    for row, kept in zip(rows, holm([r.diff.p for r in rows], ALPHA)):
        row.holm = kept


# ------------------------------------------------------------------------------------------------
# The page


def collect(studies: Path) -> dict[str, Any]:
    """Every row of the page, Holm applied across the tested differences (not the slopes, not the history)."""
    tested = [
        *run_folder_rows(studies, LM_CAP20, "LM lane, household default job (GiGPO), training cap 20, 75 iterations",
                         "LM default job, cap 20", "../lm-accounting/README.md", 75),
        *run_folder_rows(studies, LONGER, "LM lane, household longer preset (GRPO), 420 iterations",
                         "LM longer preset", "../longer-preset/README.md", 420),
    ]
    cap50 = studies / LM_CAP50 / "results.json"
    if cap50.exists():
        tested += compare_rows(studies, LM_CAP50, "lm", "LM lane, household at the ALFWorld-like cap 50",
                               "LM household, cap 50", "../dose-response/lm-test/analysis.md", COMPONENTS)
    tested += map_rows(studies)
    mark_holm(tested)
    history = []
    for folder in sorted((studies / HISTORY).iterdir()) if (studies / HISTORY).is_dir() else []:
        if folder.is_dir():
            history += compare_rows(studies, f"{HISTORY}/{folder.name}", "history", folder.name, folder.name,
                                    f"../{HISTORY}/{folder.name}/report.md", COMPONENTS[:1])
    if not history:
        raise SourceError(f"{studies / HISTORY}: missing (no report folder)")
    return {"tested": tested, "cap50": cap50.exists(), "slopes": slope_rows(studies), "history": history}


def _n(x: float) -> str:
    return f"{x:+.3f}"


def _ci(e: Estimate | None, signed: bool = True) -> str:
    if e is None:
        return "n/a"
    f = _n if signed else (lambda x: f"{x:.3f}")
    return f"{f(e.mean)} [{f(e.lo)}, {f(e.hi)}]" if math.isfinite(e.half_width) else f"{f(e.mean)} [n/a]"


def _p(p: float) -> str:
    return "n/a" if not math.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


def _where(r: Row) -> str:
    return f"[{r.where}]({r.study})"


def slope_signs(slopes: list[dict[str, Any]], metric: str) -> str:
    """How many settings' OA+MA slopes in ``metric`` are positive, negative or not resolved (Holm across the slopes)."""
    own = [r for r in slopes if r["component"] == OMA and r["metric"] == metric]
    up = sum(r["holm"] and r["slope"].mean > 0 for r in own)
    down = sum(r["holm"] and r["slope"].mean < 0 for r in own)
    return f"+ in {up}, − in {down}, not resolved in {len(own) - up - down} of {len(own)}"


def sign_pattern(tested: list[Row], cap50: bool, slopes: list[dict[str, Any]]) -> list[str]:
    """The paragraph that sets our OA+MA rows' signs beside the paper's, ordered by how much failures expand, and
    the sentence that says whether OA+MA's Δ grows with the ratio within a kind of failure."""
    ours = sorted((r for r in tested if r.compared == OMA and r.ratio is not None), key=lambda r: r.ratio.mean)
    listed = "; ".join(f"{r.label}: ratio {r.ratio.mean:.2f}, {sign(r.diff, r.holm)}" for r in ours)
    expand = [r for r in ours if r.ratio.mean > 1]
    count = {s: sum(sign(r.diff, r.holm).startswith(s) for r in expand) for s in ("+", "−", "not")}
    lm_open = all(sign(r.diff, r.holm) == "not resolved" for r in ours if r.block == "lm")
    return [
        ("**The paper**: OA+MA helps on ALFWorld (+0.070 to +0.094 in success), where failures expand much more than "
         "successes; mixed on WebShop; on WebShop-SOL nAUC rises from 0.399 to 0.511. Its pattern: positive where "
         "failures expand much more."),
        "",
        (f"**Ours** (OA+MA − row+native, in order of row+native's K fail / K success): {listed}."),
        "",
        (f"Where failures expand more than successes (ratio above 1), OA+MA is + in {count['+']}, "
         f"− in {count['−']} and not resolved in {count['not']} of {len(expand)} rows "
         "(+ and − include those resolved by their CI only). "
         + ("Every LM row is not resolved: the LM lane neither confirms nor refutes the paper's sign at these seeds. "
            if lm_open else "")
         + ("" if cap50 else "The LM test at the ALFWorld-like cap 50 has not reported.")).rstrip(),
        "",
        ("**Within one kind of failure** the paper's thesis says OA+MA's Δ should grow as failures expand more: a "
         "positive slope of Δ on the ratio. The OA+MA slopes of the dose–response settings (below, Holm across the "
         f"slopes): endpoint {slope_signs(slopes, 'endpoint')}; nAUC {slope_signs(slopes, 'nAUC')}."),
        "",
    ]


def render(c: dict[str, Any]) -> str:
    tested, slopes, history = c["tested"], c["slopes"], c["history"]
    m = len(tested)
    kept = sum(r.holm for r in tested)
    out = ["# Every measured effect beside the paper's", "",
           ("Written by `studies/tools/results_table.py` from the committed evidence of the studies it links "
            "(every number is in [results.json](results.json)); do not edit by hand."), "",
           ("Δ = compared accounting − verl-agent's row+native, paired by seed (same warm start, same tasks), mean "
            "[95% Student-t CI]; p = two-sided paired t test on the per-seed differences. **Holm**: ✱ = survives "
            f"Holm–Bonferroni across all {m} differences of the table below (family-wise {ALPHA:.0%}); "
            f"{kept} of {m} do. Baseline gain = row+native's endpoint (mean of the last 3 evaluations up to H) − its "
            "held-out success at iteration 0, mean [95% CI]: `oma compare`'s `baseline_gain`, the room a Δ is "
            "measured against (for the LM rows, whose Δ is read at the last iteration, the study gives the gain "
            "there too). Ratio = row+native's rows per failed over per successful trajectory (K fail / K "
            "success), mean over seeds."), "",
           "## The paper's effects and ours", "",
           ("The paper's rows come first: [arXiv 2611.16816](https://arxiv.org/abs/2611.16816), OA+MA against its baseline, all we have of its numbers "
            "(no CI, seeds or p, so they are not in the Holm family). Ours follow, LM lane first."), ""]
    rows = [[f"the paper: {bench}", measure, OMA, coupling or "n/a", "n/a", delta, "not given", "n/a", "", signed,
             "not given"] for bench, measure, delta, coupling, signed in PAPER]
    for r in tested:
        rows.append([_where(r), r.measure, r.compared, _ci(r.ratio, signed=False) if r.ratio else "n/a",
                     str(r.diff.n), f"{_n(r.diff.mean)}", f"[{_n(r.diff.lo)}, {_n(r.diff.hi)}]", _p(r.diff.p),
                     "✱" if r.holm else "", sign(r.diff, r.holm), _ci(r.gain)])
    if not c["cap50"]:  # its row holds its place after the other LM rows, without a number
        rows.insert(len(PAPER) + sum(r.block == "lm" for r in tested),
                    ["[LM lane, household at the ALFWorld-like cap 50](../dose-response/README.md)",
                     "—", "OA+MA, MA alone", "", "", "not yet reported", "", "", "", "", ""])
    out += _table(["where", "measure", "compared", "ratio", "n seeds", "Δ", "95% CI", "p", "Holm", "sign",
                   "baseline gain"], rows)
    if not c["cap50"]:
        out += [("The cap-50 LM test (issue #57) is running: its prediction, seeds and analysis were committed before "
                 "its first run ([its pre-registration](../dose-response/lm-test/PREREGISTRATION.md)); no number is "
                 "shown until its `dose-response/lm-test/results.json` is committed."), ""]

    out += ["## The sign pattern", ""]
    out += sign_pattern(tested, c["cap50"], slopes)

    out += ["## Dose–response slopes", "",
            ("From [dose_response.json](../dose-response/sweep/dose_response.json) "
             "([the sweep](../dose-response/sweep/README.md)): per setting, component and metric, the OLS slope of "
             "the per-seed paired differences on the cells' measured expansion ratio, per unit of ratio, "
             f"[95% CI]. ✱ = survives Holm across these {len(slopes)} slopes (a family of their own, family-wise "
             f"{ALPHA:.0%}); {sum(s['holm'] for s in slopes)} do."), ""]
    out += _table(["setting", "component", "metric", "ratios swept", "points", "slope", "p", "Holm"],
                  [[s["setting"], s["component"], s["metric"], f"{s['ratios'][0]:.2f}–{s['ratios'][1]:.2f}",
                    str(s["points"]), _ci(s["slope"]), _p(s["slope"].p), "✱" if s["holm"] else ""] for s in slopes])

    out += ["## History: the 2026-11-30 reports", "",
            ("Measured with the 2026-11-30 recipe (15 iterations), under which RL barely learned: see each baseline "
             "gain. Not in the Holm family above; each report corrects its own 6 comparisons "
             f"([the study](../{HISTORY}/README.md))."), ""]
    out += _table(["report", "measure", "ratio", "n seeds", "Δ OA+MA", "95% CI", "p", "baseline gain"],
                  [[_where(r), r.measure, _ci(r.ratio, signed=False), str(r.diff.n), _n(r.diff.mean),
                    f"[{_n(r.diff.lo)}, {_n(r.diff.hi)}]", _p(r.diff.p), _ci(r.gain)] for r in history])

    out += ["## Reproduce", "", "```", ".venv/bin/python studies/tools/results_table.py", "```", "",
            ("It reads only the committed evidence (the sources in results.json) and rewrites this page and "
             "results.json; `tests/test_study_results_table.py` checks that they regenerate byte for byte."), ""]
    return "\n".join(out)


def to_json(c: dict[str, Any]) -> dict[str, Any]:
    def est(e: Estimate | None) -> dict | None:
        return e.to_dict() if e is not None else None

    def row(r: Row) -> dict[str, Any]:
        d = {"where": r.where, "measure": r.measure, "compared": r.compared, "baseline": BASELINE,
             "source": r.source, "study": r.study, "seeds": r.seeds, "differences": r.differences,
             "diff": est(r.diff), "ratio": est(r.ratio), "baseline_gain": est(r.gain)}
        if r.block != "history":
            d |= {"holm": r.holm, "sign": sign(r.diff, r.holm)}
        return d

    return {"generated_by": "studies/tools/results_table.py",
            "paper": [dict(zip(("benchmark", "measure", "oma_minus_baseline", "coupling", "sign"), p)) for p in PAPER],
            "alpha": ALPHA, "family_size": len(c["tested"]), "rows": [row(r) for r in c["tested"]],
            "lm_cap50": "reported" if c["cap50"] else "not yet reported",
            "slopes": {"source": DOSE, "family_size": len(c["slopes"]),
                       "rows": [{**s, "slope": est(s["slope"])} for s in c["slopes"]]},
            "history": [row(r) for r in c["history"]]}


def readme_block(c: dict[str, Any]) -> str:
    """The README's results table: OA+MA − row+native in every setting the page tests (LM rows in greedy success,
    the success their plans named), then the paper's; and the count of signs, Holm across the page's family."""
    ours = [r for r in c["tested"] if r.compared == OMA and (r.block == "tabular" or "greedy" in r.measure)]
    rows = [[f"[{r.where.replace('LM lane, household', 'LM, household')}]({r.study.replace('../', 'studies/')})", r.measure.replace(" (pre-registered)", ""),
             str(r.diff.n), _ci(r.diff), "✱" if r.holm else ""] for r in ours]
    rows += [[f"the paper: {bench} (arXiv 2611.16816)", measure, "n/a", delta, "n/a"]
             for bench, measure, delta, _, _ in PAPER]
    tab = [r for r in ours if r.block == "tabular"]
    up = sum(r.holm and r.diff.mean > 0 for r in tab)
    down = sum(r.holm and r.diff.mean < 0 for r in tab)
    own = sum(r.diff.significant and not r.holm for r in tab)
    lm = [r for r in ours if r.block == "lm"]
    summary = (f"Tabular lane: OA+MA − row+native is + in {up} and − in {down} of its {len(tab)} settings (✱: survives "
               f"Holm across all {len(c['tested'])} differences of [the results page](studies/results/README.md))"
               + (f", + by its own 95% CI only in {own}" if own else "") + f". LM lane: "
               f"{sum(r.diff.significant for r in lm)} of its {len(lm)} differences has a 95% CI that excludes 0.")
    return "\n".join([README_START, "",
                      *_table(["where", "measure", "seeds", "OA+MA − row+native [95% CI]", "Holm"], rows),
                      summary, "", README_END])


def readme_with_block(text: str, block: str) -> str:
    """``text`` (the README) with the part between the markers replaced by ``block``; SourceError without them."""
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise SourceError(f"{README}: the results-table markers are missing")
    return text[:start] + block + text[end + len(README_END):]


def write(studies: Path, out: Path, readme: Path | None = None) -> None:
    c = collect(studies)
    atomic_write_text(out / "results.json", json.dumps(to_json(c), indent=2) + "\n")
    atomic_write_text(out / "README.md", render(c))
    if readme is not None:
        atomic_write_text(readme, readme_with_block(readme.read_text(encoding="utf-8"), readme_block(c)))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="results_table.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=Path, default=ROOT / "studies",
                   help="the studies folder to read (default: this repo's)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder to write README.md and results.json (default STUDIES/results)")
    p.add_argument("--add-baseline-gain", action="store_true",
                   help="write baseline_gain into each STUDIES/compare-2026-11-30/*/results.json instead")
    args = p.parse_args(argv)
    try:
        if args.add_baseline_gain:
            paths = sorted((args.studies / HISTORY).glob("*/results.json"))
            if not paths:
                raise SourceError(f"{args.studies / HISTORY}: missing (no report's results.json)")
            for path in paths:
                g = add_baseline_gain(path)
                print(f"{path}: baseline_gain {_ci(g)}")
            return 0
        out = args.out or args.studies / "results"
        write(args.studies, out, README if args.out is None and args.studies == ROOT / "studies" else None)
    except (SourceError, OSError) as e:
        print(f"results_table.py: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    print(f"results_table.py: wrote {out / 'README.md'} and {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
