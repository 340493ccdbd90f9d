"""The variants of a comparison (docs/experiments.md#the-metrics): outcome accounting × objective mass, names and switches.

A variant fixes ``algo.accounting`` (``row`` = verl-agent's stepwise statistics, ``trajectory`` =
Outcome Alignment, OA) and ``algo.mass`` (``native`` = the reducer's own mass, ``uniform`` = Mass
Alignment, MA); everything else (estimator, objective, reducer, …) comes from the compared config.
"""

from __future__ import annotations

from dataclasses import dataclass

BASELINE = "row+native"
"""The reference of every paired difference: verl / verl-agent's stepwise accounting as it is."""


@dataclass(frozen=True)
class Variant:
    name: str
    """Display and folder name, e.g. ``OA+MA``."""
    accounting: str
    """``algo.accounting``: ``row`` or ``trajectory``."""
    mass: str
    """``algo.mass``: ``native`` or ``uniform``."""
    audit_name: str
    """The matching accounting of :func:`oma.diagnostics.audit` (``trajectory+aligned`` for OA+MA)."""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("row+native", "row", "native", "row+native"),
        Variant("row+MA", "row", "uniform", "row+aligned"),
        Variant("OA+native", "trajectory", "native", "trajectory+native"),
        Variant("OA+MA", "trajectory", "uniform", "trajectory+aligned"),
    )
}
"""All four accountings; the baseline first."""

VARIANT_SETS: dict[str, tuple[str, ...]] = {
    "2x2": ("row+native", "row+MA", "OA+native", "OA+MA"),
    "2": ("row+native", "OA+MA"),
    "3": ("row+native", "row+MA", "OA+MA"),
    "baseline": ("row+native",),
}
"""``--variants`` values: the full 2×2; the baseline against full OMA for quick runs; the baseline, MA alone and full
OMA (what MA contributes to OMA's effect, for a third less than the 2×2 where runs are costly); or the baseline alone
(a pilot of a setting's coupling and room to learn, before any comparison is run)."""


def variant_set(name: str) -> tuple[Variant, ...]:
    """The variants of ``--variants name``; ValueError naming the valid values otherwise."""
    if name not in VARIANT_SETS:
        raise ValueError(f"--variants {name!r} is not valid; expected one of {list(VARIANT_SETS)}")
    return tuple(VARIANTS[v] for v in VARIANT_SETS[name])
