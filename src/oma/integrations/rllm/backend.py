"""rLLM's ``VerlBackend`` with Mass Alignment: what a run switches on (docs/rllm.md#quick-start).

rLLM's estimator registry (``register_rllm_adv_estimator``) hands an estimator one reward per trajectory,
so a registered estimator cannot reach the rows merging made; the rows' mass is set here, after rLLM's own
``VerlBackend.compute_advantages``. rLLM and verl are imported when :func:`backend_class` is called, never at
``import oma``.
"""

from __future__ import annotations

from typing import Any

from oma import hosts
from oma.integrations.rllm.batch import PREFIX, ActorLoss, RllmConfigError, align_batch, read_options

VERL_SERIES, VERL_TESTED = "0.8", "0.8.0"
"""The verl rLLM's ``verl`` extra pins (rLLM commit 9beb6e0f)."""


def _get(node: Any, dotted: str, default: Any = None) -> Any:
    for key in dotted.split("."):
        if node is None:
            return default
        node = node.get(key, None) if hasattr(node, "get") else getattr(node, key, None)
    return default if node is None else node


def check_config(config: Any) -> tuple[hosts.HostOptions, ActorLoss]:
    """Refuse at start-up, one line naming the key, what oma cannot make exact; the options and the actor's
    aggregation otherwise (its mini-batch sizes come from each batch's ``meta_info``)."""
    hosts.require_version("verl", VERL_SERIES, VERL_TESTED)
    actor_cfg = _get(config, "actor_rollout_ref.actor")
    agg = _get(config, "rllm.algorithm.loss_agg_mode") or _get(actor_cfg, "loss_agg_mode", "token-mean")
    actor = ActorLoss(loss_agg_mode=agg, loss_mode=_get(actor_cfg, "policy_loss.loss_mode", "vanilla"),
                      loss_scale_factor=_get(actor_cfg, "loss_scale_factor"), shuffle=bool(_get(actor_cfg, "shuffle", False)))
    if _get(config, "rllm.algorithm.loss_fn_map"):
        raise RllmConfigError("rllm.algorithm.loss_fn_map must be empty with oma: per-role loss routing sends each role "
                              "to its own update_actor call, whose mini-batches oma does not model")
    if bool(_get(config, "rllm.mask_truncated_samples", False)):
        # it drops rows after rLLM padded the batch to whole mini-batches, so the layout oma models moves
        raise RllmConfigError("rllm.mask_truncated_samples must be false with oma: it drops rows after the batch is "
                              "padded to whole mini-batches, which moves the rows between optimizer steps")
    if _get(config, "rllm.algorithm.stepwise_advantage_mode", "broadcast") != "broadcast":
        raise RllmConfigError("rllm.algorithm.stepwise_advantage_mode must be 'broadcast', rLLM's only mode in the unified trainer")
    raw = _get(config, PREFIX)
    opts = read_options(dict(raw.items()) if raw is not None else None, actor)
    if opts.mass != "native":
        # these terms do not scale with A, so the carrier A·W/f cannot reach them: they would keep rLLM's row mass
        if bool(_get(actor_cfg, "use_kl_loss", False)):
            raise RllmConfigError("actor_rollout_ref.actor.use_kl_loss must be false under Mass Alignment: verl adds the "
                                  "KL loss by loss_agg_mode per row, which the advantages cannot reweigh (rLLM's default is false)")
        if float(_get(actor_cfg, "entropy_coeff", 0.0) or 0.0) != 0.0:
            raise RllmConfigError("actor_rollout_ref.actor.entropy_coeff must be 0 under Mass Alignment: verl adds the "
                                  "entropy bonus by loss_agg_mode per row, which the advantages cannot reweigh (rLLM's default is 0)")
    return opts, actor


def default_mini_batch_rows(config: Any) -> int | None:
    """rLLM's fallback when the batch was not padded (``trainer.balance_batch=false``): both the mini-batch rows
    and the seq-mean denominator are ``ppo_mini_batch_size × rollout.n``."""
    mbs, n = _get(config, "actor_rollout_ref.actor.ppo_mini_batch_size"), _get(config, "actor_rollout_ref.rollout.n")
    return int(mbs) * int(n) if mbs is not None and n is not None else None


def actor_for(batch_meta: dict, actor: ActorLoss, dp: int, default_rows: int | None) -> ActorLoss:
    """The actor's layout on one batch: rLLM stashes the mini-batch rows and the seq-mean denominator in
    ``meta_info`` when it pads the batch (``_pad_dataproto_to_world_size``), else both are ``default_rows``
    (:func:`default_mini_batch_rows`), as ``_update_actor_with_loss_routing`` reads them."""
    return ActorLoss(mini_batch_rows=batch_meta.get("rllm_actor_mini_batch_size", default_rows),
                     global_batch_size=batch_meta.get("rllm_actor_global_batch_size", default_rows), dp=dp,
                     loss_agg_mode=actor.loss_agg_mode, loss_mode=actor.loss_mode,
                     loss_scale_factor=actor.loss_scale_factor, shuffle=actor.shuffle)


def backend_class() -> type:
    """A subclass of rLLM's ``VerlBackend`` whose ``compute_advantages`` applies :func:`align_batch`; pass it
    as ``UnifiedTrainer(backend_cls=...)``."""
    from rllm.trainer.verl.verl_backend import VerlBackend  # rLLM and verl only now

    class OmaVerlBackend(VerlBackend):
        _oma = True

        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            self.oma_options, self.oma_actor = check_config(config)  # before any worker starts
            super().__init__(config, *args, **kwargs)

        async def compute_advantages(self, trainer_state: Any, algorithm_config: Any, **kwargs: Any) -> None:
            await super().compute_advantages(trainer_state, algorithm_config, **kwargs)
            batch = trainer_state.backend_batch
            columns = {**batch.non_tensor_batch, **{k: batch.batch[k] for k in
                                                    ("response_mask", "advantages", "traj_rewards")}}
            actor = actor_for(batch.meta_info, self.oma_actor, self._get_dp_size(self.actor_rollout_wg, "actor"),
                              default_mini_batch_rows(self.config))
            result = align_batch(columns, self.oma_options, actor=actor, iteration=trainer_state.global_step)
            batch.batch["advantages"] = result.advantages.to(batch.batch["advantages"].device)
            trainer_state.metrics.update(result.metrics)

    return OmaVerlBackend


def install() -> None:
    """Make rLLM's verl launcher build :func:`backend_class`'s backend: ``VerlTrainerLauncher``'s Ray task
    reads the name ``VerlBackend`` from ``rllm.trainer.verl.verl_launcher``, so this has to run in that task's
    process (Ray's ``runtime_env={"worker_process_setup_hook": "oma.integrations.rllm.backend.install"}``)."""
    import rllm.trainer.verl.verl_launcher as launcher  # rLLM only now

    if not getattr(launcher.VerlBackend, "_oma", False):
        launcher.VerlBackend = backend_class()
