"""A Hugging Face inference engine for SkyRL 0.4.0 on the CPU, in place of vLLM (docs/skyrl.md#skyrl-on-cpu).

SkyRL's generators reach inference only through its ``InferenceEngineInterface``: ``generate``
(token ids in; token ids, text, stop reasons and log-probabilities out) and the controls its trainer
calls around a weight sync (pause, resume, sleep, wake up, the weights' version). Here:

* :class:`HFEngine`, a Ray actor holding the model on the CPU (:class:`oma.integrations.tiny_model.Sampler`:
  forward passes with a KV cache, temperature / top-k / top-p, each token's log-probability under the
  sampling distribution as vLLM reports it), which takes the trainer's weights after every update and
  counts them (its ``version``: 0 for the weights it loaded from disk);
* :class:`HFInferenceClient`, the interface SkyRL's ``SkyRLGymGenerator`` and trainer call. It holds
  only the actor's handle, so SkyRL ships it to its policy workers for the weight sync, as it does its
  own client; oma's CPU policy worker (:mod:`oma.integrations.skyrl.cpu`) sends the full state dict
  with :meth:`HFInferenceClient.update_named_weights`.

Token-in, token-out only: no HTTP endpoint, chat completion or LoRA adapter. Meant for tiny models and
debugging, not for speed: the engine generates one request at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
from skyrl.backends.skyrl_train.inference_servers.base import (
    InferenceEngineInput,
    InferenceEngineInterface,
    InferenceEngineOutput,
)

from oma.integrations.tiny_model import Sampler

NO_HTTP = "the Hugging Face engine of a CPU run is token-in, token-out: it has no HTTP endpoint or {}"


class HFEngine(Sampler):
    """The model of a CPU run, in a Ray actor (see the module docstring)."""

    def __init__(self, model_path: str, seed: int = 0) -> None:
        from transformers import AutoTokenizer

        super().__init__(model_path, seed=seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)  # as the model: no Hub
        self.version = 0

    def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        """One completion with vLLM's sampling parameters (``max_tokens``, ``temperature``, ``top_k``,
        ``top_p``, ``skip_special_tokens``): ids, text, log-probabilities, stop reason and the weights' version."""
        max_tokens = sampling_params.get("max_tokens") or 16
        ids, logprobs, ended = self.sample(prompt_ids, int(max_tokens), sampling_params)
        text = self.tokenizer.decode(ids, skip_special_tokens=bool(sampling_params.get("skip_special_tokens", True)))
        return {"ids": ids, "text": text, "logprobs": logprobs, "stop": "stop" if ended else "length",
                "version": self.version}

    def load_weights(self, state: dict[str, Any]) -> int:
        """The trainer's full state dict (the model's own names); returns the new version."""
        self.load_state(state)
        self.version += 1
        return self.version


def start_engine(model_path: str, seed: int = 0, num_cpus: float = 1) -> Any:
    """An :class:`HFEngine` actor."""
    return ray.remote(HFEngine).options(num_cpus=num_cpus).remote(model_path, seed)


class HFInferenceClient(InferenceEngineInterface):
    """SkyRL's inference interface over an :class:`HFEngine` actor (see the module docstring)."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self._model_name = model_name
        self.weight_version = 0
        """SkyRL's count of weight syncs (its trainer increments it after each)."""
        self.versions_seen: list[int] = []
        """The engine's weight version of every response since the last :meth:`take_versions`."""

    @property
    def model_name(self) -> str:
        return self._model_name

    async def generate(self, input_batch: InferenceEngineInput, model: str | None = None) -> InferenceEngineOutput:
        prompts = input_batch.get("prompt_token_ids")
        if prompts is None:
            raise ValueError("the Hugging Face engine takes prompt_token_ids (SkyRL's generator sends them), not prompts")
        params = dict(input_batch.get("sampling_params") or {})
        outs = await asyncio.gather(*(self.engine.generate.remote(list(p), params) for p in prompts))
        self.versions_seen += [o["version"] for o in outs]
        return InferenceEngineOutput(
            responses=[o["text"] for o in outs],
            response_ids=[o["ids"] for o in outs],
            stop_reasons=[o["stop"] for o in outs],
            response_logprobs=[o["logprobs"] for o in outs] if params.get("logprobs") is not None else None,
            prompt_logprobs=None,
            rollout_expert_indices=None,
            rollout_sample_support=None,
        )

    def take_versions(self) -> list[int]:
        """The weight versions that generated the responses since the last call."""
        seen, self.versions_seen = self.versions_seen, []
        return seen

    async def update_named_weights(self, request: Any) -> int:
        """``{"named_tensors": state_dict}``: load the trainer's weights; returns the engine's new version."""
        if not isinstance(request, dict) or "named_tensors" not in request:
            raise ValueError("the Hugging Face engine takes full weights as {'named_tensors': state_dict} (no LoRA)")
        return await self.engine.load_weights.remote(request["named_tensors"])

    def increment_weight_version(self) -> None:
        self.weight_version += 1

    async def get_world_size(self) -> tuple[int, int]:
        return 1, 1

    async def teardown(self) -> None:
        ray.kill(self.engine)

    # nothing to free, pause or route on the CPU
    async def wake_up(self, *args: Any, **kwargs: Any) -> None: ...
    async def sleep(self, *args: Any, **kwargs: Any) -> None: ...
    async def is_sleeping(self) -> bool:
        return False
    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> None: ...
    async def pause_generation(self) -> None: ...
    async def resume_generation(self) -> None: ...
    async def finish_session(self, session_id: str) -> None: ...

    def get_endpoint_url(self) -> str:
        raise NotImplementedError(NO_HTTP.format("URL"))

    async def chat_completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(NO_HTTP.format("chat completion"))

    async def render_chat_completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(NO_HTTP.format("chat rendering"))

    async def completion(self, request_payload: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(NO_HTTP.format("completion"))

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict[str, Any]:
        raise NotImplementedError(NO_HTTP.format("LoRA adapter"))
