"""studies/tools/gradient_alignment.py: expert labels line up with rows, gradients by hand and against a naive loop."""

from __future__ import annotations

import benchmark_scripts
import pytest
import torch

from oma.envs import make

OPTIONS = {"size": "small", "goals": ["place"], "distractors": "few", "notes": True, "hint": True}


def _module():
    return benchmark_scripts.load("gradient_alignment")


def test_expert_tap_labels_each_step_with_the_state_it_acted_in() -> None:
    m = _module()
    log: list = []
    env = m.ExpertTap(make("household", **OPTIONS), log)
    obs, info = env.reset(7)
    plain = make("household", **OPTIONS)
    _, plain_info = plain.reset(7)
    actions = [info["admissible_actions"][0], None, None]  # one non-expert step, then the expert's
    for k, a in enumerate(actions):
        expert, admissible = plain.expert_action(), list(plain_info["admissible_actions"])
        taken = a if a is not None else expert
        env.step(taken)
        plain_info = plain.step(taken)[4]
        assert log[k] == (expert, admissible, taken)
    assert len(log) == 3
    assert env.anchor() == plain.anchor()  # everything else is the wrapped environment's


def test_coefficient_gradient_by_hand() -> None:
    m = _module()
    theta = torch.tensor([2.0, -1.0], requires_grad=True)
    x = torch.tensor([[1.0, 0.0], [3.0, 4.0]])  # two distinct rows, two tokens each
    logp = theta * x  # d logp[u, t] / d theta_t = x[u, t]
    inverse = torch.tensor([0, 1, 0])  # rows 0 and 2 are copies of distinct row 0
    coef = torch.tensor([[1.0, 1.0], [0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    g = m.coefficient_gradient(logp, inverse, coef, [theta])
    # distinct row 0 collects (1 + 2, 1 + 0) = (3, 1); row 1 keeps (0.5, -1)
    # gradient of -sum c * theta * x: -(3*1 + 0.5*3, 1*0 + (-1)*4) = (-4.5, 4)
    assert g.tolist() == pytest.approx([-4.5, 4.0])


def test_distinct_rows_give_the_gradient_of_every_row() -> None:
    """Each distinct row once, coefficients summed, equals the gradient over all rows one by one."""
    m = _module()
    from types import SimpleNamespace

    from oma.agent.policy import response_logprobs, tiny_model
    from oma.agent.rollout import Rows

    torch.manual_seed(0)
    model = tiny_model(32, hidden=16, layers=1, heads=2, max_positions=64, seed=0)
    params = [p for p in model.parameters() if p.requires_grad]
    prompts = [[3, 4, 5], [6, 7], [3, 4, 5], [8, 9, 10, 11]]
    responses = [[12, 13], [14], [12, 13], [15, 16]]
    allowed = [torch.tensor([[0, 12], [0, 20], [1, 13], [1, 21]]), torch.tensor([[0, 14], [0, 22]]),
               torch.tensor([[0, 12], [0, 20], [1, 13], [1, 21]]), torch.tensor([[0, 15], [1, 16], [1, 17]])]
    coef = torch.tensor([[0.5, -0.2], [1.0, 0.0], [0.25, 0.3], [-0.7, 0.4]], dtype=torch.float64)
    cfg = SimpleNamespace(policy=SimpleNamespace(temperature=1.0))
    rows = Rows(prompt_ids=prompts, response_ids=responses, allowed=allowed)
    logp_u, inverse = m.distinct_logprobs(cfg, model, rows, 0)
    assert logp_u.shape[0] == 3 and set(inverse.tolist()) == {0, 1, 2} and inverse[0] == inverse[2]  # rows 0, 2: one
    fast = m.coefficient_gradient(logp_u, inverse, coef, params)
    naive = torch.zeros_like(fast)
    for r in range(4):  # one row at a time, no deduplication
        logp, mask, _ = response_logprobs(model, [prompts[r]], [responses[r]], 0, allowed=[allowed[r]])
        loss = -(coef[r, : logp.shape[1]].to(logp.dtype) * logp * mask).sum()
        naive += torch.cat([g.flatten() for g in torch.autograd.grad(loss, params, allow_unused=False)])
    assert torch.allclose(fast, naive, atol=1e-6)
    assert float(fast.norm()) > 0


def test_variants_split_gigpo_into_its_episode_and_step_terms() -> None:
    """GiGPO = episode term + step term, under both accountings; with ω = 0 the step term is 0."""
    m = _module()
    from types import SimpleNamespace

    from oma.core import outcome_advantages

    # one group: trajectory 0 wins at its 2nd step, trajectory 1 fails in 3; both start in state 5
    rows = SimpleNamespace(group_index=torch.tensor([0, 0, 0, 0, 0]), traj_index=torch.tensor([0, 0, 1, 1, 1]),
                           step_index=torch.tensor([0, 1, 0, 1, 2]), anchor=torch.tensor([5, 6, 5, 7, 8]),
                           step_rewards=torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0]))
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0])
    for w in (1.0, 0.0):
        cfg = SimpleNamespace(algo=SimpleNamespace(norm_by_std=True, gamma=0.95, step_advantage_w=w))
        out = {name: (adv, mass) for name, adv, mass in m.variant_advantages(cfg, rows, scores)}
        assert out["gigpo OA+MA"][1] == "uniform" and out["gigpo row+native"][1] == "native"
        for tag, accounting in (("OA+MA", "trajectory"), ("row+native", "row")):
            episode = outcome_advantages(scores, rows.group_index, rows.traj_index, accounting=accounting)
            assert torch.allclose(out[f"episode term (grpo) {tag}"][0], episode)
            assert torch.allclose(out[f"step term {tag}"][0] + episode, out[f"gigpo {tag}"][0])
            step = out[f"step term {tag}"][0]
            if w == 0.0:
                assert torch.equal(step, torch.zeros(5))
            else:  # state 5 is shared: returns 0.95 and 0, mean 0.475, unbiased std 0.475·√2 → A^S = ±1/√2
                assert step[0].item() == pytest.approx(2 ** -0.5, abs=1e-5)
                assert step[2].item() == pytest.approx(-(2 ** -0.5), abs=1e-5)
                assert torch.equal(step[[1, 3, 4]], torch.zeros(3))  # states seen once: no step comparison
