"""OMA inside verl-agent (github.com/langfengQ/verl-agent, verl 0.3.1 vendored): docs/verl-agent.md.

verl-agent is not on PyPI and has no estimator registry, so oma plugs in through a four-line patch of
``RayPPOTrainer.fit``: mark the rows before ``adjust_batch`` pads the batch, and call
:func:`compute_advantage` in place of verl-agent's own. Nothing here imports verl.

* :mod:`oma.integrations.verl_agent.batch`: :func:`align_batch`, the math on a batch given by
  verl-agent's column names (also for a dumped batch, offline), and :class:`ActorLoss`, how
  verl-agent's actor turns per-token losses into each optimizer step's loss;
* :mod:`oma.integrations.verl_agent.trainer`: :func:`check_config` and :func:`compute_advantage`,
  what the patch calls;
* ``python -m oma.integrations.verl_agent check BATCH``: a dumped batch's per-trajectory advantages
  and mass under both accountings;
* ``python -m oma.integrations.verl_agent check-install [PATH]``: the hook against a verl-agent
  checkout's own code (:mod:`oma.integrations.verl_agent.check_install`).
"""

from oma.integrations.verl_agent.batch import ActorLoss, VerlAgentConfigError, VerlAgentResult, align_batch
from oma.integrations.verl_agent.trainer import Setup, check_config, compute_advantage

__all__ = ["ActorLoss", "Setup", "VerlAgentConfigError", "VerlAgentResult", "align_batch", "check_config",
           "compute_advantage"]
