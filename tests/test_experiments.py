"""`oma compare` and `oma report` (docs/experiments.md#the-metrics): a tiny smoke run, resume, a hand-made directory, bad arguments."""

import json
import math
import shutil
import statistics

import numpy as np
import pytest
import torch

import oma.train
from oma.cli import main as oma_main
from oma.diagnostics import write_batch
from oma.experiments.compare import run_config
from oma.experiments.variants import VARIANTS
from oma.train import cache_key, load_config, task_seeds

TINY = [
    "policy.hidden=32", "policy.layers=1", "policy.heads=2", "policy.vocab_size=400",
    "warm_start.episodes=3", "warm_start.epochs=1", "env.eval_tasks=2", "env.tasks_per_iter=2", "env.group_size=2",
    "env.train_max_steps=null", "env.options.max_steps=4", "eval_every=1", "checkpoint_every=1", "threads=1",
    "policy.max_new_tokens=6",
    "tensorboard=false",
]
SECTIONS = ["## Command", "## Setup", "## Results", "## Significance", "## Success curves", "## Endpoint and nAUC",
            "## Expansion–outcome coupling", "## Per-seed values", "## Machine and wall time", "## Config"]
PNGS = ["success_curves.png", "endpoint.png", "nauc.png", "paired_differences.png"]
T975 = {1: 12.706, 2: 4.303, 3: 3.182}  # Student-t table, two-sided 95%


def _is_png(path):
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variants_share_warm_start_and_task_seeds_within_a_seed(tmp_path):
    base = load_config(None, TINY)
    for seed in (0, 1):
        cfgs = [run_config(base, v, seed, 3, tmp_path / v.name) for v in VARIANTS.values()]
        assert {(c.algo.accounting, c.algo.mass) for c in cfgs} == {
            ("row", "native"), ("row", "uniform"), ("trajectory", "native"), ("trajectory", "uniform")}
        assert len({cache_key(c) for c in cfgs}) == 1  # the warm-start cache ignores algo.*
        for it in (1, 2, 3):
            assert len({tuple(task_seeds(c, it)) for c in cfgs}) == 1
        assert all(c.dump_batches and c.iterations == 3 and c.seed == seed for c in cfgs)
    a, b = (run_config(base, VARIANTS["OA+MA"], s, 3, tmp_path) for s in (0, 1))
    assert cache_key(a) != cache_key(b) and task_seeds(a, 1) != task_seeds(b, 1)  # seeds do differ


def test_compare_smoke_report_and_resume(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    cache = f"warm_start.cache_dir={tmp_path / 'cache'}"

    def args(horizon=2, extra=()):
        return ["compare", *TINY, cache, *extra, "--variants", "2", "--seeds", "2", "--horizon", str(horizon),
                "--out", str(out)]

    argv = args()
    assert oma_main(argv) == 0

    # ---- layout and compare.json --------------------------------------------------------------
    doc = json.loads((out / "compare.json").read_text())
    assert doc["command"].startswith("oma compare ") and "--horizon 2" in doc["command"]
    assert doc["horizon"] == 2 and doc["seeds"] == [0, 1]
    assert [v["name"] for v in doc["variants"]] == ["row+native", "OA+MA"]
    assert doc["config"]["iterations"] == 2 and doc["config"]["dump_batches"] is True
    assert doc["overrides"] == [*TINY, cache]
    for key in ("platform", "cpu_count", "torch", "jobs", "threads_per_run"):
        assert key in doc["machine"]
    assert doc["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and doc["machine"]["cpu"]
    assert set(doc["warm_starts"]) == {"seed-0", "seed-1"}
    runs = {}
    for v, accounting, mass in (("row+native", "row", "native"), ("OA+MA", "trajectory", "uniform")):
        for k in (0, 1):
            rd = out / v / f"seed-{k}"
            cfg = json.loads((rd / "config.json").read_text())
            assert (cfg["algo"]["accounting"], cfg["algo"]["mass"], cfg["seed"]) == (accounting, mass, k)
            assert (rd / "summary.json").is_file() and (rd / "batches" / "iter_000002.parquet").is_file()
            entry = doc["runs"][f"{v}/seed-{k}"]
            assert entry["status"] == "trained" and entry["wall_time_s"] > 0
            records = [json.loads(ln) for ln in (rd / "metrics.jsonl").read_text().splitlines()]
            assert records[0]["warm_start"]["cached"] is True  # built before the runs, never by a run
            runs[(v, k)] = records

    # ---- report: every section, PNGs, numbers recomputed by hand from metrics.jsonl --------------
    report = (out / "report.md").read_text()
    for section in SECTIONS:
        assert section in report, section
    assert all(_is_png(out / p) for p in PNGS)
    assert doc["command"] in report
    assert f"of {doc['machine']['cpu']} ({doc['machine']['cpu_capability']})" in report  # the CPU the figures came from
    results = json.loads((out / "results.json").read_text())
    for (v, k), records in runs.items():
        ev = [r["eval_success"] for r in records if "eval_success" in r]  # iterations 0, 1, 2
        got = next(r for r in results["runs"] if r["variant"] == v and r["seed"] == k)
        assert got["endpoint"] == pytest.approx(sum(ev) / 3)
        assert got["nauc"] == pytest.approx(((ev[0] + ev[1]) / 2 + (ev[1] + ev[2]) / 2) / 2)
        assert got["env_steps"] == records[1]["rows"] + records[2]["rows"]
        assert got["audited_batches"] == 2
    ends = {(r["variant"], r["seed"]): r["endpoint"] for r in results["runs"]}
    d = [ends[("OA+MA", k)] - ends[("row+native", k)] for k in (0, 1)]
    diff = results["variants"]["OA+MA"]["diff_endpoint"]
    assert diff["mean"] == pytest.approx(sum(d) / 2)
    assert diff["half_width"] == pytest.approx(T975[1] * statistics.stdev(d) / math.sqrt(2), rel=1e-3, abs=1e-12)
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*/seed-*/summary.json")}
    assert len(mtimes) == 4

    # ---- second invocation: every finished run is reused, nothing trains -----------------------
    def no_train(*a, **k):
        raise AssertionError("a finished run was retrained")

    monkeypatch.setattr(oma.train, "train", no_train)
    assert oma_main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    doc = json.loads((out / "compare.json").read_text())
    assert {e["status"] for e in doc["runs"].values()} == {"reused"} and len(doc["history"]) == 2
    monkeypatch.undo()

    # ---- a run with a checkpoint but no summary is resumed; a partial run without one restarts ---
    calls = []
    real_train = oma.train.train

    def counting_train(cfg, run_dir, *, resume=False, console=None):
        calls.append((run_dir.parent.name, run_dir.name, resume))
        return real_train(cfg, run_dir, resume=resume, console=console)

    monkeypatch.setattr(oma.train, "train", counting_train)
    (out / "OA+MA" / "seed-0" / "summary.json").unlink()
    partial = out / "row+native" / "seed-1"
    shutil.rmtree(partial)
    partial.mkdir()
    (partial / "junk.txt").write_text("half a run")
    assert oma_main(argv) == 0
    assert sorted(calls) == [("OA+MA", "seed-0", True), ("row+native", "seed-1", False)]
    assert not (partial / "junk.txt").exists() and (partial / "summary.json").is_file()
    doc = json.loads((out / "compare.json").read_text())
    status = {k: e["status"] for k, e in doc["runs"].items()}
    assert status == {"row+native/seed-0": "reused", "OA+MA/seed-0": "resumed", "row+native/seed-1": "trained",
                      "OA+MA/seed-1": "reused"}

    # ---- a longer horizon extends every run from its last checkpoint ----------------------------
    calls.clear()
    assert oma_main(args(horizon=3)) == 0
    assert sorted(calls) == sorted((v, f"seed-{k}", True) for v in ("row+native", "OA+MA") for k in (0, 1))
    for rd in out.glob("*/seed-*"):
        its = [json.loads(ln)["iteration"] for ln in (rd / "metrics.jsonl").read_text().splitlines()]
        assert its == [0, 1, 2, 3]
    assert json.loads((out / "results.json").read_text())["horizon"] == 3

    # ---- a failing run is recorded, the others are reported, the exit status is 1 ---------------
    def broken_train(cfg, run_dir, *, resume=False, console=None):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(oma.train, "train", broken_train)
    (out / "OA+MA" / "seed-1" / "summary.json").unlink()
    assert oma_main(args(horizon=3)) == 1
    entry = json.loads((out / "compare.json").read_text())["runs"]["OA+MA/seed-1"]
    assert entry["status"] == "failed" and "simulated crash" in entry["error"]
    report = (out / "report.md").read_text()
    assert "OA+MA/seed-1: not finished" in report and "| OA+MA | 1 |" in report

    # ---- the same directory with another config is refused, naming the key --------------------
    capsys.readouterr()
    assert oma_main(args(extra=["env.group_size=3"])) == 2
    err = capsys.readouterr().err
    assert "env.group_size" in err and "another config" in err


def test_compare_parallel_jobs_one_seed(tmp_path):
    out = tmp_path / "par"
    argv = ["compare", *TINY, f"warm_start.cache_dir={tmp_path / 'cache'}", "--variants", "2", "--seeds", "1",
            "--horizon", "1", "--out", str(out), "--jobs", "2"]
    assert oma_main(argv) == 0
    doc = json.loads((out / "compare.json").read_text())
    assert {e["status"] for e in doc["runs"].values()} == {"trained"}
    assert doc["machine"]["jobs"] == 2 and doc["machine"]["threads_per_run"] >= 1
    for v in ("row+native", "OA+MA"):
        rd = out / v / "seed-0"
        first = json.loads((rd / "metrics.jsonl").read_text().splitlines()[0])
        assert first["warm_start"]["cached"] is True  # no worker built (or raced on) the warm start
        assert (rd / "train.log").is_file()
    report = (out / "report.md").read_text()
    assert "one seed per variant" in report  # a CI needs two seeds; nothing is called significant

    # ---- a larger --seeds adds seeds: the finished seed is reused, only the new one trains ------
    assert oma_main([*argv[:argv.index("--seeds") + 1], "2", *argv[argv.index("--seeds") + 2:]]) == 0
    doc = json.loads((out / "compare.json").read_text())
    assert doc["seeds"] == [0, 1]
    assert {k: e["status"] for k, e in doc["runs"].items()} == {
        "row+native/seed-0": "reused", "OA+MA/seed-0": "reused", "row+native/seed-1": "trained",
        "OA+MA/seed-1": "trained"}
    assert json.loads((out / "results.json").read_text())["variants"]["OA+MA"]["paired_seeds"] == [0, 1]


def test_compare_first_seed_runs_fresh_seeds(tmp_path):
    out = tmp_path / "fresh"
    argv = ["compare", *TINY, f"warm_start.cache_dir={tmp_path / 'cache'}", "--variants", "2", "--seeds", "2",
            "--first-seed", "5", "--horizon", "1", "--out", str(out)]
    assert oma_main(argv) == 0
    doc = json.loads((out / "compare.json").read_text())
    assert doc["seeds"] == [5, 6]
    assert sorted(doc["runs"]) == ["OA+MA/seed-5", "OA+MA/seed-6", "row+native/seed-5", "row+native/seed-6"]
    for v in ("row+native", "OA+MA"):
        assert not (out / v / "seed-0").exists()
        for k in (5, 6):
            assert json.loads((out / v / f"seed-{k}" / "config.json").read_text())["seed"] == k
    assert json.loads((out / "results.json").read_text())["variants"]["OA+MA"]["paired_seeds"] == [5, 6]


# ------------------------------------------------------------------------------------------------
# `oma report` on a hand-made directory: every number checked by hand arithmetic


def _fake_run(rd, curve, rows_per_iter=6, horizon=4, eval_every=2, summary=True, sampled=None):
    """A run directory with eval_success ``curve`` (and eval_sampled_success ``sampled``) at 0, 2, 4 and one
    batch per iteration: one group of a success (2 rows × 3 tokens, score 1) and a failure (4 rows × 3 tokens, score 0)."""
    rd.mkdir(parents=True)
    (rd / "config.json").write_text(json.dumps({"algo": {"reducer": "token-mean", "estimator": "grpo",
                                                         "norm_by_std": True}}))
    lines = []
    for it in range(horizon + 1):
        rec = {"iteration": it}
        if it:  # as the trainer logs the batch below: a success of 2 rows, a failure of 4
            rec.update(rows=rows_per_iter, rows_per_traj_success=2.0, rows_per_traj_failure=4.0)
        if it % eval_every == 0:
            rec["eval_success"] = curve[it // eval_every]
            if sampled is not None:
                rec["eval_sampled_success"] = sampled[it // eval_every]
        lines.append(json.dumps(rec))
        if it:
            write_batch(rd / "batches" / f"iter_{it:06d}.parquet", group_index=np.zeros(6, dtype=np.int64),
                        traj_index=np.array([0, 0, 1, 1, 1, 1]), step_index=np.array([0, 1, 0, 1, 2, 3]),
                        scores=np.array([1.0, 1, 0, 0, 0, 0]), response_mask=torch.ones(6, 3, dtype=torch.bool),
                        won=np.array([1, 1, 0, 0, 0, 0], dtype=bool))
    (rd / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if summary:
        (rd / "summary.json").write_text(json.dumps({"iterations": horizon}))


BASE = {0: [0.0, 0.2, 0.4], 1: [0.1, 0.1, 0.3], 2: [0.0, 0.3, 0.2]}
OMA = {0: [0.0, 0.4, 0.6], 1: [0.1, 0.3, 0.5], 2: [0.0, 0.5, 0.5]}


@pytest.fixture
def hand_made(tmp_path):
    out = tmp_path / "hand"
    for k in (0, 1, 2):
        _fake_run(out / "row+native" / f"seed-{k}", BASE[k])
        _fake_run(out / "OA+MA" / f"seed-{k}", OMA[k])
    _fake_run(out / "OA+MA" / "seed-3", [0.0, 0.9, 0.9], summary=False)  # unfinished: left out
    _fake_run(out / "row+native" / "seed-3", [0.0, 0.0, 0.0])
    doc = {"command": "oma compare hand-made --horizon 4", "horizon": 4, "seeds": [0, 1, 2, 3],
           "variants": [{"name": "row+native", "algo.accounting": "row", "algo.mass": "native"},
                        {"name": "OA+MA", "algo.accounting": "trajectory", "algo.mass": "uniform"}],
           "config": {"algo": {"estimator": "grpo"}, "env": {"name": "household"}, "eval_every": 2}, "runs": {}}
    (out / "compare.json").write_text(json.dumps(doc))
    return out


def _ci(xs):
    n = len(xs)
    return sum(xs) / n, T975[n - 1] * statistics.stdev(xs) / math.sqrt(n)


def test_report_numbers_on_a_hand_made_directory(hand_made):
    assert oma_main(["report", str(hand_made)]) == 0
    res = json.loads((hand_made / "results.json").read_text())
    base = {**BASE, 3: [0.0, 0.0, 0.0]}
    # endpoint: mean of the evaluations at 0, 2, 4; nAUC on [0, 4] with steps of 2: (a + 2b + c) / 4
    ep_base = [sum(c) / 3 for c in base.values()]
    ep_oma = [sum(OMA[k]) / 3 for k in (0, 1, 2)]
    auc_base = [(c[0] + 2 * c[1] + c[2]) / 4 for c in base.values()]
    auc_oma = [(OMA[k][0] + 2 * OMA[k][1] + OMA[k][2]) / 4 for k in (0, 1, 2)]
    v = res["variants"]
    for got, xs in ((v["row+native"]["endpoint"], ep_base), (v["row+native"]["nauc"], auc_base),
                    (v["OA+MA"]["endpoint"], ep_oma), (v["OA+MA"]["nauc"], auc_oma)):
        mean, hw = _ci(xs)
        assert got["mean"] == pytest.approx(mean) and got["half_width"] == pytest.approx(hw, rel=2e-4)
    assert v["OA+MA"]["paired_seeds"] == [0, 1, 2]
    d_auc = [auc_oma[k] - auc_base[k] for k in (0, 1, 2)]  # [0.15, 0.15, 0.175]
    mean, hw = _ci(d_auc)
    got = v["OA+MA"]["diff_nauc"]
    assert got["mean"] == pytest.approx(mean) and got["half_width"] == pytest.approx(hw, rel=2e-4)
    assert got["lo"] > 0 and got["significant"] is True
    # p by hand: t = 0.158333 / (0.0144338 / √3) = 19.0, and for df = 2, P(|T| > t) = 1 − t / √(2 + t²)
    assert got["p"] == pytest.approx(1 - 19 / math.sqrt(2 + 19**2), rel=1e-6)
    d_ep = [ep_oma[k] - ep_base[k] for k in (0, 1, 2)]
    assert v["OA+MA"]["diff_endpoint"]["mean"] == pytest.approx(sum(d_ep) / 3)
    assert v["OA+MA"]["diff_endpoint"]["significant"] == (sum(d_ep) / 3 - _ci(d_ep)[1] > 0)
    # coupling of the hand-made batch: K fail / K success = 4 / 2; failures hold 12 of 18 tokens under the
    # native token-mean mass, and half the mass under OA+MA (uniform over 2 trajectories); corr(K, R) = −1
    c = v["OA+MA"]["coupling"]
    assert c["expansion_ratio"]["mean"] == pytest.approx(2.0)
    assert c["rows_per_traj_failure"]["mean"] == pytest.approx(4.0)
    assert c["failure_mass_native"]["mean"] == pytest.approx(12 / 18)
    assert c["failure_mass_own"]["mean"] == pytest.approx(0.5)
    assert c["coupling_rows_outcome"]["mean"] == pytest.approx(-1.0)
    assert v["row+native"]["coupling"]["failure_mass_own"]["mean"] == pytest.approx(12 / 18)
    assert v["row+native"]["env_steps"]["mean"] == pytest.approx(4 * 6)
    # the mean curve of OA+MA at 0, 2, 4
    assert v["OA+MA"]["curve"]["mean"] == pytest.approx([sum(OMA[k][j] for k in OMA) / 3 for j in range(3)])

    report = (hand_made / "report.md").read_text()
    for section in SECTIONS:
        assert section in report, section
    assert "OA+MA has a significantly higher nAUC than row+native" in report
    # Holm over the 2 comparisons: the smaller p (nAUC, 0.0028) passes 0.05 / 2; the endpoint's must pass 0.05
    p_ep = v["OA+MA"]["diff_endpoint"]["p"]
    assert res["holm_significant"] == {"OA+MA/diff_endpoint": p_ep <= 0.05, "OA+MA/diff_nauc": True}
    assert "Corrected for the 2 comparisons of this report (Holm–Bonferroni, family-wise 5%)" in report
    assert "OA+MA/seed-3: not finished" in report
    assert all(_is_png(hand_made / p) for p in PNGS)


def test_metrics_coupling_by_hand():
    """Per iteration K_fail / K_success, then the mean over the iterations where both are defined: (3/2 + 8/4) / 2,
    not the ratio of the means (5.5 / 3); iterations after the horizon and the warm start's record are skipped."""
    from oma.experiments.report import AUDIT_ONLY, metrics_coupling

    records = [{"iteration": 0, "eval_success": 0.1},
               {"iteration": 1, "rows_per_traj_failure": 3.0, "rows_per_traj_success": 2.0, "oma/failure_mass_share": 0.6},
               {"iteration": 2, "rows_per_traj_failure": 8.0, "rows_per_traj_success": 4.0, "oma/failure_mass_share": 0.8},
               {"iteration": 3, "rows_per_traj_failure": 5.0, "rows_per_traj_success": None},  # no success yet
               {"iteration": 4, "rows_per_traj_failure": 100.0, "rows_per_traj_success": 1.0}]  # past the horizon
    got, n = metrics_coupling(records, 3)
    assert n == 3
    assert got["expansion_ratio"] == pytest.approx((3 / 2 + 8 / 4) / 2)
    assert got["rows_per_traj_failure"] == pytest.approx((3 + 8 + 5) / 3)
    assert got["rows_per_traj_success"] == pytest.approx(3.0)
    assert got["failure_mass_trained"] == pytest.approx(0.7)
    assert all(math.isnan(got[k]) for k in AUDIT_ONLY)


def test_report_coupling_from_metrics_on_the_hand_made_directory(hand_made, tmp_path, capsys):
    assert oma_main(["report", str(hand_made), "--coupling", "metrics", "--out", str(tmp_path / "m.md")]) == 0
    res = json.loads((tmp_path / "m.results.json").read_text())
    c = res["variants"]["OA+MA"]["coupling"]
    assert res["coupling_source"] == "metrics"
    assert c["expansion_ratio"]["mean"] == pytest.approx(2.0) and c["rows_per_traj_failure"]["mean"] == pytest.approx(4.0)
    assert c["failure_mass_native"] is None and c["coupling_rows_outcome"] is None  # the audit's alone
    report = (tmp_path / "m.md").read_text()
    assert "From each run's metrics.jsonl" in report and "iterations logged" in report
    assert all(r["audited_batches"] == 0 and r["coupling_iterations"] == 4 for r in res["runs"])
    assert oma_main(["report", str(hand_made), "--coupling", "both"]) == 2
    assert "--coupling" in capsys.readouterr().err


def test_compare_no_dump_reads_the_coupling_the_audit_gives(tmp_path, capsys):
    """The same tabular runs with and without dumps: training does not depend on the dump, and the expansion ratio
    and rows per trajectory read from metrics.jsonl equal the audit's of the dumped batches, run by run."""
    base = ["compare", "configs/chain-tabular-grpo.yaml", "env.eval_tasks=8", "eval_every=1", "--variants", "2",
            "--seeds", "2", "--horizon", "2", "--metric", "sampled"]
    dumped, bare = tmp_path / "dumped", tmp_path / "bare"
    assert oma_main([*base, "--out", str(dumped)]) == 0
    assert oma_main([*base, "--no-dump", "--out", str(bare)]) == 0
    doc = json.loads((bare / "compare.json").read_text())
    assert doc["config"]["dump_batches"] is False and "--no-dump" in doc["command"]
    assert not list(bare.glob("*/seed-*/batches")) and len(list(dumped.glob("*/seed-*/batches"))) == 4
    assert "From each run's metrics.jsonl" in (bare / "report.md").read_text()
    audited = {(r["variant"], r["seed"]): r for r in json.loads((dumped / "results.json").read_text())["runs"]}
    logged = {(r["variant"], r["seed"]): r for r in json.loads((bare / "results.json").read_text())["runs"]}
    assert json.loads((bare / "results.json").read_text())["coupling_source"] == "metrics"
    for key, r in logged.items():
        assert r["endpoint"] == audited[key]["endpoint"]  # the same training
        for figure in ("expansion_ratio", "rows_per_traj_failure", "rows_per_traj_success", "failure_mass_trained"):
            assert r["coupling"][figure] == pytest.approx(audited[key]["coupling"][figure], rel=1e-12), (key, figure)
        assert audited[key]["audited_batches"] == 2 and r["coupling_iterations"] == 2
    # the hosts' oma/expansion_ratio of every iteration is the same figure (every tabular row carries tokens)
    for rd in bare.glob("*/seed-*"):
        for rec in map(json.loads, (rd / "metrics.jsonl").read_text().splitlines()[1:]):
            if rec["rows_per_traj_success"] and rec["rows_per_traj_failure"]:
                ratio = rec["rows_per_traj_failure"] / rec["rows_per_traj_success"]
                assert rec["oma/expansion_ratio"] == pytest.approx(ratio, rel=1e-12)
    # the audit of runs that dumped nothing is refused; the dumped ones read either way
    assert oma_main(["report", str(bare), "--coupling", "audit"]) == 2
    assert "--no-dump" in capsys.readouterr().err
    # a comparison's runs are extended with the same dump setting only
    assert oma_main([*base[:-6], "--seeds", "2", "--horizon", "3", "--metric", "sampled", "--out", str(bare)]) == 2
    err = capsys.readouterr().err
    assert "dump_batches" in err and "--no-dump" in err and err.count("\n") == 1


def test_report_baseline_gain_by_hand(hand_made):
    """row+native's endpoint − its iteration-0 success, per seed, then mean and 95% CI over the 4 finished seeds."""
    assert oma_main(["report", str(hand_made)]) == 0
    res = json.loads((hand_made / "results.json").read_text())
    gains = [sum(c) / 3 - c[0] for c in (*BASE.values(), [0.0, 0.0, 0.0])]  # 0.2, 0.0667, 0.1667, 0
    mean, hw = _ci(gains)
    got = res["baseline_gain"]
    assert got["n"] == 4 and got["mean"] == pytest.approx(mean) and got["half_width"] == pytest.approx(hw, rel=2e-4)
    assert got["mean"] == pytest.approx((0.2 + 0.5 / 3 - 0.1 + 0.5 / 3) / 4)
    report = (hand_made / "report.md").read_text()
    assert f"Baseline gain: row+native gained {mean:+.3f} [{mean - hw:+.3f}, {mean + hw:+.3f}] over its warm start" in report


def test_report_metric_sampled_reads_the_sampled_curve_by_hand(tmp_path):
    out = tmp_path / "sampled"
    greedy, sampled = {0: [0.0, 1.0, 1.0], 1: [0.0, 1.0, 1.0]}, {0: [0.1, 0.3, 0.5], 1: [0.1, 0.2, 0.6]}
    for k in (0, 1):
        _fake_run(out / "row+native" / f"seed-{k}", greedy[k], sampled=sampled[k])
    doc = {"command": "oma compare hand-made --metric sampled", "horizon": 4, "seeds": [0, 1], "metric": "sampled",
           "variants": [{"name": "row+native", "algo.accounting": "row", "algo.mass": "native"}],
           "config": {"algo": {"estimator": "grpo"}, "env": {"name": "chain"}, "eval_every": 2}, "runs": {}}
    (out / "compare.json").write_text(json.dumps(doc))
    assert oma_main(["report", str(out)]) == 0  # compare.json's metric
    res = json.loads((out / "results.json").read_text())
    assert res["metric"] == "sampled"
    assert res["variants"]["row+native"]["endpoint"]["mean"] == pytest.approx((0.9 / 3 + 0.9 / 3) / 2)
    assert res["variants"]["row+native"]["nauc"]["mean"] == pytest.approx(((0.1 + 0.6 + 0.5) / 4 + (0.1 + 0.4 + 0.6) / 4) / 2)
    assert "held-out sampled success (`eval_sampled_success`)" in (out / "report.md").read_text()
    assert oma_main(["report", str(out), "--metric", "greedy"]) == 0  # the flag overrides compare.json
    res = json.loads((out / "results.json").read_text())
    assert res["metric"] == "greedy" and res["variants"]["row+native"]["endpoint"]["mean"] == pytest.approx(2 / 3)
    assert oma_main(["report", str(out), "--metric", "best"]) == 2


def test_report_horizon_and_out_file(hand_made, tmp_path):
    target = tmp_path / "elsewhere" / "h2.md"
    target.parent.mkdir()
    assert oma_main(["report", str(hand_made), "--horizon", "2", "--out", str(target)]) == 0
    res = json.loads((target.parent / "h2.results.json").read_text())
    assert res["horizon"] == 2
    # H = 2: endpoint = mean of the evaluations at 0 and 2 (only two up to H); nAUC = (a + b) / 2
    got = {(r["variant"], r["seed"]): r for r in res["runs"]}
    assert got[("OA+MA", 1)]["endpoint"] == pytest.approx((0.1 + 0.3) / 2)
    assert got[("OA+MA", 1)]["endpoint_iterations"] == [0, 2]
    assert got[("row+native", 2)]["nauc"] == pytest.approx((0.0 + 0.3) / 2)
    assert got[("OA+MA", 0)]["audited_batches"] == 2  # batches after H are not audited
    assert all(_is_png(target.parent / p) for p in PNGS)
    assert "here iterations (0, 2)" in target.read_text()


def test_report_says_when_nothing_is_significant(tmp_path):
    out = tmp_path / "flat"
    for k in (0, 1, 2):
        _fake_run(out / "row+native" / f"seed-{k}", [0.1, 0.2, 0.3])
        _fake_run(out / "OA+MA" / f"seed-{k}", [[0.1, 0.3, 0.3], [0.1, 0.1, 0.3], [0.1, 0.2, 0.2]][k])
    (out / "compare.json").write_text(json.dumps({
        "command": "oma compare x", "horizon": 4, "seeds": [0, 1, 2], "config": {},
        "variants": [{"name": n, "algo.accounting": "", "algo.mass": ""} for n in ("row+native", "OA+MA")]}))
    assert oma_main(["report", str(out)]) == 0
    assert "No difference is significant" in (out / "report.md").read_text()


# ------------------------------------------------------------------------------------------------
# Bad arguments: exit status 2 and one line naming the flag or key


@pytest.mark.parametrize("args,needle", [
    (["--variants", "3x3"], "--variants '3x3' is not valid; expected one of ['2x2', '2', '3', 'baseline']"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--first-seed", "-1"], "--first-seed must be >= 0"),
    (["--seeds", "100000000000000000000"], "--seeds must be <= 10000"),  # #69: an OverflowError traceback
    (["--first-seed", str(2**40)], "--first-seed + --seeds - 1 must be <= 2**40"),
    (["--horizon", "0"], "--horizon must be >= 1"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--seeds", "many"], "--seeds"),
    (["algo.mass=native"], "algo.mass cannot be overridden here; it is set per variant by --variants"),
    (["algo.accounting=row"], "algo.accounting"),
    (["iterations=5"], "use --horizon"),
    (["seed=3"], "--seeds"),
    (["out_dir=x"], "use --out"),
    (["dump_batches=false"], "--no-dump makes it false"),
    (["env.group_sise=4"], "unknown config key"),
    (["configs/no-such.yaml"], "does not exist"),
])
def test_compare_bad_arguments(args, needle, tmp_path, capsys):
    assert oma_main(["compare", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oma compare: error:") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_report_bad_arguments(tmp_path, hand_made, capsys):
    assert oma_main(["report", str(tmp_path / "nothing")]) == 2
    assert "no compare.json" in capsys.readouterr().err
    assert oma_main(["report", str(hand_made), "--horizon", "0"]) == 2
    assert "--horizon must be >= 1" in capsys.readouterr().err
    assert oma_main(["report", str(hand_made), "--horizon", "9"]) == 2  # no run reached it
    assert "fewer than the horizon 9" in capsys.readouterr().err
    assert oma_main(["report", str(hand_made), "--out", str(tmp_path / "missing" / "r.md")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_lists_the_commands(capsys):
    assert oma_main([]) == 0
    text = capsys.readouterr().out
    assert "compare" in text and "report" in text


def test_report_names_a_run_file_it_cannot_read(hand_made, capsys):
    """#58 item 7: `oma report` on a run whose metrics.jsonl is not UTF-8 text is one line naming that file."""
    damaged = hand_made / "OA+MA" / "seed-1" / "metrics.jsonl"
    damaged.write_bytes(damaged.read_bytes() + b"\xff\n")
    assert oma_main(["report", str(hand_made)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and str(damaged) in err, err
