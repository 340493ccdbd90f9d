"""Which way does one batch push a household task's first decision: stay in the room, or leave it?

Run by hand (results in studies/what-limits-learning/journal.md#where-greedy-episodes-first-go-wrong-rl-shifts-a-preference-it-does-not-learn-the-rule-measured):

    .venv/bin/python studies/tools/first_step_credit.py --seed 0
    .venv/bin/python studies/tools/first_step_credit.py --seed 2

Rolls out the warm start of the default job of 2026-12-04 (:data:`MEASURED_JOB`; ``--seed`` picks
it, as ``oma train studies/default-job/household-gigpo-oma-2026-12-04.yaml seed=K`` does) on
``--tasks`` training tasks × ``env.group_size`` episodes, and computes each row's advantage and
per-token loss weights exactly as an update would, under the job's accounting and mass and under
``row`` + ``native`` (verl's), on the same rows. At the first step the agent stands in the middle of a
room, and the hint names the goal's room. The first action either goes to a receptacle here
(stays) or to an exit (leaves). For each case × action it prints the rows, their mean advantage, and
their push W·A: the coefficient of that action's log-likelihood in the update's gradient at ratio 1
(W the weight of each of the row's tokens), summed over the rows and given as a share of the
batch's Σ |W·A|.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import replace

from pathlib import Path

import torch

from oma.core import token_weights
from oma.train import advantages, build_policy, episode_scores, load_config, policy_rollout, response_mask_of
from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env

MEASURED_JOB = Path(__file__).resolve().parents[1] / "default-job" / "household-gigpo-oma-2026-12-04.yaml"
"""The job this script's and its neighbours' committed figures were measured on (the default job until
2026-12-05); its observations are ALFWorld's sentences, which :func:`first_step_case` reads."""


def first_step_case(task: str, observation: str) -> str:
    """``goal here`` | ``goal elsewhere``: is the hint's room the room of the first observation?"""
    here, goal = re.search(r"middle of the (\w+)", observation), re.search(r" in the (\w+)\.$", task.strip())
    if not (here and goal):
        raise ValueError("household first step without a room or a hint in ALFWorld's sentences (env.options.hint must "
                         f"be true and env.options.text alfworld): {task!r}")
    return "goal here" if here.group(1) == goal.group(1) else "goal elsewhere"


def action_kind(action: str) -> str:
    """``stays`` (go to a numbered receptacle), ``leaves`` (go to a room), or the verb."""
    if action.startswith("go to "):
        return "stays" if action.rsplit(" ", 1)[-1].isdigit() else "leaves"
    return action.split(" ", 1)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("overrides", nargs="*", help=f"config overrides of {MEASURED_JOB.name}, key=value")
    args = ap.parse_args(argv)
    cfg = load_config(MEASURED_JOB, [*args.overrides, f"seed={args.seed}"])
    if cfg.env.name != "household":
        print(f"env.name is {cfg.env.name!r}; this count needs household", file=sys.stderr)
        return 2
    torch.set_num_threads(cfg.threads)
    make_env = env_factory(cfg)
    model, tokenizer, _ = build_policy(cfg, make_env)
    seeds = list(range(args.tasks))
    ro = policy_rollout(cfg, make_env, model, tokenizer, seeds, group_size=cfg.env.group_size,
                        temperature=cfg.policy.temperature, generator=torch.Generator().manual_seed(args.seed))
    rows = ro.rows
    cases = {}
    for k, s in enumerate(seeds):
        observation, info = make_env().reset(s)
        cases[k] = first_step_case(info["task"], observation)
    first = (rows.step_index == 0).nonzero().squeeze(-1).tolist()
    cell = {i: (cases[int(rows.group_index[i])], action_kind(tokenizer.decode(rows.response_ids[i], skip_special_tokens=True).strip()))
            for i in first}
    mask, scores = response_mask_of(rows), episode_scores(cfg, rows)
    columns = {f"{cfg.algo.accounting} + {cfg.algo.mass} (the job)": cfg.algo,
               "row + native": replace(cfg.algo, accounting="row", mass="native")}
    table: dict[tuple[str, str], list[str]] = defaultdict(list)
    for algo in columns.values():
        c = replace(cfg, algo=algo)
        adv = advantages(c, rows, scores)
        w = token_weights(mask, rows.group_index, rows.traj_index, reducer=algo.reducer, mass=algo.mass)
        # every reducer weighs a row's tokens alike, so Σ_t W_t·A·∇logp_t = W_token·A·∇log π(action)
        push = w.sum(-1) / mask.sum(-1) * adv.double()
        total = float(push.abs().sum())
        for key in sorted(set(cell.values())):
            idx = [i for i in first if cell[i] == key]
            table[key].append(f"{float(adv[idx].mean()):+.3f} | {100 * float(push[idx].sum()) / total:+.2f}%")
    print(f"seed {args.seed}: {len(seeds)} tasks × {cfg.env.group_size}, success {ro.success_rate:.3f}\n")
    print("| first step | first action | rows | " + " | ".join(f"mean A, {n} | push, {n}" for n in columns) + " |")
    print("|---|---|---:|" + "---:|---:|" * len(columns))
    for (case, kind), values in sorted(table.items()):
        print(f"| {case} | {kind} | {sum(cell[i] == (case, kind) for i in first)} | " + " | ".join(values) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
