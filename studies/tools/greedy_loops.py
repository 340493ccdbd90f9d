"""Why greedy success lags sampled success: are greedy failures cycles, and where do they first go wrong?

Run by hand on a finished `oma train` run (results in studies/what-limits-learning/journal.md#why-greedy-success-lags-every-greedy-failure-is-a-loop-measured):

    .venv/bin/python studies/tools/greedy_loops.py runs/long-grpo/OA+MA/seed-0 --iteration 0
    .venv/bin/python studies/tools/greedy_loops.py runs/long-grpo/OA+MA/seed-0 --iteration 60

Replays the run's greedy held-out evaluation (the same 128 tasks as `evaluate`) with the warm start
(iteration 0, from the warm-start cache) or the checkpoint of an iteration, and counts the failed
episodes in which an observation repeats exactly. With no history window the prompt is the task
plus the observation, so a repeated observation under greedy decoding is a cycle to the step cap.
It then replays each failure in a fresh environment and counts the kinds of its first action that
differs from the expert's (household names rooms without a number, receptacles with one); results in
studies/what-limits-learning/journal.md#where-greedy-episodes-first-go-wrong-rl-shifts-a-preference-it-does-not-learn-the-rule-measured.
Of the first mistakes that go to a receptacle in the room while the goal is in another, it counts
those whose receptacle is of the type the task's hint names ("drawer" in "Hint: the mug 1 is in/on
drawer 1 in the kitchen."), against the count a uniform choice among the room's receptacles would
give: under constrained decoding the type is the first token the policy writes after "go to", and
the constraint then completes it with a number this room has (studies/what-limits-learning/journal.md#the-hints-receptacle-type-most-wrong-stays-copy-it-measured).
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
from pathlib import Path

import torch

from oma.agent.rollout import Episode
from oma.train import build_policy, load_checkpoint, load_run_config, make_optimizer, policy_rollout
from oma.train import make_env as env_factory  # the factory it returns is each caller's make_env


def first_repeat(episode: Episode) -> int | None:
    """Index of the first step whose observation was already seen in the episode, or None."""
    seen: set[str] = set()
    for i, (observation, _action) in enumerate(episode.transcript):
        if observation in seen:
            return i
        seen.add(observation)
    return None


def first_mistake(episode: Episode, make_env) -> tuple[str, str, list[str]] | None:
    """(policy action, expert action, admissible actions) at the first step where the two actions differ,
    replaying ``episode``."""
    env = make_env()
    _obs, info = env.reset(episode.seed)
    for _observation, action in episode.transcript:
        expert = env.expert_action()
        if action != expert:
            return action, expert, list(info["admissible_actions"])
        _obs, _reward, _terminated, _truncated, info = env.step(action)
    return None


_HINT = re.compile(r"Hint: the \S+ \d+ is in/on (\S+) \d+ in the ")


def hint_type(observation: str) -> str | None:
    """The receptacle type a household hint names ("drawer" for "... is in/on drawer 1 in the kitchen."), or None."""
    found = _HINT.search(observation)
    return found.group(1) if found else None


def receptacle_type(action: str) -> str | None:
    """"drawer" for "go to drawer 2"; None for a room ("go to kitchen") or another verb."""
    words = action.split(" ")
    return words[2] if len(words) == 4 and words[:2] == ["go", "to"] and words[3].isdigit() else None


def hint_type_share(admissible: list[str], wanted: str) -> float:
    """The chance that a uniform choice among the ``go to <receptacle>`` actions picks one of type ``wanted``."""
    types = [t for t in map(receptacle_type, admissible) if t is not None]
    if not types:
        raise ValueError("admissible: no 'go to <receptacle> <number>' action to choose among")
    return sum(t == wanted for t in types) / len(types)


STAYS = "goes to a receptacle here; the goal is in another room"


def mistake_kind(action: str, expert: str) -> str:
    """A household action pair named by what the policy got wrong."""
    def target(a: str) -> str:  # "room" | "receptacle" for a go-to action
        return "room" if receptacle_type(a) is None else "receptacle"
    if action.startswith("go to ") and expert.startswith("go to "):
        return {("receptacle", "room"): STAYS,
                ("room", "receptacle"): "leaves the room that holds the goal",
                ("room", "room"): "takes the wrong exit",
                ("receptacle", "receptacle"): "goes to the wrong receptacle in the room"}[(target(action), target(expert))]
    verb, expert_verb = action.split(" ", 1)[0], expert.split(" ", 1)[0]
    return f"{verb} instead of {expert_verb}" if verb != expert_verb else f"{verb}s the wrong object or place"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="an oma train run folder (holds config.json and checkpoints/)")
    ap.add_argument("--iteration", type=int, default=0, help="0 = the warm start; else a checkpointed iteration")
    args = ap.parse_args(argv)
    cfg = load_run_config(args.run)
    if cfg.env.history_length != 0:
        print(f"{args.run}: env.history_length is {cfg.env.history_length}; the count assumes 0", file=sys.stderr)
        return 2
    if cfg.env.options.get("text", "alfworld") != "alfworld":  # hint_type reads ALFWorld's sentences
        print(f"{args.run}: env.options.text is {cfg.env.options['text']!r}; the count reads 'alfworld' text", file=sys.stderr)
        return 2
    torch.set_num_threads(cfg.threads)
    make_env = env_factory(cfg)
    model, tokenizer, _ = build_policy(cfg, make_env)
    if args.iteration:
        optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
        load_checkpoint(args.run / "checkpoints" / f"iter_{args.iteration:06d}", model, optimizer)
    seeds = [cfg.env.eval_seed_offset + k for k in range(cfg.env.eval_tasks)]
    ro = policy_rollout(cfg, make_env, model, tokenizer, seeds, group_size=1, temperature=0.0, generator=None)
    failures = [e for e in ro.episodes if not e.won]
    repeats = [r for r in map(first_repeat, failures) if r is not None]
    median = statistics.median(repeats) if repeats else None
    print(f"| {args.run} it {args.iteration} | {ro.success_rate:.3f} | {len(failures)} | {len(repeats)} | {median} |")
    kinds: collections.Counter[str] = collections.Counter()
    stays, copied, expected = 0, 0, 0.0
    for episode in failures:
        mistake = first_mistake(episode, make_env)
        if mistake is None:
            kinds["none (followed the expert)"] += 1
            continue
        action, expert, admissible = mistake
        kind = mistake_kind(action, expert)
        kinds[kind] += 1
        wanted = hint_type(episode.transcript[0][0])
        if kind == STAYS and wanted is not None:
            stays += 1
            copied += receptacle_type(action) == wanted
            expected += hint_type_share(admissible, wanted)
    print("\n| first action that differs from the expert's | failures |\n|---|---:|")
    for kind, count in kinds.most_common():
        print(f"| {kind} | {count} |")
    print(f"\n{STAYS}: {stays}; of the hint's receptacle type: {copied} "
          f"(a uniform choice among the room's receptacles: {expected:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
