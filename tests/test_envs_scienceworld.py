"""The ScienceWorld adapter on the installed engine (needs the extra and Java 17 on the PATH)."""

import pytest

pytest.importorskip("scienceworld", reason="needs the optional extra oma-rl[scienceworld]")

import gc
import json
import math
import random
import shutil

import oma.envs
import oma.envs.scienceworld as sw
from oma.cli import main as oma_main

if shutil.which("java") is None:
    pytest.skip("needs Java (17+) on the PATH: ScienceWorld's engine is a JAR", allow_module_level=True)


@pytest.fixture(scope="module")
def env():
    """One environment (one JVM) for the module; every engine is shut down afterwards."""
    made = oma.envs.make("scienceworld")
    yield made
    made.close()
    gc.collect()
    sw.shutdown()
    assert sw._Engine.running == 0, "an engine outlived the tests"


def run(env, seed, choose, limit=100):
    """(observation, reward, terminated, truncated, info, anchor) of every step, the reset's first."""
    obs, info = env.reset(seed)
    records = [(obs, 0.0, False, False, info, env.anchor())]
    for _ in range(limit):
        action = choose(info)
        obs, reward, terminated, truncated, info = env.step(action)
        records.append((obs, reward, terminated, truncated, info, env.anchor()))
        if terminated or truncated:
            break
    return records


def test_gold_path_wins_and_expert_is_admissible(env):
    taken: list[str] = []

    def expert(info):
        action = env.expert_action()
        assert action in info["admissible_actions"]
        taken.append(action)
        return action

    for seed in (0, 1, 2):
        taken.clear()
        records = run(env, seed, expert)
        obs, reward, terminated, truncated, info, _ = records[-1]
        assert terminated and not truncated and info["won"], (seed, taken, obs)
        assert reward == 1.0 and info["score"] == 1.0
        assert [r[1] for r in records[1:-1]] == [0.0] * (len(records) - 2)  # only the last step pays
        assert len(taken) <= 15
        assert info["admissible_actions"] == []
        assert "living thing" in info["task"] and not info["task"].startswith("Your task")


def test_noisy_expert_always_admissible_and_lists_fit(env):
    rng = random.Random(5)
    counts = []
    for seed in (3, 4):
        def noisy(info):
            admissible = info["admissible_actions"]
            assert admissible and len(set(admissible)) == len(admissible)
            assert "reset task" not in admissible and "task" not in admissible  # compact
            counts.append(len(admissible))
            expert = env.expert_action()
            assert expert in admissible
            return rng.choice(admissible) if rng.random() < 0.5 else expert

        run(env, seed, noisy, limit=15)
    assert max(counts) < 400  # the engine lists ~100-1400 before the compact reduction


def test_same_seed_same_episode(env):
    def replay(seed):
        rng = random.Random(11)
        return run(env, seed, lambda info: rng.choice(info["admissible_actions"]), limit=12)

    first = replay(7)
    replay(8)  # another task in between, on the same engine
    again = replay(7)
    assert again == first
    assert first[0][4]["variation"] == 7  # seed s plays the s-th training variation (mod their number)


def test_invalid_action_is_a_no_op(env):
    _, info = env.reset(0)
    anchor = env.anchor()
    obs2, reward, terminated, truncated, info2 = env.step("fly to the moon")
    assert obs2 == "Nothing happens." and reward == 0.0 and not (terminated or truncated)
    assert info2["valid"] is False and env.anchor() == anchor
    assert info2["admissible_actions"] == info["admissible_actions"]
    action = env.expert_action()
    _, _, _, _, info3 = env.step(action)
    assert info3["valid"] is True and env.anchor() != anchor


def test_failure_ends_the_episode_and_step_after_the_end_raises(env):
    _, info = env.reset(0)
    wrong = next(a for a in info["admissible_actions"] if a.startswith("focus on ") and "orange" not in a)
    _, reward, terminated, _, info = env.step(wrong)  # not a living thing: the task fails
    assert terminated and not info["won"] and reward == 0.0 and info["score"] == 0.0
    with pytest.raises(RuntimeError, match="over"):
        env.step("look around")
    with pytest.raises(RuntimeError, match="over"):
        env.expert_action()


def test_cap_pays_partial_credit_in_score_mode_only():
    engines = []
    for reward_mode in ("score", "success"):
        short = oma.envs.make("scienceworld", max_steps=2, reward=reward_mode)
        records = run(short, 0, lambda _info, short=short: short.expert_action())
        _, reward, terminated, truncated, info, _ = records[-1]
        assert truncated and not terminated and len(records) == 3
        assert 0.0 < info["score"] < 1.0  # the gold path's first two steps earn partial credit
        assert reward == (info["score"] if reward_mode == "score" else 0.0)
        with pytest.raises(RuntimeError, match="cap"):
            short.step("look around")
        engines.append(short._engine)
        short = None  # garbage-collected: the engine goes back to the pool for the next environment
        assert sw._IDLE and sw._IDLE[-1] is engines[-1]
    assert engines[0] is engines[1]  # the second environment reused the first one's engine
    engine = engines[0]
    sw.shutdown()
    assert not sw._IDLE and not engine.alive()


def _listening_addresses(port: int) -> set[str]:
    """The local addresses TCP sockets listen on at ``port`` (Linux's /proc/net/tcp and tcp6: hex, in 32-bit
    little-endian words; Java listens on IPv6 with IPv4 addresses mapped, ::ffff:127.0.0.1)."""
    import ipaddress

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            address, at = fields[1].split(":")
            if int(at, 16) == port and fields[3] == "0A":  # LISTEN
                ip = ipaddress.ip_address(b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8)))
                found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return found


def test_the_engine_listens_on_loopback_and_serves_only_its_token(env):
    """#58 item 11: the JVM gateway was started without an auth token, so any local user could drive it on its
    port; it listens on 127.0.0.1 alone and refuses a client without the token this process holds."""
    from py4j.java_gateway import GatewayParameters, JavaGateway
    from py4j.protocol import Py4JError

    env.reset(0)
    params = env._engine.gateway.gateway_parameters
    assert params.auth_token
    assert _listening_addresses(params.port) == {"127.0.0.1"}
    stranger = JavaGateway(gateway_parameters=GatewayParameters(port=params.port, auto_field=True))
    try:
        with pytest.raises(Py4JError):
            stranger.jvm.java.lang.System.getProperty("java.version")
    finally:
        stranger.close()
    _, _, _, _, info = env.step(env.reset(0)[1]["admissible_actions"][0])  # the engine still serves its own client
    assert info["admissible_actions"]


def test_close_shuts_the_engine_down():
    mine = oma.envs.make("scienceworld", split="dev")
    _, info = mine.reset(0)
    assert info["variation"] not in range(150)  # dev variations follow the 150 training ones
    engine = mine._engine
    mine.close()
    assert engine.process.poll() is not None
    with pytest.raises(RuntimeError):
        mine.step("look around")


@pytest.mark.parametrize("options, field", [
    ({"task": "find-unicorn"}, "task"),
    ({"split": "valid"}, "split"),
    ({"simplifications": ("none", "openDoors")}, "simplifications"),
    ({"simplifications": ("easy", "openContainers")}, "simplifications"),  # ScienceWorld takes "easy" alone
    ({"simplifications": "teleport"}, "simplifications"),
    ({"task": "power-component"}, "simplifications"),  # the default removes the connect actions it needs
    ({"actions": "few"}, "actions"),
    ({"reward": "partial"}, "reward"),
    ({"max_steps": 0}, "max_steps"),
    ({"seed": 3}, "seed"),
])
def test_bad_options_name_the_field(options, field):
    with pytest.raises(ValueError, match=f"scienceworld: .*'{field}'"):
        oma.envs.make("scienceworld", **options)


def test_options_are_canonical():
    env = oma.envs.make("scienceworld", simplifications=["openDoors", "teleportAction", "openDoors"])
    assert env.options.simplifications == ("teleportAction", "openDoors")  # ScienceWorld's order, once each
    assert env._simplifications == "teleportAction,openDoors"
    assert oma.envs.make("scienceworld", simplifications="none")._simplifications == ""
    assert oma.envs.make("scienceworld", task="power-component", simplifications="easy").options.task == "power-component"


def test_train_smoke_one_iteration(tmp_path):
    out = tmp_path / "run"
    rc = oma_main([
        "train", "env.name=scienceworld", "env.options.max_steps=6", "iterations=1", "eval_every=1",
        "policy.hidden=32", "policy.layers=1", "policy.heads=2", "policy.vocab_size=400", "policy.max_new_tokens=12",
        "warm_start.episodes=2", "warm_start.epochs=1", "env.eval_tasks=2", "env.tasks_per_iter=2",
        "env.group_size=2", "checkpoint_every=1", "threads=1", "tensorboard=false",
        f"out_dir={out}", f"warm_start.cache_dir={tmp_path / 'cache'}",
    ])
    assert rc == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    assert math.isfinite(records[1]["loss"]) and 0.0 <= records[1]["eval_success"] <= 1.0
    gc.collect()
    sw.shutdown()
