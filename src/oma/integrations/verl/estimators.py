r"""OMA advantage estimators for verl's registry: ``oma_grpo``, ``oma_rloo``, ``oma_gigpo``.

Each is a thin converter from verl's data to the host contract: it reads the call's arguments into
an :class:`oma.hosts.HostStep` and ``algorithm.oma`` into :class:`oma.hosts.HostOptions`, and calls
:func:`oma.hosts.advantages`; the result is broadcast over the response tokens,
``A[r]·response_mask[r, l]``, and returned as ``(advantages, returns)`` like verl's own outcome
estimators.

**What verl passes, and what these estimators do with it.** verl 0.9.1 calls a registered
estimator with ``token_level_rewards``, ``response_mask``, ``config`` (the ``algorithm`` node) and,
when present, ``index`` (the group ``uid``) — never a trajectory id. So:

* ``accounting: row`` needs no trajectory: every row is a member (verl/verl-agent's baseline). For
  groups of ≥2 rows ``oma_grpo`` equals verl's ``grpo``; a single-row group gets 0 (verl returns
  s/(1+ε) there).
* ``accounting: trajectory`` (the default, Outcome Alignment) needs trajectory ids. They are taken
  from the keyword ``traj_index`` or ``traj_uid`` (any hashable per row; verl-agent forks pass
  ``traj_uid``), or from ``non_tensor_batch["traj_uid"|"traj_index"]`` when the caller passes the
  non-tensor batch. Without them the estimator **refuses** with a ``ValueError`` naming the fixes
  (oma's trainer ``trainer.v1.trainer_mode=oma_sync``, or ``accounting: row``). It never falls back
  silently: row accounting is exactly the bias OA removes.
* Mass Alignment is not an advantage: it is applied by oma's trainer, which folds the step's
  weights into the advantages. Called by anyone else with ``mass`` other than ``native`` the
  estimators refuse rather than run a different objective than configured.

Trajectories are keyed by (group, trajectory id), so ids that repeat across groups (e.g. a
session number 0..n-1) are still distinct trajectories.

``oma_gigpo`` additionally needs the state each row acted in (``anchor``: int ids, or
``anchor_obs``: strings hashed with :func:`oma.core.anchor_ids`, as verl-agent names them).
``algorithm.oma.outcome: final`` stamps the score of each trajectory's last row (largest
``step_index``) on all its rows before anything else (verl's rule); ``mean`` (default) keeps each
row's score, so R_τ is their mean.

``step_rewards`` (per row) defaults to the *terminal* reward: the row's score on its trajectory's
last step, 0 before (sparse outcome reward, as ALFWorld's). ``step_index`` defaults to the rows'
order of appearance inside their trajectory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from oma import core, hosts
from oma.hosts import HostOptions, HostStep
from oma.integrations.verl.options import cfg_get, host_options


def dense_ids(values: Any, *, name: str = "ids") -> Tensor:
    """Dense int64 ids (0..n-1, in order of first appearance) of any per-row hashables."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().tolist()
    elif isinstance(values, np.ndarray):
        values = values.tolist()
    mapping: dict[Any, int] = {}
    try:
        out = [mapping.setdefault(v if not isinstance(v, list) else tuple(v), len(mapping)) for v in values]
    except TypeError as exc:
        raise TypeError(f"{name} must hold hashable values per row: {exc}") from None
    return torch.tensor(out, dtype=torch.int64)


def terminal_step_rewards(scores: Tensor, traj_index: Tensor, step_index: Tensor) -> Tensor:
    """The row's score on its trajectory's last step (largest ``step_index``), 0 on earlier rows."""
    traj = torch.unique(traj_index, return_inverse=True)[1]
    last = torch.full((int(traj.max()) + 1 if traj.numel() else 0,), -1, dtype=torch.int64)
    last = last.scatter_reduce(0, traj, step_index.to(torch.int64), reduce="amax", include_self=True)
    return torch.where(step_index.to(torch.int64) == last[traj], scores, torch.zeros_like(scores))


def _lookup(kwargs: dict, non_tensor_batch: Any, *names: str) -> Any:
    for name in names:
        if kwargs.get(name) is not None:
            return kwargs[name]
    for name in names:
        value = cfg_get(non_tensor_batch, name, None) if non_tensor_batch is not None else None
        if value is not None:
            return value
    return None


def _mass_guard(options: HostOptions, estimator: str, applied: bool) -> None:
    if options.mass != "native" and not applied:
        raise ValueError(
            f"{estimator}: algorithm.oma.mass={options.mass!r} asks for Mass Alignment, which is not an "
            "advantage: oma's trainer applies it (trainer.v1.trainer_mode=oma_sync, with "
            "actor_rollout_ref.actor.loss_agg_mode=token-sum). Select that trainer, or set "
            "algorithm.oma.mass=native to run Outcome Alignment alone."
        )


def _no_traj_error(estimator: str, accounting: str) -> ValueError:
    return ValueError(
        f"{estimator}: accounting={accounting!r} needs a trajectory id per row, and verl's estimator call "
        "passes none (only the group uid). Use oma's trainer (trainer.v1.trainer_mode=oma_sync), which "
        "recovers trajectories from verl's session keys; or pass traj_index=/traj_uid= (verl-agent style); "
        "or set algorithm.oma.accounting=row for the row-accounting baseline."
    )


def _groups(index: Any, rows: int, estimator: str) -> Tensor:
    if index is None:
        raise ValueError(f"{estimator}: needs the group index (verl's non_tensor_batch['uid']); got none")
    groups = dense_ids(index, name="index")
    if groups.shape[0] != rows:
        raise ValueError(f"{estimator}: index has {groups.shape[0]} rows, token_level_rewards has {rows}")
    return groups


def _trajectories(groups: Tensor, traj: Any, estimator: str) -> Tensor:
    traj_ids = dense_ids(traj, name="traj_index")
    if traj_ids.shape[0] != groups.shape[0]:
        raise ValueError(f"{estimator}: traj_index has {traj_ids.shape[0]} rows, the batch has {groups.shape[0]}")
    return dense_ids(list(zip(groups.tolist(), traj_ids.tolist(), strict=True)))


def _step_index(kwargs: dict, non_tensor_batch: Any, groups: Tensor, traj_index: Tensor) -> Tensor:
    """The caller's ``step_index``, else the rows' order inside their trajectory (they arrive in step order)."""
    step_index = _lookup(kwargs, non_tensor_batch, "step_index")
    if step_index is None:
        return core.batch_structure(groups, traj_index).position_in_trajectory()
    return torch.as_tensor(step_index, dtype=torch.int64).cpu()


def _advantages(step: HostStep, options: HostOptions, response_mask: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        adv_rows = hosts.advantages(step, options)
    adv = adv_rows.to(device=like.device, dtype=like.dtype).unsqueeze(-1) * response_mask.to(like.dtype)
    return adv, adv


def _episode_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    def compute(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: Sequence | np.ndarray | None = None,
        config: Any = None,
        *,
        non_tensor_batch: Any = None,
        oma_mass_applied: bool = False,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor]:
        options = host_options(config, estimator=name)
        _mass_guard(options, name, oma_mass_applied)
        scores = token_level_rewards.detach().sum(dim=-1).cpu().to(torch.float64)
        rows = scores.shape[0]
        groups = _groups(index, rows, name)
        traj = _lookup(kwargs, non_tensor_batch, "traj_index", "traj_uid")
        if traj is None:
            if options.accounting != "row":
                raise _no_traj_error(name, options.accounting)
            traj_index = torch.arange(rows, dtype=torch.int64)
        else:
            traj_index = _trajectories(groups, traj, name)
        step = HostStep(group_index=groups, traj_index=traj_index, scores=scores, response_mask=response_mask != 0,
                        step_index=_step_index(kwargs, non_tensor_batch, groups, traj_index))
        return _advantages(step, options, response_mask, token_level_rewards)

    compute.__name__ = f"compute_{name}_advantage"
    compute.__qualname__ = compute.__name__
    compute.__doc__ = (
        f"verl advantage estimator ``{name}``: :func:`oma.hosts.advantages` with the estimator "
        f"``{name.removeprefix('oma_')}`` and ``algorithm.oma`` options; see the module docstring."
    )
    return compute


compute_oma_grpo_advantage = _episode_estimator("oma_grpo")
compute_oma_rloo_advantage = _episode_estimator("oma_rloo")


def compute_oma_gigpo_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Sequence | np.ndarray | None = None,
    config: Any = None,
    *,
    non_tensor_batch: Any = None,
    oma_mass_applied: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """verl advantage estimator ``oma_gigpo``: :func:`oma.hosts.advantages` with GiGPO; see the module docstring.

    Extra keywords (or ``non_tensor_batch`` entries): ``traj_index``/``traj_uid`` (required, also
    under row accounting: step returns run inside trajectories), ``anchor`` (int ids) or
    ``anchor_obs`` (state strings) (required), ``step_rewards`` [R] and ``step_index`` [R] (optional).
    """
    name = "oma_gigpo"
    options = host_options(config, estimator=name)
    _mass_guard(options, name, oma_mass_applied)
    scores = token_level_rewards.detach().sum(dim=-1).cpu().to(torch.float64)
    rows = scores.shape[0]
    groups = _groups(index, rows, name)
    traj = _lookup(kwargs, non_tensor_batch, "traj_index", "traj_uid")
    if traj is None:
        raise _no_traj_error(name, options.accounting)
    traj_index = _trajectories(groups, traj, name)
    anchor = _lookup(kwargs, non_tensor_batch, "anchor")
    if anchor is None:
        obs = _lookup(kwargs, non_tensor_batch, "anchor_obs")
        if obs is None:
            raise ValueError(
                f"{name}: needs the state each row acted in: anchor= (int64 ids) or anchor_obs= (strings), "
                "or oma's trainer (trainer.v1.trainer_mode=oma_sync), which anchors on the row's prompt"
            )
        anchor = core.anchor_ids([str(s) for s in (obs.tolist() if isinstance(obs, np.ndarray) else obs)])
    step_index = _step_index(kwargs, non_tensor_batch, groups, traj_index)
    step_rewards = _lookup(kwargs, non_tensor_batch, "step_rewards")
    if step_rewards is None:  # the terminal reward: the trajectory's final score on its last step (either outcome rule)
        step_rewards = terminal_step_rewards(scores, traj_index, step_index)
    step = HostStep(group_index=groups, traj_index=traj_index, scores=scores, response_mask=response_mask != 0,
                    step_index=step_index, anchor=torch.as_tensor(anchor, dtype=torch.int64).cpu(),
                    step_rewards=torch.as_tensor(step_rewards).detach().to(torch.float64).cpu().reshape(rows))
    return _advantages(step, options, response_mask, token_level_rewards)


ESTIMATOR_FUNCTIONS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "oma_grpo": compute_oma_grpo_advantage,
    "oma_rloo": compute_oma_rloo_advantage,
    "oma_gigpo": compute_oma_gigpo_advantage,
}


def register(core_algos: Any = None) -> None:
    """Register the three estimators into ``verl.trainer.ppo.core_algos`` (idempotent)."""
    if core_algos is None:
        from verl.trainer.ppo import core_algos
    for name, fn in ESTIMATOR_FUNCTIONS.items():
        core_algos.register_adv_est(name)(fn)
