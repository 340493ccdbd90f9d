"""oma.diagnostics: the implicit-weighting audit of stepwise rollout batches (docs/audit.md).

* :func:`audit` — every figure of one batch under row/trajectory × native/aligned accounting,
  as an :class:`AuditReport` (math from :mod:`oma.core`).
* :func:`read_batch` — a JSONL / CSV / Parquet dump (column remapping for verl / verl-agent).
* :func:`write_batch` — the trainer's hook: one Parquet batch per iteration, atomically, at
  :func:`batch_path` ``(RUN, it)`` = ``RUN/batches/iter_000001.parquet``.
* ``oma audit FILE|RUN_DIR`` — :mod:`oma.diagnostics.cli`.
"""

from oma.diagnostics.audit import audit
from oma.diagnostics.figures import ACCOUNTING_NAMES, AccountingFigures, AuditReport, DirectionSplit
from oma.diagnostics.io import (
    ROLES,
    AuditInputError,
    BatchColumns,
    batch_from_table,
    batch_path,
    read_batch,
    run_batches,
    write_batch,
)

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
