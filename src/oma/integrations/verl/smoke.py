"""``oma verl-smoke``: real verl 0.9.1 training steps with oma's trainer, on CPU (docs/verl.md#verl-on-cpu).

Builds a tiny Qwen2 from config, a byte-level tokenizer and prompts
(:mod:`oma.integrations.verl.smoke_inputs`), runs ``python -m verl.trainer.main_ppo`` with oma's
``oma_sync`` trainer, the multi-turn agent loop of :mod:`oma.integrations.verl.smoke_agent`
(failures take more turns than successes) and the CPU platform and ``hf`` rollout of
:mod:`oma.integrations.verl.cpu`, then reads verl's console log and ends with one JSON line::

    {"steps": 2, "dp": 1, "oma_active": true, "trajectories": ..., "effective_trajectories": ...,
     "pg_loss": ..., "grad_norm": ..., "step_time_s": ..., "staleness": 0.0, ...}

Metrics are means over the steps. ``staleness`` is verl's ``training/off_policy/trajectory_staleness/mean``:
0 means every row was generated with the weights of the step before, so the rollout received
every update.

With ``--dump-dir DIR`` oma's trainer writes each step's batch to ``DIR/batches/`` (``algorithm.oma.dump_dir``),
which ``oma audit DIR --all`` reads.

Exit status 0 when every step ran, oma's trainer announced itself and every logged loss is finite;
1 otherwise (the log's path is in the JSON line); 2 for bad arguments, a missing install or another verl.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from oma.integrations.smoke_run import SmokeError, interrupted, refused, run_in_session, work_folder

MINI_BATCH_PROMPTS = 2
"""Prompts per PPO mini-batch: with 4 prompts per step a step has 2 mini-batches (4 rollouts each)."""

ACTIVE_LINE = "oma: verl integration active"

METRICS: dict[str, str] = {
    "trajectories": "oma/trajectories",
    "effective_trajectories": "oma/effective_trajectories",
    "optimizer_steps": "oma/optimizer_steps",
    "rows_per_trajectory": "oma/rows_per_trajectory/mean",
    "pg_loss": "actor/pg_loss",
    "grad_norm": "actor/grad_norm",
    "entropy": "actor/entropy",
    "reward": "critic/score/mean",
    "step_time_s": "timing_s/step",
    "staleness": "training/off_policy/trajectory_staleness/mean",
}
"""JSON key → verl metric, averaged over the steps."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oma verl-smoke", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2, help="verl training steps (default 2)")
    p.add_argument("--dp", type=int, default=1, choices=(1, 2), help="data-parallel workers (default 1)")
    p.add_argument("--accounting", choices=("row", "trajectory"), default="trajectory")
    p.add_argument("--mass", choices=("native", "uniform", "group"), default="uniform")
    p.add_argument("--estimator", choices=("oma_grpo", "oma_rloo", "oma_gigpo"), default="oma_grpo")
    p.add_argument(
        "--trainer",
        choices=("oma", "verl"),
        default="oma",
        help="oma: oma's oma_sync trainer (default); verl: verl's own sync trainer with grpo and token-mean, "
        "the native baseline (timing comparisons)",
    )
    p.add_argument("--out", default=None, help="work folder (model, data, train.log), kept; default: a temporary one, "
                   "removed after the run unless it fails")
    p.add_argument("--dump-dir", default=None, metavar="DIR",
                   help="write each step's batch to DIR/batches/ (algorithm.oma.dump_dir) for `oma audit DIR --all`")
    p.add_argument("--timeout", type=int, default=900, help="seconds before the run is stopped (default 900)")
    return p


def check_install() -> None:
    """Refuse early, with the fix, when verl's trainer stack is missing or verl is not 0.9.x."""
    from oma.hosts import HostConfigError
    from oma.integrations.verl import _verl_private

    missing = []
    for module in ("verl", "ray", "transfer_queue", "zmq", "msgspec", "fastapi", "uvicorn"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SmokeError(f"needs verl's trainer stack (missing: {', '.join(missing)}): pip install 'oma-rl[verl]'")
    try:
        _verl_private.check_version()
    except HostConfigError as err:
        raise SmokeError(str(err)) from None


def overrides(work: Path, steps: int, dp: int, accounting: str, mass: str, estimator: str,
              trainer: str = "oma", dump_dir: str | None = None) -> list[str]:
    """The verl config of the smoke run (Hydra overrides of verl's ``ppo_trainer``)."""
    from oma.integrations.verl import cpu

    rollouts = 4
    if trainer == "oma":
        algorithm = [f"algorithm.adv_estimator={estimator}", f"+algorithm.oma.accounting={accounting}",
                     f"+algorithm.oma.mass={mass}", "+algorithm.oma.reducer=token-mean",
                     "actor_rollout_ref.actor.loss_agg_mode=token-sum", "trainer.v1.trainer_mode=oma_sync"]
        if dump_dir is not None:
            algorithm.append(f"+algorithm.oma.dump_dir='{Path(dump_dir).resolve()}'")
    else:  # verl's own: the baseline oma's trainer is timed against
        algorithm = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
                     "trainer.v1.trainer_mode=sync"]
    return [
        *algorithm,
        f"data.train_files={work / 'data' / 'train.parquet'}",
        f"data.val_files={work / 'data' / 'val.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={work / 'model'}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH_PROMPTS}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.shuffle=false",
        f"actor_rollout_ref.rollout.n={rollouts}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.agent.default_agent_loop=oma_smoke_multistep",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={work / 'agent_loops.yaml'}",
        "reward.num_workers=1",
        "trainer.use_v1=true",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={steps}",
        "trainer.project_name=oma_smoke",
        "trainer.experiment_name=verl_oma_smoke",
        f"trainer.default_local_dir={work / 'ckpt'}",
        f"hydra.run.dir={work / 'hydra'}",  # Hydra's own log folder: not outputs/ in the caller's directory
        *cpu.overrides(dp),
        *(f"++ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in cpu.environment().items()),
    ]


_NUM = r"(?:np\.\w+\()?([-+0-9.eEnaif]+)"  # verl's console logger prints numpy scalars as np.float64(...)


def parse_log(text: str) -> dict[str, Any]:
    """Per-step metrics of verl's console logger (``step:N - key:value - ...`` lines), averaged."""
    steps: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        m = re.search(r"\bstep:(\d+)\s+-\s+", line)
        if not m:
            continue
        values = steps.setdefault(int(m.group(1)), {})
        for key, value in re.findall(r"([\w/@.\-]+):" + _NUM + r"\)?(?:\s+-|\s*$)", line):
            try:
                values[key] = float(value)
            except ValueError:
                continue
    out: dict[str, Any] = {"steps": len(steps), "oma_active": ACTIVE_LINE in text}
    for name, metric in METRICS.items():
        seen = [v[metric] for v in steps.values() if metric in v]
        out[name] = sum(seen) / len(seen) if seen else None
    out["step_times_s"] = [round(v["timing_s/step"], 2) for _, v in sorted(steps.items()) if "timing_s/step" in v]
    out["finite"] = all(
        math.isfinite(v[m]) for v in steps.values() for m in ("actor/pg_loss", "actor/grad_norm") if m in v
    )
    return out


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    with work_folder(args.out, "oma-verl-smoke-") as folder:
        status, result = run_in(folder.path, args)
        folder.settle(status == 0, result)
        return status, result


def run_in(work: Path, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """The run in folder ``work``: (exit status, the JSON line's fields)."""
    from oma.integrations.verl import cpu
    from oma.integrations.verl.smoke_inputs import build_inputs

    build_inputs(work)
    (work / "agent_loops.yaml").write_text(
        "- name: oma_smoke_multistep\n  _target_: oma.integrations.verl.smoke_agent.MultiStepSmokeAgentLoop\n"
    )
    env = {**os.environ, **cpu.environment(), "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0"}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo",
           *overrides(work, args.steps, args.dp, args.accounting, args.mass, args.estimator, args.trainer, args.dump_dir)]
    log = work / "train.log"
    t0 = time.perf_counter()
    rc, _ = run_in_session(cmd, env, log, args.timeout)
    wall = time.perf_counter() - t0
    result = {**parse_log(log.read_text(errors="replace")), "dp": args.dp, "trainer": args.trainer,
              "accounting": args.accounting, "mass": args.mass, "estimator": args.estimator, "exit_code": rc,
              "wall_time_s": round(wall, 1), "log": str(log)}
    ok = rc == 0 and result["steps"] >= args.steps and result["finite"]
    ok = ok and (result["oma_active"] or args.trainer == "verl")
    return (0 if ok else 1), result


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)

    def checks() -> None:
        if args.dump_dir is not None and args.trainer != "oma":
            raise SmokeError("--dump-dir writes what oma's trainer trains (algorithm.oma.dump_dir): use it with --trainer oma")
        check_install()

    status = refused("oma verl-smoke", args.steps, args.timeout, checks)
    if status is not None:
        return status
    try:
        status, result = run(args)
    except KeyboardInterrupt:
        return interrupted("oma verl-smoke")
    print(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
