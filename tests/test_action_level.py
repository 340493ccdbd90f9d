"""The action-level policy (``policy.normalise=action``, GLAM): scores, distribution, sampling, SFT, the loop."""

import json
import math

import pytest
import torch

import oma.envs
from oma.agent.imitation import demonstrations, sft
from oma.agent.policy import (
    action_distribution,
    action_choices,
    action_response_logprobs,
    action_scores,
    choices_of,
    choices_tensor,
    generate_actions,
    tiny_model,
    train_tokenizer,
)
from oma.agent.prompt import step_prompt
from oma.cli import main as oma_main
from oma.train.config import ConfigError, load_config
from oma.train.warmstart import cache_key

from test_train import TINY


@pytest.fixture(scope="module")
def policy():
    env = oma.envs.make("household", **{"size": "small", "goals": ["place"], "notes": True, "hint": True})
    texts, states = [], []
    for seed in range(4):
        obs, info = env.reset(seed)
        prompt = step_prompt(info["task"], [], obs, info["admissible_actions"], 0, False)
        texts += [prompt, *info["admissible_actions"]]
        states.append((prompt, info["admissible_actions"]))
    tok = train_tokenizer(texts, 300)
    model = tiny_model(len(tok), hidden=32, layers=2, heads=2, max_positions=512, seed=0).eval()
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p, _ in states]
    choices = [action_choices(tok, a) for _, a in states]
    return model, tok, prompts, choices


def _loop_scores(model, prompt, choices):
    """Σ_t log p(a_t | prompt, a_<t) of each action, one full forward pass per (prompt, action)."""
    out = []
    for c in choices:
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + c])).logits[0].float(), -1)
        out.append(sum(logp[len(prompt) - 1 + t, c[t]] for t in range(len(c))))
    return torch.stack(out)


def testaction_distribution_by_hand():
    # scores log(1/2), log(1/4), log(1/4) up to a constant: π = (1/2, 1/4, 1/4), H = 1.5 ln 2; a padded slot gets 0
    scores = torch.tensor([[math.log(2.0) - 7, -7.0, -7.0, 5.0]])
    valid = torch.tensor([[True, True, True, False]])
    logp, entropy = action_distribution(scores, valid, 1.0)
    torch.testing.assert_close(logp[0, :3].exp(), torch.tensor([0.5, 0.25, 0.25]))
    assert float(logp[0, 3].exp()) == 0.0
    assert float(entropy[0]) == pytest.approx(1.5 * math.log(2.0), rel=1e-6)
    # T = 2 halves the scores: π ∝ (√2, 1, 1)
    logp, _ = action_distribution(scores, valid, 2.0)
    z = math.sqrt(2.0) + 2.0
    torch.testing.assert_close(logp[0, :3].exp(), torch.tensor([math.sqrt(2.0) / z, 1 / z, 1 / z]))


def test_choices_tensor_round_trips_ragged_actions():
    choices = [[4, 5, 2], [7, 2], [9, 9, 9, 2]]
    encoded = choices_tensor(choices)
    assert encoded.tolist() == [[4, 5, 2, -1], [7, 2, -1, -1], [9, 9, 9, 2]]
    assert choices_of(encoded) == choices


def test_action_scores_equal_one_forward_pass_per_action(policy):
    model, _, prompts, choices = policy
    with torch.no_grad():
        scores, valid = action_scores(model, prompts, choices, 0)
        for r, (p, ch) in enumerate(zip(prompts, choices)):
            assert int(valid[r].sum()) == len(ch) and not valid[r, len(ch):].any()
            torch.testing.assert_close(scores[r, : len(ch)], _loop_scores(model, p, ch), rtol=1e-5, atol=1e-4)


def test_action_scores_are_invariant_to_row_order_batching_and_duplicates(policy):
    model, _, prompts, choices = policy
    with torch.no_grad():
        together, _ = action_scores(model, prompts, choices, 0)
        order = [2, 0, 3, 1, 2]  # a duplicated prompt shares its prefill
        shuffled, _ = action_scores(model, [prompts[i] for i in order], [choices[i] for i in order], 0)
        for slot, i in enumerate(order):
            k = len(choices[i])
            alone, _ = action_scores(model, [prompts[i]], [choices[i]], 0)
            torch.testing.assert_close(shuffled[slot, :k], together[i, :k], rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(alone[0, :k], together[i, :k], rtol=1e-5, atol=1e-4)


def test_action_logprobs_and_their_gradient_match_the_loop(policy):
    model, _, prompts, choices = policy
    chosen = [1, 0, 2, 1]
    responses = [ch[k] for ch, k in zip(choices, chosen)]
    allowed = [choices_tensor(ch) for ch in choices]
    model.zero_grad()
    logp, mask, entropy = action_response_logprobs(model, prompts, responses, allowed, 0, with_entropy=True, temperature=2.0)
    # every token of a row holds its action's log-prob; the row's mask is its response
    for r, resp in enumerate(responses):
        assert mask[r].tolist() == [t < len(resp) for t in range(mask.shape[1])]
        assert torch.all(logp[r, : len(resp)] == logp[r, 0]) and torch.all(logp[r, len(resp):] == 0)
    logp[:, 0].sum().backward()
    fast = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0.0
    for r, (p, ch) in enumerate(zip(prompts, choices)):
        pi = torch.log_softmax(_loop_scores(model, p, ch) / 2.0, -1)
        torch.testing.assert_close(logp[r, 0], pi[chosen[r]].detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[r, 0], -(pi.exp() * pi).sum().detach(), rtol=1e-5, atol=1e-5)
        total = total + pi[chosen[r]]
    total.backward()
    for a, b in zip(fast, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_response_outside_its_allowed_actions_is_an_error(policy):
    model, _, prompts, choices = policy
    with pytest.raises(ValueError, match="row 0: its response is not one of its allowed actions"):
        action_response_logprobs(model, prompts[:1], [[1, 1, 1]], [choices_tensor(choices[0])], 0)


def test_generation_records_the_log_probs_training_scores_and_samples_pi(policy):
    model, tok, prompts, choices = policy
    for temperature in (1.0, 0.0, 2.0):
        gen = generate_actions(model, tok, prompts, temperature=temperature, generator=torch.Generator().manual_seed(1),
                               choices=choices)
        logp, mask, entropy = action_response_logprobs(model, prompts, gen.response_ids, gen.allowed, tok.pad_token_id,
                                                       with_entropy=True, temperature=temperature or 1.0)
        for r, ids in enumerate(gen.response_ids):
            assert ids in choices[r] and len(gen.logp[r]) == len(ids) == int(mask[r].sum())
            torch.testing.assert_close(torch.tensor(gen.logp[r]), logp[r, : len(ids)].detach(), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(torch.tensor(gen.entropy[r]), entropy[r, : len(ids)].detach(), rtol=1e-4, atol=1e-5)
        if temperature == 0.0:  # greedy: the best-scored action
            with torch.no_grad():
                scores, valid = action_scores(model, prompts, choices, tok.pad_token_id)
            assert [choices[r].index(ids) for r, ids in enumerate(gen.response_ids)] == scores.argmax(-1).tolist()
    # sampled at T = 1, each action's frequency is its probability
    n = 600
    gen = generate_actions(model, tok, [prompts[0]] * n, temperature=1.0, generator=torch.Generator().manual_seed(0),
                           choices=[choices[0]] * n)
    with torch.no_grad():
        scores, valid = action_scores(model, prompts[:1], choices[:1], tok.pad_token_id)
    pi = action_distribution(scores, valid, 1.0)[0][0].exp()
    freq = torch.tensor([sum(r == c for r in gen.response_ids) / n for c in choices[0]])
    assert float(pi.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float((freq - pi).abs().max()) < 0.07


def test_action_level_sft_learns_the_demonstrations():
    make_env = lambda: oma.envs.make("household", size="small", goals=["place"], notes=True, hint=True)  # noqa: E731
    demos = demonstrations(make_env, 4, 0.3, 0, False)
    tok = train_tokenizer((t for d in demos for t in (d.prompt, d.action)), 300)
    model = tiny_model(len(tok), hidden=32, layers=1, heads=2, max_positions=512, seed=0)
    losses = sft(model, tok, demos, epochs=20, lr=3e-3, batch_rows=8, max_prompt_tokens=320, seed=0, constrained=True,
                 action_level=True)
    # −log π(a* | s) over the admissible actions, token-weighted; untrained, each token costs about log V,
    # so a long expert action among short ones starts far below uniform, and the loss falls from there
    assert losses[0] > math.log(2.0)
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]


def test_the_option_is_checked_and_keys_the_warm_start():
    with pytest.raises(ConfigError, match=r"policy.normalise='sequence' is not valid; expected one of \['token', 'action'\]"):
        load_config(None, ["policy.normalise=sequence"])
    with pytest.raises(ConfigError, match="policy.normalise=action needs policy.constrained=true"):
        load_config(None, ["policy.normalise=action", "policy.constrained=false"])
    with pytest.raises(ConfigError, match="policy.normalise"):
        load_config(None, ["policy.model=tabular", "env.name=chain", "policy.normalise=action"])
    assert cache_key(load_config(None, ["policy.normalise=action"])) != cache_key(load_config(None, []))


def test_the_loop_trains_the_action_level_policy_it_samples(tmp_path):
    """One mini-batch, one epoch: the first forward pass gives back the recorded logp_old (ratio 1)."""
    out = tmp_path / "run"
    rc = oma_main(["train", *TINY, "policy.normalise=action", "env.name=household", "optim.num_minibatches=1",
                   "iterations=1", "algo.entropy_coef=0.01", f"out_dir={out}", f"warm_start.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    record = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1]
    assert record["rows"] > 0 and record["invalid_rate"] == 0.0
    assert record["clipfrac"] == 0.0
    assert abs(record["approx_kl_k1"]) < 1e-5 and record["approx_kl_k3"] < 1e-8


def test_the_loop_loss_is_exact_under_any_micro_batching_and_equals_oma_core(policy):
    """Action-level rows through the loop's micro-batched loss: the same loss and gradient with 1 row or
    all rows per micro-batch, and as one piece from oma.core (ratio ≠ 1: logp_old shifted)."""
    from oma.agent.rollout import rollout
    from oma.core import outcome_advantages, token_objective, token_weights, weighted_loss
    from oma.train.loop import Batch, batch_logprobs, minibatch_loss, response_mask_of

    model, tok, _, _ = policy
    make_env = lambda: oma.envs.make("household", size="small", goals=["place"], notes=True, hint=True, max_steps=3)  # noqa: E731
    ro = rollout(make_env, model, tok, [11, 12], group_size=2, history_length=0, max_prompt_tokens=320, max_new_tokens=16,
                 temperature=1.0, invalid_penalty=0.1, generator=torch.Generator().manual_seed(0), constrained=True,
                 action_level=True, show_actions=False)
    rows = ro.rows
    assert rows.kind == "action" and len(rows) == 12  # 4 episodes × 3 steps: a place goal takes at least 4 (go, take, go, put)
    mask = response_mask_of(rows)
    # scores made up so that the groups have spread: trajectory t scores t
    scores = rows.traj_index.float()
    adv = outcome_advantages(scores, rows.group_index, rows.traj_index)
    logp_old = batch_logprobs(model, rows, tok.pad_token_id, 4, mask.shape[1], 1.0) - 0.05
    batch = Batch(rows, mask, adv, logp_old, None)
    results = []
    for micro in (1, 64):
        cfg = load_config(None, ["policy.normalise=action", "algo.mass=uniform", f"optim.micro_batch_rows={micro}"])
        model.zero_grad()
        stats = minibatch_loss(model, batch, torch.arange(len(rows)), cfg, tok.pad_token_id, backward=True)
        results.append((stats["loss"], [p.grad.clone() for p in model.parameters()]))
    model.zero_grad()
    logp, m, _ = action_response_logprobs(model, rows.prompt_ids, rows.response_ids, rows.allowed, tok.pad_token_id)
    assert torch.equal(m, mask)
    w = token_weights(mask, rows.group_index, rows.traj_index, reducer="token-mean", mass="uniform")
    loss = weighted_loss(token_objective(logp, logp_old, adv, mask), w)
    loss.backward()
    for value, grads in results:
        assert value == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-7)
        for g, p in zip(grads, model.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)
