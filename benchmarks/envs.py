"""Throughput of the built-in text environments (run by hand; prints a Markdown table).

    .venv/bin/python benchmarks/envs.py [--steps 200000]

For each environment, a uniformly random admissible policy plays episodes back to back on one
core. Reported: environment steps per second with the time spent in ``reset`` left out and
included, the mean ``reset`` time (world generation, including the expert check that redraws
unsolvable worlds), and the cost of ``expert_action`` and ``anchor`` on the same states.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

from oma.envs import make, names


def measure(name: str, steps: int) -> dict[str, float]:
    env = make(name)
    rng = random.Random(0)
    step_time = reset_time = expert_time = anchor_time = 0.0
    done_steps = episodes = 0
    while done_steps < steps:
        start = time.perf_counter()
        _, info = env.reset(episodes)
        reset_time += time.perf_counter() - start
        episodes += 1
        while True:
            if done_steps % 10 == 0:  # the optional calls, sampled on every tenth state
                start = time.perf_counter()
                env.expert_action()
                middle = time.perf_counter()
                env.anchor()
                expert_time += middle - start
                anchor_time += time.perf_counter() - middle
            start = time.perf_counter()
            actions = info["admissible_actions"]
            _, _, terminated, truncated, info = env.step(actions[int(rng.random() * len(actions))])
            step_time += time.perf_counter() - start
            done_steps += 1
            if terminated or truncated:
                break
    sampled = -(-done_steps // 10)
    return {
        "steps": done_steps,
        "episodes": episodes,
        "steps_per_s": done_steps / step_time,
        "steps_per_s_with_reset": done_steps / (step_time + reset_time),
        "reset_us": reset_time / episodes * 1e6,
        "expert_us": expert_time / sampled * 1e6,
        "anchor_us": anchor_time / sampled * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000, help="steps per environment")
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, {platform.machine()}, one process\n")
    print(
        "| env | steps | episodes | steps/s (step only) | steps/s (with reset) | reset (µs) "
        "| expert_action (µs) | anchor (µs) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names():
        m = measure(name, args.steps)
        print(
            f"| {name} | {m['steps']} | {m['episodes']} | {m['steps_per_s']:,.0f} "
            f"| {m['steps_per_s_with_reset']:,.0f} | {m['reset_us']:.0f} | {m['expert_us']:.1f} "
            f"| {m['anchor_us']:.1f} |"
        )


if __name__ == "__main__":
    main()
