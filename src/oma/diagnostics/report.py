"""Renderers of an :class:`~oma.diagnostics.figures.AuditReport`: tables and verdict as rich / Markdown / HTML.

The tables are built once as neutral :class:`Section` objects and then written three ways, so the
terminal report, the Markdown and the HTML always show the same figures.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np

from oma.diagnostics.figures import AuditReport, copies_unknown, verdict


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
            *_dump_rows(r),
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


def _dump_rows(r: AuditReport) -> list[list[str]]:
    """What the verl-agent reader found: padding copies and the invalid-action penalty."""
    out = []
    if r.padding_copies is not None:
        pc = r.padding_copies
        out.append([
            f"padding copies (by {r.dump.row_identity}): rows / trajectories / share of today's mass",
            f"{pc.rows} / {pc.trajectories} / {fmt(pc.mass['row+native'], '%')}",
        ])
    elif copies_unknown(r):
        out.append([
            "padding copies",
            "cannot tell: no row_hash, row_id or input_ids column (docs/audit.md#verl-agent-batches)",
        ])
    if r.dump.invalid_penalty is not None:
        n = "– (no is_action_valid column)" if r.dump.invalid_actions is None else str(r.dump.invalid_actions)
        out.append([f"invalid actions (−{r.dump.invalid_penalty:g} each on the row's score)", n])
    return out


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


MD_MARK = "# oma audit: "
"""How ``report.md`` begins: the mark by which ``oma audit --md`` knows a page it may replace (:func:`oma.files.check_outputs`)."""

HTML_MARK = "<!doctype html><html><head><meta charset='utf-8'><title>oma audit</title>"
"""How ``index.html`` begins: the mark by which ``oma audit --html`` knows a page it may replace."""


def render_markdown(
    r: AuditReport | None, images: list[tuple[str, str]], extra: list[Section] | None = None, title: str | None = None
) -> str:
    """The report as Markdown; ``images`` are (caption, relative file name) pairs."""
    src = title or (r.source if r is not None else "") or ""
    out = [f"{MD_MARK}{src}", ""]
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
        f"{HTML_MARK}<style>{style}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
