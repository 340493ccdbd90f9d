"""``chain``: a tiny chain whose ``on_wrong`` option sets the sign of the length–outcome coupling."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from oma.envs import coupling, make, rollout
from oma.agent.tabular import action_tokens
from oma.envs.chain import ACTIONS, EQUAL_ACTIONS, SIGNS, correct_action
from oma.envs.coupling import NoisyExpert
from test_envs import expert_run

ON_WRONG = ("stay", "reset", "end", "advance", "trap", "stuck")


def right(env) -> str:
    return env.expert_action()


def wrong(env) -> str:
    """An admissible action other than the right one (the first such)."""
    return next(a for a in ACTIONS[: env.options.actions] if a != env.expert_action())


@pytest.mark.parametrize("reward", ["success", "progress"])
@pytest.mark.parametrize("on_wrong", ON_WRONG)
@pytest.mark.parametrize("length", [1, 5, 8])
def test_the_expert_wins_every_task_in_exactly_length_steps(length, on_wrong, reward) -> None:
    env = make("chain", length=length, on_wrong=on_wrong, reward=reward, max_steps=length)
    for seed in range(100):
        actions, info = expert_run(env, seed)
        assert info["won"] and len(actions) == length == env.expert_step_bound, seed
    env.reset(99)
    *_, (_, last_reward, terminated, truncated, _) = [env.step(a) for a in actions]
    assert (last_reward, terminated, truncated) == (1.0, True, False)


def test_looks_like_a_chain() -> None:
    env = make("chain", length=3)
    obs, info = env.reset(0)
    assert info["task"] == "Reach the end of the chain: at each step, take the action the sign calls for."
    assert obs == f"Step 1 of 3. The sign is {SIGNS[env._signs[0]]}."
    assert info["admissible_actions"] == list(ACTIONS[:4])
    assert env.step(right(env))[0] == f"Step 2 of 3. The sign is {SIGNS[env._signs[1]]}."
    obs, reward, *_ = env.step("xyzzy")
    assert obs == f"Nothing happens.\nStep 2 of 3. The sign is {SIGNS[env._signs[1]]}." and reward == 0.0


def test_admissible_actions_differ_in_word_count() -> None:
    """The point of the phrases: the rows of a step differ in tokens by the action taken."""
    env = make("chain", actions=6)
    _, info = env.reset(0)
    assert [len(a.split()) for a in info["admissible_actions"]] == [1, 9, 3, 2, 6, 4]
    assert make("chain", actions=2).reset(0)[1]["admissible_actions"] == [ACTIONS[0], ACTIONS[1]]


def test_stay_keeps_the_position() -> None:
    env = make("chain", length=3)
    env.reset(0)
    env.step(right(env))
    before = env.anchor()
    obs, reward, terminated, truncated, _ = env.step(wrong(env))
    assert obs.startswith("Step 2 of 3.") and (reward, terminated, truncated) == (0.0, False, False)
    assert env.anchor() == before
    env.step(right(env))
    _, reward, terminated, _, info = env.step(right(env))
    assert (reward, terminated, info["won"]) == (1.0, True, True)  # 2 + 1 wrong = step 4


def test_reset_goes_back_to_the_first_position() -> None:
    env = make("chain", length=3, on_wrong="reset")
    env.reset(0)
    start = env.anchor()
    env.step(right(env))
    env.step(right(env))
    obs, reward, terminated, _, _ = env.step(wrong(env))  # at the last position
    assert obs.startswith("Step 1 of 3.") and (reward, terminated) == (0.0, False)
    assert env.anchor() == start  # under success reward nothing else is remembered
    results = [env.step(right(env)) for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True] and results[-1][4]["won"]


@pytest.mark.parametrize(("reward", "paid"), [("success", 0.0), ("progress", 1 / 3)])
def test_end_is_a_dead_end(reward: str, paid: float) -> None:
    env = make("chain", length=3, on_wrong="end", reward=reward)
    env.reset(0)
    assert env.step(right(env))[1] == 0.0
    obs, reward_, terminated, truncated, info = env.step(wrong(env))
    assert obs == "Wrong way: the chain breaks here."
    assert (reward_, terminated, truncated, info["won"]) == (paid, True, False, False)
    assert info["admissible_actions"] == [] and env.anchor().endswith(":strayed" + ":credit=1" * (reward == "progress"))


@pytest.mark.parametrize(("reward", "paid"), [("success", 0.0), ("progress", 2 / 3)])
def test_advance_moves_on_but_cannot_win(reward: str, paid: float) -> None:
    env = make("chain", length=3, on_wrong="advance", reward=reward)
    env.reset(0)
    obs, reward_, terminated, _, info = env.step(wrong(env))
    assert obs.startswith("Step 2 of 3.") and obs.endswith("You went wrong; this path cannot reach the end.")
    assert (reward_, terminated) == (0.0, False) and right(env) in info["admissible_actions"]
    env.step(right(env))
    obs, reward_, terminated, truncated, info = env.step(right(env))  # 2 of 3 right
    assert obs == "You reached the end of the path, but it was the wrong path."
    assert (reward_, terminated, truncated, info["won"]) == (paid, True, False, False)


def test_advance_episodes_last_exactly_length_steps() -> None:
    env = make("chain", on_wrong="advance", length=6)
    policy = NoisyExpert(0.5)
    episodes = [rollout(env, policy, seed) for seed in range(200)]
    assert {e.steps for e in episodes} == {6}
    assert 0 < sum(e.won for e in episodes) < 200 and not any(e.truncated for e in episodes)


def test_trap_is_a_dead_end_that_runs_to_the_cap() -> None:
    """Length 3, cap 7: right, wrong (trapped at position 2), then every action, the right one
    included, leaves the agent there, told it cannot win, until the 7th step truncates a failure."""
    env = make("chain", length=3, max_steps=7, on_wrong="trap")
    env.reset(0)
    env.step(right(env))
    live = env.anchor()
    obs, reward, terminated, truncated, info = env.step(wrong(env))
    assert obs == f"Step 2 of 3. The sign is {SIGNS[env._signs[1]]}. You went wrong; this path cannot reach the end."
    assert (reward, terminated, truncated, info["won"]) == (0.0, False, False, False)
    assert info["admissible_actions"] == list(ACTIONS[:4])  # the same actions: its rows look like live ones
    trapped = env.anchor()
    assert trapped == live + ":strayed"  # never confused with the live state it went wrong in
    results = [env.step(a(env)) for a in (right, right, wrong, right, right)]
    assert [r[0] for r in results] == [obs] * 5 and {env.anchor()} == {trapped}
    assert [(r[1], r[2], r[3]) for r in results] == [(0.0, False, False)] * 4 + [(0.0, False, True)]
    assert results[-1][4]["won"] is False and results[-1][4]["admissible_actions"] == []


@pytest.mark.parametrize("length", [1, 3, 6])
def test_trap_failures_last_the_cap_and_nothing_wins_after_a_wrong_action(length: int) -> None:
    """Noisy play: an episode with a wrong action is lost and lasts exactly ``max_steps``; one without
    is won in exactly ``length`` steps (the ratio is max_steps / length whatever the policy)."""
    env = make("chain", length=length, max_steps=3 * length + 1, on_wrong="trap")
    rng = random.Random(length)
    lengths = {True: set(), False: set()}
    for seed in range(200):
        _, info = env.reset(seed)
        went_wrong, steps = False, 0
        while True:
            action = env.expert_action() if rng.random() < 0.8 else rng.choice(info["admissible_actions"])
            went_wrong = went_wrong or action != env.expert_action()
            _, _, terminated, truncated, info = env.step(action)
            steps += 1
            if terminated or truncated:
                break
        assert info["won"] == (not went_wrong) == terminated, seed
        lengths[info["won"]].add(steps)
    assert lengths == {True: {length}, False: {3 * length + 1}}


def test_trap_progress_pays_the_position_it_went_wrong_at_when_the_cap_ends_it() -> None:
    """Length 4, cap 6: right, right, wrong (trapped at position 2 of 4), then 3 steps: 0.5 on the 6th."""
    env = make("chain", length=4, max_steps=6, on_wrong="trap", reward="progress")
    env.reset(0)
    results = [env.step(a(env)) for a in (right, right, wrong, right, right, right)]
    assert [r[1] for r in results] == [0.0] * 5 + [0.5] and results[-1][3] and not results[-1][4]["won"]
    assert env.anchor().endswith(":strayed:credit=2")


def test_trap_and_end_share_every_draw_until_the_first_wrong_turn() -> None:
    """The same policy draws: success rates and the dead ends' credit agree; only the failures' length differs."""
    trap = coupling("chain", ("noisy_expert", 0.5), 500, on_wrong="trap", max_steps=11, reward="progress")
    end = coupling("chain", ("noisy_expert", 0.5), 500, on_wrong="end", max_steps=11, reward="progress")
    assert trap.success_rate == end.success_rate and trap.mean_reward == end.mean_reward
    assert (trap.mean_steps_failure, trap.failures_at_cap, trap.ratio) == (11.0, 1.0, 11 / 5)
    assert end.mean_steps_failure < 5


def _play(env, seed: int, p_right: float, rng: random.Random) -> tuple[bool, int, list[str]]:
    """One noisy episode: (won, steps, the actions taken)."""
    _, info = env.reset(seed)
    taken = []
    while True:
        action = env.expert_action() if rng.random() < p_right else rng.choice(info["admissible_actions"])
        taken.append(action)
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info["won"], len(taken), taken


def test_stuck_by_hand_a_wrong_action_sticks_the_agent_until_an_action_takes_effect() -> None:
    """Length 3, cap 9, escape 0: right, wrong (stuck at position 2, told so), then nothing moves it, the right
    action included; escape 1: the next right action frees it and the episode is won in 4 steps."""
    never = make("chain", length=3, max_steps=9, on_wrong="stuck", escape=0.0)
    never.reset(0)
    never.step(right(never))
    live = never.anchor()
    obs, reward, terminated, truncated, _ = never.step(wrong(never))
    assert obs == f"Step 2 of 3. The sign is {SIGNS[never._signs[1]]}. You went wrong and are stuck here; most actions do nothing."
    assert (reward, terminated, truncated) == (0.0, False, False) and never.anchor() == live + ":strayed"
    results = [never.step(right(never)) for _ in range(7)]
    assert [r[0] for r in results] == [obs] * 7 and [r[3] for r in results] == [False] * 6 + [True]
    always = make("chain", length=3, max_steps=9, on_wrong="stuck", escape=1.0)
    always.reset(0)
    results = [always.step(a(always)) for a in (right, wrong, right, right)]
    assert [r[2] for r in results] == [False, False, False, True] and results[-1][4]["won"]
    assert not always.anchor().endswith(":strayed")


@pytest.mark.parametrize("escape,twin", [(0.0, "trap"), (1.0, "stay")])
def test_stuck_at_escape_0_is_trap_and_at_escape_1_is_stay(escape, twin) -> None:
    """Equivalence on 300 noisy episodes: the same actions give the same outcome and length."""
    stuck = make("chain", length=4, actions=2, max_steps=14, on_wrong="stuck", escape=escape)
    other = make("chain", length=4, actions=2, max_steps=14, on_wrong=twin)
    for seed in range(300):
        won, steps, taken = _play(stuck, seed, 0.7, random.Random(seed))
        other.reset(seed)
        for t, action in enumerate(taken, 1):
            *_, terminated, truncated, info = other.step(action)
        assert (info["won"], t, terminated or truncated) == (won, steps, True), seed


def test_stuck_escapes_at_the_rate_asked_and_replays_from_the_seed() -> None:
    """While stuck, an action takes effect with probability escape (here 0.25: 2,000 stuck steps land within
    ±0.04 of it); the same seed and actions replay the same episode (the draws come from the task seed)."""
    env = make("chain", length=1000, actions=2, max_steps=1000, on_wrong="stuck", escape=0.25)
    moved = tries = 0
    for seed in range(5):
        env.reset(seed)
        while tries < 400 * (seed + 1):  # stuck again after each escape: the draws of one episode's stream
            env.step(wrong(env))
            before = env._position
            env.step(right(env))
            tries += 1
            moved += env._position != before
    assert abs(moved / tries - 0.25) < 0.04, moved / tries
    first = _play(env, 7, 0.5, random.Random(1))
    env.reset(7)
    again = [env.step(a) for a in first[2]]
    assert again[-1][4]["won"] == first[0] and len(again) == first[1]


@pytest.mark.parametrize("escape", [-0.1, 1.5, float("nan"), "often", True])
def test_escape_must_be_a_probability(escape) -> None:
    with pytest.raises(ValueError, match=r"chain: option 'escape' must be a number in \[0.0, 1.0\]"):
        make("chain", on_wrong="stuck", escape=escape)


def test_equal_actions_are_the_same_task_in_three_words_each() -> None:
    """Action i is right where ACTIONS[i] is; every phrase has 3 words, so the tabular policy's rows all
    carry 4 tokens; episodes of the same action indices are the same episodes."""
    assert [len(a.split()) for a in EQUAL_ACTIONS] == [3] * 6 == [len(a.split()) for a in set(EQUAL_ACTIONS)]
    assert {action_tokens(a) for a in EQUAL_ACTIONS} == {4}
    for on_wrong in ON_WRONG:
        plain, equal = (make("chain", actions=6, on_wrong=on_wrong, equal_actions=e) for e in (False, True))
        rng = random.Random(on_wrong)
        for seed in range(30):
            (_, a), (_, b) = plain.reset(seed), equal.reset(seed)
            assert a["admissible_actions"] == list(ACTIONS) and b["admissible_actions"] == list(EQUAL_ACTIONS)
            while True:
                assert ACTIONS.index(plain.expert_action()) == EQUAL_ACTIONS.index(equal.expert_action())
                i = rng.randrange(6)
                p, e = plain.step(ACTIONS[i]), equal.step(EQUAL_ACTIONS[i])
                assert (p[0], p[1], p[2], p[3], p[4]["won"]) == (e[0], e[1], e[2], e[3], e[4]["won"])
                if p[2] or p[3]:
                    break
    assert make("chain", equal_actions=True, actions=2).reset(0)[1]["admissible_actions"] == list(EQUAL_ACTIONS[:2])


def test_the_anchor_of_a_strayed_path_differs() -> None:
    env = make("chain", length=3, on_wrong="advance")
    env.reset(0)
    env.step(right(env))
    clean = env.anchor()
    env.reset(0)
    env.step(wrong(env))
    assert env.anchor() == clean + ":strayed"


def test_progress_pays_the_furthest_position_when_truncated() -> None:
    """Length 4, cap 4: right, right, wrong, wrong reaches position 2 of 4: 0.5 on the last step."""
    env = make("chain", length=4, max_steps=4, reward="progress")
    env.reset(0)
    results = [env.step(a(env)) for a in (right, right, wrong, wrong)]
    assert [r[1] for r in results] == [0.0, 0.0, 0.0, 0.5]
    assert results[-1][3] and not results[-1][2] and not results[-1][4]["won"]
    env.reset(0)
    results = [env.step(a) for a in (right(env), "xyzzy", "xyzzy", "xyzzy")]
    assert results[-1][1] == 0.25  # an invalid last step still ends the episode with its credit
    env = make("chain", length=4, max_steps=4)
    env.reset(0)
    assert [env.step(a(env))[1] for a in (right, right, wrong, wrong)] == [0.0] * 4


def test_progress_under_reset_pays_the_furthest_position_not_the_current_one() -> None:
    """Length 4, cap 5: right x3 (position 3), wrong (back to 0), right (position 1): 3/4."""
    env = make("chain", length=4, max_steps=5, on_wrong="reset", reward="progress")
    env.reset(0)
    start = env.anchor()
    rewards = [env.step(a(env))[1] for a in (right, right, right, wrong)]
    assert env.anchor() != start  # the credit of 3 is part of the state: it changes future rewards
    rewards.append(env.step(right(env))[1])
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.75]


def test_progress_under_advance_pays_the_right_actions() -> None:
    """Length 4: wrong, right, wrong, right: 2 of 4 right, 0.5, at the end of the path."""
    env = make("chain", length=4, on_wrong="advance", reward="progress")
    env.reset(0)
    results = [env.step(a(env)) for a in (wrong, right, wrong, right)]
    assert [r[1] for r in results] == [0.0, 0.0, 0.0, 0.5] and results[-1][2]


def test_anchors_name_the_state_across_tasks() -> None:
    """Equal position and sign give equal anchors in different tasks; the seed is left out."""
    env = make("chain")
    by_sign: dict[str, set[str]] = {}
    for seed in range(30):
        obs, _ = env.reset(seed)
        by_sign.setdefault(obs, set()).add(env.anchor())
        assert "#" not in env.anchor() and env.anchor().startswith("chain[")
    assert len(by_sign) == 3 and all(len(anchors) == 1 for anchors in by_sign.values())
    assert len(set.union(*by_sign.values())) == 3  # a different sign, a different anchor
    env.reset(0)
    start = env.anchor()
    env.step(right(env))
    moved = env.anchor()
    assert moved != start and moved.split("|")[1].startswith("1:")
    other = make("chain", length=6)  # the options are part of the anchor
    other.reset(0)
    assert other.anchor() != start


def test_a_table_learned_on_some_tasks_solves_others() -> None:
    """The right action is a function of the observation (position and sign) alone."""
    env = make("chain", length=4, signs=3, actions=6)
    table: dict[str, str] = {}
    for seed in range(40):
        obs, _ = env.reset(seed)
        while True:
            action = env.expert_action()
            assert table.setdefault(obs, action) == action
            obs, _, terminated, _, _ = env.step(action)
            if terminated:
                break
    assert len(table) == 4 * 3
    for seed in range(1000, 1040):
        obs, _ = env.reset(seed)
        results = [env.step(table[obs])]
        while not results[-1][2]:
            results.append(env.step(table[results[-1][0]]))
        assert results[-1][4]["won"] and len(results) == 4


def test_the_table_is_the_same_in_every_process() -> None:
    table = [correct_action(p, s, 6) for p in range(8) for s in SIGNS]
    assert len(set(table)) > 1
    code = "from oma.envs.chain import SIGNS, correct_action as c\nprint([c(p, s, 6) for p in range(8) for s in SIGNS])"
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert out.stdout.strip() == str(table)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"signs": 7}, "signs"),
        ({"signs": 0}, "signs"),
        ({"actions": 1}, "actions"),
        ({"actions": 7}, "actions"),
        ({"length": 0}, "length"),
        ({"on_wrong": "loop"}, "on_wrong"),
        ({"reward": "score"}, "reward"),
        ({"equal_actions": "yes"}, "equal_actions"),
    ],
)
def test_bad_options_name_the_field(options: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"chain: option '{field}'"):
        make("chain", **options)


def test_limits_and_valid_values_are_listed() -> None:
    with pytest.raises(ValueError, match="'signs' must be an integer <= 6; got 7"):
        make("chain", signs=7)
    with pytest.raises(ValueError, match="'stay', 'reset', 'end', 'advance'"):
        make("chain", on_wrong="loop")
    assert make("chain", signs=6, actions=6).options.signs == 6


def test_on_wrong_sets_the_sign_of_the_coupling() -> None:
    """Loops and traps make failures longer, dead ends shorter, ``advance`` exactly as long; ``end``,
    ``advance`` and ``trap`` share the policy's draws until the first wrong turn, so their success
    rates match."""
    stats = {w: coupling("chain", ("noisy_expert", 0.5), 500, on_wrong=w) for w in ON_WRONG}
    assert stats["stay"].ratio > 1.5 and stats["reset"].ratio > 1.5
    assert stats["stay"].failures_at_cap == stats["reset"].failures_at_cap == 1.0
    assert stats["end"].ratio < 0.6 and stats["end"].failures_at_cap == 0.0
    assert stats["advance"].ratio == 1.0
    assert stats["trap"].ratio == 15 / 5 and stats["trap"].failures_at_cap == 1.0  # every failure at the cap
    assert stats["end"].success_rate == stats["advance"].success_rate == stats["trap"].success_rate
    assert 0.05 < stats["advance"].success_rate < 0.2  # about (1/2 + 1/8) ** 5 = 0.095


def test_reward_changes_only_the_reward() -> None:
    success = coupling("chain", ("noisy_expert", 0.5), 300, on_wrong="reset")
    progress = coupling("chain", ("noisy_expert", 0.5), 300, on_wrong="reset", reward="progress")
    assert (success.success_rate, success.mean_steps_failure) == (progress.success_rate, progress.mean_steps_failure)
    assert progress.mean_reward > success.mean_reward == success.success_rate


def test_rewards_are_zero_until_the_last_step() -> None:
    rng = random.Random(0)
    for on_wrong in ON_WRONG:
        for reward in ("success", "progress"):
            env = make("chain", on_wrong=on_wrong, reward=reward)
            for seed in range(30):
                _, info = env.reset(seed)
                results = []
                while not results or not (results[-1][2] or results[-1][3]):
                    results.append(env.step(rng.choice(info["admissible_actions"])))
                    info = results[-1][4]
                assert all(r[1] == 0.0 for r in results[:-1])
                last = results[-1]
                assert last[4]["won"] == (last[1] == 1.0) and 0.0 <= last[1] <= 1.0
                if reward == "success":
                    assert last[1] in (0.0, 1.0)
