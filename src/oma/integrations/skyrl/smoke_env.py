"""The multi-turn skyrl_gym environment of ``oma skyrl-smoke``, registered as ``oma_smoke``.

An episode is up to :data:`MAX_TURNS` model turns. It succeeds (reward 1) at the first turn whose
text holds a digit and ends there; a turn without one gets a user message back and the episode goes
on; an episode that never writes a digit runs all the turns and gets 0. So, as in real agent tasks,
failures take more turns than successes: the expansion-outcome coupling OMA is about. The same rule
as ``oma verl-smoke``'s agent loop (:mod:`oma.integrations.verl.smoke_agent`).
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

NAME = "oma_smoke"
MAX_TURNS = 4


class SmokeEnv(BaseTextEnv):
    """See the module docstring."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.max_turns = MAX_TURNS
        self.won = False

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        won = self.won = any(ch.isdigit() for ch in action)
        done = won or self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": f"step {self.turns}, you said: {action[-24:]}"}]
        return BaseTextEnvStepOutput(observations=observations, reward=float(won) if done else 0.0, done=done,
                                     metadata={"turns": self.turns, "won": won})

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "won": self.won}

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """Mean turns per episode, and per success and per failure (when the step has any); SkyRL logs them
        as ``environment/<key>``. Step-wise, SkyRL passes an empty dict for every step but an episode's last."""
        metrics = [m for m in metrics if "turns" in m]
        out: dict[str, Any] = {"turns": sum(m["turns"] for m in metrics) / len(metrics)} if metrics else {}
        for key, won in (("success_turns", True), ("failure_turns", False)):
            turns = [m["turns"] for m in metrics if m["won"] == won]
            if turns:
                out[key] = sum(turns) / len(turns)
        return out


def register() -> None:
    """Register :data:`NAME` with skyrl_gym (idempotent)."""
    import skyrl_gym

    if NAME not in skyrl_gym.registry:
        skyrl_gym.register(id=NAME, entry_point=f"{__name__}:SmokeEnv")
