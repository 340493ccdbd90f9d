"""optim.ema: an exponential moving average of the weights (docs/training.md#an-average-of-the-weights)."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import oma.train.loop as loop
from oma.cli import main as oma_main
from oma.train.config import ConfigError, load_config
from run_records import records, training_only, without_timings
from test_train import TINY


def _linear(w: float) -> torch.nn.Linear:
    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(w)
    return lin


def _set(model: torch.nn.Module, w: float) -> None:
    with torch.no_grad():
        model.weight.fill_(w)


def test_ema_by_hand():
    model = _linear(4.0)
    ema = loop.WeightAverage(model, 0.5)
    assert ema.state_dict() == {"weight": torch.tensor([[4.0]])}  # θ̄_0 = θ_0
    _set(model, 0.0)
    ema.update()
    assert float(ema.avg[0]) == 2.0  # 0.5·4 + 0.5·0
    _set(model, 8.0)
    ema.update()
    assert float(ema.avg[0]) == 5.0  # 0.5·2 + 0.5·8
    assert float(model.weight.detach()) == 8.0  # the live weights are untouched
    with ema.swapped_in():
        assert float(model.weight.detach()) == 5.0  # lent to the model ...
    assert float(model.weight.detach()) == 8.0  # ... and given back
    with pytest.raises(RuntimeError), ema.swapped_in():
        raise RuntimeError("an evaluation that fails")
    assert float(model.weight.detach()) == 8.0  # given back on an error too


def test_ema_skips_frozen_weights_and_checks_names():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].weight.requires_grad_(False)
    ema = loop.WeightAverage(model, 0.9)
    assert ema.names == ["0.bias", "1.weight", "1.bias"]
    with pytest.raises(ValueError, match=r"missing \[.1\.bias., .1\.weight.\], unexpected \[\]"):
        ema.load_state_dict({"0.bias": torch.zeros(2)})


@settings(max_examples=30, deadline=None)
@given(beta=st.floats(0.001, 0.999), ws=st.lists(st.floats(-10, 10), min_size=1, max_size=12))
def test_ema_is_the_closed_form_weighted_sum(beta, ws):
    """θ̄_k = β^k·θ_0 + (1 − β)·Σ_{j=1..k} β^(k−j)·θ_j, computed as a plain sum."""
    model = _linear(ws[0])
    ema = loop.WeightAverage(model, beta)
    for w in ws[1:]:
        _set(model, w)
        ema.update()
    k = len(ws) - 1
    expected = beta ** k * ws[0] + (1 - beta) * sum(beta ** (k - j) * ws[j] for j in range(1, k + 1))
    assert float(ema.avg[0]) == pytest.approx(expected, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("value", ["1", "1.5", "-0.1", "nan"])
def test_ema_out_of_range_is_rejected_by_name(value):
    with pytest.raises(ConfigError, match=r"optim\.ema"):
        load_config(None, [f"optim.ema={value}"])


def test_training_uses_the_live_weights_and_evaluation_the_average(tmp_path, monkeypatch):
    # an entropy bonus moves the weights even where every advantage is 0 (tiny tasks are rarely won)
    cache = [f"warm_start.cache_dir={tmp_path / 'cache'}", "algo.entropy_coef=0.01"]
    assert oma_main(["train", *TINY, *cache, "optim.ema=0", f"out_dir={tmp_path / 'plain'}"]) == 0
    seen = {}
    evaluate = loop.evaluate

    def recording(cfg, make_env, model, tokenizer, iteration):
        seen[iteration] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return evaluate(cfg, make_env, model, tokenizer, iteration)

    monkeypatch.setattr(loop, "evaluate", recording)
    assert oma_main(["train", *TINY, *cache, "optim.ema=0.5", f"out_dir={tmp_path / 'ema'}"]) == 0
    plain, ema = records(tmp_path / "plain" / "metrics.jsonl"), records(tmp_path / "ema" / "metrics.jsonl")
    # the average changes nothing in training: same rollouts, losses and updates
    assert training_only(ema) == training_only(plain)
    # θ̄_0 = θ_0: the warm start's evaluation is the same
    assert {k: v for k, v in ema[0].items() if k.startswith("eval_")} == \
        {k: v for k, v in plain[0].items() if k.startswith("eval_")}
    # the last evaluation saw θ̄, as saved in the checkpoint, which differs from the live θ
    last = tmp_path / "ema" / "checkpoints" / "iter_000002"
    averaged, live = load_file(str(last / "ema.safetensors")), load_file(str(last / "model.safetensors"))
    evaluated = seen[2]
    assert set(averaged) <= set(evaluated)
    assert all(torch.equal(evaluated[k], averaged[k]) for k in averaged)
    both = set(averaged) & set(live)  # save_model names a tied embedding once, as lm_head
    assert len(both) >= len(averaged) - 1 and any(not torch.equal(averaged[k], live[k]) for k in both)


def test_resume_with_ema_is_exact(tmp_path):
    cache = f"warm_start.cache_dir={tmp_path / 'cache'}"
    common = [*TINY, "optim.ema=0.5", "algo.entropy_coef=0.01", "checkpoint_every=2", "eval_every=2", cache]
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'straight'}"]) == 0
    assert oma_main(["train", *common, "iterations=2", f"out_dir={tmp_path / 'resumed'}"]) == 0
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'resumed'}", "--resume"]) == 0

    resumed, straight = (records(tmp_path / d / "metrics.jsonl") for d in ("resumed", "straight"))
    assert without_timings(resumed) == without_timings(straight)
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "iter_000004" / "ema.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "iter_000004" / "ema.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_missing_its_average_is_named(tmp_path, capsys):
    cache = f"warm_start.cache_dir={tmp_path / 'cache'}"
    common = [*TINY, "optim.ema=0.5", cache, f"out_dir={tmp_path / 'r'}"]
    assert oma_main(["train", *common]) == 0
    for ckpt in (tmp_path / "r" / "checkpoints").glob("iter_*"):
        (ckpt / "ema.safetensors").unlink()
    assert oma_main(["train", *common, "iterations=3", "--resume"]) == 2
    err = capsys.readouterr()
    assert "ema.safetensors is missing" in err.out + err.err


def test_a_config_saved_before_the_option_existed_reads_as_without_it():
    from oma.train.config import config_diff, to_dict

    saved = to_dict(load_config(None, ["optim.ema=0"]))
    del saved["optim"]["ema"]  # as every config.json written before optim.ema existed
    assert config_diff(saved, to_dict(load_config(None, ["optim.ema=0"]))) == []
    assert config_diff(saved, to_dict(load_config(None, ["optim.ema=0.97"]))) == ["optim.ema (saved 0.0, now 0.97)"]


def test_a_run_saved_before_the_option_existed_loads_without_it(tmp_path):
    from oma.train.config import load_run_config, to_dict

    saved = to_dict(load_config(None, ["optim.ema=0", "seed=3"]))
    del saved["optim"]["ema"]  # as every config.json written before optim.ema existed
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = load_run_config(tmp_path)
    assert (cfg.optim.ema, cfg.seed) == (0.0, 3)  # not today's default, 0.97
    saved["optim"]["ema"] = 0.5
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert load_run_config(tmp_path).optim.ema == 0.5
    with pytest.raises(ConfigError, match="no config.json"):
        load_run_config(tmp_path / "nowhere")
