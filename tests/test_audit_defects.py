"""`oma audit` defects a review found: success flags that are rates, file permissions, table width,
numbers broken across lines, plots that mislead, blank files, image anchors. Each test failed before its fix."""

import io
import json
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

from oma.cli import main as oma_main
from oma.diagnostics import plots

FIXTURES = Path(__file__).parent / "fixtures" / "audit"
WORKED = FIXTURES / "worked_example.jsonl"
ROWS = [json.loads(ln) for ln in WORKED.read_text().splitlines()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_rate_is_not_a_success_flag(tmp_path, capsys):
    wins = {r["traj_id"]: r["score"] > 0 for r in ROWS}
    rate = sum(wins.values()) / len(wins)  # the batch's success rate, copied to every row (verl-agent's success_rate)
    path = _write(tmp_path / "rate.jsonl", [dict(r, success_rate=rate) for r in ROWS])
    assert oma_main(["audit", str(path), "--col", "won=success_rate", "--quiet"]) == 2
    err = _error(capsys)
    assert "'success_rate' (won)" in err and "0/1" in err and f"{rate:g}" in err
    path = _write(tmp_path / "two.jsonl", [dict(r, won=2 if r["score"] > 0 else 0) for r in ROWS])
    assert oma_main(["audit", str(path), "--quiet"]) == 2
    assert "'won' must be 0/1" in _error(capsys)
    path = _write(tmp_path / "ok.jsonl", [dict(r, won=int(r["score"] > 0)) for r in ROWS])  # 0/1 numbers are fine
    assert oma_main(["audit", str(path), "--quiet"]) == 0


def test_reports_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert oma_main(["audit", str(WORKED), "--json", str(tmp_path / "a.json"), "--md", str(tmp_path / "md"),
                         "--html", str(tmp_path / "html"), "--quiet"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "md").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "html").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "md" / "report.md").stat().st_mode) == 0o644


def test_columns_sets_the_width_off_a_terminal(tmp_path, capsys, monkeypatch):
    def panel_width() -> int:  # the verdict panel spans the console
        top = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("╭")]
        return len(top[-1])

    monkeypatch.setenv("COLUMNS", "220")
    assert oma_main(["audit", str(WORKED)]) == 0
    assert panel_width() == 220
    monkeypatch.delenv("COLUMNS")
    assert oma_main(["audit", str(WORKED)]) == 0
    assert panel_width() == 120  # a pipe without COLUMNS


def test_all_never_breaks_a_number_across_lines(tmp_path):
    from rich.console import Console

    from oma.diagnostics.audit import audit
    from oma.diagnostics.tables import read_batch
    from oma.diagnostics.report import iterations_section, render_terminal

    b = read_batch(WORKED)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, step_index=b.step_index)
    section = iterations_section([(it, r) for it in (1, 20, 300)])
    out = io.StringIO()
    render_terminal(None, Console(file=out, width=80, color_system=None), [section])
    text = out.getvalue()
    for row in section.rows:
        for cell in row[1:]:
            assert re.search(rf"(^|\s){re.escape(cell)}(\s|$)", text, re.M), cell


def _captured(monkeypatch):
    figs = []
    monkeypatch.setattr(plots, "save_png", lambda fig, path: figs.append(fig))
    return figs


def test_iteration_ticks_are_whole_and_equal_lines_are_labelled_together(tmp_path, monkeypatch):
    from oma.diagnostics.audit import audit
    from oma.diagnostics.tables import read_batch

    b = read_batch(WORKED)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, step_index=b.step_index)
    figs = _captured(monkeypatch)
    plots.mass_share_over_iterations([(1, r), (2, r), (3, r)], tmp_path / "x.png")
    ax = figs[0].axes[0]
    figs[0].canvas.draw()
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    labels = [ln.get_label() for ln in ax.get_lines()]
    # the mass share depends on the mass rule only: four accountings, two lines, each named for both
    assert labels == ["row+native = trajectory+native", "row+aligned = trajectory+aligned", "success rate"]


def test_the_longest_tenth_is_drawn_beside_the_outcome_bars(tmp_path, monkeypatch):
    from oma.diagnostics.audit import audit
    from oma.diagnostics.tables import read_batch

    b = read_batch(WORKED)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, step_index=b.step_index)
    figs = _captured(monkeypatch)
    plots.mass_share_bars(r, tmp_path / "x.png")
    ax = figs[0].axes[0]
    bars = {c.get_label(): list(c) for c in ax.containers}
    longest, success = bars["longest 10% of trajectories"], bars["successes"]
    for lo, su in zip(longest, success, strict=True):
        assert lo.get_x() >= su.get_x() + su.get_width()  # beside, not inside, the success segment
    want = [r.accountings[n].mass_share_longest10 for n in r.accountings]
    assert [p.get_height() for p in longest] == pytest.approx(want)


def test_a_file_of_blank_lines_has_no_rows(tmp_path, capsys):
    path = tmp_path / "blank.jsonl"
    path.write_text("\n\n\n")
    assert oma_main(["audit", str(path), "--quiet"]) == 2
    assert "has no rows" in _error(capsys)


def test_image_anchors_are_hashed_by_content(tmp_path):
    rows = []
    for r in ROWS:  # an "image" per state: equal steps of a group show equal pixels
        img = np.full((2, 3), r["step"] % 3, dtype=int).tolist()
        rows.append(dict(r, anchor_obs=img, step_reward=float(r["score"] > 0 and r["step"] == 9)))
    path = _write(tmp_path / "img.jsonl", rows)
    as_text = _write(tmp_path / "txt.jsonl", [dict(r, anchor_obs=json.dumps(r["anchor_obs"])) for r in rows])
    out = {}
    for name, p in (("img", path), ("txt", as_text)):
        target = tmp_path / f"{name}.json"
        assert oma_main(["audit", str(p), "--col", "anchor=anchor_obs", "--estimator", "gigpo", "--json", str(target),
                         "--quiet"]) == 0
        doc = json.loads(target.read_text())
        doc.pop("source")
        out[name] = doc
    assert out["img"] == out["txt"]  # the same states, whether written as pixels or as their text
