"""The public oma.train API: every name it promises imports, and a tiny tabular run trains, resumes and
reads back through it alone."""

import gzip
import io
from pathlib import Path

from rich.console import Console

import oma.train
from oma.train import load_config, load_run_config, read_metrics, to_dict, train

ROOT = Path(__file__).resolve().parents[1]
TINY_TABULAR = ["iterations=2", "env.eval_tasks=4", "env.tasks_per_iter=4"]


def test_every_public_name_imports():
    assert len(set(oma.train.__all__)) == len(oma.train.__all__)
    for name in oma.train.__all__:
        assert getattr(oma.train, name) is not None, name
    namespace: dict = {}
    exec("from oma.train import *", namespace)
    assert set(oma.train.__all__) <= set(namespace)


def test_a_tiny_tabular_run_through_the_public_api(tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(ROOT / "configs" / "chain-tabular-grpo.yaml", [*TINY_TABULAR, f"out_dir={run_dir}"])
    quiet = Console(file=io.StringIO())
    summary = train(cfg, run_dir, console=quiet)
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2] and summary["iterations"] == 2
    assert summary["eval_success_end"] == records[-1]["eval_success"]
    assert to_dict(load_run_config(run_dir)) == to_dict(cfg)

    # resumed to a longer horizon from its last checkpoint
    longer = load_config(ROOT / "configs" / "chain-tabular-grpo.yaml", [*TINY_TABULAR, "iterations=3", f"out_dir={run_dir}"])
    assert train(longer, run_dir, resume=True, console=quiet)["iterations"] == 3
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]

    # a finished run whose metrics were compressed reads the same
    metrics = run_dir / "metrics.jsonl"
    with gzip.open(run_dir / "metrics.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(metrics.read_text())
    metrics.unlink()
    assert read_metrics(run_dir) == records
