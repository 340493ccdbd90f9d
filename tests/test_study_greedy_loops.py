"""studies/tools/greedy_loops.py: the first mistake of a replayed episode and the hint-type count, by hand."""

from __future__ import annotations

import benchmark_scripts
import pytest

from oma.agent.rollout import Episode
from oma.envs import make

OPTIONS = {"size": "small", "goals": ["place"], "distractors": "few", "notes": True, "hint": True}


def _module():
    return benchmark_scripts.load("greedy_loops")


def test_hint_type_and_receptacle_type() -> None:
    m = _module()
    assert m.hint_type("Your task is to: put a mug in shelf. Hint: the mug 1 is in/on drawer 12 in the kitchen.") == "drawer"
    assert m.hint_type("Your task is to: put a mug in shelf.") is None
    assert m.receptacle_type("go to drawer 2") == "drawer"
    assert m.receptacle_type("go to kitchen") is None
    assert m.receptacle_type("take mug 1 from drawer 2") is None


def test_hint_type_share_by_hand() -> None:
    m = _module()
    admissible = ["go to drawer 1", "go to drawer 3", "go to shelf 1", "go to kitchen", "inventory"]
    assert m.hint_type_share(admissible, "drawer") == pytest.approx(2 / 3)  # 2 of the 3 receptacles
    assert m.hint_type_share(admissible, "fridge") == 0.0
    with pytest.raises(ValueError, match="admissible"):
        m.hint_type_share(["go to kitchen"], "drawer")


def test_first_mistake_replays_to_the_first_departure() -> None:
    m = _module()

    def make_env():
        return make("household", **OPTIONS)

    env = make_env()
    obs, _info = env.reset(7)
    first = env.expert_action()
    assert m.first_mistake(Episode(seed=7, group=0, transcript=[(obs, first)]), make_env) is None
    obs2, _reward, _terminated, _truncated, info = env.step(first)
    second = env.expert_action()
    wrong = next(a for a in info["admissible_actions"] if a != second)
    departed = Episode(seed=7, group=0, transcript=[(obs, first), (obs2, wrong)])
    assert m.first_mistake(departed, make_env) == (wrong, second, list(info["admissible_actions"]))


def test_mistake_kind_by_hand() -> None:
    m = _module()
    assert m.mistake_kind("go to drawer 1", "go to kitchen") == m.STAYS
    assert m.mistake_kind("go to kitchen", "go to drawer 2") == "leaves the room that holds the goal"
    assert m.mistake_kind("go to office", "go to kitchen") == "takes the wrong exit"
    assert m.mistake_kind("go to drawer 1", "go to shelf 2") == "goes to the wrong receptacle in the room"
    assert m.mistake_kind("take mug 1 from drawer 2", "put mug 1 in/on shelf 1") == "take instead of put"
    assert m.mistake_kind("take mug 1 from drawer 2", "take mug 2 from drawer 2") == "takes the wrong object or place"


def test_a_run_in_terse_text_is_refused_not_misread(tmp_path, capsys) -> None:
    """hint_type reads ALFWorld's hint sentence; a terse run (today's default job) would count no copies."""
    import json

    from oma.train.config import load_config, to_dict

    (tmp_path / "config.json").write_text(json.dumps(to_dict(load_config(None))))
    assert benchmark_scripts.load("greedy_loops").main([str(tmp_path)]) == 2
    assert "env.options.text is 'terse'" in capsys.readouterr().err
    _, info = make("household", **load_config(None).env.options).reset(1_000_000)
    assert "Hint:" in info["task"] and benchmark_scripts.load("greedy_loops").hint_type(info["task"]) is None  # unread


def test_a_run_is_read_with_the_config_it_trained_with(tmp_path) -> None:
    """The run's config.json through load_run_config: a folder without one is named as no run folder."""
    from oma.train.config import ConfigError

    with pytest.raises(ConfigError, match="is not a run folder"):
        benchmark_scripts.load("greedy_loops").main([str(tmp_path)])
