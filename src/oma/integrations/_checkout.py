"""What the ``check-install`` commands share (verl-agent's, ROLL's, rLLM's): a host checkout imported from its folder
for one check, the modules its imports need but the environment lacks stubbed by ``sys.modules`` entries of
the check's own, and all of it undone afterwards. Nothing here imports a host framework."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import logging
import random
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckoutError(Exception):
    """PATH is no checkout of the framework, or its modules cannot be imported: one line."""


class _StubType(type):
    """A stubbed module's attributes: classes that stand for anything an import-time statement does with them
    (attribute, call, decorator, subscript, base class, context manager)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(f"{cls.__qualname__}.{name}", cls.__module__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not cls.__dict__.get("_oma_stub"):  # a real class deriving from a stub
            return super().__call__(*args, **kwargs)
        if len(args) == 1 and not kwargs and callable(args[0]):  # used as a decorator
            return args[0]
        return _stub(f"{cls.__qualname__}()", cls.__module__)

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __iter__(cls) -> Iterator[Any]:
        return iter(())

    def __enter__(cls) -> Any:
        return cls

    def __exit__(cls, *exc: Any) -> None:
        return None


def _stub(qualname: str, module: str) -> type:
    return _StubType(qualname.rpartition(".")[2], (), {"_oma_stub": True, "__qualname__": qualname, "__module__": module})


class StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub(f"{self.__name__}.{name}", self.__name__)
        setattr(self, name, value)
        return value


class Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a stub module for every module under the stubbed top-level names."""

    def __init__(self, stash: dict[str, types.ModuleType]) -> None:
        self.names: dict[str, str] = {}
        self._stash = stash

    def add(self, name: str, why: str) -> None:
        self.names[name] = why
        for key in [k for k in sys.modules if k.partition(".")[0] == name]:  # an imported real one is set aside
            self._stash.setdefault(key, sys.modules.pop(key))

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextlib.contextmanager
def isolated(root: Path, own: tuple[str, ...], stub: dict[str, str]) -> Iterator[Stubs]:
    """The checkout first on ``sys.path``, its top-level packages ``own`` set aside, the modules ``stub``
    (name → why) stubbed; everything as it was afterwards (modules, paths, random generators, root logger)."""
    saved_path, saved_meta = list(sys.path), list(sys.meta_path)
    stash = {k: sys.modules.pop(k) for k in list(sys.modules) if k.partition(".")[0] in own}
    rng = (np.random.get_state(), torch.get_rng_state(), random.getstate())
    root_logger = logging.getLogger()
    logger_state = (root_logger.level, list(root_logger.handlers))
    stubs = Stubs(stash)
    for name, why in stub.items():
        stubs.add(name, why)
    sys.meta_path.insert(0, stubs)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield stubs
    finally:
        sys.path[:] = saved_path
        sys.meta_path[:] = saved_meta
        for key in list(sys.modules):
            top = key.partition(".")[0]
            origin = getattr(sys.modules[key], "__file__", None) or ""
            if top in own or top in stubs.names or origin.startswith(str(root)):
                del sys.modules[key]
        sys.modules.update(stash)
        np.random.set_state(rng[0])
        torch.set_rng_state(rng[1])
        random.setstate(rng[2])
        root_logger.setLevel(logger_state[0])
        root_logger.handlers[:] = logger_state[1]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """A checkout's functions print (group sizes, settings); the table is what a check prints."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def import_from(name: str, stubs: Stubs, own: tuple[str, ...], error: type[Exception]) -> types.ModuleType:
    """``name`` from the checkout, stubbing each module outside it (not in ``own``) that its imports need but
    cannot get; ``error`` (one line) when it still cannot be imported."""
    for _ in range(64):
        try:
            with quiet():
                return importlib.import_module(name)
        except ImportError as exc:
            top = (exc.name or "").partition(".")[0]
            if not top or top in own or top in stubs.names:
                raise error(f"cannot import {name} from the checkout: {one_line(exc)}") from None
            stubs.add(top, "not installed" if isinstance(exc, ModuleNotFoundError) else f"fails to import: {one_line(exc)}")
        except Exception as exc:  # noqa: BLE001 - anything the checkout raises on import is reported in one line
            raise error(f"cannot import {name} from the checkout: {type(exc).__name__}: {one_line(exc)}") from None
    raise error(f"cannot import {name} from the checkout: too many missing modules ({', '.join(stubs.names)})")


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
