"""verl plugin entry point (``[project.entry-points."verl.plugins"] oma = "oma.integrations.verl.plugin"``).

verl 0.9.1 runs, at the end of ``import verl`` in every process, ``entry_point.load()`` for each
entry point of the group ``verl.plugins`` (policy: env ``VERL_USE_EXTERNAL_PLUGINS``, default
``auto`` = all; ``none`` = off; ``a,b`` = only those entry-point names). ``load()`` imports the
module and does not call anything, so registration happens at import of this module. Load errors
are swallowed by verl at DEBUG level, which is why the trainer checks the names again at start-up
and logs the result (:func:`oma.integrations.verl.status`).

This module is deliberately tiny (stdlib only): it installs two post-import hooks
(:mod:`oma.integrations.verl._hooks`):

* ``verl.trainer.ppo.core_algos`` → registers the estimators ``oma_grpo``, ``oma_rloo``,
  ``oma_gigpo`` (:mod:`oma.integrations.verl.estimators`);
* ``verl.trainer.ppo.v1`` → imports :mod:`oma.integrations.verl.trainer`, which registers the
  trajectory-aware trainers ``oma_sync``, ``oma_colocate_async``, ``oma_separate_async``.

So ``import verl`` stays as fast as without oma, and the names exist whenever verl can look them up.
"""

from __future__ import annotations

import logging

from oma.integrations.verl import _hooks

logger = logging.getLogger("oma.integrations.verl")

CORE_ALGOS = "verl.trainer.ppo.core_algos"
V1_PACKAGE = "verl.trainer.ppo.v1"


def _register_estimators(core_algos) -> None:
    from oma.integrations.verl.estimators import register

    register(core_algos)


def _register_trainers(_v1) -> None:
    import oma.integrations.verl.trainer  # noqa: F401  (registers on import)


def install() -> None:
    """Install the post-import hooks (idempotent per module: a module executes once)."""
    _hooks.when_imported(CORE_ALGOS, _register_estimators)
    _hooks.when_imported(V1_PACKAGE, _register_trainers)
    logger.debug("oma: verl plugin loaded; hooks on %s and %s", CORE_ALGOS, V1_PACKAGE)


install()
