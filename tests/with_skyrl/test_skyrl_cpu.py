"""SkyRL on CPU (docs/skyrl.md#skyrl-on-cpu): the SkyRL internals oma's patches rely on, the patches,
the Hugging Face engine and client by hand, the mass probe against SkyRL's and oma's normalisation,
the smoke environment, and real SkyRL training steps with oma's trainer (``oma skyrl-smoke``)."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import subprocess
import sys
import types

import pytest
import torch
from skyrl.backends.skyrl_train.distributed import fsdp_utils
from skyrl.backends.skyrl_train.utils import ppo_utils
from skyrl.backends.skyrl_train.workers.worker import DistributedTorchRayActor, PolicyWorkerBase
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.trainer import RayPPOTrainer
from test_skyrl_trainer import TRAJECTORIES, make_batch, make_cfg, make_trainer

from oma.cli import main as oma_main
from oma.integrations.skyrl import cpu_patches
from oma.integrations.skyrl.cpu import MassProbeMixin
from oma.integrations.skyrl.hf_generator import HFEngine, HFInferenceClient
from oma.integrations.skyrl.smoke_env import MAX_TURNS, SmokeEnv
from oma.integrations.skyrl.trainer import OMARayPPOTrainer
from oma.integrations.tiny_model import build

# ---- what the patches and subclasses rely on in SkyRL 0.4.0 -----------------------------------------


def _source(obj) -> str:
    return inspect.getsource(obj)


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "_ray_trace_ctx"]  # Ray's, on actor methods


def test_the_skyrl_internals_the_patches_rely_on():
    """If one of these fails, SkyRL changed under oma.integrations.skyrl.cpu_patches / cpu: re-read it."""
    import skyrl.backends.skyrl_train.workers.model_wrapper as model_wrapper  # importable with the stand-in
    from skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker import FSDPPolicyWorkerBase

    # 1. flash-attn: the model wrapper takes exactly these two names, used only when unpadding micro-batches
    wrapper = _source(model_wrapper)
    assert "from flash_attn.bert_padding import pad_input, unpad_input" in wrapper
    assert wrapper.count("unpad_input(") + wrapper.count("pad_input(") >= 1
    # 2. CUDA: the meshes are asked for by name, through the module attributes the patch replaces
    assert 'init_device_mesh("cuda"' in _source(fsdp_utils.create_device_mesh)
    assert "torch.distributed.device_mesh.init_device_mesh(" in _source(DistributedTorchRayActor.init_worker_process_group)
    assert "if not torch.distributed.is_initialized():" in _source(DistributedTorchRayActor.init_worker_process_group)
    assert "_sync_non_persistent_buffers(model" in _source(fsdp_utils.fsdp2_load_full_state_dict)
    assert _params(fsdp_utils._sync_non_persistent_buffers) == ["model", "loaded_sd"]
    assert ".cuda()" in _source(fsdp_utils._sync_non_persistent_buffers)
    # the hooks oma's CPU classes override, with the signatures SkyRL calls them by
    assert _params(PolicyWorkerBase.init_weight_sync_state) == [
        "self", "inference_engine_client", "inference_engine_cfg"]
    assert _params(FSDPPolicyWorkerBase.broadcast_to_inference_engines) == [
        "self", "inference_engine_client", "inference_engine_cfg", "model_id"]
    assert _params(RayPPOTrainer.build_models) == ["self", "PolicyWorker", "CriticWorker",
                                                                              "RefWorker"]
    for hook in ("get_inference_client", "get_train_dataset", "get_eval_dataset", "get_trainer"):
        assert callable(getattr(BasePPOExp, hook))
    assert "trainer.build_models(PolicyWorker, CriticWorker, RefWorker)" in _source(BasePPOExp._setup_trainer)
    # SkyRL ships its loss registry to Ray with cloudpickle when it is installed (plain pickle fails)
    assert ppo_utils.cloudpickle.__name__ == "cloudpickle"


@pytest.fixture(scope="module")
def patched_process() -> str:
    """What a fresh process prints with oma's patches installed (they change the process for good)."""
    code = (
        "import torch, torch.distributed as dist\n"
        "from oma.integrations.skyrl import cpu_patches\n"
        "print('stubbed', cpu_patches.stub_flash_attn(), cpu_patches.stub_flash_attn())\n"
        "import skyrl.backends.skyrl_train.workers.model_wrapper as w\n"
        "from skyrl.backends.skyrl_train.utils import torch_utils\n"
        "print('fused_ce', torch_utils.FLASH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE)\n"
        "try:\n    w.unpad_input(None, None)\nexcept RuntimeError as e:\n    print(e)\n"
        "from transformers.utils import is_flash_attn_2_available\n"
        "print('fa2', is_flash_attn_2_available())\n"
        "cpu_patches.install(); cpu_patches.install()\n"
        "from skyrl.backends.skyrl_train.distributed import fsdp_utils\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "mesh = fsdp_utils.create_device_mesh(world_size=1, fsdp_size=-1)\n"
        "m = torch.nn.Linear(2, 2); m.register_buffer('inv', torch.arange(3.0), persistent=False)\n"
        "fsdp_utils._sync_non_persistent_buffers(m, {})\n"
        "torch.cuda.set_device(0); torch.cuda.synchronize()\n"
        "print('device', mesh.device_type, torch.cuda.current_device(), torch.ones(1).to(torch.cuda.current_device()).device,"
        " m.inv.tolist(), torch.cuda.is_available())\n"
        "dist.destroy_process_group()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_flash_attn_stand_in_covers_what_skyrl_imports_and_refuses_the_rest(patched_process):
    assert "stubbed True False" in patched_process  # installed once, only where flash-attn is missing
    assert "fused_ce False" in patched_process  # SkyRL's optional flash-attn import still falls back
    assert cpu_patches.FLASH_ATTN_REFUSAL in patched_process and "fa2 False" in patched_process


def test_cpu_device_builds_skyrl_meshes_on_the_cpu(patched_process):
    assert "device cpu cpu cpu [0.0, 1.0, 2.0] False" in patched_process


# ---- the Hugging Face engine and client ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny") / "model"
    build(root)
    return root


class _Remote:
    """An HFEngine behind a fake actor handle: ``engine.method.remote(...)`` awaits the call."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        method = getattr(self._engine, name)

        async def remote(*args, **kwargs):
            return method(*args, **kwargs)

        return types.SimpleNamespace(remote=remote)


def test_engine_generates_greedily_and_counts_weight_versions(model_dir):
    engine = HFEngine(str(model_dir))
    engine.eos = set()  # run to max_tokens
    out = engine.generate([5, 17, 42], {"max_tokens": 4, "temperature": 0.0})
    assert len(out["ids"]) == 4 and out["stop"] == "length" and out["version"] == 0
    ids = [5, 17, 42]
    with torch.no_grad():
        for token, logp in zip(out["ids"], out["logprobs"], strict=True):
            logits = engine.model(input_ids=torch.tensor([ids])).logits[0, -1]
            assert token == int(torch.argmax(logits))
            assert logp == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-5)
            ids.append(token)
    assert out["text"] == engine.tokenizer.decode(out["ids"], skip_special_tokens=True)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    state["model.norm.weight"] = state["model.norm.weight"] * 3.0
    assert engine.load_weights({"model.norm.weight": state["model.norm.weight"].to(torch.bfloat16)}) == 1
    assert engine.generate([5, 17, 42], {"max_tokens": 1, "temperature": 0.0})["version"] == 1
    with pytest.raises(ValueError, match="weights the model does not have"):
        engine.load_weights({"model.not_a_layer.weight": torch.zeros(1)})


def test_the_engine_loads_its_tokenizer_from_local_files_only(model_dir, monkeypatch):
    """#58 item 11: HFEngine's tokenizer, like its model (oma.integrations.tiny_model.Sampler), is loaded with
    local_files_only=True: a path that is not a local folder never reaches the Hub."""
    from transformers import AutoTokenizer

    calls = []
    real = AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    HFEngine(str(model_dir))
    assert [kwargs.get("local_files_only") for kwargs in calls] == [True]


def test_client_answers_skyrls_interface(model_dir):
    engine = HFEngine(str(model_dir))
    client = HFInferenceClient(_Remote(engine), "tiny")
    params = {"max_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 1, "skip_special_tokens": True}
    out = asyncio.run(client.generate({"prompt_token_ids": [[1, 2, 3], [4, 5]], "sampling_params": params}))
    assert len(out["response_ids"]) == 2 and all(1 <= len(r) <= 3 for r in out["response_ids"])
    assert [len(lp) for lp in out["response_logprobs"]] == [len(r) for r in out["response_ids"]]
    assert set(out["stop_reasons"]) <= {"stop", "length"} and out["rollout_expert_indices"] is None
    no_logprobs = asyncio.run(client.generate({"prompt_token_ids": [[1]], "sampling_params": {**params, "logprobs": None}}))
    assert no_logprobs["response_logprobs"] is None
    assert client.take_versions() == [0, 0, 0] and client.take_versions() == []
    assert asyncio.run(client.update_named_weights({"named_tensors": {}})) == 1
    asyncio.run(client.generate({"prompt_token_ids": [[1]], "sampling_params": params}))
    assert client.take_versions() == [1]
    client.increment_weight_version()
    assert client.weight_version == 1 and client.model_name == "tiny"
    assert asyncio.run(client.get_world_size()) == (1, 1)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        asyncio.run(client.generate({"prompts": [[{"role": "user", "content": "hi"}]]}))
    with pytest.raises(ValueError, match="named_tensors"):
        asyncio.run(client.update_named_weights({"names": []}))
    with pytest.raises(NotImplementedError, match="token-in, token-out"):
        client.get_endpoint_url()


# ---- the mass probe --------------------------------------------------------------------------------


class _ProbedOMA(MassProbeMixin, OMARayPPOTrainer):
    pass


class _ProbedSkyRL(MassProbeMixin, RayPPOTrainer):
    pass


def _normalised(cls, oma):
    trainer = make_trainer(cls, make_cfg(oma))
    data = trainer.compute_advantages_and_returns(make_batch())
    data = trainer._normalize_advantages(data, data.metadata["policy_mini_batch_boundaries"],
                                         data.metadata["policy_prompt_boundaries"])
    return trainer.all_metrics, data["advantages"]


@pytest.mark.parametrize("mass", ["uniform", "native"])
def test_probe_measures_each_trajectorys_mass_and_changes_nothing(mass):
    metrics, adv = _normalised(_ProbedOMA, {"mass": mass})
    _, unprobed = _normalised(OMARayPPOTrainer, {"mass": mass})
    assert torch.equal(adv, unprobed)
    assert metrics["probe/trajectories"] == len(TRAJECTORIES)
    if mass == "uniform":
        assert metrics["probe/effective_trajectories"] == pytest.approx(len(TRAJECTORIES), rel=1e-9)
    else:  # SkyRL's token_mean per mini-batch: longer trajectories weigh more
        assert metrics["probe/effective_trajectories"] < len(TRAJECTORIES) - 0.5
        skyrl, _ = _normalised(_ProbedSkyRL, {"mass": "native"})
        assert skyrl["probe/effective_trajectories"] == pytest.approx(metrics["probe/effective_trajectories"])


def test_probe_counts_rows_as_trajectories_when_not_step_wise():
    cfg = make_cfg({"mass": "native"})
    cfg.generator.step_wise_trajectories = False
    trainer = make_trainer(_ProbedSkyRL, cfg)
    data = make_batch()
    data.metadata.pop("is_last_step")
    data = trainer.compute_advantages_and_returns(data)
    trainer._normalize_advantages(data, data.metadata["policy_mini_batch_boundaries"], data.metadata["policy_prompt_boundaries"])
    assert trainer.all_metrics["probe/trajectories"] == int((data["loss_mask"].sum(-1) > 0).sum())


# ---- the environment ------------------------------------------------------------------------------


def test_smoke_env_ends_at_the_first_digit_or_the_turn_cap():
    env = SmokeEnv()
    first = env.step("no digits here")
    assert not first["done"] and first["reward"] == 0.0 and first["observations"][0]["role"] == "user"
    won = env.step("it is 7")
    assert won["done"] and won["reward"] == 1.0 and won["observations"] == []
    env = SmokeEnv()
    outs = [env.step("nothing") for _ in range(MAX_TURNS)]
    assert [o["done"] for o in outs] == [False] * (MAX_TURNS - 1) + [True] and outs[-1]["reward"] == 0.0
    assert env.get_metrics() == {"turns": MAX_TURNS, "won": False}
    agg = SmokeEnv.aggregate_metrics([{"turns": 1, "won": True}, {}, {"turns": 2, "won": True}, {"turns": 4, "won": False}])
    assert agg == {"turns": pytest.approx(7 / 3), "success_turns": 1.5, "failure_turns": 4.0}
    assert SmokeEnv.aggregate_metrics([{"turns": 4, "won": False}]) == {"turns": 4.0, "failure_turns": 4.0}


# ---- the smoke command -----------------------------------------------------------------------------


def test_real_skyrl_steps_on_cpu(tmp_path, capsys):
    """Two real SkyRL steps through oma's trainer: multi-turn step-wise episodes, uniform MA, weights synced."""
    status = oma_main(["skyrl-smoke", "--steps", "2", "--out", str(tmp_path), "--timeout", "300"])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    result = json.loads(lines[-1])
    assert status == 0, (result, captured.err)
    assert result["steps"] == 2 and result["oma_active"] and result["finite"]
    assert result["trajectories"] > 0
    assert result["effective_trajectories"] == pytest.approx(result["trajectories"])  # every trajectory 1/T
    for key in ("pg_loss", "grad_norm", "step_time_s"):
        assert math.isfinite(result[key])
    assert result["grad_norm"] > 0
    assert result["turns"] > 1 and result["failure_turns"] > result["success_turns"]  # failures take more turns
    assert result["weights_synced"]  # step s sampled with the weights of update s
    assert result["processes_left"] == 0
