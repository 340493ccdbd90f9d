"""Post-import hooks: run a callback right after a named module finishes executing.

verl loads ``verl.plugins`` entry points while ``import verl`` runs, in every process (driver and
Ray workers). Registering oma's estimators there would force ``verl.trainer.ppo.core_algos``
(~2.5 s) and the v1 trainer package (Ray, TransferQueue, engines) into every process that merely
imports verl. Instead the plugin installs a meta-path finder that wraps the loader of the modules
oma extends; when such a module has executed, the callback registers oma's names into it. Anyone
who can call ``get_adv_estimator_fn`` or ``get_trainer_cls`` has imported that module, so the names
are always there when they are looked up, and nobody else pays for them.

Stdlib only; nothing here imports torch or verl.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger("oma.integrations.verl")

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_pending: dict[str, list[Callback]] = {}
_errors: dict[str, str] = {}
_done: dict[str, int] = {}


def _run(name: str, module: ModuleType, callbacks: list[Callback]) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # a failing hook must never break the host import
            _errors[name] = f"{type(exc).__name__}: {exc}"
            logger.warning("oma: post-import hook for %s failed: %s: %s", name, type(exc).__name__, exc)
        else:
            _done[name] = _done.get(name, 0) + 1


class _LoaderProxy(importlib.abc.Loader):
    """Delegates to the real loader; runs the callbacks after ``exec_module``."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):  # noqa: D401 - Loader protocol
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
        _run(self._name, module, callbacks)

    def __getattr__(self, attr: str):  # get_source, get_code, is_package, get_filename, ...
        return getattr(self._loader, attr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds watched modules through the other finders and wraps their loaders."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderProxy(spec.loader, fullname)
                return spec
        return None


_finder = _PostImportFinder()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once module ``name`` has executed (now, if it already has).

    Exceptions from the callback are logged at WARNING and recorded (see :func:`errors`), never
    raised into the importing code.
    """
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        _run(name, module, [callback])
        return
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def pending() -> dict[str, int]:
    """Watched modules not imported yet, with their number of waiting callbacks."""
    with _lock:
        return {name: len(cbs) for name, cbs in _pending.items()}


def errors() -> dict[str, str]:
    """Module name → last hook error (empty when every hook that ran succeeded)."""
    return dict(_errors)


def done() -> dict[str, int]:
    """Module name → number of callbacks that ran successfully for it."""
    return dict(_done)
