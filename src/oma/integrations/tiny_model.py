"""A tiny causal LM for CPU runs of a host framework (``oma verl-smoke``, ``oma skyrl-smoke``): a
byte-level ChatML tokenizer and a 2-layer Qwen2 built from its config with random weights. No network.

* :func:`build_tokenizer` (256 byte tokens and ChatML's three specials) and :func:`build_model` write
  a Hugging Face folder that ``from_pretrained`` loads like any model;
* :class:`Sampler` is Hugging Face forward passes with a KV cache, sampling with temperature /
  top-k / top-p and reporting each token's log-probability under the sampling distribution, as vLLM
  does, and loading a trainer's weights: the engine behind oma's CPU rollouts (:mod:`oma.integrations.verl.hf_rollout`,
  :mod:`oma.integrations.skyrl.hf_generator`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_alphabet() -> list[str]:
    """The 256 printable stand-ins of byte-level BPE (printable bytes map to themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=pad,
        eos_token_id=eos, pad_token_id=pad, torch_dtype="bfloat16",
    )
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, bos_token_id=pad).save_pretrained(out)


def build(model_dir: Path):
    """Tokenizer and model in ``model_dir``; returns the tokenizer."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(model_dir)
    assert tokenizer.decode(tokenizer("ok 12")["input_ids"]) == "ok 12"
    build_model(model_dir, tokenizer)
    return tokenizer


def sample_logprobs(logits, temperature: float):
    """log-softmax of ``logits / temperature`` (temperature 0: greedy, reported at temperature 1)."""
    import torch

    scale = temperature if temperature and temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / scale, dim=-1)


def filtered(probs, top_k: int, top_p: float):
    """Top-k, then nucleus (top-p) filtering of a probability vector (renormalised by multinomial)."""
    import torch

    if 0 < top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < top_p * sorted_p.sum()
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    return probs


class Sampler:
    """A Hugging Face model on the CPU (float32, eager attention, one thread) that samples token by token
    and takes new weights: the engine of oma's CPU rollouts. One request at a time (a lock)."""

    def __init__(self, model_path: str, seed: int = 0) -> None:
        import threading

        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        # local_files_only: a path that is not a local folder must fail here, not reach for the Hub and run its code
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager",
                                                          local_files_only=True).eval()
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()
        config = self.model.generation_config
        eos = config.eos_token_id if config.eos_token_id is not None else self.model.config.eos_token_id
        self.eos: set[int] = set(eos if isinstance(eos, list) else [eos]) - {None}

    def sample(self, prompt_ids: list[int], max_tokens: int, params: dict[str, Any]) -> tuple[list[int], list[float], bool]:
        """Up to ``max_tokens`` tokens after ``prompt_ids`` with vLLM's ``temperature``, ``top_k``, ``top_p``
        (missing: 1, all, 1): (token ids, their log-probabilities under the sampling distribution, whether
        an end-of-sequence token ended them). Temperature 0 is greedy."""
        import torch

        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0) or 1.0)
        out_ids: list[int] = []
        out_logp: list[float] = []
        past = None
        with self.lock, torch.no_grad():
            step_input = torch.tensor([list(prompt_ids)], dtype=torch.int64)
            for _ in range(max(1, int(max_tokens))):
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logp = sample_logprobs(out.logits[0, -1], temperature)
                if temperature <= 0:
                    token = int(torch.argmax(logp))
                else:
                    token = int(torch.multinomial(filtered(logp.exp(), top_k, top_p), 1, generator=self.generator))
                out_ids.append(token)
                out_logp.append(float(logp[token]))
                if token in self.eos:
                    break
                step_input = torch.tensor([[token]], dtype=torch.int64)
        return out_ids, out_logp, bool(out_ids) and out_ids[-1] in self.eos

    def load_state(self, state: dict[str, Any]) -> int:
        """Load a trainer's weights (the model's own parameter names, any dtype); returns tensors loaded.
        Raises ``ValueError`` naming the weights the model does not have."""
        with self.lock:
            own = self.model.state_dict()
            unknown = sorted(set(state) - set(own))
            if unknown:
                raise ValueError(f"weights the model does not have: {unknown[:5]}")
            self.model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)
        return len(state)
