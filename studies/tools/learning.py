"""Does RL learn? Held-out success before and after RL, across seeds, from an empty warm-start cache.

Run by hand (results committed in studies/what-limits-learning/learning-default.md):

    .venv/bin/python studies/tools/learning.py --seeds 5 --jobs 2 --out studies/what-limits-learning/learning-default.md

Each seed k runs `oma train [CONFIG] seed=k` in its own process with a fresh, empty warm-start
cache, exactly as a new user's first `oma train` would (demonstrations, warm start, RL, evaluation).
From each run's summary.json: held-out greedy and sampled success after the warm start (iteration
0) and after RL, and the run's wall time. The gain (end − start) is reported per seed and as mean
± 95% Student-t CI over seeds (oma.experiments.stats.mean_ci), with its p-value. With ``--jobs 2``
two seeds share the two cores (one torch thread each), so their wall times are not a solo run's:
``--solo`` times one more run alone, with the config's own thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("eval_success", "eval_sampled_success")
LABELS = {"eval_success": "greedy", "eval_sampled_success": "sampled"}


def train(config: str | None, overrides: list[str], out_dir: Path, cache: Path) -> dict:
    """Run `oma train` in a fresh process; its summary.json plus the wall time seen from outside."""
    args = [sys.executable, "-m", "oma.cli", "train", *([config] if config else []), *overrides,
            f"out_dir={out_dir}", f"warm_start.cache_dir={cache}", "tensorboard=false"]
    t0 = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    summary = json.loads((out_dir / "summary.json").read_text())
    return {**summary, "process_wall_s": time.perf_counter() - t0}


def plot(results: dict[int, dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4), sharey=True)
    for ax, key in zip(axes, METRICS):
        for seed, r in sorted(results.items()):
            ax.plot([0, 1], [r[f"{key}_start"], r[f"{key}_end"]], marker="o", color="tab:blue", alpha=0.6)
            ax.annotate(f"s{seed}", (1.02, r[f"{key}_end"]), fontsize=7, va="center")
        starts = [r[f"{key}_start"] for r in results.values()]
        ends = [r[f"{key}_end"] for r in results.values()]
        ax.plot([0, 1], [sum(starts) / len(starts), sum(ends) / len(ends)], marker="s", color="black", lw=2.5,
                label="mean over seeds")
        ax.set_xticks([0, 1], ["warm start", "after RL"])
        ax.set_xlim(-0.15, 1.2)
        ax.set_title(f"held-out {LABELS[key]} success")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    from oma.experiments.stats import mean_ci
    from oma.train import load_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="preset; without one, the default job")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at once (each with 2/jobs torch threads)")
    parser.add_argument("--solo", action="store_true", help="also time one run alone (seed 0, own threads)")
    parser.add_argument("--out", required=True, help="Markdown report; the PNG goes beside it")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    threads = [f"threads={max(1, cfg.threads // args.jobs)}"] if args.jobs > 1 else []
    with tempfile.TemporaryDirectory(prefix="oma-learning-") as tmp:
        tmp = Path(tmp)

        def one(seed: int) -> tuple[int, dict]:
            return seed, train(args.config, [*args.overrides, f"seed={seed}", *threads], tmp / f"run-{seed}",
                               tmp / f"cache-{seed}")

        with ThreadPoolExecutor(args.jobs) as pool:
            results = dict(pool.map(one, range(args.seeds)))
        solo = train(args.config, args.overrides, tmp / "solo", tmp / "cache-solo") if args.solo else None

    out = Path(args.out)
    png = out.with_suffix(".png")
    name = args.config or "the default job (`oma train`)"
    plot(results, png, f"{name} {' '.join(args.overrides)}: {args.seeds} seeds, {cfg.env.eval_tasks} held-out tasks")
    gains = {k: mean_ci([r[f"{k}_end"] - r[f"{k}_start"] for r in results.values()]) for k in METRICS}
    command = " ".join(["studies/tools/learning.py", *([args.config] if args.config else []), *args.overrides,
                        f"--seeds {args.seeds}", f"--jobs {args.jobs}", *(["--solo"] if args.solo else []), f"--out {args.out}"])
    lines = [
        f"Command: `.venv/bin/python {command}`",
        "",
        f"Config: {name} {' '.join(args.overrides)}; {cfg.iterations} RL iterations of {cfg.env.tasks_per_iter} tasks x "
        f"{cfg.env.group_size} episodes; held-out success on {cfg.env.eval_tasks} tasks (one episode each). Every seed "
        f"starts from an empty warm-start cache{'; ' + str(args.jobs) + ' seeds at a time, one torch thread each' if args.jobs > 1 else ''}.",
        "",
        "| seed | greedy: warm start | after RL | gain | sampled: warm start | after RL | gain | wall time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed, r in sorted(results.items()):
        cells = []
        for k in METRICS:
            cells += [f"{r[f'{k}_start']:.3f}", f"{r[f'{k}_end']:.3f}", f"{r[f'{k}_end'] - r[f'{k}_start']:+.3f}"]
        lines.append(f"| {seed} | {' | '.join(cells)} | {r['process_wall_s']:.0f} s |")
    lines += [""]
    for k in METRICS:
        g = gains[k]
        lines.append(f"- **{LABELS[k]} gain: {g.mean:+.3f} ± {g.half_width:.3f}** (95% CI [{g.lo:+.3f}, {g.hi:+.3f}], "
                     f"p = {g.p:.2g}, n = {g.n} seeds).")
    if solo is not None:
        lines.append(f"- One run alone (seed {cfg.seed}, {cfg.threads} threads, empty cache): **{solo['process_wall_s']:.0f} s** "
                     f"wall time; greedy {solo['eval_success_start']:.3f} → {solo['eval_success_end']:.3f}, "
                     f"sampled {solo['eval_sampled_success_start']:.3f} → {solo['eval_sampled_success_end']:.3f}.")
    lines += ["", f"![before and after RL, per seed]({png.name})", ""]
    text = "\n".join(lines)
    print(text)
    out.write_text(text)
    (out.with_suffix(".json")).write_text(json.dumps({"command": command, "results": results}, indent=2))


if __name__ == "__main__":
    main()
