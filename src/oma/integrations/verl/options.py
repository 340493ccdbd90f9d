"""``algorithm.oma.*``: the OMA options of a verl run, read into :class:`oma.hosts.HostOptions`
(docs/verl.md#configuration-reference).

The keys are the contract's (:class:`oma.hosts.HostOptions`), refused by name when unknown or out of range,
with verl's defaults where verl already says it:

* ``norm_by_std``: ``algorithm.norm_adv_by_std_in_grpo`` (verl's default true);
* ``loss_scale_factor``: ``actor.loss_scale_factor`` (the trainer passes it), else the batch's padded length;
* ``estimator`` is not a key here: ``algorithm.adv_estimator`` names it (``oma_grpo`` → ``grpo``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oma.hosts import HostOptions

KEY = "algorithm.oma"

ESTIMATOR_OF: dict[str, str] = {"oma_grpo": "grpo", "oma_rloo": "rloo", "oma_gigpo": "gigpo"}
"""verl's ``algorithm.adv_estimator`` (oma's registered names) → the contract's estimator."""

_MISSING = object()


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for dicts, OmegaConf DictConfigs and (verl) dataclass configs; default if absent/None cfg."""
    if cfg is None:
        return default
    if isinstance(cfg, Mapping) or hasattr(cfg, "keys") and hasattr(cfg, "get"):
        try:
            value = cfg.get(key, _MISSING)
        except Exception:  # noqa: BLE001 - structured configs may raise on unknown keys
            value = _MISSING
        return default if value is _MISSING else value
    return getattr(cfg, key, default)


def cfg_select(cfg: Any, dotted: str, default: Any = None) -> Any:
    """Nested :func:`cfg_get` along a dotted path."""
    node = cfg
    for part in dotted.split("."):
        node = cfg_get(node, part, _MISSING)
        if node is _MISSING or node is None:
            return default
    return node


def host_options(algorithm: Any, *, estimator: str | None = None, loss_scale_factor: float | None = None) -> HostOptions:
    """The options of ``algorithm.oma`` (module docstring).

    Args:
        algorithm: verl's ``algorithm`` node: an OmegaConf node, a dict, verl's ``AlgoConfig`` or None.
        estimator: the registered name the options are for (an estimator knows its own); default
            ``algorithm.adv_estimator``.
        loss_scale_factor: L_norm when ``algorithm.oma`` sets none (``actor.loss_scale_factor``).
    """
    node = cfg_get(algorithm, "oma", None)
    if node is None:
        keys = []
    else:  # an OmegaConf node or a dict, or a dataclass
        keys = list(node.keys()) if hasattr(node, "keys") else [k for k in vars(node) if not k.startswith("_")]
    defaults: dict[str, Any] = {"norm_by_std": bool(cfg_get(algorithm, "norm_adv_by_std_in_grpo", True))}
    name = estimator or cfg_get(algorithm, "adv_estimator", None)
    if name in ESTIMATOR_OF:
        defaults["estimator"] = ESTIMATOR_OF[name]
    if loss_scale_factor is not None:
        defaults["loss_scale_factor"] = float(loss_scale_factor)
    return HostOptions.from_mapping(
        {str(k): cfg_get(node, k) for k in keys}, prefix=KEY,
        refused={"estimator": f"is not an option: algorithm.adv_estimator names it ({', '.join(ESTIMATOR_OF)})"},
        **defaults)
