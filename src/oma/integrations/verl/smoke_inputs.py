"""The offline inputs of ``oma verl-smoke`` and tests/gpu/verl_oma_smoke.sh: a tiny Qwen2 model
from config (random weights), a byte-level ChatML tokenizer, and a small prompt parquet. No network.

Usage: python -m oma.integrations.verl.smoke_inputs OUT_DIR
Writes OUT_DIR/model (config, safetensors, tokenizer) and OUT_DIR/data/{train,val}.parquet.
"""

from __future__ import annotations

import sys
from pathlib import Path

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


def build_data(out: Path, rows: int = 64) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [
        {
            "data_source": "oma_smoke",
            "prompt": [{"role": "user", "content": f"Task {i}: answer with digits, one step at a time."}],
            "ability": "smoke",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(rows)
    ]
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), out / "train.parquet")
    pq.write_table(pa.Table.from_pylist(records[:8]), out / "val.parquet")


def build_inputs(root: Path) -> None:
    """OUT_DIR/model and OUT_DIR/data (see the module docstring)."""
    model_dir = root / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(model_dir)
    assert tokenizer.decode(tokenizer("ok 12")["input_ids"]) == "ok 12"
    build_model(model_dir, tokenizer)
    build_data(root / "data")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    build_inputs(Path(argv[0]))
    print(f"smoke inputs in {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
