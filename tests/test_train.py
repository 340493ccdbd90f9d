"""The trainer: projection, row assembly, the loop's loss vs oma.core, CLI smoke, resume, errors."""

import copy
import math
import json
import platform
import re
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers

import oma.envs
from oma.agent import rollout as rollout_mod
from oma.agent.policy import Generation, load_model, load_tokenizer, response_logprobs, tiny_model, train_tokenizer
from oma.agent.prompt import project_action, step_prompt
from oma.cli import main as oma_main
from oma.core import anchor_ids, outcome_advantages, token_objective, token_weights, weighted_loss
from oma.train.config import ConfigError, load_config
from oma.train.loop import Batch, MetricsLog, batch_logprobs, minibatch_loss, response_mask_of, rollout_metrics, update
from run_records import records, training_at_any_schedule, training_only, without_timings
from studies import preset

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

TINY = [
    "iterations=2", "policy.hidden=32", "policy.layers=1", "policy.heads=2", "policy.vocab_size=400",
    "warm_start.episodes=3", "warm_start.epochs=1", "env.eval_tasks=2", "env.tasks_per_iter=2", "env.group_size=2",
    "env.train_max_steps=null", "env.options.max_steps=4", "eval_every=1", "checkpoint_every=1", "threads=1",
    "policy.max_new_tokens=6",
    "tensorboard=false",
]


def test_project_action():
    admissible = ["go to fridge 1", "open fridge 1", "look"]
    assert project_action("open fridge 1", admissible) == "open fridge 1"
    assert project_action("  Open   Fridge 1 \nand more", admissible) == "open fridge 1"  # case, spaces, first line
    assert project_action("open fridge", admissible) is None  # truncated
    assert project_action("", admissible) is None
    assert project_action("go to fridge 2", admissible) is None  # not admissible here


def test_step_prompt_history_window():
    history = [("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
    p = step_prompt("the task", history, "now", ["x", "y"], history_length=2)
    assert p.splitlines() == ["Obs: o2", "Did: a2", "Obs: o3", "Did: a3", "Obs: now", "Can: x | y", "Task: the task", "Action:"]
    assert "o1" not in step_prompt("t", history, "now", ["x"], history_length=0)


@pytest.fixture(scope="module")
def tiny_policy():
    env = oma.envs.make("shop")
    texts = []
    for seed in range(5):
        obs, info = env.reset(seed)
        texts += [step_prompt(info["task"], [], obs, info["admissible_actions"], 2), *info["admissible_actions"]]
    tok = train_tokenizer(texts, 300)
    model = tiny_model(len(tok), hidden=32, layers=1, heads=2, max_positions=1024, seed=0)
    return model, tok


def _scripted_generate(tok, invalid_every=3):
    """A stand-in for sampling: the first admissible action of the prompt, or junk every k-th call."""
    calls = {"n": 0}

    def fake(model, tokenizer, prompt_ids, **kw):
        texts = []
        for ids in prompt_ids:
            calls["n"] += 1
            can = re.search(r"\nCan: (.*)\nTask: .*\nAction:$", tok.decode(ids)).group(1).split(" | ")
            texts.append("no such action" if calls["n"] % invalid_every == 0 else can[-1])
        ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        return Generation(ids, texts, logp=[[0.0] * len(r) for r in ids], entropy=[[0.0] * len(r) for r in ids])

    return fake


def test_rollout_rows(monkeypatch, tiny_policy):
    model, tok = tiny_policy
    monkeypatch.setattr(rollout_mod, "generate", _scripted_generate(tok))
    seeds = [11, 12, 13]
    ro = rollout_mod.rollout(lambda: oma.envs.make("shop", max_steps=6), model, tok, seeds, group_size=2, history_length=2,
                             max_prompt_tokens=400, max_new_tokens=8, temperature=1.0, invalid_penalty=0.1,
                             generator=None, traj_offset=100, show_actions=True)
    rows = ro.rows
    assert len(rows) == sum(e.steps for e in ro.episodes)  # K rows for a K-step episode, none after the end
    for t, ep in enumerate(ro.episodes):
        mine = (rows.traj_index == 100 + t).nonzero().squeeze(-1)
        assert len(mine) == ep.steps
        assert rows.step_index[mine].tolist() == list(range(ep.steps))
        assert set(rows.group_index[mine].tolist()) == {t // 2}
        assert ep.seed == seeds[t // 2]
        valid = rows.valid[mine]
        assert int((~valid).sum()) == ep.invalid
        expected = ep.outcome - 0.1 * (~valid).float()
        torch.testing.assert_close(rows.scores[mine], expected)
        assert rows.won[mine].eq(ep.won).all()
    # anchors are the env's state ids at the time each row acted: replay episode 0 and compare
    env = oma.envs.make("shop", max_steps=6)
    env.reset(seeds[0])
    mine = (rows.traj_index == 100).nonzero().squeeze(-1)
    replay = []
    for obs_action in ro.episodes[0].transcript:
        replay.append(env.anchor())
        env.step(obs_action[1])
    assert rows.anchor[mine].tolist() == anchor_ids(replay).tolist()


def _expert_act(lives):
    """The expert's action in every live episode (a stand-in policy that wins every household task)."""
    texts = [lv.env.expert_action() for lv in lives]
    return [[0] for _ in lives], Generation([[0] for _ in lives], texts, logp=[[0.0] for _ in lives],
                                            entropy=[[0.0] for _ in lives])


def test_a_training_horizon_ends_episodes_after_that_many_steps_by_hand():
    make_env = lambda: oma.envs.make("household")  # noqa: E731
    full = rollout_mod.run_episodes(make_env, _expert_act, [3], group_size=1, invalid_penalty=0.1)
    k = full.episodes[0].steps
    assert full.episodes[0].won and full.episodes[0].outcome == 1.0 and k > 2
    # a cap at the expert's length changes nothing: winning on the last allowed step is a win
    at = rollout_mod.run_episodes(make_env, _expert_act, [3], group_size=1, invalid_penalty=0.1, max_steps=k)
    assert (at.episodes[0].steps, at.episodes[0].won, at.episodes[0].outcome) == (k, True, 1.0)
    assert torch.equal(at.rows.scores, full.rows.scores)
    # one step fewer: k - 1 rows, steps 0..k-2, unwon, outcome 0 on every row
    cut = rollout_mod.run_episodes(make_env, _expert_act, [3], group_size=1, invalid_penalty=0.1, max_steps=k - 1)
    ep = cut.episodes[0]
    assert (ep.steps, ep.won, ep.outcome) == (k - 1, False, 0.0)
    assert cut.rows.step_index.tolist() == list(range(k - 1))
    assert cut.rows.scores.tolist() == [0.0] * (k - 1) and not cut.rows.won.any()
    assert cut.rows.prompt_ids == full.rows.prompt_ids[: k - 1]
    with pytest.raises(ValueError, match="max_steps: expected a positive number of steps or None, got 0"):
        rollout_mod.run_episodes(make_env, _expert_act, [3], group_size=1, invalid_penalty=0.1, max_steps=0)


@pytest.mark.parametrize("cap", [1, 2, 4])
def test_a_training_horizon_equals_the_environments_own_cap(tiny_policy, cap):
    """Sampling from the tiny LM, a rollout capped at ``cap`` steps by the trainer gives exactly the rows
    and episodes of one whose environment caps at ``cap``: the same decisions, lengths and outcomes."""
    model, tok = tiny_policy
    seeds = [11, 12, 13]

    def run(env_cap, max_steps):
        return rollout_mod.rollout(lambda: oma.envs.make("shop", max_steps=env_cap), model, tok, seeds, group_size=3,
                                   history_length=0, max_prompt_tokens=400, max_new_tokens=8, temperature=1.0,
                                   invalid_penalty=0.1, generator=torch.Generator().manual_seed(7), constrained=True,
                                   show_actions=True, max_steps=max_steps)

    trainer, env = run(8, cap), run(cap, None)
    assert [(e.steps, e.won, e.outcome) for e in trainer.episodes] == [(e.steps, e.won, e.outcome) for e in env.episodes]
    assert max(e.steps for e in trainer.episodes) == cap
    assert trainer.rows.prompt_ids == env.rows.prompt_ids and trainer.rows.response_ids == env.rows.response_ids
    for name in ("group_index", "traj_index", "step_index", "scores", "step_rewards", "valid", "won"):
        assert torch.equal(getattr(trainer.rows, name), getattr(env.rows, name)), name
    # state ids name the environment's options (its cap included), so compare which rows share a state
    assert _partition(trainer.rows.anchor) == _partition(env.rows.anchor)


def _partition(ids: torch.Tensor) -> list[int]:
    """Each id relabelled by its first occurrence: equal lists mean the same rows share a value."""
    first: dict[int, int] = {}
    return [first.setdefault(int(v), len(first)) for v in ids]


def test_train_max_steps_caps_training_episodes_only(tmp_path):
    out = tmp_path / "run"
    rc = oma_main(["train", *TINY, "env.options.max_steps=5", "env.train_max_steps=2", f"out_dir={out}",
                   f"warm_start.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rows_per_traj"] <= 2 for r in records[1:])
    assert all(r["eval_steps"] > 2 for r in records)  # held-out episodes still run to the environment's cap of 5
    with pytest.raises(ConfigError, match=r"env.train_max_steps must be > 0 or null, got 0"):
        load_config(None, ["env.train_max_steps=0"])
    assert load_config(None, ["env.train_max_steps=null"]).env.train_max_steps is None


CHAIN = ["iterations=2", "eval_every=1", "env.options.max_steps=12", "env.options.actions=4", "tensorboard=false"]
"""The tabular lane on loops (`stay`: failures run to the cap), a few seconds a run."""


def _chain_run(tmp_path, name: str, *overrides: str) -> list[dict]:
    out = tmp_path / name
    assert oma_main(["train", str(CONFIGS / "chain-tabular-grpo.yaml"), *CHAIN, *overrides, f"out_dir={out}"]) == 0
    return without_timings(records(out / "metrics.jsonl"))


def test_eval_max_steps_caps_held_out_episodes_only(tmp_path):
    """By hand: held-out episodes end at ``env.eval_max_steps``. Equivalence: at the environment's own cap it is
    the default (null), record for record. Invariance: it changes no training record, only the evaluations."""
    default = _chain_run(tmp_path, "default")
    short = _chain_run(tmp_path, "short", "env.eval_max_steps=7")
    assert _chain_run(tmp_path, "at-cap", "env.eval_max_steps=12") == default
    assert all(r["eval_steps"] <= 7 and r["eval_sampled_steps"] <= 7 for r in short)
    assert max(r["eval_sampled_steps"] for r in default) > 7  # the cap had something to cut
    # the same policies (training is unchanged, below), greedy: an episode won within 7 steps is won within 12
    assert all(a["eval_success"] <= b["eval_success"] for a, b in zip(short, default))
    # to float32 rounding: a logged sum (approx_kl_k1) can round differently once evaluation allocates otherwise
    for a, b in zip(training_only(short), training_only(default), strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("key", ["env.train_max_steps", "env.eval_max_steps"])
def test_a_step_cap_above_the_environments_is_refused(tmp_path, capsys, key):
    """Above the environment's cap the cap would silently change nothing (a longer training cap was a no-op):
    refused in one line naming the key and the environment's cap, before the run folder exists."""
    out = tmp_path / "run"
    rc = oma_main(["train", str(CONFIGS / "chain-tabular-grpo.yaml"), *CHAIN, f"{key}=13", f"out_dir={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and not out.exists()
    assert len(err) == 1 and f"{key}: 13 is above chain's step cap of 12" in err[0]
    with pytest.raises(ConfigError, match=rf"{key} must be > 0 or null, got 0"):
        load_config(None, [f"{key}=0"])
    assert load_config(None, ["env.eval_max_steps=9", "env.name=shop"]).env.eval_max_steps == 9  # one layer: set wins
    assert load_config(CONFIGS / "household-gigpo-oma.yaml", ["env.eval_max_steps=9"]).env.eval_max_steps == 9
    assert load_config(None).env.eval_max_steps is None


def test_runs_saved_before_eval_max_steps_read_as_null(tmp_path):
    """A config.json written before ``env.eval_max_steps`` existed reads as what the code did then (held-out
    episodes to the environment's cap), so such a run resumes and compares as unchanged."""
    from oma.train.config import config_diff, load_run_config, to_dict
    now = to_dict(load_config(None))
    saved = json.loads(json.dumps(now))
    del saved["env"]["eval_max_steps"]
    assert config_diff(saved, now) == []
    assert config_diff(saved, to_dict(load_config(None, ["env.eval_max_steps=9"]))) == [
        "env.eval_max_steps (saved None, now 9)"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert load_run_config(tmp_path).env.eval_max_steps is None


def _captured_batch(monkeypatch, model, tok, seeds=(5,), group_size=2, max_steps=3, logp_shift=0.0):
    """A scripted shop rollout and its batch (GRPO advantages; logp_old = current logp − logp_shift)."""
    monkeypatch.setattr(rollout_mod, "generate", _scripted_generate(tok))
    ro = rollout_mod.rollout(lambda: oma.envs.make("shop", max_steps=max_steps), model, tok, list(seeds),
                             group_size=group_size, history_length=1, max_prompt_tokens=400, max_new_tokens=8,
                             temperature=1.0, invalid_penalty=0.1, generator=None, show_actions=True)
    mask = response_mask_of(ro.rows)
    adv = outcome_advantages(ro.rows.scores, ro.rows.group_index, ro.rows.traj_index)
    logp_old = batch_logprobs(model, ro.rows, tok.pad_token_id, 4, mask.shape[1], 1.0) - logp_shift
    return ro, Batch(ro.rows, mask, adv, logp_old, None)


def test_loop_loss_equals_oma_core_on_a_captured_batch(monkeypatch, tiny_policy):
    model, tok = tiny_policy
    ro, batch = _captured_batch(monkeypatch, model, tok, seeds=(3, 4), group_size=3, max_steps=5, logp_shift=0.05)  # ratio ≠ 1
    rows, mask, adv, logp_old = ro.rows, batch.response_mask, batch.adv, batch.logp_old
    cfg = load_config(None, ["algo.mass=uniform", "algo.reducer=seq-mean-token-mean", "optim.micro_batch_rows=3"])
    model.zero_grad()
    stats = minibatch_loss(model, batch, torch.arange(len(rows)), cfg, tok.pad_token_id, backward=True)
    grads = [p.grad.clone() for p in model.parameters()]
    # the same loss in one piece, straight from oma.core
    model.zero_grad()
    logp, m, _ = response_logprobs(model, rows.prompt_ids, rows.response_ids, tok.pad_token_id)
    assert torch.equal(m, mask)
    ell = token_objective(logp, logp_old, adv, mask)
    w = token_weights(mask, rows.group_index, rows.traj_index, reducer="seq-mean-token-mean", mass="uniform")
    loss = weighted_loss(ell, w)
    loss.backward()
    assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_metrics_are_strict_json_with_null_for_an_empty_outcome_class(monkeypatch, tmp_path, tiny_policy):
    model, tok = tiny_policy
    ro, _ = _captured_batch(monkeypatch, model, tok)
    assert not any(e.won for e in ro.episodes)  # three scripted steps never buy the right product
    record = {"iteration": 1, **rollout_metrics(ro)}
    assert record["rows_per_traj_success"] is None
    assert record["rows_per_traj_failure"] == sum(e.steps for e in ro.episodes) / len(ro.episodes)
    MetricsLog(tmp_path, tensorboard=False).write(record)

    def no_constants(name):
        raise AssertionError(f"metrics.jsonl holds the non-JSON constant {name}")

    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
    assert json.loads(line, parse_constant=no_constants)["rows_per_traj_success"] is None
    with pytest.raises(FloatingPointError, match="iteration 2: loss=nan; the run diverged"):  # an error naming it, never written
        MetricsLog(tmp_path, tensorboard=False).write({"iteration": 2, "loss": float("nan")})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1


def test_evaluation_reports_success_and_mean_reward_by_hand(monkeypatch):
    from oma.agent import kinds
    from oma.agent.rollout import Episode, Rollout
    from oma.train import loop

    # four held-out episodes: one win (reward 1), partial credit 0.5 and 0.25, and a zero
    eps = [Episode(seed=k, group=k, steps=s, invalid=i, outcome=o, won=w)
           for k, (s, i, o, w) in enumerate([(2, 0, 1.0, True), (4, 1, 0.5, False), (6, 3, 0.0, False), (4, 0, 0.25, False)])]
    monkeypatch.setattr(kinds, "rollout", lambda *a, **k: Rollout(rows=None, episodes=eps, generated_tokens=0))
    got = loop.evaluate(load_config(None, ["env.eval_tasks=4"]), None, None, None, iteration=3)
    for name in ("eval", "eval_sampled"):
        assert got[f"{name}_success"] == 1 / 4
        assert got[f"{name}_outcome"] == (1.0 + 0.5 + 0.0 + 0.25) / 4
        assert got[f"{name}_steps"] == 16 / 4 and got[f"{name}_invalid"] == 4 / 16
    assert got["time_eval"] >= 0 and set(got) == {f"{n}_{m}" for n in ("eval", "eval_sampled")
                                                   for m in ("success", "outcome", "steps", "invalid")} | {"time_eval"}


def test_a_non_finite_gradient_stops_the_update_before_the_optimizer_step(monkeypatch, tiny_policy):
    model, tok = tiny_policy
    model = copy.deepcopy(model)
    _, batch = _captured_batch(monkeypatch, model, tok)
    batch.adv = torch.linspace(-1.0, 1.0, len(batch.adv))  # scripted episodes tie (A = 0 rows are skipped): give them a gradient
    # the loss stays finite (oma.core rejects non-finite logp itself); one gradient overflows, as in fp16
    next(model.parameters()).register_hook(lambda g: g * float("inf"))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = load_config(None, ["optim.num_minibatches=1"])
    with pytest.raises(FloatingPointError, match=r"iteration 7: the gradient norm is (nan|inf) \(loss -?\d"):
        update(model, optimizer, batch, cfg, tok.pad_token_id, iteration=7)
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))  # no step was taken


def test_tiny_model_and_tokenizer_save_and_reload(tmp_path, tiny_policy):
    model, tok = tiny_policy
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "tokenizer")
    model2, tok2 = load_model(tmp_path / "model"), load_tokenizer(tmp_path / "tokenizer")
    text = "search[red cotton t-shirt]"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"] and tok2.decode(tok(text)["input_ids"]) == text
    ids = torch.tensor([tok(text)["input_ids"]])
    torch.testing.assert_close(model2(ids).logits, model(ids).logits)


def test_library_versions_name_a_missing_package_none(monkeypatch):
    from oma.train import warmstart

    monkeypatch.setattr(warmstart, "VERSIONED", ("torch", "no-such-package-oma-test"))
    versions = warmstart.library_versions()
    assert versions == {"python": versions["python"], "torch": torch.__version__, "no-such-package-oma-test": None,
                        "cpu": warmstart.cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def test_cpu_model_reads_the_first_model_name(tmp_path):
    from oma.train import warmstart

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n\n"
                       "processor\t: 1\nmodel name\t: another\n")
    assert warmstart.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz"
    # no /proc/cpuinfo (macOS), or one without a model name (some ARM kernels): the platform's word for it
    expected = platform.processor() or platform.machine()
    assert warmstart.cpu_model(tmp_path / "missing") == expected
    cpuinfo.write_text("processor\t: 0\nmodel name\t:   \nBogoMIPS\t: 50.00\n")
    assert warmstart.cpu_model(cpuinfo) == expected


def test_another_cpu_misses_the_warm_start_cache(monkeypatch):
    """The same install on a CPU with other kernels (AVX2 against AVX512) can train another policy."""
    from oma.train import warmstart

    cfg = load_config(None, [])
    here = warmstart.cache_key(cfg)
    for key, value in (("cpu_capability", "NO-SUCH-ISA"), ("cpu", "another processor")):
        other = {**warmstart.library_versions(), key: value}
        monkeypatch.setattr(warmstart, "library_versions", lambda other=other: other)
        assert warmstart.cache_key(cfg) != here, key


def test_another_thread_count_misses_the_warm_start_cache():
    """SFT at another torch thread count can train another policy (measured on an AVX512 Xeon), so a
    2-thread run must not reuse the warm start a 1-thread run built, nor the other way round."""
    import torch

    from oma.train import warmstart

    cfg = load_config(None, [])
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = warmstart.cache_key(cfg)
        torch.set_num_threads(2)
        two = warmstart.cache_key(cfg)
        torch.set_num_threads(1)
        assert warmstart.cache_key(cfg) == one != two
    finally:
        torch.set_num_threads(previous)


def test_another_install_misses_the_warm_start_cache(monkeypatch):
    """The same config on another transformers trains another policy: it must not reuse this one's."""
    from oma.train import warmstart

    cfg = load_config(None, [])
    here = warmstart.cache_key(cfg)
    assert warmstart.cache_key(cfg) == here
    other = {**warmstart.library_versions(), "transformers": "0.0.1"}
    monkeypatch.setattr(warmstart, "library_versions", lambda: other)
    assert warmstart.cache_key(cfg) != here


def test_cli_smoke_two_iterations(tmp_path):
    out = tmp_path / "run"
    rc = oma_main(["train", *TINY, f"out_dir={out}", f"warm_start.cache_dir={tmp_path / 'cache'}", "dump_batches=true"])
    assert rc == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all("eval_success" in r and r["time_eval"] > 0 for r in records)
    built = records[0]["warm_start"]
    assert built["cached"] is False and built["time_demos"] > 0 and built["time_sft"] > 0 and built["sft_steps"] > 0
    assert records[1]["rows"] == records[1]["rows_per_traj"] * 4
    assert (out / "checkpoints" / "latest").read_text() == "iter_000002"
    assert (out / "checkpoints" / "iter_000002" / "model.safetensors").is_file()
    assert json.loads((out / "config.json").read_text())["iterations"] == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == 2 and 0 <= summary["eval_success_end"] <= 1
    # the installed versions the figures came from, as this interpreter sees them
    versions = summary["versions"]
    assert versions["torch"] == torch.__version__ and versions["transformers"] == transformers.__version__
    assert versions["tokenizers"] == tokenizers.__version__ and versions["python"] == platform.python_version()
    assert versions["oma-rl"] == oma.__version__ and versions["numpy"] is not None
    assert versions["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and versions["cpu"]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in (out / "batches").iterdir()) == ["iter_000001.parquet", "iter_000002.parquet"]
    # a second run into the same out_dir gets a fresh sibling; nothing is overwritten
    rc = oma_main(["train", *TINY, "iterations=0", f"out_dir={out}", f"warm_start.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0 and (tmp_path / "run-2" / "metrics.jsonl").is_file()
    loaded = json.loads((tmp_path / "run-2" / "metrics.jsonl").read_text().splitlines()[0])["warm_start"]
    assert loaded["cached"] is True and "time_sft" not in loaded  # this run spent no SFT time
    assert loaded["sft_steps"] == built["sft_steps"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_rollout_temperature_is_the_policy_trained(tmp_path, temperature):
    """At T ≠ 1 the update scores π_T, the distribution sampled from: with one mini-batch and one
    epoch the first forward pass gives back logp_old (ratio 1, so no clipping and approx-KL ≈ 0).
    An entropy term keeps every row in the forward pass; scored at T = 1 instead, approx_kl_k1 is 0.0027 here."""
    out = tmp_path / "run"
    rc = oma_main(["train", *TINY, f"policy.temperature={temperature}", "optim.num_minibatches=1", "optim.ppo_epochs=1",
                   "iterations=1", "algo.entropy_coef=0.01", f"out_dir={out}", f"warm_start.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    record = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1]
    assert record["clipfrac"] == 0.0
    assert abs(record["approx_kl_k1"]) < 1e-5 and record["approx_kl_k3"] < 1e-8


def test_resume_gives_identical_metrics(tmp_path):
    cache = f"warm_start.cache_dir={tmp_path / 'cache'}"
    common = [*TINY, "checkpoint_every=2", "eval_every=2", cache]
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'straight'}"]) == 0
    assert oma_main(["train", *common, "iterations=2", f"out_dir={tmp_path / 'resumed'}"]) == 0
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'resumed'}", "--resume"]) == 0
    straight, resumed = (without_timings(records(tmp_path / d / "metrics.jsonl")) for d in ("straight", "resumed"))
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3, 4]
    assert resumed == straight
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "straight" / "checkpoints" / "iter_000004" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "iter_000004" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the wall time adds up the invocations: the first one's up to its checkpoint, then the resumed one's
    fresh = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert fresh["wall_time_s"] == fresh["wall_time_s_this_invocation"] > 0
    first = json.loads((tmp_path / "resumed" / "checkpoints" / "iter_000002" / "state.json").read_text())["wall_time_s"]
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert first > 0 and summary["wall_time_s"] == first + summary["wall_time_s_this_invocation"]
    last = json.loads((tmp_path / "resumed" / "checkpoints" / "iter_000004" / "state.json").read_text())["wall_time_s"]
    assert first < last <= summary["wall_time_s"]


def test_training_does_not_depend_on_how_often_it_evaluates(tmp_path):
    """Evaluations draw from their own generator per (seed, iteration) and change no weight, so a run that
    evaluates at every iteration trains exactly as one that evaluates only at its end, and both evaluate the
    end alike (studies/tools/horizon_budget.py re-prices a run's schedule on this)."""
    cache = f"warm_start.cache_dir={tmp_path / 'cache'}"
    for every in (1, 3):
        assert oma_main(["train", *TINY, "iterations=3", f"eval_every={every}", cache, f"out_dir={tmp_path / str(every)}"]) == 0
    often, once = (records(tmp_path / d / "metrics.jsonl") for d in ("1", "3"))
    assert [r["iteration"] for r in often if "eval_success" in r] == [0, 1, 2, 3]
    assert [r["iteration"] for r in once if "eval_success" in r] == [0, 3]
    assert training_at_any_schedule(often) == training_at_any_schedule(once) and len(once) == 4
    assert {k: v for k, v in often[3].items() if k.startswith("eval_")} == \
           {k: v for k, v in once[3].items() if k.startswith("eval_")}


def test_a_run_resumed_from_a_checkpoint_without_its_wall_time_says_it_is_unknown(tmp_path, capsys):
    common = [*TINY, f"warm_start.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'r'}"]
    assert oma_main(["train", *common]) == 0
    state_path = tmp_path / "r" / "checkpoints" / "iter_000002" / "state.json"
    state = json.loads(state_path.read_text())
    del state["wall_time_s"]  # as every checkpoint saved before the record existed
    state_path.write_text(json.dumps(state))
    capsys.readouterr()
    assert oma_main(["train", *common, "iterations=3", "--resume"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["wall_time_s"] is None and summary["wall_time_s_this_invocation"] > 0
    assert "in this invocation" in capsys.readouterr().out


def test_bad_configs(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"unknown config key 'algo.masss'.*valid keys: .*algo\.mass"):
        load_config(None, ["algo.masss=native"])
    with pytest.raises(ConfigError, match=r"algo.accounting='rows' is not valid; expected one of \['row', 'trajectory'\]"):
        load_config(None, ["algo.accounting=rows"])
    with pytest.raises(ConfigError, match="optim.micro_batch_rows must be > 0"):
        load_config(None, ["optim.micro_batch_rows=0"])
    with pytest.raises(ConfigError, match="bad value for config key 'iterations'"):
        load_config(None, ["iterations=many"])
    with pytest.raises(ConfigError, match="config file 'nope.yaml' does not exist"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="override 'iterations' must look like key=value"):
        load_config(None, ["iterations"])
    assert oma_main(["train", "env.options.colour=red", f"out_dir={tmp_path / 'r'}"]) == 2
    assert "env.options:" in capsys.readouterr().err
    assert oma_main(["train", "--resume", f"out_dir={tmp_path / 'nothing'}", *TINY, f"warm_start.cache_dir={tmp_path}"]) == 2
    assert "--resume:" in capsys.readouterr().err


def test_bad_model_path(tmp_path, capsys):
    rc = oma_main(["train", f"policy.model={tmp_path / 'missing'}", f"out_dir={tmp_path / 'r'}", f"warm_start.cache_dir={tmp_path}"])
    assert rc == 2
    assert re.search(r"policy.model: '.*missing' is not a directory", capsys.readouterr().err)
    (tmp_path / "empty").mkdir()
    rc = oma_main(["train", f"policy.model={tmp_path / 'empty'}", f"out_dir={tmp_path / 'r2'}", f"warm_start.cache_dir={tmp_path}"])
    assert rc == 2 and "has no config.json" in capsys.readouterr().err


def test_constrained_decoding_is_a_distribution_over_admissible_actions(tiny_policy):
    from oma.agent.policy import action_choices, allowed_positions, generate

    model, tok = tiny_policy
    env = oma.envs.make("shop")
    obs, info = env.reset(7)
    actions = info["admissible_actions"]
    prompt = tok(step_prompt(info["task"], [], obs, actions, 0), add_special_tokens=False)["input_ids"]
    choices = action_choices(tok, actions)
    # every admissible action's constrained sequence probability; they must sum to 1
    with torch.no_grad():
        logp, mask, _ = response_logprobs(model, [prompt] * len(choices), choices, tok.pad_token_id,
                                          allowed=[allowed_positions(choices, c) for c in choices])
    seq_p = (logp * mask).sum(-1).exp()
    assert float(seq_p.sum()) == pytest.approx(1.0, abs=1e-4)
    # sampling only ever produces admissible actions, at about those frequencies
    gen = generate(model, tok, [prompt] * 400, max_new_tokens=2, temperature=1.0,
                   generator=torch.Generator().manual_seed(0), choices=[choices] * 400)
    assert set(gen.texts) <= set(actions)
    # what generation records as allowed is what the trie allows for that response (training renormalises over it)
    for resp, pairs in zip(gen.response_ids[:20], gen.allowed[:20]):
        assert torch.equal(pairs, allowed_positions(choices, resp))
    freq = torch.tensor([gen.texts.count(a) / 400 for a in actions])
    assert float((freq - seq_p).abs().max()) < 0.1


def test_presets_load_and_name_their_command():
    """configs/ holds the presets a user picks (at most 12, the verl example included), each headed by at most
    3 comment lines, the first its command; a study's variants live with the study."""
    presets = sorted(CONFIGS.glob("*.yaml"))
    assert presets, "no presets found"
    assert len(list(CONFIGS.rglob("*.yaml"))) <= 12
    for path in CONFIGS.rglob("*.yaml"):
        lines = path.read_text().splitlines()
        assert len(lines[: next(i for i, ln in enumerate(lines) if not ln.startswith("#"))]) <= 3, path.name
    missing = []
    for path in presets:
        assert path.read_text().splitlines()[0] == f"# oma train configs/{path.name}"
        cfg = load_config(path)
        try:
            oma.envs.make(cfg.env.name, **cfg.env.options)  # the options are valid for the env
        except ImportError as e:  # an adapter whose extra is not installed here (CI installs them all)
            missing.append(f"{path.name}: {e}")
    if missing:
        pytest.skip("presets not checked, extra missing: " + "; ".join(missing))


def test_the_default_job_is_oma_train_with_no_arguments():
    preset = CONFIGS / "household-gigpo-oma.yaml"
    assert load_config(preset) == load_config(None)
    assert "train: $(BIN)/oma-installed\n\t$(BIN)/oma train\n" in (preset.parents[1] / "Makefile").read_text()


@pytest.mark.parametrize("name", ["household-grpo-baseline", "household-grpo-oma", "household-grpo-oma-long-2026-12-04",
                                  "household-gspo-oma"])
def test_the_household_grpo_and_gspo_presets_train_to_the_environments_own_cap(name):
    """They were measured before the default job capped training episodes at 20; they keep household's 30."""
    cfg = load_config(preset(f"{name}.yaml"))
    assert cfg.env.train_max_steps is None and "text" not in cfg.env.options


def test_env_options_belong_to_one_environment():
    default = load_config(None).env.options
    assert default["hint"] is True and default["size"] == "small"
    assert load_config(None, ["env.options.max_steps=20"]).env.options == {**default, "max_steps": 20}  # adds a key
    assert load_config(None, ["env.name=shop"]).env.options == {}  # another env starts from its own defaults
    assert load_config(None, ["env.name=shop", "env.options.reward=success"]).env.options == {"reward": "success"}
    assert load_config(CONFIGS / "shop-grpo-oma.yaml").env.options == {"reward": "score"}  # a preset replaces them
    assert load_config(CONFIGS / "shop-grpo-oma.yaml", ["env.options.max_steps=9"]).env.options == {"reward": "score", "max_steps": 9}


def test_the_training_cap_belongs_to_one_environment():
    """The default job's cap of 20 is household's; another environment trains to its own cap unless told."""
    assert load_config(None).env.train_max_steps == 20
    assert load_config(None, ["env.name=household"]).env.train_max_steps == 20  # the same environment keeps it
    assert load_config(None, ["env.name=shop"]).env.train_max_steps is None
    assert load_config(None, ["env.name=shop", "env.train_max_steps=7"]).env.train_max_steps == 7
    assert load_config(None, ["env.train_max_steps=7", "env.name=shop"]).env.train_max_steps == 7  # one layer: set wins
    assert load_config(CONFIGS / "textworld-grpo-oma.yaml").env.train_max_steps is None
    assert load_config(CONFIGS / "textworld-grpo-oma.yaml", ["env.train_max_steps=5"]).env.train_max_steps == 5
    assert load_config(CONFIGS / "chain-tabular-grpo.yaml").env.train_max_steps is None
    assert load_config(None, ["env.train_max_steps=null"]).env.train_max_steps is None
    with pytest.raises(ConfigError, match="env.train_max_steps must be > 0 or null, got 0"):
        load_config(None, ["env.train_max_steps=0"])


def test_show_actions_follows_constrained_decoding_unless_set():
    assert load_config(None).env.show_actions is False  # constrained: the actions need not be listed
    assert load_config(None, ["policy.constrained=false"]).env.show_actions is True
    assert load_config(None, ["env.show_actions=true"]).env.show_actions is True
    with pytest.raises(ConfigError, match="env.show_actions=false needs policy.constrained=true"):
        load_config(None, ["policy.constrained=false", "env.show_actions=false"])
    assert "Can:" not in step_prompt("t", [], "o", ["a", "b"], 0, show_actions=False)
    assert "Can: a | b" in step_prompt("t", [], "o", ["a", "b"], 0)


def test_warm_start_cache_key_follows_the_prompt_format(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached warm start was trained on one prompt format; another format must not reuse it."""
    import oma.train.warmstart as warmstart

    cfg = load_config(None, [])
    before = warmstart.cache_key(cfg)
    assert warmstart.cache_key(cfg) == before  # deterministic
    original = warmstart.step_prompt
    monkeypatch.setattr(warmstart, "step_prompt", lambda *a: original(*a).replace("Task:", "Goal:"))
    assert warmstart.cache_key(cfg) != before


@pytest.mark.parametrize("name", oma.envs.names(builtin_only=True))
def test_reward_only_options_leave_demonstrations_and_the_warm_start_key_alone(name: str) -> None:
    """An option declared reward-only must not change a demonstration (else sharing the cached
    warm start would be wrong); every other option still splits the cache."""
    import typing

    from oma.agent.imitation import demonstrations
    from oma.train.warmstart import cache_key

    env_cls = oma.envs.env_class(name)
    assert env_cls.reward_only_options == ({"reward"} if name in ("shop", "chain") else set())
    for option in env_cls.reward_only_options:
        values = typing.get_args(typing.get_type_hints(env_cls.options_class)[option])
        assert len(values) >= 2
        demos = [demonstrations(lambda v=v: oma.envs.make(name, **{option: v}), 6, 0.3, 2) for v in values]
        assert all(d == demos[0] for d in demos) and len(demos[0]) > 6
        keys = {cache_key(load_config(None, [f"env.name={name}", f"env.options.{option}={v}"])) for v in values}
        assert len(keys) == 1
    other = {"household": "size=large", "shop": "distractors=few", "chain": "length=6"}[name]  # a value the defaults do not have
    assert cache_key(load_config(None, [f"env.name={name}"])) != cache_key(load_config(None, [f"env.name={name}", f"env.options.{other}"]))


def test_forced_rest_and_unique_index_by_hand():
    from oma.agent.policy import forced_rest, unique_index

    choices = [[5, 6, 7, 2], [5, 8, 2], [9, 2]]  # three actions, EOS = 2
    assert forced_rest(choices, []) is None  # three remain
    assert forced_rest(choices, [5]) is None  # two remain
    assert forced_rest(choices, [5, 6]) == [7, 2]  # one remains: its rest is forced
    assert forced_rest(choices, [9]) == [2]
    assert forced_rest(choices + [[9, 2]], [9]) == [2]  # a duplicated action is still one continuation
    firsts, inverse = unique_index(["a", "b", "a", "c", "b"])
    assert firsts == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2, 1]
    assert unique_index([])[0] == [] and unique_index([])[1].tolist() == []


def test_generation_records_the_log_probs_training_scores(tiny_policy):
    """logp recorded while sampling = response_logprobs of the same rows (constrained, at the sampling T); forced tokens are
    exactly 0; duplicated prompts (shared prefill) decode as they would alone."""
    from oma.agent.policy import action_choices, generate

    model, tok = tiny_policy
    env = oma.envs.make("shop")
    prompts, choices = [], []
    for seed in (1, 2):
        obs, info = env.reset(seed)
        prompts.append(tok(step_prompt(info["task"], [], obs, info["admissible_actions"], 0), add_special_tokens=False)["input_ids"])
        choices.append(action_choices(tok, info["admissible_actions"]))
    batch_prompts, batch_choices = [prompts[k % 2] for k in range(6)], [choices[k % 2] for k in range(6)]
    for temperature in (1.0, 0.0, 2.0, 0.5):
        gen = generate(model, tok, batch_prompts, max_new_tokens=2, temperature=temperature,
                       generator=torch.Generator().manual_seed(3), choices=batch_choices)
        # recorded at the temperature sampled from (the model's own distribution when greedy)
        logp, mask, entropy = response_logprobs(model, batch_prompts, gen.response_ids, tok.pad_token_id, with_entropy=True,
                                                allowed=gen.allowed, temperature=temperature or 1.0)
        for r, ids in enumerate(gen.response_ids):
            assert len(gen.logp[r]) == len(ids) == int(mask[r].sum())
            torch.testing.assert_close(torch.tensor(gen.logp[r]), logp[r, : len(ids)], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(torch.tensor(gen.entropy[r]), entropy[r, : len(ids)], rtol=1e-4, atol=1e-5)
            forced = [t for t in range(len(ids)) if int((gen.allowed[r][:, 0] == t).sum()) == 1]
            assert forced and all(gen.logp[r][t] == 0.0 for t in forced)  # every action ends in forced tokens (EOS)
    alone = generate(model, tok, prompts, max_new_tokens=2, temperature=0.0, generator=None, choices=choices)
    shared = generate(model, tok, batch_prompts, max_new_tokens=2, temperature=0.0, generator=None, choices=batch_choices)
    assert shared.texts == [alone.texts[k % 2] for k in range(6)]


def test_forward_plan_serves_every_row_once_and_computes_each_distinct_row_once():
    from oma.agent.rollout import Rows
    from oma.train.loop import forward_plan

    prompts = [[1, 2], [1, 2], [3], [1, 2], [4, 5, 6], [3]]
    responses = [[7], [7], [7], [8], [9, 9], [7]]
    rows = Rows(prompt_ids=prompts, response_ids=responses)
    rows_idx = torch.tensor([0, 1, 2, 3, 4, 5])
    for micro in (1, 2, 10):
        plan = forward_plan(rows, rows_idx, micro)
        served = torch.cat([s for _, s, _ in plan]).sort().values
        assert served.tolist() == list(range(6))  # each position once
        computed = [(tuple(prompts[i]), tuple(responses[i])) for c, _, _ in plan for i in c.tolist()]
        assert sorted(computed) == sorted(set(zip(map(tuple, prompts), map(tuple, responses))))  # 4 distinct rows
        assert all(len(c) <= micro for c, _, _ in plan)
        for compute, positions, local in plan:  # each position reads the row equal to its own
            for pos, loc in zip(positions.tolist(), local.tolist()):
                i, j = rows_idx[pos].item(), compute[loc].item()
                assert (prompts[i], responses[i]) == (prompts[j], responses[j])
    lengths = [len(prompts[c[0]]) + len(responses[c[0]]) for c, _, _ in forward_plan(rows, rows_idx, 1)]
    assert lengths == sorted(lengths, reverse=True)  # longest first: micro-batches pad to similar lengths
    assert forward_plan(rows, torch.tensor([], dtype=torch.long), 4) == []


def test_learning_signal_by_hand():
    from oma.agent.rollout import Rows
    from oma.train.loop import learning_signal

    # 3 groups: g0 trajectories 0 (score 1, 2 rows) and 1 (score 0, 1 row); g1 two trajectories that both
    # scored 1 (zero spread); g2 a single trajectory (no baseline): 2 of 3 groups teach nothing
    group = torch.tensor([0, 0, 0, 1, 1, 2])
    traj = torch.tensor([0, 0, 1, 2, 3, 4])
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.5])
    rows = Rows(prompt_ids=[[1]] * 6, response_ids=[[1]] * 6, group_index=group, traj_index=traj,
                scores=torch.zeros(6))  # the spread is read from the scores passed in, not these
    mask = torch.tensor([[True, True]] * 5 + [[True, False]])
    entropy = torch.tensor([[0.5, 0.1]] * 5 + [[1.0, 99.0]])  # the masked 99 must not count
    logp_old = torch.log(torch.tensor([[0.5, 0.25]] * 6))
    logp_ref = torch.log(torch.tensor([[0.25, 0.25]] * 6))
    adv = torch.tensor([1.0, 1.0, -1.0, 0.0, 0.0, 0.0])
    got = learning_signal(rows, scores, mask, adv, logp_old, entropy, logp_ref)
    assert got["zero_spread_groups"] == pytest.approx(2 / 3)
    assert got["adv_abs_mean"] == pytest.approx(3 / 6)
    assert got["entropy"] == pytest.approx((5 * 0.6 + 1.0) / 11)
    k3 = 0.5 - math.log(0.5) - 1  # first token: ratio ref/old = 0.5; second token: 0
    assert got["kl_warm_start"] == pytest.approx(6 * k3 / 11)
    assert "kl_warm_start" not in learning_signal(rows, scores, mask, adv, logp_old, entropy, None)


def test_choice_tokens_by_hand():
    """Which tokens were choices, for each kind of policy, and the entropy over them alone."""
    from oma.agent.rollout import Rows
    from oma.train.loop import choice_mask, learning_signal

    mask = torch.tensor([[True, True, True], [True, True, False]])
    # token-level constraint: (position, token) pairs; row 0 chose among 2 tokens, then 1, then 1 (forced);
    # row 1 among 3, then 2; its position 2 is past the response (a stray pair there must not count)
    lm = [torch.tensor([[0, 5], [0, 6], [1, 7], [2, 2]]), torch.tensor([[0, 5], [0, 6], [0, 8], [1, 3], [1, 4], [2, 2], [2, 9]])]
    rows = Rows(prompt_ids=[[1]] * 2, response_ids=[[5, 7, 2], [8, 3]], group_index=torch.tensor([0, 0]),
                traj_index=torch.tensor([0, 1]), allowed=lm)
    assert choice_mask(rows, mask).tolist() == [[True, False, False], [True, True, False]]
    entropy = torch.tensor([[0.6, 0.0, 0.0], [1.0, 0.5, 99.0]])
    got = learning_signal(rows, torch.tensor([1.0, 0.0]), mask, torch.zeros(2), torch.zeros(2, 3), entropy, None)
    assert got["choice_tokens"] == pytest.approx(3 / 5)
    assert got["entropy_choices"] == pytest.approx((0.6 + 1.0 + 0.5) / 3)
    assert got["entropy"] == pytest.approx(got["entropy_choices"] * got["choice_tokens"])  # forced tokens add 0
    # tabular: table slots of the admissible actions, one choice per row on all its tokens
    rows.allowed, rows.kind = [torch.tensor([4]), torch.tensor([1, 2, 3])], "tabular"
    assert choice_mask(rows, mask).tolist() == [[False, False, False], [True, True, False]]
    # action level: [k, w] admissible actions padded with -1
    rows.allowed, rows.kind = [torch.tensor([[5, 2], [6, -1]]), torch.tensor([[8, 3]])], "action"
    assert choice_mask(rows, mask).tolist() == [[True, True, True], [False, False, False]]
    # a batch with no choice at all reports None (JSON null), not NaN or 0
    rows.allowed = [torch.tensor([[5, 2]]), torch.tensor([[8, 3]])]
    got = learning_signal(rows, torch.tensor([1.0, 0.0]), mask, torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, 3), None)
    assert got["choice_tokens"] == 0.0 and got["entropy_choices"] is None
    # unconstrained: every token is a choice among the vocabulary
    rows.allowed, rows.kind = None, "token"
    assert torch.equal(choice_mask(rows, mask), mask)


def test_forced_tokens_have_zero_entropy_in_a_real_rollout(tiny_policy):
    """On a constrained generation, the tokens choice_mask calls forced have entropy exactly 0 and the
    choices do not, so ``entropy`` = ``entropy_choices`` × ``choice_tokens``."""
    from oma.agent.policy import action_choices, generate
    from oma.agent.rollout import Rows
    from oma.train.loop import choice_mask, learning_signal, per_token

    model, tok = tiny_policy
    env = oma.envs.make("household", hint=True, notes=True)
    prompts, choices = [], []
    for seed in range(4):
        obs, info = env.reset(seed)
        prompts.append(tok(step_prompt(info["task"], [], obs, info["admissible_actions"], 0), add_special_tokens=False)["input_ids"])
        choices.append(action_choices(tok, info["admissible_actions"]))
    gen = generate(model, tok, prompts, max_new_tokens=2, temperature=1.0, generator=torch.Generator().manual_seed(0),
                   choices=choices)
    rows = Rows(prompt_ids=prompts, response_ids=gen.response_ids, group_index=torch.zeros(4, dtype=torch.long),
                traj_index=torch.arange(4), allowed=gen.allowed)
    lengths = torch.tensor([len(r) for r in gen.response_ids])
    mask = torch.arange(int(lengths.max())).unsqueeze(0) < lengths.unsqueeze(-1)
    entropy = per_token(gen.entropy, mask.shape[1])
    picked = choice_mask(rows, mask)
    assert bool(picked.any()) and bool((picked != mask).any())  # both kinds occur
    assert bool((entropy[mask & ~picked] == 0).all()) and bool((entropy[picked] > 0).all())
    got = learning_signal(rows, torch.zeros(4), mask, torch.zeros(4), torch.zeros(mask.shape), entropy, None)
    assert got["entropy"] == pytest.approx(got["entropy_choices"] * got["choice_tokens"], rel=1e-6)
    assert got["entropy_choices"] > got["entropy"]


def test_rows_without_advantage_are_skipped_exactly(monkeypatch, tiny_policy):
    """Skipping the forward pass of A = 0 rows changes neither the loss nor the gradient; their tokens
    still count in the weights' normalisers (token-mean over the whole mini-batch)."""
    model, tok = tiny_policy
    ro, batch = _captured_batch(monkeypatch, model, tok, seeds=(3, 4), group_size=3, max_steps=5, logp_shift=0.05)
    rows = ro.rows
    batch.adv = torch.where(rows.traj_index % 2 == 0, torch.zeros(len(rows)), torch.linspace(-1, 1, len(rows)))
    assert 0 < int((batch.adv == 0).sum()) < len(rows)
    cfg = load_config(None, ["algo.mass=native", "algo.reducer=token-mean", "optim.micro_batch_rows=2"])
    model.zero_grad()
    stats = minibatch_loss(model, batch, torch.arange(len(rows)), cfg, tok.pad_token_id, backward=True)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logp, mask, _ = response_logprobs(model, rows.prompt_ids, rows.response_ids, tok.pad_token_id)
    w = token_weights(mask, rows.group_index, rows.traj_index, reducer="token-mean", mass="native")
    assert float(w.sum()) == pytest.approx(1.0)  # normalised over every token, skipped rows' included
    loss = weighted_loss(token_objective(logp, batch.logp_old, batch.adv, mask), w)
    loss.backward()
    assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_per_token_pads_each_rows_values_by_hand():
    from oma.train.loop import per_token

    assert per_token([[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]], 4).tolist() == [[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 6, 0]]
    assert per_token([], 3).shape == (0, 3)


def _scored_rows(valid: list[bool], rewards: list[float], traj: list[int], step: list[int], penalty: float = 0.1):
    from oma.agent.rollout import Rows

    valid_t = torch.tensor(valid)
    pen = penalty * (~valid_t).float()
    env_reward = torch.tensor(rewards, dtype=torch.float32)
    traj_t = torch.tensor(traj)
    outcome = torch.zeros(int(traj_t.max()) + 1).index_add_(0, traj_t, env_reward)[traj_t]
    return Rows(traj_index=traj_t, step_index=torch.tensor(step), group_index=torch.zeros(len(traj), dtype=torch.long),
                valid=valid_t, step_rewards=env_reward - pen, scores=outcome - pen)


def test_discounted_episode_score_by_hand():
    """algo.score=discounted: G_0 = Σ γ^t r_t; the row's own invalid penalty stays on that row, undiscounted."""
    from oma.train.loop import episode_scores

    # trajectory 0 wins at its third step, 1 at its first; 2 makes an invalid move, then stops without a win
    rows = _scored_rows([True, True, True, True, False, True], [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 2, 2], [0, 1, 2, 0, 0, 1])
    cfg = load_config(None, ["algo.score=discounted", "algo.gamma=0.5"])
    assert episode_scores(cfg, rows).tolist() == pytest.approx([0.25, 0.25, 0.25, 1.0, -0.1, 0.0])
    cfg = load_config(None, ["algo.score=return"])
    assert episode_scores(cfg, rows) is rows.scores  # verl-agent's score, untouched
    cfg = load_config(None, ["algo.score=discounted", "algo.gamma=1.0"])  # γ = 1: the summed reward
    assert episode_scores(cfg, rows).tolist() == pytest.approx(rows.scores.tolist())


def test_discounted_episode_score_matches_a_loop_in_any_row_order():
    from oma.train.loop import episode_scores

    g = torch.Generator().manual_seed(0)
    lengths = [1, 4, 7, 2, 5]
    traj = [t for t, n in enumerate(lengths) for _ in range(n)]
    step = [k for n in lengths for k in range(n)]
    rewards = torch.rand(len(traj), generator=g).tolist()
    valid = (torch.rand(len(traj), generator=g) > 0.3).tolist()
    cfg = load_config(None, ["algo.score=discounted", "algo.gamma=0.9", "env.invalid_penalty=0.25"])
    rows = _scored_rows(valid, rewards, traj, step, penalty=0.25)
    g0 = {t: sum(0.9 ** k * r for tt, k, r in zip(traj, step, rewards) if tt == t) for t in set(traj)}
    expected = [g0[t] - 0.25 * (not v) for t, v in zip(traj, valid)]
    assert episode_scores(cfg, rows).tolist() == pytest.approx(expected, abs=1e-6)
    perm = torch.randperm(len(traj), generator=g)
    shuffled = _scored_rows([valid[i] for i in perm], [rewards[i] for i in perm], [traj[i] for i in perm],
                            [step[i] for i in perm], penalty=0.25)
    assert torch.allclose(episode_scores(cfg, shuffled), episode_scores(cfg, rows)[perm])


def test_episode_score_option_is_checked():
    with pytest.raises(ConfigError, match=r"algo.score='discount' is not valid; expected one of \['return', 'discounted'\]"):
        load_config(None, ["algo.score=discount"])
