#!/bin/bash
# One CPU run of verl-agent's patched RayPPOTrainer.fit (README.md beside this file).
# Usage: run.sh LOG ACCOUNTING MASS ESTIMATOR [extra Hydra overrides]; VA_REAL: the patched verl-agent checkout,
# VA_VENV: its venv (with the shim's .pth), VA_WORK: model and data from prep.py and sft.py.
LOG=$1; ACC=$2; MASS=$3; EST=${4:-grpo}; shift 4
VA_REAL=${VA_REAL:-/tmp/va-real}; VA_VENV=${VA_VENV:-/tmp/va-venv}; VA_WORK=${VA_WORK:-/tmp/va-work}
export VA_CPU_SHIM=1 PYTHONPATH=$VA_REAL PYTHONUNBUFFERED=1 RAY_DEDUP_LOGS=0 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 HYDRA_FULL_ERROR=1
export RAY_USAGE_STATS_ENABLED=0 WANDB_MODE=disabled
cd $VA_REAL
timeout ${TIMEOUT:-1500} $VA_VENV/bin/python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=$EST \
    +algorithm.oma.accounting=$ACC \
    +algorithm.oma.mass=$MASS \
    data.train_files=$VA_WORK/data/train.parquet \
    data.val_files=$VA_WORK/data/test.parquet \
    data.train_batch_size=4 \
    data.val_batch_size=2 \
    data.max_prompt_length=2048 \
    data.max_response_length=48 \
    data.filter_overlong_prompts=False \
    data.truncation=left \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=$VA_WORK/model \
    actor_rollout_ref.model.use_remove_padding=False \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    +actor_rollout_ref.model.override_config._attn_implementation=eager \
    actor_rollout_ref.actor.optim.lr=1e-4 \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.ref.strategy=fsdp2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=10 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.actor.use_invalid_action_penalty=True \
    actor_rollout_ref.actor.invalid_action_penalty_coef=0.1 \
    actor_rollout_ref.rollout.name=hf \
    actor_rollout_ref.rollout.n=1 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=10 \
    actor_rollout_ref.rollout.free_cache_engine=False \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
    algorithm.use_kl_in_reward=False \
    env.env_name=Sokoban \
    env.seed=0 \
    env.max_steps=3 \
    env.history_length=0 \
    env.rollout.n=4 \
    env.sokoban.mode=tiny_rgb_array \
    env.resources_per_worker.num_cpus=0.1 \
    trainer.logger=['console'] \
    trainer.project_name=oma_va_cpu \
    trainer.experiment_name=realstep \
    trainer.default_local_dir=$VA_WORK/ckpt \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.device=cuda \
    trainer.save_freq=-1 \
    trainer.test_freq=-1 \
    trainer.val_before_train=False \
    trainer.total_epochs=1 \
    trainer.total_training_steps=2 \
    ray_init.num_cpus=8 \
    +ray_init.num_gpus=1 \
    +ray_init._node_ip_address=127.0.0.1 \
    +ray_init.include_dashboard=False \
    hydra.run.dir=$VA_WORK/hydra \
    "$@" > $LOG 2>&1
echo "rc=$?" >> $LOG
