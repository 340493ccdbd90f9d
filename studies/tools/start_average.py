"""Start an average of the weights at a checkpoint of a run trained without one (studies/weight-average/journal.md#an-average-of-the-weights).

Copies run SRC up to its checkpoint at ``--iteration`` into a new run folder DST whose config is SRC's
with ``optim.ema`` = β, and seeds that checkpoint's averaged weights with its live ones (θ̄_k = θ_k).
``oma train ... optim.ema=β out_dir=DST --resume`` then continues SRC's training exactly (the average
changes neither rollouts nor updates) while its evaluations measure θ̄. After m more optimizer steps
θ̄ differs from the average a run started with from the warm start by β^m·(θ_k − θ̄_k); at β = 0.97
and 400 steps (100 iterations of 4 mini-batches) that weight is 5e-6:

    .venv/bin/python studies/tools/start_average.py runs/grpo375s/OA+MA/seed-1 DST --iteration 275 --ema 0.97
    oma train studies/longer-preset/household-grpo-oma-375.yaml seed=1 optim.ema=0.97 warm_start.cache_dir=... out_dir=DST --resume
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from oma.files import sha256_file
from oma.train import (EMA_FILE, ConfigError, WeightAverage, config_diff, load_checkpoint, load_run_config, make_optimizer,
                       to_dict, trainable_policy, validate)
from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env


def start_average(src: Path, dst: Path, iteration: int, beta: float) -> Path:
    """Write DST (see the module docstring); return its checkpoint folder."""
    ckpt = src / "checkpoints" / f"iter_{iteration:06d}"
    cfg = load_run_config(src)
    if not (ckpt / "state.json").is_file():
        raise ConfigError(f"--iteration: {src} has no checkpoint at iteration {iteration} ({ckpt.name})")
    if dst.exists():
        raise ConfigError(f"dst: {dst} exists; give a new folder")
    saved = json.loads((src / "config.json").read_text())
    if cfg.optim.ema:
        raise ConfigError(f"src: {src} already averages its weights (optim.ema = {cfg.optim.ema}); resume it instead")
    cfg.optim.ema, cfg.out_dir = beta, str(dst)
    validate(cfg)  # names optim.ema when β is out of [0, 1)
    if not beta:
        raise ConfigError("--ema: expected a β in (0, 1); 0 is no average")
    changed = config_diff(saved, to_dict(cfg), ("out_dir",))
    assert changed == [f"optim.ema (saved 0.0, now {beta!r})"], changed  # nothing else of SRC's config may move

    torch.set_num_threads(cfg.threads)
    model, _, _ = trainable_policy(cfg, env_factory(cfg))
    optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    load_checkpoint(ckpt, model, optimizer)  # checks every file's SHA-256 first

    (dst / "checkpoints").mkdir(parents=True)
    for name in ("metrics.jsonl", "samples.jsonl"):  # --resume drops what came after the checkpoint
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    (dst / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
    out = dst / "checkpoints" / ckpt.name
    shutil.copytree(ckpt, out)
    save_file(WeightAverage(model, beta).state_dict(), str(out / EMA_FILE))  # θ̄_k = θ_k
    state = json.loads((out / "state.json").read_text())
    state["sha256"][EMA_FILE] = sha256_file(out / EMA_FILE)
    state["config"] = to_dict(cfg)
    state["average_started_at"] = {"run": str(src), "iteration": iteration}
    (out / "state.json").write_text(json.dumps(state))
    (dst / "checkpoints" / "latest").write_text(out.name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path, help="a run folder trained with optim.ema = 0")
    ap.add_argument("dst", type=Path, help="the new run folder (must not exist)")
    ap.add_argument("--iteration", type=int, required=True, help="the checkpointed iteration to start the average at")
    ap.add_argument("--ema", type=float, required=True, help="β of optim.ema, in (0, 1)")
    args = ap.parse_args(argv)
    try:
        out = start_average(args.src, args.dst, args.iteration, args.ema)
    except ConfigError as e:
        print(f"start_average: {e}", file=sys.stderr)
        return 2
    print(f"{out}: θ̄ = θ at iteration {args.iteration}; continue with oma train ... optim.ema={args.ema} "
          f"out_dir={args.dst} --resume")
    return 0


if __name__ == "__main__":
    sys.exit(main())
