"""The tabular policy (docs/experiments.md#the-tabular-lane): by hand, against oma.core, resume, bad input."""

import json
import math

import pytest
import torch

import oma.envs
from oma.agent.tabular import TabularPolicy, action_tokens, imitate, tabular_rollout
from oma.cli import main as oma_main
from oma.core import outcome_advantages, token_objective, token_weights, weighted_loss
from oma.train.config import ConfigError, load_config
from oma.train.loop import Batch, minibatch_loss, per_token, response_mask_of, row_logprobs

TAB = ["policy.model=tabular", "env.name=household", "env.train_max_steps=null", "env.options.max_steps=6",
       "env.eval_tasks=4",
       "env.tasks_per_iter=2", "env.group_size=3", "optim.lr=0.1", "tensorboard=false", "threads=1"]


def _two_state_policy():
    """States s, t; s admits (go, push the gate), t admits (go, wait here, jump) — entries 0..4."""
    p = TabularPolicy(16)
    for state, action in (("s", "go"), ("s", "push the gate"), ("t", "go"), ("t", "wait here"), ("t", "jump")):
        p.entry(state, action)
    with torch.no_grad():
        p.logits[:5] = torch.tensor([0.0, math.log(3.0), 1.0, 1.0, 0.0])
    return p


def test_action_tokens_are_words_plus_eos():
    assert [action_tokens(a) for a in ("go", "push the gate", "  wait   here ")] == [2, 4, 3]


def test_log_probs_and_gradients_by_hand():
    p = _two_state_policy()
    # rows: (s, push the gate) = entry 1 with 4 tokens; (t, wait here) = entry 3 with 3 tokens
    responses = [[1] * 4, [3] * 3]
    allowed = [torch.tensor([0, 1]), torch.tensor([2, 3, 4])]
    logp, mask, entropy = p.response_logprobs(responses, allowed, with_entropy=True)
    e = math.e
    # every token carries the action's log-prob: π(push | s) = 3/(1+3); π(wait | t) = e/(e+e+1); 0 past the row
    a, b = math.log(3 / 4), math.log(e / (2 * e + 1))
    assert logp.tolist() == [pytest.approx([a] * 4), pytest.approx([b, b, b, 0])]
    assert mask.tolist() == [[True] * 4, [True, True, True, False]]
    h_s = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    q = [e / (2 * e + 1), e / (2 * e + 1), 1 / (2 * e + 1)]
    h_t = -sum(x * math.log(x) for x in q)
    assert entropy.tolist() == [pytest.approx([h_s] * 4), pytest.approx([h_t] * 3 + [0])]
    # d log π(a|s) / dθ[s, b] = 1[a = b] − π(b|s), once per token: 4 tokens of row 0, 3 of row 1
    logp.sum().backward()
    assert p.logits.grad[:5].tolist() == pytest.approx([4 * -0.25, 4 * 0.25, 3 * -q[0], 3 * (1 - q[1]), 3 * -q[2]])
    assert p.logits.grad[5:].abs().sum() == 0


def test_act_greedy_sampled_and_recorded_log_probs():
    p = _two_state_policy()
    gen = p.act(["s", "t"], [["go", "push the gate"], ["go", "wait here", "jump"]], temperature=0.0, generator=None)
    assert gen.texts == ["push the gate", "go"]  # argmax; the tie in t goes to the first action
    assert gen.response_ids == [[1] * 4, [2] * 2]
    # recorded log-probs are those training scores: the same as response_logprobs of the chosen rows
    logp, _, _ = p.response_logprobs(gen.response_ids, gen.allowed)
    assert [lp[0] for lp in gen.logp] == pytest.approx(logp[:, 0].tolist())
    assert gen.logp[0] == [gen.logp[0][0]] * 4 and len(gen.logp[1]) == 2
    # sampling follows π: 4000 draws in s, π(push | s) = 0.75
    g = torch.Generator().manual_seed(0)
    gen = p.act(["s"] * 4000, [["go", "push the gate"]] * 4000, temperature=1.0, generator=g)
    share = sum(t == "push the gate" for t in gen.texts) / 4000
    assert abs(share - 0.75) < 0.03
    # a new state is met with logits 0: uniform
    gen = p.act(["u"], [["a", "b", "c", "d"]], temperature=1.0, generator=g)
    assert gen.logp[0][0] == pytest.approx(math.log(0.25)) and p.entries == 9


def test_temperature_trains_the_distribution_it_samples_by_hand():
    """π_T = softmax(logits / T), verl's convention: sampled from, recorded and scored at T."""
    p = _two_state_policy()
    # in s, logits (0, log 3) / 0.5 = (0, log 9): π_T(push | s) = 9/10, π_T(go | s) = 1/10
    g = torch.Generator().manual_seed(0)
    gen = p.act(["s"] * 4000, [["go", "push the gate"]] * 4000, temperature=0.5, generator=g)
    share = sum(t == "push the gate" for t in gen.texts) / 4000
    assert abs(share - 0.9) < 0.02
    recorded = {t: lp[0] for t, lp in zip(gen.texts, gen.logp)}
    assert recorded == {"push the gate": pytest.approx(math.log(0.9)), "go": pytest.approx(math.log(0.1))}
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert gen.entropy[0][0] == pytest.approx(h)
    logp, _, entropy = p.response_logprobs([[1] * 4], [torch.tensor([0, 1])], with_entropy=True, temperature=0.5)
    assert logp[0].tolist() == pytest.approx([math.log(0.9)] * 4) and entropy[0].tolist() == pytest.approx([h] * 4)
    # d log π_T(push | s) / dθ[s, ·] = (1[a = b] − π_T(b | s)) / T, once per token
    logp.sum().backward()
    assert p.logits.grad[:2].tolist() == pytest.approx([4 * -0.1 / 0.5, 4 * 0.1 / 0.5])
    # greedy decoding records π itself (T = 1): log 3/4
    gen = p.act(["s"], [["go", "push the gate"]], temperature=0.0, generator=None)
    assert gen.logp[0][0] == pytest.approx(math.log(0.75))


def test_table_full_names_the_key():
    p = TabularPolicy(2)
    p.entry("s", "a")
    p.entry("s", "b")
    assert p.entry("s", "a") == 0  # known pairs keep their entry
    with pytest.raises(ValueError, match="policy.table_size=2 is full"):
        p.entry("s", "c")


def test_imitation_is_add_one_smoothed_counts_by_hand():
    p = TabularPolicy(8)
    demos = [("s", "a", ["a", "b", "c"]), ("s", "a", ["a", "b", "c"]), ("s", "b", ["a", "b", "c"]), ("t", "x", ["x", "y"])]
    imitate(p, demos)
    logp, _, _ = p.response_logprobs([[p.entry("s", "a")], [p.entry("t", "y")]],
                                     [torch.tensor([p.entry("s", a) for a in "abc"]), torch.tensor([p.entry("t", a) for a in "xy"])])
    assert logp[:, 0].exp().tolist() == pytest.approx([3 / 6, 1 / 3])  # (1+2)/(3+3), (1+0)/(2+1)


def _batch(policy, seeds=(7, 8), group_size=3):
    g = torch.Generator().manual_seed(1)
    ro = tabular_rollout(lambda: oma.envs.make("household", max_steps=6), policy, list(seeds), group_size=group_size,
                         temperature=1.0, invalid_penalty=0.1, generator=g)
    rows = ro.rows
    mask = response_mask_of(rows)
    adv = outcome_advantages(rows.scores + 0.1 * rows.traj_index.float(), rows.group_index, rows.traj_index)  # spread
    logp_old = per_token(rows.logp, mask.shape[1]) - 0.05 * mask.float()  # ratio ≠ 1
    return ro, Batch(rows, mask, adv, logp_old, None)


def test_rollout_rows_carry_token_counts_and_recorded_log_probs():
    p = TabularPolicy(4096)
    ro, batch = _batch(p)
    rows = ro.rows
    assert len(rows) == sum(e.steps for e in ro.episodes) and rows.valid.all()
    texts = [ro.episodes[t].transcript[k][1] for t, k in zip(rows.traj_index.tolist(), rows.step_index.tolist())]
    assert [len(r) for r in rows.response_ids] == [action_tokens(t) for t in texts]
    assert len({len(r) for r in rows.response_ids}) > 1  # short and long actions were both taken
    logp, mask, _ = row_logprobs(p, rows, torch.arange(len(rows)), 0, temperature=1.0)
    assert torch.equal(mask, batch.response_mask)
    torch.testing.assert_close(logp, per_token(rows.logp, mask.shape[1]))


@pytest.mark.parametrize("micro", [1, 4, 1000])
def test_loop_loss_equals_oma_core_in_one_piece(micro):
    p = TabularPolicy(4096)
    ro, batch = _batch(p)
    with torch.no_grad():
        p.logits.normal_(generator=torch.Generator().manual_seed(3))
    rows = ro.rows
    cfg = load_config(None, [*TAB, "algo.mass=uniform", "algo.reducer=seq-mean-token-mean", f"optim.micro_batch_rows={micro}"])
    stats = minibatch_loss(p, batch, torch.arange(len(rows)), cfg, 0, backward=True)
    grad = p.logits.grad.clone()
    p.zero_grad()
    logp, mask, _ = p.response_logprobs(rows.response_ids, rows.allowed)
    w = token_weights(mask, rows.group_index, rows.traj_index, reducer="seq-mean-token-mean", mass="uniform")
    loss = weighted_loss(token_objective(logp, batch.logp_old, batch.adv, mask), w)
    loss.backward()
    assert stats["loss"] == pytest.approx(float(loss.detach()), abs=1e-6)
    torch.testing.assert_close(grad, p.logits.grad, atol=1e-7, rtol=1e-5)
    assert grad.abs().sum() > 0


def _metrics(path):
    drop = ("time_", "tokens_per_s", "rows_per_s", "warm_start")
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(drop)} for line in path.read_text().splitlines()]


def test_tabular_training_is_deterministic_and_resumes_exactly(tmp_path):
    common = [*TAB, "env.name=chain", "env.options.length=2", "optim.optimizer=sgd", "optim.lr=5", "checkpoint_every=2",
              "eval_every=2"]
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'a'}"]) == 0
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'b'}"]) == 0
    assert oma_main(["train", *common, "iterations=2", f"out_dir={tmp_path / 'r'}"]) == 0
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'r'}", "--resume"]) == 0
    a, b, r = (_metrics(tmp_path / d / "metrics.jsonl") for d in "abr")
    assert a == b == r and [x["iteration"] for x in r] == [0, 1, 2, 3, 4]
    assert any(x.get("grad_norm", 0) > 0 for x in a)  # it did update
    from safetensors.torch import load_file

    ta = load_file(str(tmp_path / "a" / "checkpoints" / "iter_000004" / "model.safetensors"))["logits"]
    tr = load_file(str(tmp_path / "r" / "checkpoints" / "iter_000004" / "model.safetensors"))["logits"]
    assert torch.equal(ta, tr) and ta.abs().sum() > 0
    state = json.loads((tmp_path / "r" / "checkpoints" / "iter_000004" / "state.json").read_text())
    met = len(state["model_index"]["entries"])
    assert met > 0 and ta[met:].abs().sum() == 0  # only the entries met have moved


@pytest.mark.parametrize("override, key", [
    ("policy.lora_r=8", "policy.lora_r"), ("policy.constrained=false", "policy.constrained"),
    ("policy.hidden=64", "policy.hidden"), ("env.history_length=2", "env.history_length"),
    ("env.show_actions=true", "env.show_actions"), ("policy.table_size=0", "policy.table_size"),
])
def test_lm_only_options_are_refused_by_name(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [*TAB, override])


def test_normalized_sgd_steps_have_length_lr_by_hand():
    from oma.train.loop import NormalizedSGD

    a, b = torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.nn.Parameter(torch.tensor([0.0]))
    opt = NormalizedSGD([a, b], lr=0.5)
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # ‖g‖ = 5
    opt.step()
    assert a.tolist() == pytest.approx([1 - 0.5 * 3 / 5, 2.0]) and b.tolist() == pytest.approx([-0.5 * 4 / 5])
    a.grad, b.grad = torch.tensor([30.0, 0.0]), torch.tensor([40.0])  # 10x the gradient: the same step
    before = a.detach().clone()
    opt.step()
    assert (a.detach() - before).tolist() == pytest.approx([-0.3, 0.0])
    a.grad.zero_(), b.grad.zero_()
    before = a.detach().clone()
    opt.step()  # a zero gradient takes no step (and makes no NaN)
    assert torch.equal(a.detach(), before)
    assert load_config(None, [*TAB, "optim.optimizer=normalized-sgd"]).optim.optimizer == "normalized-sgd"
    with pytest.raises(ConfigError, match="optim.optimizer='adam' is not valid"):
        load_config(None, [*TAB, "optim.optimizer=adam"])
    with pytest.raises(ConfigError, match="optim.weight_decay=0.1 does not apply"):
        load_config(None, [*TAB, "optim.optimizer=normalized-sgd", "optim.weight_decay=0.1"])


def test_tabular_defaults_start_uniform_and_lm_defaults_keep_their_warm_start():
    assert load_config(None, TAB).warm_start.enabled is False
    assert load_config(None, []).warm_start.enabled is True
    assert load_config(None, [*TAB, "warm_start.enabled=true"]).warm_start.enabled is True


def test_the_imitation_warm_start_through_the_config_prefers_the_expert():
    from oma.agent.imitation import DEMO_SEED_OFFSET
    from oma.train import build_policy, make_env

    cfg = load_config(None, ["policy.model=tabular", "env.name=chain", "warm_start.enabled=true", "warm_start.episodes=5"])
    policy, tokenizer, info = build_policy(cfg, make_env(cfg))
    assert tokenizer is None and info["cached"] is False and policy.entries > 0
    env = oma.envs.make("chain")
    env.reset(DEMO_SEED_OFFSET)  # the first demonstration's first state: the expert was shown acting there
    state, actions = env.anchor(), env.reset(DEMO_SEED_OFFSET)[1]["admissible_actions"]
    gen = policy.act([state], [actions], temperature=0.0, generator=None)
    assert gen.texts == [env.expert_action()] and gen.logp[0][0] > math.log(1 / len(actions))
    uniform = load_config(None, ["policy.model=tabular", "env.name=chain"])
    assert build_policy(uniform, make_env(uniform))[0].entries == 0  # no warm start: nothing met yet


def test_an_environment_without_anchor_is_refused_with_the_reason(monkeypatch, tmp_path, capsys):
    from oma.envs import registry

    class NoAnchor:
        def __init__(self, **options):
            pass

        def reset(self, seed):
            return "obs", {"admissible_actions": ["a"], "won": False, "task": "t"}

    monkeypatch.setitem(registry._ENVS, "noanchor", NoAnchor)
    rc = oma_main(["train", "policy.model=tabular", "env.name=noanchor", f"out_dir={tmp_path / 'x'}", "tensorboard=false"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "needs env.anchor()" in err and "noanchor" in err


def test_tabular_compare_two_seeds_two_iterations_writes_every_section(tmp_path):
    from test_experiments import PNGS, SECTIONS

    out = tmp_path / "cmp"
    argv = ["compare", "configs/chain-tabular-grpo.yaml", "env.eval_tasks=8", "eval_every=1", "--variants", "2",
            "--seeds", "2", "--horizon", "2", "--metric", "sampled", "--out", str(out)]
    assert oma_main(argv) == 0
    report = (out / "report.md").read_text()
    for section in SECTIONS:
        assert section in report, section
    assert "held-out sampled success" in report and all((out / p).is_file() for p in PNGS)
    res = json.loads((out / "results.json").read_text())
    assert res["metric"] == "sampled" and res["variants"]["OA+MA"]["paired_seeds"] == [0, 1]
    # the report's endpoint is the mean of the sampled evaluations at 0, 1, 2, read back by hand
    rd = out / "OA+MA" / "seed-1"
    curve = [json.loads(ln)["eval_sampled_success"] for ln in (rd / "metrics.jsonl").read_text().splitlines()]
    run = next(r for r in res["runs"] if r["variant"] == "OA+MA" and r["seed"] == 1)
    assert run["endpoint"] == pytest.approx(sum(curve) / 3)
    assert json.loads((rd / "config.json").read_text())["policy"]["model"] == "tabular"


def test_tabular_compare_variants_3_adds_ma_alone_and_changes_no_other_run(tmp_path):
    """``--variants 3`` runs row+native, row+MA and OA+MA; the two it shares with ``--variants 2`` train the same."""
    base = ["compare", "configs/chain-tabular-grpo.yaml", "env.eval_tasks=8", "eval_every=1", "--seeds", "2",
            "--horizon", "2", "--metric", "sampled", "--no-dump"]
    assert oma_main([*base, "--variants", "3", "--out", str(tmp_path / "three")]) == 0
    assert oma_main([*base, "--variants", "2", "--out", str(tmp_path / "two")]) == 0
    three = json.loads((tmp_path / "three" / "results.json").read_text())
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert sorted(three["variants"]) == ["OA+MA", "row+MA", "row+native"]
    assert three["variants"]["row+MA"]["paired_seeds"] == [0, 1]
    cfg = json.loads((tmp_path / "three" / "row+MA" / "seed-1" / "config.json").read_text())["algo"]
    assert (cfg["accounting"], cfg["mass"]) == ("row", "uniform")
    ends = {(r["variant"], r["seed"]): r["endpoint"] for r in three["runs"]}
    for r in two["runs"]:
        assert ends[(r["variant"], r["seed"])] == r["endpoint"], (r["variant"], r["seed"])
    assert "row+MA" in (tmp_path / "three" / "report.md").read_text()


def test_coupling_map_smoke_and_bad_arguments(tmp_path, capsys):
    from oma.experiments.coupling_map import SETTING_NAMES

    out = tmp_path / "map"
    argv = ["coupling-map", "--seeds", "2", "--horizon", "2", "--settings", "advance,reset", "--out", str(out),
            "env.eval_tasks=8", "eval_every=1"]
    assert oma_main(argv) == 0
    readme = (out / "README.md").read_text()
    for section in ("## Command", "## Settings", "## The map", "## What each component does", "## Wall time"):
        assert section in readme, section
    m = json.loads((out / "map.json").read_text())
    assert set(m["settings"]) == {"advance", "reset"} and m["family_size"] <= 2 * 3 * 2
    # advance: every episode lasts `length` = 4 steps, so failures and successes have the same rows
    ratio = m["settings"]["advance"]["ratio"]
    assert ratio is None or ratio["mean"] == pytest.approx(1.0)
    assert (out / "coupling_map.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("advance", "reset"):
        assert (out / name / "report.md").is_file()
    assert len(SETTING_NAMES) == 8
    assert oma_main(["coupling-map", "--settings", "nope", "--out", str(out)]) == 2
    assert "unknown setting" in capsys.readouterr().err
    assert oma_main(["coupling-map", "--seeds", "1", "--out", str(out)]) == 2
    assert "--seeds must be >= 2" in capsys.readouterr().err


def test_equal_actions_make_the_advance_control_exactly_neutral(tmp_path):
    """Every episode of `advance` lasts `length` rows and, with equal actions, every row 4 tokens: trajectories carry
    equal native mass (MA changes nothing) and row statistics are trajectory statistics (OA changes nothing), so the
    four variants train the same table and the same success curves."""
    out = tmp_path / "cmp"
    argv = ["compare", "configs/chain-tabular-grpo.yaml", "env.options.on_wrong=advance", "env.options.length=4",
            "env.options.actions=2", "env.options.equal_actions=true", "env.eval_tasks=16", "eval_every=1",
            "--seeds", "1", "--horizon", "2", "--metric", "sampled", "--no-dump", "--out", str(out)]
    assert oma_main(argv) == 0
    curves = {r["variant"]: r["eval_success"] for r in json.loads((out / "results.json").read_text())["runs"]}
    assert len(curves) == 4 and len({tuple(c) for c in curves.values()}) == 1
    rows = {json.loads(ln)["rows_per_traj"] for ln in (out / "OA+MA" / "seed-0" / "metrics.jsonl").read_text()
            .splitlines()[1:]}
    assert rows == {4.0}  # every episode `length` rows
