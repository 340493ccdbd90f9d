"""verl on CPU (docs/verl.md#verl-on-cpu): the platform, the ``hf`` rollout by hand, and real verl
training steps with oma's trainer at dp = 1 and 2 (``oma verl-smoke``)."""

from __future__ import annotations

import json
import math
import signal
import types

import pytest
import torch

from oma.cli import main as oma_main
from oma.integrations.verl import cpu
from oma.integrations.tiny_model import filtered as _filtered
from oma.integrations.tiny_model import sample_logprobs
from oma.integrations.verl.hf_rollout import HFServer
from oma.integrations.verl.smoke import parse_log
from oma.integrations.verl.smoke_inputs import build_inputs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    build_inputs(root)
    return root


# ---- the platform -------------------------------------------------------------------------------


def test_cpu_platform_answers_what_verl_asks():
    p = cpu.PlatformCPU()
    assert (p.device_name, p.communication_backend_name(), p.ray_resource_name()) == ("cpu", "gloo", "GPU")
    assert p.is_platform_available(use_smi_check=True) is False  # only by VERL_PLATFORM=cpu
    x = torch.ones(2)
    assert x.to(p.current_device()).device.type == "cpu" and torch.device(p.current_device()).type == "cpu"
    dev = p.device_module
    assert dev.is_available() and dev.memory_allocated() == 0 and dev.empty_cache() is None
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    state = dev.get_rng_state()
    a = torch.rand(3)
    dev.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)


def test_process_group_backend_names_the_cpu_once():
    seen = {}

    def original(timeout_second=None, backend=None):
        seen["backend"] = backend

    module = types.SimpleNamespace(initialize_global_process_group_ray=original)
    cpu._single_backend(module)
    module.initialize_global_process_group_ray(timeout_second=None)
    assert seen["backend"] == "cpu:gloo"
    module.initialize_global_process_group_ray(backend="cpu:gloo,cuda:nccl")
    assert seen["backend"] == "cpu:gloo,cuda:nccl"  # an explicit backend is left alone
    wrapped = module.initialize_global_process_group_ray
    cpu._single_backend(module)
    assert module.initialize_global_process_group_ray is wrapped  # idempotent


def test_overrides_and_environment():
    lines = cpu.overrides(dp=2)
    assert "++ray_kwargs.ray_init.num_gpus=2" in lines and "trainer.n_gpus_per_node=2" in lines
    assert "actor_rollout_ref.rollout.name=hf" in lines and "trainer.device=cpu" in lines
    env = cpu.environment()
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_USE_EXTERNAL_MODULES"] == "oma.integrations.verl.cpu"


# ---- the hf rollout by hand ------------------------------------------------------------------------


def test_filtering_by_hand():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    assert _filtered(p, 2, 1.0).tolist() == [0.5, 0.3, 0.0, 0.0]
    # nucleus 0.7: keep while the mass before a token is below 0.7 → 0.5 (0), 0.3 (0.5); not 0.15 (0.8)
    assert _filtered(p, -1, 0.7).tolist() == [0.5, 0.3, 0.0, 0.0]
    assert _filtered(p, -1, 1.0).tolist() == p.tolist()
    torch.testing.assert_close(sample_logprobs(torch.tensor([0.0, 2.0]), 0.5), torch.log_softmax(torch.tensor([0.0, 4.0]), -1))


def _forward_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_greedy_generation_equals_step_by_step_forward(inputs):
    server = HFServer(str(inputs / "model"), response_length=6, prompt_length=32)
    server.eos = set()  # run to the length cap
    prompt = [5, 17, 42, 8]
    out = server._generate(prompt, {"temperature": 0.0})
    assert len(out.token_ids) == 6 and out.stop_reason == "length" and out.extra_fields == {"global_steps": None}
    ids = list(prompt)
    for token, logp in zip(out.token_ids, out.log_probs, strict=True):
        logits = _forward_logits(server.model, ids)
        assert token == int(torch.argmax(logits))
        assert logp == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-5)
        ids.append(token)
    assert len(server._generate(prompt, {"temperature": 0.0, "max_tokens": 2}).token_ids) == 2


def test_sampled_logprobs_are_at_the_temperature_and_eos_stops(inputs):
    server = HFServer(str(inputs / "model"), response_length=8, prompt_length=32, seed=3)
    prompt = [9, 9, 30]
    first = server._generate(prompt, {"temperature": 0.7, "top_k": -1, "top_p": 1.0})
    logits = _forward_logits(server.model, prompt)
    token = first.token_ids[0]
    assert first.log_probs[0] == pytest.approx(float(torch.log_softmax(logits / 0.7, -1)[token]), abs=1e-5)
    server.eos = {token}  # the same seed draws the same first token: it now ends the episode
    server.generator.manual_seed(3)
    again = server._generate(prompt, {"temperature": 0.7})
    assert again.token_ids == [token] and again.stop_reason == "completed"


def test_weights_from_the_trainer_change_the_rollout(inputs):
    server = HFServer(str(inputs / "model"), response_length=4, prompt_length=32)
    prompt = [1, 2, 3]
    before = _forward_logits(server.model, prompt)
    state = {k: v.clone() for k, v in server.model.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"] * 3.0
    assert server.load_weights({"model.norm.weight": state["model.norm.weight"].to(torch.bfloat16)}, 7) == 1
    assert not torch.allclose(_forward_logits(server.model, prompt), before)
    assert server._generate(prompt, {"temperature": 0.0}).extra_fields == {"global_steps": 7}
    with pytest.raises(ValueError, match="weights the model does not have"):
        server.load_weights({"model.not_a_layer.weight": torch.zeros(1)}, 8)


# ---- the smoke command ---------------------------------------------------------------------------


def test_parse_log_reads_verls_console_lines():
    text = (
        "(TaskRunnerV1 pid=1) oma: verl integration active — trainer 'oma_sync'\n"
        "(TaskRunnerV1 pid=1) step:1 - actor/pg_loss:np.float64(0.5) - oma/trajectories:16.0 - "
        "actor/grad_norm:1.5 - training/off_policy/trajectory_staleness/mean:np.float64(0.0)\n"
        "(TaskRunnerV1 pid=1) step:2 - actor/pg_loss:-0.25 - oma/trajectories:12.0 - actor/grad_norm:0.5\n"
    )
    got = parse_log(text)
    assert got["steps"] == 2 and got["oma_active"] and got["finite"]
    assert got["pg_loss"] == pytest.approx(0.125) and got["trajectories"] == 14.0 and got["staleness"] == 0.0
    assert parse_log(text.replace("-0.25", "nan"))["finite"] is False


def test_smoke_refuses_bad_arguments(capsys):
    assert oma_main(["verl-smoke", "--steps", "0"]) == 2
    assert "--steps must be ≥ 1" in capsys.readouterr().err


def test_smoke_names_the_missing_extra(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_transfer_queue(name, *args, **kwargs):
        if name == "transfer_queue":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transfer_queue)
    assert oma_main(["verl-smoke"]) == 2
    err = capsys.readouterr().err
    assert "transfer_queue" in err and "pip install 'oma-rl[verl]'" in err


def test_smoke_refuses_dump_dir_without_omas_trainer(capsys):
    assert oma_main(["verl-smoke", "--trainer", "verl", "--dump-dir", "x"]) == 2
    assert "--dump-dir writes what oma's trainer trains" in capsys.readouterr().err


def test_smoke_refuses_another_verl(monkeypatch, capsys):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0" if name == "verl" else real(name))
    assert oma_main(["verl-smoke"]) == 2
    err = capsys.readouterr().err
    assert "supports verl 0.9.x (tested on 0.9.1); the installed verl is 0.10.0" in err and len(err.splitlines()) == 1


def test_smoke_passes_dump_dir_to_omas_trainer(tmp_path):
    from oma.integrations.verl.smoke import overrides

    lines = overrides(tmp_path, 2, 1, "trajectory", "uniform", "oma_grpo", dump_dir=str(tmp_path / "dump"))
    assert f"+algorithm.oma.dump_dir='{tmp_path / 'dump'}'" in lines
    assert not any("algorithm.oma.dump_dir" in line for line in overrides(tmp_path, 2, 1, "trajectory", "uniform", "oma_grpo"))


@pytest.mark.parametrize("dp", [1, 2])
def test_real_verl_steps_on_cpu(dp, tmp_path, capsys):
    """Two real verl steps with oma_sync: OA + uniform MA over several mini-batches, weights synced; the
    batches it trained on, dumped (algorithm.oma.dump_dir), are what `oma audit --all` reads."""
    dump = tmp_path / "dump"
    status = oma_main(["verl-smoke", "--steps", "2", "--dp", str(dp), "--out", str(tmp_path / "work"), "--timeout", "800",
                       "--dump-dir", str(dump)])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert status == 0, result
    assert result["steps"] == 2 and result["oma_active"] and result["finite"] and result["dp"] == dp
    assert result["optimizer_steps"] > 1  # several PPO mini-batches per step
    assert result["effective_trajectories"] == pytest.approx(result["trajectories"])  # every trajectory 1/T
    assert result["staleness"] == 0.0  # the rollout generated with the latest weights
    assert math.isfinite(result["pg_loss"]) and result["grad_norm"] > 0

    report = tmp_path / "audit.json"
    assert oma_main(["audit", str(dump), "--all", "--quiet", "--json", str(report)]) == 0
    iterations = json.loads(report.read_text())["iterations"]
    assert [it["iteration"] for it in iterations] == [1, 2]  # verl's global steps
    audited = sum(it["trajectories"] for it in iterations) / len(iterations)
    assert audited == pytest.approx(result["trajectories"])  # the smoke's oma/trajectories, a mean over its steps


@pytest.mark.parametrize("out, fails, kept", [(False, False, False), (False, True, True), (True, False, True)],
                         ids=["temporary-ok", "temporary-failed", "out"])
def test_the_temporary_work_folder_is_removed_after_a_run_that_succeeds(tmp_path, monkeypatch, capsys, out, fails, kept):
    """#58 item 12: `oma verl-smoke`'s default work folder (model, data, train.log) was left in the temporary
    directory after every run; it is removed unless the run failed (its log, named in the JSON line, explains
    the failure) or --out gave it."""
    import tempfile

    from oma.integrations.verl import smoke

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the default folder
    monkeypatch.setattr("oma.integrations.verl.smoke_inputs.build_inputs", lambda work: None)

    def fake_verl(cmd, env, log, timeout):  # verl's console, as test_parse_log_reads_verls_console_lines reads it
        log.write_text("(TaskRunnerV1 pid=1) oma: verl integration active — trainer 'oma_sync'\n"
                       "(TaskRunnerV1 pid=1) step:1 - actor/pg_loss:0.5 - oma/trajectories:16.0 - actor/grad_norm:1.5\n")
        return (1 if fails else 0), 0

    monkeypatch.setattr(smoke, "run_in_session", fake_verl)
    argv = ["verl-smoke", "--steps", "1", *(["--out", str(tmp_path / "mine")] if out else [])]
    assert oma_main(argv) == (1 if fails else 0)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == int(kept)
    assert result["log"] == (str(folders[0] / "train.log") if kept else None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["TERM", "INT", "KILL"])
def test_the_run_and_its_processes_die_with_the_smoke_command(tmp_path, sig):
    """#69 item 3: `oma verl-smoke --steps 50 & sleep 60; kill $!` left the verl driver and its Ray session (22-30
    processes, about 5 GB) running under PID 1 and its temporary folder behind; Ctrl-C was a KeyboardInterrupt
    traceback with exit status 1. With a stand-in for verl's trainer that starts grandchildren, nothing of the run
    is alive after the command, the folder is gone, and Ctrl-C is one line with exit status 130."""
    from smoke_guard import stop_smoke

    status, err, alive, tmp = stop_smoke(tmp_path, "verl-smoke", "oma.integrations.verl.smoke",
                                         "oma.integrations.verl.smoke_inputs", sig)
    assert alive == [] and list(tmp.iterdir()) == []
    if sig == signal.SIGINT:
        assert status == 130 and err == "oma verl-smoke: interrupted; the run and every process it started were ended\n"
    else:
        assert status == -sig
