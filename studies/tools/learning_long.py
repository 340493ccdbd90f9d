"""Does a longer preset learn a lot? Held-out success gains per variant across seeds, with
learning curves, of an `oma compare` folder or of runs trained one by one into the same layout.

Run by hand after the runs (results committed in studies/longer-preset/learning-long.md and
studies/default-job/learning-long-gigpo.md):

    oma compare studies/longer-preset/household-grpo-oma-long-2026-12-04.yaml --variants 2 --seeds 5 --jobs 2 --out runs/long-grpo
    .venv/bin/python studies/tools/learning_long.py runs/long-grpo --preset studies/longer-preset/household-grpo-oma-long-2026-12-04.yaml \
        --out studies/longer-preset/learning-long.md

    oma train studies/default-job/household-gigpo-oma-long.yaml seed=K out_dir=runs/long-gigpo/OA+MA/seed-K
    oma train studies/default-job/household-gigpo-oma-long.yaml seed=K algo.accounting=row algo.mass=native \
        out_dir=runs/long-gigpo/row+native/seed-K                                   # K = 0..4
    .venv/bin/python studies/tools/learning_long.py runs/long-gigpo --preset studies/default-job/household-gigpo-oma-long.yaml \
        --out studies/default-job/learning-long-gigpo.md

The default job's two accountings (studies/lm-accounting/learning-default-accounting.md; the default job of
2026-12-04, studies/default-job/household-gigpo-oma-2026-12-04.yaml), judged by its own target over seeds:

    oma train studies/default-job/household-gigpo-oma-2026-12-04.yaml seed=K threads=1 out_dir=runs/default-acc/OA+MA/seed-K
    oma train studies/default-job/household-gigpo-oma-2026-12-04.yaml seed=K threads=1 algo.accounting=row algo.mass=native \
        out_dir=runs/default-acc/row+native/seed-K
    .venv/bin/python studies/tools/learning_long.py runs/default-acc --preset studies/default-job/household-gigpo-oma-2026-12-04.yaml \
        --horizon 15 --target default --out studies/lm-accounting/learning-default-accounting.md

Runs that roll out other numbers of episodes per iteration (``env.tasks_per_iter``) are compared on
the same data with ``--unit episode``: the horizon and the curves count training episodes, read from
each run's config.json (studies/what-limits-learning/learning-default-batch.md):

    oma train studies/default-job/household-gigpo-oma-2026-12-04.yaml env.tasks_per_iter=4 iterations=30 eval_every=15 seed=K \
        threads=1 out_dir=runs/batch/4x8/seed-K
    .venv/bin/python studies/tools/learning_long.py runs/batch --preset studies/default-job/household-gigpo-oma-2026-12-04.yaml \
        --horizon 960 --unit episode --target default --baseline 'the default job' --command TEXT \
        --out studies/what-limits-learning/learning-default-batch.md

Jobs of different lengths are compared as each one's user gets them with ``--baseline-horizon``: the
baseline's runs are read at their own end (studies/default-job/learning-default-terse-45.md, a 45-iteration job
against the 15-iteration default job of 2026-12-04 on the same seeds):

    oma train studies/default-job/household-gigpo-oma-terse.yaml eval_every=15 seed=K threads=1 \
        out_dir=runs/terse-45/'terse, 45 iterations'/seed-K                            # K = 5..9
    .venv/bin/python studies/tools/learning_long.py runs/terse-45 --preset studies/default-job/household-gigpo-oma-terse.yaml \
        --horizon 45 --target default --baseline 'the default job' --baseline-horizon 15 --command TEXT \
        --out studies/default-job/learning-default-terse-45.md

One evaluation is a noisy reading of one run; ``--last K`` reads each run's end as its endpoint success
instead, the mean of its last K evaluations up to its horizon (docs/experiments.md#the-metrics;
studies/default-job-375/learning-default-375-last-3.md, the 375-iteration runs of both accountings over their last 3):

    .venv/bin/python studies/tools/learning_long.py studies/default-job-375/evidence/2026-12-05-accounting-375 \
        --preset studies/default-job-375/household-gigpo-oma-375.yaml --horizon 375 --last 3 --command TEXT \
        --out studies/default-job-375/learning-default-375-last-3.md

No rule that picks a checkpoint (early stopping, the best one on a validation set) can report more than
``--best`` reads: each run's best greedy evaluation after 0 up to its horizon, chosen on the very tasks it
is scored on, with the sampled success of that evaluation (studies/longer-preset/learning-grpo-375-best.md):

    .venv/bin/python studies/tools/learning_long.py studies/longer-preset/evidence/2026-12-05-grpo-375 \
        studies/longer-preset/evidence/2026-12-05-grpo-375-seeds-5-7 --preset studies/longer-preset/household-grpo-oma-375.yaml \
        --horizon 375 --best --command TEXT --out studies/longer-preset/learning-grpo-375-best.md

More seeds of the same study trained later into another folder are read with it as one study by
naming both folders (studies/longer-preset/learning-grpo-375-8-seeds.md: target 2's preset over seeds 0-4 and 5-7):

    .venv/bin/python studies/tools/learning_long.py studies/longer-preset/evidence/2026-12-05-grpo-375 \
        studies/longer-preset/evidence/2026-12-05-grpo-375-seeds-5-7 --preset studies/longer-preset/household-grpo-oma-375.yaml \
        --horizon 375 --command TEXT --out studies/longer-preset/learning-grpo-375-8-seeds.md

Runs continued past their horizon are read at the new one, with ``--since`` naming the old one: per
variant, what the added iterations gave each run, paired by run (studies/longer-preset/learning-grpo-525.md,
target 2's preset continued from 375 to 525 iterations):

    oma train studies/longer-preset/household-grpo-oma-375.yaml seed=K [algo.accounting=row algo.mass=native] \
        iterations=525 out_dir=RUN --resume                          # RUN: a copy of the 375-iteration run
    .venv/bin/python studies/tools/learning_long.py studies/longer-preset/evidence/2026-12-05-grpo-525 \
        --preset studies/longer-preset/household-grpo-oma-375.yaml --horizon 525 --since 375 --command TEXT \
        --out studies/longer-preset/learning-grpo-525.md

A folder with compare.json is read as that comparison's runs; any other folder as
DIR/<variant>/seed-K. Reads each finished run's metrics.jsonl (held-out greedy and sampled success on 128 tasks at
iterations 0, 10, ..., 60). The gain is success at the horizon minus success at iteration 0 (the
warm start), per seed, as mean ± 95% Student-t CI over the seeds (oma.experiments.stats.mean_ci);
every variant that shares seeds with ``--baseline`` (row+native unless named) is also paired with
it by seed, in gain and in success at the horizon; a named baseline without finished runs is refused.
Runs that have not reached the horizon are listed and left out. With two variants or more the report
opens with a summary, one row per variant (the baseline first, then by mean greedy gain), and a forest
plot of the gains with the target's (<out>-gains.png). Every 5-seed screen of the default job
(studies/what-limits-learning/learning-default-screens.md) is read this way from one folder of links to their runs:

    .venv/bin/python studies/tools/learning_long.py runs/screens --preset studies/default-job/household-gigpo-oma-2026-12-04.yaml \
        --horizon 15 --target default --baseline 'the default job' --command TEXT \
        --out studies/what-limits-learning/learning-default-screens.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from oma.experiments.plan import study_runs
from oma.experiments.stats import Estimate, endpoint, endpoint_iterations, mean_ci, paired_diff
from oma.files import read_jsonl

METRICS = {"eval_success": "greedy", "eval_sampled_success": "sampled"}


TARGETS = {
    "long": "Target (greedy, per run): a gain of at least +25 points, or doubling where the warm start is below 25%.",
    "default": "Target (the default job's): a mean gain of at least +10 points with its 95% CI above 0, greedy and sampled.",
}
TARGET_GAIN = {"long": 0.25, "default": 0.10}
"""The gain each target asks for (the long one per run, the default one as the mean over seeds), drawn in the forest plot."""


def meets_target(start: float, end: float) -> bool:
    """The long preset's target for one run: greedy gain ≥ +25 points, or doubling from a warm start below 25%."""
    return end - start >= TARGET_GAIN["long"] or (start < 0.25 and end >= 2 * start)


def meets_mean_target(e: Estimate) -> bool:
    """The default job's target over seeds, on the gains' :func:`mean_ci`: mean ≥ +0.10 and the 95% CI's lower end above 0."""
    return e.mean >= TARGET_GAIN["default"] and e.lo > 0


UNITS = {"iteration": "iteration", "episode": "training episode"}
"""What a curve is indexed by: RL iterations, or the training episodes rolled out by then (iteration ×
``env.tasks_per_iter`` × ``env.group_size`` of the run's config.json), so runs that roll out other numbers
of episodes per iteration are compared on the same data."""


class Horizons(dict):
    """Where each variant's gain is read: ``horizon`` for every variant, ``baseline_horizon`` (when given)
    for ``baseline``; ``Horizons(15)[v] == 15`` for any ``v``."""

    def __init__(self, horizon: int, baseline: str | None = None, baseline_horizon: int | None = None) -> None:
        super().__init__({} if baseline_horizon is None else {baseline: baseline_horizon})
        self.horizon = horizon

    def __missing__(self, variant: str) -> int:
        return self.horizon


def episodes_per_iteration(run_dir: Path) -> int:
    """Training episodes of one RL iteration of the run: ``env.tasks_per_iter`` × ``env.group_size`` of its config.json."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise SystemExit(f"{run_dir}: no config.json, so its episodes per iteration are unknown (--unit episode)")
    env = json.loads(path.read_text())["env"]
    return int(env["tasks_per_iter"]) * int(env["group_size"])


def curves(run_dir: Path, unit: str = "iteration") -> dict[str, dict[int, float]]:
    """Held-out greedy and sampled success of a run, keyed by ``unit`` (:data:`UNITS`)."""
    scale = episodes_per_iteration(run_dir) if unit == "episode" else 1
    out: dict[str, dict[int, float]] = {m: {} for m in METRICS}
    for row in read_jsonl(run_dir / "metrics.jsonl"):  # or its committed metrics.jsonl.gz
        for m in METRICS:
            if m in row:
                out[m][int(row["iteration"]) * scale] = float(row[m])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir", nargs="+",
                   help="an oma compare --out folder, or DIR/<variant>/seed-K run folders; several folders are read "
                        "as one study (more seeds of the same runs), a variant's seed found in two of them refused")
    p.add_argument("--horizon", type=int, default=60, help="where the gain is read, in --unit")
    p.add_argument("--unit", choices=sorted(UNITS), default="iteration",
                   help="iteration: RL iterations; episode: training episodes rolled out (runs that roll out "
                        "other numbers of episodes per iteration, compared on the same data)")
    p.add_argument("--preset", default="configs/household-grpo-oma-long.yaml",
                   help="the preset the runs were trained from, named in the report (a compare.json names its own)")
    p.add_argument("--out", default="studies/longer-preset/learning-long.md")
    p.add_argument("--target", choices=sorted(TARGETS), default="long",
                   help="long: the long preset's per-run target; default: the default job's target over seeds")
    p.add_argument("--baseline",
                   help="the variant every other one is paired against, by seed (gain and success at the horizon); "
                        "default: row+native where it has runs; must name a variant with finished runs")
    p.add_argument("--baseline-horizon", type=int,
                   help="read the baseline's runs here instead of at --horizon: jobs of different lengths compared as "
                        "each one's user gets it (e.g. a 45-iteration job against the 15-iteration default job)")
    p.add_argument("--command", help="how the runs were trained, named in the report (default: a generic oma train line)")
    p.add_argument("--since", type=int,
                   help="also report, per variant, success at the horizon minus at this earlier point, paired by run: "
                        "what the training after it added (e.g. runs continued from 375 to 525 iterations)")
    p.add_argument("--last", type=int, default=1,
                   help="read each run's end as the mean of its last LAST held-out evaluations up to its horizon "
                        "(after iteration 0), a reading less sensitive to one evaluation's swing (default 1: the "
                        "evaluation at the horizon)")
    p.add_argument("--best", action="store_true",
                   help="read each run's end as its best greedy evaluation after 0 up to its horizon, with the sampled "
                        "success of that evaluation: chosen on the tasks it is scored on, an upper bound on what any "
                        "checkpoint selection could report (not with --last or --since)")
    args = p.parse_args(argv)
    if args.best and (args.last != 1 or args.since is not None):
        print("--best: not with --last or --since (each reads the run's end its own way)", file=sys.stderr)
        return 2
    if args.last < 1:
        print(f"--last: expected a count of evaluations >= 1, got {args.last}", file=sys.stderr)
        return 2
    if args.since is not None and not 0 < args.since < args.horizon:
        print(f"--since: expected a point after 0 and before --horizon {args.horizon}, got {args.since}", file=sys.stderr)
        return 2
    per_run = args.target == "long"
    roots = [Path(r) for r in args.runs_dir]
    try:
        found, recorded = study_runs(roots)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    preset = recorded.get("config_path") or args.preset  # a comparison records its preset
    folders = " ".join(map(str, roots))
    command = (f"`{recorded['command']}`" if "command" in recorded else
               args.command or (f"`oma train {preset} seed=K [algo.accounting=row algo.mass=native] "
                                f"out_dir={roots[0] if len(roots) == 1 else 'DIR'}/<variant>/seed-K`, one run per "
                                "variant and seed,"))
    if args.baseline_horizon is not None and args.baseline is None:
        print("--baseline-horizon needs --baseline", file=sys.stderr)
        return 2
    baseline = args.baseline or "row+native"
    horizons = Horizons(args.horizon, baseline, args.baseline_horizon)
    runs: dict[str, dict[int, dict]] = {}
    unfinished = []
    for key, run_dir in found.items():
        variant, seed = key.split("/seed-")
        c = curves(run_dir, args.unit) if any((run_dir / f).is_file() for f in ("metrics.jsonl", "metrics.jsonl.gz")) else None
        if c is None or horizons[variant] not in c["eval_success"]:
            unfinished.append(key)
            continue
        runs.setdefault(variant, {})[int(seed)] = c
    try:
        ends = best_ends(runs, horizons) if args.best else averaged_ends(runs, horizons, args.last)
    except ValueError as e:
        print(f"{'--best' if args.best else f'--last {args.last}'}: {e}", file=sys.stderr)
        return 2
    unit = UNITS[args.unit]
    at = partial(end_name, unit, last=args.last, best=args.best)
    try:
        since_lines = [] if args.since is None else since(ends, horizons, args.since, unit, at)
    except ValueError as e:
        print(f"--since {args.since}: {e}", file=sys.stderr)
        return 2
    if args.baseline is not None and args.baseline not in runs:
        print(f"--baseline {args.baseline!r}: no finished runs of that variant at {args.unit} {horizons[args.baseline]} "
              f"(variants: {', '.join(sorted(runs)) or 'none'})", file=sys.stderr)
        return 2
    png = Path(args.out).with_suffix(".png")
    if args.best or args.last > 1:  # the tables read other points than the horizon's: mark them
        plot(runs, png, args.horizon, unit, lambda v, c: read_points(c, horizons[v], args.last, args.best),
             "each run's best greedy evaluation" if args.best else f"each run's last {args.last} evaluations, averaged")
    else:
        plot(runs, png, args.horizon, unit)
    lines = [
        f"# {preset} across seeds: held-out success gains",
        "",
        f"Commands: {command} then `.venv/bin/python studies/tools/learning_long.py {folders} "
        f"--preset {preset}{'' if args.horizon == 60 else f' --horizon {args.horizon}'}"
        f"{'' if args.unit == 'iteration' else f' --unit {args.unit}'}"
        f"{'' if per_run else f' --target {args.target}'}"
        f"{'' if args.baseline is None else f' --baseline {args.baseline!r}'}"
        f"{'' if args.baseline_horizon is None else f' --baseline-horizon {args.baseline_horizon}'}"
        f"{'' if args.since is None else f' --since {args.since}'}"
        f"{' --command TEXT' if args.command else ''}{'' if args.last == 1 else f' --last {args.last}'}"
        f"{' --best' if args.best else ''} --out {args.out}`.",
        f"Held-out success on 128 tasks at {unit}s 0 (the warm start) to {args.horizon}; gain = {unit} "
        f"{args.horizon} − {unit} 0, per seed; mean ± 95% Student-t CI over seeds. {TARGETS[args.target]}"
        + ("" if args.baseline_horizon is None else
           f" {baseline} is read at {unit} {args.baseline_horizon}, the end of its job: its gain is {unit} "
           f"{args.baseline_horizon} − {unit} 0.")
        + ("" if args.last == 1 else
           f" **Each run's end is its endpoint success, the mean of its last {args.last} evaluations up to its "
           f"horizon** (docs/experiments.md#the-metrics; for the horizon {args.horizon}: {unit}s "
           f"{', '.join(map(str, last_evaluations(runs, args.horizon, args.last)))}), in every table and the "
           "gains' plot; the learning curves show every evaluation, the ones each end reads marked.")
        + ("" if not args.best else
           " **Each run's end is its best greedy evaluation after 0 up to its horizon, with the sampled success of "
           "that same evaluation**, in every table and the gains' plot: a checkpoint chosen on the held-out tasks it is "
           "scored on, so an upper bound on what early stopping or any other checkpoint selection could report, "
           "not a result; the learning curves show every evaluation, the one each end reads marked."),
        "",
    ]
    if len(runs) >= 2:
        lines += summary(ends, horizons, baseline, per_run)
        forest_png = png.with_name(f"{png.stem}-gains.png")
        forest(ends, forest_png, horizons, baseline, TARGET_GAIN[args.target], unit)
        lines += [f"![gains per variant]({forest_png.name})", ""]
    for variant, seeds in ends.items():
        target_cell = ("| target ", "---|") if per_run else ("", "")
        lines += [f"## {variant}", "", f"| seed | greedy: warm start | end | gain {target_cell[0]}| sampled: warm start "
                  "| end | gain |", f"|---:|---:|---:|---:|{target_cell[1]}---:|---:|---:|"]
        for seed, c in sorted(seeds.items()):
            cells = []
            for m in METRICS:
                start, end = c[m][0], c[m][horizons[variant]]
                cells += [f"{start:.3f}", f"{end:.3f}", f"{end - start:+.3f}"]
                if m == "eval_success" and per_run:
                    cells.append("met" if meets_target(start, end) else "not met")
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
        lines.append("")
        if args.best:
            lines += ["Chosen evaluations (" + unit + "): " + ", ".join(
                f"seed {seed}: {best_evaluation(c, horizons[variant])}" for seed, c in sorted(runs[variant].items())), ""]
        for m, label in METRICS.items():
            gains = seed_gains(seeds, m, horizons[variant])
            if len(gains) >= 2:
                e = mean_ci(gains)
                verdict = "" if per_run else f"; target {'met' if meets_mean_target(e) else 'not met'}"
                lines.append(f"- **{label} gain: {e.mean:+.3f} ± {e.half_width:.3f}** "
                             f"(95% CI [{e.lo:+.3f}, {e.hi:+.3f}], p = {e.p:.2g}, n = {len(gains)} seeds{verdict})")
            else:
                lines.append(f"- {label} gain: {gains[0]:+.3f} (one seed)")
        lines.append("")
    lines += paired(ends, horizons, baseline, unit, at)
    lines += since_lines
    if unfinished:
        lines += [f"Not finished at the horizon, left out: {', '.join(unfinished)}.", ""]
    lines += [f"![learning curves]({png.name})", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def last_evaluations(runs: dict[str, dict[int, dict]], horizon: int, k: int) -> list[int]:
    """The evaluations :func:`averaged_ends` averages at ``horizon`` (for the report's header): those of the
    first run evaluated there; none when no run is (only a baseline read at its own horizon)."""
    for seeds in runs.values():
        for c in seeds.values():
            if horizon in c["eval_success"]:
                return read_points(c, horizon, last=k)
    return []


def averaged_ends(runs: dict[str, dict[int, dict]], horizons: Horizons, k: int) -> dict[str, dict[int, dict]]:
    """``runs`` with each curve's value at its variant's horizon replaced by its endpoint success
    (:func:`oma.experiments.stats.endpoint`, docs/experiments.md#the-metrics): the mean of its last ``k``
    evaluations up to that horizon; ``k = 1`` leaves every value as it is. E.g. evaluations
    {0: .1, 15: .3, 30: .2, 45: .4}, horizon 45, k = 2: the end becomes (.2 + .4) / 2 = .3. Unlike
    ``endpoint``, a run with fewer than ``k`` evaluations after 0 is refused (ValueError naming it): the
    warm start averaged into the end would shrink the gain."""
    out: dict[str, dict[int, dict]] = {}
    for variant, seeds in runs.items():
        h = horizons[variant]
        for seed, c in seeds.items():
            new = {}
            for m, curve in c.items():
                its = sorted(curve)
                if len(endpoint_iterations([i for i in its if i > 0], h, k)) < k:
                    raise ValueError(f"{variant}/seed-{seed} has fewer than {k} {METRICS[m]} evaluations after 0 up to {h}")
                new[m] = {**curve, h: endpoint(its, [curve[i] for i in its], h, k)}
            out.setdefault(variant, {})[seed] = new
    return out


def best_evaluation(curve: dict[str, dict[int, float]], horizon: int) -> int:
    """The evaluation :func:`best_ends` picks: the highest greedy success after 0 up to ``horizon``, the
    earliest on a tie. E.g. greedy {0: .1, 15: .4, 30: .2, 45: .4}, horizon 45: 15."""
    its = [i for i in sorted(curve["eval_success"]) if 0 < i <= horizon]
    if not its:
        raise ValueError(f"no greedy evaluation after 0 up to {horizon}")
    return max(its, key=lambda i: (curve["eval_success"][i], -i))


def read_points(curve: dict[str, dict[int, float]], horizon: int, last: int = 1, best: bool = False) -> list[int]:
    """The evaluations a run's end is read from at ``horizon``: its :func:`best_evaluation` with ``best``,
    else its last ``last`` after 0 up to ``horizon`` (those :func:`averaged_ends` averages). E.g. greedy
    {0: .1, 15: .4, 30: .2, 45: .3}, horizon 45: [15] with ``best``, [30, 45] with ``last=2``."""
    if best:
        return [best_evaluation(curve, horizon)]
    return [int(i) for i in endpoint_iterations([i for i in sorted(curve["eval_success"]) if i > 0], horizon, last)]


def best_ends(runs: dict[str, dict[int, dict]], horizons: Horizons) -> dict[str, dict[int, dict]]:
    """``runs`` with each curve's value at its variant's horizon replaced by its value at the
    :func:`best_evaluation`, greedy and sampled alike (one checkpoint, chosen by greedy success). E.g. greedy
    {0: .1, 15: .4, 30: .2, 45: .3} and sampled {0: .2, 15: .3, 30: .5, 45: .6}, horizon 45: the ends become
    .4 and .3. A run with no sampled evaluation there is refused (ValueError naming it)."""
    out: dict[str, dict[int, dict]] = {}
    for variant, seeds in runs.items():
        h = horizons[variant]
        for seed, c in seeds.items():
            try:
                i = best_evaluation(c, h)
            except ValueError as e:
                raise ValueError(f"{variant}/seed-{seed}: {e}") from None
            missing = [METRICS[m] for m, curve in c.items() if i not in curve]
            if missing:
                raise ValueError(f"{variant}/seed-{seed} has no {' or '.join(missing)} evaluation at {i}, its best greedy one")
            out.setdefault(variant, {})[seed] = {m: {**curve, h: curve[i]} for m, curve in c.items()}
    return out


def gain(curve: dict[str, dict[int, float]], metric: str, horizon: int) -> float:
    """Held-out success at the horizon minus at iteration 0 (the warm start)."""
    return curve[metric][horizon] - curve[metric][0]


def seed_gains(seeds: dict[int, dict], metric: str, horizon: int, only: list[int] | None = None) -> list[float]:
    """One variant's :func:`gain` per seed, in seed order; ``only``: these seeds alone."""
    return [gain(seeds[k], metric, horizon) for k in (sorted(seeds) if only is None else only)]


def end_name(unit: str, horizon: int, last: int = 1, best: bool = False) -> str:
    """How the report reads a run's end at ``horizon``, for the paired tables' labels: e.g. "iteration
    375", "the mean of the last 3 evaluations up to iteration 375" (``--last 3``), "the best
    evaluation up to iteration 375" (``--best``)."""
    if best:
        return f"the best evaluation up to {unit} {horizon}"
    return f"{unit} {horizon}" if last == 1 else f"the mean of the last {last} evaluations up to {unit} {horizon}"


def paired(runs: dict[str, dict[int, dict]], horizons: Horizons, baseline: str, unit: str = "iteration",
           at: Callable[[int], str] | None = None) -> list[str]:
    """Each variant − ``baseline``, gain against gain and success against success, each at its end (``at``
    names it; default: the evaluation at its horizon), over the seeds both finished (the success
    difference is what a user of either gets; with the same warm starts it equals the gain difference).
    A baseline read at its own horizon is named with its reading too: "iteration 45 against iteration
    15", or "the mean of the last 3 evaluations up to iteration 45 against the mean of the last 3
    evaluations up to iteration 15"."""
    at = at or partial(end_name, unit)
    b = runs.get(baseline, {})
    lines: list[str] = []
    for variant, a in runs.items():
        seeds = sorted(set(a) & set(b))
        if variant == baseline or len(seeds) < 2:
            continue
        lines += [f"## {variant} − {baseline}, paired by seed ({len(seeds)} seeds)", ""]
        ha, hb = horizons[variant], horizons[baseline]
        where = at(ha) if ha == hb else f"{at(ha)} against {at(hb)}"
        for m, label in METRICS.items():
            for what, e in (("gain", paired_diff(seed_gains(a, m, ha, seeds), seed_gains(b, m, hb, seeds))),
                            (f"success at {where}", paired_diff([a[k][m][ha] for k in seeds], [b[k][m][hb] for k in seeds]))):
                lines.append(f"- {label} {what}: {e.mean:+.3f} ± {e.half_width:.3f} "
                             f"(95% CI [{e.lo:+.3f}, {e.hi:+.3f}], p = {e.p:.2g})")
        lines.append("")
    return lines


def since(runs: dict[str, dict[int, dict]], horizons: Horizons, start: int, unit: str = "iteration",
          at: Callable[[int], str] | None = None) -> list[str]:
    """Each variant's success at its horizon (its end as the report reads it, named by ``at`` as in
    :func:`paired`) minus its evaluation at ``start``, paired by run (:func:`paired_diff`): what the
    training after ``start`` added, and in how many runs it rose. E.g. greedy 0.50 → 0.60 and 0.40 →
    0.35 from ``start`` to the horizon: +0.025, higher in 1 of 2 runs. A run not evaluated at ``start``
    is refused (ValueError naming it)."""
    at = at or partial(end_name, unit)
    lines: list[str] = []
    for variant, seeds in runs.items():
        h, order = horizons[variant], sorted(seeds)
        for k in order:
            if start not in seeds[k]["eval_success"]:
                raise ValueError(f"{variant}/seed-{k} has no evaluation at {unit} {start}")
        if len(order) < 2:
            continue
        lines += [f"## {variant}: {at(h)} − {unit} {start}, paired by run ({len(order)} seeds)", ""]
        for m, label in METRICS.items():
            end, before = [seeds[k][m][h] for k in order], [seeds[k][m][start] for k in order]
            e = paired_diff(end, before)
            rose = sum(a > b for a, b in zip(end, before))
            lines.append(f"- {label} success: {e.mean:+.3f} ± {e.half_width:.3f} (95% CI [{e.lo:+.3f}, {e.hi:+.3f}], "
                         f"p = {e.p:.2g}); higher in {rose} of {len(order)} runs")
        lines.append("")
    return lines


def summary(runs: dict[str, dict[int, dict]], horizons: Horizons, baseline: str, per_run: bool = False) -> list[str]:
    """One table row per variant, the baseline first, then by greedy gain: its seeds, its gains, with
    ``per_run`` (the long preset's target) how many of its runs meet :func:`meets_target`, and (where
    ``baseline`` has runs) the gain differences paired by seed with it (:func:`paired_diff`) over the seeds
    both finished, blank for the baseline and where fewer than 2 seeds are shared. A paired CI's
    half-width is the smallest difference that study could tell from 0."""
    b = runs.get(baseline)
    head = ["variant", "seeds", "greedy gain", "sampled gain"] + (["runs meeting the target"] if per_run else [])
    if b is not None:
        head += [f"{label} gain − {baseline}'s, paired" for label in METRICS.values()]
    lines = ["## Summary", "", "| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for variant in _ranked(runs, horizons, baseline):
        a = runs[variant]
        cells = [str(mean_ci(seed_gains(a, m, horizons[variant]))) for m in METRICS]
        if per_run:
            h = horizons[variant]
            met = sum(meets_target(c["eval_success"][0], c["eval_success"][h]) for c in a.values())
            cells.append(f"{met} of {len(a)}")
        if b is not None:
            shared = sorted(set(a) & set(b)) if variant != baseline else []
            cells += [str(paired_diff(seed_gains(a, m, horizons[variant], shared),
                                      seed_gains(b, m, horizons[baseline], shared)))
                      if len(shared) >= 2 else "" for m in METRICS]
        lines.append(f"| {variant} | {', '.join(map(str, sorted(a)))} | " + " | ".join(cells) + " |")
    return lines + [""]


def _ranked(runs: dict[str, dict[int, dict]], horizons: Horizons, baseline: str) -> list[str]:
    """The baseline, then the other variants by mean greedy gain, the largest first."""
    def key(v: str) -> tuple[bool, float]:
        return v != baseline, -mean_ci(seed_gains(runs[v], "eval_success", horizons[v])).mean
    return sorted(runs, key=key)


def forest(runs: dict[str, dict[int, dict]], path: Path, horizons: Horizons, baseline: str, target: float,
           unit: str = "iteration") -> None:
    """Each variant's mean gain with its 95% CI, one row per variant in the summary's order (the baseline
    on top, its CI as a grey band), greedy and sampled side by side, with 0 and the target's gain marked;
    a filled marker is a CI that excludes 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = _ranked(runs, horizons, baseline)
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 1.2 + 0.32 * len(names)), sharey=True)
    y = list(range(len(names)))[::-1]
    for ax, (m, label) in zip(axes, METRICS.items()):
        for yi, variant in zip(y, names):
            e = mean_ci(seed_gains(runs[variant], m, horizons[variant]))
            color = "black" if variant == baseline else "tab:blue"
            if variant == baseline and e.n > 1:
                ax.axvspan(e.lo, e.hi, color="0.85", zorder=0)
            ax.errorbar(e.mean, yi, xerr=e.half_width if e.n > 1 else 0.0, fmt="o", color=color, capsize=3,
                        mfc=color if e.significant else "white")
        ax.axvline(0.0, color="0.5", lw=0.8)
        ax.axvline(target, color="tab:red", lw=1, ls="--", label=f"target {target:+.2f}")
        ax.set_title(f"{label} gain, {unit} {horizons.horizon} − 0", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, [f"{v} (n={len(runs[v])}{'' if horizons[v] == horizons.horizon else f', {unit} {horizons[v]}'})"
                           for v in names], fontsize=8)
    axes[0].set_ylim(-0.7, len(names) - 0.3)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(runs: dict[str, dict[int, dict]], path: Path, horizon: int, unit: str = "iteration",
         reads: Callable[[str, dict], list[int]] | None = None, read_label: str = "") -> None:
    """Each run's learning curves, greedy and sampled, with each variant's mean over its seeds. ``reads``
    (variant, a run's curves) -> the evaluations the report reads that run's end from, marked on its curves
    and named ``read_label`` in the legend (``--last`` and ``--best``: the tables read other points than the
    horizon's, and the plot shows which)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    named = {"row+native": "tab:gray", "OA+MA": "tab:red"}
    others = iter(["tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink"])
    colors = {v: named.get(v) or next(others, "black") for v in runs}  # one colour per variant, in both panels
    for ax, (m, label) in zip(axes, METRICS.items()):
        for variant, seeds in runs.items():
            color = colors[variant]
            its = sorted(set.intersection(*(set(c[m]) for c in seeds.values()))) if seeds else []
            for c in seeds.values():
                ax.plot(sorted(c[m]), [c[m][i] for i in sorted(c[m])], color=color, alpha=0.25, lw=1)
                if reads is not None:
                    read = [i for i in reads(variant, c) if i in c[m]]  # the tables refuse a run that lacks one
                    ax.plot(read, [c[m][i] for i in read], ls="", marker="D", ms=4, color=color, alpha=0.8)
            if its:
                mean = [sum(c[m][i] for c in seeds.values()) / len(seeds) for i in its]
                ax.plot(its, mean, color=color, lw=2.5, marker="o", label=f"{variant} (mean of {len(seeds)})")
        if reads is not None:  # one legend entry for the marks of every variant
            ax.plot([], [], ls="", marker="D", ms=4, color="0.3", label=read_label)
        ax.set_title(f"held-out {label} success")
        ax.set_xlabel("RL iteration" if unit == "iteration" else f"{unit}s")
        ax.set_xlim(0, horizon)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success (128 tasks)")
    if len(runs) <= 3:
        axes[0].legend(fontsize=8)
        fig.tight_layout()
    else:  # a legend this long would cover the curves: put it below both panels
        legend_height = 0.25 * math.ceil(len(runs) / 2)  # inches: two entries per line
        fig.set_figheight(3.6 + legend_height)
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, legend_height / (3.6 + legend_height) + 0.02, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
