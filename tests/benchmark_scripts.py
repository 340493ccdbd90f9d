"""Load a by-hand script of benchmarks/ or studies/tools/ (or any file that is no package's, such as docs/'s hooks and
figures) as a module, for the tests of its helpers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "benchmarks", ROOT / "studies" / "tools")


def load(name: str) -> ModuleType:
    """<folder>/<name>.py as a module (neither folder is a package: their scripts are run by path, which puts
    the script's folder on sys.path for the scripts that import one another; the study tools that reuse a
    benchmark's helpers put benchmarks/ there themselves)."""
    for folder in FOLDERS:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
    [path] = [f / f"{name}.py" for f in FOLDERS if (f / f"{name}.py").is_file()]
    return load_file(path, name)


def load_file(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` as a module named ``name`` (not registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
