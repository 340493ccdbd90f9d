"""The LM test's pre-registered analysis (studies/dose-response/lm-test/PREREGISTRATION.md), applied as written.

Run by hand once a batch brings the paired seeds to 12 (then 16, 20, 24 if the stopping rule asks for them):

    .venv/bin/python studies/tools/lm_test.py

It reads only committed evidence: the runs of every ``lm-test/batches/seeds-A-B/`` (each run's ``config.json``,
``summary.json`` and ``metrics.jsonl.gz``; a run found in several batches is read from the newest) and the
sweep's lines (``sweep/dose_response.json``). It assembles them, in a temporary folder, into the ``oma compare``
folder of the newest batch's ``compare.json``, then writes into ``lm-test/``:

* ``report.md``, its PNGs and ``results.json``: ``oma report --metric greedy --coupling metrics`` of the runs
  (what ``studies/results`` reads), with ``compare.json`` beside them;
* ``analysis.md`` and ``analysis.json``: the plan's analysis.
  - **Primary**: OA+MA − row+native in the greedy endpoint, paired by seed, mean and 95% Student-t CI.
  - **Stopping rule**: with fewer than 24 seeds, a primary half-width above 0.03 asks for the next 4 seeds; the
    rule reads the half-width only.
  - **Secondary**, Holm at family-wise 5% over five: row+MA in the greedy endpoint; OA+MA and row+MA in the
    sampled endpoint; OA+MA and row+MA in nAUC (greedy, the primary's success; the sampled nAUC is shown beside,
    untested).
  - **Against the prediction**: the line of ``stay-gigpo`` (:func:`oma.experiments.dose_response.predict` at the
    pre-registered ratio 2.35) for OA+MA and MA alone, endpoint and nAUC: *consistent* when the LM's 95% CI
    overlaps the line's, *below* / *above* when it lies entirely below / above it; the signs of the means too.
    The line is evaluated at row+native's own measured ratio as well when that lies outside [2.0, 2.7].
  - The other kinds' GiGPO lines at 2.35, recorded not tested, beside the LM.
  - Added after the plan (issue #67), marked so on the page: the direct test of agreement, LM Δ − line Δ with
    Welch's CI (:func:`oma.experiments.stats.welch_diff`, the line on n − 2 degrees of freedom), at 2.35 and at the
    measured ratio; and the primary's power as planned (the plan's sd, 0.043) and as observed (the test's own sd).
* ``prediction.png``: the stay-gigpo line with its 95% band, its cells, and the LM's Δs at their measured ratio.

With fewer than 12 paired seeds it stops with one line and writes nothing: the plan shows no difference before
seeds 0–11 are in.
"""

# No `from __future__ import annotations`: the tests load this script without registering it in sys.modules.
import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from oma.experiments.dose_response import Fit, load_fits, predict
from oma.experiments.report import BASELINE, analyse, write_report
from oma.experiments.stats import Estimate, holm, t_quantile, welch_diff
from oma.experiments.sweep import detectable, estimate, power
from oma.files import atomic_write_text, read_json_object

STUDY = Path(__file__).resolve().parents[2] / "studies" / "dose-response"
LINE = "stay-gigpo"
"""The kind of failure household's failures are (loops), GiGPO: the line the prediction was read from."""
OTHER_LINES = ("reset-gigpo", "trap-gigpo")
PREDICTED_AT = 2.35
"""Household's expansion ratio at cap 50 in the pilot (not the test's seeds)."""
RATIO_BAND = (2.0, 2.7)
FIRST_SEEDS = 12
SEED_STEP = 4
MAX_SEEDS = 24
HALF_WIDTH_MAX = 0.03
ALPHA = 0.05
COMPONENTS = (("OA+MA", "OA+MA"), ("MA", "row+MA"))
"""(the line's component, the variant that measures it against row+native): MA alone is row+MA."""
LABELS = {"OA+MA": "OA+MA", "MA": "MA alone"}
PLAN_SD = 0.043
"""The paired sd the plan's power came from (the cap-20 study of the same job, one evaluation, 10 seeds)."""
POWER_AT = 0.03
"""A 3-point difference: the size the power is stated for, as planned and as observed."""
MEASURES = (("endpoint", "endpoint", "diff_endpoint"), ("nAUC", "nauc", "diff_nauc"))
"""(the line's measure, its key in a report's per-variant figures, the key of its paired difference)."""
SECONDARY = (("row+MA", "greedy", "endpoint"), ("OA+MA", "sampled", "endpoint"), ("row+MA", "sampled", "endpoint"),
             ("OA+MA", "greedy", "nAUC"), ("row+MA", "greedy", "nAUC"))
"""The five secondary differences, (variant, success, measure), Holm across them."""


class AnalysisError(ValueError):
    """The batches cannot be analysed (missing, damaged, or too few seeds); the message says why in one line."""


# ------------------------------------------------------------------------------------------------
# The runs


def newest_compare(batches: Path) -> dict:
    """The compare.json of the batch with the most seeds: the invocation every earlier one is a prefix of."""
    docs = [read_json_object(p) for p in sorted(batches.glob("seeds-*/compare.json"))]
    if not docs:
        raise AnalysisError(f"{batches}: no batch (seeds-A-B/compare.json)")
    return max(docs, key=lambda d: len(d["seeds"]))


def assemble(batches: Path, folder: Path) -> dict:
    """Link every run of the newest compare.json into ``folder`` as ``oma compare`` lays them out; return it."""
    doc = newest_compare(batches)
    for v in (v["name"] for v in doc["variants"]):
        for k in doc["seeds"]:
            found = sorted(batches.glob(f"seeds-*/{v}/seed-{k}/summary.json"))
            if found:  # the newest batch holding it (by the batch's last seed)
                src = max(found, key=lambda p: int(p.parts[-4].rsplit("-", 1)[1])).parent
                (folder / v).mkdir(parents=True, exist_ok=True)
                os.symlink(src.resolve(), folder / v / f"seed-{k}")
    atomic_write_text(folder / "compare.json", json.dumps(doc, indent=2))
    return doc


# ------------------------------------------------------------------------------------------------
# The analysis


def verdict(lm: Estimate, line: Estimate) -> str:
    """``consistent`` when the two 95% CIs overlap, else ``below`` or ``above`` (the LM's CI against the line's)."""
    if lm.hi < line.lo:
        return "below"
    if lm.lo > line.hi:
        return "above"
    return "consistent"


def sign(x: float) -> str:
    return "+" if x > 0 else "−" if x < 0 else "0"


def stopping(primary: Estimate) -> dict[str, Any]:
    """The plan's stopping rule on the primary's half-width (never its mean)."""
    wide = not math.isfinite(primary.half_width) or primary.half_width > HALF_WIDTH_MAX
    more = wide and primary.n < MAX_SEEDS
    return {"n_seeds": primary.n, "half_width": primary.half_width, "threshold": HALF_WIDTH_MAX,
            "add_seeds": list(range(primary.n, primary.n + SEED_STEP)) if more else [],
            "final": not more}


def against_lines(diffs: dict[str, dict[str, dict[str, Estimate]]], fits: dict[str, dict[str, dict[str, Fit]]],
                  ratios: list[float]) -> list[dict[str, Any]]:
    """Each LM Δ (component × success × measure) against the stay-gigpo line at each ratio."""
    out = []
    for component, variant in COMPONENTS:
        for success, by in diffs[variant].items():
            for measure, lm in by.items():
                for r in ratios:
                    line = predict(fits[LINE][component][measure], r)
                    out.append({"component": component, "variant": variant, "success": success, "measure": measure,
                                "ratio": r, "lm": lm, "line": line, "verdict": verdict(lm, line),
                                "same_sign": sign(lm.mean) == sign(line.mean)})
    return out


def analysis(greedy: dict[str, Any], sampled: dict[str, Any], fits: dict[str, dict[str, dict[str, Fit]]]) -> dict:
    """The plan's analysis of the two ``oma report`` analyses (greedy and sampled success) of the same runs."""
    by = {"greedy": greedy["per_variant"], "sampled": sampled["per_variant"]}
    diffs = {v: {s: {m: by[s][v][key] for m, _, key in MEASURES} for s in by} for _, v in COMPONENTS}
    primary = diffs["OA+MA"]["greedy"]["endpoint"]
    if primary.n < FIRST_SEEDS:
        raise AnalysisError(f"{primary.n} paired seeds; the plan analyses none before seeds 0-{FIRST_SEEDS - 1}")
    tests = [diffs[v][s][m] for v, s, m in SECONDARY]
    kept = holm([e.p for e in tests], ALPHA)
    ratio = by["greedy"][BASELINE]["coupling"]["expansion_ratio"]
    ratios = [PREDICTED_AT] + ([ratio.mean] if not RATIO_BAND[0] <= ratio.mean <= RATIO_BAND[1] else [])
    others = [{"setting": s, "component": c, "measure": m, "line": predict(fits[s][c][m], PREDICTED_AT),
               "swept": [fits[s][c][m].x_min, fits[s][c][m].x_max]}
              for s in OTHER_LINES for c, _ in COMPONENTS for m, _, _ in MEASURES]
    agreement = [{"component": c, "variant": v, "success": succ, "measure": m, "ratio": r,
                  "diff": welch_diff(diffs[v][succ][m], predict(fits[LINE][c][m], r), df_b=fits[LINE][c][m].df)}
                 for c, v in COMPONENTS for succ in ("greedy", "sampled") for m, _, _ in MEASURES
                 for r in (PREDICTED_AT, ratio.mean)]
    planned = Estimate(0.0, t_quantile(0.975, primary.n - 1) * PLAN_SD / math.sqrt(primary.n), primary.n)
    return {"primary": primary, "stopping": stopping(primary),
            "post_hoc": {"agreement": agreement,
                         "power": {name: {"sd": e.half_width / t_quantile(0.975, e.n - 1) * math.sqrt(e.n),
                                          "detectable_80": detectable(e), "power_at": POWER_AT,
                                          "power": power(POWER_AT, e)}
                                   for name, e in (("planned", planned), ("observed", primary))}},
            "secondary": [{"variant": v, "success": s, "measure": m, "diff": e, "holm": k}
                          for (v, s, m), e, k in zip(SECONDARY, tests, kept)],
            "sampled_nauc": {v: diffs[v]["sampled"]["nAUC"] for _, v in COMPONENTS},
            "ratio": ratio, "ratio_band": list(RATIO_BAND), "against": against_lines(diffs, fits, ratios),
            "others": others,
            "baseline_gain": {"greedy": greedy["baseline_gain"], "sampled": sampled["baseline_gain"]},
            "baseline": {s: {m: by[s][BASELINE][key] for m, key, _ in MEASURES} for s in by},
            "seeds": greedy["per_variant"][BASELINE]["seeds"], "missing": greedy["missing"],
            "endpoint_iterations": greedy["endpoint_iterations"],
            "eval_tasks": greedy["compare"]["config"].get("env", {}).get("eval_tasks")}


# ------------------------------------------------------------------------------------------------
# Writing


def _d(e: Estimate) -> str:
    return f"{e.mean:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers), *["| " + " | ".join(r) + " |" for r in rows],
            ""]


def render(a: dict[str, Any]) -> str:
    p, stop, r = a["primary"], a["stopping"], a["ratio"]
    out = ["# The LM test at a 50-step cap: the pre-registered analysis", "",
           ("Written by `studies/tools/lm_test.py` from the committed batches and the sweep's lines, as "
            "[PREREGISTRATION.md](PREREGISTRATION.md) says; do not edit by hand. The runs' own report (curves, "
            "endpoints, coupling) is [report.md](report.md)."), "",
           f"Seeds: {', '.join(map(str, a['seeds']))} ({p.n} paired); every Δ is a paired difference to row+native, "
           "mean [95% Student-t CI].", ""]
    if a["missing"]:
        out += ["Runs missing:", "", *[f"* {m}" for m in a["missing"]], ""]
    out += ["## Primary", "",
            (f"OA+MA − row+native, greedy endpoint (iterations "
             f"{'; '.join(', '.join(f'{i:g}' for i in its) for its in a['endpoint_iterations'])}; "
             f"{a['eval_tasks']} held-out tasks): **{_d(p)}**, p = {p.p:.3g}."), "",
            (f"Stopping rule: half-width {p.half_width:.4f} against {HALF_WIDTH_MAX}; "
             + ("final." if stop["final"] and p.half_width <= HALF_WIDTH_MAX else
                "final (24 seeds reached)." if stop["final"] else
                f"seeds {stop['add_seeds'][0]}–{stop['add_seeds'][-1]} are to be added before the test reports.")), ""]
    g = a["baseline_gain"]
    out += [(f"Row+native's own gain over its warm start: {_d(g['greedy'])} greedy, {_d(g['sampled'])} sampled; its "
             f"endpoint {_d(a['baseline']['greedy']['endpoint'])} greedy."), ""]
    out += ["## Secondary (Holm over five, family-wise 5%)", ""]
    rows = [[v, s, m, _d(x["diff"]), f"{x['diff'].p:.3g}", "yes" if x["holm"] else "no"]
            for x in a["secondary"] for v, s, m in [(x["variant"], x["success"], x["measure"])]]
    out += _table(["variant − row+native", "success", "measure", "Δ [95% CI]", "p", "survives Holm"], rows)
    out += ["Not tested, shown beside: nAUC in sampled success, " + "; ".join(
        f"{v} {_d(e)}" for v, e in a["sampled_nauc"].items()) + ".", ""]
    out += ["## Against the prediction", "",
            (f"Row+native's measured expansion ratio: {r.mean:.2f} [{r.lo:.2f}, {r.hi:.2f}] (mean over iterations, "
             f"then seeds), the band the plan named {a['ratio_band'][0]}–{a['ratio_band'][1]}"
             + (": inside it." if a["ratio_band"][0] <= r.mean <= a["ratio_band"][1] else
                ": outside it, so the line is evaluated at it too.")), "",
            (f"The line is `{LINE}`'s (loops, GiGPO) in [the sweep](../sweep/README.md), the tabular policy's sampled "
             "success; consistent = the two 95% CIs overlap."), ""]
    rows = [[LABELS[x["component"]], x["success"], x["measure"], f"{x['ratio']:.2f}", _d(x["line"]), _d(x["lm"]),
             f"**{x['verdict']}**" if x["success"] == "greedy" and x["measure"] == "endpoint" else x["verdict"],
             "yes" if x["same_sign"] else "no"] for x in a["against"]]
    out += _table(["component", "LM success", "measure", "at ratio", "line Δ [95% CI]", "LM Δ [95% CI]", "verdict",
                   "same sign"], rows)
    out += ["The other kinds' GiGPO lines at 2.35, written down in the plan and not tested:", ""]
    out += _table(["line", "component", "measure", "swept ratios", "line Δ [95% CI]"],
                  [[x["setting"], LABELS[x["component"]], x["measure"], f"{x['swept'][0]:.2f}–{x['swept'][1]:.2f}",
                    _d(x["line"])] for x in a["others"]])
    out += ["![The stay-gigpo lines, their cells and the LM's Δs](prediction.png)", ""]
    ph = a["post_hoc"]
    out += ["## Added after the plan: agreement tested directly, and power", "",
            ("Not in the pre-registration (issue #67 asked for them): two overlapping CIs are not a test of agreement, so "
             "here the LM's Δ minus the line's Δ, Welch's 95% CI (the line on n − 2 degrees of freedom); *agree* = "
             "the CI includes 0. The line is in the tabular policy's sampled success, the LM's Δ in the success named."),
            ""]
    out += _table(["component", "LM success", "measure", "at ratio", "LM − line [95% CI]", "p", "agree"],
                  [[LABELS[x["component"]], x["success"], x["measure"], f"{x['ratio']:.2f}", _d(x["diff"]),
                    f"{x['diff'].p:.3g}", "no" if x["diff"].significant else "yes"] for x in ph["agreement"]])
    pw = ph["power"]
    out += [(f"Power of the primary at {pw['planned']['power_at']:.2f} (two-sided 5%, {p.n} seeds, the shifted-t "
             "approximation of the reports' detectable Δ): **as planned** (the plan's paired sd "
             f"{pw['planned']['sd']:.3f}) {pw['planned']['power']:.2f}, a Δ of {pw['planned']['detectable_80']:.3f} "
             f"found 4 times in 5; **as observed** (this test's paired sd {pw['observed']['sd']:.3f}) "
             f"{pw['observed']['power']:.2f}, {pw['observed']['detectable_80']:.3f} found 4 times in 5."), ""]
    return "\n".join(out)


def to_json(a: dict[str, Any]) -> dict[str, Any]:
    def conv(x):
        if isinstance(x, Estimate):
            return x.to_dict()
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list):
            return [conv(v) for v in x]
        return None if isinstance(x, float) and not math.isfinite(x) else x

    return {"plan": "PREREGISTRATION.md", "line": LINE, "predicted_at": PREDICTED_AT, **conv(a)}


def plot(a: dict[str, Any], dose: dict, fits: dict[str, dict[str, dict[str, Fit]]], path: Path) -> None:
    """Per component × measure: the stay-gigpo line from ratio 1 to 3 (or past the LM's) with its 95% band (dashed outside the swept ratios),
    its cells' Δs, and the LM's greedy (filled) and sampled (hollow) Δ at its measured ratio."""
    from oma.diagnostics.plots import figure, save_png

    r = a["ratio"]
    lm = {(x["variant"], x["success"], x["measure"]): x["lm"] for x in a["against"]}
    fig = figure(11.0, 7.5)
    for i, (measure, _, _) in enumerate(MEASURES):
        for j, (component, variant) in enumerate(COMPONENTS):
            ax = fig.add_subplot(2, 2, i * 2 + j + 1)
            fit = fits[LINE][component][measure]
            xs = np.linspace(1.0, max(3.0, r.hi + 0.2), 81)
            band = [predict(fit, float(x)) for x in xs]
            ax.fill_between(xs, [b.lo for b in band], [b.hi for b in band], color="#1f4e9c", alpha=0.15, lw=0)
            inside = (xs >= fit.x_min) & (xs <= fit.x_max)
            ax.plot(xs[inside], [b.mean for b, k in zip(band, inside) if k], "-", color="#1f4e9c",
                    label=f"{LINE} line (95% band)")
            ax.plot(xs, [b.mean for b in band], ":", color="#1f4e9c", lw=1.0)
            for c in (c for c in dose["cells"].values() if c["setting"] == LINE):
                d, cr = estimate(c["diffs"][component][measure]), estimate(c["ratio"])
                ax.errorbar(cr.mean, d.mean, xerr=cr.half_width, yerr=d.half_width, fmt="s", color="#1f4e9c",
                            capsize=3, mfc="white", label="its cells" if c["cap"] == 12 else None)
            for success, mfc, dx in (("greedy", "#c0392b", 0.0), ("sampled", "white", 0.04)):
                d = lm[(variant, success, measure)]
                ax.errorbar(r.mean + dx, d.mean, xerr=r.half_width, yerr=d.half_width, fmt="o", color="#c0392b",
                            mfc=mfc, capsize=3, label=f"LM, {success}")
            ax.axvline(PREDICTED_AT, color="#999999", lw=0.8, ls="--")
            ax.axhline(0.0, color="#999999", lw=0.8)
            name = LABELS[component] + (f" ({variant})" if variant != component else "")
            ax.set_title(f"{name} − row+native: Δ {measure}", fontsize=9)
            if i == 1:
                ax.set_xlabel("expansion ratio (row+native)")
            if i == j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"The LM test against the {LINE} line (dotted: extrapolated; dashed: the pre-registered ratio)",
                 fontsize=10)
    save_png(fig, path)


def write(study: Path, out: Path) -> dict[str, Any]:
    """Analyse ``study``'s batches against its sweep; write the report, the analysis and the plot into ``out``."""
    sweep = study / "sweep" / "dose_response.json"
    dose, fits = read_json_object(sweep), load_fits(sweep)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "runs"
        doc = assemble(study / "lm-test" / "batches", folder)
        greedy = analyse(folder, metric="greedy", coupling="metrics")
        a = analysis(greedy, analyse(folder, metric="sampled", coupling="metrics"), fits)
        write_report(folder, out / "report.md", metric="greedy", coupling="metrics")
    atomic_write_text(out / "compare.json", json.dumps(doc, indent=2))
    atomic_write_text(out / "analysis.json", json.dumps(to_json(a), indent=2) + "\n")
    atomic_write_text(out / "analysis.md", render(a))
    plot(a, dose, fits, out / "prediction.png")
    return a


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="lm_test.py", description=__doc__.split("\n")[0])
    p.add_argument("--study", type=Path, default=STUDY, help="the dose-response study folder (default: the repo's)")
    p.add_argument("--out", type=Path, default=None, help="where to write (default STUDY/lm-test)")
    args = p.parse_args(argv)
    out = args.out or args.study / "lm-test"
    try:
        a = write(args.study, out)
    except (AnalysisError, OSError, KeyError, ValueError) as e:
        print(f"lm_test.py: {e}", file=sys.stderr)
        return 1
    print(f"lm_test.py: {a['primary'].n} seeds; wrote {out / 'analysis.md'} and {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
