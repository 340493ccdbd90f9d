"""`oma compare` and `oma report` under faults (#58): a kill -9 of a compare with --jobs 2, an --out folder
compare did not make, damaged compare.json and run files, the umask, a killed compare's time.

The comparisons are of the tabular lane's chain preset with few tasks (a few seconds a run). Processes a test
starts are ended by their own ids; every wait has a deadline; nothing asserts a timing.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import oma.train
from oma.cli import main as oma_main
from oma.experiments import compare as compare_module
from oma.train import held
from permissions import mask, wrong_modes  # noqa: F401 (mask: a fixture)
from run_records import records, without_timings

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


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has: it holds no lock and runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def _kill_worker(pid: int) -> None:
    """SIGKILL worker ``pid`` if it is still a multiprocessing worker (not a later process given its id)."""
    try:
        if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass


# ---- item 2: the workers die with their compare, and a rerun gives the uninterrupted result -----------------


def test_item2_kill_9_of_compare_jobs_2_ends_its_workers_and_a_rerun_equals_an_uninterrupted_compare(tmp_path):
    """#58 items 2 and 12: `kill -9` of `oma compare --jobs 2` while both runs train ends its two workers (the
    OS kills them with their parent); the rerun takes over the locks the dead processes named, resumes the runs
    from their checkpoints and gives metrics and results.json equal to an uninterrupted compare's, each
    iteration once. The killed invocation stays in compare.json's history, marked killed, with the time it had
    written."""
    horizon, flags = 60, ("--variants", "2", "--seeds", "1", "--jobs", "2", "--no-dump")
    reference = tmp_path / "reference"
    assert oma_main(_args(reference, horizon, *flags)) == 0

    out = tmp_path / "killed"
    runs = [out / v / "seed-0" for v in ("row+native", "OA+MA")]
    parent = subprocess.Popen([sys.executable, "-m", "oma.cli", *_args(out, horizon, *flags)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not all((r / "checkpoints" / "latest").is_file() for r in runs) and time.monotonic() < deadline:
            assert parent.poll() is None, "the compare ended before it could be killed"
            time.sleep(0.05)
        workers = [int((r / ".oma-run").read_text().split()[1]) for r in runs]  # "pid N on host since ..."
        assert parent.pid not in workers and len(set(workers)) == 2
        recorded = json.loads((out / "compare.json").read_text())["history"][-1]
        parent.kill()
        parent.wait(timeout=60)
        assert not all((r / "summary.json").is_file() for r in runs), "both runs had finished: nothing was killed"
        deadline = time.monotonic() + 60
        while not all(_gone(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in workers if not _gone(pid)] == [], "workers outlived their compare"
    finally:
        parent.kill()
        parent.wait(timeout=60)
        for pid in workers:
            _kill_worker(pid)

    assert oma_main(_args(out, horizon, *flags)) == 0
    assert f"pid {os.getpid()} " in (out / ".oma-run").read_text()  # the dead compare's lock, taken over
    for run in runs:
        killed = records(run / "metrics.jsonl")
        assert [r["iteration"] for r in killed] == list(range(horizon + 1))
        assert without_timings(killed) == without_timings(records(reference / run.relative_to(out) / "metrics.jsonl"))
    assert json.loads((out / "results.json").read_text()) == json.loads((reference / "results.json").read_text())

    # item 12: the killed invocation's time is in the history, as its last write left it
    history = json.loads((out / "compare.json").read_text())["history"]
    assert [h["status"] for h in history] == ["killed", "finished"]
    assert history[0]["wall_time_s"] >= recorded["wall_time_s"] > 0 and history[0]["started"] == recorded["started"]
    assert sorted(history[1]["trained"]) == ["OA+MA/seed-0", "row+native/seed-0"]


def test_item2_workers_are_killed_when_the_pool_is_left_by_ctrl_c():
    """#58 item 2: Ctrl-C in compare (any exception leaving the pool) kills its workers at once, instead of
    leaving them to finish their current run. In a child process, bounded by its timeout."""
    script = """
import os, sys, time
from oma.experiments.worker import worker_pool
try:
    with worker_pool(1) as pool:
        pid = pool.submit(os.getpid).result()
        pool.submit(time.sleep, 600)
        raise KeyboardInterrupt
except KeyboardInterrupt:
    print(pid, os.path.exists(f"/proc/{pid}"))
"""
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    pid, alive = got.stdout.split()
    assert alive == "False", f"worker {pid} still runs"


def test_item2_a_worker_without_prctl_watches_its_parent():
    """#58 item 2: where the OS has no PR_SET_PDEATHSIG, a worker's thread kills it once its parent is no longer
    the one that started it."""
    code = "from oma.experiments.worker import _watch_parent; _watch_parent(-1)"  # -1: no process's parent
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert got.returncode == -signal.SIGKILL


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


def test_69_a_compare_json_compare_did_not_write_is_refused_before_the_lock_is_made(tmp_path, capsys):
    """#69: `mkdir u; echo '{"my":1}' > u/compare.json; oma compare --out u ...` was refused but left u/.oma-run."""
    out = tmp_path / "u"
    out.mkdir()
    (out / "compare.json").write_text('{"my":1}\n')
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 2
    assert "compare.json: no 'command'" in _one_line_error(capsys, "oma compare: error: ")
    assert [p.name for p in out.iterdir()] == ["compare.json"] and (out / "compare.json").read_text() == '{"my":1}\n'


@pytest.mark.parametrize("target, says", [
    ("compare.json", "is one of this command's inputs"),
    ("row+native/seed-0/metrics.jsonl", "is one of this command's inputs"),
    ("../notes.md", "exists and was not written by this command"),
    ("../success_curves.png", "exists and was not written by this command"),
])
def test_69_report_never_writes_over_its_inputs_or_a_file_it_did_not_write(finished, tmp_path, capsys, target, says):
    """#69: `oma report CMP --out CMP/compare.json` (or a run's metrics.jsonl) overwrote it with Markdown; so did
    --out onto a user's file, and the PNGs beside --out onto the user's PNGs. Refused, every file as it was."""
    out = _copy(finished, tmp_path)
    for name in ("notes.md", "success_curves.png"):
        (tmp_path / name).write_text("mine\n")
    before = {**_files(out), **{p: p.read_bytes() for p in tmp_path.glob("*.*")}}
    path = out / target if target != "../success_curves.png" else tmp_path / "new.md"
    assert oma_main(["report", str(out), "--out", str(path)]) == 2
    assert says in _one_line_error(capsys, f"oma report: error: --out {path}: ")
    assert {**_files(out), **{p: p.read_bytes() for p in tmp_path.glob("*.*")}} == before


def test_69_report_writes_again_over_its_own_report(finished, tmp_path):
    """#69: the rule refuses foreign files only: a report written again over its own report (and PNGs) succeeds."""
    out = _copy(finished, tmp_path)
    for _ in range(2):
        assert oma_main(["report", str(out), "--out", str(tmp_path / "mine.md")]) == 0
    assert (tmp_path / "mine.md").read_text().startswith("# oma compare: ")
    assert oma_main(["report", str(out)]) == 0


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


# ---- item 12: a running compare keeps its time in compare.json -------------------------------------------


def test_item12_a_running_compare_writes_its_time_so_far(tmp_path, monkeypatch):
    """#58 item 12: while a run trains, with nothing else happening, the heartbeat rewrites compare.json with the
    invocation's wall time so far (its history entry, marked running), so a kill loses at most one beat."""
    monkeypatch.setattr(compare_module, "HEARTBEAT_S", 0.05)
    out = tmp_path / "c"
    beats = []
    real_train = oma.train.train

    def train_after_a_beat(cfg, run_dir, *, resume=False, console=None):
        entry = json.loads((out / "compare.json").read_text())["history"][-1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = json.loads((out / "compare.json").read_text())["history"][-1]
            if now["wall_time_s"] > entry["wall_time_s"]:
                beats.append((entry, now))
                break
            time.sleep(0.01)
        return real_train(cfg, run_dir, resume=resume, console=console)

    monkeypatch.setattr(oma.train, "train", train_after_a_beat)
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1", "--no-dump")) == 0
    assert beats, "compare.json was not rewritten while the run trained"
    assert beats[0][1]["status"] == "running" and beats[0][1]["trained"] == []
    last = json.loads((out / "compare.json").read_text())["history"]
    assert len(last) == 1 and last[0]["status"] == "finished" and last[0]["wall_time_s"] > beats[0][1]["wall_time_s"]


def test_69_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    """#69: `oma compare --out` on a full disk was an OSError traceback; it is one line naming the file, exit 1 (a
    failure while running, docs/guarantees.md)."""
    import errno

    import oma.files

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(oma.files, "atomic_write_text", full)
    out = tmp_path / "c"
    assert oma_main(_args(out, 2, "--variants", "baseline", "--seeds", "1")) == 1
    assert _one_line_error(capsys, "oma compare: error: ") == \
        f"oma compare: error: {out / 'compare.json'}: No space left on device"
