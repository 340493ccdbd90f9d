"""``algorithm.oma.*``: the OMA options of a verl run, with their defaults.

| key | default | meaning |
|---|---|---|
| ``accounting`` | ``trajectory`` | outcome statistics over unique trajectories (OA) or rows (``row``, verl/verl-agent baseline) |
| ``mass`` | ``uniform`` | trajectory mass target of Mass Alignment: ``uniform`` (1/T), ``group`` (1/(G·|𝒯_g|)), ``native`` (off) |
| ``reducer`` | ``token-mean`` | the optimizer's native aggregation *inside* a trajectory (verl ``loss_agg_mode`` names) |
| ``norm_by_std`` | ``algorithm.norm_adv_by_std_in_grpo`` (verl default true) | divide by the group std (grpo/gigpo) |
| ``gamma`` | ``0.95`` | GiGPO step-return discount γ |
| ``step_advantage_w`` | ``1.0`` | GiGPO step-advantage weight ω |
| ``eps`` | ``1e-6`` | ε of the std normaliser (verl's value) |
| ``loss_scale_factor`` | ``actor.loss_scale_factor``, else the batch's padded response length | L_norm of ``seq-mean-token-sum-norm`` |
| ``outcome`` | ``mean`` | a trajectory's outcome: the ``mean`` of its rows' scores (oma.core's R_τ), or the score of its ``final`` row (verl's rule: the reward on the last turn; they differ when a reward model scores every row, or under ``use_kl_in_reward``) |

Unknown keys under ``algorithm.oma`` are an error (a typo must not silently fall back to a default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

_MISSING = object()

OUTCOMES: tuple[str, ...] = ("mean", "final")
"""``algorithm.oma.outcome``: a trajectory's outcome from its rows' scores (module docstring)."""


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


@dataclass(frozen=True)
class OMAOptions:
    """Validated OMA options of one run (see the module docstring for each key)."""

    accounting: str = "trajectory"
    mass: str = "uniform"
    reducer: str = "token-mean"
    norm_by_std: bool = True
    gamma: float = 0.95
    step_advantage_w: float = 1.0
    eps: float = 1e-6
    loss_scale_factor: float | None = None
    outcome: str = "mean"

    def __post_init__(self) -> None:
        from oma.core import ACCOUNTINGS, MASSES, REDUCERS

        for name, value, allowed in (
            ("accounting", self.accounting, ACCOUNTINGS),
            ("mass", self.mass, MASSES),
            ("reducer", self.reducer, REDUCERS),
            ("outcome", self.outcome, OUTCOMES),
        ):
            if value not in allowed:
                raise ValueError(f"algorithm.oma.{name} must be one of {list(allowed)}, got {value!r}")
        if not 0.0 <= float(self.gamma) <= 1.0:
            raise ValueError(f"algorithm.oma.gamma must be in [0, 1], got {self.gamma}")
        if float(self.step_advantage_w) < 0.0:
            raise ValueError(f"algorithm.oma.step_advantage_w must be >= 0, got {self.step_advantage_w}")
        if float(self.eps) < 0.0:
            raise ValueError(f"algorithm.oma.eps must be >= 0, got {self.eps}")
        if self.loss_scale_factor is not None and not float(self.loss_scale_factor) > 0:
            raise ValueError(f"algorithm.oma.loss_scale_factor must be > 0 or null, got {self.loss_scale_factor}")

    @classmethod
    def from_algorithm_config(cls, algorithm: Any) -> OMAOptions:
        """Read ``algorithm.oma`` (and ``algorithm.norm_adv_by_std_in_grpo``) from a verl algorithm config.

        ``algorithm`` may be an OmegaConf node, a dict, verl's ``AlgoConfig`` or None (all defaults).
        """
        node = cfg_get(algorithm, "oma", None)
        known = {f.name for f in fields(cls)}
        given: dict[str, Any] = {}
        if node is not None:
            keys = list(node.keys()) if hasattr(node, "keys") else [k for k in vars(node) if not k.startswith("_")]
            unknown = sorted(str(k) for k in keys if k not in known)
            if unknown:
                raise ValueError(f"unknown key(s) under algorithm.oma: {unknown}; known: {sorted(known)}")
            for key in keys:
                value = cfg_get(node, key)
                if value is not None:
                    given[str(key)] = value
        if "norm_by_std" not in given:
            given["norm_by_std"] = bool(cfg_get(algorithm, "norm_adv_by_std_in_grpo", True))
        for key in ("gamma", "step_advantage_w", "eps", "loss_scale_factor"):
            if key in given:
                given[key] = float(given[key])
        if "norm_by_std" in given:
            given["norm_by_std"] = bool(given["norm_by_std"])
        return cls(**given)

    def with_loss_scale_factor(self, value: float | None) -> OMAOptions:
        return self if self.loss_scale_factor is not None or value is None else replace(self, loss_scale_factor=float(value))
