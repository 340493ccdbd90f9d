"""``oma skyrl-smoke``: real SkyRL 0.4.0 training steps with oma's trainer, on CPU (docs/skyrl.md#skyrl-on-cpu).

Builds a tiny Qwen2 from config and a byte-level tokenizer (:mod:`oma.integrations.tiny_model`) and
a prompt parquet, then runs ``python -m oma.integrations.skyrl.cpu``: SkyRL's step-wise trainer with
oma's ``OMARayPPOTrainer`` (``mass: uniform``), SkyRL's FSDP policy worker on the CPU, a Hugging
Face engine in place of vLLM and the multi-turn environment of :mod:`oma.integrations.skyrl.smoke_env`
(failures take more turns than successes). It reads the metrics SkyRL logged and ends with one JSON
line::

    {"steps": 2, "oma_active": true, "trajectories": ..., "effective_trajectories": ..., "pg_loss": ...,
     "grad_norm": ..., "turns": ..., "success_turns": ..., "failure_turns": ..., "step_time_s": ...,
     "weights_synced": true, "processes_left": 0, ...}

Metrics are means over the steps. ``trajectories`` and ``effective_trajectories`` are measured on
what the trainer does (:class:`oma.integrations.skyrl.cpu.MassProbeMixin`): under ``mass: uniform``
every trajectory weighs the same, so the two are equal. ``weights_synced`` is true when step s
generated with the weights of update s (the engine received every update).

Exit status 0 when every step ran, oma's trainer announced itself, every logged loss is finite and
no process of the run is left; 1 otherwise, with one line on stderr naming the problem (the log's
path is in the JSON line); 2, with one line, for bad arguments or a missing install.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from oma.integrations.smoke_run import SmokeError, interrupted, refused, run_in_session, work_folder

ACTIVE_LINE = "oma: SkyRL integration active in "
PROMPTS = 4
"""Prompts per step; each is sampled :data:`SAMPLES` times (the GRPO group)."""
SAMPLES = 4
MINI_BATCH_PROMPTS = 2
"""Prompts per PPO mini-batch: two optimizer steps per training step."""

METRICS: dict[str, str] = {
    "trajectories": "probe/trajectories",
    "effective_trajectories": "probe/effective_trajectories",
    "pg_loss": "policy/policy_loss",
    "grad_norm": "policy/grad_norm",
    "reward": "reward/avg_raw_reward",
    "turns": "environment/turns",
    "success_turns": "environment/success_turns",
    "failure_turns": "environment/failure_turns",
    "step_time_s": "timing/step",
    "rollout_weight_version": "cpu/rollout_weight_version",
}
"""JSON key → SkyRL metric, averaged over the steps."""
FINITE = ("pg_loss", "grad_norm", "trajectories", "effective_trajectories", "step_time_s")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oma skyrl-smoke", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2, help="SkyRL training steps (default 2)")
    p.add_argument("--mass", choices=("native", "uniform", "group"), default="uniform")
    p.add_argument("--accounting", choices=("trajectory", "row"), default="trajectory")
    p.add_argument("--out", default=None, help="work folder (model, data, train.log, metrics.jsonl), kept; default: a "
                   "temporary one, removed after the run unless it fails")
    p.add_argument("--timeout", type=int, default=600, help="seconds before the run is stopped (default 600)")
    return p


def check_install() -> None:
    """Refuse early, with the fix, when SkyRL's trainer stack is missing (the main .venv has none)."""
    missing = []
    for module in ("skyrl", "skyrl_gym", "ray", "loguru", "jaxtyping", "cloudpickle"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SmokeError(f"needs SkyRL (missing: {', '.join(missing)}): run it from the SkyRL environment "
                         "(.venv-skyrl/bin/oma, built by `make install`) or pip install 'oma-rl[skyrl]' (Python >= 3.12)")


def build_inputs(work: Path) -> None:
    """``work/model`` (tiny Qwen2, byte tokenizer) and ``work/data/train.parquet`` (prompts of ``oma_smoke``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from oma.integrations.tiny_model import build

    build(work / "model")
    records = [{"prompt": [{"role": "user", "content": f"Task {i}: answer with digits, one step at a time."}],
                "env_class": "oma_smoke"} for i in range(64)]
    (work / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), work / "data" / "train.parquet")


def overrides(work: Path, steps: int, mass: str, accounting: str) -> list[str]:
    """The SkyRL config of the smoke run (``key.path=value``)."""
    return [
        f"data.train_data=['{work / 'data' / 'train.parquet'}']",
        "data.val_data=[]",
        "data.dataloader.num_workers=0",
        f"trainer.policy.model.path={work / 'model'}",
        "trainer.strategy=fsdp",
        "trainer.placement.colocate_all=false",
        "trainer.placement.colocate_policy_ref=false",
        "trainer.placement.policy_num_gpus_per_node=1",
        f"trainer.algorithm.oma.mass={mass}",
        f"trainer.algorithm.oma.accounting={accounting}",
        "trainer.algorithm.advantage_estimator=grpo",
        "trainer.algorithm.loss_reduction=token_mean",
        "trainer.algorithm.use_kl_loss=false",
        "trainer.policy.optimizer_config.lr=1e-4",
        "trainer.policy.optimizer_config.num_warmup_steps=0",
        f"trainer.train_batch_size={PROMPTS}",
        f"trainer.policy_mini_batch_size={MINI_BATCH_PROMPTS}",
        "trainer.micro_train_batch_size_per_gpu=4",
        "trainer.micro_forward_batch_size_per_gpu=8",
        "trainer.epochs=1",
        f"trainer.max_training_steps={steps}",
        "trainer.eval_interval=-1",
        "trainer.eval_before_train=false",
        "trainer.ckpt_interval=-1",
        "trainer.hf_save_interval=-1",
        "trainer.resume_mode=none",
        "trainer.logger=console",
        "trainer.max_prompt_length=256",
        "trainer.flash_attn=false",
        "trainer.remove_microbatch_padding=false",
        "trainer.gradient_checkpointing=false",
        "trainer.enable_ray_gpu_monitor=false",
        "trainer.seed=0",
        f"trainer.log_path={work / 'logs'}",
        f"trainer.ckpt_path={work / 'ckpt'}",
        f"trainer.export_path={work / 'export'}",
        "generator.step_wise_trajectories=true",
        "generator.max_turns=4",
        f"generator.n_samples_per_prompt={SAMPLES}",
        "generator.max_input_length=512",
        "generator.sampling_params.max_generate_length=8",
        "generator.sampling_params.temperature=1.0",
        "generator.inference_engine.enable_ray_prometheus_stats=false",
        "environment.env_class=oma_smoke",
        "environment.skyrl_gym.max_env_workers=0",
    ]


def environment() -> dict[str, str]:
    """The smoke run's environment: this oma first on the path (the run imports the caller's oma), Ray's
    resources declared (one GPU slot, held by the policy worker; logical CPUs for SkyRL's and oma's
    actors), one thread each, nothing on the network."""
    import oma

    here = str(Path(oma.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": os.pathsep.join([here, *([path] if path else [])]),
        "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 8, "GPU": 1}),
        "RAY_DEDUP_LOGS": "0",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    }


def read_metrics(path: Path) -> list[dict[str, float]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(steps: list[dict[str, float]], log_text: str) -> dict[str, Any]:
    """Means over the steps of :data:`METRICS`, and the checks."""
    out: dict[str, Any] = {"steps": len(steps), "oma_active": ACTIVE_LINE in log_text}
    for name, metric in METRICS.items():
        seen = [s[metric] for s in steps if metric in s]
        out[name] = sum(seen) / len(seen) if seen else None
    out["step_times_s"] = [round(s["timing/step"], 2) for s in steps if "timing/step" in s]
    out["finite"] = bool(steps) and all(
        isinstance(out[k], float) and math.isfinite(out[k]) for k in FINITE
    ) and all(math.isfinite(s[m]) for s in steps for m in ("policy/policy_loss", "policy/grad_norm") if m in s)
    versions = [s.get("cpu/rollout_weight_version") for s in steps]
    out["weights_synced"] = bool(steps) and versions == [float(i + 1) for i in range(len(steps))]
    return out


def problem(result: dict[str, Any], wanted_steps: int) -> str | None:
    """One line naming what went wrong, or None."""
    if result["exit_code"] == 124:
        return f"the run was stopped after --timeout {result['timeout_s']} s"
    if result["exit_code"] != 0:
        return f"the SkyRL run exited with status {result['exit_code']} (see {result['log']})"
    if result["steps"] < wanted_steps:
        return f"{result['steps']} of {wanted_steps} steps logged (see {result['log']})"
    if not result["oma_active"]:
        return f"oma's trainer did not announce itself ({ACTIVE_LINE!r} not in {result['log']})"
    if not result["finite"]:
        return "a logged loss, gradient norm or trajectory count is missing or not finite"
    if result["processes_left"]:
        return f"{result['processes_left']} processes of the run could not be ended"
    return None


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The run in folder ``work``: the JSON line's fields."""
    build_inputs(work)
    metrics = work / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "oma.integrations.skyrl.cpu", "--metrics", str(metrics),
           "--env", "oma.integrations.skyrl.smoke_env", *overrides(work, args.steps, args.mass, args.accounting)]
    log = work / "train.log"
    t0 = time.perf_counter()
    rc, left = run_in_session(cmd, {**os.environ, **environment()}, log, args.timeout, cwd=work)
    result = {**summarise(read_metrics(metrics), log.read_text(errors="replace")), "mass": args.mass,
              "accounting": args.accounting, "exit_code": rc, "timeout_s": args.timeout,
              "wall_time_s": round(time.perf_counter() - t0, 1), "processes_left": left, "log": str(log)}
    return result


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    status = refused("oma skyrl-smoke", args.steps, args.timeout, check_install)
    if status is not None:
        return status
    try:
        with work_folder(args.out, "oma-skyrl-smoke-") as folder:
            result = run(folder.path, args)
            trouble = problem(result, args.steps)
            folder.settle(trouble is None, result)
    except KeyboardInterrupt:
        return interrupted("oma skyrl-smoke")
    print(json.dumps(result))
    if trouble:
        print(f"oma skyrl-smoke: {trouble}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
