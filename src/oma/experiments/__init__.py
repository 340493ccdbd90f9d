"""oma.experiments: matched-horizon comparisons of the accountings over seeds (docs/experiments.md).

* ``oma compare CONFIG ... --variants 2x2 --seeds 3 --horizon H`` — :mod:`oma.experiments.compare`:
  row/trajectory × native/MA runs of one config, seeds 0..S−1, resumable, optionally parallel.
* ``oma report DIR`` — :mod:`oma.experiments.report`: success curves, endpoint and nAUC with 95% CIs,
  paired differences to row+native, the measured expansion–outcome coupling (oma.diagnostics.audit).
* ``oma coupling-map`` and ``oma dose-response`` — :mod:`oma.experiments.coupling_map`,
  :mod:`oma.experiments.dose_response`: the tabular lane's sweeps of ``oma compare`` cells
  (:mod:`oma.experiments.sweep`), OMA's effect across kinds of failure and against the expansion ratio.
* :mod:`oma.experiments.stats` — the pure statistics (endpoint, nAUC, Student-t CIs, paired differences, Holm's correction).
"""

from oma.experiments.stats import Estimate, endpoint, holm, mean_ci, nauc, paired_diff, t_quantile
from oma.experiments.variants import BASELINE, VARIANT_SETS, VARIANTS, Variant

__all__ = ["BASELINE", "VARIANTS", "VARIANT_SETS", "Estimate", "Variant", "endpoint", "holm", "mean_ci", "nauc", "paired_diff",
           "t_quantile"]
