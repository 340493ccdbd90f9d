"""oma inside SkyRL (``pip install 'oma-rl[skyrl]'``, Python >= 3.12): docs/skyrl.md.

* :mod:`oma.integrations.skyrl.batch`: the math on a step-wise batch (no SkyRL import);
* :mod:`oma.integrations.skyrl.trainer`: ``OMASkyRLTrainConfig``, ``OMARayPPOTrainer``,
  ``OMAFullyAsyncRayPPOTrainer`` and the entry point (imports SkyRL and Ray).
"""

from oma.integrations.skyrl.batch import OMAConfig, check_config, mass_weights, row_accounted_advantages, stepwise_structure

__all__ = ["OMAConfig", "check_config", "mass_weights", "row_accounted_advantages", "stepwise_structure"]
