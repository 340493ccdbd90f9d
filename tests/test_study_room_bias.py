"""studies/tools/room_bias.py: the stay-or-leave decision against a naive sum, the kernel by hand, the parts add up."""

from __future__ import annotations

import math
from types import SimpleNamespace

import benchmark_scripts
import pytest
import torch

from oma.agent.policy import action_choices, response_logprobs, tiny_model, train_tokenizer
from oma.agent.prompt import step_prompt
from oma.envs import make

OPTIONS = {"size": "small", "goals": ["place"], "distractors": "few", "notes": True, "hint": True}
CFG = SimpleNamespace(policy=SimpleNamespace(temperature=1.0))


def _module():
    return benchmark_scripts.load("room_bias")


@pytest.fixture(scope="module")
def first_state():
    env = make("household", **OPTIONS)
    obs, info = env.reset(3)
    prompt_text = step_prompt(info["task"], [], obs, info["admissible_actions"], 0)
    tok = train_tokenizer([prompt_text, *info["admissible_actions"]], 300)
    model = tiny_model(len(tok), hidden=16, layers=1, heads=2, max_positions=1024, seed=0)
    prompt = tok(prompt_text, add_special_tokens=False)["input_ids"]
    return model, tok, prompt, list(info["admissible_actions"])


def test_decision_is_the_log_odds_of_leaving_summed_over_actions(first_state) -> None:
    """f = log Σ_leave π − log Σ_stay π, with π(a) the product of a's constrained token probabilities, one action at a time."""
    m = _module()
    model, tok, prompt, admissible = first_state
    choices = action_choices(tok, admissible)
    from oma.agent.policy import allowed_positions

    p = []
    for c in choices:  # naive: each action alone, its token log-probs under the constraint of all admissible actions
        logp, mask, _ = response_logprobs(model, [prompt], [c], tok.pad_token_id, allowed=[allowed_positions(choices, c)])
        p.append(math.exp(float((logp * mask).sum().detach())))
    assert sum(p) == pytest.approx(1.0, abs=1e-5)  # the constrained policy is a distribution over admissible actions
    kinds = [m.action_kind(a) for a in admissible]
    leave = sum(q for q, k in zip(p, kinds) if k == "leaves")
    stay = sum(q for q, k in zip(p, kinds) if k == "stays")
    assert leave > 0 and stay > 0
    f = m.decision(CFG, model, tok, prompt, admissible)
    assert float(f.detach()) == pytest.approx(math.log(leave) - math.log(stay), abs=1e-5)
    assert f.requires_grad  # its gradient is J(s)
    with pytest.raises(ValueError, match="both a receptacle and a room"):
        m.decision(CFG, model, tok, prompt, [a for a, k in zip(admissible, kinds) if k != "leaves"])


def test_mean_cos_by_hand() -> None:
    m = _module()
    jac = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    a = torch.tensor([True, True, False])
    # within a: the pairs (0, 1) and (1, 0), cos 0; across a and ~a: cos(e1, (1,1)) = cos(e2, (1,1)) = 1/√2
    assert m.mean_cos(jac, a, a) == pytest.approx(0.0)
    assert m.mean_cos(jac, a, ~a) == pytest.approx(2 ** -0.5)
    everything = torch.ones(3, dtype=torch.bool)  # 6 ordered pairs: 0 twice, 1/√2 four times
    assert m.mean_cos(jac, everything, everything) == pytest.approx(4 * 2 ** -0.5 / 6)


def test_row_kinds_name_the_right_decision_and_the_taken_one() -> None:
    m = _module()
    log = [("go to kitchen", [], "go to drawer 1"), ("go to drawer 1", [], "go to drawer 1"),
           ("take mug 1 from drawer 1", [], "go to bedroom")]
    assert m.row_kinds(log) == ["right: leaves, did: stays", "right: stays, did: stays", "right: other, did: leaves"]


def test_expert_label_parts_add_up_to_the_whole() -> None:
    """oracle_gradient with a keep mask is that part of the whole: the parts of a partition add up to it."""
    ga = benchmark_scripts.load("gradient_alignment")
    texts = ["go to kitchen", "go to drawer 1", "open drawer 1", "Task: put a mug in a drawer"]
    tok = train_tokenizer(texts, 300)
    model = tiny_model(len(tok), hidden=16, layers=1, heads=2, max_positions=256, seed=1)
    params = [p for p in model.parameters() if p.requires_grad]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("Task: a", "Task: b", "Task: a")]
    log = [("go to kitchen", ["go to kitchen", "go to drawer 1"], "go to drawer 1"),
           ("open drawer 1", ["open drawer 1", "go to kitchen"], "open drawer 1"),
           ("go to drawer 1", ["go to kitchen", "go to drawer 1"], "go to kitchen")]
    ro = SimpleNamespace(rows=SimpleNamespace(prompt_ids=prompts))
    whole = ga.oracle_gradient(CFG, model, tok, ro, log, params)
    keep = torch.tensor([True, False, True])
    parts = ga.oracle_gradient(CFG, model, tok, ro, log, params, keep) + ga.oracle_gradient(CFG, model, tok, ro, log, params, ~keep)
    assert float(whole.norm()) > 0
    assert torch.allclose(parts, whole, atol=1e-6)
    assert float(ga.oracle_gradient(CFG, model, tok, ro, log, params, torch.zeros(3, dtype=torch.bool)).norm()) == 0.0


def test_credit_table_sums_the_parts_per_batch() -> None:
    m = _module()
    part = lambda b, c: {"bias": b, "comparison": c}  # noqa: E731  two batches each
    table = {"the job's update": part([0.0, 0.0], [0.0, 0.0]),
             "right: leaves, did: leaves, A > 0": part([1.0, 3.0], [-1.0, -1.0]),
             "right: leaves, did: stays, A < 0": part([1.0, 1.0], [0.0, -2.0]),
             "right: leaves, did: leaves, A < 0": part([-2.0, -2.0], [1.0, 1.0])}  # the other parts absent: 0
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in m.credit_table(table).splitlines()[2:]}
    # per batch: (1 + 1, 3 + 1) = (2, 4), mean 3; comparison (-1, -3), mean -2; CI over 2 batches: t(1) = 12.706 × 1/√2·√2
    assert rows["right action pushed up or wrong one down, toward leaving"][0].startswith("+3.00 ± 12.71")
    assert rows["right action pushed up or wrong one down, toward leaving"][1].startswith("-2.00 ± 12.71")
    assert rows["right action pushed down or wrong one up, toward staying"][0].startswith("-2.00 ± 0.00")
    assert rows["all mis-credited (the last two)"][0].startswith("-2.00")
    assert rows["all rightly credited (the first two)"][0].startswith("+3.00")


def test_trajectory_table_by_hand() -> None:
    m = _module()
    points = [{"run": "a", "seed": 0, "iteration": 0, "here": -1.0, "elsewhere": 1.0},
              {"run": "a", "seed": 0, "iteration": 15, "here": -2.0, "elsewhere": 0.0},  # bias -1, comparison 0
              {"run": "b", "seed": 1, "iteration": 0, "here": 0.0, "elsewhere": 0.0},
              {"run": "b", "seed": 1, "iteration": 15, "here": -1.0, "elsewhere": 1.0}]  # bias 0, comparison +2
    text = m.trajectory_table(points)
    assert "| 0 | 15 | -2.00 | +0.00 | -1.00 | +2.00 |" in text
    # over the 2 seeds: bias (-1, 0) mean -0.5, comparison (0, 2) mean +1; half-widths 12.706 × sd/√2
    assert "bias -0.50 ± 6.35, comparison +1.00 ± 12.71." in text


def test_trajectory_rejects_a_group_without_runs(tmp_path, capsys) -> None:
    (tmp_path / "group" / "seed-0").mkdir(parents=True)
    code = _module().main(["--trajectory", str(tmp_path / "group"), "threads=1"])
    assert code == 2
    assert "--trajectory threads=1: expected a folder holding seed-K run folders" in capsys.readouterr().err


def test_the_probes_start_from_the_job_they_were_measured_on() -> None:
    """first_step_credit, room_bias and gradient_alignment default to the default job of 2026-12-04
    (ALFWorld's sentences, which the first-step cases are read from); today's terse default is refused
    with the key to change, not misread."""
    from oma.train.config import load_config

    m = benchmark_scripts.load("first_step_credit")
    cfg = load_config(m.MEASURED_JOB)
    assert cfg.env.options == OPTIONS and (cfg.iterations, cfg.env.train_max_steps) == (15, None)
    obs, info = make("household", **cfg.env.options).reset(1_000_000)
    assert m.first_step_case(info["task"], obs) in ("goal here", "goal elsewhere")
    obs, info = make("household", **load_config(None).env.options).reset(1_000_000)
    with pytest.raises(ValueError, match="env.options.text alfworld"):
        m.first_step_case(info["task"], obs)
