"""oma.integrations: adapters that run oma's math inside other training frameworks.

Each integration lives in its own subpackage and is imported lazily (never from here), so
``import oma`` and ``import oma.integrations`` stay free of heavy dependencies. An integration reads
its framework's batch and config into the host contract, :mod:`oma.hosts` (docs/hosts.md), and hands
the result back; the math is never copied.

* :mod:`oma.integrations.verl` — verl 0.9.x plugin: estimators ``oma_grpo``/``oma_rloo``/
  ``oma_gigpo`` and the trajectory-aware trainers ``oma_sync``/``oma_colocate_async``/
  ``oma_separate_async`` (docs/verl.md).
* :mod:`oma.integrations.verl_agent` — verl-agent (verl 0.3.1 vendored): the advantages and weights a
  patched ``RayPPOTrainer.fit`` calls for, and a dumped batch checked offline (docs/verl-agent.md).
* :mod:`oma.integrations.skyrl` — SkyRL 0.4.x: its step-wise trainers with OMA (docs/skyrl.md).
"""
