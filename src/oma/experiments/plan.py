"""The plan of `oma compare`: its runs (variant × seed), each run's config, and what to do with a run
directory that already exists (reuse, resume or start fresh)."""

from __future__ import annotations

import copy
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oma.experiments.variants import Variant
from oma.train import config_diff

MAY_DIFFER = ("iterations", "out_dir", "threads")
"""Config keys a saved run may differ in from the planned one (horizon, location, CPU threads)."""


class CompareError(ValueError):
    """A bad argument or an output directory that does not fit the command; the message says which."""


def check_overrides(overrides: list[str], reserved: dict[str, str], error: type[Exception] = CompareError) -> None:
    """Refuse, raising ``error`` in one line, an override of a key (or below a key) that the command sets itself;
    ``reserved`` maps each such key to why, naming the flag to use instead."""
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        for name, why in reserved.items():
            if key == name or key.startswith(name + "."):
                raise error(f"override {item!r}: {name} cannot be overridden here; {why}")




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


def study_runs(roots: list[Path]) -> tuple[dict[str, Path], dict[str, str]]:
    """Every run of a study trained into ``roots`` (more seeds of the same runs in several folders) as
    ``{"<variant>/seed-K": its folder}``, in the folders' order, with what a
    comparison's compare.json records (its ``command`` and ``config_path``, from the first folder that has
    one). A folder with compare.json holds that comparison's runs; any other folder DIR/<variant>/seed-K.
    Refused (ValueError naming the folders): a folder without runs, and one variant's seed in two folders,
    which would count one seed twice."""
    found: dict[str, Path] = {}
    recorded: dict[str, str] = {}
    for root in roots:
        if (root / "compare.json").is_file():
            doc = json.loads((root / "compare.json").read_text())
            keys = list(doc["runs"])
            for field in ("command", "config_path"):
                if doc.get(field) and field not in recorded:
                    recorded[field] = doc[field]
        else:
            keys = sorted(f"{d.parent.name}/{d.name}" for d in root.glob("*/seed-*") if d.is_dir())
        if not keys:
            raise ValueError(f"{root}: no runs found (expected compare.json or <variant>/seed-K folders)")
        for key in keys:
            if key in found:
                raise ValueError(f"{key} is in both {found[key].parents[1]} and {root}: one seed would count twice")
            found[key] = root / key
    return found, recorded


def run_config(base, variant: Variant, seed: int, horizon: int, run_dir: Path, dump: bool = True):
    """The TrainConfig of one run: ``base`` with the variant's switches, the seed and the horizon; its
    batches dumped for the report's audit unless ``dump`` is false (``--no-dump``)."""
    cfg = copy.deepcopy(base)
    cfg.algo.accounting = variant.accounting
    cfg.algo.mass = variant.mass
    cfg.seed = seed
    cfg.iterations = horizon
    cfg.out_dir = str(run_dir)
    cfg.dump_batches = dump
    return cfg


def run_state(run: Run) -> str:
    """Decide what to do with ``run``'s directory: ``done``, ``resume`` or ``fresh``.

    Raises CompareError when the directory holds a run of another config (only ``iterations``,
    ``out_dir`` and ``threads`` may differ).
    """
    from oma.train import to_dict

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
    """Where the comparison ran: platform, CPUs (the processor and the instruction set torch's kernels use, which
    decide a warm start's last bits: docs/training.md#reproducibility-and-resume), library versions, parallelism."""
    import torch

    import oma
    from oma.train import cpu_info

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        **cpu_info(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable,
        "torch": torch.__version__,
        "oma": oma.__version__,
        "jobs": jobs,
        "threads_per_run": threads,
    }
