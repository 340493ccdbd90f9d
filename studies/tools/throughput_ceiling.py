"""Where one RL iteration of a config spends its time, and how much code alone could take off it.

Run by hand (results committed as studies/default-job/throughput-ceiling.md):

    .venv/bin/python studies/tools/throughput_ceiling.py --out studies/default-job/throughput-ceiling.md

It builds the warm-started policy as `oma train` does (cached), rolls out iteration 1 and updates on
that batch, timing every forward pass of the model: in the rollout the prefills (real and padded
prompt tokens) and the decoding steps, in the update the forward passes (the rest of the update is the
backward pass and the loss). Then, at the update's own micro-batch shape (64 rows × the mean padded
length), it times the model's forward + backward pass alone: eager, under ``torch.compile``, and for
smaller policies and shorter prompts (fresh models of the same family, so only the shape differs), and
counts its FLOPs against this CPU's fp32 matmul peak; and the forward pass alone without gradients (what a
prefill does), eager and compiled. Every ratio is measured in this one run, repeats
alternating, median of each.
"""

from __future__ import annotations

import sys
from pathlib import Path
import copy
import statistics
import time
from collections import defaultdict

import torch
from oma.agent.policy import tiny_model
from oma.train import cpu_info, forward_plan, training_rollout, update
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the benchmark harness it reuses
from speedup import matmul_peak
from throughput import on_policy_batch, publish, setup


class ForwardTimer:
    """Wraps ``model.forward``: seconds, calls, real and padded tokens per kind of pass (prefill or one-token decode)."""

    def __init__(self, model) -> None:
        self.model, self.inner = model, model.forward
        self.stats: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0, 0])
        model.forward = self

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        s = self.stats["decode" if ids.shape[1] == 1 else "prefill"]
        s[0] += time.perf_counter() - t0
        s[1] += 1
        s[2] += int(mask[:, -ids.shape[1]:].sum())
        s[3] += ids.numel()
        return out

    def reset(self) -> None:
        self.stats.clear()

    def close(self) -> None:
        self.model.forward = self.inner


def step_time(model, batch_rows: int, length: int, repeats: int, backward: bool = True) -> float:
    """Median seconds of one forward + backward pass over [batch_rows, length] tokens (a quarter of the rows
    left-padded by up to a tenth of the length, as length-sorted micro-batches are), logits for the last 8;
    without ``backward``, a forward pass without gradients and logits for the last position (a prefill)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch_rows, length), generator=g)
    mask = torch.ones(batch_rows, length, dtype=torch.long)
    for i in range(0, batch_rows, 4):
        mask[i, : (i * length) // (10 * batch_rows)] = 0
    positions = (mask.cumsum(-1) - 1).clamp_min(0)

    def once() -> float:
        t0 = time.perf_counter()
        if not backward:
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
            return time.perf_counter() - t0
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=8).logits
        logits.logsumexp(-1).sum().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    once()
    return statistics.median(once() for _ in range(repeats))


def step_flops(model, batch_rows: int, length: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(3, model.config.vocab_size, (batch_rows, length))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, logits_to_keep=8).logits.logsumexp(-1).sum().backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def main() -> None:
    args, cfg, make_env, model, tok = setup(__doc__.splitlines()[0], repeats=7)
    pad = tok.pad_token_id

    # ---- the iteration: rollout and update on its batch, every forward pass timed -------------------
    timer = ForwardTimer(model)
    t0 = time.perf_counter()
    ro = training_rollout(cfg, make_env, model, tok, 1, torch.Generator().manual_seed(cfg.seed))
    t_rollout = time.perf_counter() - t0
    rollout_stats = {k: list(v) for k, v in timer.stats.items()}
    rows = ro.rows
    batch = on_policy_batch(cfg, rows)
    plan = forward_plan(rows, (batch.adv != 0).nonzero().squeeze(-1), cfg.optim.micro_batch_rows)
    if not plan:  # every group of iteration 1 has one outcome: the update computes nothing to time
        raise SystemExit(f"iteration 1 of this config has no row with A != 0 ({len(rows)} rows); "
                         "time a config whose groups' outcomes differ (more tasks or episodes)")
    start = copy.deepcopy(model.state_dict())
    t_update, update_fwd = [], []
    for _ in range(3):
        model.load_state_dict(start)
        timer.reset()
        t0 = time.perf_counter()
        update(model, torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr), batch, cfg, pad, 1)
        t_update.append(time.perf_counter() - t0)
        update_fwd.append(timer.stats["prefill"][0])
    update_stats = timer.stats["prefill"]
    timer.close()
    t_update_med, t_update_fwd = statistics.median(t_update), statistics.median(update_fwd)
    length = round(update_stats[3] / sum(len(c) for c, _, _ in plan))  # mean padded row length of a micro-batch
    rows_mb = cfg.optim.micro_batch_rows

    # ---- the kernel at the update's shape: eager, compiled, smaller policies, shorter prompts --------
    p = cfg.policy
    eager = tiny_model(len(tok), hidden=p.hidden, layers=p.layers, heads=p.heads, max_positions=512, seed=0)
    t0 = time.perf_counter()
    compiled = torch.compile(eager, dynamic=False)
    step_time(compiled, rows_mb, length, 1)
    step_time(compiled, rows_mb, length, 1, backward=False)
    t_compile = time.perf_counter() - t0
    shapes = [("the default policy (eager)", p.hidden, 3 * p.hidden, length),
              ("MLP 1× hidden instead of 3×", p.hidden, p.hidden, length),
              (f"hidden {3 * p.hidden // 4}", 3 * p.hidden // 4, 9 * p.hidden // 4, length),
              (f"hidden {p.hidden // 2}", p.hidden // 2, 3 * p.hidden // 2, length),
              (f"prompts 3/4 as long ({3 * length // 4} tokens)", p.hidden, 3 * p.hidden, 3 * length // 4),
              (f"prompts half as long ({length // 2} tokens)", p.hidden, 3 * p.hidden, length // 2)]
    models = {}
    for _, h, i, _ in shapes:
        if (h, i) not in models:
            models[(h, i)] = eager if (h, i) == (p.hidden, 3 * p.hidden) else _model(len(tok), h, i, p.layers, p.heads)
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(3):  # alternate, so a slow spell of the shared machine falls on every variant
        times["compiled"].append(step_time(compiled, rows_mb, length, args.repeats))
        times["forward"].append(step_time(eager, rows_mb, length, args.repeats, backward=False))
        times["compiled forward"].append(step_time(compiled, rows_mb, length, args.repeats, backward=False))
        for name, h, i, L in shapes:
            times[name].append(step_time(models[(h, i)], rows_mb, L, args.repeats))
    t_eager = statistics.median(times[shapes[0][0]])
    flops = step_flops(eager, rows_mb, length)
    peak = matmul_peak(cfg.threads)

    # ---- report -------------------------------------------------------------------------------------
    pre, dec = rollout_stats.get("prefill", [0, 0, 0, 0]), rollout_stats.get("decode", [0, 0, 0, 0])
    iteration = t_rollout + t_update_med
    cpu = cpu_info()
    lines = [
        "# Benchmark: where an RL iteration's time goes, and what code alone could take off it",
        "",
        "Command: `" + " ".join([".venv/bin/python studies/tools/throughput_ceiling.py", *([args.config] if args.config else []),
                                 *args.overrides, *(["--out", args.out] if args.out else [])]) + "`",
        "",
        f"Machine: {cpu['cpu']} ({cpu['cpu_capability']}), torch {torch.__version__}, {cfg.threads} threads "
        "(shared, noisy: read the ratios, each measured in this one run).",
        "",
        f"Iteration 1 of `oma train` at this config (seed {cfg.seed}): {len(rows):,} rows, "
        f"{sum(len(x) for x in rows.prompt_ids):,} prompt tokens; the update computes {sum(len(c) for c, _, _ in plan):,} "
        f"distinct rows with A ≠ 0 in {len(plan)} micro-batches.",
        "",
        "| phase | part | seconds | share of the iteration | tokens (real / padded) |",
        "|---|---|---:|---:|---:|",
        f"| rollout | prefills ({int(pre[1])} calls) | {pre[0]:.2f} | {pre[0] / iteration:.0%} | {int(pre[2]):,} / {int(pre[3]):,} |",
        f"| rollout | decoding steps ({int(dec[1])} calls) | {dec[0]:.2f} | {dec[0] / iteration:.0%} | {int(dec[2]):,} |",
        f"| rollout | the rest (environments, tokenizer, sampling, bookkeeping) | {t_rollout - pre[0] - dec[0]:.2f} | "
        f"{(t_rollout - pre[0] - dec[0]) / iteration:.0%} | |",
        f"| update | forward passes (median of 3) | {t_update_fwd:.2f} | {t_update_fwd / iteration:.0%} | "
        f"{int(update_stats[2]):,} / {int(update_stats[3]):,} |",
        f"| update | backward passes, loss, optimizer | {t_update_med - t_update_fwd:.2f} | "
        f"{(t_update_med - t_update_fwd) / iteration:.0%} | |",
        f"| **iteration** | | **{iteration:.2f}** | 100% | |",
        "",
        f"The model's forward + backward pass alone at the update's micro-batch shape ({rows_mb} × {length} tokens): "
        f"{flops / 1e9:.2f} GFLOP in {t_eager * 1e3:.0f} ms = {flops / t_eager / 1e9:.0f} GFLOP/s, "
        f"**{flops / t_eager / peak:.0%} of this CPU's fp32 matmul peak** ({peak / 1e9:.0f} GFLOP/s at 2048², "
        f"{cfg.threads} threads). The same pass for the same {rows_mb} rows under other code or shapes, "
        "against the default policy's eager pass (>1: faster):",
        "",
        "| variant | ms per micro-batch | speed-up |",
        "|---|---:|---:|",
        f"| `torch.compile` (inductor; compiling this shape's two graphs, with and without gradients, took "
        f"{t_compile:.0f} s) | "
        f"{statistics.median(times['compiled']) * 1e3:.0f} | {t_eager / statistics.median(times['compiled']):.2f}× |",
    ]
    for name, _, _, _ in shapes:
        t = statistics.median(times[name])
        lines.append(f"| {name} | {t * 1e3:.0f} | {t_eager / t:.2f}× |")
    t_fwd, t_cfwd = statistics.median(times["forward"]), statistics.median(times["compiled forward"])
    lines += ["", f"The forward pass alone, without gradients (a prefill of the same {rows_mb} rows): eager "
              f"{t_fwd * 1e3:.0f} ms, `torch.compile` {t_cfwd * 1e3:.0f} ms, **{t_fwd / t_cfwd:.2f}×**."]
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


def _model(vocab: int, hidden: int, intermediate: int, layers: int, heads: int):
    model = tiny_model(vocab, hidden=hidden, layers=layers, heads=heads, max_positions=512, seed=0)
    if model.config.intermediate_size != intermediate:  # tiny_model's MLP is 3x hidden: rebuild with this one
        from transformers import Qwen2ForCausalLM

        config = copy.deepcopy(model.config)
        config.intermediate_size = intermediate
        model = Qwen2ForCausalLM(config)
    return model


if __name__ == "__main__":
    main()
