"""Seconds per real training step on CPU, each host with OMA on against its native path, in one run.

* verl 0.9.1 (``.venv/bin/oma verl-smoke``, docs/verl.md#verl-on-cpu; tiny Qwen2, 4 prompts × 4 rollouts of
  up to 4 turns, 2 PPO mini-batches a step): oma's trainer (``oma_sync``, OA + uniform MA, token-sum) against
  verl's own (``sync``, grpo, token-mean), at dp = 1 and 2.
* SkyRL 0.4.0 (``.venv-skyrl/bin/oma skyrl-smoke``, docs/skyrl.md#skyrl-on-cpu; the same tiny model, 16
  step-wise episodes of up to 4 turns): oma's trainer with OA + uniform MA against the same trainer with
  ``accounting=trajectory mass=native``, which is SkyRL's own computation (docs/skyrl.md#how-it-works).

Runs alternate OMA on / native, so both see the same load on the shared machine. Per-step time: each host's
own step timing, steps 2..N (step 1 includes start-up and the first weight sync).

    python benchmarks/cpu_steps.py [--steps 5] [--repeats 1] [--out benchmarks/cpu_steps.md]

Each host runs in its own environment (``make install`` builds both); this script imports neither.
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

ROOT = Path(__file__).resolve().parents[1]

# (host, label of a row, the command's arguments after `oma`) for OMA on, then the host's native path
ARMS = {
    "verl": (ROOT / ".venv/bin/oma", [
        ("oma (`oma_sync`, OA + uniform MA, token-sum)", ["verl-smoke", "--trainer", "oma"]),
        ("verl (`sync`, grpo, token-mean)", ["verl-smoke", "--trainer", "verl"])]),
    "SkyRL": (ROOT / ".venv-skyrl/bin/oma", [
        ("oma's trainer, OA + uniform MA", ["skyrl-smoke", "--accounting", "trajectory", "--mass", "uniform"]),
        ("oma's trainer, trajectory + native (SkyRL's own)", ["skyrl-smoke", "--accounting", "trajectory",
                                                               "--mass", "native"])]),
}


def smoke(oma: Path, args: list[str], steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="oma-cpu-steps-") as work:
        cmd = [str(oma), *args, "--steps", str(steps), "--out", work, "--timeout", "1500"]
        out = subprocess.run(cmd, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {out.returncode}): {(out.stderr or out.stdout)[-500:]}")
    return json.loads(lines[-1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default="benchmarks/cpu_steps.md")
    args = p.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        raise SystemExit(f"--steps must be >= 2 (step 1 is not timed), --repeats >= 1; got {args.steps}, {args.repeats}")
    times: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(args.repeats):
        for host, (oma, arms) in ARMS.items():
            for dp in (1, 2) if host == "verl" else (1,):
                for label, cmd in arms:
                    r = smoke(oma, [*cmd, *(["--dp", str(dp)] if host == "verl" else [])], args.steps)
                    times.setdefault((host, dp, label), []).extend(r["step_times_s"][1:])
                    print(f"{host} dp={dp} {label}: steps {r['step_times_s']}, wall {r['wall_time_s']} s", flush=True)
    lines = [
        "# Real training steps on CPU: each host with OMA on against its native path",
        "",
        f"Command: `python benchmarks/cpu_steps.py --steps {args.steps} --repeats {args.repeats}` (machine: "
        f"{platform.machine()}, the shared 2-core CPU; runs alternate OMA on / native so both see the same load). "
        "verl: `oma verl-smoke` (docs/verl.md#verl-on-cpu); SkyRL: `oma skyrl-smoke` (docs/skyrl.md#skyrl-on-cpu). "
        "Per-step time: the host's own step timing, steps 2..N.",
        "",
        "| host | dp | path | steps timed | s/step, mean | median | min | max |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for (host, dp, label), t in times.items():
        lines.append(f"| {host} | {dp} | {label} | {len(t)} | {statistics.mean(t):.2f} | {statistics.median(t):.2f} "
                     f"| {min(t):.2f} | {max(t):.2f} |")
    lines += ["", "| host | dp | OMA on / native, mean s/step | median |", "|---|---:|---:|---:|"]
    for host, (_, arms) in ARMS.items():
        for dp in (1, 2) if host == "verl" else (1,):
            on, native = times[(host, dp, arms[0][0])], times[(host, dp, arms[1][0])]
            lines.append(f"| {host} | {dp} | {statistics.mean(on) / statistics.mean(native):.2f} | "
                         f"{statistics.median(on) / statistics.median(native):.2f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
