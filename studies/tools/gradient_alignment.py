"""Does one RL batch's gradient point where the expert would? Cosines against an oracle direction.

Run by hand (results in studies/what-limits-learning/journal.md#the-rl-gradient-against-the-experts-it-points-away-from-what-held-out-states-need-measured):

    .venv/bin/python studies/tools/gradient_alignment.py --seed 0 --batches 3 threads=1
    .venv/bin/python studies/tools/gradient_alignment.py --seed 2 --batches 3 --json out.json threads=2

Rolls out the warm start of ``--seed`` of the default job of 2026-12-04 (as ``oma train
studies/default-job/household-gigpo-oma-2026-12-04.yaml seed=K`` builds it, cached) on
training tasks, as an RL iteration does, and records the expert's action in every state the policy
acted in.
For each advantage / mass variant it takes the policy gradient of the batch at ratio 1, the
gradient of Σ W·(−A·logp) with W and A exactly as an update computes them, and compares it with
two references:

* ``oracle``: the gradient of the expert actions' token-mean log-likelihood on the states of
  *other* policy rollouts (held-out task seeds): imitating the expert where the policy goes (DART,
  Laskey et al. 2017) is the improvement a perfect critic would point to, and it carries over to
  tasks the batch never saw only through what generalises;
* ``other batch``: the same variant's gradient on an independent batch (other task seeds). Their
  cosine measures how much of one batch's gradient is signal: for g = μ + noise, E cos(g₁, g₂) =
  |μ|² / (|μ|² + σ²/n).

Reported per variant, mean ± 95% CI over the 2 × ``--batches`` training batches: cos(g, oracle), the
same with Adam's first-step direction sign(g) and cos(g, sharpen); over the ``--batches`` pairs:
cos(g₁, g₂) and cos(sign g₁, sign g₂) between the two batches of a pair. ``sharpen`` raises the
likelihood of every action the policy took (A = 1). ``oracle on a training batch`` is the expert-label gradient of the training
batch against the held-out one: what a perfectly labelled batch of the same size achieves. Then the
paired difference of each variant's cos(g, oracle) from verl's accounting (gigpo row+native) on the
same batches, and the job's gradient split by row kind (sign of A × whether the row took the
expert's action), each part projected on the oracle and divided by |g|, so the parts add up to
cos(g, oracle).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from first_step_credit import MEASURED_JOB  # studies/tools/ is on sys.path when run as a script
from oma.agent.policy import action_choices, allowed_positions
from oma.agent.rollout import Rows
from oma.core import gigpo_advantages, outcome_advantages, token_weights
from oma.experiments.stats import mean_ci
from oma.train import build_policy, episode_scores, forward_plan, load_config, policy_rollout, response_mask_of, row_logprobs
import oma.envs


class ExpertTap:
    """An environment that records, before every step, the expert's action and the admissible actions
    of the state acted in: row k of a rollout is the k-th step taken, so ``log[k]`` labels row k."""

    def __init__(self, env, log: list[tuple[str, list[str], str]]) -> None:
        self.env, self.log, self.info = env, log, None

    def reset(self, seed: int):
        obs, self.info = self.env.reset(seed)
        return obs, self.info

    def step(self, action: str):
        self.log.append((self.env.expert_action(), list(self.info["admissible_actions"]), action))
        out = self.env.step(action)
        self.info = out[4]
        return out

    def __getattr__(self, name):
        return getattr(self.env, name)


def labelled_rollout(cfg, model, tokenizer, seeds, generator, *, group_size=None, temperature=None):
    """A rollout as an RL iteration's (the job's group size and temperature unless given, its training cap) and its
    expert labels: ``(rollout, [(expert action, admissible actions, action taken)] per row)``."""
    log: list[tuple[str, list[str], str]] = []
    make_env = lambda: ExpertTap(oma.envs.make(cfg.env.name, **cfg.env.options), log)  # noqa: E731
    ro = policy_rollout(cfg, make_env, model, tokenizer, seeds,
                        group_size=cfg.env.group_size if group_size is None else group_size,
                        temperature=cfg.policy.temperature if temperature is None else temperature, generator=generator,
                        max_steps=cfg.env.train_max_steps)
    if len(log) != len(ro.rows):
        raise RuntimeError(f"{len(log)} expert labels for {len(ro.rows)} rows")
    return ro, log


def flat_grad(loss, params) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def variant_advantages(cfg, rows, scores):
    """(name, advantages [R], mass rule) of every variant compared: GiGPO and its two terms, under OA+MA
    and under verl's row+native."""
    a = cfg.algo
    common = dict(norm_by_std=a.norm_by_std)
    out = []
    for accounting, mass in (("trajectory", "uniform"), ("row", "native")):
        gigpo = gigpo_advantages(scores, rows.step_rewards, rows.anchor, rows.group_index, rows.traj_index,
                                 rows.step_index, accounting=accounting, gamma=a.gamma,
                                 step_advantage_w=a.step_advantage_w, **common)
        episode = outcome_advantages(scores, rows.group_index, rows.traj_index, accounting=accounting,
                                     estimator="grpo", **common)
        tag = "OA+MA" if accounting == "trajectory" else "row+native"
        out += [(f"gigpo {tag}", gigpo, mass), (f"episode term (grpo) {tag}", episode, mass),
                (f"step term {tag}", gigpo - episode, mass)]
    return out


def distinct_logprobs(cfg, model, rows: Rows, pad_id: int):
    """(logp [U, L] with its graph, inverse [R]): each distinct row once, as the update's
    :func:`oma.train.loop.forward_plan` finds them; row r reads ``logp[inverse[r]]``."""
    (compute, served, local), = forward_plan(rows, torch.arange(len(rows)), len(rows))  # one micro-batch
    logp, _, _ = row_logprobs(model, rows, compute, pad_id, temperature=cfg.policy.temperature)
    assert torch.equal(served, torch.arange(len(rows)))
    return logp, local


def coefficient_gradient(logp, inverse, coef, params) -> torch.Tensor:
    """Gradient of −Σ_rows Σ_t coef[r, t]·logp[r, t], each row's coefficients added onto its distinct row."""
    c = torch.zeros(logp.shape, dtype=logp.dtype).index_add_(0, inverse, coef[:, : logp.shape[1]].to(logp.dtype))
    return flat_grad(-(c * logp).sum(), params)


PARTS = ("A > 0, the expert's action", "A > 0, another action", "A < 0, the expert's action", "A < 0, another action")


def rl_gradients(cfg, model, tokenizer, ro, params, log=None, by_kind=False) -> dict[str, torch.Tensor]:
    """Per variant, the update's gradient at ratio 1: of Σ W·(−A·logp), W and A as the update computes them;
    and ``sharpen``: the same with A = 1 on every row (raising the likelihood of what the policy did)."""
    rows = ro.rows
    mask = response_mask_of(rows)
    scores = episode_scores(cfg, rows)
    logp, inverse = distinct_logprobs(cfg, model, rows, tokenizer.pad_token_id)
    out = {}
    weights = {mass: token_weights(mask, rows.group_index, rows.traj_index, reducer=cfg.algo.reducer, mass=mass)
               for mass in ("uniform", "native")}
    for name, adv, mass in variant_advantages(cfg, rows, scores):
        w = weights[mass]
        coef = w * adv.unsqueeze(-1).to(w.dtype)
        out[name] = coefficient_gradient(logp, inverse, coef, params)
        if log is not None and name in ("gigpo OA+MA", "gigpo row+native"):
            agree = torch.tensor([e == a for e, _, a in log])
            for part, keep in zip(PARTS, ((adv > 0) & agree, (adv > 0) & ~agree, (adv < 0) & agree, (adv < 0) & ~agree)):
                out[f"{name} | {part}"] = coefficient_gradient(logp, inverse, coef * keep.unsqueeze(-1), params)
            if by_kind and name == "gigpo OA+MA":
                from first_step_credit import action_kind  # studies/tools/ is on sys.path when run as a script

                kinds = [action_kind(a) for _, _, a in log]
                for kind in sorted(set(kinds)):
                    keep = (adv > 0) & agree & torch.tensor([k == kind for k in kinds])
                    out[f"{name} | A > 0, the expert's action: {kind}"] = coefficient_gradient(
                        logp, inverse, coef * keep.unsqueeze(-1), params)
    out["sharpen (A = 1, OA+MA weights)"] = coefficient_gradient(logp, inverse, weights["uniform"], params)
    return out


def oracle_gradient(cfg, model, tokenizer, ro, log, params, keep=None) -> torch.Tensor:
    """Gradient of −(token-mean log-likelihood of the expert's actions) on the rollout's states; with
    ``keep`` (bool [R]) the part of it that comes from those rows (the token mean still over all rows)."""
    eos = tokenizer.eos_token_id
    responses = [ids + [eos] for ids in tokenizer([a for a, _, _ in log], add_special_tokens=False)["input_ids"]]
    allowed = [allowed_positions(action_choices(tokenizer, adm), r) for (_, adm, _), r in zip(log, responses)]
    expert_rows = Rows(prompt_ids=ro.rows.prompt_ids, response_ids=responses, allowed=allowed)
    logp, inverse = distinct_logprobs(cfg, model, expert_rows, tokenizer.pad_token_id)
    lengths = torch.tensor([len(r) for r in responses])
    coef = (torch.arange(logp.shape[1]) < lengths.unsqueeze(-1)).to(logp.dtype) / float(lengths.sum())
    if keep is not None:
        coef = coef * keep.unsqueeze(-1)
    return coefficient_gradient(logp, inverse, coef, params)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=4, help="independent batch pairs (each pair: 2 training batches)")
    ap.add_argument("--json", help="also write every per-batch cosine here")
    ap.add_argument("--by-kind", action="store_true",
                    help="also split the job's A > 0, expert's-action part by the kind of action (stays, leaves, take, ...)")
    ap.add_argument("overrides", nargs="*", help=f"config overrides of {MEASURED_JOB.name}, key=value")
    args = ap.parse_args(argv)
    cfg = load_config(MEASURED_JOB, [*args.overrides, f"seed={args.seed}"])
    torch.set_num_threads(cfg.threads)
    make_env = lambda: oma.envs.make(cfg.env.name, **cfg.env.options)  # noqa: E731
    model, tokenizer, _ = build_policy(cfg, make_env)
    params = [p for p in model.parameters() if p.requires_grad]
    g = cfg.env.tasks_per_iter
    held_out = [cfg.env.eval_seed_offset + k for k in range(cfg.env.eval_tasks)]
    table: dict[str, dict[str, list[float]]] = {}
    oracle_self: list[float] = []
    parts: dict[str, list[float]] = {}
    for b in range(args.batches):
        gen = torch.Generator().manual_seed(1_000 * args.seed + b)
        first = 50_000 + 2 * b * g  # training-like task seeds, disjoint from the job's first iterations
        ro1, log1 = labelled_rollout(cfg, model, tokenizer, list(range(first, first + g)), gen)
        ro2, log2 = labelled_rollout(cfg, model, tokenizer, list(range(first + g, first + 2 * g)), gen)
        half = [held_out[(b * g + k) % len(held_out)] for k in range(g)]
        roh, logh = labelled_rollout(cfg, model, tokenizer, half, gen)
        oracle = oracle_gradient(cfg, model, tokenizer, roh, logh, params)
        oracle_self.append(cos(oracle_gradient(cfg, model, tokenizer, ro1, log1, params), oracle))
        g1, g2 = (rl_gradients(cfg, model, tokenizer, ro, params, log, args.by_kind) for ro, log in ((ro1, log1), (ro2, log2)))
        unit = oracle / oracle.norm()
        for name in [n for n in g1 if " | " in n]:
            whole = name.split(" | ")[0]
            for gs in (g1, g2):
                parts.setdefault(name, []).append(float(gs[name] @ unit) / float(gs[whole].norm()))
        for name in [n for n in g1 if " | " not in n]:
            t = table.setdefault(name, {"cos oracle": [], "cos oracle, sign(g)": [], "cos other batch": [],
                                        "cos sharpen": [], "cos other batch, sign(g)": []})
            for gr, gs in ((g1[name], g1["sharpen (A = 1, OA+MA weights)"]), (g2[name], g2["sharpen (A = 1, OA+MA weights)"])):
                t["cos oracle"].append(cos(gr, oracle))  # both are loss gradients: their descent directions agree
                t["cos oracle, sign(g)"].append(cos(gr.sign(), oracle))
                t["cos sharpen"].append(cos(gr, gs))
            t["cos other batch"].append(cos(g1[name], g2[name]))
            t["cos other batch, sign(g)"].append(cos(g1[name].sign(), g2[name].sign()))
        print(f"batch {b + 1}/{args.batches}: {len(ro1.rows)} + {len(ro2.rows)} rows, held-out {len(roh.rows)} rows",
              file=sys.stderr)

    if args.json:
        Path(args.json).write_text(json.dumps({"seed": args.seed, "batches": args.batches, "oracle_self": oracle_self,
                                               "variants": table, "parts": parts}, indent=1))

    def fmt(xs):
        ci = mean_ci(xs)
        return f"{ci.mean:+.4f} ± {ci.half_width:.4f}"

    print(f"seed {args.seed}, {args.batches} batch pairs of {g} tasks × {cfg.env.group_size} episodes\n")
    print("| gradient | cos(g, oracle) | cos(sign g, oracle) | cos(g₁, g₂) | cos(sign g₁, sign g₂) | cos(g, sharpen) |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| oracle on a training batch (expert labels) | {fmt(oracle_self)} | | | | |")
    for name, t in table.items():
        print(f"| {name} | {fmt(t['cos oracle'])} | {fmt(t['cos oracle, sign(g)'])} | {fmt(t['cos other batch'])} "
              f"| {fmt(t['cos other batch, sign(g)'])} | {fmt(t['cos sharpen'])} |")
    base = table["gigpo row+native"]["cos oracle"]
    print("\nPaired with verl's accounting on the same batches: cos(g, oracle) − that of gigpo row+native.\n")
    print("| gradient | difference |")
    print("|---|---:|")
    for name, t in table.items():
        if name != "gigpo row+native":
            print(f"| {name} | {fmt([x - y for x, y in zip(t['cos oracle'], base)])} |")
    print("\nWhere cos(g, oracle) comes from: each kind of row's part of g, projected on the oracle, over |g|"
          " (the parts of a variant add up to its cos(g, oracle)).\n")
    print("| gradient | rows | share of cos(g, oracle) |")
    print("|---|---|---:|")
    for name, xs in parts.items():
        whole, part = name.split(" | ")
        print(f"| {whole} | {part} | {fmt(xs)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
