"""`oma train` under faults: races, bad numbers, interrupts, corrupt or half-written files, short runs.

The runs use the tabular policy on `chain` (about a second each): the fault handling is the loop's
and the CLI's, the same for every policy.
"""

import errno
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from oma.agent.kinds import policy_kind
from oma.cli import main as oma_main
from oma.train import make_env
from oma.train.config import ConfigError, load_config
from permissions import mask, wrong_modes  # noqa: F401 (mask: a fixture)

FAST = ["policy.model=tabular", "env.name=chain", "env.options.length=2", "env.eval_tasks=4", "env.tasks_per_iter=2",
        "env.group_size=3", "optim.optimizer=normalized-sgd", "optim.lr=0.2", "tensorboard=false", "threads=1"]

WARM_LM = ["policy.hidden=32", "policy.layers=1", "policy.heads=2", "policy.vocab_size=300", "warm_start.episodes=2",
           "warm_start.epochs=1", "policy.max_new_tokens=6", "threads=1"]
"""A tiny LM whose warm start (the one kind that is cached) takes about a second."""


def _metrics(path: Path) -> list[dict]:
    drop = ("time_", "tokens_per_s", "rows_per_s", "warm_start")
    return [{k: v for k, v in json.loads(ln).items() if not k.startswith(drop)} for ln in path.read_text().splitlines()]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---- claiming the run folder -------------------------------------------------------------------


def _claim(args):
    from oma.train.cli import claim_run_dir

    path, barrier = args
    barrier.wait()
    return str(claim_run_dir(Path(path)))


def test_simultaneous_starts_claim_distinct_folders(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(6)
        with ctx.Pool(6) as pool:
            got = pool.map(_claim, [(str(tmp_path / "run"), barrier)] * 6)
    assert sorted(got) == sorted({str(tmp_path / "run"), *(str(tmp_path / f"run-{k}") for k in range(2, 7))})


def test_an_empty_existing_folder_is_claimed_once(tmp_path):
    from oma.train.cli import claim_run_dir

    (tmp_path / "run").mkdir()
    assert claim_run_dir(tmp_path / "run") == tmp_path / "run"
    assert claim_run_dir(tmp_path / "run") == tmp_path / "run-2"  # claimed, though still empty of results


def test_a_run_folder_is_locked_for_the_life_of_its_process(tmp_path):
    """#58 item 1: while one process trains into a folder, a second --resume of it is refused in one line
    naming the holder, and a fresh run goes to a sibling; after kill -9 of the holder the OS has released
    the lock, and the run resumes with each iteration once."""
    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "oma.cli", "train", *FAST, "iterations=100000", "checkpoint_every=20"]
    first = subprocess.Popen([*cmd, f"out_dir={run}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "latest").is_file() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert first.poll() is None, "the first run ended before a second one could try its folder"
        second = subprocess.run([*cmd, f"out_dir={run}", "--resume"], capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run ended while the second one tried its folder"
        assert second.returncode == 2
        err = second.stderr.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert f"{run} is in use by pid {first.pid} on {socket.gethostname()} since " in err
        fresh = subprocess.run([*cmd[:-2], "iterations=1", f"out_dir={run}"], capture_output=True, text=True, timeout=120)
        assert fresh.returncode == 0 and (tmp_path / "r-2" / "summary.json").is_file(), fresh.stderr
    finally:
        first.kill()  # SIGKILL: no handler runs, only the OS can release the lock
        first.wait(timeout=60)
    done = int((run / "checkpoints" / "latest").read_text().strip().removeprefix("iter_"))
    assert oma_main(["train", *FAST, "checkpoint_every=20", f"iterations={done + 1}", f"out_dir={run}", "--resume"]) == 0
    assert [json.loads(ln)["iteration"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == list(range(done + 2))


def test_the_lock_is_given_back_when_training_ends_and_refuses_a_second_holder(tmp_path, capsys):
    """#58 item 1: train() holds the folder only while it runs (the next command of the same process may
    take it), and a second holder, even in the same process, is refused naming the first."""
    from oma.train.lock import held

    run = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=2", f"out_dir={run}"]) == 0
    with held(run):
        assert oma_main(["train", *FAST, "iterations=3", f"out_dir={run}", "--resume"]) == 2
        assert f"{run} is in use by pid {os.getpid()} on " in _one_line_error(capsys)
    assert oma_main(["train", *FAST, "iterations=3", f"out_dir={run}", "--resume"]) == 0


# ---- numbers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("override, key", [
    ("optim.grad_clip=-1", "optim.grad_clip"), ("optim.grad_clip=0", "optim.grad_clip"),
    ("env.group_size=1", "env.group_size"), ("policy.temperature=0", "policy.temperature"),
    ("policy.temperature=-1", "policy.temperature"), ("algo.entropy_coef=nan", "algo.entropy_coef"),
    ("algo.clip_high=nan", "algo.clip_high"), ("algo.clip_low=-0.1", "algo.clip_low"), ("optim.lr=inf", "optim.lr"),
    ("algo.gamma=1.5", "algo.gamma"), ("optim.weight_decay=-1", "optim.weight_decay"),
    ("algo.step_advantage_w=nan", "algo.step_advantage_w"), ("warm_start.lr=0", "warm_start.lr"),
    ("env.invalid_penalty=inf", "env.invalid_penalty"),
])
def test_numeric_options_are_checked_once_by_name(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


# ---- one line instead of a traceback ---------------------------------------------------------------


def test_yaml_syntax_error_is_one_line_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  mass: [native\n")
    assert oma_main(["train", str(bad), f"out_dir={tmp_path / 'r'}"]) == 2
    err = _one_line_error(capsys)
    assert str(bad) in err and "line" in err
    assert not (tmp_path / "r").exists()


def test_out_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert oma_main(["train", *FAST, f"out_dir={tmp_path / 'f'}", "--resume"]) == 2
    assert "is a file" in _one_line_error(capsys)
    assert oma_main(["train", *FAST, f"out_dir={tmp_path / 'f'}"]) == 2
    assert "is a file" in _one_line_error(capsys)


def test_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    from oma.train import loop

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / "checkpoints"))

    monkeypatch.setattr(loop, "save_checkpoint", full)
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={tmp_path / 'r'}"]) == 1  # a runtime failure, not a usage error
    err = _one_line_error(capsys)
    assert "No space left on device" in err and "checkpoints" in err


def test_sigint_is_one_line_and_the_run_resumes(tmp_path):
    out = tmp_path / "r"
    cmd = [sys.executable, "-m", "oma.cli", "train", *FAST, "iterations=5000", "checkpoint_every=1", f"out_dir={out}"]
    # a shell that starts jobs in the background makes them ignore SIGINT; Ctrl-C in a terminal does not
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 60
        while not (out / "checkpoints" / "latest").is_file() and time.time() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "--resume" in err
    done = int((out / "checkpoints" / "latest").read_text().strip().removeprefix("iter_"))
    assert oma_main(["train", *FAST, "checkpoint_every=1", f"iterations={done + 1}", f"out_dir={out}", "--resume"]) == 0
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["iteration"] == done + 1


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
"""342 bytes of nested aliases that expand to 9^9 (387 million) strings."""


def _limited_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # an expansion that is not refused fails fast, not the machine


@pytest.mark.parametrize("text, says", [
    (BOMB, "expands to more than 10000 YAML nodes through its aliases"),
    ("env: &x\n  options: {a: *x}\n", "contains an alias of itself"),
    ("a: &x [1, *x]\n", "contains an alias of itself"),
], ids=["alias-bomb", "self-alias-mapping", "self-alias-list"])
def test_yaml_alias_bombs_and_self_references_are_refused_in_one_line(tmp_path, text, says):
    """#58 item 5: a YAML alias bomb and a self-referencing alias are refused before they expand, in one line
    naming the file (they grew memory past 874 MB, or ended in a 2,756-line RecursionError)."""
    config = tmp_path / "bomb.yaml"
    config.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "oma.cli", "train", str(config), f"out_dir={tmp_path / 'r'}"],
                          capture_output=True, text=True, timeout=300, preexec_fn=_limited_memory)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err[-2000:]
    assert str(config) in err and says in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text, says", [
    ("- a\n- b\n", "must be a YAML mapping of keys"),
    ("3\n", "must be a YAML mapping of keys"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nests its YAML collections too deep to read"),
], ids=["a-list", "a-number", "nested-5000-deep"])
def test_a_yaml_that_is_no_preset_is_refused_in_one_line(tmp_path, capsys, text, says):
    """#58 items 5 and 7: a preset that is a list or a number (an OSError from OmegaConf, exit 1) or nests 5,000
    levels deep (a RecursionError in PyYAML, like the self-referencing alias) is one line naming the file."""
    config = tmp_path / "c.yaml"
    config.write_text(text)
    assert oma_main(["train", str(config), f"out_dir={tmp_path / 'r'}"]) == 2
    err = _one_line_error(capsys)
    assert str(config) in err and says in err


def test_a_preset_may_use_a_few_aliases(tmp_path):
    """#58 item 5: the budget refuses expansions, not YAML's anchors: a preset that repeats a value by alias loads."""
    config = tmp_path / "c.yaml"
    config.write_text("env:\n  name: chain\n  options: {length: &n 3, max_steps: *n}\npolicy: {model: tabular}\n")
    assert load_config(config).env.options == {"length": 3, "max_steps": 3}


@pytest.mark.parametrize("offset", [-5, 0, 2_000_000 - 128 + 1])
def test_an_eval_seed_offset_that_lets_seeds_meet_is_refused_naming_the_range(offset):
    """#58 item 6: env.eval_seed_offset=-5 made training seeds held-out seeds too, 0 divided by zero, and one
    past 2,000,000 - eval_tasks made held-out seeds demonstration seeds; each is refused naming the key and range."""
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"env.eval_seed_offset={offset}"])
    assert str(e.value).startswith("env.eval_seed_offset must be in [1, 1999872]") and str(e.value).endswith(f"got {offset}")


@pytest.mark.parametrize("offset", [1, 7, 1_999_872])
def test_every_accepted_eval_seed_offset_keeps_training_and_held_out_seeds_apart(offset):
    """#58 item 6: at both ends of the range, training seeds (oma.train.task_seeds) never meet held-out seeds."""
    from oma.train import task_seeds

    cfg = load_config(None, [f"env.eval_seed_offset={offset}", "env.tasks_per_iter=16"])
    held_out = {cfg.env.eval_seed_offset + k for k in range(cfg.env.eval_tasks)}
    for seed in (0, 3):
        cfg.seed = seed
        training = {s for it in range(1, 40) for s in task_seeds(cfg, it)}
        assert training and not training & held_out and min(training) >= 0


@pytest.mark.parametrize("overrides, says", [
    (["optim.lr=1e308", "optim.optimizer=sgd"], "optim.lr must be a finite number within float32's range"),
    (["policy.table_size=1"], "policy.table_size=1 is full"),
    (["policy.table_size=99999999999999"], "policy.table_size=99999999999999 needs 372529.0 GiB"),
    (["seed=99999999999999999999"], "seed must fit in 64 bits"),
    (["seed=2000000000000"], "seed must be in [-2**40, 2**40]"),
    (["threads=2147483648"], "threads must be in [1, 1024]"),
])
def test_bad_settings_are_one_line_and_leave_no_folder(tmp_path, capsys, overrides, says):
    """#58 item 7: optim.lr=1e308 (a torch overflow), policy.table_size=1 (a ValueError while running) and the
    integers torch cannot take (a table it cannot allocate, a seed or thread count past its int64 or int) are one
    line with exit 2, and the folder claimed for the run is removed, so the next run gets out_dir itself."""
    out = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=2", *overrides, f"out_dir={out}"]) == 2
    assert says in _one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("override", ["optim.optimizer=normalized-sgd", "optim.optimizer=sgd", "optim.optimizer=adamw"])
def test_a_run_that_diverges_is_one_line(tmp_path, capsys, override):
    """#58 item 7: a learning rate within float32 that still overflows the step, or makes the metrics inf, is a
    failure while running (exit 1) in one line, not a torch or JSON traceback."""
    assert oma_main(["train", *FAST, "iterations=2", override, "optim.lr=3e38", f"out_dir={tmp_path / 'r'}"]) == 1
    assert "lower optim.lr" in _one_line_error(capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("lr", ["3e38", "1e30"])
def test_a_warm_start_that_diverges_is_one_line_and_is_not_cached(tmp_path, capsys, lr):
    """#58 item 7: a warm_start.lr that overflows the SFT step (3e38) or makes the weights inf/NaN (1e30) was a
    torch traceback, or a NaN policy cached for every later run; it is one line (exit 1) and nothing is cached."""
    assert oma_main(["train", *WARM_LM, "iterations=1", "env.eval_tasks=2", "env.tasks_per_iter=2", "env.group_size=2",
                     "optim.num_minibatches=1", "tensorboard=false", f"warm_start.lr={lr}",
                     f"warm_start.cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'r'}"]) == 1
    assert "lower warm_start.lr" in _one_line_error(capsys)
    assert not (tmp_path / "r").exists() and not any((tmp_path / "cache").rglob("done.json"))


@pytest.mark.parametrize("out_dir", [".", "/", ".."])
def test_an_out_dir_that_names_no_folder_of_its_own_is_one_line(tmp_path, capsys, monkeypatch, out_dir):
    """#58 item 7: out_dir=. and out_dir=/ were a ValueError traceback from Path.with_name."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path / "work")
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={out_dir}"]) == 2
    assert f"out_dir={out_dir!r} names no folder of its own" in _one_line_error(capsys)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_a_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path, capsys):
    """#58 item 7: a Latin-1 preset was a UnicodeDecodeError traceback."""
    config = tmp_path / "latin1.yaml"
    config.write_bytes("out_dir: runs/caf\xe9\n".encode("latin-1"))
    assert oma_main(["train", str(config), *FAST]) == 2
    err = _one_line_error(capsys)
    assert str(config) in err and "not UTF-8" in err and "0xe9" in err


def _safetensors_full_disk(*args, **kwargs):
    from safetensors import SafetensorError

    # what safetensors 0.8 raises when the disk is full (measured on a 64 KiB tmpfs)
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def _oserror_full_disk(path, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """#58 item 7: a full disk while a checkpoint's tensors are written (safetensors' own error, not an OSError)
    is one line with exit 1 naming the checkpoint; the half-written checkpoint is removed, and so is the folder,
    which held no checkpoint, so the next run gets out_dir itself, not out_dir-2."""
    from oma.train import checkpoint

    out = tmp_path / "r"
    monkeypatch.setattr(checkpoint, "save_file", _safetensors_full_disk)
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={out}"]) == 1
    err = _one_line_error(capsys)
    assert f"checkpoint {out / 'checkpoints' / 'iter_000001'} could not be written" in err and "No space left on device" in err
    assert not out.exists()
    monkeypatch.undo()
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={out}"]) == 0
    assert not (tmp_path / "r-2").exists()


def test_a_full_disk_after_a_checkpoint_is_one_line_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """#58 item 7: a full disk while ``checkpoints/latest`` is replaced (an OSError) is one line with exit 1; the
    checkpoint before it is complete, so the folder stays and --resume finishes the run."""
    from oma.train import checkpoint

    out = tmp_path / "r"
    monkeypatch.setattr(checkpoint, "atomic_write_text", _oserror_full_disk)
    assert oma_main(["train", *FAST, "iterations=2", "checkpoint_every=1", f"out_dir={out}"]) == 1
    err = _one_line_error(capsys)
    assert "No space left on device" in err and "latest" in err
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["iter_000001"]
    monkeypatch.undo()
    assert oma_main(["train", *FAST, "iterations=2", "checkpoint_every=1", f"out_dir={out}", "--resume"]) == 0
    assert [json.loads(ln)["iteration"] for ln in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


@pytest.mark.parametrize("name, damage, says", [
    ("metrics.jsonl", lambda text: text.replace("\n", "\n{}\n", 1), "line 2 is not a record with an integer iteration"),
    ("metrics.jsonl", lambda text: text.replace("\n", "\n[1, 2]\n", 1), "line 2 is not a record with an integer iteration"),
    ("samples.jsonl", lambda text: text.replace("\n", '\n{"iteration": "1"}\n', 1), "line 2 is not a record"),
    ("config.json", lambda text: text[: len(text) // 2], "config.json is damaged ("),
    ("config.json", lambda text: "[]", "config.json is damaged (a JSON list, not an object)"),
], ids=["empty-record", "list-line", "string-iteration", "truncated-config", "config-not-an-object"])
def test_a_damaged_run_file_on_resume_is_one_line_naming_it(tmp_path, capsys, name, damage, says):
    """#58 item 7: a ``{}`` line in metrics.jsonl (a KeyError) or a truncated config.json (a JSONDecodeError)
    on --resume is one line with exit 2 naming the file; the run folder is left as it was."""
    run = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=2", f"out_dir={run}"]) == 0
    path = run / name
    path.write_text(damage(path.read_text()))
    before = sorted(p.name for p in run.rglob("*"))
    assert oma_main(["train", *FAST, "iterations=3", f"out_dir={run}", "--resume"]) == 2
    err = _one_line_error(capsys)
    assert str(path) in err and says in err
    assert sorted(p.name for p in run.rglob("*")) == before


# ---- failed starts leave nothing behind -----------------------------------------------------------


def test_a_failed_start_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "r"
    assert oma_main(["train", "policy.model=/nonexistent/model", f"out_dir={out}", "tensorboard=false"]) == 2
    _one_line_error(capsys)
    assert not out.exists()
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={out}"]) == 0
    assert (out / "config.json").is_file() and not (tmp_path / "r-2").exists()
    assert oma_main(["train", *FAST, f"out_dir={tmp_path / 'missing'}", "--resume"]) == 2
    assert "--resume" in _one_line_error(capsys) and not (tmp_path / "missing").exists()


# ---- resume ------------------------------------------------------------------------------------------


def test_a_short_run_can_resume(tmp_path):
    cfg = load_config(None, [*FAST, "iterations=4"])
    assert cfg.checkpoint_every > cfg.iterations  # the default (5) would never checkpoint a 4-iteration run
    assert oma_main(["train", *FAST, "iterations=4", f"out_dir={tmp_path / 'r'}"]) == 0
    names = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir() if p.name.startswith("iter_"))
    assert names == ["iter_000002", "iter_000004"]


def _straight_and_resumed(tmp_path, damage):
    common = [*FAST, "checkpoint_every=2", "eval_every=2", "samples_per_iter=2"]
    assert oma_main(["train", *common, "iterations=6", f"out_dir={tmp_path / 'straight'}"]) == 0
    assert oma_main(["train", *common, "iterations=4", f"out_dir={tmp_path / 'resumed'}"]) == 0
    damage(tmp_path / "resumed")
    assert oma_main(["train", *common, "iterations=6", f"out_dir={tmp_path / 'resumed'}", "--resume"]) == 0
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _metrics(resumed / "metrics.jsonl") == _metrics(straight / "metrics.jsonl")
    assert (resumed / "samples.jsonl").read_text() == (straight / "samples.jsonl").read_text()
    return resumed


def test_resume_trims_samples_and_a_half_written_metrics_line(tmp_path):
    def damage(run):
        with (run / "metrics.jsonl").open("a") as f:
            f.write('{"iteration": 5, "succ')  # killed mid-write
        with (run / "samples.jsonl").open("a") as f:
            f.write(json.dumps({"iteration": 5, "seed": 0}) + "\n")  # written after the last checkpoint

    _straight_and_resumed(tmp_path, damage)


def test_a_corrupt_checkpoint_is_named_and_the_previous_one_used(tmp_path, capsys):
    def damage(run):
        model = run / "checkpoints" / "iter_000004" / "model.safetensors"
        data = bytearray(model.read_bytes())
        data[-1] ^= 0xFF  # in place: same size, still parses
        model.write_bytes(bytes(data))

    _straight_and_resumed(tmp_path, damage)
    out = capsys.readouterr()
    assert "iter_000004" in out.out + out.err and "model.safetensors" in out.out + out.err


def test_resume_cleans_debris_of_killed_saves(tmp_path):
    run = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=2", "checkpoint_every=1", f"out_dir={run}"]) == 0
    (run / "checkpoints" / ".tmp-abc123").mkdir()
    (run / "checkpoints" / ".tmp-abc123" / "model.safetensors").write_bytes(b"partial")
    (run / "checkpoints" / ".latest.xyz").write_text("iter_000009")
    assert oma_main(["train", *FAST, "iterations=3", "checkpoint_every=1", f"out_dir={run}", "--resume"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")) == []


def test_resume_cleans_the_temporary_files_of_an_interrupted_resume(tmp_path):
    """#58 item 12: a resume rewrites samples.jsonl through a temporary file (and dump_batches writes each batch
    through one); those an interrupted resume left are removed by the next, and nothing else is."""
    run = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=2", "checkpoint_every=1", "dump_batches=true", f"out_dir={run}"]) == 0
    (run / ".samples.jsonl.k2x9q1").write_text('{"iteration": 1')
    (run / "batches" / ".iter_000002.parquet.tmp-4242-0a1b2c3d").write_bytes(b"PAR1")
    (run / "notes.txt").write_text("mine")
    assert oma_main(["train", *FAST, "iterations=3", "checkpoint_every=1", "dump_batches=true", f"out_dir={run}",
                     "--resume"]) == 0
    assert sorted(p.name for p in run.rglob(".*") if p.name != ".oma-run") == []
    assert (run / "notes.txt").read_text() == "mine"


def test_resume_config_mismatch_names_the_dotted_key(tmp_path, capsys):
    run = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={run}"]) == 0
    assert oma_main(["train", *FAST, "iterations=2", "algo.mass=native", f"out_dir={run}", "--resume"]) == 2
    err = _one_line_error(capsys)
    assert "algo.mass" in err and "['algo']" not in err


# ---- permissions -------------------------------------------------------------------------------------


def test_a_run_folder_follows_the_umask_before_and_after_a_resume(tmp_path, mask):
    """#58 item 10: config.json, summary.json, checkpoints, latest, metrics.jsonl, samples.jsonl and
    .oma-run get 0644/0755 under umask 022 (0600/0700 under 077), also after a resume rewrites them."""
    run = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=2", "checkpoint_every=1", f"out_dir={run}"]) == 0
    assert wrong_modes(run, mask) == []
    assert oma_main(["train", *FAST, "iterations=3", "checkpoint_every=1", f"out_dir={run}", "--resume"]) == 0
    assert {p.name for p in run.iterdir()} >= {".oma-run", "config.json", "summary.json", "metrics.jsonl",
                                                "samples.jsonl", "checkpoints"}
    assert wrong_modes(run, mask) == []


def test_the_warm_start_cache_follows_the_umask(tmp_path, mask):
    """#58 item 10: the cached warm start (safetensors writes its files 0600) follows the umask."""
    cfg = load_config(None, WARM_LM)
    policy_kind(cfg).warm_start(cfg, make_env(cfg), lambda: tmp_path / "warm-start")
    assert (tmp_path / "warm-start" / "done.json").is_file()
    assert wrong_modes(tmp_path / "warm-start", mask) == []


# ---- the warm-start cache ------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(count: int):
    """Flip ``count`` bytes spread over a safetensors file's tensor data (after its header), in place: the
    file keeps its size and still parses."""
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        start = 8 + int.from_bytes(data[:8], "little")
        for k in range(count):
            data[start + k * (len(data) - start) // count] ^= 0xFF
        path.write_bytes(bytes(data))
    return damage


def _without_checksums(cache: Path) -> None:
    record = json.loads((cache / "done.json").read_text())
    del record["sha256"]
    (cache / "done.json").write_text(json.dumps(record))


@pytest.mark.parametrize("damage, file", [
    (lambda cache: _truncate(cache / "model" / "model.safetensors"), "model/model.safetensors"),
    (lambda cache: _flip(1)(cache / "model" / "model.safetensors"), "model/model.safetensors"),
    (lambda cache: _flip(64)(cache / "model" / "model.safetensors"), "model/model.safetensors"),
    (lambda cache: (cache / "tokenizer" / "tokenizer.json").unlink(), "tokenizer/tokenizer.json"),
    (lambda cache: _truncate(cache / "done.json"), "done.json"),
    (_without_checksums, "done.json"),
], ids=["truncated", "one-byte-flipped", "64-bytes-flipped", "tokenizer-missing", "record-cut-short", "no-checksums"])
def test_a_damaged_warm_start_cache_entry_is_named_and_rebuilt(tmp_path, capsys, damage, file):
    """#58 item 4: a truncated model.safetensors (a SafetensorError), a flipped byte ("probability tensor contains
    inf/nan") or 64 flipped bytes (loaded silently and trained on) are found by the entry's SHA-256s; the entry
    is named in one warning line and rebuilt, and the run goes on from a good warm start."""
    cfg = load_config(None, WARM_LM)
    kind, new_env, cache = policy_kind(cfg), make_env(cfg), tmp_path / "warm-start"
    good, _, _ = kind.warm_start(cfg, new_env, lambda: cache)
    damage(cache)
    capsys.readouterr()
    model, _, info = kind.warm_start(cfg, new_env, lambda: cache)
    [warning] = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]  # transformers' save prints a bar
    assert warning.startswith(f"warning: the cached warm start {cache} is damaged") and file in warning
    assert info["cached"] is False
    for a, b in zip(good.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # rebuilt as it was first built
    again, _, info = kind.warm_start(cfg, new_env, lambda: cache)
    assert info["cached"] is True and "warning" not in capsys.readouterr().err
    for a, b in zip(good.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm-start"]  # the rebuild's temporary folder is gone


def test_a_full_disk_while_caching_the_warm_start_is_one_line_naming_the_cache(tmp_path, monkeypatch):
    """#58 item 7: a full disk while the warm start is cached (safetensors' own error) is an OSError naming the cache
    entry, which `oma train` reports in one line, and leaves no temporary folder."""
    from transformers import PreTrainedModel

    cfg = load_config(None, WARM_LM)
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", _safetensors_full_disk)  # it writes with safetensors
    with pytest.raises(OSError, match=f"the warm start's cache {tmp_path / 'warm-start'} could not be written: .*No space"):
        policy_kind(cfg).warm_start(cfg, make_env(cfg), lambda: tmp_path / "warm-start")
    assert list(tmp_path.iterdir()) == []


def test_a_run_whose_warm_start_cache_is_damaged_warns_in_one_line_and_trains(tmp_path):
    """#58 item 4: through `oma train`, the damaged entry is one warning line in the run's output and the run
    ends as it would have from a whole cache."""
    cmd = [sys.executable, "-m", "oma.cli", "train", *WARM_LM, "iterations=1", "env.eval_tasks=2", "env.tasks_per_iter=2",
           "env.group_size=2", "optim.num_minibatches=1", "tensorboard=false", f"warm_start.cache_dir={tmp_path / 'cache'}"]
    first = subprocess.run([*cmd, f"out_dir={tmp_path / 'a'}"], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    [entry] = (tmp_path / "cache" / "warmstart").iterdir()
    _flip(64)(entry / "model" / "model.safetensors")
    second = subprocess.run([*cmd, f"out_dir={tmp_path / 'b'}"], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "COLUMNS": "60"})  # a narrow terminal must not wrap the warning
    assert second.returncode == 0, second.stderr[-2000:]
    warnings = [ln for ln in (second.stdout + second.stderr).splitlines() if any(w in ln for w in ("warning", "damaged", "safetensors", "rebuilding"))]
    assert len(warnings) == 1 and str(entry) in warnings[0] and "model/model.safetensors" in warnings[0], warnings
    assert _metrics(tmp_path / "b" / "metrics.jsonl") == _metrics(tmp_path / "a" / "metrics.jsonl")


# ---- #69: hostile overrides, paths and folders ------------------------------------------------------------------


@pytest.mark.parametrize("override", ["env.group_size=[1", "env.group_size=\t1", "env.group_size=\x01",
                                      "env.group_size=!!python/object/apply:os.system [true]"])
@pytest.mark.parametrize("command", ["train", "compare"])
def test_69_an_override_that_is_not_yaml_is_one_line_naming_it(tmp_path, capsys, command, override):
    """#69: YAML errors inside command-line overrides (`'iterations=[1'`, a tab, a control character, a
    `!!python/object/apply` tag) were tracebacks in `oma train` and `oma compare`; they are one line naming the
    override, exit 2, and nothing is created."""
    out = tmp_path / "r"
    flag = f"out_dir={out}" if command == "train" else f"--out={out}"
    assert oma_main([command, *FAST, override, flag]) == 2
    err = _one_line_error(capsys)
    assert f"override {override!r}: the value is not valid YAML" in err
    assert list(tmp_path.iterdir()) == []


def test_69_a_path_override_is_taken_as_written_and_tilde_is_home(tmp_path, capsys, monkeypatch):
    """#69: `out_dir=od/hash #1` wrote to od/hash (YAML read `#1` as a comment) and `~` in out_dir made a literal
    ./~ folder, from a preset or the command line, while warm_start.cache_dir expanded it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert oma_main(["train", *FAST, "iterations=1", "out_dir=od/hash #1"]) == 0
    assert [p.name for p in (tmp_path / "od").iterdir()] == ["hash #1"]
    preset = tmp_path / "p.yaml"
    preset.write_text("out_dir: ~/runs/a\n")
    assert oma_main(["train", str(preset), *FAST, "iterations=1"]) == 0
    assert oma_main(["train", *FAST, "iterations=1", "out_dir=~/runs/b"]) == 0
    assert sorted(p.name for p in (tmp_path / "home" / "runs").iterdir()) == ["a", "b"]
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize("overrides, says", [
    (["out_dir=od/nl\nrun"], "out_dir='od/nl\\nrun' holds a control character"),
    (["out_dir="], "out_dir must not be empty"),
    (["samples_per_iter=-1"], "samples_per_iter must be >= 0, got -1"),
    (["policy.temperature=1e-300"], "policy.temperature must be >= 0.001, got 1e-300"),
])
def test_69_bad_settings_are_one_line_and_create_nothing(tmp_path, capsys, monkeypatch, overrides, says):
    """#69: a newline in out_dir wrote to `od/nl run`, samples_per_iter=-1 was accepted, and policy.temperature=1e-300
    passed "> 0" and underflowed to a NaN traceback. Each is one line, exit 2, nothing created."""
    monkeypatch.chdir(tmp_path)
    assert oma_main(["train", *FAST, "iterations=1", *overrides]) == 2
    assert says in _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_69_a_preset_with_a_key_that_is_no_name_is_one_line(tmp_path, capsys):
    """#69: a preset with a `null` key (`? null\\n: 2`) was an OmegaConf traceback."""
    preset = tmp_path / "p.yaml"
    preset.write_text("? null\n: 2\n")
    assert oma_main(["train", str(preset), f"out_dir={tmp_path / 'r'}"]) == 2
    assert f"config file {str(preset)!r}: " in _one_line_error(capsys)
    assert not (tmp_path / "r").exists()


def test_69_a_preset_read_from_a_pipe_is_a_preset(tmp_path):
    """#69: `oma train /dev/stdin` (stdin a pipe) said the file "does not exist"."""
    run = subprocess.run([sys.executable, "-m", "oma.cli", "train", "/dev/stdin", *FAST, f"out_dir={tmp_path / 'r'}"],
                         input=b"iterations: 1\n", capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    assert json.loads((tmp_path / "r" / "config.json").read_text())["iterations"] == 1


def _model_folder(tmp_path: Path, config: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    return folder


@pytest.mark.parametrize("case, says", [
    ("long", "File name too long"),
    ("dangling", "is a symbolic link to"),
    ("read-only", "Read-only file system"),
    ("bad-json", "cannot be loaded as a Hugging Face model"),
    ("big", "cannot be loaded as a Hugging Face model"),
    ("cache-file", "Not a directory"),
])
def test_69_a_path_that_cannot_be_used_is_bad_input(tmp_path, capsys, monkeypatch, case, says):
    """#69: a 300-character out_dir, a read-only file system, a dangling-symlink out_dir ("File exists"), a model
    folder with bad JSON and a cache dir that is a file were exit 1 (a failure while running) and some a traceback
    that left the run folder ("hidden_size": "big"); each is the user's input: one line, exit 2, no run folder."""
    out, extra = tmp_path / "r", []
    if case == "long":
        out = tmp_path / ("x" * 300)
    elif case == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    elif case == "read-only":
        def read_only(self, *args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system", str(self))

        monkeypatch.setattr(Path, "mkdir", read_only)
    elif case in ("bad-json", "big"):
        model = _model_folder(tmp_path, "{bad" if case == "bad-json" else '{"model_type": "qwen2", "hidden_size": "big"}')
        extra = [f"policy.model={model}", "env.eval_tasks=2", "env.tasks_per_iter=2", "env.group_size=2",
                 "optim.num_minibatches=1", "warm_start.episodes=2", f"warm_start.cache_dir={tmp_path / 'cache'}"]
    else:
        (tmp_path / "cache").write_text("a file")
        extra = [*WARM_LM, "env.eval_tasks=2", "env.tasks_per_iter=2", "env.group_size=2", "optim.num_minibatches=1",
                 f"warm_start.cache_dir={tmp_path / 'cache'}"]
    args = [*FAST, *extra] if case not in ("bad-json", "big", "cache-file") else ["tensorboard=false", *extra]
    assert oma_main(["train", *args, "iterations=1", f"out_dir={out}"]) == 2
    err = _one_line_error(capsys)
    assert says in err and "[Errno" not in err, err
    assert not os.path.exists(out)  # nothing made there (a dangling link stays as the user left it)


def test_69_ctrl_c_before_the_first_checkpoint_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """#69: Ctrl-C while the first checkpoint was written said "rerun with --resume", a resume then refused ("no
    usable checkpoint"), and the folder stayed claimed, so a fresh run went to out_dir-2. It says there is nothing
    to resume and removes the folder; the next run gets out_dir itself."""
    from oma.train import loop

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "r"
    with monkeypatch.context() as m:
        m.setattr(loop, "save_checkpoint", ctrl_c)
        assert oma_main(["train", *FAST, "iterations=2", f"out_dir={out}"]) == 130
    assert "interrupted before its first checkpoint; nothing to resume" in _one_line_error(capsys)
    assert not out.exists()
    assert oma_main(["train", *FAST, "iterations=1", f"out_dir={out}"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_69_resume_to_fewer_iterations_than_trained_is_refused(tmp_path, capsys):
    """#69: `iterations=12` then `iterations=4 --resume` was exit 0, progress "12/4", and config.json rewritten to 4
    while the metrics held 12 iterations. Refused in one line, the folder as it was."""
    out = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=4", f"out_dir={out}"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".oma-run"}
    assert oma_main(["train", *FAST, "iterations=2", f"out_dir={out}", "--resume"]) == 2
    assert "iterations=2 is below the 4 iterations" in _one_line_error(capsys)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".oma-run"} == before


def test_69_a_duplicated_metrics_line_does_not_survive_a_resume(tmp_path):
    """#69: a line of metrics.jsonl written twice (iteration 4 twice) survived --resume; each iteration is kept once."""
    out = tmp_path / "r"
    assert oma_main(["train", *FAST, "iterations=4", "checkpoint_every=2", f"out_dir={out}"]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([*lines, lines[-1]]) + "\n")
    assert oma_main(["train", *FAST, "iterations=5", "checkpoint_every=2", f"out_dir={out}", "--resume"]) == 0
    assert [r["iteration"] for r in _metrics(out / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("override, says", [
    ("env.tasks_per_iter=100000000000", "env.tasks_per_iter=100000000000 × env.group_size=3 × env.options.max_steps=4 "
     "steps need about 1.09 PB for one training batch (at least 1024 bytes a step); this machine has 8 GiB"),
    ("env.group_size=1000000000", "env.tasks_per_iter=2 × env.group_size=1000000000 × env.options.max_steps=4 steps "
     "need about 7.45 TB for one training batch"),
    ("env.options.max_steps=1000000000000", "env.options.max_steps=1000000000000 steps need about 5.46 PB for one "
     "training batch"),
])
def test_69_options_that_cannot_fit_in_memory_are_refused_with_the_estimate(tmp_path, capsys, monkeypatch, override,
                                                                           says):
    """#69 item 4: env.tasks_per_iter=10^11 grew until the OOM killer ended it, env.group_size=10^9 and
    env.options.max_steps=10^12 ran with no output. Options whose rows cannot fit in this machine's memory are one
    line with the estimate, exit 2, before any folder is made."""
    import oma.train.config

    monkeypatch.setattr(oma.train.config, "memory_bytes", lambda: 8 * 2**30)
    out = tmp_path / "r"
    assert oma_main(["train", *FAST, "env.options.max_steps=4", "iterations=1", override, f"out_dir={out}"]) == 2
    assert says in _one_line_error(capsys)
    assert not out.exists()


def test_69_every_preset_fits_a_small_machine():
    """#69 item 4: the size estimate refuses nothing a preset asks for, on a machine of 4 GiB."""
    import oma.envs
    from oma.train.config import check_sizes

    for preset in sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")):
        cfg = load_config(preset)
        cap = getattr(oma.envs.make(cfg.env.name, **cfg.env.options), "max_steps", None)
        check_sizes(cfg, cap, memory=4 * 2**30)
