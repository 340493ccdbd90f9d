"""`oma compare` and `oma report` under faults (#58): a kill -9 of a compare with --jobs 2, an --out folder
compare did not make, damaged compare.json and run files, the umask, a killed compare's time.

The comparisons are of the tabular lane's chain preset with few tasks (a few seconds a run). Processes a test
starts are ended by their own ids; every wait has a deadline; nothing asserts a timing.
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from oma.cli import main as oma_main
from oma.train import held
from permissions import mask, wrong_modes  # noqa: F401 (mask: a fixture)

ROOT = Path(__file__).resolve().parents[1]
CHAIN = [str(ROOT / "configs" / "chain-tabular-grpo.yaml"), "env.eval_tasks=4", "env.tasks_per_iter=4", "eval_every=2"]
"""The lane's preset, small: a run of 60 iterations takes seconds, and checkpoints every 10. Its tabular
policy caches no warm start."""


def _args(out: Path, horizon: int, *flags: str) -> list[str]:
    return ["compare", *CHAIN, "--horizon", str(horizon), "--out", str(out), *flags]


def _one_line_error(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith(prefix), err
    return err


# ---- item 3: compare writes only into its own folder -------------------------------------------------------


def test_item3_compare_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    """#58 item 3: --out naming a non-empty folder without compare.json is refused in one line naming --out and
    what was expected, and nothing in it is touched; an empty folder is used."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my own notes")
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 2
    err = _one_line_error(capsys, f"oma compare: error: --out {out}: ")
    assert "no compare.json" in err and "expected a new or empty folder" in err
    assert [p.name for p in out.iterdir()] == ["report.md"] and (out / "report.md").read_text() == "my own notes"

    (out / "report.md").unlink()
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1", "--no-dump")) == 0
    assert (out / "compare.json").is_file() and (out / "report.md").is_file()


def test_item3_a_folder_another_compare_holds_is_refused_naming_it(tmp_path, capsys):
    """#58 item 3: one compare at a time in a folder: a second is refused in one line naming the holder."""
    out = tmp_path / "c"
    out.mkdir()
    with held(out, "--out"):
        assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 2
    err = _one_line_error(capsys, "oma compare: error: --out: ")
    assert f"{out} is in use by pid {os.getpid()} on " in err
    assert not (out / "compare.json").exists()


# ---- item 7: damaged files are one line naming them -------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished one-run comparison that dumped its batches (so the report audits them and reads config.json)."""
    out = tmp_path_factory.mktemp("finished") / "c"
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 0
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "c"
    shutil.copytree(finished, out)
    return out


def _files(folder: Path) -> dict[Path, bytes]:
    """Every file under ``folder`` and its bytes, the lock aside (a compare that takes it writes its pid there)."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".oma-run"}


def _without_horizon(path: Path) -> None:
    doc = json.loads(path.read_text())
    del doc["horizon"]
    path.write_text(json.dumps(doc))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40])


def _seeds_text(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["seeds"] = "0"
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("damage, says", [
    (_without_horizon, "compare.json: no 'horizon'; expected an integer >= 1"),
    (_cut, "compare.json is damaged (Unterminated string"),
    (_seeds_text, "compare.json: 'seeds' must be a list of integers >= 0, found \"0\""),
    (lambda p: p.write_text("[]"), "compare.json is damaged (a JSON list, not an object)"),
])
def test_item7_a_damaged_compare_json_is_one_line_naming_it(finished, tmp_path, capsys, damage, says):
    """#58 item 7: a compare.json without `horizon`, cut short, with a field of the wrong type or not an object
    is one line naming the file and what was expected, for `oma compare` rerun into it and for `oma report`;
    nothing is written."""
    out = _copy(finished, tmp_path)
    damage(out / "compare.json")
    before = (out / "compare.json").read_bytes()
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 2
    assert f"{out / 'compare.json'}" in (err := _one_line_error(capsys, "oma compare: error: ")) and says in err, err
    assert oma_main(["report", str(out)]) == 2
    assert says in _one_line_error(capsys, f"oma report: error: {out / 'compare.json'}")
    assert (out / "compare.json").read_bytes() == before


@pytest.mark.parametrize("name, damage, says", [
    ("config.json", _cut, "is damaged (Unterminated string"),
    ("config.json", lambda p: p.write_text("[]"), "is damaged (a JSON list, not an object)"),
    ("summary.json", _cut, "is damaged ("),
    ("summary.json", lambda p: p.write_text("{}"), "'iterations' must be an integer, found null"),
])
def test_item7_a_damaged_run_file_on_a_compare_rerun_is_one_line_naming_it(finished, tmp_path, capsys, name, damage,
                                                                          says):
    """#58 item 7: a rerun that finds a run's config.json or summary.json damaged stops before anything runs, in one
    line naming the file and how to go on (a damaged file is never trained over: oma writes both atomically, so
    the damage came from elsewhere and is the user's to look at); the folder's files are left as they were."""
    out = _copy(finished, tmp_path)
    path = out / "row+native" / "seed-0" / name
    damage(path)
    before = _files(out)
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 2
    err = _one_line_error(capsys, f"oma compare: error: {path}")
    assert says in err and "remove" in err and "another --out" in err
    assert _files(out) == before


@pytest.mark.parametrize("name, damage, says", [
    ("config.json", _cut, "is damaged (Unterminated string"),
    ("metrics.jsonl", lambda p: p.write_text(p.read_text() + "{}\n"), "record 4 has no integer iteration"),
    ("metrics.jsonl", lambda p: p.write_bytes(p.read_bytes() + b"\xff\n"), "is not UTF-8 text"),
])
def test_item7_report_names_the_run_file_it_cannot_read(finished, tmp_path, capsys, name, damage, says):
    """#58 item 7: `oma report` on a run whose config.json or metrics.jsonl cannot be read is one line naming the
    file; `oma compare` rerun into the folder says it wrote no report, naming the file, and exits 1."""
    out = _copy(finished, tmp_path)
    path = out / "row+native" / "seed-0" / name
    damage(path)
    assert oma_main(["report", str(out)]) == 2
    assert says in _one_line_error(capsys, f"oma report: error: {path}")
    if name == "metrics.jsonl":  # a damaged config.json stops the rerun before it (the test above)
        assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 1
        got = capsys.readouterr()
        printed = got.out.replace("\n", "")  # the console wraps long lines
        assert "Traceback" not in got.err and f"no report: {path}" in printed and says in printed


# ---- item 10: the comparison's own files follow the umask --------------------------------------------------


def test_item10_compare_outputs_follow_the_umask(tmp_path, mask):
    """#58 item 10: compare.json, results.json, report.md, the PNGs, the lock and the runs get what a plain open or
    mkdir gives (0644/0755 under umask 022, 0600/0700 under 077), also after a rerun rewrites them."""
    out = tmp_path / "c"
    args = _args(out, 2, "--variants", "baseline", "--seeds", "1", "--no-dump")
    assert oma_main(args) == 0
    assert {"compare.json", "results.json", "report.md", "success_curves.png", ".oma-run"} <= {p.name for p in out.iterdir()}
    assert wrong_modes(out, mask) == []
    assert oma_main(args) == 0
    assert wrong_modes(out, mask) == []
