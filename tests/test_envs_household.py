"""``household``: ALFWorld-like tasks whose failures run to the step cap."""

from __future__ import annotations

import collections
import random
import re

import pytest

from oma.envs import coupling, make
from oma.envs.household import GOAL_KINDS, ROOMS
from test_envs import expert_run


@pytest.mark.parametrize("kind", GOAL_KINDS)
def test_every_goal_kind_is_solvable(kind: str) -> None:
    env = make("household", goals=kind)
    for seed in range(40):
        actions, info = expert_run(env, seed)
        assert info["won"]
        last = actions[-1]
        assert last.startswith("use ") if kind == "examine" else last.startswith("put ")
        if kind in ("clean", "heat", "cool"):
            assert any(a.startswith(f"{kind} ") for a in actions)


def test_difficulty_varies_across_seeds() -> None:
    env = make("household")
    kinds, rooms, lengths = collections.Counter(), set(), set()
    for seed in range(120):
        obs, info = env.reset(seed)
        kinds[_goal_kind(info["task"])] += 1
        rooms.add(len(env._home.rooms))
        lengths.add(len(expert_run(env, seed)[0]))
    assert set(kinds) == set(GOAL_KINDS)
    assert rooms == {3, 4, 6}
    assert min(lengths) <= 6 and max(lengths) >= 24


def _goal_kind(task: str) -> str:
    patterns = {
        "examine": r"^look at ",
        "two": r"^put two ",
        "clean": r"^put a clean ",
        "heat": r"^put a hot ",
        "cool": r"^put a cool ",
        "place": r"^put a ",
    }
    return next(kind for kind, pattern in patterns.items() if re.match(pattern, task))


def test_looks_like_alfworld() -> None:
    env = make("household", goals="heat")
    obs, info = env.reset(0)
    assert obs.startswith("You are in the middle of the ")
    assert "Looking quickly around you, you see a " in obs
    assert obs.endswith(f"Your task is to: {info['task']}")
    actions, _ = expert_run(env, 0)
    assert any(re.fullmatch(r"go to [a-z]+ \d+", a) for a in actions)
    assert any(re.fullmatch(r"take [a-z]+ \d+ from [a-z]+ \d+", a) for a in actions)
    assert any(re.fullmatch(r"heat [a-z]+ \d+ with microwave \d+", a) for a in actions)
    assert re.fullmatch(r"put [a-z]+ \d+ in/on [a-z]+ \d+", actions[-1])


def test_closed_receptacles_hide_their_contents() -> None:
    env = make("household")
    for seed in range(50):
        _, info = env.reset(seed)
        for _ in range(30):
            action = env.expert_action()
            obs, _, terminated, _, info = env.step(action)
            if action.startswith("go to") and obs.endswith("is closed."):
                assert "you see" not in obs
                assert not any(a.startswith("take ") for a in info["admissible_actions"])
                name = action.removeprefix("go to ")
                obs, *_ = env.step(f"open {name}")
                assert f"The {name} is open. In it, you see " in obs
                return
            if terminated:
                break
    pytest.fail("no closed receptacle was visited")


def test_transforms_change_the_object_state() -> None:
    env = make("household", goals="cool")
    actions, _ = expert_run(env, 1)
    env.reset(1)
    for action in actions:
        if action.startswith("cool "):
            obj = action.split(" with ")[0].removeprefix("cool ")
            fridge = action.split(" with ")[1]
            assert env.step("inventory")[0] == f"You are carrying: a {obj}."
            obs = env.step(action)[0]
            assert obs == f"You cool the {obj} using the {fridge}."
            assert env.step("inventory")[0] == f"You are carrying: a {obj} (cool)."
            return
        env.step(action)
    pytest.fail("the expert never cooled anything")


def test_reward_only_on_the_winning_step() -> None:
    env = make("household")
    env.reset(2)
    rewards = []
    while True:
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        rewards.append(reward)
        if terminated or truncated:
            break
    assert rewards[-1] == 1.0 and set(rewards[:-1]) == {0.0} and terminated and info["won"]


@pytest.mark.parametrize("cap", [20, 30, 45])
def test_failures_run_to_the_cap_and_are_longer(cap: int) -> None:
    stats = coupling("household", ("noisy_expert", 0.25), 300, max_steps=cap)
    assert stats.failures_at_cap == 1.0
    assert stats.mean_steps_failure == cap
    assert stats.mean_steps_success < cap * 0.75
    assert stats.ratio > 1.3


def test_a_noisy_expert_sometimes_succeeds() -> None:
    """The design target: at epsilon 0.25 success is intermediate, so groups have spread."""
    stats = coupling("household", ("noisy_expert", 0.25), 400)
    assert 0.4 <= stats.success_rate <= 0.85
    assert coupling("household", ("noisy_expert", 0.5), 200).success_rate < stats.success_rate
    assert coupling("household", "random", 100).success_rate <= 0.02


def test_bigger_homes_are_harder() -> None:
    small = coupling("household", ("noisy_expert", 0.25), 300, size="small")
    large = coupling("household", ("noisy_expert", 0.25), 300, size="large")
    assert small.success_rate > large.success_rate + 0.05
    assert small.mean_steps_success < large.mean_steps_success


def _notes(observation: str) -> str:
    lines = [line for line in observation.splitlines() if line.startswith("Notes: ")]
    assert len(lines) == 1, observation
    return lines[0]


def test_notes_record_what_the_agent_found() -> None:
    """Every observation ends with the notes; they list exactly what earlier observations showed."""
    env = make("household", size="small", goals="place", distractors="few", notes=True)
    observation, info = env.reset(seed=3)
    assert _notes(observation) == "Notes: carrying nothing; searched nothing."
    searched: list[str] = []
    for _ in range(30):
        action = env.expert_action()
        observation, _, terminated, truncated, info = env.step(action)
        notes = _notes(observation)
        # A receptacle counts as searched once its open inside was shown ("you see ...").
        for verb in ("You arrive at ", "You open the "):
            if observation.startswith(verb) and "you see" in observation.split("\n")[0]:
                name = observation[len(verb):].split(".")[0]
                searched.append(name)
        for name in searched:
            assert name in notes.split("searched ", 1)[1], (name, notes)
        if action.startswith("take "):
            assert notes.startswith(f"Notes: carrying {action.split()[1]} {action.split()[2]};")
        if terminated or truncated:
            break
    assert info["won"]


def test_notes_are_off_by_default_and_change_nothing_else() -> None:
    plain, noted = make("household", notes=False), make("household", notes=True)
    a, _ = plain.reset(seed=11)
    b, _ = noted.reset(seed=11)
    assert "Notes:" not in a and b.startswith(a + "\nNotes: ")
    for _ in range(10):
        action = plain.expert_action()
        assert noted.expert_action() == action
        a, ra, ta, _, _ = plain.step(action)
        b, rb, tb, _, _ = noted.step(action)
        assert b.startswith(a + "\nNotes: ") and (ra, ta) == (rb, tb)
        if ta:
            break


@pytest.mark.parametrize("seed", range(20))
def test_the_hint_is_true_and_shortens_the_expert(seed: int) -> None:
    options = {"size": "medium", "goals": "place", "distractors": "many"}
    hinted = make("household", hint=True, **options)
    _, info = hinted.reset(seed=seed)
    hint = info["task"].split(" Hint: the ", 1)[1]
    obj, rest = hint.split(" is in/on ", 1)
    recep, room = rest.rstrip(".").split(" in the ", 1)
    # Walk there with the expert of the hinted env: it goes straight to the hinted receptacle.
    steps = 0
    while True:
        action = hinted.expert_action()
        observation, _, terminated, _, _ = hinted.step(action)
        steps += 1
        if action.startswith("take "):
            assert action == f"take {obj} from {recep}"
            break
    plain = make("household", **options)
    _, plain_info = plain.reset(seed=seed)
    assert info["task"].startswith(plain_info["task"])  # same world, same goal
    plain_steps = 0
    while not plain.expert_action().startswith("take "):
        plain.step(plain.expert_action())
        plain_steps += 1
    assert steps <= plain_steps + 1


def test_terse_text_by_hand() -> None:
    """Seed 3 of the quickstart's home, worded ``terse``: each message written out."""
    env = make("household", size="small", goals="place", distractors="few", notes=True, hint=True, text="terse")
    observation, info = env.reset(seed=3)
    # The home: kitchen (cabinet 1-3, countertop 1, drawer 1-3, fridge 1, microwave 1, sinkbasin 1),
    # bathroom (the start), livingroom (cabinet 5, sidetable 1, sofa 1); lettuce 1 in microwave 1.
    assert info["task"] == "put a lettuce on sofa. Hint: lettuce 1 in/on microwave 1 in kitchen."
    notes = "Carrying nothing; searched microwave 1; saw lettuce 1 in/on microwave 1."
    assert observation == ("In bathroom: cabinet 4, countertop 2, drawer 4, sinkbasin 2, toilet 1. "
                           f"Exits: kitchen, livingroom.\n{notes}")
    assert env.step("inventory")[0] == f"Carrying nothing.\n{notes}"
    assert env.step("go to livingroom")[0] == (
        f"Entered livingroom: cabinet 5, sidetable 1, sofa 1. Exits: bathroom.\n{notes}")
    assert env.step("go to sofa 1")[0] == (
        "At sofa 1. On it: nothing.\nCarrying nothing; searched microwave 1, sofa 1; saw lettuce 1 in/on microwave 1.")
    assert env.step("look")[0].startswith("At sofa 1 in livingroom. On it: nothing.\n")
    env.step("go to bathroom")
    env.step("go to kitchen")
    assert env.step("go to microwave 1")[0].startswith("At microwave 1. Closed.\n")
    assert env.step("open microwave 1")[0].startswith("Opened microwave 1. In it: lettuce 1.\n")
    assert env.step("take lettuce 1 from microwave 1")[0] == (
        "Took lettuce 1 from microwave 1.\nCarrying lettuce 1; searched microwave 1, sofa 1.")
    assert env.step("close microwave 1")[0].startswith("Closed microwave 1.\n")
    assert env.step("inventory")[0].startswith("Carrying lettuce 1.\n")


def test_terse_text_says_the_same_facts_in_fewer_words() -> None:
    """Under ``text=terse`` every step has the same actions, rewards, expert and state as under
    ``alfworld``, names the same things (objects, receptacles, rooms) and is shorter."""
    rng = random.Random(0)
    names = re.compile(r"[a-z]+ \d+|" + "|".join(room.name for room in ROOMS))
    for seed in range(30):
        options = {"goals": GOAL_KINDS, "notes": seed % 2 == 0, "hint": seed % 3 == 0}
        worded, terse = make("household", **options), make("household", text="terse", **options)
        a, info_a = worded.reset(seed)
        b, info_b = terse.reset(seed)
        first = True
        while True:
            assert info_a["admissible_actions"] == info_b["admissible_actions"]
            assert worded.expert_action() == terse.expert_action()
            assert worded._state_key() == terse._state_key()
            assert info_a["task"].split(" Hint:")[0] == info_b["task"].split(" Hint:")[0]
            if first:  # ALFWorld's first observation also says the task: the prompt's Task line
                a = a.split("\nYour task is to: ")[0] + a.split(info_a["task"])[1]
            assert set(names.findall(a)) == set(names.findall(b)), (a, b)
            assert len(b) < len(a), (a, b)
            first = False
            admissible = info_a["admissible_actions"]
            action = rng.choice(admissible) if rng.random() < 0.3 else worded.expert_action()
            a, ra, ta, ua, info_a = worded.step(action)
            b, rb, tb, ub, info_b = terse.step(action)
            assert (ra, ta, ua, info_a["won"]) == (rb, tb, ub, info_b["won"])
            if ta or ua:
                break


def test_text_option_is_checked() -> None:
    with pytest.raises(ValueError, match="option 'text' must be one of 'alfworld', 'terse'; got 'short'"):
        make("household", text="short")
