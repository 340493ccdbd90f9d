"""The multi-step agent loop of ``oma verl-smoke`` and tests/gpu/verl_oma_smoke.sh (verl 0.9.1
AgentLoop API), registered as ``oma_smoke_multistep``.

Each session is one episode of up to 4 model turns; every turn is returned as its own
AgentLoopOutput (verl-agent style: one training row per step), so verl keys the rows
``{uid}_{session_id}_{index}`` and oma's trainer sees trajectories of different lengths. The
episode succeeds (reward 1) at the first turn whose text contains a digit and ends there; an
episode that never writes one runs all 4 turns and gets 0. So, as in real agent tasks, failures
are longer than successes: the expansion-outcome coupling OMA is about. The reward is put on the
last output (verl copies it to the others). verl imports this module from the agent-loop config.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.utils.profiler import simple_timer

MAX_STEPS = 4


@register("oma_smoke_multistep")
class MultiStepSmokeAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput]:
        task = list(kwargs["raw_prompt"])
        response_length = int(self.rollout_config.response_length)
        outputs: list[AgentLoopOutput] = []
        won, last = False, ""
        for step in range(MAX_STEPS):
            messages = task if step == 0 else task + [{"role": "user", "content": f"step {step}, you said: {last[-24:]}"}]
            prompt_ids = await self.ct_build_initial_tokens(messages)
            metrics: dict[str, Any] = {}
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(
                    request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params
                )
            response_ids = list(out.token_ids[:response_length]) or [self.tokenizer.eos_token_id]
            logprobs = list(out.log_probs[: len(response_ids)]) if out.log_probs else None
            if logprobs is not None and len(logprobs) != len(response_ids):
                logprobs = None
            last = self.tokenizer.decode(response_ids, skip_special_tokens=True)
            won = any(ch.isdigit() for ch in last)
            outputs.append(
                AgentLoopOutput(
                    prompt_ids=prompt_ids,
                    response_ids=response_ids,
                    response_mask=[1] * len(response_ids),
                    response_logprobs=logprobs,
                    num_turns=2,
                    metrics=metrics,
                    # the server's own fields (global_steps, min/max_global_steps: the weights version that
                    # generated the turn) go through, as verl's single-turn loop passes them; verl's trainer
                    # reads min_global_steps of every row after the first update
                    extra_fields={**out.extra_fields, "turn_scores": [], "tool_rewards": []},
                )
            )
            if won:
                break
        outputs[-1].reward_score = float(won)
        outputs[-1].extra_fields["reward_extra_info"] = {}
        return outputs
