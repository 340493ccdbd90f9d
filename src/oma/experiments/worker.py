"""One run of `oma compare`, trained (or resumed) into its folder with its output in ``train.log``; also
the worker of ``--jobs N`` (module-level, picklable arguments)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any



@contextlib.contextmanager
def _quiet_hf():
    """No tqdm bars from transformers (model saving/loading) over the progress display."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        yield
        return
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _sync_threads(run_dir: Path, threads: int) -> None:
    """Let a resumed run use this invocation's thread count (train() refuses a config that differs)."""
    from oma.files import atomic_write_text
    from oma.train import saved_config

    saved = saved_config(run_dir)
    if saved.get("threads") != threads:
        saved["threads"] = threads
        atomic_write_text(run_dir / "config.json", json.dumps(saved, indent=2))


def execute_run(cfg, run_dir: str, resume: bool, threads: int | None) -> dict[str, Any]:
    """Train (or resume) one run into ``run_dir``; its console output goes to ``run_dir/train.log``.

    ``threads`` (None = the config's) is written into the config, so ``train`` sets torch's CPU
    threads to it. Returns the wall time and iterations.
    """
    import torch
    from rich.console import Console

    from oma.train import train

    path = Path(run_dir)
    if threads is not None:
        cfg.threads = threads
    if resume:
        _sync_threads(path, cfg.threads)
    torch.set_num_threads(cfg.threads)
    path.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with _quiet_hf(), (path / "train.log").open("a", encoding="utf-8") as fh:
        console = Console(file=fh, width=120, force_terminal=False, color_system=None)
        summary = train(cfg, path, resume=resume, console=console)
    return {"wall_time_s": time.perf_counter() - t0, "iterations": int(summary["iterations"])}


def build_warm_start(cfg, threads: int, progress=None) -> dict[str, Any]:
    """Build (or load) ``cfg``'s warm start with ``threads`` torch threads, the count its runs train with:
    the cache key names the thread count (:func:`oma.train.cache_key`), so the runs then find it
    cached. Returns what compare.json records of it. Also the worker of ``--jobs N``."""
    import torch

    from oma.train import build_policy, cache_key, make_env

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        with _quiet_hf():
            _, _, info = build_policy(cfg, make_env(cfg), progress)
        return {"cache_key": cache_key(cfg), "cache": info["cache"], "was_cached": bool(info["cached"]),
                "wall_time_s": time.perf_counter() - t0}
    finally:
        torch.set_num_threads(previous)
