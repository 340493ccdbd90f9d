"""Run Outcome-Mass Alignment inside verl 0.9.x (docs/verl.md).

Two layers, both reading verl's data into the host contract, :mod:`oma.hosts` (the math is never
copied here):

* **Estimators** ``oma_grpo``, ``oma_rloo``, ``oma_gigpo``, registered into verl's
  ``core_algos`` advantage registry by the ``verl.plugins`` entry point. Options come from
  ``algorithm.oma.*`` (:func:`oma.integrations.verl.options.host_options`). verl's stock estimator
  call passes no trajectory ids, so on their own they give Outcome Alignment only when the caller
  passes ``traj_index``/``traj_uid`` (verl-agent-style forks do), and refuse otherwise (or use
  ``accounting: row``). They never apply Mass Alignment.
* **Trainers** ``oma_sync``, ``oma_colocate_async``, ``oma_separate_async`` (select with
  ``trainer.v1.trainer_mode``): recover trajectories from verl's session keys
  ``{uid}_{session_id}_{index}``, compute OA advantages and MA weights over the step's batch
  (:func:`oma.hosts.align`: also the ``oma/*`` metrics, and the batch under ``algorithm.oma.dump_dir``),
  and fold the weights into the advantages. With ``actor.loss_agg_mode=token-sum`` and a policy loss
  that is positively homogeneous in the advantage (``vanilla`` PPO-clip incl. dual clip, ``gspo``),
  the update's objective is exactly ``oma.core.weighted_loss``. Other combinations, and a verl other
  than 0.9.x, are refused at start-up; the verl privates they rely on are in
  :mod:`oma.integrations.verl._verl_private`.

Nothing heavy is imported here; :func:`status` imports verl on demand.
"""

from __future__ import annotations

ESTIMATOR_NAMES: tuple[str, ...] = ("oma_grpo", "oma_rloo", "oma_gigpo")
"""Advantage estimators registered into ``verl.trainer.ppo.core_algos``."""

TRAINER_NAMES: dict[str, str] = {
    "oma_sync": "sync",
    "oma_colocate_async": "colocate_async",
    "oma_separate_async": "separate_async",
}
"""``trainer.v1.trainer_mode`` values registered by oma → the verl mode each one extends."""

ENTRY_POINT_GROUP = "verl.plugins"
ENTRY_POINT_NAME = "oma"


def status(*, import_trainer: bool = False) -> dict:
    """What oma has registered in this process's verl (imports ``verl`` and ``core_algos``).

    Returns a dict with: ``plugin_loaded`` (the entry point ran during ``import verl``),
    ``entry_point`` (found in the installed metadata), ``estimators`` (name → registered, and
    registered to oma's function), ``trainers`` (name → registered; only meaningful once
    ``verl.trainer.ppo.v1`` has been imported, which ``import_trainer=True`` tries — it needs
    verl's ``verl-core`` extras such as TransferQueue), ``hook_errors``.
    """
    import sys
    from importlib.metadata import entry_points

    import verl  # noqa: F401  (runs verl's plugin discovery)

    from oma.integrations.verl import _hooks

    eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME]
    from verl.trainer.ppo import core_algos

    from oma.integrations.verl import estimators

    est = {}
    for name in ESTIMATOR_NAMES:
        fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        est[name] = fn is not None and fn is estimators.ESTIMATOR_FUNCTIONS[name]
    trainers: dict[str, bool | str] = {}
    if import_trainer:
        try:
            import verl.trainer.ppo.v1  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            trainers = {name: f"verl v1 trainer not importable: {type(exc).__name__}: {exc}" for name in TRAINER_NAMES}
    if "verl.trainer.ppo.v1.trainer_base" in sys.modules and not trainers:
        registry = sys.modules["verl.trainer.ppo.v1.trainer_base"].TRAINER_REGISTRY
        trainers = {name: name in registry for name in TRAINER_NAMES}
    return {
        "plugin_loaded": "oma.integrations.verl.plugin" in sys.modules,
        "entry_point": [f"{ep.name} = {ep.value}" for ep in eps],
        "estimators": est,
        "trainers": trainers,
        "hook_errors": _hooks.errors(),
    }
