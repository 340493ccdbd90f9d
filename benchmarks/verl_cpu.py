"""Seconds per verl 0.9.1 training step on CPU, oma's trainer against verl's own, at dp = 1 and 2.

Runs ``oma verl-smoke`` (tiny Qwen2, 4 prompts × 4 rollouts, multi-turn episodes, docs/verl.md#verl-on-cpu)
with ``--trainer oma`` (oma_sync, OA + uniform MA, token-sum) and ``--trainer verl`` (verl's sync
trainer, grpo + token-mean), alternating, and writes a Markdown table. The first step of a run
(start-up, first weight sync) is left out of the per-step time.

Usage: .venv/bin/python benchmarks/verl_cpu.py [--steps 5] [--repeats 1] [--out benchmarks/verl_cpu.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def smoke(trainer: str, dp: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="oma-verl-bench-") as work:
        cmd = [sys.executable, "-m", "oma.cli", "verl-smoke", "--steps", str(steps), "--dp", str(dp),
               "--trainer", trainer, "--out", work, "--timeout", "1500"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    if out.returncode != 0:
        raise RuntimeError(f"{trainer} dp={dp} failed: {result}")
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default="benchmarks/verl_cpu.md")
    args = p.parse_args(argv)
    rows: dict[tuple[int, str], list[float]] = {}
    runs: list[dict] = []
    for _ in range(args.repeats):
        for dp in (1, 2):
            for trainer in ("oma", "verl"):
                r = smoke(trainer, dp, args.steps)
                runs.append(r)
                rows.setdefault((dp, trainer), []).extend(r["step_times_s"][1:])
                print(f"dp={dp} {trainer}: steps {r['step_times_s']}, wall {r['wall_time_s']} s", flush=True)
    lines = [
        "# verl 0.9.1 on CPU: seconds per training step, oma's trainer vs verl's",
        "",
        f"Command: `.venv/bin/python benchmarks/verl_cpu.py --steps {args.steps} --repeats {args.repeats}`",
        f"(machine: {platform.machine()}, the shared 2-core CPU; runs alternate oma / verl, so both see the",
        "same load). Each run: `oma verl-smoke` (tiny Qwen2, 4 prompts × 4 rollouts of up to 4 turns, 2 PPO",
        "mini-batches per step, the `hf` rollout), docs/verl.md#verl-on-cpu. Per-step time: verl's",
        "`timing_s/step`, steps 2..N (step 1 includes the first weight sync and warm-up).",
        "",
        "| dp | trainer | steps timed | s/step, mean | median | min | max |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (dp, trainer), times in sorted(rows.items()):
        label = "oma (`oma_sync`, OA + uniform MA, token-sum)" if trainer == "oma" else "verl (`sync`, grpo, token-mean)"
        lines.append(f"| {dp} | {label} | {len(times)} | {statistics.mean(times):.2f} | {statistics.median(times):.2f} "
                     f"| {min(times):.2f} | {max(times):.2f} |")
    lines += ["", "| dp | oma / verl, mean s/step | oma / verl, median |", "|---:|---:|---:|"]
    for dp in (1, 2):
        o, v = rows[(dp, "oma")], rows[(dp, "verl")]
        lines.append(f"| {dp} | {statistics.mean(o) / statistics.mean(v):.2f} | "
                     f"{statistics.median(o) / statistics.median(v):.2f} |")
    first = {(r["dp"], r["trainer"]): r for r in runs}
    lines += ["", "Whole runs (start-up included), wall seconds: " + ", ".join(
        f"dp {dp} {t} {first[(dp, t)]['wall_time_s']}" for dp, t in sorted(first)) + "."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
