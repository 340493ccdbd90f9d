"""Bad input gets a clear error naming the field; nothing silently becomes NaN."""

import pytest
import torch

from oma.core import (
    anchor_ids,
    discounted_returns,
    gigpo_advantages,
    implicit_mass,
    micro_batches,
    outcome_advantages,
    token_objective,
    token_weights,
    trajectory_minibatches,
    weighted_loss,
)

S = torch.tensor([1.0, 0.0, 1.0, 0.0])
G = torch.tensor([0, 0, 1, 1])
T = torch.tensor([0, 1, 2, 3])
M = torch.ones(4, 3, dtype=torch.bool)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scores=torch.tensor([1.0, 0.0, 1.0])), r"scores must have shape \(4,\)"),
        (dict(traj_index=torch.tensor([0, 1, 2])), "traj_index has 3 rows, expected 4"),
        (dict(traj_index=torch.tensor([0.0, 1, 2, 3])), "traj_index must have an integer dtype"),
        (dict(group_index=torch.tensor([True, False, True, True])), "group_index must have an integer dtype"),
        (dict(group_index=torch.zeros(4, 1, dtype=torch.long)), r"group_index must be 1-D"),
        (dict(traj_index=torch.tensor([0, 1, 0, 3])), r"traj_index 0 spans groups 0 and 1"),
        (dict(scores=torch.tensor([1.0, float("nan"), 1.0, 0.0])), r"scores has 1 non-finite value.*index \(1,\)"),
        (dict(scores=torch.tensor([1.0, float("inf"), 1.0, 0.0])), "scores has 1 non-finite"),
        (dict(scores=torch.tensor([1, 0, 1, 0])), "scores must have a floating dtype"),
        (dict(scores=[1.0, 0.0, 1.0, 0.0]), "scores must be a torch.Tensor"),
        (dict(accounting="rows"), r"accounting='rows' is not a valid option; expected one of \['row', 'trajectory'\]"),
        (dict(estimator="ppo"), r"estimator='ppo'.*\['grpo', 'rloo'\]"),
        (dict(eps=-1.0), "eps must be >= 0"),
    ],
)
def test_outcome_advantages_errors(kwargs, match):
    args = dict(scores=S, group_index=G, traj_index=T)
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in ("accounting", "estimator", "eps")}
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        outcome_advantages(args["scores"], args["group_index"], args["traj_index"], **options)


def test_gigpo_errors():
    ok = dict(scores=S, step_rewards=torch.zeros(4), anchor=torch.zeros(4, dtype=torch.long), group_index=G, traj_index=T, step_index=torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="anchor has 3 rows"):
        gigpo_advantages(**{**ok, "anchor": torch.zeros(3, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"step_rewards must have shape \(4,\)"):
        gigpo_advantages(**{**ok, "step_rewards": torch.zeros(5)})
    with pytest.raises(ValueError, match="step_advantage_w must be >= 0"):
        gigpo_advantages(**ok, step_advantage_w=-1.0)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        gigpo_advantages(**ok, gamma=1.5)
    with pytest.raises(ValueError, match="traj_index 0 has step_index 0 twice"):
        discounted_returns(torch.zeros(2), torch.tensor([0, 0]), torch.tensor([0, 0]))


def test_token_weights_errors():
    with pytest.raises(ValueError, match=r"reducer='mean' is not a valid option; expected one of \['token-mean'"):
        token_weights(M, G, T, reducer="mean")
    with pytest.raises(ValueError, match=r"mass='equal'.*\['native', 'uniform', 'group'\]"):
        token_weights(M, G, T, mass="equal")
    with pytest.raises(ValueError, match="response_mask must be a bool tensor"):
        token_weights(M.float(), G, T)
    with pytest.raises(ValueError, match="response_mask has 3 rows but group_index/traj_index have 4"):
        token_weights(M[:3], G, T)
    with pytest.raises(ValueError, match="loss_scale_factor must be > 0"):
        token_weights(M, G, T, reducer="seq-mean-token-sum-norm", loss_scale_factor=0)
    with pytest.raises(ValueError, match="traj_index 0 spans groups"):
        implicit_mass(M, G, torch.tensor([0, 1, 0, 3]))


def test_rows_without_trainable_tokens_never_divide_by_zero():
    mask = M.clone()
    mask[1] = False  # a row (and trajectory) with no trainable token
    for reducer in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"):
        for mass in ("native", "uniform", "group"):
            w = token_weights(mask, G, T, reducer=reducer, mass=mass)
            assert torch.isfinite(w).all() and w[1].eq(0).all()
    empty = torch.zeros(4, 3, dtype=torch.bool)
    assert token_weights(empty, G, T).eq(0).all()
    assert implicit_mass(empty, G, T).eq(0).all()
    # uniform mass is shared among the 3 trajectories that can be trained
    assert implicit_mass(mask, G, T, mass="uniform").tolist() == pytest.approx([1 / 3, 0, 1 / 3, 1 / 3])


def test_token_objective_errors():
    logp = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"objective='grpo'.*\['ppo', 'gspo'\]"):
        token_objective(logp, logp, torch.zeros(4), M, objective="grpo")
    with pytest.raises(ValueError, match=r"advantages must have shape \[R\]=\(4,\) or \[R, L\]=\(4, 3\)"):
        token_objective(logp, logp, torch.zeros(3), M)
    with pytest.raises(ValueError, match=r"logp_old must have shape \(4, 3\)"):
        token_objective(logp, torch.zeros(4, 2), torch.zeros(4), M)
    bad = logp.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"logp has 1 non-finite value\(s\) at trainable tokens, first at index \(2, 1\)"):
        token_objective(bad, logp, torch.zeros(4), M)
    masked = M.clone()
    masked[2, 1] = False  # the same NaN at a padding token is fine
    assert torch.isfinite(token_objective(bad, logp, torch.zeros(4), masked)).all()
    with pytest.raises(ValueError, match="clip_low must be in"):
        token_objective(logp, logp, torch.zeros(4), M, clip_low=1.5)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        token_objective(logp, logp, torch.zeros(4), M, clip_ratio_c=0.5)


def test_weighted_loss_errors():
    w = torch.full((2, 2), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"token_loss must have shape \(2, 2\)"):
        weighted_loss(torch.zeros(2, 3), w)
    with pytest.raises(ValueError, match="token_loss is NaN or inf at a token with non-zero weight"):
        weighted_loss(torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), w)


def test_batching_and_anchor_errors():
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        micro_batches(4, 0)
    with pytest.raises(ValueError, match=r"num_minibatches must be in \[1, 4\]"):
        trajectory_minibatches(T, 5)
    with pytest.raises(TypeError, match="states must be a sequence of str"):
        anchor_ids("kitchen")
    with pytest.raises(TypeError, match=r"states\[1\] must be str"):
        anchor_ids(["a", 3])


def test_anchor_ids_are_stable_across_processes():
    import subprocess
    import sys

    states = ["You are in the kitchen.", "You are in the kitchen.", "fridge 1 is open", ""]
    ids = anchor_ids(states)
    assert ids.dtype == torch.int64 and ids[0] == ids[1] and len(set(ids.tolist())) == 3
    code = f"from oma.core import anchor_ids; print(anchor_ids({states!r}).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == str(ids.tolist())


def test_empty_batch():
    empty = torch.zeros(0, dtype=torch.long)
    assert outcome_advantages(torch.zeros(0), empty, empty).shape == (0,)
    assert token_weights(torch.zeros(0, 3, dtype=torch.bool), empty, empty).shape == (0, 3)
    assert sum(len(c) for c in micro_batches(0, 3)) == 0
    assert [c.tolist() for c in micro_batches(5, 2)] == [[0, 1], [2, 3], [4]]


def test_structure_of_another_batch_is_refused():
    from oma.core import batch_structure

    with pytest.raises(ValueError, match="structure describes 2 rows, the batch has 4"):
        outcome_advantages(S, G, T, structure=batch_structure(G[:2], T[:2]))
    with pytest.raises(TypeError, match="structure must be an oma.core.BatchStructure"):
        outcome_advantages(S, G, T, structure={"rows": 4})


def test_split_trajectory_error_carries_the_ids():
    from oma.core import TrajectorySplitError, batch_structure

    with pytest.raises(TrajectorySplitError) as err:
        batch_structure(torch.tensor([5, 5, 8, 8]), torch.tensor([2, 4, 4, 6]))
    assert (err.value.traj_id, err.value.group_ids, err.value.n_split) == (4, (5, 8), 1)
    assert isinstance(err.value, ValueError)


# ---- #69: numbers that are not finite, counts that are not integers, text that is not UTF-8 ---------------------


def _gigpo(**kwargs):
    return gigpo_advantages(S, torch.zeros(4), torch.tensor([0, 0, 1, 1]), G, T, torch.zeros(4, dtype=torch.long),
                            **kwargs)


@pytest.mark.parametrize("call, error, match", [
    (lambda: _gigpo(step_advantage_w=float("inf")), ValueError, r"step_advantage_w must be >= 0 and finite, got inf"),
    (lambda: outcome_advantages(S, G, T, eps=float("inf")), ValueError, r"eps must be >= 0 and finite, got inf"),
    (lambda: outcome_advantages(S, G, T, eps="1e-6"), TypeError, r"eps must be a number, got str '1e-6'"),
    (lambda: token_weights(M, G, T, reducer="seq-mean-token-sum-norm", loss_scale_factor=float("inf")), ValueError,
     r"loss_scale_factor must be > 0 and finite, got inf"),
    (lambda: micro_batches(2.5, 2), TypeError, r"n_rows must be an integer, got float 2.5"),
    (lambda: micro_batches(4, 2.0), TypeError, r"max_rows must be an integer, got float 2.0"),
    (lambda: trajectory_minibatches(T, 2.0), TypeError, r"num_minibatches must be an integer, got float 2.0"),
    (lambda: anchor_ids(["ok", "bad \udce9"]), ValueError, r"states\[1\] is not encodable as UTF-8"),
])
def test_69_a_bad_argument_is_named(call, error, match):
    """#69: step_advantage_w=inf gave all-NaN advantages, an infinite eps or loss_scale_factor all zeros,
    micro_batches(2.5, 2) float indices; a float num_minibatches, a string eps and an unencodable anchor text raised
    errors that did not name the argument. Each is refused naming it."""
    with pytest.raises(error, match=match):
        call()
