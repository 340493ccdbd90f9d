"""Which pushes of an RL batch move a household policy's stay-or-leave decision, and where?

Run by hand (results in studies/what-limits-learning/journal.md#which-pushes-move-the-room-decision-every-direction-moves-both-kinds-together-measured):

    .venv/bin/python studies/tools/room_bias.py --seed 0 --batches 3 threads=1
    .venv/bin/python studies/tools/room_bias.py --seed 2 --batches 3 --json out.json threads=1

The probes are the first states of the 128 held-out tasks of the default job of 2026-12-04, the
warm start of ``--seed`` (as ``oma train studies/default-job/household-gigpo-oma-2026-12-04.yaml seed=K`` builds
it, cached). In each the agent stands in the middle of a
room and the hint names the goal's room: staying (going to a receptacle here) is right when the two
rooms are the same, leaving (going to a room) when they differ. Each probe's decision is

    f(s) = log Σ_{a leaves} π(a | s) − log Σ_{a stays} π(a | s),

π the constrained policy at ``policy.temperature``, and its gradient J(s) = ∇_θ f(s). A step of
length η along a direction d changes f(s) by η·J(s)·d to first order. With d = −g/|g| for a
batch's update gradient g, the script reports the mean change of f on the probes where the goal
is here (where f should fall) and where it is elsewhere (where f should rise), per unit step:

* ``bias``: the mean of the two, how far the step moves "leave" against "stay" everywhere;
* ``comparison``: elsewhere minus here, how far it moves the decision the task needs. A rule that
  compares the two room names moves the comparison; a preference moves the bias.

Directions: the job's update gradient at ratio 1 on a training batch (W and A as the update computes
them), split into the pushes of each kind of row (the state's right decision, read from the expert;
what the policy did; the sign of A), so the parts add up to the whole; and, for comparison, the
gradient of the expert actions' likelihood on the same batch's states (SFT's labels, as
``studies/tools/gradient_alignment.py``'s oracle is built). The kernel of the probes, cos(J(s), J(s'))
within and across the two kinds, says how much a push on one kind of state moves the other.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from first_step_credit import MEASURED_JOB, action_kind, first_step_case  # studies/tools/ is on sys.path when run as a script
from gradient_alignment import coefficient_gradient, distinct_logprobs, flat_grad, labelled_rollout, oracle_gradient
from oma.agent.policy import action_choices, allowed_positions
from oma.agent.rollout import Rows
from oma.core import token_weights
from oma.experiments.stats import mean_ci
from oma.train import advantages, build_policy, episode_scores, load_config, load_run_config, response_mask_of, row_logprobs
from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env

SFT = "expert labels on the batch's states (SFT)"


def decision(cfg, model, tokenizer, prompt: list[int], admissible: list[str]) -> torch.Tensor:
    """f(s) = log π(leave | s) − log π(stay | s) (a 0-dim tensor with its graph) at one first state."""
    choices = action_choices(tokenizer, admissible)
    kinds = [action_kind(a) for a in admissible]
    if "stays" not in kinds or "leaves" not in kinds:
        raise ValueError(f"a first state without both a receptacle and a room to go to: {admissible}")
    rows = Rows(prompt_ids=[prompt] * len(admissible), response_ids=choices,  # each ends with EOS
                allowed=[allowed_positions(choices, r) for r in choices])
    logp, mask, _ = row_logprobs(model, rows, torch.arange(len(rows)), tokenizer.pad_token_id,
                                 temperature=cfg.policy.temperature)
    action_logp = (logp * mask).sum(-1)
    leaves, stays = (torch.tensor([k == kind for k in kinds]) for kind in ("leaves", "stays"))  # others ("look") in neither
    return torch.logsumexp(action_logp[leaves], 0) - torch.logsumexp(action_logp[stays], 0)


def first_states(cfg, model, tokenizer, make_env):
    """The held-out first states: ``(prompt ids, admissible actions, case, greedy action kind)`` per task,
    from one greedy episode of each of the job's held-out tasks (their prompts are the rollout's own)."""
    seeds = [cfg.env.eval_seed_offset + k for k in range(cfg.env.eval_tasks)]
    ro, log = labelled_rollout(cfg, model, tokenizer, seeds, None, group_size=1, temperature=0.0)
    out = []
    for i in (ro.rows.step_index == 0).nonzero().squeeze(-1).tolist():
        observation, info = make_env().reset(seeds[int(ro.rows.group_index[i])])
        out.append((ro.rows.prompt_ids[i], log[i][1], first_step_case(info["task"], observation), action_kind(log[i][2])))
    return out


def probes(cfg, model, tokenizer, make_env, params):
    """(case per probe, the warm start's greedy first action kind, f [N], J [N, P]) on the held-out first states."""
    cases, greedy, values, jac = [], [], [], []
    for prompt, admissible, case, kind in first_states(cfg, model, tokenizer, make_env):
        cases.append(case)
        greedy.append(kind)
        f = decision(cfg, model, tokenizer, prompt, admissible)
        values.append(float(f.detach()))
        jac.append(flat_grad(f, params))
    return cases, greedy, torch.tensor(values), torch.stack(jac)


def row_kinds(log) -> list[str]:
    """Per row: the state's right decision (the expert's action kind) and what the policy did."""
    def named(kind):
        return kind if kind in ("stays", "leaves") else "other"
    return [f"right: {named(action_kind(expert))}, did: {named(action_kind(action))}" for expert, _, action in log]


def batch_directions(cfg, model, tokenizer, ro, log, params) -> dict[str, torch.Tensor]:
    """The job's update gradient of one batch (Σ W·(−A·logp) at ratio 1), its parts by row kind × sign of A,
    and the expert-label gradient on the same states."""
    rows = ro.rows
    mask = response_mask_of(rows)
    adv = advantages(cfg, rows, episode_scores(cfg, rows))
    w = token_weights(mask, rows.group_index, rows.traj_index, reducer=cfg.algo.reducer, mass=cfg.algo.mass)
    coef = w * adv.unsqueeze(-1).to(w.dtype)
    logp, inverse = distinct_logprobs(cfg, model, rows, tokenizer.pad_token_id)
    out = {"the job's update": coefficient_gradient(logp, inverse, coef, params)}
    kinds = row_kinds(log)
    for kind in sorted(set(kinds)):
        for sign, keep_sign in (("A > 0", adv > 0), ("A < 0", adv < 0)):
            keep = keep_sign & torch.tensor([k == kind for k in kinds])
            if bool(keep.any()):
                out[f"{kind}, {sign}"] = coefficient_gradient(logp, inverse, coef * keep.unsqueeze(-1), params)
    out[SFT] = oracle_gradient(cfg, model, tokenizer, ro, log, params)
    right = [k.split(",")[0] for k in kinds]
    for kind in sorted(set(right)):
        keep = torch.tensor([k == kind for k in right])
        out[f"{SFT}, {kind}"] = oracle_gradient(cfg, model, tokenizer, ro, log, params, keep)
    return out


def mean_cos(jac: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean cos(J(s), J(s')) over pairs s ∈ a, s' ∈ b, s ≠ s'."""
    unit = jac / jac.norm(dim=1, keepdim=True)
    ia, ib = a.nonzero().squeeze(-1), b.nonzero().squeeze(-1)
    return float((unit[ia] @ unit[ib].T)[ia.unsqueeze(1) != ib.unsqueeze(0)].mean())


CREDIT = {  # the job's update's parts on the two room decisions, by whether their push is the right one
    "right action pushed up or wrong one down, toward leaving": ("right: leaves, did: leaves, A > 0", "right: leaves, did: stays, A < 0"),
    "right action pushed up or wrong one down, toward staying": ("right: stays, did: stays, A > 0", "right: stays, did: leaves, A < 0"),
    "right action pushed down or wrong one up, toward staying": ("right: leaves, did: leaves, A < 0", "right: leaves, did: stays, A > 0"),
    "right action pushed down or wrong one up, toward leaving": ("right: stays, did: stays, A < 0", "right: stays, did: leaves, A > 0"),
}


def fmt(xs: list[float], digits: int = 3) -> str:
    ci = mean_ci(xs)
    return f"{ci.mean:+.{digits}f} ± {ci.half_width:.{digits}f}"


def credit_table(table: dict) -> str:
    """Markdown: the bias and comparison of the parts of :data:`CREDIT`, summed per batch, mean ± CI over batches."""
    lines = ["| rows of the two room decisions | bias | comparison |", "|---|---:|---:|"]
    groups = {**CREDIT, "all mis-credited (the last two)": sum(list(CREDIT.values())[2:], ()),
              "all rightly credited (the first two)": sum(list(CREDIT.values())[:2], ())}
    for name, parts in groups.items():
        present = [p for p in parts if p in table]
        n = len(table["the job's update"]["bias"])
        sums = {k: [sum(table[p][k][i] for p in present) for i in range(n)] for k in ("bias", "comparison")}
        lines.append(f"| {name} | {fmt(sums['bias'], 2)} | {fmt(sums['comparison'], 2)} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """Per seed, each direction's mean change of f on the goal-here probes (x) against the goal-elsewhere ones (y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 5), squeeze=False)
    for ax, res in zip(axes[0], results):
        lim = 1.1 * max(abs(v) for t in res["table"].values() for k in ("here", "elsewhere") for v in [mean_ci(t[k]).mean])
        ax.fill_between([-lim, 0], 0, lim, color="tab:green", alpha=0.12, label="learns the comparison (here falls, elsewhere rises)")
        ax.plot([-lim, lim], [-lim, lim], color="grey", lw=0.8, ls="--", label="moves both kinds alike")
        part_label = "a part of the job's update (row kind × sign of A)"
        for name, t in res["table"].items():
            x, y = mean_ci(t["here"]).mean, mean_ci(t["elsewhere"]).mean
            if name == "the job's update":
                ax.scatter(x, y, s=90, marker="*", color="tab:red", zorder=3, label="the job's update")
            elif name == SFT:
                ax.scatter(x, y, s=70, marker="s", color="tab:blue", zorder=3, label="expert labels (SFT), same states")
            elif not name.startswith(SFT):
                ax.scatter(x, y, s=18, color="black", alpha=0.6, zorder=2, label=part_label)
                part_label = None  # one legend entry for all the parts
        ax.axhline(0, color="black", lw=0.5)
        ax.axvline(0, color="black", lw=0.5)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_xlabel("Δ log-odds of leaving, goal here (should fall)")
        ax.set_ylabel("Δ log-odds of leaving, goal elsewhere (should rise)")
        ax.set_title(f"seed {res['seed']}: per unit step, {res['batches']} batches")
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=120)


def trajectory(group: Path) -> list[dict]:
    """For each ``seed-K`` run of ``group`` (folders of ``oma train``): the mean f on the goal-here and
    goal-elsewhere probes at the warm start and at every checkpointed iteration."""
    from oma.train import load_checkpoint, make_optimizer

    out = []
    for run in sorted(group.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        cfg = load_run_config(run)
        torch.set_num_threads(cfg.threads)
        make_env = env_factory(cfg)
        model, tokenizer, _ = build_policy(cfg, make_env)
        states = first_states(cfg, model, tokenizer, make_env)  # at the warm start: the first prompts do not depend on it
        here_t = torch.tensor([case == "goal here" for _, _, case, _ in states])
        iterations = [0] + sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("iter_*"))
        optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
        for it in iterations:
            if it:
                load_checkpoint(run / "checkpoints" / f"iter_{it:06d}", model, optimizer)
            with torch.no_grad():
                f = torch.tensor([float(decision(cfg, model, tokenizer, prompt, admissible))
                                  for prompt, admissible, _, _ in states])
            out.append({"run": str(run), "seed": cfg.seed, "iteration": it, "here": float(f[here_t].mean()),
                        "elsewhere": float(f[~here_t].mean())})
        print(f"{run}: iterations {iterations}", file=sys.stderr)
    return out


def trajectory_table(points: list[dict]) -> str:
    """Markdown: per seed and iteration the mean f of both kinds, then the change from the warm start
    to the last iteration, mean ± CI over seeds, of the bias and the comparison."""
    lines = ["| seed | iteration | f, goal here | f, goal elsewhere | bias | comparison |", "|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        lines.append(f"| {p['seed']} | {p['iteration']} | {p['here']:+.2f} | {p['elsewhere']:+.2f} "
                     f"| {(p['here'] + p['elsewhere']) / 2:+.2f} | {p['elsewhere'] - p['here']:+.2f} |")
    by_run: dict[str, list[dict]] = defaultdict(list)
    for p in points:
        by_run[p["run"]].append(p)
    first_last = [(ps[0], ps[-1]) for ps in by_run.values()]
    bias = [((b["here"] + b["elsewhere"]) - (a["here"] + a["elsewhere"])) / 2 for a, b in first_last]
    comparison = [(b["elsewhere"] - b["here"]) - (a["elsewhere"] - a["here"]) for a, b in first_last]
    last = first_last[0][1]["iteration"]
    lines += ["", f"From the warm start to iteration {last}, over {len(first_last)} seeds: bias {fmt(bias, 2)}, "
              f"comparison {fmt(comparison, 2)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot", nargs="+", metavar="JSON", help="only plot these --json outputs to --png, one panel each")
    ap.add_argument("--png", type=Path, default=Path("studies/what-limits-learning/room-bias.png"))
    ap.add_argument("--trajectory", nargs="+", type=Path, metavar="GROUP",
                    help="only follow f through training: GROUP holds seed-K run folders of oma train")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=3, help="training batches, each of the job's tasks × episodes")
    ap.add_argument("--json", help="also write every per-batch figure here")
    ap.add_argument("overrides", nargs="*", help=f"config overrides of {MEASURED_JOB.name}, key=value")
    args = ap.parse_args(argv)
    if args.plot:
        results = [json.loads(Path(p).read_text()) for p in args.plot]
        plot(results, args.png)
        for res in results:
            print(f"seed {res['seed']}, the job's update by credit:\n\n{credit_table(res['table'])}\n")
        print(f"wrote {args.png}")
        return 0
    if args.trajectory:
        # nargs="+" also takes a key=value written after the groups: say so instead of an empty table
        for group in args.trajectory:
            if not any(group.glob("seed-*")):
                print(f"--trajectory {group}: expected a folder holding seed-K run folders of oma train "
                      "(the trajectory reads each run's own config, so it takes no overrides)", file=sys.stderr)
                return 2
        for group in args.trajectory:
            print(f"## {group}\n\n{trajectory_table(trajectory(group))}\n")
        return 0
    cfg = load_config(MEASURED_JOB, [*args.overrides, f"seed={args.seed}"])
    if cfg.env.name != "household" or not cfg.env.options.get("hint"):
        print(f"this measurement needs household with env.options.hint=true ({MEASURED_JOB.name})", file=sys.stderr)
        return 2
    torch.set_num_threads(cfg.threads)
    make_env = env_factory(cfg)
    model, tokenizer, _ = build_policy(cfg, make_env)
    params = [p for p in model.parameters() if p.requires_grad]
    cases, greedy, f, jac = probes(cfg, model, tokenizer, make_env, params)
    here = torch.tensor([c == "goal here" for c in cases])
    wrong_stay = torch.tensor([c == "goal elsewhere" and k == "stays" for c, k in zip(cases, greedy)])
    if not (here.any() and (~here).any() and wrong_stay.any()):
        print(f"seed {args.seed}: the probes need both cases and a wrong stay; got {int(here.sum())} goal here, "
              f"{int((~here).sum())} elsewhere, {int(wrong_stay.sum())} wrong stays", file=sys.stderr)
        return 2
    j_here, j_else, j_wrong = jac[here].mean(0), jac[~here].mean(0), jac[wrong_stay].mean(0)
    print(f"seed {args.seed}: {len(cases)} probes, {int(here.sum())} goal here (greedy stays on "
          f"{sum(k == 'stays' for c, k in zip(cases, greedy) if c == 'goal here')}), {int((~here).sum())} goal elsewhere "
          f"(greedy stays on {int(wrong_stay.sum())}); mean f: here {float(f[here].mean()):+.2f}, "
          f"elsewhere {float(f[~here].mean()):+.2f}", file=sys.stderr)

    table: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    g = cfg.env.tasks_per_iter
    for b in range(args.batches):
        first = 50_000 + b * g  # training-like task seeds, disjoint from the job's first iterations
        ro, log = labelled_rollout(cfg, model, tokenizer, list(range(first, first + g)),
                                   torch.Generator().manual_seed(1_000 * args.seed + b))
        directions = batch_directions(cfg, model, tokenizer, ro, log, params)
        whole, sft = directions["the job's update"].norm(), directions[SFT].norm()
        for name, d in directions.items():
            step = -d / (sft if name.startswith(SFT) else whole)  # descent, per unit length of the whole
            t = table[name]
            t["here"].append(float(j_here @ step))
            t["elsewhere"].append(float(j_else @ step))
            t["wrong stays"].append(float(j_wrong @ step))
            t["bias"].append((t["here"][-1] + t["elsewhere"][-1]) / 2)
            t["comparison"].append(t["elsewhere"][-1] - t["here"][-1])
        print(f"batch {b + 1}/{args.batches}: {len(ro.rows)} rows", file=sys.stderr)

    kernel = {"within goal here": mean_cos(jac, here, here), "within goal elsewhere": mean_cos(jac, ~here, ~here),
              "across the two": mean_cos(jac, here, ~here)}
    mean_dirs = {"cos(mean J here, mean J elsewhere)": float(torch.nn.functional.cosine_similarity(j_here, j_else, dim=0)),
                 "|mean J elsewhere − mean J here| / |mean J|": float((j_else - j_here).norm() / ((j_else + j_here) / 2).norm()),
                 "|mean J here| / |mean J elsewhere|": float(j_here.norm() / j_else.norm())}
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": args.seed, "batches": args.batches, "cases": cases, "greedy": greedy,
                                               "f": f.tolist(), "kernel": kernel, "mean_directions": mean_dirs,
                                               "table": table}, indent=1))

    print(f"seed {args.seed}: {len(cases)} held-out first states ({int(here.sum())} goal here, "
          f"{int((~here).sum())} goal elsewhere, of which the warm start's greedy action stays on {int(wrong_stay.sum())}); "
          f"{args.batches} batches of {g} tasks × {cfg.env.group_size} episodes\n")
    print("Kernel of the probes' decision gradients, mean cos(J(s), J(s')):\n")
    print("| pairs | mean cos |\n|---|---:|")
    for name, v in {**kernel, **mean_dirs}.items():
        print(f"| {name} | {v:+.3f} |")
    print("\nChange of f = log π(leave) − log π(stay) per unit step along each direction (the parts of the job's"
          " update, and the parts of SFT's, are per unit length of their whole, and add up to it):\n")
    print("| direction | goal here (should fall) | goal elsewhere (should rise) | wrong stays | bias | comparison |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, t in table.items():
        print(f"| {name} | {fmt(t['here'])} | {fmt(t['elsewhere'])} | {fmt(t['wrong stays'])} | {fmt(t['bias'])} "
              f"| {fmt(t['comparison'])} |")
    print(f"\nThe job's update on the two room decisions, by credit:\n\n{credit_table(table)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
