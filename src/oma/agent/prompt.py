"""The step prompt and the projection of model text to an environment action (docs/training.md).

As in verl-agent's ALFWorld/WebShop prompts, each step's prompt holds the task, a window of the
last ``history_length`` (observation, action) pairs, the current observation and the admissible
actions; the model answers with one action.
"""

from __future__ import annotations

from collections.abc import Sequence

PROMPT_END = "\nAction:"
"""The prompt ends here; the response is the action text, then the end-of-sequence token."""


def step_prompt(task: str, history: Sequence[tuple[str, str]], observation: str, admissible: Sequence[str],
                history_length: int, show_actions: bool = True) -> str:
    """The last ``history_length`` (observation, action) pairs, the observation, the actions, the task.

    ``show_actions=False`` leaves out the ``Can:`` line of admissible actions: under constrained
    decoding the policy can write nothing else, and the line is about a quarter of a household
    prompt's tokens (studies/what-limits-learning/journal.md#what-limited-learning).

    The task is the last line before the answer. Most decisions copy a word of the task into the
    action (the object to take, the receptacle to put it on); a small model learns to copy from a
    fixed short distance much sooner than from a line whose distance varies with the number of
    admissible actions (measured on household: held-out greedy success of a 0.5M warm start rose
    from 0.06 to 0.22-0.28 after the same 10-12 SFT epochs when the task moved here).
    """
    lines = []
    if history_length > 0:
        for past_obs, past_action in history[-history_length:]:
            lines.append(f"Obs: {past_obs}")
            lines.append(f"Did: {past_action}")
    lines.append(f"Obs: {observation}")
    if show_actions:
        lines.append("Can: " + " | ".join(admissible))
    lines.append(f"Task: {task}")
    return "\n".join(lines) + PROMPT_END


def normalise(text: str) -> str:
    """Lower-case and collapse white space (how model text and actions are compared)."""
    return " ".join(text.lower().split())


def project_action(text: str, admissible: Sequence[str]) -> str | None:
    """The admissible action the model wrote, or None when it wrote none of them.

    The model's text up to its first newline is compared with each admissible action after
    :func:`normalise`; anything else (empty, truncated, an action of another state) is invalid.
    The caller sends invalid text to the environment as a no-op and charges the penalty.
    """
    first_line = text.split("\n", 1)[0]
    wanted = normalise(first_line)
    for action in admissible:
        if normalise(action) == wanted:
            return action
    return None
