r"""Row sums of :func:`oma.core.token_weights` from token counts, without the [R, L] tensor.

The audit reads batches of 10^6 rows whose responses hold hundreds of tokens; materialising the
float64 W[R, L] of ``token_weights`` would need gigabytes. Every reducer of oma.core gives row r's
tokens one common weight that depends on the mask only through n_r = Σ_l m[r, l] (and, for
``seq-mean-token-sum-norm``, the padded length L), so the row sums Σ_l W[r, l] = n_r·coef_r follow
from the counts alone.

This is a *core helper that oma.core does not have yet* (proposed for ``oma.core.weights``; its
owner decides). It is assembled from oma.core's own building blocks (``_row_unit``,
``_scope_counts``, ``_mass_targets``), so each reducer and mass rule is still defined once, in
oma.core; ``tests/test_audit_core_ext.py`` checks it against ``token_weights(...).sum(-1)`` and
``implicit_mass`` for every reducer × mass rule.
"""

from __future__ import annotations

import torch
from torch import Tensor

from oma.core import MASSES, REDUCERS
from oma.core._validate import check_option
from oma.core.segments import BatchStructure, segment_sum
from oma.core.weights import _mass_targets, _row_unit, _scope_counts


def row_weight_sums(
    n_tokens: Tensor,
    structure: BatchStructure,
    *,
    reducer: str = "token-mean",
    mass: str = "native",
    length: int,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """Σ_l W[r, l] of ``token_weights(mask, ..., reducer=reducer, mass=mass)``, float64 [R].

    Args:
        n_tokens: trainable tokens of each row, n_r = Σ_l mask[r, l] (any real dtype, ≥ 0), [R].
        structure: ``oma.core.segments.batch_structure(group_index, traj_index)`` of the batch.
        reducer, mass: as in :func:`oma.core.token_weights`.
        length: the padded response length L (used only by ``seq-mean-token-sum-norm``).
        loss_scale_factor: as in :func:`oma.core.token_weights`.
    """
    check_option("reducer", reducer, REDUCERS)
    check_option("mass", mass, MASSES)
    n = n_tokens.to(torch.float64)
    unit = _row_unit(reducer, n, max(int(length), 1), loss_scale_factor)
    counts = _scope_counts(reducer, n)
    if mass == "native":
        coef = unit if counts is None else unit / counts.sum().clamp_min(1.0)
    else:
        tinv = structure.traj.inverse
        active_traj = segment_sum(n, tinv, structure.n_traj) > 0
        per_traj = _mass_targets(mass, structure, active_traj)
        if counts is not None:
            per_traj = per_traj / segment_sum(counts, tinv, structure.n_traj).clamp_min(1.0)
        coef = unit * per_traj[tinv]
    coef = torch.where(n > 0, coef, torch.zeros_like(coef))
    return n * coef
