"""The guide's figures are made from real evidence by the scripts beside them (docs/_figures/), and say what the
evidence says: the expansion figure's numbers are `oma audit`'s on the committed batch, the metrics figure's series
are the committed run's metrics.jsonl. Each script runs here end to end and writes its PNG."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from audit_cli import audit_json
from benchmark_scripts import load_file

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "_figures"


def script(name: str):
    return load_file(FIGURES / f"{name}.py", f"docs_figure_{name}")


expansion = script("expansion")
oma_metrics = script("oma_metrics")


def test_expansion_figure_is_the_audit_of_the_committed_batch(tmp_path):
    t = expansion.trajectories()
    report = audit_json(tmp_path, str(expansion.BATCH))
    failed = ~t["success"].astype(bool)
    assert len(t["rows"]) == report["trajectories"] and int(t["rows"].sum()) == report["rows"]
    assert len(set(t["group"].tolist())) == report["groups"]
    assert int(failed.sum()) == report["failures"] > 0 and report["successes"] > 0
    ratio = t["rows"][failed].mean() / t["rows"][~failed].mean()
    assert math.isclose(ratio, report["expansion_ratio_fail_over_success"], rel_tol=1e-9)
    for key, accounting in (("native", "row+native"), ("aligned", "trajectory+aligned")):
        assert math.isclose(t[key].sum(), 1.0, rel_tol=1e-9)
        assert math.isclose(t[key][failed].sum(), report["mass_share_failure"][accounting], rel_tol=1e-9)
    # what the figure shows: failures are the long trajectories, native mass follows length, MA evens it out
    assert ratio > 1 and report["mass_share_failure"]["row+native"] > report["mass_share_failure"]["trajectory+aligned"]
    assert math.isclose(t["aligned"].max(), t["aligned"].min(), rel_tol=1e-9)
    out = expansion.plot(out=tmp_path / "expansion.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (FIGURES / "expansion.png").is_file()


def test_metrics_figure_is_the_committed_run(tmp_path):
    lines = gzip.open(oma_metrics.RUN / "metrics.jsonl.gz", "rt").read().splitlines()
    records = [json.loads(line) for line in lines]
    data = oma_metrics.series()
    iterations = [r["iteration"] for r in records if r["iteration"] > 0]
    assert [i for i, _ in data["oma/trajectories"]] == iterations and len(iterations) >= 10
    for name, points in data.items():
        by_iteration = {r["iteration"]: r.get(name) for r in records}
        assert points and all(by_iteration[i] == v for i, v in points), name
    # a healthy OA+MA run: no copies, every trajectory weighs the same, failures longer than successes
    assert all(r["oma/padding_copies"] == 0 for r in records if r["iteration"] > 0)
    assert all(math.isclose(e, t) for (_, e), (_, t) in zip(data["oma/effective_trajectories"], data["oma/trajectories"]))
    out = oma_metrics.plot(out=tmp_path / "oma_metrics.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (FIGURES / "oma_metrics.png").is_file()
