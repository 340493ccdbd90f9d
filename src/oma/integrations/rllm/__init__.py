"""OMA inside rLLM's verl backend (github.com/rllm-org/rllm, verl 0.8.0): docs/rllm.md.

rLLM already computes one advantage per trajectory of each TrajectoryGroup (Outcome Alignment); this
integration adds Mass Alignment: the rows a trajectory became (prefix-merged, or split where merging broke)
share one objective mass. Nothing here imports rLLM or verl.

* :mod:`oma.integrations.rllm.batch`: :func:`align_batch` on a batch by rLLM's column names, and
  :class:`ActorLoss`, how verl 0.8.0's engine loss weighs each row;
* :mod:`oma.integrations.rllm.backend`: :func:`backend_class`, rLLM's ``VerlBackend`` with the hook, and
  :func:`check_config`, the start-up refusals.
"""

from oma.integrations.rllm.backend import backend_class, check_config
from oma.integrations.rllm.batch import ActorLoss, RllmConfigError, RllmResult, align_batch

__all__ = ["ActorLoss", "RllmConfigError", "RllmResult", "align_batch", "backend_class", "check_config"]
