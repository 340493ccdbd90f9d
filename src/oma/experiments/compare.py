"""``oma compare CONFIG [key=value ...] --variants 2x2 --seeds 3 --horizon H [--out DIR] [--jobs N]``.

Runs the accountings of a config (row/trajectory × native/MA, :mod:`oma.experiments.variants`)
for seeds 0..S−1 at a matched horizon H (docs/experiments.md#the-metrics) and writes the report of
:mod:`oma.experiments.report`. Layout (docs/experiments.md)::

    DIR/compare.json               the command, config, machine, per-run status and wall time
    DIR/<variant>/seed-<k>/        one `oma train` run directory each (dump_batches=true)
    DIR/report.md, DIR/*.png       the report

Within a seed every variant starts from the same cached warm start and sees the same task seeds:
both depend on ``seed``, ``env``, ``policy`` and ``warm_start`` only, never on ``algo.*``
(``oma.train.warmstart.cache_key``, ``oma.train.loop.task_seeds``; tests/test_experiments.py checks it).

Resumable: a run with ``summary.json`` covering H iterations is reused; a run directory with a
checkpoint is resumed (``train(..., resume=True)``, which also extends a shorter finished run to H);
anything else is (re)started fresh. Warm starts are built first, one seed at a time, so parallel
jobs (``--jobs N``, worker processes) never race on the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from oma.experiments.variants import VARIANT_SETS, Variant, variant_set
from oma.train.config import config_diff

SCHEMA_VERSION = 1

RESERVED: dict[str, str] = {
    "algo.accounting": "it is set per variant by --variants",
    "algo.mass": "it is set per variant by --variants",
    "seed": "the runs use seeds 0..S-1 (--seeds S)",
    "iterations": "use --horizon",
    "out_dir": "use --out",
    "dump_batches": "it is always true (the report audits the dumped batches)",
}
"""Config keys `oma compare` sets itself: an override of one is an error naming the right flag."""

MAY_DIFFER = ("iterations", "out_dir", "threads")
"""Config keys a saved run may differ in from the planned one (horizon, location, CPU threads)."""


class CompareError(ValueError):
    """A bad argument or an output directory that does not fit the command; the message says which."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise CompareError(message)


# ------------------------------------------------------------------------------------------------
# Plan


@dataclass
class Run:
    """One (variant, seed) run of the comparison."""

    variant: Variant
    seed: int
    run_dir: Path
    cfg: Any  # TrainConfig
    state: str = "fresh"
    """``done`` (reused), ``resume`` (from its checkpoint) or ``fresh``."""

    @property
    def key(self) -> str:
        return f"{self.variant.name}/seed-{self.seed}"


def run_key(variant: str, seed: int) -> str:
    """``<variant>/seed-<k>``: the run's key in compare.json and its folder under DIR."""
    return f"{variant}/seed-{seed}"


def run_config(base, variant: Variant, seed: int, horizon: int, run_dir: Path):
    """The TrainConfig of one run: ``base`` with the variant's switches, the seed and the horizon."""
    cfg = copy.deepcopy(base)
    cfg.algo.accounting = variant.accounting
    cfg.algo.mass = variant.mass
    cfg.seed = seed
    cfg.iterations = horizon
    cfg.out_dir = str(run_dir)
    cfg.dump_batches = True
    return cfg


def run_state(run: Run) -> str:
    """Decide what to do with ``run``'s directory: ``done``, ``resume`` or ``fresh``.

    Raises CompareError when the directory holds a run of another config (only ``iterations``,
    ``out_dir`` and ``threads`` may differ).
    """
    from oma.train.config import to_dict

    d = run.run_dir
    if not d.is_dir():
        return "fresh"
    if (d / "config.json").is_file():
        diff = config_diff(json.loads((d / "config.json").read_text()), to_dict(run.cfg), MAY_DIFFER)
        if diff:
            raise CompareError(
                f"{d} holds a run of another config: it differs in {', '.join(diff)}; "
                "use another --out or remove that directory"
            )
    summary = d / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("iterations", 0) >= run.cfg.iterations:
        return "done"
    if (d / "checkpoints" / "latest").is_file():
        return "resume"
    return "fresh"


def machine_info(jobs: int, threads: int) -> dict[str, Any]:
    """Where the comparison ran: platform, CPUs, library versions, parallelism."""
    import torch

    import oma

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "torch": torch.__version__,
        "oma": oma.__version__,
        "jobs": jobs,
        "threads_per_run": threads,
    }


# ------------------------------------------------------------------------------------------------
# Running one run (also the worker of --jobs N: module-level, picklable arguments)


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
    from oma.train.checkpoint import atomic_write_text

    path = run_dir / "config.json"
    saved = json.loads(path.read_text())
    if saved.get("threads") != threads:
        saved["threads"] = threads
        atomic_write_text(path, json.dumps(saved, indent=2))


def execute_run(cfg, run_dir: str, resume: bool, threads: int | None) -> dict[str, Any]:
    """Train (or resume) one run into ``run_dir``; its console output goes to ``run_dir/train.log``.

    ``threads`` (None = the config's) is written into the config, so ``train`` sets torch's CPU
    threads to it. Returns the wall time and iterations.
    """
    import torch
    from rich.console import Console

    from oma.train import loop

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
        summary = loop.train(cfg, path, resume=resume, console=console)
    return {"wall_time_s": time.perf_counter() - t0, "iterations": int(summary["iterations"])}


# ------------------------------------------------------------------------------------------------
# Progress display across runs


def _last_iteration(run_dir: Path) -> int | None:
    path = run_dir / "metrics.jsonl"
    try:
        text = path.read_text()
    except OSError:
        return None
    lines = [ln for ln in text.split("\n")[:-1] if ln]  # complete lines only
    if not lines:
        return None
    try:
        return int(json.loads(lines[-1])["iteration"])
    except (ValueError, KeyError):
        return None


class _Display:
    """A rich progress display: an overall bar (runs done / total, the runs now training) and one bar
    per active run (its iterations, read from its metrics.jsonl by a polling thread)."""

    def __init__(self, console, total: int, done: int, horizon: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.horizon = horizon
        self.overall = self.progress.add_task("runs", total=total, completed=done)
        self.active: dict[str, tuple[Any, Path]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Self:
        self.progress.__enter__()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.progress.__exit__(*exc)

    def _describe(self) -> None:
        now = ", ".join(self.active) or "-"
        self.progress.update(self.overall, description=f"runs (now: {now})")

    def start(self, key: str, run_dir: Path) -> None:
        with self.lock:
            start = _last_iteration(run_dir) if (run_dir / "metrics.jsonl").is_file() else 0
            task = self.progress.add_task(f"  {key}", total=self.horizon, completed=start or 0)
            self.active[key] = (task, run_dir)
            self._describe()

    def finish(self, key: str) -> None:
        with self.lock:
            task, _ = self.active.pop(key)
            self.progress.remove_task(task)
            self.progress.advance(self.overall)
            self._describe()

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            with self.lock:
                for task, run_dir in self.active.values():
                    it = _last_iteration(run_dir)
                    if it is not None:
                        self.progress.update(task, completed=it)


# ------------------------------------------------------------------------------------------------
# The command


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        for reserved, why in RESERVED.items():
            if key == reserved or key.startswith(reserved + "."):
                raise CompareError(f"override {item!r}: {reserved} cannot be overridden here; {why}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oma compare", description="Run row/trajectory x native/MA accountings of a config over "
                "seeds at a matched horizon and write a report with 95% CIs (docs/experiments.md).")
    p.add_argument("config", nargs="?", help="YAML preset (configs/*.yaml); defaults apply without one")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.group_size=4; the keys algo.accounting, "
                   "algo.mass, seed, iterations, out_dir and dump_batches are set by oma compare itself")
    p.add_argument("--variants", default="2x2", metavar="{2x2,2}",
                   help="2x2 (row+native, row+MA, OA+native, OA+MA; default) or 2 (row+native vs OA+MA)")
    p.add_argument("--seeds", type=int, default=3, metavar="S",
                   help="seeds 0..S-1 per variant (default 3; docs/experiments.md#the-metrics wants >= 3)")
    p.add_argument("--horizon", type=int, default=None, metavar="H", help="matched horizon H = iterations of every run "
                   "(default: the config's iterations)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default runs/compare-<config name>); "
                   "rerunning into it resumes")
    p.add_argument("--metric", default="greedy", choices=["greedy", "sampled"],
                   help="success curve of the report: greedy (default) or sampled held-out success (the policy RL "
                   "trains; what the tabular lane reports)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="runs in parallel worker processes (default 1: one "
                   "after another); each gets max(1, cpu_count // N) torch threads")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and check the arguments; CompareError with a one-line message otherwise."""
    args = _parser().parse_args(argv)
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        config, overrides = None, [config, *overrides]  # `oma compare key=value` without a preset
    args.config, args.overrides = config, overrides
    if args.variants not in VARIANT_SETS:
        raise CompareError(f"--variants {args.variants!r} is not valid; expected one of {list(VARIANT_SETS)}")
    if args.seeds < 1:
        raise CompareError(f"--seeds must be >= 1, got {args.seeds}")
    if args.horizon is not None and args.horizon < 1:
        raise CompareError(f"--horizon must be >= 1, got {args.horizon}")
    if args.jobs < 1:
        raise CompareError(f"--jobs must be >= 1, got {args.jobs}")
    _check_overrides(overrides)
    return args


def _base_record(base, horizon: int, out: Path) -> dict:
    """The config as stored in compare.json: per-run keys say where they come from."""
    from oma.train.config import to_dict

    d = to_dict(base)
    d["iterations"] = horizon
    d["out_dir"] = str(out)
    d["dump_batches"] = True
    d["seed"] = "per run: 0..S-1"
    d["algo"]["accounting"] = "per variant"
    d["algo"]["mass"] = "per variant"
    return d


def _load_previous(out: Path, record: dict) -> dict | None:
    path = out / "compare.json"
    if not path.is_file():
        return None
    try:
        prev = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CompareError(f"{path} is not valid JSON ({e}); remove it or use another --out") from None
    diff = config_diff(prev.get("config", {}), record, MAY_DIFFER)
    if diff:
        raise CompareError(f"{out} holds a comparison of another config: it differs in {', '.join(diff)}; "
                           "use another --out")
    return prev


def compare(args: argparse.Namespace, argv: list[str], console=None) -> int:
    """Plan, run and report a comparison (see the module docstring). Returns the exit status."""
    from rich.console import Console

    from oma.train.checkpoint import atomic_write_text
    from oma.train.config import load_config
    from oma.train.loop import env_factory

    console = console or Console()
    t_start = time.perf_counter()
    base = load_config(args.config, args.overrides)
    env_factory(base)  # a bad env.options fails here, once, not in every run
    horizon = args.horizon if args.horizon is not None else base.iterations
    if horizon < 1:
        raise CompareError(f"--horizon must be >= 1, got {horizon} (the config's iterations)")
    stem = Path(args.config).stem if args.config else "default"
    out = Path(args.out) if args.out else Path("runs") / f"compare-{stem}"
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out}: exists and is not a directory")
    variants = variant_set(args.variants)
    seeds = list(range(args.seeds))
    jobs = args.jobs
    cpus = os.cpu_count() or 1
    threads = base.threads if jobs == 1 else max(1, cpus // jobs)

    record = _base_record(base, horizon, out)
    prev = _load_previous(out, record)
    runs = [Run(v, k, out / v.name / f"seed-{k}", None) for k in seeds for v in variants]
    for r in runs:
        r.cfg = run_config(base, r.variant, r.seed, horizon, r.run_dir)
        r.state = run_state(r)
    out.mkdir(parents=True, exist_ok=True)

    prev_runs = (prev or {}).get("runs", {})
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": "oma compare " + shlex.join(argv),
        "argv": list(argv),
        "cwd": os.getcwd(),
        "config_path": args.config,
        "overrides": list(args.overrides),
        "variants_arg": args.variants,
        "variants": [{"name": v.name, "algo.accounting": v.accounting, "algo.mass": v.mass,
                      "audit_accounting": v.audit_name} for v in variants],
        "seeds": seeds,
        "horizon": horizon,
        "metric": args.metric,
        "jobs": jobs,
        "config": record,
        "machine": machine_info(jobs, threads),
        "started": _now(),
        "finished": None,
        "wall_time_s": None,
        "warm_starts": (prev or {}).get("warm_starts", {}),
        "runs": dict(prev_runs),
        "history": (prev or {}).get("history", []),
    }
    for r in runs:
        entry = dict(prev_runs.get(r.key, {}))
        if "wall_time_total_s" not in entry and r.state == "done":
            entry["wall_time_total_s"] = json.loads((r.run_dir / "summary.json").read_text()).get("wall_time_s")
        entry.update(variant=r.variant.name, seed=r.seed, run_dir=run_key(r.variant.name, r.seed),
                     status="reused" if r.state == "done" else "pending", wall_time_s=0.0)
        entry.setdefault("wall_time_total_s", 0.0)
        entry.pop("error", None)
        doc["runs"][r.key] = entry

    def save() -> None:
        atomic_write_text(out / "compare.json", json.dumps(doc, indent=2))

    save()
    pending = [r for r in runs if r.state != "done"]
    n_resume = sum(r.state == "resume" for r in pending)
    console.print(f"oma compare: {len(variants)} variants x {len(seeds)} seeds, horizon {horizon}, into {out} "
                  f"({len(runs) - len(pending)} finished runs reused, {n_resume} to resume, "
                  f"{len(pending) - n_resume} to start; jobs {jobs}, {threads} threads each)")
    failed: list[str] = []
    interrupted = False
    try:
        with _Display(console, len(runs), len(runs) - len(pending), horizon) as display:
            _warm_starts(pending, doc, save, display, threads if jobs == 1 else cpus)
            if jobs == 1:
                for r in pending:
                    _run_sequential(r, display, doc, save, failed, console)
            else:
                _run_parallel(pending, jobs, threads, display, doc, save, failed, console)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        wall = time.perf_counter() - t_start
        doc["finished"] = _now()
        doc["wall_time_s"] = wall
        trained = [r.key for r in pending if doc["runs"][r.key]["status"] in ("trained", "resumed")]
        doc["history"].append({"command": doc["command"], "started": doc["started"], "wall_time_s": wall,
                               "jobs": jobs, "interrupted": interrupted, "trained": trained})
        save()
    if interrupted:
        console.print(f"oma compare: interrupted; rerun the same command to resume ({out / 'compare.json'})")
        return 130

    from oma.experiments.report import ReportError, write_report

    try:
        path = write_report(out, console=console)
    except ReportError as e:
        console.print(f"oma compare: no report: {e}")
        failed = failed or ["(report)"]
    else:
        console.print(f"oma compare: report written to {path}")
    if failed:
        console.print(f"oma compare: {len(failed)} run(s) failed: {', '.join(failed)} (see their train.log and "
                      "compare.json; rerun the same command to retry them)")
        return 1
    return 0


def _warm_starts(pending: list[Run], doc: dict, save, display: _Display, threads: int) -> None:
    """Build (or load) each pending seed's warm start once, in order, before any run starts."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _build_warm_starts(pending, doc, save, display)
    finally:
        torch.set_num_threads(previous)


def _build_warm_starts(pending: list[Run], doc: dict, save, display: _Display) -> None:
    from oma.train.loop import env_factory
    from oma.train.warmstart import build_policy, cache_key

    for seed in sorted({r.seed for r in pending}):
        cfg = next(r.cfg for r in pending if r.seed == seed)
        before = set(display.progress.task_ids)
        display.progress.add_task(f"warm start seed {seed}", total=None)
        t0 = time.perf_counter()
        with _quiet_hf():
            _, _, info = build_policy(cfg, env_factory(cfg), display.progress)
        for task in set(display.progress.task_ids) - before:  # ours and build_policy's SFT bar
            display.progress.remove_task(task)
        doc["warm_starts"][f"seed-{seed}"] = {"cache_key": cache_key(cfg), "cache": info["cache"],
                                              "was_cached": bool(info["cached"]),
                                              "wall_time_s": time.perf_counter() - t0}
        save()


def _prepare_dir(r: Run) -> bool:
    """Remove a partial run without a checkpoint; True when the run resumes."""
    if r.state == "fresh" and r.run_dir.exists():
        shutil.rmtree(r.run_dir)
    return r.state == "resume"


def _done(r: Run, doc: dict, save, result: dict | None, error: BaseException | None, failed: list[str],
          console) -> None:
    entry = doc["runs"][r.key]
    if error is None:
        entry.update(status="resumed" if r.state == "resume" else "trained", wall_time_s=result["wall_time_s"],
                     iterations=result["iterations"])
        entry["wall_time_total_s"] = float(entry.get("wall_time_total_s") or 0.0) + result["wall_time_s"]
    else:
        msg = " ".join(str(error).split()) or type(error).__name__
        entry.update(status="failed", error=f"{type(error).__name__}: {msg}")
        failed.append(r.key)
        console.print(f"[red]run {r.key} failed[/red]: {entry['error']}")
    save()


def _run_sequential(r: Run, display: _Display, doc: dict, save, failed: list[str], console) -> None:
    resume = _prepare_dir(r)
    display.start(r.key, r.run_dir)
    try:
        result = execute_run(r.cfg, str(r.run_dir), resume, None)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
        _done(r, doc, save, None, e, failed, console)
    else:
        _done(r, doc, save, result, None, failed, console)
    finally:
        display.finish(r.key)


def _run_parallel(pending: list[Run], jobs: int, threads: int, display: _Display, doc: dict, save,
                  failed: list[str], console) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    queue = list(pending)
    running: dict[Any, Run] = {}
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                r = queue.pop(0)
                resume = _prepare_dir(r)
                display.start(r.key, r.run_dir)
                running[pool.submit(execute_run, r.cfg, str(r.run_dir), resume, threads)] = r
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                r = running.pop(fut)
                try:
                    result = fut.result()
                except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
                    _done(r, doc, save, None, e, failed, console)
                else:
                    _done(r, doc, save, result, None, failed, console)
                display.finish(r.key)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def main(argv: list[str]) -> int:
    from oma.train.config import ConfigError

    try:
        args = parse_args(argv)
    except SystemExit as done:  # --help
        return int(done.code or 0) if isinstance(done.code, int) else 0
    except CompareError as e:
        print(f"oma compare: error: {e}", file=sys.stderr)
        return 2
    try:
        return compare(args, argv)
    except (CompareError, ConfigError, FileNotFoundError) as e:
        print(f"oma compare: error: {e}", file=sys.stderr)
        return 2
