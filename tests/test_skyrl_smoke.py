"""``oma skyrl-smoke`` without SkyRL (the main environment has none): the command is registered, refuses
with the fix, and reads SkyRL's metrics into its JSON line. The real run: tests/with_skyrl/test_skyrl_cpu.py."""

from __future__ import annotations

import builtins
import json
import math
import signal
import tempfile
from pathlib import Path

import pytest

from oma.cli import COMMANDS
from oma.cli import main as oma_main
from oma.integrations.skyrl import smoke


def test_the_command_is_registered_and_lazy(capsys):
    assert COMMANDS["skyrl-smoke"][0] == "oma.integrations.skyrl.smoke"
    assert oma_main(["--help"]) == 0
    assert "skyrl-smoke" in capsys.readouterr().out


def test_without_skyrl_it_says_where_to_run_it(monkeypatch, capsys):
    real = builtins.__import__

    def no_skyrl(name, *args, **kwargs):
        if name.split(".")[0] in ("skyrl", "skyrl_gym"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_skyrl)
    assert oma_main(["skyrl-smoke", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".venv-skyrl/bin/oma" in err[0] and "pip install 'oma-rl[skyrl]'" in err[0]


def test_bad_arguments_are_refused(capsys):
    assert oma_main(["skyrl-smoke", "--steps", "0"]) == 2
    assert "--steps must be ≥ 1" in capsys.readouterr().err


def _step(i: int, **extra) -> dict:
    return {"step": i, "probe/trajectories": 16.0, "probe/effective_trajectories": 16.0, "policy/policy_loss": 0.5 * i,
            "policy/grad_norm": 1.0, "timing/step": 2.0 + i, "environment/turns": 2.5,
            "cpu/rollout_weight_version": float(i), **extra}


def test_summary_averages_the_steps_and_checks_them():
    log = "(cpu_entrypoint pid=1) oma: SkyRL integration active in CPUOMARayPPOTrainer: ..."
    out = smoke.summarise([_step(1), _step(2)], log)
    assert out["steps"] == 2 and out["oma_active"] and out["finite"] and out["weights_synced"]
    assert out["pg_loss"] == pytest.approx(0.75) and out["step_time_s"] == pytest.approx(3.5)
    assert out["trajectories"] == out["effective_trajectories"] == 16.0 and out["turns"] == 2.5
    assert not smoke.summarise([_step(1), _step(2, **{"policy/grad_norm": math.nan})], log)["finite"]
    stale = smoke.summarise([_step(1), _step(2, **{"cpu/rollout_weight_version": 1.0})], log)
    assert not stale["weights_synced"]
    assert not smoke.summarise([], "")["finite"]


def test_problems_are_named_in_one_line():
    ok = {**smoke.summarise([_step(1), _step(2)], smoke.ACTIVE_LINE), "exit_code": 0, "timeout_s": 9,
          "processes_left": 0, "log": "x/train.log"}
    assert smoke.problem(ok, 2) is None
    assert "2 of 3 steps" in smoke.problem(ok, 3)
    assert "--timeout 9" in smoke.problem({**ok, "exit_code": 124}, 2)
    assert "status 1" in smoke.problem({**ok, "exit_code": 1}, 2)
    assert "did not announce" in smoke.problem({**ok, "oma_active": False}, 2)
    assert "not finite" in smoke.problem({**ok, "finite": False}, 2)
    assert "could not be ended" in smoke.problem({**ok, "processes_left": 2}, 2)


def test_the_run_is_step_wise_multi_turn_with_oma_on(tmp_path):
    lines = smoke.overrides(Path(tmp_path), steps=2, mass="uniform", accounting="trajectory")
    for line in ("generator.step_wise_trajectories=true", "trainer.algorithm.oma.mass=uniform",
                 "trainer.max_training_steps=2", "environment.env_class=oma_smoke", "trainer.placement.colocate_all=false"):
        assert line in lines
    turns = int(next(x for x in lines if x.startswith("generator.max_turns=")).split("=")[1])
    assert turns > 1
    env = smoke.environment()
    assert '"GPU": 1' in env["RAY_OVERRIDE_RESOURCES"] and env["HF_HUB_OFFLINE"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(Path(smoke.__file__).resolve().parents[3])


def test_session_members_finds_this_session():
    import os

    from oma.integrations.smoke_run import session_members

    assert os.getpid() in session_members(os.getsid(0))


@pytest.mark.parametrize("out, fails, kept", [(False, False, False), (False, True, True), (True, False, True)],
                         ids=["temporary-ok", "temporary-failed", "out"])
def test_the_temporary_work_folder_is_removed_after_a_run_that_succeeds(tmp_path, monkeypatch, capsys, out, fails, kept):
    """#58 item 12: the default work folder (model, data, train.log) was left in the temporary directory after every
    run; it is removed unless the run failed (its log, named in the JSON line, explains the failure) or --out gave it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the default folder
    monkeypatch.setattr(smoke, "check_install", lambda: None)
    monkeypatch.setattr(smoke, "build_inputs", lambda work: None)

    def fake_skyrl(cmd, env, log, timeout, cwd):  # SkyRL's metrics and log, as test_summary_averages_the_steps reads them
        Path(cmd[cmd.index("--metrics") + 1]).write_text(json.dumps(_step(1)) + "\n")
        log.write_text(smoke.ACTIVE_LINE + "CPUOMARayPPOTrainer\n")
        return (1 if fails else 0), 0

    monkeypatch.setattr(smoke, "run_in_session", fake_skyrl)
    argv = ["skyrl-smoke", "--steps", "1", *(["--out", str(tmp_path / "mine")] if out else [])]
    assert oma_main(argv) == (1 if fails else 0)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == int(kept)
    assert result["log"] == (str(folders[0] / "train.log") if kept else None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["TERM", "INT", "KILL"])
def test_the_run_and_its_processes_die_with_the_smoke_command(tmp_path, sig):
    """#69 item 3: `oma skyrl-smoke` killed (SIGTERM, SIGKILL) left its run, Ray's processes and its temporary work
    folder behind; Ctrl-C was a traceback. Now nothing of the run is alive after it, the folder is gone, and
    Ctrl-C is one line with exit status 130."""
    from smoke_guard import stop_smoke

    status, err, alive, tmp = stop_smoke(tmp_path, "skyrl-smoke", "oma.integrations.skyrl.smoke",
                                         "oma.integrations.skyrl.smoke", sig)
    assert alive == [] and list(tmp.iterdir()) == []
    if sig == signal.SIGINT:
        assert status == 130 and err == "oma skyrl-smoke: interrupted; the run and every process it started were ended\n"
    else:
        assert status == -sig
