"""The offline inputs of ``oma verl-smoke`` and tests/gpu/verl_oma_smoke.sh: a tiny Qwen2 model
from config (random weights), a byte-level ChatML tokenizer (:mod:`oma.integrations.tiny_model`),
and a small prompt parquet. No network.

Usage: python -m oma.integrations.verl.smoke_inputs OUT_DIR
Writes OUT_DIR/model (config, safetensors, tokenizer) and OUT_DIR/data/{train,val}.parquet.
"""

from __future__ import annotations

import sys
from pathlib import Path

from oma.integrations.tiny_model import build


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
    build(root / "model")
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
