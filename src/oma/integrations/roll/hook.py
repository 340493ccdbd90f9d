"""What ``oma.integrations.roll.install`` puts in ROLL's agentic pipeline (docs/roll.md#how-it-works): its
``agentic_compute_advantage``, as the pipeline module imported it by name, wrapped so that oma's advantages
(and, under Mass Alignment, the weights the actor carries) are written into the batch. No ROLL import here:
the batch is used through ``batch`` (tensors), ``non_tensor_batch`` (numpy arrays) and ``meta_info``."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import Any


from oma.integrations.roll.batch import (ADV_KEY, NON_TENSOR_COLUMNS, TENSOR_COLUMNS, WEIGHTS_KEY, RollConfigError,
                                         Setup, align_batch, check_config)

PIPELINE_MODULE = "roll.pipeline.agentic.agentic_pipeline"
HOOKED = ("agentic_compute_advantage", "compute_response_level_rewards")
"""Names the pipeline module imports from ``roll.pipeline.agentic.utils`` and calls in ``AgenticPipeline.run``:
the first is wrapped; both must be there, or this is not the ROLL the hook was written for."""


def columns(data: Any) -> dict[str, Any]:
    """The columns :func:`~oma.integrations.roll.batch.align_batch` reads, from a ROLL ``DataProto``."""
    out: dict[str, Any] = {k: data.non_tensor_batch[k] for k in NON_TENSOR_COLUMNS if k in data.non_tensor_batch}
    keys = set(data.batch.keys())
    out.update({k: data.batch[k] for k in TENSOR_COLUMNS if k in keys})
    return out


def compute_advantage(data: Any, *, setup: Setup, original: Callable[..., Any], counter: Any = None, **kwargs: Any) -> Any:
    """ROLL's ``agentic_compute_advantage`` (``original``, for its ``returns`` and ``raw_advantages``), then oma's
    advantages in ``advantages`` and, under Mass Alignment, ``oma_adv`` and ``oma_weights`` for the actor; the
    ``oma/*`` metrics go into ``meta_info['metrics']``, which the pipeline logs. oma reads its columns first:
    a malformed batch is refused before anything is written."""
    result = align_batch(columns(data), setup.options, iteration=None if counter is None else next(counter))
    data = original(data=data, **kwargs)
    mask = data.batch["response_mask"]
    data.batch["advantages"] = result.token_adv.to(mask.device)
    if result.weights is not None:
        data.batch[ADV_KEY] = result.token_adv.to(mask.device)
        data.batch[WEIGHTS_KEY] = result.weights.to(mask.device)
    metrics = dict(data.meta_info.get("metrics", {}) or {})
    metrics.update(result.metrics)
    data.meta_info["metrics"] = metrics
    return data


def install(node: Mapping[str, Any] | None, pipeline_config: Any, module: Any = None) -> Setup:
    """Check the run (:func:`~oma.integrations.roll.batch.check_config`) and wrap ``agentic_compute_advantage``
    in ROLL's pipeline module (imported here, or ``module``). Call it in the driver before the pipeline runs."""
    setup = check_config(pipeline_config, node)
    if module is None:
        import importlib

        module = importlib.import_module(PIPELINE_MODULE)
    missing = [name for name in HOOKED if not callable(getattr(module, name, None))]
    if missing or not hasattr(getattr(module, "AgenticPipeline", None), "adjust_batch"):
        raise RollConfigError(f"{PIPELINE_MODULE} has no {missing or ['AgenticPipeline.adjust_batch']}: oma's ROLL "
                              "integration was written for ROLL at commit 8eb27cc (docs/roll.md)")
    original = getattr(module.agentic_compute_advantage, "__wrapped_by_oma__", module.agentic_compute_advantage)
    wrapped = functools.partial(compute_advantage, setup=setup, original=original, counter=itertools.count())
    wrapped.__wrapped_by_oma__ = original  # type: ignore[attr-defined]  # a second install wraps ROLL's, not ours
    module.agentic_compute_advantage = wrapped
    print(setup, flush=True)
    return setup


__all__ = ["columns", "compute_advantage", "install"]
