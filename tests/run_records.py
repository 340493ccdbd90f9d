"""A run's metrics.jsonl as records, and the parts of them that the training decides, for the tests
that compare two runs of the same training."""

from __future__ import annotations

import gzip
from pathlib import Path

from oma.files import read_jsonl

TIMINGS = ("time_", "tokens_per_s", "rows_per_s", "warm_start")
"""Keys the clock or the warm-start cache's place decide."""

NOT_TRAINING = (*TIMINGS, "eval_")
"""Keys the rollouts and updates do not decide: the timings and the held-out evaluations."""


def records(path: Path) -> list[dict]:
    """Every record of a metrics.jsonl (or of its compressed ``.gz``), in order."""
    return read_jsonl(path)


def lines(path: Path) -> list[str]:
    """The text lines of a metrics.jsonl (or of its compressed ``.gz``) as written, for byte-exact comparisons."""
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.is_file():
        return gzip.decompress(packed.read_bytes()).decode("utf-8").splitlines()
    return path.read_text(encoding="utf-8").splitlines()


def _without(run: list[dict], prefixes: tuple[str, ...]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(prefixes)} for r in run]


def without_timings(run: list[dict]) -> list[dict]:
    """Each record without its :data:`TIMINGS` keys: what two runs of the same job on the same CPU share."""
    return _without(run, TIMINGS)


def training_only(run: list[dict]) -> list[dict]:
    """Each record without its :data:`NOT_TRAINING` keys: what two runs of the same training share whatever
    weights they evaluate (an average of the weights changes the evaluations, not the training)."""
    return _without(run, NOT_TRAINING)


def training_at_any_schedule(run: list[dict]) -> list[dict]:
    """:func:`training_only` without the KL to the warm start, which a run logs only where it evaluates: what
    two runs of the same training share whatever their ``eval_every``."""
    return [{k: v for k, v in r.items() if k != "kl_warm_start"} for r in training_only(run)]
