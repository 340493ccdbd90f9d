"""The 5-seed screen of an average of the weights and of a larger learning rate (studies/weight-average/journal.md#an-average-of-the-weights).

Reads DIR/<arm>/seed-K run folders trained with the screen's patch (``ema-screen.patch`` beside them),
whose last evaluation also holds ``ema{β}_eval_success`` and ``ema{β}_eval_sampled_success``: the
same 128 held-out tasks played by the exponential average of the run's weights (θ̄_0 = θ_0, so each
average starts from the warm start's evaluation at iteration 0). Writes the gains (end − warm start)
of the live weights and of each average, the averages' paired differences with the live weights of
the same run, the arms' paired difference, and a forest plot (<out>-gains.png):

    .venv/bin/python studies/tools/ema_screen.py studies/weight-average/evidence/2026-12-05-ema-lr-screen \\
        --horizon 75 --baseline 'lr 3e-4' --out studies/weight-average/learning-default-ema-screen.md

With ``--live LIVE``, each run of DIR was trained with ``optim.ema`` = β (its config.json), so its own
evaluations are the average's, and LIVE/<arm>/seed-K is the same run's training without the average
(an average started at a checkpoint of it, studies/tools/start_average.py): its evaluations are the live
weights'. The two runs' training metrics must be equal at every iteration both hold, or the pairing is
refused. ``--pool`` adds each average's paired difference over every run of every arm
(studies/longer-preset/learning-grpo-375-ema-vs-live.md). More seeds trained later into other folders are read
with the first ones by naming every folder, in DIR and in ``--live``
(studies/longer-preset/learning-grpo-375-ema-vs-live-8-seeds.md):

    .venv/bin/python studies/tools/ema_screen.py studies/longer-preset/evidence/2026-12-05-grpo-375-ema \\
        --live studies/longer-preset/evidence/2026-12-05-grpo-375 --horizon 375 --baseline row+native --pool \\
        --title TEXT --command TEXT --out studies/longer-preset/learning-grpo-375-ema-vs-live.md
    .venv/bin/python studies/tools/ema_screen.py studies/longer-preset/evidence/2026-12-05-grpo-375-ema \\
        studies/longer-preset/evidence/2026-12-05-grpo-375-ema-seeds-5-7 --live studies/longer-preset/evidence/2026-12-05-grpo-375 \\
        studies/longer-preset/evidence/2026-12-05-grpo-375-seeds-5-7 --horizon 375 --baseline row+native --pool \\
        --title TEXT --command TEXT --out studies/longer-preset/learning-grpo-375-ema-vs-live-8-seeds.md
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from oma.experiments.plan import study_runs
from oma.experiments.stats import Estimate, mean_ci, paired_diff
from oma.train import read_metrics

MODES = {"eval_success": "greedy", "eval_sampled_success": "sampled"}
EMA_KEY = re.compile(r"^ema([0-9.]+)_eval_success$")


NOT_TRAINING = ("time_", "tokens_per_s", "rows_per_s", "eval_", "warm_start")
"""Record keys that are not training: timings, evaluations and the warm start's bookkeeping."""


def _records(run_dir: Path, horizon: int) -> dict[int, dict]:
    records = {r["iteration"]: r for r in read_metrics(run_dir)}
    if horizon not in records or 0 not in records:
        raise SystemExit(f"{run_dir}: no evaluation at iteration 0 and {horizon}")
    return records


def _training(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(NOT_TRAINING)}


def read_run(run_dir: Path, horizon: int, live_dir: Path | None = None) -> dict[str, dict[str, float]]:
    """``{weights: {mode: gain}}`` for the live weights (``"live"``) and each average ``"EMA β"``: read from
    one run's ``ema{β}_*`` keys, or with ``live_dir`` from two runs of the same training (module docstring)."""
    records = _records(run_dir, horizon)
    start, end = records[0], records[horizon]
    if live_dir is None:
        betas = sorted(m.group(1) for m in map(EMA_KEY.match, end) if m)
        out = {"live": {mode: end[mode] - start[mode] for mode in MODES}}
        for beta in betas:
            out[f"EMA {beta}"] = {mode: end[f"ema{beta}_{mode}"] - start[mode] for mode in MODES}
        return out
    beta = json.loads((run_dir / "config.json").read_text())["optim"].get("ema", 0.0)
    if not beta:
        raise SystemExit(f"{run_dir}: optim.ema is 0 in its config.json; --live pairs runs that average their weights")
    live = _records(live_dir, horizon)
    for it in sorted(set(records) & set(live)):
        if _training(records[it]) != _training(live[it]):
            raise SystemExit(f"{run_dir} and {live_dir} trained differently (iteration {it}); they cannot be paired")
    if any(start[mode] != live[0][mode] for mode in MODES):
        raise SystemExit(f"{run_dir} and {live_dir} start from different warm starts (iteration 0's evaluations)")
    return {"live": {mode: live[horizon][mode] - start[mode] for mode in MODES},
            f"EMA {beta}": {mode: end[mode] - start[mode] for mode in MODES}}


def read_arms(roots: list[Path], horizon: int,
              live_roots: list[Path] | None = None) -> dict[str, dict[int, dict[str, dict[str, float]]]]:
    """``{arm: {seed: read_run(...)}}`` over every ROOT/<arm>/seed-K of ``roots`` (more seeds of one study
    trained into several folders: :func:`oma.experiments.plan.study_runs`), each paired with the one
    ``live_roots`` folder that holds the same <arm>/seed-K. Refused (SystemExit naming the folders): a
    folder without runs, one arm's seed in two of ``roots``, and a run whose live twin is in none or in
    two of ``live_roots``."""
    try:
        found, _ = study_runs(roots)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    arms: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    for key, run in found.items():  # seeds are put in order below, across every folder
        arm, seed = run.parent.name, int(run.name.split("-")[1])
        live = None
        if live_roots is not None:
            twins = [d / key for d in live_roots if (d / key).is_dir()]
            if len(twins) != 1:
                raise SystemExit(f"{run}: expected its live twin {key} in exactly one of "
                                 f"{', '.join(map(str, live_roots))}, found {len(twins)}")
            live = twins[0]
        arms.setdefault(arm, {})[seed] = read_run(run, horizon, live)
    return {arm: dict(sorted(seeds.items())) for arm, seeds in sorted(arms.items())}


TITLE = "an average of the weights, and a larger learning rate, in the default job (5-seed screen)"


def report(arms, horizon: int, baseline: str, command: str, title: str = TITLE,
           pool: bool = False) -> tuple[str, list[tuple[str, str, Estimate]]]:
    lines = [f"# Benchmark: {title}",
             "", f"Command: `{command}`", "",
             f"Held-out success on 128 tasks at iteration {horizon}; each gain is end − the seed's warm start "
             "(iteration 0), mean ± 95% Student-t CI half-width over seeds. An average's paired difference is "
             "with the live weights of the same run, on the same tasks.", ""]
    forest = []
    for arm, runs in arms.items():
        seeds = sorted(runs)
        weights = list(runs[seeds[0]])
        lines += [f"## {arm} (seeds {seeds[0]}–{seeds[-1]})", "",
                  "| weights | greedy gain | sampled gain | greedy − live, paired | sampled − live, paired |",
                  "|---|---:|---:|---:|---:|"]
        for w in weights:
            row = [w]
            for mode in MODES:
                row.append(str(mean_ci([runs[s][w][mode] for s in seeds])))
            for mode in MODES:
                if w == "live":
                    row.append("")
                    continue
                d = paired_diff([runs[s][w][mode] for s in seeds], [runs[s]["live"][mode] for s in seeds])
                row.append(str(d))
                forest.append((arm, f"{w} − live, {MODES[mode]}", d))
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", "| seed | " + " | ".join(f"{w} greedy / sampled" for w in weights) + " |",
                  "|---:|" + "---:|" * len(weights)]
        for s in seeds:
            lines.append(f"| {s} | " + " | ".join(
                f"{runs[s][w]['eval_success']:+.3f} / {runs[s][w]['eval_sampled_success']:+.3f}" for w in weights) + " |")
        lines.append("")
    if pool:
        every = [(arm, s) for arm, runs in arms.items() for s in sorted(runs)]
        averages = [w for w in next(iter(arms.values()))[every[0][1]] if w != "live"]
        lines += [f"## Every arm's runs pooled ({len(every)} runs)", "",
                  "| weights | greedy − live, paired | sampled − live, paired |", "|---|---:|---:|"]
        for w in averages:
            row = [w]
            for mode in MODES:
                d = paired_diff([arms[a][s][w][mode] for a, s in every], [arms[a][s]["live"][mode] for a, s in every])
                row.append(str(d))
                forest.append(("pooled", f"{w} − live, {MODES[mode]}", d))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    others = [a for a in arms if a != baseline]
    if baseline in arms and others:
        lines += [f"## The arms against {baseline}, live weights, paired by seed", "",
                  "| arm | greedy − baseline | sampled − baseline |", "|---|---:|---:|"]
        for arm in others:
            common = sorted(set(arms[arm]) & set(arms[baseline]))
            row = [arm]
            for mode in MODES:
                d = paired_diff([arms[arm][s]["live"][mode] for s in common],
                                [arms[baseline][s]["live"][mode] for s in common])
                row.append(str(d))
                forest.append((arm, f"{arm} − {baseline}, {MODES[mode]}", d))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines), forest


def plot(forest: list[tuple[str, str, Estimate]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.32 * len(forest) + 1.2))
    for y, (arm, label, e) in enumerate(reversed(forest)):
        ax.errorbar(e.mean, y, xerr=e.half_width, fmt="o", color="C0" if "greedy" in label else "C1", capsize=3)
    ax.set_yticks(range(len(forest)), [f"{arm}: {label}" for arm, label, _ in reversed(forest)], fontsize=7)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("paired difference in held-out success (mean ± 95% CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", nargs="+", help="DIR/<arm>/seed-K run folders; several folders are one study")
    p.add_argument("--horizon", type=int, default=75)
    p.add_argument("--baseline", default="lr 3e-4", help="the arm the others are compared with")
    p.add_argument("--out", default="studies/weight-average/learning-default-ema-screen.md")
    p.add_argument("--command", default="OMA_SCREEN_EMA=0.9,0.97,0.99 oma train seed=K [optim.lr=0.0005] "
                                        "warm_start.cache_dir=<the seed's warm start> (ema-screen.patch applied)")
    p.add_argument("--live", nargs="+", help="LIVE/<arm>/seed-K: the same runs' training without the average "
                                             "(module docstring), in one folder or several")
    p.add_argument("--pool", action="store_true", help="also pair each average with the live weights over every arm's runs")
    p.add_argument("--title", default=TITLE)
    args = p.parse_args(argv)
    out = Path(args.out)
    arms = read_arms([Path(r) for r in args.runs_dir], args.horizon, [Path(r) for r in args.live] if args.live else None)
    text, forest = report(arms, args.horizon, args.baseline, args.command, args.title, args.pool)
    png = out.with_name(out.stem + "-gains.png")
    text += f"\n![paired differences]({png.name})\n"
    out.write_text(text)
    plot(forest, png)
    print(f"wrote {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
