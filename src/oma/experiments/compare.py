"""``oma compare CONFIG [key=value ...] --variants 2x2 --seeds 3 --horizon H [--out DIR] [--jobs N] [--no-dump]``.

Runs the accountings of a config (row/trajectory × native/MA, :mod:`oma.experiments.variants`)
for seeds F..F+S−1 (``--first-seed F``, default 0) at a matched horizon H (docs/experiments.md#the-metrics) and writes the report of
:mod:`oma.experiments.report`. Layout (docs/experiments.md)::

    DIR/compare.json               the command, config, machine, per-run status and wall time, history
    DIR/.oma-run                   the lock of the compare writing into DIR (oma.train.held)
    DIR/<variant>/seed-<k>/        one `oma train` run directory each (dump_batches=true; false with --no-dump,
                                   and the report then reads each run's coupling from its metrics.jsonl)
    DIR/report.md, DIR/*.png       the report

Within a seed every variant starts from the same cached warm start and sees the same task seeds:
both depend on ``seed``, ``env``, ``policy`` and ``warm_start`` only, never on ``algo.*``
(``oma.train.cache_key``, ``oma.train.task_seeds``; tests/test_experiments.py checks it).

Resumable: a run with ``summary.json`` covering H iterations is reused; a run directory with a
checkpoint is resumed (``train(..., resume=True)``, which also extends a shorter finished run to H);
anything else is (re)started fresh. Warm starts are built first, each seed's once and with the runs' thread
count, so parallel jobs (``--jobs N``, worker processes) never race on the cache and every run finds its
seed's warm start cached. A compare killed (``kill -9`` included) takes its workers with it
(:func:`oma.experiments.worker.worker_pool`), and its time stays in compare.json's history (:class:`_Journal`),
so a rerun resumes where it stopped. DIR must be new, empty, or an earlier compare's (:func:`_check_out`).

This module is the command; the plan (runs, their configs, reuse or resume) is
:mod:`oma.experiments.plan`, one run :mod:`oma.experiments.worker`, the progress bars
:mod:`oma.experiments.progress`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oma.experiments.plan import (MAY_DIFFER, CompareError, Run, check_overrides, machine_info, read_compare_json,
                                  run_config, run_key, run_state, run_summary)
from oma.experiments.progress import _Display
from oma.experiments.variants import VARIANT_SETS, variant_set
from oma.experiments.worker import build_warm_start, execute_run, worker_pool
from oma.errors import os_error_line, os_error_status
from oma.files import user_path
from oma.train import CLAIM, SEED_MAX, config_diff

__all__ = ["CompareError", "compare", "main", "parse_args", "run_config"]

SCHEMA_VERSION = 1

RESERVED: dict[str, str] = {
    "algo.accounting": "it is set per variant by --variants",
    "algo.mass": "it is set per variant by --variants",
    "seed": "the runs use seeds F..F+S-1 (--first-seed F, --seeds S)",
    "iterations": "use --horizon",
    "out_dir": "use --out",
    "dump_batches": "it is true, so the report audits the dumped batches; --no-dump makes it false",
}
"""Config keys `oma compare` sets itself: an override of one is an error naming the right flag."""

MAX_SEEDS = 10_000
"""The most seeds (``--seeds``) of one comparison: each is a run per variant, so more is no comparison one machine
finishes (and 10**20 was an OverflowError traceback)."""

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        raise CompareError(message)


# ------------------------------------------------------------------------------------------------
# The command


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oma compare", description="Run row/trajectory x native/MA accountings of a config over "
                "seeds at a matched horizon and write a report with 95% CIs (docs/experiments.md).")
    p.add_argument("config", nargs="?", help="YAML preset (configs/*.yaml); defaults apply without one")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. env.group_size=4; the keys algo.accounting, "
                   "algo.mass, seed, iterations, out_dir and dump_batches are set by oma compare itself")
    p.add_argument("--variants", default="2x2", metavar="{2x2,2,baseline}",
                   help="2x2 (row+native, row+MA, OA+native, OA+MA; default), 2 (row+native vs OA+MA) or baseline "
                   "(row+native alone: a pilot)")
    p.add_argument("--seeds", type=int, default=3, metavar="S",
                   help="seeds F..F+S-1 per variant (default 3; docs/experiments.md#the-metrics wants >= 3)")
    p.add_argument("--first-seed", type=int, default=0, metavar="F",
                   help="the first seed (default 0): a replication takes fresh seeds, e.g. --first-seed 12 --seeds 32")
    p.add_argument("--horizon", type=int, default=None, metavar="H", help="matched horizon H = iterations of every run "
                   "(default: the config's iterations)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default runs/compare-<config name>); "
                   "rerunning into it resumes")
    p.add_argument("--metric", default="greedy", choices=["greedy", "sampled"],
                   help="success curve of the report: greedy (default) or sampled held-out success (the policy RL "
                   "trains; what the tabular lane reports)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="runs in parallel worker processes (default 1: one "
                   "after another); each gets max(1, cpu_count // N) torch threads")
    p.add_argument("--no-dump", action="store_true", help="dump no batches (dump_batches=false): faster; the report "
                   "takes each run's coupling from its metrics.jsonl instead of auditing its batches")
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
    if args.seeds > MAX_SEEDS:
        raise CompareError(f"--seeds must be <= {MAX_SEEDS} (a run per variant each), got {args.seeds}")
    if args.first_seed < 0:
        raise CompareError(f"--first-seed must be >= 0, got {args.first_seed}")
    if args.first_seed + args.seeds - 1 > SEED_MAX:
        raise CompareError(f"--first-seed + --seeds - 1 must be <= 2**40 (the seeds F..F+S-1 are the runs' `seed`), "
                           f"got {args.first_seed + args.seeds - 1}")
    if args.horizon is not None and args.horizon < 1:
        raise CompareError(f"--horizon must be >= 1, got {args.horizon}")
    if args.jobs < 1:
        raise CompareError(f"--jobs must be >= 1, got {args.jobs}")
    check_overrides(overrides, RESERVED)
    return args


def _base_record(base, horizon: int, out: Path, dump: bool) -> dict:
    """The config as stored in compare.json: per-run keys say where they come from."""
    from oma.train import to_dict

    d = to_dict(base)
    d["iterations"] = horizon
    d["out_dir"] = str(out)
    d["dump_batches"] = dump
    d["seed"] = "per run: 0..S-1"
    d["algo"]["accounting"] = "per variant"
    d["algo"]["mass"] = "per variant"
    return d


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` that compare did not make, before anything is created in it: compare writes only into a
    new folder, an empty one, or one that holds its own compare.json, checked field by field (a folder holding
    nothing but the lock, :data:`oma.train.CLAIM`, is one a compare locked and stopped in before its first write)."""
    if out.exists() and not out.is_dir():
        raise CompareError(f"--out {out}: exists and is not a directory")
    if (out / "compare.json").exists():
        read_compare_json(out)  # a compare.json compare did not write is refused here, before the lock is created
    elif out.is_dir() and any(p.name != CLAIM for p in out.iterdir()):
        raise CompareError(f"--out {out}: holds files but no compare.json; expected a new or empty folder, or one "
                           "an earlier `oma compare` wrote (rerun into it to resume); give another --out")


def _load_previous(out: Path, record: dict) -> dict | None:
    """The compare.json of an earlier invocation into ``out`` (None when there is none), refused when it is damaged
    or made with another config. Its invocations still marked running were killed (this one holds ``out``'s
    lock, so none runs): they are marked so, their time being what their last heartbeat wrote."""
    if not (out / "compare.json").exists():
        return None
    prev = read_compare_json(out)
    diff = config_diff(prev["config"], record, MAY_DIFFER)
    if diff:
        dump = " (give --no-dump exactly when its runs were trained with it)" if any(d.startswith("dump_batches") for d in diff) else ""
        raise CompareError(f"{out} holds a comparison of another config: it differs in {', '.join(diff)}{dump}; "
                           "use another --out")
    for entry in prev.get("history", []):
        if entry.get("status") == "running":
            entry["status"] = "killed"
    return prev


HEARTBEAT_S = 5.0
"""How often a running compare rewrites compare.json with its wall time so far (see :class:`_Journal`)."""


class _Journal:
    """compare.json as this invocation keeps it. Each change is made in :meth:`edit` and written at once
    (atomically), and a thread rewrites it every :data:`HEARTBEAT_S` seconds; every write sets this invocation's
    wall time so far (``wall_time_s``, and its ``history`` entry's, the last), so a compare killed with ``kill -9``
    leaves its time in the history, at most HEARTBEAT_S short."""

    def __init__(self, path: Path, doc: dict, t_start: float) -> None:
        self.path, self.doc, self.t_start = path, doc, t_start
        self.lock = threading.Lock()  # the heartbeat thread reads doc while the main thread changes it
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict]:
        from oma.files import atomic_write_text

        with self.lock:
            yield self.doc
            self.doc["wall_time_s"] = self.doc["history"][-1]["wall_time_s"] = time.perf_counter() - self.t_start
            atomic_write_text(self.path, json.dumps(self.doc, indent=2))

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                with self.edit():
                    pass
            except OSError:  # a full disk: the next beat tries again, and the main thread's own writes report it
                pass

    def __enter__(self) -> _Journal:
        with self.edit():
            pass
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def compare(args: argparse.Namespace, argv: list[str], console=None) -> int:
    """Plan, run and report a comparison (see the module docstring). Returns the exit status."""
    from rich.console import Console

    from oma.train import held, load_config, make_env

    console = console or Console()
    t_start = time.perf_counter()
    base = load_config(args.config, args.overrides)
    make_env(base)  # a bad env.options fails here, once, not in every run
    horizon = args.horizon if args.horizon is not None else base.iterations
    if horizon < 1:
        raise CompareError(f"--horizon must be >= 1, got {horizon} (the config's iterations)")
    stem = Path(args.config).stem if args.config else "default"
    out = user_path(args.out) if args.out else Path("runs") / f"compare-{stem}"
    _check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    # one compare at a time in a folder (two would overwrite each other's compare.json); the OS releases the lock
    # when this process dies, kill -9 included, so a rerun after a kill takes it over
    with held(out, "--out"):
        return _compare(args, argv, console, base, horizon, out, t_start)


def _compare(args: argparse.Namespace, argv: list[str], console, base, horizon: int, out: Path,
             t_start: float) -> int:
    """:func:`compare` once it holds ``out``."""
    variants = variant_set(args.variants)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    jobs = args.jobs
    cpus = os.cpu_count() or 1
    threads = base.threads if jobs == 1 else max(1, cpus // jobs)

    record = _base_record(base, horizon, out, not args.no_dump)
    prev = _load_previous(out, record)
    runs = [Run(v, k, out / v.name / f"seed-{k}", None) for k in seeds for v in variants]
    for r in runs:
        r.cfg = run_config(base, r.variant, r.seed, horizon, r.run_dir, dump=not args.no_dump)
        r.state = run_state(r)

    prev_runs = (prev or {}).get("runs", {})
    command = "oma compare " + shlex.join(argv)
    started = _now()
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": command,
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
        "started": started,
        "finished": None,
        "wall_time_s": None,
        "warm_starts": (prev or {}).get("warm_starts", {}),
        "runs": dict(prev_runs),
        # this invocation's entry is written now and kept up to date (_Journal): a kill leaves its time behind
        "history": [*(prev or {}).get("history", []), {"command": command, "started": started, "wall_time_s": 0.0,
                                                        "jobs": jobs, "status": "running", "trained": []}],
    }
    for r in runs:
        entry = dict(prev_runs.get(r.key, {}))
        if "wall_time_total_s" not in entry and r.state == "done":
            entry["wall_time_total_s"] = run_summary(r.run_dir).get("wall_time_s")
        entry.update(variant=r.variant.name, seed=r.seed, run_dir=run_key(r.variant.name, r.seed),
                     status="reused" if r.state == "done" else "pending", wall_time_s=0.0)
        entry.setdefault("wall_time_total_s", 0.0)
        entry.pop("error", None)
        doc["runs"][r.key] = entry

    pending = [r for r in runs if r.state != "done"]
    n_resume = sum(r.state == "resume" for r in pending)
    console.print(f"oma compare: {len(variants)} variants x {len(seeds)} seeds, horizon {horizon}, into {out} "
                  f"({len(runs) - len(pending)} finished runs reused, {n_resume} to resume, "
                  f"{len(pending) - n_resume} to start; jobs {jobs}, {threads} threads each)")
    failed: list[str] = []
    status = "failed"  # what an exception other than Ctrl-C leaves in the history
    with _Journal(out / "compare.json", doc, t_start) as journal:
        try:
            with _Display(console, len(runs), len(runs) - len(pending), horizon) as display:
                _warm_starts(pending, journal, display, jobs, threads)
                if jobs == 1:
                    for r in pending:
                        _run_sequential(r, display, journal, failed, console)
                else:
                    _run_parallel(pending, jobs, threads, display, journal, failed, console)
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            with journal.edit() as d:
                d["finished"] = _now()
                d["history"][-1]["status"] = status
    if status == "interrupted":
        console.print(f"oma compare: interrupted; rerun the same command to resume ({out / 'compare.json'})")
        return 130

    from oma.experiments.report import write_report

    try:
        path = write_report(out, console=console)
    except ValueError as e:  # a ReportError, or a run file the report cannot read (the message names it)
        console.print(f"oma compare: no report: {e}")
        failed = failed or ["(report)"]
    else:
        console.print(f"oma compare: report written to {path}")
    if failed:
        console.print(f"oma compare: {len(failed)} run(s) failed: {', '.join(failed)} (see their train.log and "
                      "compare.json; rerun the same command to retry them)")
        return 1
    return 0


def _warm_starts(pending: list[Run], journal: _Journal, display: _Display, jobs: int, threads: int) -> None:
    """Build (or load) each pending seed's warm start once, before any run starts, with the runs' torch thread
    count (the warm-start cache key names it): one seed after another in this process with ``--jobs 1``,
    else ``jobs`` seeds at a time in worker processes. Different seeds never share a cache entry, so the
    workers cannot race on one."""
    first = {}
    for r in pending:
        first.setdefault(r.seed, r.cfg)

    def record(seed: int, built: dict) -> None:
        with journal.edit() as doc:
            doc["warm_starts"][f"seed-{seed}"] = built

    if jobs == 1:
        for seed, cfg in sorted(first.items()):
            before = set(display.progress.task_ids)
            display.progress.add_task(f"warm start seed {seed}", total=None)
            built = build_warm_start(cfg, threads, display.progress)
            for task in set(display.progress.task_ids) - before:  # ours and build_policy's SFT bar
                display.progress.remove_task(task)
            record(seed, built)
        return
    from concurrent.futures import as_completed

    tasks = {seed: display.progress.add_task(f"warm start seed {seed}", total=None) for seed in sorted(first)}
    with worker_pool(jobs) as pool:
        futures = {pool.submit(build_warm_start, first[seed], threads): seed for seed in sorted(first)}
        for fut in as_completed(futures):
            seed = futures[fut]
            display.progress.remove_task(tasks[seed])
            record(seed, fut.result())


def _prepare_dir(r: Run) -> bool:
    """Remove a partial run without a checkpoint; True when the run resumes."""
    if r.state == "fresh" and r.run_dir.exists():
        shutil.rmtree(r.run_dir)
    return r.state == "resume"


def _done(r: Run, journal: _Journal, result: dict | None, error: BaseException | None, failed: list[str],
          console) -> None:
    with journal.edit() as doc:
        entry = doc["runs"][r.key]
        if error is None:
            entry.update(status="resumed" if r.state == "resume" else "trained", wall_time_s=result["wall_time_s"],
                         iterations=result["iterations"])
            entry["wall_time_total_s"] = float(entry.get("wall_time_total_s") or 0.0) + result["wall_time_s"]
            doc["history"][-1]["trained"].append(r.key)
        else:
            msg = " ".join(str(error).split()) or type(error).__name__
            entry.update(status="failed", error=f"{type(error).__name__}: {msg}")
            failed.append(r.key)
            console.print(f"[red]run {r.key} failed[/red]: {entry['error']}")


def _run_sequential(r: Run, display: _Display, journal: _Journal, failed: list[str], console) -> None:
    resume = _prepare_dir(r)
    display.start(r.key, r.run_dir)
    try:
        result = execute_run(r.cfg, str(r.run_dir), resume, None)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 — one failed run must not stop the others
        _done(r, journal, None, e, failed, console)
    else:
        _done(r, journal, result, None, failed, console)
    finally:
        display.finish(r.key)


def _run_parallel(pending: list[Run], jobs: int, threads: int, display: _Display, journal: _Journal,
                  failed: list[str], console) -> None:
    from concurrent.futures import FIRST_COMPLETED, wait

    queue = list(pending)
    running: dict[Any, Run] = {}
    with worker_pool(jobs) as pool:
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
                    _done(r, journal, None, e, failed, console)
                else:
                    _done(r, journal, result, None, failed, console)
                display.finish(r.key)


def main(argv: list[str]) -> int:
    from oma.train import ConfigError

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
    except OSError as e:  # a full disk (1), or an --out that cannot be written (2)
        print(f"oma compare: error: {' '.join(os_error_line(e).split())}", file=sys.stderr)
        return os_error_status(e)
