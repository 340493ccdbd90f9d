"""RL iteration throughput of this checkout against an earlier commit, side by side in one run.

Run by hand (results committed as benchmarks/speedup.md):

    .venv/bin/python benchmarks/speedup.py configs/household-grpo-oma.yaml --baseline bfe36fe \
        --current-extra 'warm_start.episodes=120 warm_start.epochs=12 env.show_actions=true' --new-default \
        --out benchmarks/speedup.md

Both code paths run `oma train` at the same config and seed, alternating (baseline, current,
baseline, current, ...), each in its own process: the baseline from a `git worktree` of
``--baseline``, the current one from this checkout's ``src``. Each run writes metrics.jsonl; an
iteration's wall time is the sum of its ``time_*`` fields (rollout, advantages, old/reference
log-probs, update: everything but evaluation and checkpoints), and its throughput is rows / that
time. Runs are warm-started from the shared cache (a first pass fills it), so only RL is timed.

Then, in this process, the current code's update phase on one batch is run under
``torch.utils.flop_counter.FlopCounterMode`` to count the floating-point operations it executes,
and timed again without the counter: achieved FLOP/s, as a fraction of this CPU's measured fp32
matmul peak (best of 5 square matmuls at the configured thread count).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RUN = ("import sys; from oma.cli import main; sys.exit(main(sys.argv[1:]))")


def run_train(src: Path, config: str | None, overrides: list[str], out_dir: Path, cache: str) -> list[dict]:
    args = [sys.executable, "-c", RUN, "train", *([config] if config else []), *overrides,
            f"out_dir={out_dir}", f"warm_start.cache_dir={cache}", "tensorboard=false"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def iteration_stats(records: list[dict]) -> list[tuple[int, float]]:
    """(rows, seconds) of each RL iteration: seconds = Σ of its time_* fields."""
    return [(r["rows"], sum(v for k, v in r.items() if k.startswith("time_"))) for r in records if r["iteration"] > 0]


def matmul_peak(threads: int, n: int = 2048) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return 2 * n**3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def update_flops(config: str | None, overrides: list[str], cache: str) -> dict[str, float]:
    """FLOPs and seconds of the current code's update phase on one iteration's batch."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    from oma.agent.rollout import rollout
    from oma.train import Batch, advantages, build_policy, episode_scores, load_config, per_token, response_mask_of, task_seeds, update
    from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env

    cfg = load_config(config, [*overrides, f"warm_start.cache_dir={cache}"])
    torch.set_num_threads(cfg.threads)
    make_env = env_factory(cfg)
    model, tok, _ = build_policy(cfg, make_env)
    ro = rollout(make_env, model, tok, task_seeds(cfg, 1), group_size=cfg.env.group_size,
                 history_length=cfg.env.history_length, max_prompt_tokens=cfg.policy.max_prompt_tokens,
                 max_new_tokens=cfg.policy.max_new_tokens, temperature=cfg.policy.temperature,
                 invalid_penalty=cfg.env.invalid_penalty, generator=torch.Generator().manual_seed(cfg.seed),
                 constrained=cfg.policy.constrained, show_actions=cfg.env.show_actions)
    rows = ro.rows
    mask = response_mask_of(rows)
    batch = Batch(rows, mask, advantages(cfg, rows, episode_scores(cfg, rows)), per_token(rows.logp, mask.shape[1]), None)
    start = copy.deepcopy(model.state_dict())

    def once() -> None:
        model.load_state_dict(start)
        update(model, torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr), batch, cfg, tok.pad_token_id, 1)

    with FlopCounterMode(display=False) as counter:
        once()
    seconds = statistics.median(_timed(once) for _ in range(3))
    return {"flops": float(counter.get_total_flops()), "seconds": seconds, "rows": len(rows),
            "live_rows": int((batch.adv != 0).sum()), "threads": cfg.threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--baseline", default="bfe36fe", help="git revision of the code path to compare with")
    parser.add_argument("--iterations", type=int, default=4, help="RL iterations per run")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each code path")
    parser.add_argument("--current-extra", default="", metavar="OVERRIDES",
                        help="overrides for the current code alone, so that it runs the baseline's config where "
                             "defaults changed (e.g. 'warm_start.episodes=120 env.show_actions=true')")
    parser.add_argument("--new-default", action="store_true",
                        help="also run the current code at its own default job (`oma train` with no config), in the same alternation")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    timing = [f"iterations={args.iterations}", f"eval_every={args.iterations}", "env.eval_tasks=4"]
    with tempfile.TemporaryDirectory(prefix="oma-speedup-") as tmp:
        tmp = Path(tmp)
        cache = str(tmp / "cache")
        worktree = tmp / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Both code paths read the baseline's copy of the config file: the same YAML for both.
        config = str(worktree / args.config) if args.config else None
        paths = {f"baseline ({args.baseline})": (worktree / "src", config, args.overrides),
                 "current": (ROOT / "src", config, [*args.overrides, *args.current_extra.split()])}
        if args.new_default:
            paths["current, new default job"] = (ROOT / "src", None, [])
        try:
            for i, (src, config, extra) in enumerate(paths.values()):  # fill the warm-start cache (not timed)
                run_train(src, config, [*extra, "iterations=0", "env.eval_tasks=1"], tmp / f"warm-{i}", cache)
            per_iter: dict[str, list[tuple[int, float]]] = {k: [] for k in paths}
            for k in range(args.repeats):
                for i, (name, (src, config, extra)) in enumerate(paths.items()):
                    per_iter[name] += iteration_stats(run_train(src, config, [*extra, *timing], tmp / f"run-{k}-{i}", cache))
            flops_config = (None, []) if args.new_default else paths["current"][1:]
            flops = update_flops(*flops_config, cache)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    peak = matmul_peak(flops["threads"])
    rate = {k: sum(r for r, _ in v) / sum(t for _, t in v) for k, v in per_iter.items()}
    base, cur = rate[f"baseline ({args.baseline})"], rate["current"]
    achieved = flops["flops"] / flops["seconds"]
    text = "\n".join([
        "# Benchmark: RL iteration throughput against an earlier commit",
        "",
        f"Command: `.venv/bin/python benchmarks/speedup.py {args.config or ''} {' '.join(args.overrides)} "
        f"--baseline {args.baseline} --iterations {args.iterations} --repeats {args.repeats}"
        + (f" --current-extra '{args.current_extra}'" if args.current_extra else "")
        + (" --new-default" if args.new_default else "")
        + (f" --out {args.out}`" if args.out else "`"),
        "",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {os.cpu_count()} cores (shared, noisy: compare the ratio, measured in one run).",
        "",
        f"Each code path ran `oma train` {args.repeats} times x {args.iterations} RL iterations at the same config "
        f"(`{args.config}` as of {args.baseline}{', with ' + args.current_extra + ' for the current code, whose defaults changed' if args.current_extra else ''}) "
        "and seed, alternating. Iteration time = rollout + advantages + old/reference log-probs + update "
        "(evaluation and checkpoints excluded); throughput = rows of all iterations / their time.",
        "",
        "| code path | iterations | rows | seconds | rows/s |",
        "|---|---:|---:|---:|---:|",
        *(f"| {k} | {len(v)} | {sum(r for r, _ in v):,} | {sum(t for _, t in v):.1f} | {rate[k]:.1f} |"
          for k, v in per_iter.items()),
        "",
        f"**Speed-up at the same config: {cur / base:.2f}x** rows per second (target ≥ 2x).",
        *([f"The new default job (`oma train`, its own config): {rate['current, new default job']:.1f} rows/s, "
           f"{rate['current, new default job'] / base:.2f}x the baseline's rate at the old config."]
          if args.new_default else []),
        "",
        f"Update phase of the current code at {'the new default job' if args.new_default else 'this config'}, on one batch "
        f"({flops['rows']} rows, {flops['live_rows']} with a non-zero advantage): "
        f"{flops['flops'] / 1e9:.1f} GFLOP executed in {flops['seconds']:.2f} s = "
        f"{achieved / 1e9:.1f} GFLOP/s; this CPU's fp32 matmul peak at {flops['threads']} threads "
        f"(2048x2048) is {peak / 1e9:.1f} GFLOP/s: **{achieved / peak:.0%} of peak**.",
        "",
    ])
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
