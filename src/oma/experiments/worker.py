"""One run of `oma compare`, trained (or resumed) into its folder with its output in ``train.log``; also
the worker of ``--jobs N`` (module-level, picklable arguments), and the pool of worker processes that die
with the compare that started them."""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
"""Linux's prctl option: the signal the kernel sends a process when the thread that started it ends."""


def _watch_parent(parent: int) -> None:
    """Kill this process once ``parent`` is no longer its parent (it died, and the OS gave this one to another)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _die_with_parent(parent: int) -> None:
    """Initializer of every worker: the worker is killed when ``parent``, the compare that started it, dies, by
    ``kill -9`` too, so no orphan trains on into a run folder a rerun needs (its lock would refuse the rerun).
    On Linux the kernel sends SIGKILL (PR_SET_PDEATHSIG: the pool starts its workers from the compare's main
    thread, which lives as long as the compare); elsewhere a thread watches the parent pid."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is None:  # not Linux
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
        return
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before prctl: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def worker_pool(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """``jobs`` worker processes for the block, each dying with this process (:func:`_die_with_parent`). Left by
    an exception (Ctrl-C), the block kills the workers before it re-raises: shut down, a pool would still wait
    for each worker's current run to end. Their runs keep their last checkpoint (checkpoints are written to a
    temporary name and renamed), so a rerun resumes them."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_die_with_parent,
                               initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:
        for worker in set(multiprocessing.active_children()) - before:
            worker.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


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
