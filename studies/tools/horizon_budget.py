"""What a run's time buys when it evaluates less often: each run's measured phase times re-summed for
other schedules of iterations and held-out evaluations (studies/longer-preset/journal.md#target-2s-preset-since-2026-12-06-its-evaluation-time-spent-on-iterations-10-of-10-runs-5-seeds).

A run trained to iteration H with evaluations every E spends, besides its warm start (the same in
every schedule, so left out), the time of its H iterations plus that of its evaluations. Both are in
its metrics.jsonl: iteration i's loop takes ``time_rollout + time_advantages + time_update`` plus, where
it does not evaluate, ``time_logp_ref``; an evaluation at i > 0 takes ``time_eval`` plus that
iteration's ``time_logp_ref`` (with ``algo.kl_coef`` 0, the reference pass runs only to log the KL to the
warm start at evaluations; the ~2 ms of bookkeeping it also times is counted with the evaluation), and
the one at iteration 0 its ``time_eval``. A schedule H:E evaluates where the loop does: at 0, at every
multiple of E up to H, and at H. Its cost in a run is the sum of those measured times, so every
iteration up to H and every evaluation the schedule makes must have been measured in that run (a run
that evaluated every 15 prices every schedule whose evaluations fall on multiples of 15); anything else
is refused naming the run and the iteration. Nothing is extrapolated and nothing is timed here:
training does not depend on the schedule (evaluations draw from their own generator), so a shorter
schedule's iterations are the run's own.

``--schedule`` names the reference first, then the candidates. ``--longest E`` adds, for evaluations
every E, the longest horizon (a multiple of ``--step``, up to the runs' shortest) that costs no more
than the reference in every run, and with ``--out`` a plot of each run's cost against the horizon
(<out>-ratios.png). Target 2's preset until 2026-12-06, 375 iterations evaluated every 15, against 420
evaluated every 60 (its preset since), over the 24 runs of seeds 0-11 trained to 525 (studies/longer-preset/learning-grpo-horizon-budget.md):

    .venv/bin/python studies/tools/horizon_budget.py studies/longer-preset/evidence/2026-12-05-grpo-525 \\
        studies/longer-preset/evidence/2026-12-05-grpo-525-seeds-8-9 studies/longer-preset/evidence/2026-12-06-grpo-525-seeds-10-11 \\
        --schedule 375:15 --schedule 420:60 --schedule 450:75 --longest 60 --command TEXT \\
        --out studies/longer-preset/learning-grpo-horizon-budget.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from oma.experiments.plan import study_runs
from oma.train import evaluates, read_metrics
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the benchmark harness it reuses
from throughput import publish

LOOP = ("time_rollout", "time_advantages", "time_update")
"""The phases of one iteration's loop that run whatever the schedule."""


def parse_schedule(text: str) -> tuple[int, int]:
    """``"H:E"`` → (H, E): H iterations, evaluations every E (both positive integers)."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise SystemExit(f"--schedule {text!r}: expected HORIZON:EVERY, two positive integers (e.g. 420:60)")
    return int(parts[0]), int(parts[1])


def evaluation_iterations(horizon: int, every: int) -> list[int]:
    """Where a run of ``horizon`` iterations evaluating every ``every`` evaluates (oma.train.loop.evaluates)."""
    return [it for it in range(horizon + 1) if evaluates(it, every, horizon)]


def phase_times(records: list[dict], run: str) -> tuple[dict[int, float], dict[int, float]]:
    """``(loop, evaluation)``: the measured seconds of each iteration's loop, without its evaluation, and of
    each evaluation, keyed by iteration. A record missing a phase time is refused naming the run and key."""
    loop: dict[int, float] = {}
    evaluation: dict[int, float] = {}
    for r in records:
        it = int(r["iteration"])
        evaluated = "time_eval" in r
        keys = ((*LOOP, "time_logp_ref") if it > 0 else ()) + (("time_eval",) if evaluated else ())
        missing = [k for k in keys if k not in r]
        if missing:
            raise SystemExit(f"{run}: iteration {it} has no {', '.join(missing)}")
        if it > 0:
            loop[it] = sum(float(r[k]) for k in LOOP) + (0.0 if evaluated else float(r["time_logp_ref"]))
        if evaluated:
            evaluation[it] = float(r["time_eval"]) + (float(r["time_logp_ref"]) if it > 0 else 0.0)
    return loop, evaluation


def cost(loop: dict[int, float], evaluation: dict[int, float], horizon: int, every: int, run: str) -> float:
    """Seconds the run spent on ``horizon`` iterations and the evaluations of schedule horizon:every."""
    missing_it = [i for i in range(1, horizon + 1) if i not in loop]
    if missing_it:
        raise SystemExit(f"{run}: no timing of iteration {missing_it[0]} (schedule {horizon}:{every})")
    needed = evaluation_iterations(horizon, every)
    missing_ev = [i for i in needed if i not in evaluation]
    if missing_ev:
        raise SystemExit(f"{run}: no evaluation timed at iteration {missing_ev[0]} (schedule {horizon}:{every} "
                         f"evaluates at {', '.join(map(str, needed))})")
    return sum(loop[i] for i in range(1, horizon + 1)) + sum(evaluation[i] for i in needed)


def costs(runs: dict[str, tuple[dict[int, float], dict[int, float]]], schedules: list[tuple[int, int]]
          ) -> dict[str, list[float]]:
    """Each run's cost of each schedule, in the schedules' order."""
    return {run: [cost(loop, ev, h, e, run) for h, e in schedules] for run, (loop, ev) in runs.items()}


def horizon_costs(runs: dict[str, tuple[dict[int, float], dict[int, float]]], reference: tuple[int, int],
                  every: int, horizons: list[int]) -> dict[str, tuple[float, list[float]]]:
    """Each run's cost of ``reference`` and of each horizon with evaluations every ``every``."""
    return {run: (cost(loop, ev, *reference, run), [cost(loop, ev, h, every, run) for h in horizons])
            for run, (loop, ev) in runs.items()}


def last_iteration(runs: dict[str, tuple[dict[int, float], dict[int, float]]]) -> int:
    """The last iteration every run measured: the shortest run's end."""
    return min(max(loop) for loop, _ in runs.values())


def longest(runs: dict[str, tuple[dict[int, float], dict[int, float]]], reference: tuple[int, int], every: int,
            step: int) -> int | None:
    """The longest horizon, a multiple of ``step`` up to the shortest run's last iteration, whose schedule
    with evaluations every ``every`` costs no more than ``reference`` in every run; None if none does."""
    horizons = list(range(step, last_iteration(runs) + 1, step))
    table = horizon_costs(runs, reference, every, horizons).values()
    return max((h for j, h in enumerate(horizons) if all(costs[j] <= base for base, costs in table)), default=None)


def plot(runs: dict[str, tuple[dict[int, float], dict[int, float]]], reference: tuple[int, int], every: int,
         step: int, found: int | None, path: Path) -> None:
    """Each run's cost of horizon H with evaluations every ``every``, as a ratio to the reference's, for H
    from the reference's horizon to the shortest run's end in steps of ``step``; 1 and the longest horizon
    that fits every run marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = list(range(reference[0] - reference[0] % step, last_iteration(runs) + 1, step))
    fig, ax = plt.subplots(figsize=(7, 4))
    for run, (base, costs) in horizon_costs(runs, reference, every, horizons).items():
        ax.plot(horizons, [c / base for c in costs],
                color="tab:red" if run.startswith("OA+MA") else "tab:gray", alpha=0.5, lw=1)
    ax.axhline(1.0, color="black", lw=0.8)
    if found is not None:
        ax.axvline(found, color="tab:blue", ls="--", lw=1, label=f"longest that fits every run: {found}")
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel(f"RL iterations, evaluated every {every}")
    ax.set_ylabel(f"cost / {reference[0]} iterations evaluated every {reference[1]}")
    ax.set_title(f"Each run's time re-summed ({len(runs)} runs; OA+MA red, row+native grey)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(table: dict[str, list[float]], schedules: list[tuple[int, int]], found: tuple[int, int | None] | None,
           command: str, figure: str | None = None) -> str:
    """The Markdown page: each run's cost per schedule and its ratio to the reference, then the range."""
    names = [f"{h} iterations, {len(evaluation_iterations(h, e))} evaluations (every {e})" for h, e in schedules]
    lines = ["# What target 2's run time buys with fewer evaluations", "",
             f"Command: `{command}`", "",
             "Each run's measured seconds of its iterations and evaluations (warm start left out), re-summed for "
             "each schedule; the reference is the first. Nothing is timed or extrapolated: every iteration and "
             "evaluation counted was measured in that run.", "",
             "| run | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for run, row in table.items():
        cells = [f"{row[0]:,.0f} s"] + [f"{c:,.0f} s ({c / row[0]:.3f}×)" for c in row[1:]]
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    lines += ["", "| schedule | runs | median cost | ratio to the reference: min | median | max | runs at most the reference |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for j, name in enumerate(names):
        ratios = [row[j] / row[0] for row in table.values()]
        at_most = sum(r <= 1.0 for r in ratios)
        lines.append(f"| {name} | {len(ratios)} | {statistics.median(row[j] for row in table.values()):,.0f} s | "
                     f"{min(ratios):.3f} | {statistics.median(ratios):.3f} | {max(ratios):.3f} | {at_most} of {len(ratios)} |")
    if found is not None:
        every, horizon = found
        h0, e0 = schedules[0]
        lines += ["", f"**Longest horizon with evaluations every {every}** that costs no more than {h0} iterations "
                      f"evaluated every {e0} in every run: "
                      + (f"**{horizon} iterations**." if horizon is not None else "none.")]
    if figure:
        lines += ["", f"![each run's cost against the horizon]({figure})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("studies", nargs="+", type=Path, help="folders of DIR/<variant>/seed-K runs, read as one study")
    parser.add_argument("--schedule", action="append", required=True,
                        help="HORIZON:EVERY; the first is the reference (repeat for candidates)")
    parser.add_argument("--longest", type=int, default=None, help="evaluations every E: find the longest horizon")
    parser.add_argument("--step", type=int, default=15, help="horizons searched by --longest are multiples of this")
    parser.add_argument("--command", default="", help="the command to print on the page")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    schedules = [parse_schedule(s) for s in args.schedule]
    for name, value in (("--longest", args.longest), ("--step", args.step)):
        if value is not None and value <= 0:
            raise SystemExit(f"{name} {value}: expected a positive integer")
    try:
        found, _ = study_runs(args.studies)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    runs = {run: phase_times(read_metrics(path), run) for run, path in found.items()}
    table = costs(runs, schedules)
    best = None if args.longest is None else (args.longest, longest(runs, schedules[0], args.longest, args.step))
    figure = None
    if best is not None and args.out:
        path = Path(args.out).with_name(Path(args.out).stem + "-ratios.png")
        plot(runs, schedules[0], best[0], args.step, best[1], path)
        figure = path.name
    command = args.command or " ".join(["studies/tools/horizon_budget.py", *argv])
    publish(report(table, schedules, best, command, figure), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
