"""Inputs of a CPU verl-agent run: oma's tiny Qwen2 + byte tokenizer, and the text-mode parquet
verl-agent's examples/data_preprocess/prepare.py would write (its rows only carry modality and count)."""
import sys
from pathlib import Path

import pandas as pd

from oma.integrations.tiny_model import build

work = Path(sys.argv[1])
build(work / "model")
for split, n in (("train", 64), ("test", 8)):
    rows = [{"data_source": "text", "prompt": [{"role": "user", "content": ""}], "ability": "agent",
             "extra_info": {"split": split, "index": i}} for i in range(n)]
    (work / "data").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(work / "data" / f"{split}.parquet")
print("ok", work)
