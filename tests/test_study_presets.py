"""The studies' configs and committed runs: each study ran exactly the preset it names, and the runs that
should repeat one another do, record for record (studies/*/evidence)."""

import json

from oma.train.config import config_diff, load_config, to_dict
from run_records import lines, records, training_at_any_schedule, without_timings
from studies import evidence
from studies import preset as find_preset


PREVIOUS_DEFAULT = find_preset("household-gigpo-oma-2026-12-04.yaml")
CAP20 = find_preset("household-gigpo-oma-cap20.yaml")
"""The default job before its average of the weights (``optim.ema``): what its studies of 2026-12-04/05 ran."""
RUN_ONLY = ("out_dir", "seed", "threads", "tensorboard", "warm_start.cache_dir")
"""Keys that name where and how a run ran, not the job."""


def _evidence_configs(folder: str) -> list[dict]:
    paths = sorted(evidence(folder).glob("seed-*/config.json"))
    assert paths, f"no runs in {folder}"
    return [json.loads(p.read_text()) for p in paths]


def test_the_default_job_is_the_capped_terse_job_with_an_average_of_its_weights():
    default = load_config(None)
    assert default.optim.ema == 0.97
    assert load_config(None, ["optim.ema=0", "out_dir=runs/household-gigpo-oma-cap20"]) == load_config(CAP20)
    # its pre-registered study ran exactly it: fresh seeds 15-24, 2 threads, each from an empty warm-start cache
    [timed] = _evidence_configs("2026-12-05-default-job-timing/oma train with its average, fresh clone")
    assert config_diff(timed, to_dict(default), ignore=("warm_start.cache_dir",)) == []  # `oma train`, nothing else
    saved = _evidence_configs("2026-12-05-default-ema-15-24/the default job")
    # the same runs trained again without the average, from the same warm starts, to pair with (seeds 15-24)
    live = _evidence_configs("2026-12-05-default-live-15-24/the default job")
    assert sorted(s["seed"] for s in live) == list(range(15, 25)) and all(s["threads"] == 2 for s in live)
    for one in live:
        assert config_diff(one, to_dict(default), ignore=RUN_ONLY) == ["optim.ema (saved 0.0, now 0.97)"]
    assert sorted(s["seed"] for s in saved) == list(range(15, 25))
    for one in saved:
        assert config_diff(one, to_dict(default), ignore=RUN_ONLY) == [] and one["threads"] == 2


def test_the_default_job_timed_in_fresh_clones_on_two_days_is_the_same_run_to_the_last_digit():
    """`oma train` alone from an empty warm-start cache, in fresh clones on the AMD EPYC machine type: once on
    2026-12-05 and four times on 2026-12-06 (at 04:13, 04:35 and 05:19 UTC from 54483ee, at 09:55 from 0f45d34).
    Their wall times differ (229 to 351 s, docs/training.md#where-the-default-job-stands-measured): the work does
    not. Every record is equal, timings aside, and so is the final table's reading."""
    timings = evidence("2026-12-06-default-job-timing")
    runs = [evidence("2026-12-05-default-job-timing") / "oma train with its average, fresh clone" / "seed-0",
            *(timings / name / "seed-0" for name in ("oma train, fresh clone", "oma train, fresh clone, 22 minutes later",
                                                     "oma train, fresh clone, an hour later",
                                                     "oma train, fresh clone of 0f45d34"))]
    assert sorted(p.parent for p in runs[1:]) == sorted(timings.iterdir())  # every timing of that day
    default = to_dict(load_config(None))
    first = without_timings(records(runs[0] / "metrics.jsonl"))
    assert [r["iteration"] for r in first] == list(range(76))
    for run in runs:
        saved = json.loads((run / "config.json").read_text())
        assert config_diff(saved, default, ignore=("warm_start.cache_dir", "out_dir")) == [] and saved["threads"] == 2
        assert without_timings(records(run / "metrics.jsonl")) == first
        summary = json.loads((run / "summary.json").read_text())
        assert summary["warm_start_cached"] is False and summary["versions"]["cpu"] == "AMD EPYC"
        assert (summary["eval_success_start"], summary["eval_success_end"]) == (0.28125, 0.4140625)  # 36 → 53 of 128


def test_the_cap20_preset_is_terse_text_the_training_cap_of_20_and_75_iterations():
    default = load_config(CAP20)
    assert default.env.options == {"size": "small", "goals": ["place"], "distractors": "few", "notes": True, "hint": True,
                                   "text": "terse"}
    assert (default.env.train_max_steps, default.iterations, default.eval_every, default.optim.ema) == (20, 75, 75, 0.0)
    # the job its committed figures ran: the solo timings, and the pre-registered seeds 5-14 (evaluated every 15)
    for timed in ("2026-12-04-solo-timings/terse, cap 20, 75 iterations", "2026-12-04-solo-timings/terse, cap 20, 75 iterations, "
                  "timed again", "2026-12-04-solo-timings/terse, cap 20, 75 iterations, fresh clone",
                  "2026-12-05-default-job-timing/oma train, fresh clone", "2026-12-05-default-job-timing/oma train, AMD EPYC"):
        [saved] = _evidence_configs(timed)
        assert config_diff(saved, to_dict(default), ignore=RUN_ONLY) == []
    for saved in _evidence_configs("2026-12-04-cap20-75/terse, cap 20, 75 iterations"):
        assert config_diff(saved, to_dict(default), ignore=(*RUN_ONLY, "eval_every")) == []
        assert saved["eval_every"] == 15
    verl_accounting = to_dict(load_config(CAP20, ["algo.accounting=row", "algo.mass=native"]))
    for saved in _evidence_configs("2026-12-05-accounting-75/row+native"):  # its study under verl's accounting
        assert config_diff(saved, verl_accounting, ignore=(*RUN_ONLY, "eval_every")) == []
    for saved in _evidence_configs("2026-12-05-accounting-375/row+native"):  # and for 375 iterations
        assert config_diff(saved, verl_accounting, ignore=(*RUN_ONLY, "eval_every", "iterations")) == []
        assert (saved["iterations"], saved["eval_every"]) == (375, 15)


def test_the_dated_preset_is_the_default_job_of_2026_12_04():
    """Figures dated before 2026-12-05 name the default job of their day; this preset reruns them."""
    previous = load_config(PREVIOUS_DEFAULT)
    assert previous.env.options == {"size": "small", "goals": ["place"], "distractors": "few", "notes": True, "hint": True}
    assert (previous.env.train_max_steps, previous.iterations, previous.eval_every) == (None, 15, 15)
    back = load_config(None, ["env.train_max_steps=null", "iterations=15", "eval_every=15", "optim.ema=0", "out_dir=x"])
    del back.env.options["text"]  # household's own default, alfworld; no key, as its runs' warm-start cache keys had
    assert load_config(PREVIOUS_DEFAULT, ["out_dir=x"]) == back  # nothing else differs
    for saved in _evidence_configs("2026-12-04-15-seeds/the default job"):  # its 15-seed study ran exactly it
        assert config_diff(saved, to_dict(previous), ignore=RUN_ONLY) == []
    assert config_diff(_evidence_configs("2026-12-04-15-seeds/the default job")[0], to_dict(load_config(None)),
                       ignore=RUN_ONLY) != []  # and today's default job is another


def test_the_long_gigpo_preset_is_the_previous_default_job_run_longer():
    preset = find_preset("household-gigpo-oma-long.yaml")
    long = load_config(preset)
    assert (long.iterations, long.eval_every, long.out_dir) == (60, 10, "runs/household-gigpo-oma-long")
    assert load_config(preset, ["iterations=15", "eval_every=15", "out_dir=x"]) == load_config(PREVIOUS_DEFAULT, ["out_dir=x"])


def test_the_glam_preset_is_the_previous_default_job_over_whole_actions():
    preset = find_preset("household-gigpo-oma-glam.yaml")
    glam = load_config(preset)
    assert (glam.policy.normalise, glam.optim.lr, glam.out_dir) == ("action", 1e-4, "runs/household-gigpo-oma-glam")
    back = ["policy.normalise=token", "optim.lr=0.0003", "out_dir=x"]
    assert load_config(preset, back) == load_config(PREVIOUS_DEFAULT, ["out_dir=x"])


def test_the_terse_preset_is_the_default_job_without_the_training_cap_for_45_iterations():
    preset = find_preset("household-gigpo-oma-terse.yaml")
    terse = load_config(preset)
    assert (terse.env.options["text"], terse.env.train_max_steps, terse.iterations, terse.eval_every) == ("terse", None, 45, 45)
    back = ["env.train_max_steps=20", "iterations=75", "eval_every=75", "out_dir=runs/household-gigpo-oma-cap20"]
    assert load_config(preset, back) == load_config(CAP20)  # nothing else differs
    # = the previous default job with terse text (its study's description)
    assert load_config(preset, ["out_dir=x"]) == load_config(PREVIOUS_DEFAULT, ["env.options.text=terse", "iterations=45",
                                                                                 "eval_every=45", "out_dir=x"])
    # the default job's pre-registered study named its runs as overrides of this preset (docs/training.md)
    as_run = ["env.train_max_steps=20", "iterations=75", "eval_every=15", "out_dir=x"]
    assert load_config(preset, as_run) == load_config(CAP20, as_run[2:])


def test_the_375_preset_is_the_default_job_for_375_iterations_as_its_studies_ran():
    preset = find_preset("household-gigpo-oma-375.yaml")
    long = load_config(preset)
    assert (long.iterations, long.eval_every, long.out_dir) == (375, 15, "runs/household-gigpo-oma-375")
    assert load_config(preset, ["iterations=75", "eval_every=75", "out_dir=x"]) == load_config(CAP20, ["out_dir=x"])
    verl_accounting = to_dict(load_config(preset, ["algo.accounting=row", "algo.mass=native"]))
    for arm, expected in (("OA+MA", to_dict(long)), ("row+native", verl_accounting)):  # where and how they ran aside
        for saved in _evidence_configs(f"2026-12-05-accounting-375/{arm}"):
            assert config_diff(saved, expected, ignore=RUN_ONLY) == []
    [timed] = _evidence_configs("2026-12-05-solo-375/the 375 preset, alone")
    assert config_diff(timed, to_dict(long), ignore=RUN_ONLY) == [] and timed["threads"] == 2


def test_the_grpo_375_preset_is_the_375_preset_with_grpo_as_its_studies_ran():
    """Target 2's preset from 2026-12-05 until 2026-12-06: the default job for 375 iterations with GRPO's
    advantages; nothing else differs."""
    preset = find_preset("household-grpo-oma-375.yaml")
    grpo = load_config(preset)
    assert (grpo.algo.estimator, grpo.iterations, grpo.eval_every, grpo.optim.ema) == ("grpo", 375, 15, 0.0)
    assert (grpo.algo.accounting, grpo.algo.mass) == ("trajectory", "uniform")  # OA+MA, the default job's
    assert load_config(preset, ["out_dir=x"]) == load_config(find_preset("household-gigpo-oma-375.yaml"),
                                                             ["algo.estimator=grpo", "out_dir=x"])
    verl_accounting = to_dict(load_config(preset, ["algo.accounting=row", "algo.mass=native"]))
    for arm, expected in (("OA+MA", to_dict(grpo)), ("row+native", verl_accounting)):  # seeds 0-4, both arms
        saved = _evidence_configs(f"2026-12-05-grpo-375/{arm}")
        assert [s["seed"] for s in saved] == [0, 1, 2, 3, 4]
        more = _evidence_configs(f"2026-12-05-grpo-375-seeds-5-7/{arm}")  # three more seeds, trained from the preset
        assert [s["seed"] for s in more] == [5, 6, 7]
        for one in saved + more:
            assert config_diff(one, expected, ignore=RUN_ONLY) == [] and one["threads"] == 2
        # the same runs with an average of the weights started at iteration 275 (studies/tools/start_average.py)
        averaged = _evidence_configs(f"2026-12-05-grpo-375-ema/{arm}")
        assert [s["seed"] for s in averaged] == [0, 1, 2, 3, 4]
        averaged += _evidence_configs(f"2026-12-05-grpo-375-ema-seeds-5-7/{arm}")  # and seeds 5-7's, the same way
        assert [s["seed"] for s in averaged] == [0, 1, 2, 3, 4, 5, 6, 7]
        for one, before in zip(averaged, saved + more, strict=True):
            assert one["seed"] == before["seed"] and one["threads"] == 2
            assert config_diff(before, one, ignore=RUN_ONLY) == ["optim.ema (saved 0.0, now 0.97)"]
        # the same 16 runs continued from their iteration-375 checkpoints to 525 (a longer budget than target 2's)
        longer = _evidence_configs(f"2026-12-05-grpo-525/{arm}")
        for one, before in zip(longer, saved + more, strict=True):
            assert one["seed"] == before["seed"] and one["threads"] == 2
            assert config_diff(before, one, ignore=RUN_ONLY) == ["iterations (saved 375, now 525)"]
            run = evidence("2026-12-05-grpo-525") / arm / f"seed-{one['seed']}" / "metrics.jsonl"
            first = evidence("2026-12-05-grpo-375" if one["seed"] < 5 else "2026-12-05-grpo-375-seeds-5-7") / arm
            written = lines(run)
            assert written[:376] == lines(first / f"seed-{one['seed']}" / "metrics.jsonl")
            assert [json.loads(ln)["iteration"] for ln in written[376:]] == list(range(376, 526))
        # two more seeds, twice, trained from scratch for 525 iterations, read at 375 (the preset's end) and at 525
        for study, seeds in (("2026-12-05-grpo-525-seeds-8-9", [8, 9]), ("2026-12-06-grpo-525-seeds-10-11", [10, 11])):
            fresh = _evidence_configs(f"{study}/{arm}")
            assert [s["seed"] for s in fresh] == seeds
            for one in fresh:
                assert config_diff(expected, one, ignore=RUN_ONLY) == ["iterations (saved 375, now 525)"]
                assert one["threads"] == 2 and one["warm_start"]["cache_dir"] == "/tmp/emptycache"
                rows = records(evidence(study) / arm / f"seed-{one['seed']}" / "metrics.jsonl")
                assert [r["iteration"] for r in rows] == list(range(526))
                assert [r["iteration"] for r in rows if "eval_success" in r] == list(range(0, 526, 15))


def test_the_long_grpo_preset_is_the_grpo_375_preset_with_its_evaluation_time_spent_on_iterations():
    """Target 2's preset since 2026-12-06: the 375 recipe for 420 iterations, evaluated every 60, with the
    default job's average of the weights; its pre-registered study (seeds 12-16, one at a time) ran exactly it."""
    path = find_preset("household-grpo-oma-long.yaml")
    preset = load_config(path)
    assert (preset.algo.estimator, preset.iterations, preset.eval_every, preset.optim.ema) == ("grpo", 420, 60, 0.97)
    assert preset.optim.ema == load_config(None).optim.ema  # the default job's average
    assert load_config(path, ["out_dir=x"]) == load_config(
        find_preset("household-grpo-oma-375.yaml"), ["iterations=420", "eval_every=60", "optim.ema=0.97", "out_dir=x"])
    verl_accounting = to_dict(load_config(path, ["algo.accounting=row", "algo.mass=native"]))
    for arm, expected in (("OA+MA", to_dict(preset)), ("row+native", verl_accounting)):
        runs = _evidence_configs(f"2026-12-06-grpo-420-ema/{arm}")
        assert [s["seed"] for s in runs] == [12, 13, 14, 15, 16]
        for one in runs:
            assert config_diff(expected, one, ignore=RUN_ONLY) == []
            assert one["threads"] == 2 and one["warm_start"]["cache_dir"] == "/tmp/cache420"
            rows = records(evidence("2026-12-06-grpo-420-ema") / arm / f"seed-{one['seed']}" / "metrics.jsonl")
            assert [r["iteration"] for r in rows] == list(range(421))
            assert [r["iteration"] for r in rows if "eval_success" in r] == list(range(0, 421, 60))


def test_target_2s_preset_as_a_user_runs_it_trains_as_the_375_recipe_did_and_meets_the_target():
    """`oma train configs/household-grpo-oma-long.yaml` as is (seed 0) from an empty warm-start cache, alone in a fresh
    clone of 0f45d34 (2026-12-06, AMD EPYC, 2 threads): its 420 iterations train exactly as the first 420 of the 375
    recipe's seed-0 run continued to 525 (evaluations and the average do not train), and its end meets target 2's
    per-run criterion."""
    run = evidence("2026-12-06-grpo-long-fresh-clone") / "OA+MA" / "seed-0"
    saved = json.loads((run / "config.json").read_text())
    preset = to_dict(load_config(find_preset("household-grpo-oma-long.yaml")))
    assert config_diff(saved, preset, ignore=("warm_start.cache_dir", "out_dir")) == [] and saved["threads"] == 2
    rows = records(run / "metrics.jsonl")
    assert [r["iteration"] for r in rows if "eval_success" in r] == list(range(0, 421, 60))
    earlier = records(evidence("2026-12-05-grpo-525") / "OA+MA" / "seed-0" / "metrics.jsonl")
    assert training_at_any_schedule(rows) == training_at_any_schedule(earlier)[:421]
    assert rows[0]["eval_success"] == earlier[0]["eval_success"] == 0.28125  # the same warm start: 36 of 128
    summary = json.loads((run / "summary.json").read_text())
    assert summary["warm_start_cached"] is False and summary["iterations"] == 420
    assert summary["eval_success_end"] == 0.625  # 80 of 128 under the average: +34.4 points, at least +25


def test_target_2s_preset_rerun_a_day_later_repeats_its_study_run_to_the_last_digit():
    """OA+MA seed 0 of the 2026-12-05 study, trained again on 2026-12-06 from a fresh clone's install (the same
    CPU type, 2 threads, a warm start built by the default job of the same seed): every record of metrics.jsonl
    but the timings is equal, losses and held-out evaluations included."""
    study, rerun = (evidence(d) / "OA+MA" / "seed-0" for d in ("2026-12-05-grpo-375", "2026-12-06-grpo-375-rerun"))
    saved, again = (json.loads((d / "config.json").read_text()) for d in (study, rerun))
    assert config_diff(saved, again, ignore=RUN_ONLY) == [] and saved["threads"] == again["threads"] == 2

    first, second = records(study / "metrics.jsonl"), records(rerun / "metrics.jsonl")
    assert [r["iteration"] for r in second] == list(range(376))
    assert without_timings(second) == without_timings(first)  # rollouts, losses, diagnostics, evaluations
    assert second[-1]["eval_success"] == 0.6484375  # 83 of 128 held-out tasks, greedy, at iteration 375
