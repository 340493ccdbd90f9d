"""The tabular policy: a softmax table over (anchor state, admissible action) logits.

It stands in for the LM where the question is the *accounting* (docs/experiments.md#the-tabular-lane):
the same rollouts, rows, :mod:`oma.core` advantages, weights and objectives and the same
``oma train`` loop, but an update that costs microseconds, so hundreds of seeds are affordable.

    π(a | s) = exp θ[s, a] / Σ_{a' ∈ A(s)} exp θ[s, a']

``s`` is ``env.anchor()`` (the environment's name for the current state) and ``A(s)`` the
admissible actions; a state's logits start at 0, so an unvisited state is uniform. The logits live
in one parameter of ``capacity`` entries (``policy.table_size``); an index assigns each (state,
action) pair its entry the first time the policy meets it, in a deterministic order, and is saved
with the weights (:meth:`TabularPolicy.index_state`), so a resumed run continues the same table.

**Tokens.** A row of the LM policy has one log-prob per generated token, and its loss weight
(``algo.reducer``) depends on how many tokens it has. The tabular policy's row for action ``a`` has
:func:`action_tokens` tokens (a stand-in for the default tokenizer: words + end-of-sequence), and
every one of them carries log π(a | s) (and the entropy of π(· | s)): the action's choice counted
once per token. So a row's gradient is proportional to the total weight of its tokens, as when every
token of an LM response carries gradient (free-text decoding, verl-agent's setup): under token-mean
a long action weighs more than a short one, and a trajectory's objective mass is its influence. Per
token the ratio is the action's ratio π(a | s) / π_old(a | s), so PPO-clip clips actions, and GSPO's
sequence ratio (the geometric mean over tokens) is the action's ratio too.

Row encoding (what :class:`oma.agent.rollout.Rows` holds for this policy): ``prompt_ids = [state
id]``; ``response_ids`` = the chosen action's table entry, repeated once per token; ``allowed`` =
the table entries of the admissible actions, in the environment's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from oma.agent.policy import Generation
from oma.agent.rollout import LiveEpisode, Rollout, run_episodes
from oma.core import token_entropy
from oma.errors import ConfigError

_MASKED = -1e9  # padding of ragged admissible sets: exp() underflows to exactly 0, gradients stay finite


def action_tokens(action: str) -> int:
    """The stand-in token count of ``action``: its words plus one end-of-sequence token.

    The default tokenizer (a 1024-entry BPE trained on environment text) spends about one token per
    word of environment text; words + 1 keeps the ordering and the ratios between actions without
    training a tokenizer.
    """
    return len(action.split()) + 1


class TabularPolicy(torch.nn.Module):
    """Logits θ[s, a] of a softmax policy over admissible actions, one entry per (state, action) met."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if capacity < 1:
            raise ValueError(f"policy.table_size must be >= 1, got {capacity}")
        try:
            self.logits = torch.nn.Parameter(torch.zeros(capacity))
        except RuntimeError as e:  # torch's CPU allocator refusing the request
            if "allocate" not in str(e):
                raise
            raise ConfigError(f"policy.table_size={capacity} needs {4 * capacity / 2**30:.1f} GiB of float32 logits, more "
                              "than this machine can allocate") from None
        self._states: dict[str, int] = {}
        self._entries: dict[tuple[str, str], int] = {}
        self._allowed_cache: dict[tuple[str, ...], Tensor] = {}

    # --- the index -------------------------------------------------------------------------------

    def state_id(self, state: str) -> int:
        """The id of ``state`` (assigned on first sight)."""
        return self._states.setdefault(state, len(self._states))

    def entry(self, state: str, action: str) -> int:
        """The table entry of (``state``, ``action``) (assigned on first sight)."""
        key = (state, action)
        e = self._entries.get(key)
        if e is None:
            e = len(self._entries)
            if e >= self.logits.numel():
                raise ConfigError(f"policy.table_size={self.logits.numel()} is full: the policy has met more "
                                 "(state, action) pairs than that; raise policy.table_size")
            self._entries[key] = e
        return e

    @property
    def entries(self) -> int:
        """How many (state, action) pairs the table holds."""
        return len(self._entries)

    def index_state(self) -> dict:
        """The index as JSON (checkpoints keep it beside the logits: safetensors holds tensors only)."""
        return {"states": list(self._states), "entries": [list(k) for k in self._entries]}

    def load_index_state(self, state: dict) -> None:
        self._states = {s: i for i, s in enumerate(state["states"])}
        self._entries = {(s, a): i for i, (s, a) in enumerate(state["entries"])}
        self._allowed_cache = {}

    # --- acting and scoring ----------------------------------------------------------------------

    def _padded(self, allowed: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """(logits [R, k], valid [R, k]) of each row's admissible entries, padded to the largest set."""
        k = max(len(a) for a in allowed)
        idx = torch.zeros(len(allowed), k, dtype=torch.long)
        valid = torch.arange(k).unsqueeze(0) < torch.tensor([len(a) for a in allowed]).unsqueeze(-1)
        idx[valid] = torch.cat(list(allowed))
        return self.logits[idx].masked_fill(~valid, _MASKED), valid

    def _allowed(self, state: str, actions: Sequence[str]) -> Tensor:
        """The entries of ``actions`` in ``state`` (cached: a rollout meets the same states again and again)."""
        key = (state, *actions)
        allowed = self._allowed_cache.get(key)
        if allowed is None:
            allowed = self._allowed_cache[key] = torch.tensor([self.entry(state, a) for a in actions], dtype=torch.long)
        return allowed

    @torch.no_grad()
    def act(self, states: Sequence[str], admissible: Sequence[Sequence[str]], *, temperature: float,
            generator: torch.Generator | None) -> Generation:
        """One action per state, sampled from π_T = softmax(logits / T) at T = ``temperature`` (greedy
        at 0: the first best action).

        Log-probs and entropies are those of π_T (π itself when greedy), the distribution training
        scores, as :func:`oma.agent.policy.generate` records them.
        """
        allowed = [self._allowed(s, acts) for s, acts in zip(states, admissible)]
        logits, _ = self._padded(allowed)
        logits = logits / (temperature if temperature > 0 else 1.0)
        if temperature > 0:
            choice = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)
        else:
            choice = logits.argmax(-1)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, choice.unsqueeze(-1)).squeeze(-1).tolist()
        entropy = _entropy(logits).tolist()
        texts = [acts[c] for acts, c in zip(admissible, choice.tolist())]
        responses = [[int(a[c])] * action_tokens(t) for a, c, t in zip(allowed, choice.tolist(), texts)]
        return Generation(responses, texts, allowed, [[lp] * len(r) for lp, r in zip(logp, responses)],
                          [[h] * len(r) for h, r in zip(entropy, responses)])

    def response_logprobs(self, response_ids: Sequence[Sequence[int]], allowed: Sequence[Tensor], *,
                          with_entropy: bool = False, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(logp [R, L], response_mask [R, L], entropy [R, L] or None)`` as the LM's
        :func:`oma.agent.policy.response_logprobs` returns them: each of a row's tokens holds
        log π_T(a | s) (and the entropy of π_T(· | s)), 0 past its length, π_T = softmax(logits / T)."""
        lengths = torch.tensor([len(r) for r in response_ids])
        width = int(lengths.max())
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(-1)
        logits, valid = self._padded(allowed)
        logits = logits / temperature
        chosen = torch.tensor([r[0] for r in response_ids], dtype=torch.long)
        padded_entries = torch.zeros_like(valid, dtype=torch.long)
        padded_entries[valid] = torch.cat(list(allowed))
        position = ((padded_entries == chosen.unsqueeze(-1)) & valid).long().argmax(-1)
        logp_all = torch.log_softmax(logits, dim=-1)
        zero = torch.zeros((), dtype=logp_all.dtype)
        logp = torch.where(mask, logp_all.gather(-1, position.unsqueeze(-1)), zero)
        entropy = None
        if with_entropy:
            entropy = torch.where(mask, _entropy(logits).unsqueeze(-1), zero)
        return logp, mask, entropy


def _entropy(logits: Tensor) -> Tensor:
    """Entropy [R] of each row's distribution over its (padded) admissible actions."""
    return token_entropy(logits.unsqueeze(1), torch.ones(len(logits), 1, dtype=torch.bool))[:, 0]


def tabular_rollout(make_env: Callable[[], object], policy: TabularPolicy, task_seeds: Sequence[int], *,
                    group_size: int, temperature: float, invalid_penalty: float, generator: torch.Generator | None,
                    traj_offset: int = 0, max_steps: int | None = None) -> Rollout:
    """:func:`oma.agent.rollout.rollout` for the tabular policy: same episodes, rows and ids."""

    def act(lives: list[LiveEpisode]) -> tuple[list[list[int]], Generation]:
        states = [lv.env.anchor() for lv in lives]
        gen = policy.act(states, [lv.info["admissible_actions"] for lv in lives], temperature=temperature,
                         generator=generator)
        return [[policy.state_id(s)] for s in states], gen

    ro = run_episodes(make_env, act, task_seeds, group_size=group_size, invalid_penalty=invalid_penalty,
                      traj_offset=traj_offset, max_steps=max_steps)
    ro.rows.kind = "tabular"
    return ro


def imitate(policy: TabularPolicy, demos: Sequence[tuple[str, str, Sequence[str]]]) -> None:
    """The few-episode imitation warm start: θ[s, a] = log(1 + n(s, a)) for every admissible ``a``.

    ``demos`` are (state, expert action, admissible actions) of noisy-expert episodes; n(s, a)
    counts how often the expert chose ``a`` in ``s``. It is the maximum-likelihood table under
    add-one (Laplace) smoothing: π(a | s) = (1 + n(s, a)) / (|A(s)| + n(s)), uniform where no
    demonstration reached. Closed form, so it is exact, instant and deterministic.
    """
    counts: dict[int, int] = {}
    for state, expert, admissible in demos:
        for a in admissible:
            counts.setdefault(policy.entry(state, a), 0)
        counts[policy.entry(state, expert)] += 1
    with torch.no_grad():
        entries = torch.tensor(list(counts), dtype=torch.long)
        policy.logits[entries] = torch.log1p(torch.tensor(list(counts.values()), dtype=torch.float))
