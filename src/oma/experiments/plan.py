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
from oma.files import read_json_object
from oma.train import ConfigError, config_diff

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


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, dict) for x in value)


COMPARE_FIELDS: dict[str, tuple[bool, Any, str]] = {
    "command": (True, lambda v: isinstance(v, str), "a string"),
    "horizon": (True, lambda v: type(v) is int and v >= 1, "an integer >= 1"),
    "seeds": (True, lambda v: isinstance(v, list) and all(type(s) is int and s >= 0 for s in v),
              "a list of integers >= 0"),
    "variants": (True, lambda v: _objects(v) and all(isinstance(x.get(k), str) for x in v
                                                     for k in ("name", "algo.accounting", "algo.mass")),
                 'a list of objects with string "name", "algo.accounting" and "algo.mass"'),
    "config": (True, lambda v: isinstance(v, dict), "an object"),
    "runs": (False, lambda v: isinstance(v, dict) and _objects(list(v.values())), "an object of run objects"),
    "warm_starts": (False, lambda v: isinstance(v, dict), "an object"),
    "history": (False, _objects, "a list of objects"),
    "overrides": (False, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "metric": (False, lambda v: isinstance(v, str), "a string"),
    "machine": (False, lambda v: isinstance(v, dict), "an object"),
}
"""The fields of compare.json that `oma compare` (on a rerun) and `oma report` read: name -> (required, check,
what the check expects). Comparisons written before a field existed lack the optional ones."""


def read_compare_json(folder: Path) -> dict:
    """``folder/compare.json``, checked field by field (:data:`COMPARE_FIELDS`); CompareError naming the file and
    the field, and what was expected, when it is damaged (not JSON, not an object) or a field is missing or wrong."""
    path = folder / "compare.json"
    try:
        doc = read_json_object(path)
    except ValueError as e:
        raise CompareError(f"{e}; expected the compare.json `oma compare` writes") from None
    for name, (required, ok, expected) in COMPARE_FIELDS.items():
        if name not in doc:
            if required:
                raise CompareError(f"{path}: no {name!r}; expected {expected}, as `oma compare` writes it")
        elif not ok(doc[name]):
            found = json.dumps(doc[name])
            raise CompareError(f"{path}: {name!r} must be {expected}, "
                               f"found {found if len(found) <= 60 else found[:57] + '...'}")
    return doc


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
            doc = read_compare_json(root)
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


def run_summary(run_dir: Path) -> dict | None:
    """A run's ``summary.json``, None before the run finished; ValueError naming the file when it is damaged or
    its ``iterations`` is not an integer."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    summary = read_json_object(path)
    if type(summary.get("iterations")) is not int:
        raise ValueError(f"{path}: 'iterations' must be an integer, found {json.dumps(summary.get('iterations'))}; "
                         "expected the summary `oma train` writes")
    return summary


def run_state(run: Run) -> str:
    """Decide what to do with ``run``'s directory: ``done``, ``resume`` or ``fresh``.

    Raises CompareError when the directory holds a run of another config (only ``iterations``,
    ``out_dir`` and ``threads`` may differ), or a ``config.json`` or ``summary.json`` that cannot be read: a
    damaged file is named and left for the user to look at, never trained over (oma writes both atomically, so
    damage came from elsewhere).
    """
    from oma.train import saved_config, to_dict

    d = run.run_dir
    if not d.is_dir():
        return "fresh"
    if (d / "config.json").is_file():
        try:
            saved = saved_config(d)
        except ConfigError as e:
            raise CompareError(f"{e}; remove {d} to train that run again, or use another --out") from None
        diff = config_diff(saved, to_dict(run.cfg), MAY_DIFFER)
        if diff:
            raise CompareError(
                f"{d} holds a run of another config: it differs in {', '.join(diff)}; "
                "use another --out or remove that directory"
            )
    try:
        summary = run_summary(d)
    except ValueError as e:
        raise CompareError(f"{e}; remove it to resume that run from its last checkpoint, or use another --out") from None
    if summary is not None and summary["iterations"] >= run.cfg.iterations:
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
