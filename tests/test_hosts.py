"""oma.hosts, the host contract: by hand, against plain loops written without oma.core, and by invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oma import hosts
from oma.diagnostics import audit, read_batch

# 2 tasks: task 0's episode 0 wins in 2 steps, episode 1 fails in 4; task 1's wins in 1, fails in 2
GROUP = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1])
TRAJ = torch.tensor([0, 0, 1, 1, 1, 1, 2, 3, 3])
STEP = torch.tensor([0, 1, 0, 1, 2, 3, 0, 0, 1])
SCORE = torch.tensor([1.0, 1, 0, 0, 0, 0, 1, 0, 0])


def _step(**kw) -> hosts.HostStep:
    base = dict(group_index=GROUP, traj_index=TRAJ, scores=SCORE, response_mask=torch.ones(9, 5, dtype=torch.bool),
                step_index=STEP)
    return hosts.HostStep(**{**base, **kw})


def test_by_hand_oa_ma_over_two_minibatches():
    r = hosts.align(_step(minibatches=[torch.arange(5), torch.arange(5, 9)]), hosts.HostOptions())
    # one success and one failure per group: ±1/√2 (sample std √2/2; ε = 1e-6 aside)
    assert r.adv.tolist() == pytest.approx([s * 2**-0.5 for s in (1, 1, -1, -1, -1, -1, 1, -1, -1)], abs=1e-5)
    # uniform mass: each of the 4 trajectories carries k/T = 2/4 of the step, spread over its tokens
    per_traj = torch.zeros(4, dtype=torch.float64).index_add_(0, TRAJ, r.weights.sum(-1))
    assert per_traj.tolist() == pytest.approx([0.5] * 4)
    assert r.metrics == pytest.approx({
        "oma/optimizer_steps": 2, "oma/padding_copies": 0, "oma/trajectories": 4, "oma/groups": 2,
        "oma/rows_per_trajectory/mean": 9 / 4, "oma/rows_per_trajectory/max": 4, "oma/zero_spread_groups": 0,
        "oma/effective_trajectories": 4, "oma/failure_mass_share": 0.5,
        "oma/expansion_ratio": ((4 + 2) / 2) / ((2 + 1) / 2)})


def test_by_hand_the_stepwise_baseline():
    o = hosts.HostOptions(accounting="row", mass="native")
    assert not o.aligned and o.prefix == "oma"
    r = hosts.align(_step(minibatches=[torch.arange(5), torch.arange(5, 9)]), o)
    # task 0 over rows: 2 ones, 4 zeros: μ = 1/3, σ (n − 1) = √(4/15)
    sigma = math.sqrt((2 * (2 / 3) ** 2 + 4 * (1 / 3) ** 2) / 5)
    assert r.adv[0].item() == pytest.approx((2 / 3) / (sigma + 1e-6), rel=1e-5)
    # token-mean per mini-batch: every token of the 5 rows of the first carries 1/25
    assert r.weights[:5].unique().tolist() == pytest.approx([1 / 25])
    # failures: rows 2-4 (15 of the first mini-batch's 25 tokens) and 5, 7, 8 (15 of the second's 20), of a mass of 2
    assert r.metrics["oma/failure_mass_share"] == pytest.approx((15 / 25 + 15 / 20) / 2)


def test_the_final_row_rule_stamps_each_trajectorys_last_score():
    scores = torch.tensor([0.0, 1, 5, 0, 0, 2, 3, 0, 7])
    out = hosts.outcome_scores(_step(scores=scores), hosts.HostOptions(outcome="final"))
    assert out.tolist() == [1, 1, 2, 2, 2, 2, 3, 7, 7]
    with pytest.raises(ValueError, match="oma.outcome=final needs each row's step_index"):
        hosts.outcome_scores(_step(step_index=None), hosts.HostOptions(outcome="final"))


def _loops(group, traj, scores, accounting, estimator, eps=1e-6):
    """Advantages by plain loops over Python lists (no oma.core): the equations of docs/math.md."""
    rows = range(len(group))
    out = []
    for r in rows:
        members = [q for q in rows if group[q] == group[r]]
        if accounting == "trajectory":
            trajs = sorted({traj[q] for q in members})
            values = {t: np.mean([scores[q] for q in members if traj[q] == t]) for t in trajs}
            own, pool = values[traj[r]], list(values.values())
        else:
            own, pool = scores[r], [scores[q] for q in members]
        if len(pool) < 2:
            out.append(0.0)
        elif estimator == "rloo":
            out.append(len(pool) / (len(pool) - 1) * (own - np.mean(pool)))
        else:
            out.append((own - np.mean(pool)) / (np.std(pool, ddof=1) + eps))
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["row", "trajectory"]), st.sampled_from(["grpo", "rloo"]))
def test_advantages_equal_plain_loops(seed, accounting, estimator):
    rng = np.random.default_rng(seed)
    group, traj, scores = [], [], []
    for g in range(3):
        for e in range(int(rng.integers(1, 4))):
            t = len(set(traj))
            outcome = float(rng.integers(0, 3))
            for _ in range(int(rng.integers(1, 5))):
                group.append(g), traj.append(t), scores.append(outcome)
    step = hosts.HostStep(group_index=torch.tensor(group), traj_index=torch.tensor(traj),
                          scores=torch.tensor(scores), response_mask=torch.ones(len(group), 3, dtype=torch.bool))
    adv = hosts.advantages(step, hosts.HostOptions(accounting=accounting, estimator=estimator))
    assert adv.tolist() == pytest.approx(_loops(group, traj, scores, accounting, estimator), abs=1e-5)


def _random_step(seed: int) -> hosts.HostStep:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (10,), generator=g)
    traj = torch.repeat_interleave(torch.arange(10), lengths)
    group = traj // 3
    rows = traj.shape[0]
    mask = torch.arange(7).unsqueeze(0) < torch.randint(1, 8, (rows, 1), generator=g)
    scores = (torch.rand(10, generator=g) > 0.5).double().index_select(0, traj)
    return hosts.HostStep(group_index=group, traj_index=traj, scores=scores, response_mask=mask)


@pytest.mark.parametrize("mass", ["uniform", "group"])
@pytest.mark.parametrize("seed", range(5))
def test_ma_gives_each_trajectory_its_share_whatever_the_minibatches(seed, mass):
    step = _random_step(seed)
    o = hosts.HostOptions(mass=mass)
    whole = hosts.weights(step, o)
    cut = torch.randperm(step.rows, generator=torch.Generator().manual_seed(seed)).tensor_split(3)
    split = hosts.weights(hosts.HostStep(**{**vars(step), "minibatches": list(cut)}), o)
    per = lambda w: torch.zeros(10, dtype=torch.float64).index_add_(0, step.traj_index, w.sum(-1))  # noqa: E731
    assert torch.allclose(per(split), 3 * per(whole))  # the same shares, k times the scale
    expected = torch.full((10,), 1 / 10) if mass == "uniform" else 1 / (4 * torch.tensor([3, 3, 3, 3, 3, 3, 3, 3, 3, 1][:10]))
    if mass == "group":  # 4 groups (trajectories 0-2, 3-5, 6-8, 9): each 1/4, split among its trajectories
        expected = torch.tensor([1 / 12] * 9 + [1 / 4])
    assert per(whole).tolist() == pytest.approx(expected.tolist())


def test_padding_copies_get_no_mass_and_leave_the_others_as_they_were():
    step = _random_step(0)
    copied = torch.tensor([0, 3, 3])  # verl-agent's adjust_batch appends copies of chosen rows
    padded = hosts.HostStep(group_index=torch.cat([step.group_index, step.group_index[copied]]),
                            traj_index=torch.cat([step.traj_index, step.traj_index[copied]]),
                            scores=torch.cat([step.scores, step.scores[copied]]),
                            response_mask=torch.cat([step.response_mask, step.response_mask[copied]]),
                            copies=torch.cat([torch.zeros(step.rows, dtype=torch.bool), torch.ones(3, dtype=torch.bool)]))
    o = hosts.HostOptions()
    w = hosts.weights(padded, o)
    assert torch.equal(w[: step.rows], hosts.weights(step, o)) and not w[step.rows:].any()
    m, m0 = hosts.metrics(padded, o, w), hosts.metrics(step, o, hosts.weights(step, o))
    assert m.pop("oma/padding_copies") == 3 and m0.pop("oma/padding_copies") == 0
    assert m == m0
    native = hosts.weights(padded, hosts.HostOptions(mass="native"))
    assert native[step.rows:].any()  # native mass is the host's own: its copies count, as the host counts them


def test_row_order_does_not_matter():
    step = _random_step(3)
    perm = torch.randperm(step.rows, generator=torch.Generator().manual_seed(1))
    shuffled = hosts.HostStep(group_index=step.group_index[perm], traj_index=step.traj_index[perm],
                              scores=step.scores[perm], response_mask=step.response_mask[perm])
    for o in (hosts.HostOptions(), hosts.HostOptions(accounting="row", mass="group", reducer="seq-mean-token-mean")):
        a, b = hosts.align(step, o), hosts.align(shuffled, o)
        assert torch.allclose(a.adv[perm], b.adv) and torch.allclose(a.weights[perm], b.weights)
        assert a.metrics == pytest.approx(b.metrics)


def test_a_metric_undefined_on_the_step_is_left_out_never_nan():
    step = _step(scores=torch.zeros(9))  # no success: no expansion ratio; every group has zero spread
    m = hosts.metrics(step, hosts.HostOptions(), hosts.weights(step, hosts.HostOptions()))
    assert "oma/expansion_ratio" not in m and m["oma/zero_spread_groups"] == 1.0
    assert all(math.isfinite(v) for v in m.values())
    empty = _step(response_mask=torch.zeros(9, 5, dtype=torch.bool))
    assert hosts.metrics(empty, hosts.HostOptions(), hosts.weights(empty, hosts.HostOptions())) == {
        "oma/optimizer_steps": 1.0, "oma/padding_copies": 0.0}


@pytest.mark.parametrize(("given", "message"), [
    ({"mass": "unifrom"}, "algorithm.oma.mass must be one of ['native', 'uniform', 'group'], got 'unifrom'"),
    ({"masss": "uniform"}, "algorithm.oma.masss is not an option; known: ["),
    ({"gamma": 1.5}, "algorithm.oma.gamma must be a finite number in [0, 1], got 1.5"),
    ({"eps": "x"}, "algorithm.oma.eps must be a number, got 'x'"),
    ({"eps": float("nan")}, "algorithm.oma.eps must be a finite number >= 0, got nan"),
    ({"loss_scale_factor": 0}, "algorithm.oma.loss_scale_factor must be a finite number > 0 or null, got 0"),
    ({"estimator": "ppo"}, "algorithm.oma.estimator must be one of ['grpo', 'rloo', 'gigpo'], got 'ppo'"),
    ({"norm_by_std": "yes"}, "algorithm.oma.norm_by_std must be true or false, got 'yes'"),
])
def test_a_bad_option_is_one_line_naming_the_key(given, message):
    with pytest.raises(hosts.HostConfigError) as e:
        hosts.HostOptions.from_mapping(given, prefix="algorithm.oma")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_defaults_fill_what_the_node_leaves_unset():
    o = hosts.HostOptions.from_mapping({"mass": None, "gamma": "0.9"}, prefix="x", norm_by_std=False)
    assert (o.mass, o.gamma, o.norm_by_std, o.prefix) == ("uniform", 0.9, False, "x")


def test_a_bad_step_is_refused_by_field():
    with pytest.raises(ValueError, match=r"scores must be \[R\] with R = 9 rows, got \(8,\)"):
        _step(scores=torch.zeros(8))
    with pytest.raises(ValueError, match="minibatches must serve every row of the step exactly once"):
        _step(minibatches=[torch.arange(5), torch.arange(4, 9)])
    with pytest.raises(ValueError, match="oma.estimator=gigpo needs each row's anchor, step_rewards"):
        hosts.advantages(_step(), hosts.HostOptions(estimator="gigpo"))


def test_the_dump_is_what_oma_audit_reads(tmp_path):
    o = hosts.HostOptions(dump_dir=str(tmp_path))
    with pytest.raises(ValueError, match="oma.dump_dir is set: align\\(\\) needs the step's iteration"):
        hosts.align(_step(), o)
    hosts.align(_step(), o, iteration=7)
    b = read_batch(tmp_path / "batches" / "iter_000007.parquet")
    report = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, step_index=b.step_index)
    assert (report.trajectories, report.groups) == (4, 2)
    assert report.expansion_ratio_fail_over_success == pytest.approx(2.0)


def test_won_decides_success_where_the_host_knows_it(tmp_path):
    # trajectory 1 scores 0.5 (> 0, a success by the outcome rule) but lost; trajectory 3 scores 0 but won
    scores = torch.tensor([1.0, 1, 0.5, 0.5, 0.5, 0.5, 1, 0, 0])
    won = torch.tensor([True, True, False, False, False, False, True, True, True])
    o = hosts.HostOptions(dump_dir=str(tmp_path))
    by_outcome = hosts.align(_step(scores=scores), o, iteration=1).metrics
    by_won = hosts.align(_step(scores=scores, won=won), o, iteration=2).metrics
    assert by_outcome["oma/failure_mass_share"] == pytest.approx(0.25)  # trajectory 3 alone fails
    assert by_won["oma/failure_mass_share"] == pytest.approx(0.25)  # trajectory 1 alone fails
    assert by_outcome["oma/expansion_ratio"] == pytest.approx(2 / ((2 + 4 + 1) / 3))
    assert by_won["oma/expansion_ratio"] == pytest.approx(4 / ((2 + 1 + 2) / 3))
    b = read_batch(tmp_path / "batches" / "iter_000002.parquet")
    assert b.won.tolist() == won.tolist() and read_batch(tmp_path / "batches" / "iter_000001.parquet").won is None


def test_select_keeps_every_row_field_and_drops_the_layout():
    step = _step(won=torch.zeros(9, dtype=torch.bool), copies=torch.zeros(9, dtype=torch.bool),
                 minibatches=[torch.arange(5), torch.arange(5, 9)])
    idx = torch.tensor([8, 2, 3])
    sub = step.select(idx)
    assert sub.rows == 3 and sub.minibatches is None and sub.anchor is None
    for name in ("group_index", "traj_index", "scores", "step_index", "won", "copies"):
        assert torch.equal(getattr(sub, name), getattr(step, name)[idx])
    assert torch.equal(sub.response_mask, step.response_mask[idx])


def test_keys_a_host_sets_itself_are_refused_saying_what_to_use():
    refused = {"estimator": "is set by x.adv_estimator: set that instead", "audit_dir": "was renamed x.oma.dump_dir"}
    with pytest.raises(hosts.HostConfigError, match=r"^x\.oma\.estimator is set by x\.adv_estimator: set that instead$"):
        hosts.HostOptions.from_mapping({"estimator": "rloo"}, prefix="x.oma", refused=refused)
    with pytest.raises(hosts.HostConfigError, match=r"^x\.oma\.audit_dir was renamed x\.oma\.dump_dir$"):
        hosts.HostOptions.from_mapping({"audit_dir": "/tmp"}, prefix="x.oma", refused=refused)
    with pytest.raises(hosts.HostConfigError) as e:
        hosts.HostOptions.from_mapping({"masss": "group"}, prefix="x.oma", refused=refused)
    assert "'estimator'" not in str(e.value) and "'mass'" in str(e.value)  # the known keys are the host's
    assert hosts.HostOptions.from_mapping({}, prefix="x.oma", refused=refused, estimator="rloo").estimator == "rloo"


def test_a_framework_version_outside_the_tested_series_is_refused_in_one_line(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: {"fw": "1.3.2"}[name])
    hosts.require_version("fw", "1.3", "1.3.0")
    for supported in ("1.4", "1.3.2.1", "2", "1.30"):
        with pytest.raises(hosts.HostConfigError) as e:
            hosts.require_version("fw", supported, f"{supported}.0")
        assert str(e.value) == (f"oma's fw integration supports fw {supported}.x (tested on {supported}.0); "
                                f"the installed fw is 1.3.2: pip install 'fw=={supported}.0'")


def _with_copies(step: hosts.HostStep, copied: torch.Tensor) -> hosts.HostStep:
    """``step`` with copies of rows ``copied`` appended, as verl-agent's adjust_batch pads a batch."""
    cat = lambda x: None if x is None else torch.cat([x, x.index_select(0, copied)])  # noqa: E731
    return hosts.HostStep(group_index=cat(step.group_index), traj_index=cat(step.traj_index), scores=cat(step.scores),
                          response_mask=cat(step.response_mask), step_index=cat(step.step_index), anchor=cat(step.anchor),
                          step_rewards=cat(step.step_rewards),
                          copies=torch.cat([torch.zeros(step.rows, dtype=torch.bool), torch.ones(len(copied), dtype=torch.bool)]))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gigpo"])
def test_under_trajectory_accounting_copies_leave_the_statistics_and_take_their_rows_advantage(estimator):
    penalised = SCORE - 0.1 * torch.tensor([0.0, 1, 0, 0, 1, 0, 0, 1, 0])  # rows of a trajectory differ: a copy would shift R_τ
    step = _step(scores=penalised, anchor=torch.tensor([0, 1, 0, 1, 2, 1, 3, 3, 4]),
                 step_rewards=torch.tensor([0.0, 1, 0, 0, 0, 0, 1, 0, 0]))
    copied = torch.tensor([1, 4, 4])
    padded = _with_copies(step, copied)
    o = hosts.HostOptions(estimator=estimator)
    a, b = hosts.advantages(step, o), hosts.advantages(padded, o)
    assert torch.equal(b[: step.rows], a) and torch.equal(b[step.rows:], a.index_select(0, copied))
    if estimator != "gigpo":  # (GiGPO's returns need one row per step: a host that copies steps discounts itself)
        row = hosts.HostOptions(estimator=estimator, accounting="row")  # the stepwise host counts its copies
        assert not torch.allclose(hosts.advantages(padded, row)[: step.rows], hosts.advantages(step, row))
    assert hosts.copy_sources(padded).tolist() == [*range(9), 1, 4, 4]
    orphan = hosts.HostStep(**{**vars(padded),
                               "step_rewards": torch.cat([padded.step_rewards[:11], torch.tensor([5.0])])})
    assert hosts.copy_sources(orphan)[-1] == -1 and hosts.advantages(orphan, o)[-1] == 0  # repeats no row: 0


def test_by_hand_carried_advantages_divide_by_the_hosts_factor_and_zero_what_it_does_not_weigh():
    adv = torch.tensor([[2.0], [-1.0]])
    w = torch.tensor([[0.5, 0.25], [0.1, 0.0]])
    f = torch.tensor([[0.25, 0.5], [0.0, 0.2]])
    # A·W/f: 2·0.5/0.25 = 4, 2·0.25/0.5 = 1; f = 0 → 0; −1·0/0.2 = 0
    assert hosts.carried_advantages(adv, w, f).tolist() == [[4.0, 1.0], [0.0, 0.0]]
