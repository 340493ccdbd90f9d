"""The policy: any Hugging Face causal LM plus its tokenizer, sampling with a KV cache, log-probs.

No hub access is needed or attempted: the default policy is a tiny Qwen2 built from a config with a
byte-level BPE tokenizer trained locally on environment text; a user model is loaded from a local
directory (``local_files_only``). The tokenizer is saved in its own folder, without a model
``config.json``, and loaded as ``PreTrainedTokenizerFast`` so transformers never substitutes
another tokenizer class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from oma.core import token_entropy

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def checked_step(optimizer: torch.optim.Optimizer, params: Iterable[Tensor], where: str, key: str) -> None:
    """``optimizer.step()``, then FloatingPointError naming ``where`` and ``key`` (the learning rate to lower) when the
    step overflowed float32 or left a weight inf or NaN: sampling from such weights fails later, far from the cause."""
    try:
        optimizer.step()
    except RuntimeError as e:  # torch refuses a step size beyond float32 (a learning rate near its top, or over a tiny norm)
        if "overflow" not in str(e):
            raise
        raise FloatingPointError(f"{where}: the optimizer step overflowed float32 ({e}); lower {key}") from None
    if not all(bool(torch.isfinite(p).all()) for p in params):
        raise FloatingPointError(f"{where}: the optimizer step made weights inf or NaN; lower {key}")


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts`` (round-trips any text exactly)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[PAD, EOS, UNK], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)


def load_tokenizer(path: str | Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)


def tiny_model(vocab_size: int, *, hidden: int, layers: int, heads: int, max_positions: int, seed: int):
    """A small Qwen2 causal LM built from a config (no download), deterministic in ``seed``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_positions,
        tie_word_embeddings=True, attention_dropout=0.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def load_model(path: str | Path):
    """A causal LM from a local Hugging Face directory; a clear error when it is not one."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"policy.model: {str(path)!r} is not a directory (expected a local Hugging Face model folder)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"policy.model: {str(path)!r} has no config.json; expected a Hugging Face model folder")
    try:
        return AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # noqa: BLE001 — any error here is the folder's (a config.json with "hidden_size": "big"
        # raises huggingface_hub's own Exception subclass), and the user's to fix
        raise model_folder_error(path, e) from None


def model_folder_error(path: str | Path, err: Exception) -> Exception:
    """The error of a model folder that transformers cannot load, one line naming ``policy.model``."""
    from oma.errors import ConfigError

    return ConfigError(f"policy.model: {str(path)!r} cannot be loaded as a Hugging Face model "
                       f"({' '.join(str(err).split())[:300]})")


@dataclass
class Generation:
    """Sampled responses: token ids (ending with EOS when the model stopped) and decoded text.

    ``allowed`` (constrained decoding only): per response, the (position, token) pairs the
    constraint allowed, for :func:`response_logprobs` to renormalise over the same tokens.
    """

    response_ids: list[list[int]]
    texts: list[str]
    allowed: list[Tensor] | None = None
    logp: list[list[float]] | None = None
    """Per response token: its log-probability under the (constrained) distribution it was sampled
    from, softmax(z / T) at the sampling temperature T (T = 1 when greedy), the distribution training
    scores (a forced token's is exactly 0), so rollouts need no second pass for ``logp_old``."""
    entropy: list[list[float]] | None = None
    """Per response token: the entropy (nats) of that same distribution."""


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask) of left-padded sequences, so every sequence ends at the last column."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


Choices = list[list[int]]
"""The admissible actions of one step as token ids, each ending with EOS (constrained decoding)."""

_MASKED = -1e9  # finite: exp() underflows to exactly 0 while log-probs and gradients stay finite


def action_choices(tokenizer, actions: Sequence[str]) -> Choices:
    """Token ids of each action followed by EOS: what constrained decoding may produce."""
    eos = tokenizer.eos_token_id
    return [ids + [eos] for ids in tokenizer(list(actions), add_special_tokens=False)["input_ids"]]


def allowed_next(choices: Choices, prefix: Sequence[int]) -> list[int]:
    """Tokens that continue ``prefix`` toward one of ``choices`` (a token trie, walked on demand)."""
    n, prefix = len(prefix), list(prefix)
    return sorted({c[n] for c in choices if len(c) > n and c[:n] == prefix})


def forced_rest(choices: Choices, prefix: Sequence[int]) -> list[int] | None:
    """The rest of the one choice that ``prefix`` still leads to, or None while several remain.

    Once only one admissible action continues ``prefix``, every later token has constrained
    probability 1 (log-prob exactly 0): :func:`generate` appends them without a forward pass.
    """
    n, prefix = len(prefix), list(prefix)
    rest = {tuple(c[n:]) for c in choices if c[:n] == prefix}
    return list(next(iter(rest))) if len(rest) == 1 else None


def unique_index(keys: Sequence[object]) -> tuple[list[int], Tensor]:
    """(first position of each distinct key, inverse [len(keys)]): ``keys[first[inverse[i]]] == keys[i]``."""
    slot: dict[object, int] = {}
    firsts: list[int] = []
    inverse: list[int] = []
    for i, key in enumerate(keys):
        u = slot.get(key)
        if u is None:
            u = slot[key] = len(firsts)
            firsts.append(i)
        inverse.append(u)
    return firsts, torch.tensor(inverse, dtype=torch.long)


def allowed_positions(choices: Choices, response: Sequence[int]) -> Tensor:
    """int64 [n, 2] of (position, token): what constrained decoding allowed at each step of ``response``."""
    pairs = [(t, v) for t in range(len(response)) for v in allowed_next(choices, response[:t])]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def allowed_rows(allowed: Sequence[Tensor]) -> Tensor:
    """long [n]: the row of each (position, token) pair of ``allowed``, in the order ``torch.cat`` joins them."""
    return torch.repeat_interleave(torch.arange(len(allowed)), torch.tensor([len(a) for a in allowed], dtype=torch.long))


def allowed_mask(allowed: Sequence[Tensor], width: int, vocab: int) -> Tensor:
    """bool [R, width, V] from each row's (position, token) pairs, in one indexed write."""
    mask = torch.zeros(len(allowed), width, vocab, dtype=torch.bool)
    rows = allowed_rows(allowed)
    pairs = torch.cat(list(allowed))
    mask[rows, pairs[:, 0], pairs[:, 1]] = True
    return mask


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
             generator: torch.Generator | None, choices: Sequence[Choices] | None = None) -> Generation:
    """Sample a response for every prompt in one batch, with a KV cache; greedy when temperature is 0.

    With ``choices`` (per prompt, the admissible actions' token ids ending with EOS) decoding is
    constrained: each token is drawn from the model's distribution renormalised over the tokens
    that continue some admissible action, so every response is exactly one of them (its length,
    not ``max_new_tokens``, bounds the loop). Once a single action remains, its remaining tokens
    (probability 1) are appended without a forward pass (:func:`forced_rest`). Identical prompts
    (the n episodes of a task at their first steps) are prefilled once and their KV cache shared.
    Sampling draws from ``generator`` only, so a rollout is reproducible from its seed (and a
    resumed run samples what an uninterrupted one would). The recorded log-probs and entropies are
    those of the distribution sampled from, softmax(z / T) (verl's convention; T = 1 when greedy).
    """
    eos = tokenizer.eos_token_id
    firsts, expand = unique_index([tuple(p) for p in prompt_ids])
    ids, mask = left_pad([prompt_ids[i] for i in firsts], tokenizer.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    logits_last, mask = out.logits[expand, -1], mask[expand]
    past = out.past_key_values
    if len(firsts) < len(prompt_ids):
        past.reorder_cache(expand)  # one cache row per prompt again (index_select along the batch)
    batch = len(prompt_ids)
    responses: list[list[int]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    steps = max(len(c) for ch in choices for c in ch) if choices is not None else max_new_tokens
    pairs: list[list[tuple[int, int]]] = [[] for _ in range(batch)]
    logps: list[list[float]] = [[] for _ in range(batch)]
    entropies: list[list[float]] = [[] for _ in range(batch)]
    scale = temperature if temperature > 0 else 1.0
    for step in range(steps):
        logits = logits_last.float() / scale
        if choices is not None:
            allowed = torch.zeros_like(logits, dtype=torch.bool)
            for i in (~done).nonzero().squeeze(-1).tolist():
                ok = allowed_next(choices[i], responses[i])
                allowed[i, ok] = True
                pairs[i] += [(step, v) for v in ok]
            allowed[done] = True
            logits = logits.masked_fill(~allowed, _MASKED)
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)
        else:
            nxt = logits.argmax(-1)
        logp_all = torch.log_softmax(logits, dim=-1)  # the distribution sampled from, which training scores
        logp_nxt = logp_all.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).tolist()
        entropy = token_entropy(logits.unsqueeze(1), torch.ones(batch, 1, dtype=torch.bool))[:, 0].tolist()
        for i in (~done).nonzero().squeeze(-1).tolist():
            responses[i].append(int(nxt[i]))
            logps[i].append(logp_nxt[i])
            entropies[i].append(entropy[i])
            rest = forced_rest(choices[i], responses[i]) if choices is not None else None
            if rest:
                pairs[i] += [(len(responses[i]) + k, v) for k, v in enumerate(rest)]
                responses[i] += rest
                logps[i] += [0.0] * len(rest)
                entropies[i] += [0.0] * len(rest)
                done[i] = True
        done |= nxt == eos
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=torch.long)], dim=1)
        positions = mask.sum(-1, keepdim=True) - 1
        out = model(input_ids=nxt.unsqueeze(-1), attention_mask=mask, position_ids=positions,
                    past_key_values=past, use_cache=True)
        logits_last, past = out.logits[:, -1], out.past_key_values
    texts = [tokenizer.decode([t for t in r if t != eos]) for r in responses]
    allowed_pairs = [torch.tensor(p, dtype=torch.long).reshape(-1, 2) for p in pairs] if choices is not None else None
    return Generation(responses, texts, allowed_pairs, logps, entropies)


def response_logprobs(model, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                      pad_id: int, *, with_entropy: bool = False, allowed: Sequence[Tensor] | None = None,
                      temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor | None]:
    """log π_T(response token | prompt, earlier response tokens) for a batch of rows, π_T = softmax(z / T).

    Each row is prompt + response, left-padded so all responses end at the last column; only the
    last positions are projected to the vocabulary (``logits_to_keep``). Returns ``(logp [R, L],
    response_mask [R, L], entropy [R, L] or None)`` with L the longest response, each response in
    columns 0..len-1 and ``response_mask`` True exactly there; ``entropy`` is that of the
    distribution each response token was drawn from (:func:`oma.core.token_entropy`). With
    ``allowed`` (each row's (position, token) pairs, :attr:`Generation.allowed` or
    :func:`allowed_positions`) the distributions are the constrained ones :func:`generate` sampled from.
    ``temperature`` T divides the logits, as verl's actor does with its rollout temperature: the policy
    RL trains is the one the rollouts sample from (T = 1: the model's own distribution, as in SFT).
    """
    width = max(len(r) for r in response_ids)
    ids, mask = left_pad([list(p) + list(r) for p, r in zip(prompt_ids, response_ids)], pad_id)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    # The last `width` + 1 positions are all that can predict response tokens.
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=width + 1).logits
    logits = logits[:, :-1].float() / temperature  # position j predicts ids[:, -width + j]
    lengths = torch.tensor([len(r) for r in response_ids])
    col = torch.arange(width).unsqueeze(0)
    response_mask = col < lengths.unsqueeze(-1)
    # Response token t of row r sits at tail column width - len_r + t: move it to column t.
    src = ((width - lengths).unsqueeze(-1) + col).clamp_max(width - 1)
    logits = logits.gather(1, src.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    targets = ids[:, -width:].gather(1, src)
    if allowed is not None:
        keep = allowed_mask(allowed, width, logits.shape[-1]) | ~response_mask.unsqueeze(-1)
        logits = logits.masked_fill(~keep, _MASKED)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logp = torch.where(response_mask, logp, torch.zeros((), dtype=logp.dtype))
    entropy = token_entropy(logits, response_mask) if with_entropy else None
    return logp, response_mask, entropy


# ================================================================================================
# The action-level policy (``policy.normalise=action``): a softmax over whole admissible actions
# ================================================================================================


def choices_tensor(choices: Choices) -> Tensor:
    """int64 [k, w]: the k admissible actions' token ids, padded with -1 (how a row records them)."""
    width = max(len(c) for c in choices)
    out = torch.full((len(choices), width), -1, dtype=torch.long)
    for i, c in enumerate(choices):
        out[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    return out


def choices_of(encoded: Tensor) -> Choices:
    """The inverse of :func:`choices_tensor`."""
    return [[int(t) for t in row if t >= 0] for row in encoded]


def action_scores(model, prompt_ids: Sequence[Sequence[int]], choices: Sequence[Choices], pad_id: int) -> tuple[Tensor, Tensor]:
    r"""``(scores [R, K], valid [R, K])``: s(a | p) = Σ_t log p_LM(a_t | p, a_<t) of each admissible action.

    The language model's own (unconstrained, T = 1) likelihood of every action string of every
    prompt, EOS included; K is the largest admissible set, ``valid`` marks the real entries. Each
    distinct prompt is run once, its KV cache copied to its actions, and all actions of the batch
    then run as one batch, so the cost is about the prompt's plus the actions' tokens (not k
    prompts). Differentiable: training calls it with gradients on.
    """
    firsts, expand = unique_index([tuple(p) for p in prompt_ids])
    ids, mask = left_pad([prompt_ids[i] for i in firsts], pad_id)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    owner = torch.tensor([r for r, ch in enumerate(choices) for _ in ch], dtype=torch.long)
    flat = [c for ch in choices for c in ch]
    source = expand[owner]  # the distinct prompt each action continues
    past = out.past_key_values
    past.reorder_cache(source)
    lengths = torch.tensor([len(c) for c in flat], dtype=torch.long)
    width = int(lengths.max())
    action_mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(-1)  # right-padded
    action_ids = torch.full((len(flat), width), pad_id, dtype=torch.long)
    action_ids[action_mask] = torch.tensor([t for c in flat for t in c], dtype=torch.long)  # row-major: in order
    prompt_mask = mask[source]
    attention = torch.cat([prompt_mask, action_mask.long()], dim=1)
    positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(width).unsqueeze(0)
    # The prompt's last position predicts each action's first token; action token t predicts t + 1.
    first = out.logits[source, -1:]
    if width > 1:
        rest = model(input_ids=action_ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1],
                     past_key_values=past, use_cache=True).logits
        logits = torch.cat([first, rest], dim=1)
    else:
        logits = first
    token_logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, action_ids.unsqueeze(-1)).squeeze(-1)
    per_action = (token_logp * action_mask).sum(-1)
    counts = torch.tensor([len(ch) for ch in choices], dtype=torch.long)
    valid = torch.arange(int(counts.max())).unsqueeze(0) < counts.unsqueeze(-1)
    scores = torch.full(valid.shape, _MASKED, dtype=per_action.dtype)
    scores = scores.masked_scatter(valid, per_action)
    return scores, valid


def action_distribution(scores: Tensor, valid: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """(log π_T [R, K], entropy of π_T [R]) for π_T(a | s) = softmax_a(s(a | p) / T) over the valid actions."""
    logits = scores.masked_fill(~valid, _MASKED) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = token_entropy(logits.unsqueeze(1), torch.ones(len(logits), 1, dtype=torch.bool))[:, 0]
    return logp_all, entropy


@torch.no_grad()
def generate_actions(model, tokenizer, prompt_ids: Sequence[Sequence[int]], *, temperature: float,
                     generator: torch.Generator | None, choices: Sequence[Choices]) -> Generation:
    r"""One admissible action per prompt from the action-level policy π_T(a | s) = softmax_a(s(a | p) / T).

    s is :func:`action_scores`; greedy (``temperature`` 0) takes the first best action, at T = 1.
    This is GLAM's policy (Carta et al. 2023, "Grounding Large Language Models in Interactive
    Environments with Online Reinforcement Learning"): the whole action is one choice, so no token
    decides for the rest (under token-level constrained decoding the receptacle type is chosen
    before its number; studies/action-level-policy/journal.md#an-action-level-policy-glam). As the tabular policy does,
    each response token records the action's log-prob and the entropy of π_T(· | s), so the
    ``algo.reducer`` counts the action's choice once per token of it. ``allowed`` records each
    row's admissible actions (:func:`choices_tensor`).
    """
    scores, valid = action_scores(model, prompt_ids, choices, tokenizer.pad_token_id)
    scale = temperature if temperature > 0 else 1.0
    logp_all, entropy = action_distribution(scores, valid, scale)
    if temperature > 0:
        pick = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
    else:
        pick = logp_all.argmax(-1)
    logp = logp_all.gather(-1, pick.unsqueeze(-1)).squeeze(-1).tolist()
    eos = tokenizer.eos_token_id
    responses = [list(ch[k]) for ch, k in zip(choices, pick.tolist())]
    texts = [tokenizer.decode([t for t in r if t != eos]) for r in responses]
    return Generation(responses, texts, [choices_tensor(ch) for ch in choices],
                      [[lp] * len(r) for lp, r in zip(logp, responses)],
                      [[float(h)] * len(r) for h, r in zip(entropy.tolist(), responses)])


def action_response_logprobs(model, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]],
                             allowed: Sequence[Tensor], pad_id: int, *, with_entropy: bool = False,
                             temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`response_logprobs` for the action-level policy: every token of a row's response holds
    log π_T(a | s) of its whole action a among the row's ``allowed`` actions (:func:`choices_tensor`),
    and ``entropy`` that of π_T(· | s); the same ``(logp [R, L], response_mask [R, L], entropy)`` shapes."""
    choices = [choices_of(a) for a in allowed]
    chosen = []
    for r, (ch, resp) in enumerate(zip(choices, response_ids)):
        try:
            chosen.append(ch.index(list(resp)))
        except ValueError:
            raise ValueError(f"row {r}: its response is not one of its allowed actions") from None
    scores, valid = action_scores(model, prompt_ids, choices, pad_id)
    logp_all, entropy = action_distribution(scores, valid, temperature)
    logp_action = logp_all.gather(-1, torch.tensor(chosen).unsqueeze(-1))  # [R, 1]
    lengths = torch.tensor([len(r) for r in response_ids])
    mask = torch.arange(int(lengths.max())).unsqueeze(0) < lengths.unsqueeze(-1)
    zero = torch.zeros((), dtype=logp_all.dtype)
    logp = torch.where(mask, logp_action, zero)
    return logp, mask, torch.where(mask, entropy.unsqueeze(-1), zero) if with_entropy else None
