"""oma.diagnostics: the implicit-weighting audit of stepwise rollout batches (docs/audit.md).

* :func:`audit` — every figure of one batch under row/trajectory × native/aligned accounting,
  as an :class:`AuditReport` (math from :mod:`oma.core`).
* :func:`read_batch` — a JSONL / CSV / Parquet dump (column remapping for verl / verl-agent;
  :mod:`oma.diagnostics.tables`, verl-agent's own dumps :mod:`oma.diagnostics.verl_agent`).
* :func:`write_batch` — the trainer's hook: one Parquet batch per iteration, atomically, at
  :func:`batch_path` ``(RUN, it)`` = ``RUN/batches/iter_000001.parquet`` (:mod:`oma.batchfile`, below
  this package so the trainers write batches without importing it; re-exported here).
* ``oma audit FILE|RUN_DIR`` — :mod:`oma.diagnostics.cli`.
"""

from oma.batchfile import batch_path, run_batches, write_batch
from oma.diagnostics.audit import audit
from oma.diagnostics.figures import ACCOUNTING_NAMES, AccountingFigures, AuditReport, DirectionSplit
from oma.diagnostics.tables import ROLES, AuditInputError, BatchColumns, batch_from_table, read_batch

__all__ = [
    "ACCOUNTING_NAMES",
    "ROLES",
    "AccountingFigures",
    "AuditInputError",
    "AuditReport",
    "BatchColumns",
    "DirectionSplit",
    "audit",
    "batch_from_table",
    "batch_path",
    "read_batch",
    "run_batches",
    "write_batch",
]
