"""`oma audit` on the docs/math.md#worked-example worked example (tests/fixtures/audit/worked_example.jsonl), every figure by hand.

One group, 8 trajectories: 4 successes (R = 10, 10 rows) and 4 failures (R = 0, 50 rows), 4 tokens
per row (240 rows, 960 tokens).
"""

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq
import pytest

from oma.cli import main as oma_main
from oma.diagnostics import ACCOUNTING_NAMES, audit, read_batch

FIXTURES = Path(__file__).parent / "fixtures" / "audit"
WORKED = FIXTURES / "worked_example.jsonl"
EXPECTED = FIXTURES / "worked_example.expected.json"
EPS = 1e-6

# hand arithmetic ------------------------------------------------------------------------------
MU_ROW = 400 / 240  # 40 rows of 10, 200 of 0
SIGMA_ROW = math.sqrt((40 * (10 - MU_ROW) ** 2 + 200 * MU_ROW**2) / 239)  # = √(30000/2151) ≈ 3.735
A_ROW_S, A_ROW_F = (10 - MU_ROW) / (SIGMA_ROW + EPS), (0 - MU_ROW) / (SIGMA_ROW + EPS)  # +2.231, −0.446
SIGMA_TRAJ = math.sqrt(8 * 25 / 7)  # ≈ 5.345
A_TRAJ = 5 / (SIGMA_TRAJ + EPS)  # ±0.9354


def run_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "audit.json"
    assert oma_main(["audit", *args, "--json", str(out), "--quiet"]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    return run_json(tmp_path_factory.mktemp("we"), str(WORKED))


def test_hand_arithmetic_matches_design():
    assert SIGMA_ROW == pytest.approx(3.735, abs=5e-4) and SIGMA_TRAJ == pytest.approx(5.345, abs=5e-4)
    assert A_ROW_S == pytest.approx(2.231, abs=5e-4) and A_ROW_F == pytest.approx(-0.446, abs=5e-4)
    assert A_TRAJ == pytest.approx(0.9354, abs=5e-5)


def test_counts_and_expansion(doc):
    assert (doc["rows"], doc["trajectories"], doc["groups"]) == (240, 8, 1)
    assert (doc["successes"], doc["failures"]) == (4, 4)
    assert doc["settings"]["success_rule"] == "score > 0"
    assert doc["rows_per_traj_mean"] == 30.0
    assert doc["rows_per_traj"] == {"all": 30.0, "success": 10.0, "failure": 50.0}
    assert doc["tokens_per_traj"] == {"all": 120.0, "success": 40.0, "failure": 200.0}
    assert doc["expansion_ratio_fail_over_success"] == 5.0
    assert doc["token_ratio_fail_over_success"] == 5.0
    # within the group the longer episodes are exactly the failed ones
    assert doc["coupling"]["rows_vs_outcome"] == pytest.approx(-1.0)
    assert doc["coupling"]["tokens_vs_outcome"] == pytest.approx(-1.0)
    assert doc["duplicated_rows"] == 0
    assert doc["singleton_groups"] == {"row": 0, "trajectory": 0}
    assert doc["zero_spread_groups"] == {"row": 0, "trajectory": 0}


def test_outcome_statistics(doc):
    assert doc["mu_row_minus_mu_traj_mean"] == pytest.approx(MU_ROW - 5.0)  # −10/3
    assert doc["mu_row_minus_mu_traj"]["abs_mean"] == pytest.approx(10 / 3)
    assert doc["per_group"]["mu_row"] == [pytest.approx(MU_ROW)]
    assert doc["per_group"]["mu_traj"] == [5.0]


def test_advantages(doc):
    for name in ACCOUNTING_NAMES:
        s, f = doc["advantage_success_mean"][name], doc["advantage_failure_mean"][name]
        if name.startswith("row"):
            assert (s, f) == (pytest.approx(A_ROW_S, rel=1e-9), pytest.approx(A_ROW_F, rel=1e-9))
        else:
            assert (s, f) == (pytest.approx(A_TRAJ, rel=1e-9), pytest.approx(-A_TRAJ, rel=1e-9))


def test_masses_and_shares(doc):
    # token-mean native: each success 10/240, each failure 50/240; aligned (uniform): each 1/8
    for name in ACCOUNTING_NAMES:
        native = name.endswith("native")
        assert doc["mass_share_success"][name] == pytest.approx(1 / 6 if native else 1 / 2)
        assert doc["mass_share_failure"][name] == pytest.approx(5 / 6 if native else 1 / 2)
        # longest 10% = ⌈0.8⌉ = 1 trajectory, a 50-row failure
        assert doc["mass_share_longest10"][name] == pytest.approx(50 / 240 if native else 1 / 8)
        # Kish: 1 / Σm² = 1 / (4·(1/24)² + 4·(5/24)²) = 576/104 trajectories of 8
        assert doc["kish_ess"][name] == pytest.approx(576 / 104 if native else 8.0)
        assert doc["kish_ess_fraction"][name] == pytest.approx(9 / 13 if native else 1.0)
        assert doc["degenerate_mass_share"][name] == 0.0
    assert doc["per_group"]["mass"] == {"native": [pytest.approx(1.0)], "aligned": [pytest.approx(1.0)]}
    assert doc["group_mass_shift_tv"] == pytest.approx(0.0, abs=1e-12)


def test_net_push(doc):
    push = doc["net_push"]
    assert push["row+native"] == 0.0  # 4·(10/240)·2.231 = 4·(50/240)·0.446: exactly balanced
    assert push["trajectory+native"] == pytest.approx(-0.624, abs=5e-4)
    assert push["trajectory+native"] == pytest.approx(4 * (10 - 50) / 240 * A_TRAJ, rel=1e-9)
    assert push["row+aligned"] == pytest.approx(0.893, abs=5e-4)
    assert push["row+aligned"] == pytest.approx(4 / 8 * (A_ROW_S + A_ROW_F), rel=1e-9)
    assert push["trajectory+aligned"] == 0.0
    assert doc["groups_pushed_up"] == {
        "row+native": 0,
        "row+aligned": 1,
        "trajectory+native": 0,
        "trajectory+aligned": 0,
    }
    assert doc["groups_pushed_down"] == {
        "row+native": 0,
        "row+aligned": 0,
        "trajectory+native": 1,
        "trajectory+aligned": 0,
    }
    # push per trajectory p = m·A: row+native (10/240)(25/3) = (50/240)(5/3): all 8 equal → ESS 8;
    # trajectory+native: p ∝ 1 vs 5 → (4·6)²/(4·26) = 576/104 of 8 = 9/13
    assert doc["push_ess_fraction"] == {
        "row+native": pytest.approx(1.0),
        "row+aligned": pytest.approx(9 / 13),
        "trajectory+native": pytest.approx(9 / 13),
        "trajectory+aligned": pytest.approx(1.0),
    }


def test_direction_split(doc):
    """Per-token coefficients c = W·A. Against row+native ∝ (success, failure) = (5, −1) per token:
    trajectory+aligned ∝ (5, −1) too (docs/math.md#worked-example note: same direction, different scale);
    trajectory+native ∝ (1, −1) → cos = 400/√(1200·240) = √5/3; row+aligned ∝ (25, −1) →
    cos = 5200/√(1200·25200) = 13/(3√21). One group, so the between-group cosine is 1."""
    split = doc["direction_split"]
    assert split["baseline"] == "row+native"
    assert split["trajectory+aligned"]["cos_within"] == pytest.approx(1.0, abs=1e-12)
    assert split["trajectory+native"]["cos_within"] == pytest.approx(math.sqrt(5) / 3, rel=1e-9)
    assert split["row+aligned"]["cos_within"] == pytest.approx(13 / (3 * math.sqrt(21)), rel=1e-9)
    for k in ("row+aligned", "trajectory+native", "trajectory+aligned"):
        assert split[k]["cos_between"] == pytest.approx(1.0)
        assert split[k]["cos_total"] == pytest.approx(split[k]["cos_within"] * split[k]["cos_between"], rel=1e-12)
    # scale ‖c_b‖/‖c_a‖; with ‖c_row+native‖² = 239/(57600·t) (t tokens per row):
    assert split["trajectory+aligned"]["scale_ratio"] == pytest.approx(math.sqrt(378 / 239), rel=1e-5)
    assert split["trajectory+native"]["scale_ratio"] == pytest.approx(math.sqrt(210 / 239), rel=1e-5)
    assert split["row+aligned"]["scale_ratio"] == pytest.approx(math.sqrt(7.56), rel=1e-5)


def test_verdict_reads_the_figures(doc):
    v = doc["verdict"]
    assert "Failures expand 5.0x more than successes (50.0 vs 10.0 rows per trajectory)" in v
    assert "failures carry 83% of the objective mass" in v and "would give them 50%" in v
    assert "-0.624 with OA alone" in v and "switch OA and MA together" in v
    assert v.endswith("in batches like this: docs/how-to-choose.md#failures-expand-more.")
    assert "\n" not in v


def test_json_is_stable(doc):
    """The committed snapshot: same keys in the same order, same values (12 significant digits)."""
    expected = json.loads(EXPECTED.read_text())
    got = dict(doc, source=expected["source"])
    assert list(got) == list(expected)
    assert got == expected
    required = [
        "rows",
        "trajectories",
        "groups",
        "rows_per_traj_mean",
        "expansion_ratio_fail_over_success",
        "mu_row_minus_mu_traj_mean",
        "kish_ess_fraction",
        "mass_share_success",
    ]
    assert all(k in got for k in required)
    assert list(got["mass_share_success"]) == ["row+native", "row+aligned", "trajectory+native", "trajectory+aligned"]
    assert list(got["kish_ess_fraction"]) == list(got["mass_share_success"])


def test_csv_parquet_jsonl_agree(tmp_path, doc):
    table = pjson.read_json(WORKED)
    pcsv.write_csv(table, tmp_path / "we.csv")
    pq.write_table(table, tmp_path / "we.parquet")
    for name in ("we.csv", "we.parquet"):
        got = run_json(tmp_path, str(tmp_path / name))
        assert dict(got, source=None) == dict(doc, source=None), name


def test_api_matches_cli(doc):
    b = read_batch(WORKED)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, step_index=b.step_index)
    assert r.mass_share_success == pytest.approx(doc["mass_share_success"], rel=1e-11)
    assert r.kish_ess_fraction == pytest.approx(doc["kish_ess_fraction"])
    assert r.net_push["trajectory+native"] == pytest.approx(doc["net_push"]["trajectory+native"])
    assert r.accountings["row+native"].mass.tolist() == pytest.approx([10 / 240] * 4 + [50 / 240] * 4)
    assert r.mu_row_minus_mu_traj.tolist() == pytest.approx([-10 / 3])
    assert r.verdict == doc["verdict"]


def test_reports_and_plots(tmp_path, capsys):
    rc = oma_main(["audit", str(WORKED), "--html", str(tmp_path / "html"), "--md", str(tmp_path / "md")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "verdict" in out and "trajectory+aligned" in out and "16.7%" in out
    for folder, page in (("html", "index.html"), ("md", "report.md")):
        files = sorted(p.name for p in (tmp_path / folder).iterdir())
        assert files == sorted([page, "mass_share.png", "mu_shift.png", "rows_per_trajectory.png"])
        for png in (tmp_path / folder).glob("*.png"):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "md" / "report.md").read_text()
    assert "![Objective-mass share per accounting](mass_share.png)" in md and "| mass share: successes | 16.7% |" in md
    assert "<img src='mass_share.png'" in (tmp_path / "html" / "index.html").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_reducer_seq_mean_token_mean_counts_rows():
    """seq-mean-token-mean: mass ∝ rows, here the same 10:50 split (equal rows) — and MA still 1/8."""
    b = read_batch(WORKED)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens, reducer="seq-mean-token-mean")
    assert r.mass_share_success["row+native"] == pytest.approx(1 / 6)
    assert r.mass_share_success["trajectory+aligned"] == pytest.approx(1 / 2)


def test_table_with_worked_example_in_memory():
    """The same batch built in memory (not from the fixture) gives the same shares."""
    k = [10] * 4 + [50] * 4
    traj = [t for t, n in enumerate(k) for _ in range(n)]
    table = pa.table(
        {
            "group_id": [0] * 240,
            "traj_id": traj,
            "score": [10.0 if t < 4 else 0.0 for t in traj],
            "response_tokens": [4] * 240,
        }
    )
    from oma.diagnostics import batch_from_table

    b = batch_from_table(table)
    r = audit(b.scores, b.group_index, b.traj_index, response_tokens=b.response_tokens)
    assert r.mass_share_success == {
        "row+native": pytest.approx(1 / 6),
        "row+aligned": pytest.approx(0.5),
        "trajectory+native": pytest.approx(1 / 6),
        "trajectory+aligned": pytest.approx(0.5),
    }


def test_docs_example_is_real_output(capsys):
    """docs/audit.md shows the real terminal report of this fixture (regenerate it when this fails)."""
    docs = (Path(__file__).parents[1] / "docs" / "audit.md").read_text()
    block = docs.split("Real output of `oma audit\ntests/fixtures/audit/worked_example.jsonl`:\n\n```text\n", 1)[1]
    block = block.split("\n```", 1)[0]
    assert oma_main(["audit", str(WORKED)]) == 0
    out = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert out[1:] == block.splitlines()[1:]
