"""bf16 autocast for the policy on a CPU with AVX512-BF16: what each phase gains, and what it does to the log-probs.

Run by hand (results committed as studies/bf16/bf16.md):

    .venv/bin/python studies/tools/bf16_speed.py --repeats 12 --out studies/bf16/bf16.md

The config (the default job unless named, with any overrides) is warm-started as `oma train` builds it
(cached). For iterations 1 to ``--repeats`` it rolls out that iteration's tasks and updates on the
batch once in fp32 and once under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (weights, optimizer
state, log-softmax and the objective stay fp32; the model's matrix products run in bf16), the two
alternating and each starting from the warm start, so a slow spell of the shared machine falls on both.
Both updates train on the fp32 rollout's batch (the same rows, advantages and ``logp_old``), so their
effect on the policy is compared on equal terms: the KL (k1) from the rollout policy to the updated one,
read in fp32 on that batch's tokens. Iteration 1's batch also gives how far each reading of a token's
log-prob lies from the one recorded while sampling (``logp_old``): the gap bf16 puts into the ratio
π_θ / π_old before any update.
"""

from __future__ import annotations

import sys
from pathlib import Path
import copy
import statistics
import time
from contextlib import nullcontext

import torch
from rich.console import Console
from rich.progress import Progress

from oma.train import batch_logprobs, cpu_info, make_optimizer, per_token, response_mask_of, training_rollout, update
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the benchmark harness it reuses
from throughput import on_policy_batch, publish, setup

PRECISIONS = ("fp32", "bf16")


def autocast(precision: str):
    """The context a phase runs in: bf16 autocast on the CPU, or none (fp32)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> str:
    """|a − b| over the response tokens: mean, 99th percentile and max, e.g. "2.3e-08, 3.6e-07, 1.2e-06"."""
    d = (a - b)[mask].abs()
    return f"{d.mean():.1e} | {d.quantile(0.99):.1e} | {d.max():.1e}"


def main() -> None:
    args, cfg, make_env, model, tok = setup(__doc__.splitlines()[0], repeats=6)
    pad, micro = tok.pad_token_id, cfg.optim.micro_batch_rows
    start = copy.deepcopy(model.state_dict())
    times: dict[str, dict[str, list[float]]] = {p: {"rollout": [], "update": []} for p in PRECISIONS}
    moved: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    diag: dict[str, list[dict]] = {p: [] for p in PRECISIONS}
    gaps: dict[str, str] = {}
    with Progress(console=Console()) as progress:
        task = progress.add_task("iterations", total=args.repeats * len(PRECISIONS))
        for it in range(1, args.repeats + 1):
            batch = None
            for p in PRECISIONS:
                model.load_state_dict(start)
                t0 = time.perf_counter()
                with autocast(p), torch.no_grad():
                    ro = training_rollout(cfg, make_env, model, tok, it, torch.Generator().manual_seed(cfg.seed + it))
                times[p]["rollout"].append(time.perf_counter() - t0)
                if p == "fp32":
                    batch = on_policy_batch(cfg, ro.rows)
                if it == 1:  # the log-prob a full forward pass reads against the one recorded while sampling
                    mask = response_mask_of(ro.rows)
                    with autocast(p), torch.no_grad():
                        logp = batch_logprobs(model, ro.rows, pad, micro, mask.shape[1], cfg.policy.temperature)
                    gaps[f"{p} forward vs {p} rollout"] = gap(logp, per_token(ro.rows.logp, mask.shape[1]), mask)
                    if p == "bf16":
                        gaps["bf16 forward vs fp32 rollout"] = gap(logp, batch.logp_old, batch.response_mask)
                optimizer = make_optimizer(cfg, [q for q in model.parameters() if q.requires_grad])
                t0 = time.perf_counter()
                with autocast(p):
                    diag[p].append(update(model, optimizer, batch, cfg, pad, it))
                times[p]["update"].append(time.perf_counter() - t0)
                with torch.no_grad():
                    logp_new = batch_logprobs(model, batch.rows, pad, micro, batch.response_mask.shape[1], cfg.policy.temperature)
                moved[p].append(float((batch.logp_old - logp_new)[batch.response_mask].mean()))
                progress.advance(task)

        # The bare pass at one fixed shape, as studies/tools/throughput_ceiling.py times it (a lower bound on overheads)
        shape = (64, 104)
        ids = torch.randint(len(tok), shape, generator=torch.Generator().manual_seed(0))
        bare: dict[str, dict[str, list[float]]] = {p: {"forward + backward": [], "forward, no gradients": []}
                                                   for p in PRECISIONS}
        for _ in range(args.repeats):
            for p in PRECISIONS:
                t0 = time.perf_counter()
                with autocast(p):
                    model(input_ids=ids, logits_to_keep=8).logits.float().logsumexp(-1).mean().backward()
                bare[p]["forward + backward"].append(time.perf_counter() - t0)
                model.zero_grad()
                t0 = time.perf_counter()
                with autocast(p), torch.no_grad():
                    model(input_ids=ids, logits_to_keep=8)
                bare[p]["forward, no gradients"].append(time.perf_counter() - t0)

    med = {p: {phase: statistics.median(ts) for phase, ts in times[p].items()} for p in PRECISIONS}
    for p in PRECISIONS:
        med[p].update({what: statistics.median(ts) for what, ts in bare[p].items()})
    for p in PRECISIONS:
        med[p]["iteration"] = statistics.median(r + u for r, u in zip(times[p]["rollout"], times[p]["update"]))
    cpu = cpu_info()
    command = (".venv/bin/python studies/tools/bf16_speed.py" + (f" {args.config}" if args.config else "")
               + "".join(f" {o}" for o in args.overrides) + f" --repeats {args.repeats}"
               + (f" --out {args.out}" if args.out else ""))
    mean = statistics.mean
    lines = [
        "# Benchmark: bf16 autocast for the policy on the CPU",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {cpu['cpu']} ({cpu['cpu_capability']}), torch {torch.__version__}, {cfg.threads} threads "
        "(shared, noisy: read the ratios, each measured in this one run).",
        "",
        f"Iterations 1–{args.repeats} of {args.config or 'the default job'} ({cfg.env.tasks_per_iter} tasks × "
        f"{cfg.env.group_size} episodes), from its warm start every time, fp32 and bf16 alternating; medians "
        "over the iterations. Both updates train on the fp32 rollout's batch.",
        "",
        "| phase | fp32 s | bf16 s | fp32 / bf16 |",
        "|---|---:|---:|---:|",
        *(f"| {phase} | {med['fp32'][phase]:.2f} | {med['bf16'][phase]:.2f} | {med['fp32'][phase] / med['bf16'][phase]:.2f}× |"
          for phase in ("rollout", "update", "iteration")),
        "",
        f"The policy's bare pass at one fixed shape, {shape[0]} rows × {shape[1]} tokens of random ids (no padding, "
        "logits at the last 8 positions), medians over the same repeats:",
        "",
        "| pass | fp32 s | bf16 s | fp32 / bf16 |",
        "|---|---:|---:|---:|",
        *(f"| {what} | {med['fp32'][what]:.3f} | {med['bf16'][what]:.3f} | {med['fp32'][what] / med['bf16'][what]:.2f}× |"
          for what in bare["fp32"]),
        "",
        "What one update does, means over the iterations (the KL is read in fp32 on the batch's tokens, from the "
        "rollout policy to the updated one; `clipfrac` and `approx_kl_k1` are the update's own diagnostics, read "
        "in the update's precision):",
        "",
        "| update in | KL(π_old ‖ π_new), k1, read in fp32 | clipfrac | approx_kl_k1 | grad_norm |",
        "|---|---:|---:|---:|---:|",
        *(f"| {p} | {mean(moved[p]):.2e} | {mean(d['clipfrac'] for d in diag[p]):.4f} "
          f"| {mean(d['approx_kl_k1'] for d in diag[p]):.2e} | {mean(d['grad_norm'] for d in diag[p]):.3f} |"
          for p in PRECISIONS),
        "",
        "Iteration 1: |log-prob of a full forward pass − log-prob recorded while sampling|, over the response tokens:",
        "",
        "| reading | mean | 99th percentile | max |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {g} |" for name, g in gaps.items()),
        "",
    ]
    text = "\n".join(lines)
    publish(text, args.out)


if __name__ == "__main__":
    main()
