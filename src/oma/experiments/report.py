"""``oma report DIR [--out FILE.md] [--horizon H] [--metric M] [--coupling audit|metrics]``: the report of an ``oma compare`` directory (docs/experiments.md#the-metrics).

Reads ``DIR/compare.json`` and every run's ``metrics.jsonl`` and (``--coupling audit``) ``batches/``; writes
``DIR/report.md`` (or FILE.md), PNGs beside it and ``results.json`` (every number of the report).

Per run (seed k of variant v), at the matched horizon H:

* the success curve: held-out success at the evaluation iterations ≤ H (iteration 0 = warm start),
  greedy (``eval_success``, the default) or sampled (``eval_sampled_success``: the stochastic
  policy RL trains; ``--metric sampled``, what the tabular lane reports);
* endpoint = mean of the last 3 evaluations ≤ H; nAUC = trapezoid area on [0, H] / H
  (:mod:`oma.experiments.stats`);
* env steps = Σ of the training rows (one row per agent step) over iterations 1..H;
* the expansion–outcome coupling of its own rollouts at iterations ≤ H, averaged over iterations (mean
  of the defined values): from :func:`oma.diagnostics.audit` of each dumped batch (``--coupling
  audit``, the default when the runs dumped batches), or from what the trainer logged in
  ``metrics.jsonl`` (``--coupling metrics``, the default after ``oma compare --no-dump``), which gives
  the rows per trajectory and the expansion ratio by the audit's definition (:func:`metrics_coupling`)
  but neither the within-group correlation nor the audit's masses.

Per variant: mean and 95% Student-t CI over seeds, and the paired difference to row+native
(same seed: same warm start, same task seeds); significant = its CI excludes 0. Across all the
paired differences of one report, Holm–Bonferroni at family-wise 5% says which survive the
multiplicity (a 2x2 report makes 6 comparisons: 1 − 0.95⁶ = 26% chance of some false positive).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oma.experiments.plan import read_compare_json
from oma.experiments.stats import (
    ENDPOINT_EVALS,
    Estimate,
    curve_to_horizon,
    endpoint,
    endpoint_iterations,
    holm,
    mean_ci,
    nauc,
    paired_diff,
)
from oma.experiments.variants import BASELINE, VARIANTS

COUPLING: tuple[tuple[str, str, str], ...] = (
    ("rows_per_traj_failure", "rows/traj, failures", "mean K_τ of failed trajectories"),
    ("rows_per_traj_success", "rows/traj, successes", "mean K_τ of successful trajectories"),
    ("expansion_ratio", "K fail / K success", "expansion ratio: mean rows of failures over mean rows of successes"),
    ("coupling_rows_outcome", "corr(K, R)", "within-group correlation of rows and outcome (−1: longer = worse)"),
    ("failure_mass_native", "failure mass, native", ("objective-mass share of failures under row+native "
     "(the reducer's native mass: what verl-agent's loss gives them)")),
    ("failure_mass_own", "failure mass, own", ("objective-mass share of failures under the variant's own "
     "accounting (the mass it actually trained with)")),
    ("failure_mass_trained", "failure mass, trained", ("objective-mass share of failures in the weights the run "
     "trained with, each mini-batch weighted on its own (metrics.jsonl `oma/failure_mass_share`; n/a for runs "
     "older than it)")),
)
"""(key, column title, meaning) of the coupling figures averaged per run."""

AUDIT_ONLY = ("coupling_rows_outcome", "failure_mass_native", "failure_mass_own")
"""Coupling figures only the audit of dumped batches gives (``--coupling metrics`` leaves them NaN)."""

COUPLING_SOURCES: dict[str, str] = {
    "audit": "`oma audit` of every dumped training batch at iterations ≤ H",
    "metrics": ("each run's metrics.jsonl at iterations ≤ H (`rows_per_traj_failure`, `rows_per_traj_success`, "
                "`oma/failure_mass_share`, logged by the trainer; no batch audited)"),
}
"""``--coupling`` values and where each takes the coupling figures from, as the report says it."""

REPORT_MARK = "# oma compare: "
"""How a report begins: the mark by which ``oma report`` and ``oma compare`` know a report they may replace
(:func:`oma.files.check_outputs`)."""

IMAGES = {
    "success_curves": "success_curves.png",
    "endpoint": "endpoint.png",
    "nauc": "nauc.png",
    "paired": "paired_differences.png",
}


class ReportError(ValueError):
    """The directory cannot be reported on; the message says why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ReportError(message)


# ------------------------------------------------------------------------------------------------
# One run


@dataclass
class RunResult:
    """The figures of one finished run cut at the horizon."""

    variant: str
    seed: int
    run_dir: Path
    eval_iterations: list[int]
    eval_success: list[float]
    endpoint: float
    endpoint_iterations: list[float]
    nauc: float
    env_steps: int
    coupling: dict[str, float] = field(default_factory=dict)
    audited_batches: int = 0
    coupling_iterations: int = 0
    """The iterations the coupling figures average over: batches audited, or metrics.jsonl records read."""


def run_coupling(run_dir: Path, horizon: int, config: dict, audit_name: str) -> tuple[dict[str, float], int]:
    """The coupling figures of ``run_dir``'s dumped batches at iterations ≤ horizon, each averaged
    over the batches where it is defined (NaN when it never is); also the number of batches audited."""
    import torch

    from oma.diagnostics import audit, read_batch, run_batches

    algo = config.get("algo", {})
    values: dict[str, list[float]] = {k: [] for k, _, _ in COUPLING}
    n = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many small O(R) passes: one thread is fastest (as in `oma audit`)
    try:
        for it, path in run_batches(run_dir):
            if it > horizon:
                continue
            b = read_batch(path)
            r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens,
                      response_length=b.response_length, step_index=b.step_index, anchor=b.anchor,
                      step_rewards=b.step_rewards, won=b.won, reducer=algo.get("reducer", "token-mean"),
                      aligned_mass="uniform", estimator=algo.get("estimator", "grpo"),
                      norm_by_std=algo.get("norm_by_std", True), gamma=algo.get("gamma", 0.95),
                      step_advantage_w=algo.get("step_advantage_w", 1.0))
            n += 1
            got = {
                "rows_per_traj_failure": r.rows_per_traj_failure_mean,
                "rows_per_traj_success": r.rows_per_traj_success_mean,
                "expansion_ratio": r.expansion_ratio_fail_over_success,
                "coupling_rows_outcome": r.coupling_rows_outcome,
                "failure_mass_native": r.accountings["row+native"].mass_share_failure,
                "failure_mass_own": r.accountings[audit_name].mass_share_failure,
            }
            for k, v in got.items():
                if math.isfinite(v):
                    values[k].append(float(v))
    finally:
        torch.set_num_threads(threads)
    return {k: float(np.mean(v)) if v else math.nan for k, v in values.items()}, n


def metrics_coupling(records: list[dict], horizon: int) -> tuple[dict[str, float], int]:
    """The coupling figures a run logged in metrics.jsonl at iterations 1..horizon, by the audit's
    definitions per iteration, each averaged over the iterations where it is defined (NaN when never):

        K_fail(i), K_success(i) = ``rows_per_traj_failure``, ``rows_per_traj_success`` of iteration i
            (mean steps of its failed / won episodes: one row per step, success by ``won``, as the
            audit counts the rows K_τ of its dumped batch)
        expansion_ratio(i) = K_fail(i) / K_success(i)   (defined when the batch has both outcomes)
        failure_mass_trained(i) = ``oma/failure_mass_share`` of iteration i

    so the ratio is the mean over iterations of per-iteration ratios, as :func:`run_coupling`'s, not
    a ratio of means. The figures only the audit gives (:data:`AUDIT_ONLY`) are NaN. Also returns
    the number of iterations read."""
    values: dict[str, list[float]] = {k: [] for k, _, _ in COUPLING}
    n = 0
    for r in records:
        if not 1 <= int(r["iteration"]) <= horizon:
            continue
        n += 1
        fail, ok = r.get("rows_per_traj_failure"), r.get("rows_per_traj_success")
        got = {"rows_per_traj_failure": fail, "rows_per_traj_success": ok,
               "expansion_ratio": fail / ok if fail is not None and ok else None,
               "failure_mass_trained": r.get("oma/failure_mass_share")}
        for k, v in got.items():
            if v is not None and math.isfinite(v):
                values[k].append(float(v))
    return {k: float(np.mean(v)) if v else math.nan for k, v in values.items()}, n


METRICS: dict[str, str] = {"greedy": "eval_success", "sampled": "eval_sampled_success"}
"""``--metric`` values and the ``metrics.jsonl`` key of the success curve each reports."""


def load_run(run_dir: Path, variant: str, seed: int, horizon: int, metric: str = "greedy",
             coupling_from: str = "audit") -> RunResult | str:
    """The run's figures at ``horizon`` on success ``metric``, its coupling from ``coupling_from``
    (:data:`COUPLING_SOURCES`), or a one-line reason why it cannot be used."""
    from oma.train import read_metrics, saved_config

    if not (run_dir / "summary.json").is_file():
        return "not finished (no summary.json)"
    records = read_metrics(run_dir)
    bad = next((n for n, r in enumerate(records, 1) if type(r.get("iteration")) is not int), None)
    if bad is not None:
        raise ReportError(f"{run_dir / 'metrics.jsonl'}: record {bad} has no integer iteration; expected the "
                          "metrics `oma train` writes")
    key = METRICS[metric]
    evals = [(int(r["iteration"]), float(r[key])) for r in records if key in r]
    last = max((int(r["iteration"]) for r in records), default=0)
    if last < horizon:
        return f"trained for {last} iterations only, fewer than the horizon {horizon}"
    its = [i for i, _ in evals]
    vals = [v for _, v in evals]
    try:
        ep = endpoint(its, vals, horizon)
        area = nauc(its, vals, horizon)
    except ValueError as e:
        return str(e)
    coupling, logged = metrics_coupling(records, horizon)
    audited = 0
    if coupling_from == "audit":
        config = saved_config(run_dir)
        audit_name = VARIANTS[variant].audit_name if variant in VARIANTS else "row+native"
        trained = coupling["failure_mass_trained"]
        coupling, audited = run_coupling(run_dir, horizon, config, audit_name)
        coupling["failure_mass_trained"] = trained  # only the metrics have it
    steps = sum(int(r.get("rows", 0)) for r in records if 1 <= int(r["iteration"]) <= horizon)
    return RunResult(variant, seed, run_dir, its, vals, ep, endpoint_iterations(its, horizon), area, steps, coupling,
                     audited, audited if coupling_from == "audit" else logged)


# ------------------------------------------------------------------------------------------------
# Analysis


def _ci_or_none(values: list[float]) -> Estimate | None:
    finite = [v for v in values if math.isfinite(v)]
    return mean_ci(finite) if finite else None


def gain(run: RunResult) -> float:
    """What a run learned over its warm start: endpoint − success at iteration 0 (NaN when its curve has no
    evaluation at 0)."""
    start = dict(zip(run.eval_iterations, run.eval_success)).get(0)
    return math.nan if start is None else run.endpoint - start


def _variant_curve(results: list[RunResult], horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    cut = [curve_to_horizon(r.eval_iterations, r.eval_success, horizon) for r in results]
    grid = np.unique(np.concatenate([x for x, _ in cut]))
    ys = np.stack([np.interp(grid, x, y) for x, y in cut])  # identical grids: no interpolation happens
    est = [mean_ci(ys[:, j]) for j in range(len(grid))]
    return grid, np.array([e.mean for e in est]), np.array([e.half_width for e in est]), len(results)


def coupling_source(doc: dict, coupling: str | None) -> str:
    """Where the coupling figures come from: ``coupling`` (:data:`COUPLING_SOURCES`), or by default the
    audit when the runs dumped their batches and their metrics after ``oma compare --no-dump``. The audit
    of runs that dumped nothing is refused."""
    dumped = doc.get("config", {}).get("dump_batches", True)
    source = coupling or ("audit" if dumped else "metrics")
    if source not in COUPLING_SOURCES:
        raise ReportError(f"--coupling {source!r} is not valid; expected one of {list(COUPLING_SOURCES)}")
    if source == "audit" and not dumped:
        raise ReportError("--coupling audit: the runs dumped no batches (oma compare --no-dump); use --coupling metrics")
    return source


def analyse(out: Path, horizon: int | None = None, metric: str | None = None,
            coupling: str | None = None) -> dict[str, Any]:
    """Every figure of the report as a dict (``results.json``), plus the RunResults under ``_runs``.

    ``metric`` (``greedy`` | ``sampled``; None = the one ``oma compare --metric`` recorded) picks the success curve,
    ``coupling`` (:func:`coupling_source`) where the coupling figures come from."""
    if not (out / "compare.json").is_file():
        raise ReportError(f"{out} has no compare.json; is it an `oma compare` output directory?")
    doc = read_compare_json(out)
    h = horizon if horizon is not None else doc["horizon"]
    if h < 1:
        raise ReportError(f"--horizon must be >= 1, got {h}")
    metric = metric or doc.get("metric", "greedy")
    if metric not in METRICS:
        raise ReportError(f"--metric {metric!r} is not valid; expected one of {list(METRICS)}")
    source = coupling_source(doc, coupling)
    variants = [v["name"] for v in doc["variants"]]
    seeds = doc["seeds"]
    runs: dict[str, dict[int, RunResult]] = {v: {} for v in variants}
    missing: list[str] = []
    for v in variants:
        for k in seeds:
            got = load_run(out / v / f"seed-{k}", v, k, h, metric, source)
            if isinstance(got, str):
                missing.append(f"{v}/seed-{k}: {got}")
            else:
                runs[v][k] = got
    if not any(runs.values()):
        raise ReportError(f"{out}: no finished run to report on ({'; '.join(missing)})")

    per_variant: dict[str, Any] = {}
    for v in variants:
        rs = [runs[v][k] for k in seeds if k in runs[v]]
        entry: dict[str, Any] = {"n_seeds": len(rs), "seeds": [r.seed for r in rs]}
        if rs:
            entry["endpoint"] = mean_ci([r.endpoint for r in rs])
            entry["nauc"] = mean_ci([r.nauc for r in rs])
            entry["env_steps"] = mean_ci([float(r.env_steps) for r in rs])
            entry["coupling"] = {key: _ci_or_none([r.coupling[key] for r in rs]) for key, _, _ in COUPLING}
            entry["curve"] = _variant_curve(rs, h)
        if v != BASELINE and BASELINE in runs:
            paired = [k for k in seeds if k in runs[v] and k in runs[BASELINE]]
            if paired:
                entry["paired_seeds"] = paired
                entry["diff_endpoint"] = paired_diff([runs[v][k].endpoint for k in paired],
                                                     [runs[BASELINE][k].endpoint for k in paired])
                entry["diff_nauc"] = paired_diff([runs[v][k].nauc for k in paired],
                                                 [runs[BASELINE][k].nauc for k in paired])
        per_variant[v] = entry
    ep_its = sorted({tuple(r.endpoint_iterations) for rv in runs.values() for r in rv.values()})
    # how much room the baseline had and used: a Δ of a point means little where it gained nothing
    baseline_gain = _ci_or_none([gain(r) for r in runs.get(BASELINE, {}).values()])
    return {"compare": doc, "horizon": h, "metric": metric, "coupling_source": source, "variants": variants,
            "seeds": seeds, "per_variant": per_variant, "baseline_gain": baseline_gain, "missing": missing,
            "endpoint_iterations": [list(t) for t in ep_its], "_runs": runs}


DIFFS: tuple[tuple[str, str], ...] = (("diff_endpoint", "endpoint success"), ("diff_nauc", "nAUC"))
"""(key, label) of the paired differences every variant is tested on."""


def comparisons(a: dict[str, Any]) -> list[tuple[str, str, str, Estimate, bool]]:
    """Every paired difference of the report as (variant, key, label, estimate, survives Holm).

    The family is all of them (each variant × endpoint and nAUC), corrected together with
    :func:`holm` at 1 − the CIs' level.
    """
    tests = [(v, key, label, e[key]) for v, e in a["per_variant"].items() for key, label in DIFFS if key in e]
    keep = holm([d.p for *_, d in tests], alpha=1.0 - tests[0][3].level) if tests else []
    return [(*t, k) for t, k in zip(tests, keep)]


def significance_statements(a: dict[str, Any]) -> list[str]:
    """Plain-language statements of which paired differences are significant (and that none are)."""
    tests = comparisons(a)
    if not tests:
        return [f"No paired difference could be computed (no seed where both {BASELINE} and another variant finished)."]
    if all(not math.isfinite(d.half_width) for *_, d, _ in tests):
        return [("With one seed per variant the 95% CIs are undefined: no difference can be called significant. "
                "Run more seeds (docs/experiments.md#the-metrics asks for at least 3).")]
    lines = [f"{v} has a significantly {'higher' if d.mean > 0 else 'lower'} {label} than {BASELINE}: paired "
             f"difference {_signed(d.mean)} (95% CI {_signed(d.lo)} to {_signed(d.hi)}, p = {d.p:.3f}, n={d.n} seeds)."
             for v, _, label, d, _ in tests if d.significant]
    if not lines:
        return [(f"No difference is significant: every 95% CI of a paired difference to {BASELINE} "
                "(endpoint and nAUC) includes 0.")]
    m = sum(math.isfinite(d.p) for *_, d, _ in tests)
    if m > 1:
        kept = [f"{v} ({label})" for v, _, label, d, k in tests if k]
        lines.append(
            f"Corrected for the {m} comparisons of this report (Holm–Bonferroni, family-wise 5%), "
            + (f"{len(kept)} of them remain significant: {', '.join(kept)}." if kept else
               "none remains significant: with this many comparisons, read the differences above as suggestive."))
    return lines


# ------------------------------------------------------------------------------------------------
# Rendering


def _num(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if x is not None and math.isfinite(x) else "n/a"


def _signed(x: float, digits: int = 3) -> str:
    return f"{x:+.{digits}f}" if math.isfinite(x) else "n/a"


def _est(e: Estimate | None, digits: int = 3) -> str:
    if e is None:
        return "n/a"
    hw = f" ± {e.half_width:.{digits}f}" if math.isfinite(e.half_width) else " ± n/a"
    return f"{_num(e.mean, digits)}{hw}"


def _diff(e: Estimate | None) -> str:
    if e is None:
        return "—"
    ci = f" [{_signed(e.lo)}, {_signed(e.hi)}]" if math.isfinite(e.half_width) else " [n/a]"
    text = f"{_signed(e.mean)}{ci}"
    return f"**{text}** ✱" if e.significant else text


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def _minutes(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "n/a"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def render_markdown(a: dict[str, Any], images: dict[str, str]) -> str:
    """The report as Markdown (``images`` maps IMAGES keys to relative file names)."""
    doc, h, pv = a["compare"], a["horizon"], a["per_variant"]
    cfg = doc["config"]
    algo = cfg.get("algo", {})
    m = doc.get("machine", {})
    out = [f"{REPORT_MARK}{doc['config'].get('out_dir', '')}", ""]
    out += ["## Command", "", "```", doc["command"], "```", ""]
    n_ep = ", ".join("(" + ", ".join(f"{i:g}" for i in its) + ")" for its in a["endpoint_iterations"])
    out += ["## Setup", "",
            f"* variants: {', '.join(a['variants'])}; baseline {BASELINE} (verl-agent's stepwise accounting)",
            (f"* seeds: {', '.join(map(str, a['seeds']))} "
            "(within a seed every variant shares the warm start and the task seeds)"),
            (f"* success: held-out {a['metric']} success (`{METRICS[a['metric']]}`), "
             + ("greedy decoding" if a["metric"] == "greedy" else "sampled at policy.temperature: the policy RL trains")),
            f"* matched horizon H = {h} iterations"
            + (f" (the runs were launched with --horizon {doc['horizon']})" if h != doc["horizon"] else ""),
            (f"* optimizer: estimator {algo.get('estimator')}, objective {algo.get('objective')}, reducer "
            f"{algo.get('reducer')}, norm_by_std {algo.get('norm_by_std')}, episode score {algo.get('score', 'return')}"),
            (f"* environment: {cfg.get('env', {}).get('name')} {json.dumps(cfg.get('env', {}).get('options', {}))}, "
            f"{cfg.get('env', {}).get('tasks_per_iter')} tasks × {cfg.get('env', {}).get('group_size')} episodes per "
            f"iteration, {cfg.get('env', {}).get('eval_tasks')} held-out tasks evaluated every {cfg.get('eval_every')} "
            "iterations (and at 0 and H)"),
            (f"* endpoint = mean of the last {ENDPOINT_EVALS} evaluations at iterations ≤ H, here iterations {n_ep} "
            "(fewer when fewer evaluations fall at or before H; never interpolated)"),
            ("* nAUC = trapezoid area under the success curve on [0, H] / H (the value at H is interpolated linearly "
            "between evaluations when H is not an evaluation iteration)"),
            f"* coupling: from {COUPLING_SOURCES[a['coupling_source']]} (`--coupling {a['coupling_source']}`)",
            ""]
    variants_table = [[v["name"], v["algo.accounting"], v["algo.mass"]] for v in doc["variants"]]
    out += _table(["variant", "algo.accounting", "algo.mass"], variants_table)

    out += ["## Results", "",
            (f"Mean ± 95% CI (Student t) over seeds at H = {h}; Δ = paired difference to {BASELINE} (same seed), "
            "mean [95% CI]; **bold ✱** = the CI excludes 0."), ""]
    # the audit's native failure mass; without batches the one each run trained with, from its metrics
    mass_key = "failure_mass_native" if a["coupling_source"] == "audit" else "failure_mass_trained"
    mass_title = next(t for k, t, _ in COUPLING if k == mass_key)
    rows = []
    for v in a["variants"]:
        e = pv[v]
        if not e["n_seeds"]:
            rows.append([v, "0", "n/a", "n/a", "—", "—", "n/a", "n/a", "n/a"])
            continue
        cpl = e["coupling"]
        rows.append([v, str(e["n_seeds"]), _est(e["endpoint"]), _est(e["nauc"]),
                     "baseline" if v == BASELINE else _diff(e.get("diff_endpoint")),
                     "baseline" if v == BASELINE else _diff(e.get("diff_nauc")),
                     _est(cpl["expansion_ratio"], 2), _est(cpl[mass_key], 2), _est(e["env_steps"], 0)])
    out += _table(["variant", "seeds", "endpoint", "nAUC", "Δ endpoint", "Δ nAUC", "K fail / K success",
                   mass_title, "env steps (training)"], rows)
    own = "audited" if a["coupling_source"] == "audit" else "as its runs logged them"
    out += [(f"Coupling columns: the variant's own rollouts, {own} (next sections); env steps = training rows "
            "(one per agent step) over iterations 1..H, evaluation episodes excluded."), ""]
    g = a["baseline_gain"]
    if g is not None:
        out += [(f"Baseline gain: {BASELINE} gained {_signed(g.mean)} "
                 + (f"[{_signed(g.lo)}, {_signed(g.hi)}]" if math.isfinite(g.half_width) else "[n/a]")
                 + f" over its warm start (endpoint − held-out {a['metric']} success at iteration 0, mean [95% CI] "
                 f"over {g.n} seeds): the room a Δ above is measured against."), ""]

    out += ["## Significance", ""]
    out += [f"* {s}" for s in significance_statements(a)] + [""]
    if a["missing"]:
        out += ["Runs left out (rerun `oma compare` with the same arguments to finish them):", ""]
        out += [f"* {x}" for x in a["missing"]] + [""]

    out += ["## Success curves", "", f"![Success curves with 95% CI bands]({images['success_curves']})", ""]
    out += ["## Endpoint and nAUC", "",
            f"![Endpoint success, mean and 95% CI]({images['endpoint']})", "",
            f"![nAUC, mean and 95% CI]({images['nauc']})", "",
            f"![Paired differences to {BASELINE}]({images['paired']})", ""]

    source = a["coupling_source"]
    out += ["## Expansion–outcome coupling", "",
            (f"From {COUPLING_SOURCES[source]}, averaged over the iterations where "
            "a figure is defined (e.g. K fail / K success needs both outcomes in the batch), then mean ± 95% CI "
            "over seeds (n = the seeds where it is defined, when fewer). Each variant's own rollouts."
            + ("" if source == "audit" else
               " The rows per trajectory and K fail / K success are the audit's figures, per iteration; "
               + " and ".join(f"*{t}*" for k, t, _ in COUPLING if k in AUDIT_ONLY)
               + " need the dumped batches (n/a here).")), ""]
    crow = []
    for v in a["variants"]:
        e = pv[v]
        cells = []
        for k, _, _ in COUPLING:
            c = e.get("coupling", {}).get(k)
            cells.append(_est(c, 2) + (f" (n={c.n})" if c is not None and c.n < e["n_seeds"] else ""))
        crow.append([v] + cells)
    out += _table(["variant"] + [t for _, t, _ in COUPLING], crow)
    out += [f"* **{t}**: {meaning}." for _, t, meaning in COUPLING] + [""]

    out += ["## Per-seed values", ""]
    prow = []
    for v in a["variants"]:
        for k, r in sorted(a["_runs"][v].items()):
            prow.append([v, str(k), _num(r.endpoint), _num(r.nauc), str(r.env_steps),
                         _num(r.coupling["expansion_ratio"], 2), _num(r.coupling[mass_key], 2),
                         str(r.coupling_iterations)])
    read = "batches audited" if source == "audit" else "iterations logged"
    out += _table(["variant", "seed", "endpoint", "nAUC", "env steps", "K fail / K success", mass_title, read], prow)

    out += ["## Machine and wall time", ""]
    out += [(f"* {m.get('platform')} ({m.get('machine')}), Python {m.get('python')}, torch {m.get('torch')}, "
            f"oma {m.get('oma')}"),
            (f"* CPUs: {m.get('cpu_count')} ({m.get('usable_cpus')} usable) of {m.get('cpu', 'an unrecorded processor')}"
             f" ({m.get('cpu_capability', 'kernels not recorded')}); jobs {m.get('jobs')}, "
            f"{m.get('threads_per_run')} torch threads per run"),
            (f"* last invocation: started {doc.get('started')}, wall time {_minutes(doc.get('wall_time_s'))}; "
            f"all invocations: {_minutes(sum(x.get('wall_time_s') or 0 for x in doc.get('history', [])))}"),
            ""]
    wrows = []
    for v in a["variants"]:
        for k in a["seeds"]:
            r = doc.get("runs", {}).get(f"{v}/seed-{k}", {})
            wrows.append([f"{v}/seed-{k}", r.get("status", "?"), _minutes(r.get("wall_time_total_s"))])
    ws = doc.get("warm_starts", {})
    out += _table(["run", "status (last invocation)", "training wall time (all invocations)"], wrows)
    if ws:
        out += _table(["warm start", "cache key", "was cached", "wall time"],
                      [[k, w.get("cache_key", ""), str(w.get("was_cached")), _minutes(w.get("wall_time_s"))]
                       for k, w in sorted(ws.items())])

    out += ["## Config", "",
            "The config every run shares (`algo.accounting`, `algo.mass` and `seed` are set per run; see Setup):", "",
            "```json", json.dumps(cfg, indent=2), "```", ""]
    if doc.get("overrides"):
        on = f" on `{doc['config_path']}`" if doc.get("config_path") else ""
        out += ["Overrides: `" + " ".join(doc["overrides"]) + "`" + on, ""]
    out += ["Definitions and how to read this report: docs/experiments.md#the-metrics.", ""]
    return "\n".join(out)


def results_dict(a: dict[str, Any]) -> dict[str, Any]:
    """JSON form of the analysis (results.json)."""
    def est(e):
        return e.to_dict() if isinstance(e, Estimate) else None

    pv = {}
    for v, e in a["per_variant"].items():
        d = {k: e[k] for k in ("n_seeds", "seeds", "paired_seeds") if k in e}
        for k in ("endpoint", "nauc", "env_steps", "diff_endpoint", "diff_nauc"):
            if k in e:
                d[k] = est(e[k])
        if "coupling" in e:
            d["coupling"] = {k: est(x) for k, x in e["coupling"].items()}
        if "curve" in e:
            x, mean, hw, n = e["curve"]
            d["curve"] = {"iterations": x.tolist(), "mean": mean.tolist(),
                          "half_width": [float(h) if math.isfinite(h) else None for h in hw], "n": n}
        pv[v] = d

    def num(x):
        return float(x) if math.isfinite(x) else None

    runs = [{"variant": r.variant, "seed": r.seed, "endpoint": r.endpoint, "endpoint_iterations": r.endpoint_iterations,
             "nauc": r.nauc, "env_steps": r.env_steps, "eval_iterations": r.eval_iterations,
             "eval_success": r.eval_success, "audited_batches": r.audited_batches,
             "coupling_iterations": r.coupling_iterations, "coupling": {k: num(x) for k, x in r.coupling.items()}}
            for rv in a["_runs"].values() for r in rv.values()]
    holm_kept = {f"{v}/{key}": k for v, key, _, d, k in comparisons(a) if math.isfinite(d.p)}
    return {"horizon": a["horizon"], "metric": a["metric"], "coupling_source": a["coupling_source"], "baseline": BASELINE,
            "variants": pv, "baseline_gain": est(a["baseline_gain"]), "runs": runs, "missing": a["missing"],
            "significance": significance_statements(a), "holm_significant": holm_kept}


def write_report(out: Path, out_file: Path | None = None, horizon: int | None = None, console=None,
                 metric: str | None = None, coupling: str | None = None) -> Path:
    """Analyse ``out`` and write the Markdown report, its PNGs (beside it) and results.json; return its path."""
    from oma.experiments import plots
    from oma.files import atomic_write_text, check_outputs

    out = Path(out)
    if not (out / "compare.json").is_file():
        raise ReportError(f"{out} has no compare.json; is it an `oma compare` output directory?")
    target = Path(out_file) if out_file is not None else out / "report.md"
    folder = target.resolve().parent
    if not folder.is_dir():
        raise ReportError(f"--out {target}: directory {target.parent} does not exist")
    if target.is_dir():
        raise ReportError(f"--out {target}: is a directory; give a file name such as report.md")
    results = "results.json" if target.name == "report.md" else f"{target.stem}.results.json"
    # the report reads compare.json and every run folder (DIR's subfolders): it writes over none of them
    check_outputs(f"--out {target}", target, (REPORT_MARK,), beside=(results, *IMAGES.values()),
                  inputs=[out / "compare.json", *(p for p in out.iterdir() if p.is_dir())])
    a = analyse(out, horizon, metric, coupling)
    pv = a["per_variant"]
    h = a["horizon"]
    plots.success_curves({v: e["curve"] for v, e in pv.items() if "curve" in e}, h, folder / IMAGES["success_curves"],
                         f"held-out {a['metric']} success")
    with_runs = [v for v in a["variants"] if pv[v]["n_seeds"]]
    per_seed = {v: [r.endpoint for r in a["_runs"][v].values()] for v in with_runs}
    plots.metric_bars({v: pv[v]["endpoint"] for v in with_runs}, per_seed,
                      f"Endpoint success at H = {h} (mean of the last {ENDPOINT_EVALS} evaluations)",
                      "held-out success", folder / IMAGES["endpoint"])
    per_seed = {v: [r.nauc for r in a["_runs"][v].values()] for v in with_runs}
    plots.metric_bars({v: pv[v]["nauc"] for v in with_runs}, per_seed, f"nAUC on [0, {h}]", "time-averaged success",
                      folder / IMAGES["nauc"])
    diffs = {v: {"endpoint": pv[v]["diff_endpoint"], "nAUC": pv[v]["diff_nauc"]} for v in a["variants"]
             if "diff_endpoint" in pv[v]}
    plots.paired_differences(diffs, folder / IMAGES["paired"])
    atomic_write_text(folder / results, json.dumps(results_dict(a), indent=2))
    atomic_write_text(target, render_markdown(a, IMAGES))
    if console is not None:
        for s in significance_statements(a):
            console.print(s)
    return target


def main(argv: list[str]) -> int:
    p = _Parser(prog="oma report", description="Write the report of an `oma compare` directory: success curves, "
                "endpoint and nAUC with 95% CIs, paired differences to row+native, coupling (docs/experiments.md).")
    p.add_argument("dir", metavar="DIR", help="the `oma compare` output directory (holds compare.json)")
    p.add_argument("--out", default=None, metavar="FILE.md",
                   help="Markdown file to write (default DIR/report.md); PNGs go beside it")
    p.add_argument("--horizon", type=int, default=None, metavar="H",
                   help="matched horizon H (default: the one of compare.json); "
                   "every run must have reached it")
    p.add_argument("--metric", default=None, choices=list(METRICS),
                   help="success curve: greedy or sampled held-out success (default: the one of compare.json)")
    p.add_argument("--coupling", default=None, choices=list(COUPLING_SOURCES),
                   help="coupling figures from the audit of the dumped batches (the default when the runs dumped "
                   "them) or from each run's metrics.jsonl (the default after oma compare --no-dump; faster)")
    try:
        args = p.parse_args(argv)
        if args.horizon is not None and args.horizon < 1:
            raise ReportError(f"--horizon must be >= 1, got {args.horizon}")
        from rich.console import Console

        path = write_report(Path(args.dir), Path(args.out) if args.out else None, args.horizon, Console(), args.metric,
                            args.coupling)
    except SystemExit as done:  # --help
        return int(done.code or 0) if isinstance(done.code, int) else 0
    except (ReportError, OSError, ValueError) as e:
        print(f"oma report: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"oma report: wrote {path}")
    return 0
