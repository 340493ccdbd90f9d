"""oma.core: the pure math of Outcome-Mass Alignment (docs/math.md).

Pure functions over torch tensors plus integer id arrays; no config, logging or state.
"""

from oma.core.advantages import (
    ACCOUNTINGS,
    ESTIMATORS,
    Accounting,
    Estimator,
    GroupOutcomeStats,
    discounted_returns,
    gigpo_advantages,
    group_outcome_stats,
    outcome_advantages,
    trajectory_outcomes,
)
from oma.core.anchors import anchor_ids
from oma.core.batching import micro_batches, trajectory_minibatches
from oma.core.objectives import OBJECTIVES, Objective, clipped_tokens, kl_k3, token_entropy, token_objective
from oma.core.segments import BatchStructure, TrajectorySplitError, batch_structure, segment_sum
from oma.core.weights import MASSES, REDUCERS, Mass, Reducer, implicit_mass, row_coefficients, token_weights, weighted_loss

__all__ = [
    "ACCOUNTINGS",
    "ESTIMATORS",
    "MASSES",
    "OBJECTIVES",
    "REDUCERS",
    "Accounting",
    "BatchStructure",
    "Estimator",
    "GroupOutcomeStats",
    "Mass",
    "Objective",
    "Reducer",
    "TrajectorySplitError",
    "anchor_ids",
    "batch_structure",
    "clipped_tokens",
    "discounted_returns",
    "gigpo_advantages",
    "group_outcome_stats",
    "implicit_mass",
    "kl_k3",
    "micro_batches",
    "outcome_advantages",
    "row_coefficients",
    "segment_sum",
    "token_entropy",
    "token_objective",
    "token_weights",
    "trajectory_minibatches",
    "trajectory_outcomes",
    "weighted_loss",
]
