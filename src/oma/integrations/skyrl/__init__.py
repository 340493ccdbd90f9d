"""oma inside SkyRL (``pip install 'oma-rl[skyrl]'``, Python >= 3.12): docs/skyrl.md.

* :mod:`oma.integrations.skyrl.batch`: SkyRL's batch and config read into the host contract (no SkyRL import);
* :mod:`oma.integrations.skyrl.trainer`: ``OMASkyRLTrainConfig``, ``OMARayPPOTrainer``,
  ``OMAFullyAsyncRayPPOTrainer`` and the entry point (imports SkyRL and Ray).
"""

from oma.integrations.skyrl.batch import changes_skyrl, check_config, check_version, host_options, host_step

__all__ = ["changes_skyrl", "check_config", "check_version", "host_options", "host_step"]
