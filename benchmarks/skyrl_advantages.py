"""oma's advantages + weights inside SkyRL vs SkyRL's own step-wise advantages + normalisation.

Run by hand in the SkyRL environment (results committed in benchmarks/skyrl_advantages.md):

    .venv-skyrl/bin/python benchmarks/skyrl_advantages.py --rows 100000 1000000 --out benchmarks/skyrl_advantages.md

Times the two trainer methods oma overrides, ``compute_advantages_and_returns`` then
``_normalize_advantages``, on one synthetic step-wise batch per size (groups of 8 trajectories of
1-8 steps, responses of 1-32 tokens, 0/1 outcomes, 8 mini-batches), for SkyRL's
``RayPPOTrainer`` (GRPO, token_mean) and oma's ``OMARayPPOTrainer`` (uniform mass, trajectory and row
accounting). Variants alternate within each repeat so they share the machine's load; the table
gives the median of the repeats and the ratio to SkyRL's in the same run, and the time of oma's own
functions alone (the batch read into a host step, row-accounted advantages, weights), which is what oma adds.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from rich.progress import Progress
from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch
from skyrl.train.dataset.preprocess import compute_prompt_mini_batch_boundaries
from skyrl.train.trainer import RayPPOTrainer

from dataclasses import replace

from oma import hosts
from oma.integrations.skyrl.batch import changes_skyrl, host_options, host_step, minibatches
from oma.integrations.skyrl.trainer import OMARayPPOTrainer, OMASkyRLTrainConfig

L = 32
GROUP = 8
MINI_BATCHES = 8
VARIANTS = {
    "SkyRL (RayPPOTrainer: trajectory advantages, token_mean per mini-batch)": (RayPPOTrainer, {"mass": "native"}),
    "oma: trajectory accounting + uniform mass": (OMARayPPOTrainer, {"mass": "uniform"}),
    "oma: row accounting + uniform mass": (OMARayPPOTrainer, {"accounting": "row", "mass": "uniform"}),
}


def make_batch(rows: int, seed: int = 0) -> tuple[TrainingInputBatch, int]:
    """A step-wise batch of at least ``rows`` rows (whole groups, a multiple of 8 prompts), and its prompts."""
    rng = np.random.default_rng(seed)
    steps, uids = [], []
    prompt = 0
    while len(uids) < rows or prompt % MINI_BATCHES:
        for _ in range(GROUP):
            n = int(rng.integers(1, 9))
            steps.append(n)
            uids += [f"p{prompt}"] * n
        prompt += 1
    last = np.zeros(len(uids), dtype=bool)
    last[np.cumsum(steps) - 1] = True
    lengths = torch.as_tensor(rng.integers(1, L + 1, len(uids)))
    mask = (torch.arange(L) >= L - lengths.unsqueeze(-1)).long()  # right-aligned, as SkyRL lays them out
    rewards = torch.zeros(len(uids), L)
    rewards[torch.as_tensor(last), -1] = torch.as_tensor(rng.integers(0, 2, len(steps)), dtype=torch.float32)
    data = TrainingInputBatch({"response_mask": mask, "loss_mask": mask.clone(), "rewards": rewards,
                               "values": torch.zeros(len(uids), L)})
    data.metadata = {"uids": uids, "is_last_step": last.tolist(), "response_length": L,
                     "avg_response_length": float(lengths.float().mean()), "pad_size": 0}
    return data, prompt


def make_trainer(cls, oma: dict, prompts: int):
    cfg = OMASkyRLTrainConfig()
    cfg.generator.step_wise_trajectories = True
    cfg.generator.n_samples_per_prompt = GROUP
    cfg.generator.inference_engine.enable_ray_prometheus_stats = False
    cfg.trainer.enable_ray_gpu_monitor = False
    cfg.data.dataloader.num_workers = 0
    cfg.trainer.algorithm.oma = oma
    cfg.trainer.train_batch_size = prompts
    cfg.trainer.policy_mini_batch_size = prompts // MINI_BATCHES

    class _Prompts(list):
        def collate_fn(self, batch):
            return batch

    return cls(cfg=cfg, tracker=None, tokenizer=None, train_dataset=_Prompts(["x"]), eval_dataset=None,
               inference_engine_client=None, generator=None)


def time_once(trainer, data: TrainingInputBatch, boundaries) -> float:
    t0 = time.perf_counter()
    data = trainer.compute_advantages_and_returns(data)
    trainer._normalize_advantages(data, boundaries)
    return time.perf_counter() - t0


def time_oma_part(trainer, data: TrainingInputBatch, boundaries) -> float:
    """oma's own part alone (what the trainer adds to SkyRL's work): the batch read into a host step, row
    advantages, weights."""
    options = host_options(trainer.cfg.trainer.algorithm)
    t0 = time.perf_counter()
    step = host_step(data.metadata["uids"], data.metadata["is_last_step"], data["rewards"], data["loss_mask"])
    if options.accounting == "row":
        hosts.advantages(step, options)
    hosts.weights(replace(step, minibatches=minibatches(boundaries, step.rows)), options)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    results: dict[tuple[int, str], list[float]] = {}
    sizes = {}
    with Progress() as progress:
        task = progress.add_task("timing", total=len(args.rows) * args.repeats * (2 * len(VARIANTS) - 1))
        for rows in args.rows:
            data, prompts = make_batch(rows)
            sizes[rows] = (len(data["loss_mask"]), int(sum(data.metadata["is_last_step"])), prompts)
            boundaries = compute_prompt_mini_batch_boundaries(data.metadata["uids"], prompts // MINI_BATCHES, prompts,
                                                              True, GROUP)
            trainers = {name: make_trainer(cls, oma, prompts) for name, (cls, oma) in VARIANTS.items()}
            for _ in range(args.repeats):
                for name, trainer in trainers.items():
                    results.setdefault((rows, name), []).append(time_once(trainer, copy.deepcopy(data), boundaries))
                    progress.advance(task)
                    if changes_skyrl(host_options(trainer.cfg.trainer.algorithm)):
                        results.setdefault((rows, name, "part"), []).append(time_oma_part(trainer, data, boundaries))
                        progress.advance(task)
    lines = [
        "# oma inside SkyRL: advantages + weights vs SkyRL's step-wise advantages + normalisation", "",
        f"Command: `.venv-skyrl/bin/python benchmarks/skyrl_advantages.py --rows {' '.join(map(str, args.rows))} "
        f"--repeats {args.repeats} --out {args.out}`", "",
        f"Machine: {platform.machine()}, the shared 2-core CPU, torch {torch.__version__}, 2 threads. Time of "
        "`compute_advantages_and_returns` + `_normalize_advantages` on one step-wise batch (groups of 8 "
        "trajectories of 1-8 steps, responses of 1-32 tokens, 8 mini-batches); median of "
        f"{args.repeats} repeats, variants alternating.", "",
        "| rows | trajectories | variant | s, median | min | max | ratio to SkyRL | oma's functions alone, s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for rows in args.rows:
        base = statistics.median(results[(rows, next(iter(VARIANTS)))])
        for name in VARIANTS:
            t = results[(rows, name)]
            part = results.get((rows, name, "part"))
            lines.append(f"| {sizes[rows][0]:,} | {sizes[rows][1]:,} | {name} | {statistics.median(t):.3f} | "
                         f"{min(t):.3f} | {max(t):.3f} | {statistics.median(t) / base:.2f} | "
                         f"{f'{statistics.median(part):.3f}' if part else '-'} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
