"""oma.integrations: adapters that run oma's math inside other training frameworks.

Each integration lives in its own subpackage and is imported lazily (never from here), so
``import oma`` and ``import oma.integrations`` stay free of heavy dependencies. Integrations
depend on :mod:`oma.core` only (docs/verl.md); the math is never copied.

* :mod:`oma.integrations.verl` — verl 0.9.x plugin: estimators ``oma_grpo``/``oma_rloo``/
  ``oma_gigpo`` and the trajectory-aware trainers ``oma_sync``/``oma_colocate_async``/
  ``oma_separate_async`` (docs/verl.md).
"""
