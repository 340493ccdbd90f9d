#!/usr/bin/env bash
# GPU smoke check: oma's verl plugin and trainer (`oma_sync`) in a real verl 0.9.1 run — tiny Qwen2
# built from config (random weights), byte-level tokenizer, a 2–4-step agent loop, 3 training steps.
#
# STATUS: PREPARED, NOT RUN ON A GPU. No GPU machine was lent to the tasks that wrote it, and the
# accelerator image this workplace lends has no verl, Ray or vLLM (their wheels exceed the 64 MiB
# carry limit). Run it on a CUDA machine with `oma-rl[verl]` and vLLM (or verl's docker image).
# Nothing is downloaded. The same inputs, agent loop and trainer run on CPU with the `hf` rollout in
# `oma verl-smoke` (docs/verl.md#verl-on-cpu), which the test suite runs at dp = 1 and 2.
#
# Usage, from the repository root:
#   bash tests/gpu/verl_oma_smoke.sh [WORKDIR]            # full run, ~5–8 min on one GPU
#   SMOKE_DRY_RUN=1 bash tests/gpu/verl_oma_smoke.sh      # CPU: inputs + config checks only
# Environment: PYTHON (default python3), SMOKE_TIMEOUT (s, default 1200), SMOKE_STEPS (default 3).
#
# Passes (exit 0) when: the `verl.plugins` entry point loads and `python -m oma.integrations.verl
# --trainer` reports every name registered; the composed config passes oma's and verl's checks; the
# run ends; its log holds "oma: verl integration active", an oma/optimizer_steps metric for every step,
# more than one mini-batch in some step (step-wide Mass Alignment over several), and only finite
# actor/pg_loss values. Log: WORKDIR/train.log.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="${1:-/tmp/oma_verl_smoke}"
PY="${PYTHON:-python3}"
STEPS="${SMOKE_STEPS:-3}"
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 VERL_USE_EXTERNAL_PLUGINS=auto

fail() { echo "SMOKE FAIL: $*" >&2; exit 1; }

echo "== prerequisites"
"$PY" -c "import verl, ray, transfer_queue; assert verl.__version__ == '0.9.1', verl.__version__" \
  || fail "needs verl==0.9.1 with its verl-core extras (TransferQueue, ...) in $PY"
if [ -z "${SMOKE_DRY_RUN:-}" ]; then
  "$PY" -c "import vllm" || fail "needs vLLM (verl's rollout engine)"
  nvidia-smi -L || fail "no NVIDIA GPU visible"
fi

echo "== oma's entry point"
if ! "$PY" -c "import sys; from importlib.metadata import entry_points as e; sys.exit(0 if any(p.name == 'oma' for p in e(group='verl.plugins')) else 1)"; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" || fail "could not install oma (pip install -e .)"
fi
"$PY" -m oma.integrations.verl --trainer || fail "oma's names are not all registered in verl (see the report above)"

echo "== inputs (tiny model from config, tokenizer, data) in $WORK"
"$PY" -m oma.integrations.verl.smoke_inputs "$WORK"
cat > "$WORK/agent_loops.yaml" <<YAML
- name: oma_smoke_multistep
  _target_: oma.integrations.verl.smoke_agent.MultiStepSmokeAgentLoop
YAML

OVERRIDES=(
  algorithm.adv_estimator=oma_grpo
  +algorithm.oma.accounting=trajectory
  +algorithm.oma.mass=uniform
  +algorithm.oma.reducer=token-mean
  data.train_files="$WORK/data/train.parquet"
  data.val_files="$WORK/data/val.parquet"
  data.train_batch_size=4
  data.max_prompt_length=256
  data.max_response_length=32
  data.dataloader_num_workers=0
  actor_rollout_ref.model.path="$WORK/model"
  actor_rollout_ref.actor.optim.lr=1e-5
  actor_rollout_ref.actor.ppo_mini_batch_size=2
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
  actor_rollout_ref.actor.loss_agg_mode=token-sum
  actor_rollout_ref.actor.use_kl_loss=false
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.shuffle=false
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=4
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.3
  actor_rollout_ref.rollout.enforce_eager=true
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.agent.num_workers=1
  actor_rollout_ref.rollout.agent.default_agent_loop=oma_smoke_multistep
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$WORK/agent_loops.yaml"
  reward.num_workers=1
  trainer.use_v1=true
  trainer.v1.trainer_mode=oma_sync
  trainer.n_gpus_per_node=1
  trainer.nnodes=1
  "trainer.logger=[console]"
  trainer.val_before_train=false
  trainer.test_freq=-1
  trainer.save_freq=-1
  trainer.total_epochs=1
  trainer.total_training_steps="$STEPS"
  trainer.project_name=oma_smoke
  trainer.experiment_name=verl_oma_smoke
  trainer.default_local_dir="$WORK/ckpt"
)

echo "== config: compose + oma's and verl's checks"
"$PY" - "${OVERRIDES[@]}" <<'PYCHECK' || fail "config rejected"
import sys
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from oma.integrations.verl.batch import check_trainer_config
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

with initialize_config_module(config_module="verl.trainer.config", version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=sys.argv[1:])
OmegaConf.resolve(cfg)
print("oma options:", check_trainer_config(cfg))
validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
import oma.integrations.verl.smoke_agent  # noqa: F401  (the agent loop imports against this verl)
PYCHECK

if [ -n "${SMOKE_DRY_RUN:-}" ]; then
  echo "SMOKE DRY RUN OK (no training run)"
  exit 0
fi

echo "== training ($STEPS steps)"
set +e
timeout "${SMOKE_TIMEOUT:-1200}" "$PY" -m verl.trainer.main_ppo "${OVERRIDES[@]}" 2>&1 | tee "$WORK/train.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || fail "verl exited with $rc (log: $WORK/train.log)"

echo "== checks on $WORK/train.log"
grep -q "oma: verl integration active" "$WORK/train.log" || fail "start-up line missing: oma's trainer did not run"
"$PY" - "$WORK/train.log" "$STEPS" <<'PYLOG' || fail "log checks failed"
import math, re, sys
text = open(sys.argv[1], errors="replace").read()
steps = int(sys.argv[2])
num = r"(?:np\.\w+\()?([-+0-9.eEnaif]+)"  # verl's console logger pformats numpy scalars as np.float64(...)
optimizer_steps = [float(x) for x in re.findall(r"oma/optimizer_steps:" + num, text)]
losses = re.findall(r"actor/pg_loss:" + num, text)
print("oma/optimizer_steps per step:", optimizer_steps)
print("actor/pg_loss:", losses)
assert len(optimizer_steps) >= steps, "an oma/optimizer_steps metric per step"
assert max(optimizer_steps) > 1, "some step had several PPO mini-batches (step-wide weights exercised)"
assert losses and all(math.isfinite(float(x)) for x in losses), "finite policy losses"
PYLOG
echo "SMOKE OK"
