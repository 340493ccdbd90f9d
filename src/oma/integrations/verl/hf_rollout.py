"""The ``hf`` rollout of verl 0.9.1 on CPU: Hugging Face ``generate`` behind verl's token-in,
token-out server interface (docs/verl.md#verl-on-cpu). Registered by :mod:`oma.integrations.verl.cpu`.

verl's hybrid mode puts a rollout *adapter* in every actor worker and one *server* per replica,
which the agent loops call. Here:

* :class:`HFServer` (a Ray actor named ``oma_hf_server_<replica>``) holds a copy of the model on
  the CPU and answers ``generate(prompt_ids, sampling_params)`` with the sampled token ids, their
  log-probabilities under the sampling distribution (temperature applied, as vLLM reports them) and
  ``extra_fields["global_steps"]``, the version of the weights that produced them;
* :class:`HFServerAdapter` (in each actor worker) receives the trainer's weights after every update
  (verl's ``naive`` checkpoint engine) and sends them to its replica's server; every rank iterates
  the weights (FSDP gathers them collectively), the replica's first rank sends them;
* :class:`HFReplica` starts the server.

Meant for tiny models and debugging, not for speed: one request is generated at a time.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from oma.integrations.verl import _verl_private
from oma.integrations.tiny_model import Sampler


def server_name(replica_rank: int) -> str:
    return f"oma_hf_server_{replica_rank}"


def _model_path(model_config: Any) -> str:
    for key in ("local_path", "path"):
        value = getattr(model_config, key, None) if not isinstance(model_config, dict) else model_config.get(key)
        if value:
            return str(value)
    raise ValueError("hf rollout: the model config has no path")


class HFServer(Sampler):
    """One replica's model and its ``generate`` (see the module docstring)."""

    def __init__(self, model_path: str, response_length: int, prompt_length: int, seed: int = 0) -> None:
        super().__init__(model_path, seed=seed)
        self.response_length = int(response_length)
        self.prompt_length = int(prompt_length)
        self.global_steps: int | None = None

    def _generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        params = dict(sampling_params)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_tokens is None:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        out_ids, out_logp, ended = self.sample(prompt_ids, max(1, int(max_tokens)), params)
        return TokenOutput(token_ids=out_ids, log_probs=out_logp, stop_reason="completed" if ended else "length",
                           extra_fields={"global_steps": self.global_steps})

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str | None = None,
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        if image_data or video_data:
            raise ValueError("hf rollout: text only (no image_data / video_data)")
        return await asyncio.to_thread(self._generate, list(prompt_ids), dict(sampling_params))

    def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> int:
        """Load the trainer's weights (names as the FSDP engine gives them); returns tensors loaded."""
        try:
            loaded = self.load_state(state)
        except ValueError as err:
            raise ValueError(f"hf rollout: {err}") from None
        self.global_steps = global_steps
        return loaded

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # verl's replica controls: nothing to free or resume on the CPU
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


class HFReplica(RolloutReplica):
    """verl rollout replica ``hf``: one :class:`HFServer` actor (it holds no Ray slot)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        name = server_name(self.replica_rank)
        server = ray.remote(HFServer).options(name=name, num_cpus=0, max_concurrency=self.max_concurrency).remote(
            _model_path(self.model_config), self.config.response_length, self.config.prompt_length,
            seed=self.replica_rank,
        )
        self.servers = [server]
        _verl_private.set_replica_server(self, server, name)


class HFServerAdapter(BaseRollout):
    """The rollout inside an actor worker: sends the trainer's weights to its replica's server."""

    def __init__(self, config, model_config, device_mesh, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank // world
        self.is_leader = rank % world == 0

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: int | None = None,
                             **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout: weights as {wire_format!r} are not supported (use the naive engine)")
        # every rank drains the generator (FSDP gathers each tensor collectively); only the leader keeps them
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights if self.is_leader}
        if self.is_leader:
            server = ray.get_actor(server_name(self.replica_rank))
            await server.load_weights.remote(state, global_steps)

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None
