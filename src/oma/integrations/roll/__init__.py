"""OMA inside ROLL's agentic pipeline (github.com/alibaba/ROLL, written against commit 8eb27cc): docs/roll.md.

ROLL is not on PyPI and has no estimator registry. oma plugs in with two lines in the driver script
(:func:`install`, which wraps the pipeline module's ``agentic_compute_advantage``) and, under Mass
Alignment, ``actor_train.worker_cls: oma.integrations.roll.worker.ActorWorker``. Nothing here imports ROLL
until :func:`install` runs.

* :mod:`oma.integrations.roll.batch`: :func:`check_config`, :func:`align_batch` (the step on ROLL's
  column names, through :mod:`oma.hosts`) and the carrier the actor applies per micro-batch;
* :mod:`oma.integrations.roll.hook`: :func:`install` and the wrapped ``agentic_compute_advantage``;
* :mod:`oma.integrations.roll.worker`: the actor (imports ROLL);
* ``python -m oma.integrations.roll check-install [PATH]``: the hook against a ROLL checkout's own code.
"""

from oma.integrations.roll.batch import RollConfigError, RollResult, Setup, align_batch, check_config
from oma.integrations.roll.hook import compute_advantage, install

__all__ = ["RollConfigError", "RollResult", "Setup", "align_batch", "check_config", "compute_advantage", "install"]
