"""Renderers of an :class:`~oma.diagnostics.audit.AuditReport`: verdict, JSON, tables (rich / Markdown / HTML).

The tables are built once as neutral :class:`Section` objects and then written three ways, so the
terminal report, the Markdown and the HTML always show the same figures.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from oma.diagnostics.audit import AuditReport

SCHEMA_VERSION = 1


# ------------------------------------------------------------------------------------------------
# JSON


def _num(x) -> float | int | None:
    """JSON-safe number: NaN/inf → None, floats rounded to 12 significant digits (stable text)."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.12g}")


def _arr(a: np.ndarray) -> list:
    if a.dtype.kind in "iub":
        return a.tolist()
    if a.dtype.kind == "f":
        return [_num(v) for v in a.tolist()]
    return [v if isinstance(v, (int, str)) else str(v) for v in a.tolist()]


def report_dict(r: AuditReport, *, per_group: bool = True) -> dict:
    """The ``--json`` document (docs/audit.md lists every key). Key order is fixed."""
    acc = r.accountings

    def by_acc(attr: str) -> dict:
        return {k: _num(getattr(a, attr)) for k, a in acc.items()}

    out: dict = {
        "schema_version": SCHEMA_VERSION,
        "source": r.source,
        "rows": r.rows,
        "trajectories": r.trajectories,
        "groups": r.groups,
        "rows_per_traj_mean": _num(r.rows_per_traj_mean),
        "expansion_ratio_fail_over_success": _num(r.expansion_ratio_fail_over_success),
        "mu_row_minus_mu_traj_mean": _num(r.mu_row_minus_mu_traj_mean),
        "kish_ess_fraction": by_acc("kish_ess_fraction"),
        "mass_share_success": by_acc("mass_share_success"),
        "mass_share_failure": by_acc("mass_share_failure"),
        "mass_share_longest10": by_acc("mass_share_longest10"),
        "kish_ess": by_acc("kish_ess"),
        "push_ess_fraction": by_acc("push_ess_fraction"),
        "net_push": by_acc("net_push"),
        "groups_pushed_up": by_acc("groups_pushed_up"),
        "groups_pushed_down": by_acc("groups_pushed_down"),
        "advantage_success_mean": by_acc("advantage_success_mean"),
        "advantage_failure_mean": by_acc("advantage_failure_mean"),
        "degenerate_mass_share": by_acc("degenerate_mass_share"),
        "settings": {
            "reducer": r.reducer,
            "aligned_mass": r.aligned_mass,
            "estimator": r.estimator,
            "norm_by_std": r.norm_by_std,
            "eps": _num(r.eps),
            "success_rule": r.success_rule,
        },
        "successes": r.successes,
        "failures": r.failures,
        "rows_per_traj": {
            "all": _num(r.rows_per_traj_mean),
            "success": _num(r.rows_per_traj_success_mean),
            "failure": _num(r.rows_per_traj_failure_mean),
        },
        "tokens_per_traj": {
            "all": _num(r.tokens_per_traj_mean),
            "success": _num(r.tokens_per_traj_success_mean),
            "failure": _num(r.tokens_per_traj_failure_mean),
        },
        "token_ratio_fail_over_success": _num(r.token_ratio_fail_over_success),
        "coupling": {
            "rows_vs_outcome": _num(r.coupling_rows_outcome),
            "tokens_vs_outcome": _num(r.coupling_tokens_outcome),
        },
        "mu_row_minus_mu_traj": {
            "mean": _num(r.mu_row_minus_mu_traj_mean),
            "abs_mean": _num(r.mu_row_minus_mu_traj_abs_mean),
            "min": _num(r.mu_row_minus_mu_traj_min),
            "max": _num(r.mu_row_minus_mu_traj_max),
        },
        "singleton_groups": dict(r.singleton_groups),
        "zero_spread_groups": dict(r.zero_spread_groups),
        "duplicated_rows": r.duplicated_rows,
        "group_mass_shift_tv": _num(r.group_mass_shift_tv),
        "direction_split": {
            "baseline": "row+native",
            **{
                k: {
                    "cos_within": _num(d.cos_within),
                    "cos_between": _num(d.cos_between),
                    "cos_total": _num(d.cos_total),
                    "scale_ratio": _num(d.scale_ratio),
                }
                for k, d in r.direction_split.items()
            },
        },
        "verdict": verdict(r),
    }
    if per_group:
        out["per_group"] = {
            "group_id": _arr(np.asarray(r.group_labels)),
            "trajectories": _arr(r.group_trajectories),
            "mu_row": _arr(r.mu_row),
            "mu_traj": _arr(r.mu_traj),
            "mass": {"native": _arr(r.group_mass_native), "aligned": _arr(r.group_mass_aligned)},
            "net_push": {k: _arr(a.net_push_per_group) for k, a in acc.items()},
        }
    return out


# ------------------------------------------------------------------------------------------------
# verdict


def _pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _f(x: float, spec: str = ".3g") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, spec)


def verdict(r: AuditReport) -> str:
    """One plain-language paragraph: expansion, mass by outcome, baseline shift, push, direction, warnings."""
    acc = r.accountings
    today, oa, ma, full = acc["row+native"], acc["trajectory+native"], acc["row+aligned"], acc["trajectory+aligned"]
    parts: list[str] = []
    if r.successes and r.failures:
        ratio = r.expansion_ratio_fail_over_success
        ks, kf = r.rows_per_traj_success_mean, r.rows_per_traj_failure_mean
        if ratio >= 1.05:
            parts.append(f"Failures expand {ratio:.1f}x more than successes ({kf:.1f} vs {ks:.1f} rows per trajectory)")
        elif ratio <= 1 / 1.05:
            parts.append(
                f"Successes expand {1 / ratio:.1f}x more than failures ({ks:.1f} vs {kf:.1f} rows per trajectory)"
            )
        else:
            parts.append(f"Successes and failures expand about equally ({ks:.1f} vs {kf:.1f} rows per trajectory)")
        parts[-1] += (
            f"; under {r.reducer} the failures carry {_pct(today.mass_share_failure)} of the objective mass, "
            f"and OMA ({r.aligned_mass} mass) would give them {_pct(full.mass_share_failure)}."
        )
    else:
        which = "a success" if not r.successes else "a failure"
        parts.append(
            f"None of the {r.trajectories} trajectories counts as {which} under the rule '{r.success_rule}', so the "
            "outcome split is one-sided (pass a won column or --success-threshold if that is wrong)."
        )
    if r.mu_row_minus_mu_traj_abs_mean > 1e-12:
        parts.append(
            f"Counting each outcome once per row moves the group baselines by {r.mu_row_minus_mu_traj_mean:+.3g} on "
            f"average (mean |shift| {r.mu_row_minus_mu_traj_abs_mean:.3g})."
        )
    else:
        parts.append("Row and trajectory accounting agree on every group's baseline.")

    def signed(x: float) -> str:
        return "0" if x == 0 else _f(x, "+.3f")

    push = (
        f"Net signed push (Σ mass × advantage; negative = toward failures) is {signed(today.net_push)} today, "
        f"{signed(oa.net_push)} with OA alone, {signed(ma.net_push)} with MA alone "
        f"and {signed(full.net_push)} with both"
    )
    if oa.net_push < today.net_push - 1e-9 * (1 + abs(today.net_push)):
        push += ": OA alone leans further toward failures than today, so switch OA and MA together."
    else:
        push += "."
    parts.append(push)
    d = r.direction_split.get("trajectory+aligned")
    if d is not None and math.isfinite(d.cos_total):
        parts.append(
            f"Against today's update, full OMA keeps the within-group direction at cosine {d.cos_within:.2f} and the "
            f"spread across groups at cosine {d.cos_between:.2f} (update size x{d.scale_ratio:.2f}); Mass Alignment "
            f"moves {_pct(r.group_mass_shift_tv)} of the objective mass between groups."
        )
    parts.append(
        f"Effective trajectories (Kish): {_pct(today.kish_ess_fraction)} of {r.trajectories} today, "
        f"{_pct(full.kish_ess_fraction)} aligned."
    )
    n_deg = r.singleton_groups["trajectory"] + r.zero_spread_groups["trajectory"]
    if n_deg:
        parts.append(
            f"Warning: {n_deg} of {r.groups} groups have one trajectory or one outcome, so their advantage is 0; they "
            f"hold {_pct(today.degenerate_mass_share)} of today's mass."
        )
    if r.duplicated_rows:
        parts.append(f"Warning: {r.duplicated_rows} rows repeat a (traj_id, step) pair; check the dump.")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------------
# tables


@dataclass(frozen=True)
class Section:
    """A titled table: ``headers`` and ``rows`` of already formatted strings; ``note`` below it."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


def fmt(x, kind: str = "g") -> str:
    if x is None:
        return "–"
    if isinstance(x, (int, np.integer)) and kind != "%":
        return str(int(x))
    x = float(x)
    if not math.isfinite(x):
        return "–"
    if kind == "%":
        return f"{100 * x:.1f}%"
    if kind == "+":
        return "0" if x == 0 else f"{x:+.4g}"
    return f"{x:.4g}"


def sections(r: AuditReport) -> list[Section]:
    """The report's tables: batch and expansion, mass and push per accounting, direction split."""
    batch = Section(
        "Batch and expansion",
        ["figure", "value"],
        [
            ["rows / trajectories / groups", f"{r.rows} / {r.trajectories} / {r.groups}"],
            ["successes / failures", f"{r.successes} / {r.failures}  ({r.success_rule})"],
            [
                "rows per trajectory: all / success / failure",
                " / ".join(
                    fmt(x) for x in (r.rows_per_traj_mean, r.rows_per_traj_success_mean, r.rows_per_traj_failure_mean)
                ),
            ],
            [
                "tokens per trajectory: all / success / failure",
                " / ".join(
                    fmt(x)
                    for x in (r.tokens_per_traj_mean, r.tokens_per_traj_success_mean, r.tokens_per_traj_failure_mean)
                ),
            ],
            [
                "expansion ratio failure/success: rows / tokens",
                f"{fmt(r.expansion_ratio_fail_over_success)} / {fmt(r.token_ratio_fail_over_success)}",
            ],
            [
                "within-group corr(rows, outcome) / corr(tokens, outcome)",
                f"{fmt(r.coupling_rows_outcome)} / {fmt(r.coupling_tokens_outcome)}",
            ],
            [
                "μ_row − μ_traj per group: mean / mean |·| / min / max",
                " / ".join(
                    fmt(x, kind)
                    for x, kind in (
                        (r.mu_row_minus_mu_traj_mean, "+"),
                        (r.mu_row_minus_mu_traj_abs_mean, "g"),
                        (r.mu_row_minus_mu_traj_min, "+"),
                        (r.mu_row_minus_mu_traj_max, "+"),
                    )
                ),
            ],
            ["singleton groups: row / trajectory", f"{r.singleton_groups['row']} / {r.singleton_groups['trajectory']}"],
            [
                "zero-spread groups: row / trajectory",
                f"{r.zero_spread_groups['row']} / {r.zero_spread_groups['trajectory']}",
            ],
            [
                "duplicated rows (traj_id, step)",
                "– (no step column)" if r.duplicated_rows is None else str(r.duplicated_rows),
            ],
        ],
    )
    names = list(r.accountings)
    a = [r.accountings[n] for n in names]
    mass = Section(
        f"Objective mass and push per accounting "
        f"(reducer {r.reducer}; aligned = {r.aligned_mass}; estimator {r.estimator})",
        ["figure", *names],
        [
            ["mass share: successes", *(fmt(x.mass_share_success, "%") for x in a)],
            ["mass share: failures", *(fmt(x.mass_share_failure, "%") for x in a)],
            ["mass share: longest 10%", *(fmt(x.mass_share_longest10, "%") for x in a)],
            ["Kish ESS / trajectories", *(fmt(x.kish_ess_fraction, "%") for x in a)],
            ["push ESS / trajectories", *(fmt(x.push_ess_fraction, "%") for x in a)],
            ["mean advantage: successes", *(fmt(x.advantage_success_mean, "+") for x in a)],
            ["mean advantage: failures", *(fmt(x.advantage_failure_mean, "+") for x in a)],
            ["net signed push Σ m·A", *(fmt(x.net_push, "+") for x in a)],
            ["groups pushed up / down", *(f"{x.groups_pushed_up} / {x.groups_pushed_down}" for x in a)],
            ["mass in zero-advantage groups", *(fmt(x.degenerate_mass_share, "%") for x in a)],
        ],
    )
    split = Section(
        "Within-group direction vs between-group magnitude, against row+native",
        ["accounting", "cos within", "cos between", "cos total", "scale ratio"],
        [
            [k, fmt(d.cos_within), fmt(d.cos_between), fmt(d.cos_total), fmt(d.scale_ratio)]
            for k, d in r.direction_split.items()
        ],
        note=(
            f"cos total = cos within × cos between. Mass Alignment moves {fmt(r.group_mass_shift_tv, '%')} of the "
            "objective mass between groups (total variation of the group masses, native vs aligned)."
        ),
    )
    return [batch, mass, split]


def iterations_section(items: list[tuple[int, AuditReport]]) -> Section:
    """One row per iteration of a run (``oma audit RUN --all``)."""
    rows = []
    for it, r in items:
        a = r.accountings
        rows.append(
            [
                str(it),
                str(r.rows),
                str(r.trajectories),
                f"{r.successes}/{r.trajectories}",
                fmt(r.expansion_ratio_fail_over_success),
                *(
                    fmt(a[n].mass_share_success, "%")
                    for n in ("row+native", "row+aligned", "trajectory+native", "trajectory+aligned")
                ),
                fmt(a["row+native"].kish_ess_fraction, "%"),
                fmt(a["trajectory+aligned"].kish_ess_fraction, "%"),
                fmt(a["row+native"].net_push, "+"),
                fmt(a["trajectory+native"].net_push, "+"),
                fmt(a["trajectory+aligned"].net_push, "+"),
                fmt(r.mu_row_minus_mu_traj_mean, "+"),
            ]
        )
    return Section(
        "Per iteration",
        [
            "iter",
            "rows",
            "traj",
            "succ",
            "K fail/succ",
            "succ mass row+nat",
            "row+al",
            "traj+nat",
            "traj+al",
            "Kish nat",
            "Kish al",
            "push row+nat",
            "push traj+nat",
            "push traj+al",
            "μ shift",
        ],
        rows,
    )


# ------------------------------------------------------------------------------------------------
# renderers


def render_terminal(r: AuditReport | None, console, extra: list[Section] | None = None) -> None:
    """Print rich tables and the verdict to ``console`` (a ``rich.console.Console``)."""
    from rich import box
    from rich.measure import Measurement
    from rich.panel import Panel
    from rich.table import Table

    secs = list(extra or [])
    if r is not None:
        console.print(f"[bold]oma audit[/bold] {r.source or ''}")
        secs += sections(r)
    for sec in secs:
        table = Table(title=sec.title, box=box.SIMPLE_HEAD, title_justify="left")
        # A column is never narrower than its longest value (numbers are not broken across lines; headers
        # may be) or than 5 characters (a header folds at word length); a table that cannot fit so is printed
        # wider than the console: rich would otherwise drop its last columns.
        widths = [max(5, *(len(row[i]) for row in sec.rows)) for i in range(len(sec.headers))]
        for i, (h, w) in enumerate(zip(sec.headers, widths, strict=True)):
            table.add_column(h, justify="left" if i == 0 else "right", overflow="fold", min_width=w)
        for row in sec.rows:
            table.add_row(*row)
        need = Measurement.get(console, console.options.update(max_width=10_000), table).minimum
        width = console.width
        console.width = max(width, need)  # print() caps its own width at the console's
        console.print(table)
        console.width = width
        if sec.note:
            console.print(sec.note)
    if r is not None:
        console.print(Panel(verdict(r), title="verdict", expand=True))


def _md_table(sec: Section) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = [
        f"### {sec.title}",
        "",
        "| " + " | ".join(cell(h) for h in sec.headers) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(sec.headers))) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in sec.rows]
    if sec.note:
        lines += ["", sec.note]
    return "\n".join(lines) + "\n"


def render_markdown(
    r: AuditReport | None, images: list[tuple[str, str]], extra: list[Section] | None = None, title: str | None = None
) -> str:
    """The report as Markdown; ``images`` are (caption, relative file name) pairs."""
    src = title or (r.source if r is not None else "") or ""
    out = [f"# oma audit: {src}", ""]
    if r is not None:
        out += ["**Verdict.** " + verdict(r), ""]
    for sec in [*(extra or []), *(sections(r) if r is not None else [])]:
        out.append(_md_table(sec))
    for caption, name in images:
        out += [f"![{caption}]({name})", ""]
    return "\n".join(out)


def render_html(
    r: AuditReport | None, images: list[tuple[str, str]], extra: list[Section] | None = None, title: str | None = None
) -> str:
    """The report as one self-contained HTML page (images referenced by relative file name)."""
    e = html.escape
    src = title or (r.source if r is not None else "") or ""
    body = [f"<h1>oma audit: {e(src)}</h1>"]
    if r is not None:
        body.append(f"<p class='verdict'><b>Verdict.</b> {e(verdict(r))}</p>")
    for sec in [*(extra or []), *(sections(r) if r is not None else [])]:
        body.append(f"<h3>{e(sec.title)}</h3><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in sec.headers) + "</tr>")
        body += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in sec.rows]
        body.append("</table>")
        if sec.note:
            body.append(f"<p>{e(sec.note)}</p>")
    for caption, name in images:
        body.append(f"<figure><img src='{e(name)}' alt='{e(caption)}'><figcaption>{e(caption)}</figcaption></figure>")
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".verdict{background:#f4f4f4;padding:1em}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>oma audit</title><style>{style}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
