r"""``python -m oma.integrations.verl_agent check-install [PATH]``: oma's verl-agent hook checked against
verl-agent's own code (docs/verl-agent.md#checked-against-verl-agents-own-code).

PATH is a verl-agent checkout, the folder that holds ``verl/``, ``gigpo/`` and ``agent_system/``; without
it, the parent of the installed ``verl`` package when ``agent_system`` sits beside it. The check imports
that checkout's own modules: its folder goes first on ``sys.path``, ``ray`` and any module its imports
need but the environment lacks are stubbed by ``sys.modules`` entries of this check's own, and all of it
is undone afterwards (modules, ``sys.path``, the random generators, the root logger). Nothing imports
verl before the command runs.

On a synthetic stepwise batch, built as the checkout's ``DataProto`` (groups of episodes of uneven
length, string ``uid``/``traj_uid``, invalid actions, ``anchor_obs``), it runs verl-agent's pipeline as
``RayPPOTrainer.fit`` does: ``compute_step_discounted_returns``, the patch's ``row_id`` line,
``adjust_batch`` (padding copies), ``compute_response_mask``, a random reorder and ``_balance_batch``,
``EpisodeRewardManager``, ``apply_invalid_action_penalty``. Then it compares

1. ``compute_advantage`` (GRPO with and without std, RLOO, GiGPO ``mean_norm`` and ``mean_std_norm``)
   with oma's hook under ``accounting=row mass=native``: the worst \|Δ\| of ``advantages`` on the
   response mask;
2. under Mass Alignment (``mass=uniform`` and ``group``), the loss the checkout's own
   ``DataParallelPPOActor.update_policy`` makes from the advantages oma's hook writes (its forward pass a
   fixed table of log-probabilities; the data-parallel ranks run one after another on the driver's
   contiguous chunks, their losses and gradients averaged), summed over the step's optimizer steps,
   and its gradient, with Σ W·ℓ(A): oma's weights W (:attr:`VerlAgentResult.weights`) and ℓ the
   checkout's own ``compute_policy_loss`` / ``compute_policy_loss_gspo`` on each row alone;
3. ``RayPPOTrainer.fit``'s source: the three places of the patch (docs/verl-agent.md#quick-start), or
   on an unpatched checkout the lines the patch goes next to.

Prints a table; exits 0 when everything passes, 1 when a comparison fails, 2 when PATH is no
verl-agent checkout or its modules cannot be imported.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib
import importlib.util
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oma.integrations._checkout import CheckoutError
from oma.integrations._checkout import Stubs as _Stubs
from oma.integrations._checkout import StubModule as _StubModule  # noqa: F401 - the tests stub through it
from oma.integrations._checkout import import_from, isolated
from oma.integrations._checkout import quiet as _quiet

OWN = ("verl", "agent_system", "gigpo")
"""The checkout's top-level packages: their modules are set aside while the check imports the checkout's."""

REQUIRED = ("verl/protocol.py", "verl/trainer/ppo/ray_trainer.py", "verl/trainer/ppo/core_algos.py",
            "verl/workers/actor/dp_actor.py", "gigpo/core_gigpo.py", "agent_system/multi_turn_rollout/__init__.py",
            "agent_system/reward_manager/__init__.py")
"""What the check reads in a checkout, relative to its root."""

ADVANTAGE_TOL = 1e-5
"""Absolute, on advantages of order 1: verl-agent computes in float32, oma in float64."""
LOSS_TOL = 1e-5
"""Relative: the loss to Σ_r c_r·|S_r| (each row's weighted policy loss), its gradient to the largest entry."""

GROUPS, EPISODES, PROMPT, RESPONSE = 6, 4, 8, 16
"""The synthetic batch: uids, ``rollout.n`` (the uids have 3 to 5 episodes), padded prompt and response lengths."""
PENALTY, GAMMA = 0.125, 0.5
"""``invalid_action_penalty_coef`` and ``algorithm.gamma``: with rewards 0 and 1 every score and step return
is a dyadic fraction, exact in float32, so no group mean is inexact and verl-agent's float32 zero-spread
artefact (a nonzero advantage for a group of equal scores whose float32 mean is inexact) cannot arise."""



@dataclass(frozen=True)
class Layout:
    """One actor layout; ``adjust_batch`` pads the batch to its divisors."""

    name: str
    dp: int
    """``trainer.n_gpus_per_node`` (one node, no Ulysses)."""
    mini: int
    """``ppo_mini_batch_size`` (× ``rollout.n`` rows per optimizer step)."""
    micro: int
    """``ppo_micro_batch_size_per_gpu``."""
    log_prob_micro: int
    """``log_prob_micro_batch_size_per_gpu`` of the rollout and the reference (``adjust_batch`` reads them)."""
    max_tokens: int | None = None
    """``ppo_max_token_len_per_gpu`` with ``use_dynamic_bsz``; None: fixed micro-batches."""

    def describe(self, rows: int, copies: int) -> str:
        split = (f"micro-batches by tokens (use_dynamic_bsz, at most {self.max_tokens})" if self.max_tokens
                 else f"micro-batches of {self.micro} rows")
        return (f"{self.name}: dp={self.dp}, {self.mini * EPISODES} rows per optimizer step, {split}; "
                f"{rows} rows after adjust_batch ({copies} copies)")


LAYOUTS = (
    Layout("A", dp=2, mini=8, micro=4, log_prob_micro=4),
    Layout("B", dp=1, mini=16, micro=8, log_prob_micro=2),
    Layout("C", dp=4, mini=4, micro=2, log_prob_micro=4),
    Layout("D", dp=2, mini=8, micro=4, log_prob_micro=4, max_tokens=3 * (PROMPT + RESPONSE)),
)

ESTIMATORS = (  # label, algorithm overrides
    ("grpo, norm_adv_by_std_in_grpo=True", {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True}),
    ("grpo, norm_adv_by_std_in_grpo=False", {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False}),
    ("rloo", {"adv_estimator": "rloo"}),
    ("gigpo, mode=mean_norm", {"adv_estimator": "gigpo", "gigpo.mode": "mean_norm"}),
    ("gigpo, mode=mean_std_norm", {"adv_estimator": "gigpo", "gigpo.mode": "mean_std_norm"}),
)

CARRIERS = (  # label, loss_agg_mode, policy_loss.loss_mode
    ("token-mean", "token-mean", "vanilla"),
    ("seq-mean-token-sum", "seq-mean-token-sum", "vanilla"),
    ("seq-mean-token-mean", "seq-mean-token-mean", "vanilla"),
    ("seq-mean-token-sum-norm", "seq-mean-token-sum-norm", "vanilla"),
    ("gspo (seq-mean-token-mean)", "token-mean", "gspo"),
)

MASSES = ({"accounting": "trajectory", "mass": "uniform"}, {"accounting": "trajectory", "mass": "group"},
          {"accounting": "row", "mass": "native"})
"""``algorithm.oma`` of the actor comparisons: OA + MA both ways, and verl-agent's own weights as oma models them."""

MINIMAL_CONFIG: dict[str, Any] = {  # the keys the check and its calls read, where a checkout has no ppo_trainer.yaml
    "algorithm": {"adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True,
                  "use_kl_in_reward": False, "use_pf_ppo": False, "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0},
                  "gigpo": {"step_advantage_w": 1.0, "mode": "mean_norm", "enable_similarity": False,
                            "similarity_thresh": 0.95}},
    "actor_rollout_ref": {
        "actor": {"strategy": "fsdp", "ppo_mini_batch_size": 256, "ppo_micro_batch_size": None,
                  "ppo_micro_batch_size_per_gpu": None, "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 16384,
                  "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                  "loss_agg_mode": "token-mean", "entropy_coeff": 0.001, "use_invalid_action_penalty": True,
                  "invalid_action_penalty_coef": 0.1, "use_kl_loss": False, "use_torch_compile": True,
                  "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "ppo_epochs": 1, "shuffle": False,
                  "ulysses_sequence_parallel_size": 1, "policy_loss": {"loss_mode": "vanilla"}},
        "ref": {"log_prob_micro_batch_size_per_gpu": None},
        "rollout": {"n": 1, "log_prob_micro_batch_size_per_gpu": None, "multi_turn": {"enable": False}}},
    "trainer": {"n_gpus_per_node": 8, "nnodes": 1, "balance_batch": True},
}


@dataclass
class Row:
    """One line of the table."""

    what: str
    """The estimator and mode, the loss aggregation, or the place of the patch."""
    compared: str
    layouts: str
    worst: float | str
    """The worst deviation, or for the patch where the line is (or that it is missing)."""
    tol: float | None
    ok: bool
    detail: str = ""


# ------------------------------------------------------------------------------------ the checkout


def find_checkout(path: str | Path | None) -> Path:
    """The checkout's root: PATH, or the installed ``verl``'s parent when ``agent_system`` sits beside it.

    Raises:
        CheckoutError: one line naming what was expected.
    """
    if path is None:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.origin:
            raise CheckoutError("no PATH given and no verl package is importable: pass a verl-agent checkout (the folder "
                                "with verl/, gigpo/ and agent_system/)")
        root = Path(spec.origin).resolve().parent.parent
        if not (root / "agent_system").is_dir():
            raise CheckoutError(f"no PATH given and the installed verl ({Path(spec.origin).parent}) has no agent_system/ "
                                "beside it: it is not verl-agent's; pass a verl-agent checkout")
    else:
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise CheckoutError(f"{path}: no such folder; expected a verl-agent checkout (the folder with verl/, gigpo/ "
                                "and agent_system/)")
    missing = [rel for rel in REQUIRED if not (root / rel).is_file()]
    if missing:
        raise CheckoutError(f"{root}: not a verl-agent checkout: expected {missing[0]} (a verl-agent checkout's root holds "
                            "verl/, gigpo/ and agent_system/)")
    return root


def _isolated(root: Path) -> contextlib.AbstractContextManager[_Stubs]:
    """The checkout first on ``sys.path``, ``ray`` stubbed; everything as it was afterwards."""
    return isolated(root, OWN, {"ray": "no cluster: the check runs the driver's functions and one actor in this process"})


def _import(name: str, stubs: _Stubs) -> types.ModuleType:
    """``name`` from the checkout, stubbing each module outside it that its imports need but cannot get."""
    return import_from(name, stubs, OWN, CheckoutError)



@dataclass
class Checkout:
    """The checkout's functions the check calls."""

    root: Path
    DataProto: Any
    adjust_batch: Callable[..., Any]
    reward_manager: Any
    step_returns: Callable[..., Any]
    core_algos: types.ModuleType
    core_gigpo: types.ModuleType
    dp_actor: types.ModuleType
    compute_response_mask: Callable[..., Any]
    balance_batch: Callable[..., Any]
    apply_invalid_action_penalty: Callable[..., Any]
    compute_advantage: Callable[..., Any]
    trainer_error: str | None = None
    """Why ``verl.trainer.ppo.ray_trainer`` could not be imported; its four functions are then stand-ins."""
    imported: list[str] = field(default_factory=list)


def load(root: Path, stubs: _Stubs) -> Checkout:
    """The checkout's modules; ``ray_trainer``'s functions replaced by stand-ins when it cannot be imported."""
    protocol = _import("verl.protocol", stubs)
    core_algos = _import("verl.trainer.ppo.core_algos", stubs)
    core_gigpo = _import("gigpo.core_gigpo", stubs)
    rollout = _import("agent_system.multi_turn_rollout", stubs)
    reward = _import("agent_system.reward_manager", stubs)
    dp_actor = _import("verl.workers.actor.dp_actor", stubs)
    imported = ["verl.protocol.DataProto", "agent_system.multi_turn_rollout.adjust_batch",
                "agent_system.reward_manager.EpisodeRewardManager", "gigpo.core_gigpo.compute_step_discounted_returns",
                "verl.trainer.ppo.core_algos.{compute_policy_loss, compute_policy_loss_gspo}",
                "verl.workers.actor.dp_actor.DataParallelPPOActor.update_policy"]
    common = {"root": root, "DataProto": protocol.DataProto, "adjust_batch": rollout.adjust_batch,
              "reward_manager": reward.EpisodeRewardManager(tokenizer=_Tokenizer(), num_examine=0),
              "step_returns": core_gigpo.compute_step_discounted_returns, "core_algos": core_algos,
              "core_gigpo": core_gigpo, "dp_actor": dp_actor}
    try:
        trainer = _import("verl.trainer.ppo.ray_trainer", stubs)
    except CheckoutError as exc:
        stand_in = _StandIns(core_algos, core_gigpo)
        return Checkout(**common, compute_response_mask=stand_in.compute_response_mask,
                        balance_batch=stand_in.balance_batch,
                        apply_invalid_action_penalty=stand_in.apply_invalid_action_penalty,
                        compute_advantage=stand_in.compute_advantage, trainer_error=str(exc),
                        imported=[*imported, "verl.trainer.ppo.core_algos.compute_{grpo,rloo}_outcome_advantage",
                                  "gigpo.core_gigpo.compute_gigpo_outcome_advantage"])
    return Checkout(**common, compute_response_mask=trainer.compute_response_mask,
                    balance_batch=lambda batch, dp: trainer.RayPPOTrainer._balance_batch(_Trainer(dp), batch, metrics={}),
                    apply_invalid_action_penalty=trainer.apply_invalid_action_penalty,
                    compute_advantage=trainer.compute_advantage,
                    imported=[*imported, "verl.trainer.ppo.ray_trainer.{compute_response_mask, "
                              "RayPPOTrainer._balance_batch, apply_invalid_action_penalty, compute_advantage}"])


class _Tokenizer:
    """``EpisodeRewardManager`` decodes each row for its console samples; the check shows none."""

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return ""


class _Trainer:
    """What ``RayPPOTrainer._balance_batch`` reads of its trainer: the actor's world size."""

    def __init__(self, dp: int) -> None:
        self.actor_rollout_wg = types.SimpleNamespace(world_size=dp)


class _StandIns:
    """``ray_trainer``'s four functions, written here from its source, for a checkout whose ``ray_trainer`` cannot
    be imported: they call the checkout's own ``core_algos`` / ``core_gigpo``."""

    def __init__(self, core_algos: types.ModuleType, core_gigpo: types.ModuleType) -> None:
        self.core_algos, self.core_gigpo = core_algos, core_gigpo

    @staticmethod
    def compute_response_mask(data: Any) -> torch.Tensor:
        return data.batch["attention_mask"][:, -data.batch["responses"].size(1):]

    @staticmethod
    def balance_batch(batch: Any, dp: int) -> None:
        return None  # the rows are already in random order

    @staticmethod
    def apply_invalid_action_penalty(data: Any, invalid_action_penalty_coef: float) -> tuple[Any, dict[str, float]]:
        invalid = torch.as_tensor(1.0 - data.non_tensor_batch["is_action_valid"].astype(np.float32))
        last = data.batch["response_mask"].sum(-1) - 1
        rows = torch.arange(len(invalid))
        data.batch["token_level_scores"][rows, last] -= invalid_action_penalty_coef * invalid
        if "step_rewards" in data.batch.keys():
            data.batch["step_rewards"] -= invalid_action_penalty_coef * invalid
        return data, {}

    def compute_advantage(self, data: Any, adv_estimator: str, norm_adv_by_std_in_grpo: bool = True,
                          step_advantage_w: float = 1.0, gigpo_mode: str = "mean_norm",
                          gigpo_enable_similarity: bool = False, gigpo_similarity_thresh: float = 0.95, **_: Any) -> Any:
        b, nt = data.batch, data.non_tensor_batch
        common = {"token_level_rewards": b["token_level_rewards"], "response_mask": b["response_mask"], "index": nt["uid"],
                  "traj_index": nt["traj_uid"]}
        if adv_estimator == "grpo":
            adv, ret = self.core_algos.compute_grpo_outcome_advantage(
                **common, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        elif adv_estimator == "rloo":
            adv, ret = self.core_algos.compute_rloo_outcome_advantage(**common)
        else:
            adv, ret = self.core_gigpo.compute_gigpo_outcome_advantage(
                **common, step_rewards=b["step_rewards"], anchor_obs=nt["anchor_obs"], step_advantage_w=step_advantage_w,
                mode=gigpo_mode, enable_similarity=gigpo_enable_similarity, similarity_thresh=gigpo_similarity_thresh)
        b["advantages"], b["returns"] = adv, ret
        return data


# ------------------------------------------------------------------------------------ the batch


@dataclass
class Rollout:
    """The synthetic rollout, one entry per agent step (before ``adjust_batch``)."""

    columns: dict[str, np.ndarray]
    prompt_len: np.ndarray
    response_len: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.prompt_len)


def rollout(seed: int) -> Rollout:
    """GROUPS uids of 3 to 5 episodes; a success takes 2-4 steps and earns 1 at its last, a failure 3-6 steps;
    one action in five is invalid; the anchor observation is one of three rooms; a row count that no layout
    divides, so that ``adjust_batch`` appends copies."""
    rng = np.random.default_rng(seed)
    while True:
        cols: dict[str, list[Any]] = {k: [] for k in ("uid", "traj_uid", "anchor_obs", "rewards", "is_action_valid",
                                                       "episode_rewards", "episode_lengths")}
        for g in range(GROUPS):
            uid = f"{rng.integers(16**8):08x}-task-{g}"
            for e in range(EPISODES - 1 + g % 3):  # 3 to 5 episodes: mass=group then differs from uniform
                traj = f"{rng.integers(16**8):08x}-episode-{g}-{e}"
                won = bool(rng.random() < 0.5)
                steps = int(rng.integers(2, 5) if won else rng.integers(3, 7))
                room = 0
                for k in range(steps):
                    cols["uid"].append(uid)
                    cols["traj_uid"].append(traj)
                    cols["anchor_obs"].append(f"task {g}: you are in room {room}.")
                    cols["rewards"].append(1.0 if won and k == steps - 1 else 0.0)
                    cols["is_action_valid"].append(np.bool_(rng.random() >= 0.2))
                    cols["episode_rewards"].append(np.float32(1.0 if won else 0.0))
                    cols["episode_lengths"].append(np.float32(steps))
                    room = int(rng.integers(0, 3))
        rows = len(cols["uid"])
        if all(rows % _divisor(layout) for layout in LAYOUTS):
            break
    columns = {k: _objects(v) for k, v in cols.items()}  # verl-agent's rollout stacks its steps into object arrays
    columns["active_masks"] = _objects([True] * rows)
    columns["data_source"] = np.asarray(["check-install"] * rows, dtype=object)
    return Rollout(columns, rng.integers(3, PROMPT + 1, rows), rng.integers(1, RESPONSE + 1, rows))


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _divisor(layout: Layout) -> int:
    return int(np.lcm(layout.micro, layout.log_prob_micro)) * layout.dp


def proto(checkout: Checkout, ro: Rollout) -> Any:
    """The rollout as the checkout's ``DataProto``: left-padded prompts, right-padded responses. The first
    prompt token (padding: no mask reads it) holds the row's number, so that the actor's stand-in forward pass
    finds its log-probabilities; a copy repeats its original's."""
    rows = ro.rows
    gen = torch.Generator().manual_seed(rows)
    prompt_mask = torch.arange(PROMPT) >= PROMPT - torch.as_tensor(ro.prompt_len)[:, None]
    response_mask = torch.arange(RESPONSE) < torch.as_tensor(ro.response_len)[:, None]
    prompts = torch.randint(1, 1000, (rows, PROMPT), generator=gen) * prompt_mask
    prompts[:, 0] = torch.arange(rows)
    responses = torch.randint(1, 1000, (rows, RESPONSE), generator=gen) * response_mask
    attention = torch.cat([prompt_mask, response_mask], -1).long()
    tensors = {"input_ids": torch.cat([prompts, responses], -1), "attention_mask": attention,
               "position_ids": (attention.cumsum(-1) - 1).clamp_min(0), "prompts": prompts, "responses": responses}
    return checkout.DataProto.from_dict(tensors=tensors, non_tensors={k: v.copy() for k, v in ro.columns.items()})


def config(base: Any, layout: Layout, algorithm: dict[str, Any] | None = None, oma: dict[str, str] | None = None,
           actor: dict[str, Any] | None = None) -> Any:
    """verl-agent's config (the checkout's ``ppo_trainer.yaml``) set for ``layout``; ``algorithm.oma`` = ``oma``."""
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(base)
    values = {"algorithm.gamma": GAMMA, "algorithm.use_kl_in_reward": False, "algorithm.gigpo.enable_similarity": False,
              "algorithm.gigpo.step_advantage_w": 1.0,
              "actor_rollout_ref.rollout.n": EPISODES, "actor_rollout_ref.rollout.multi_turn.enable": False,
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": layout.log_prob_micro,
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": layout.log_prob_micro,
              "actor_rollout_ref.actor.strategy": "fsdp",
              "actor_rollout_ref.actor.ppo_mini_batch_size": layout.mini,
              "actor_rollout_ref.actor.ppo_micro_batch_size": None,
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": layout.micro,
              "actor_rollout_ref.actor.use_dynamic_bsz": layout.max_tokens is not None,
              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": layout.max_tokens or 16384,
              "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
              "actor_rollout_ref.actor.use_invalid_action_penalty": True,
              "actor_rollout_ref.actor.invalid_action_penalty_coef": PENALTY,
              "actor_rollout_ref.actor.use_kl_loss": False, "actor_rollout_ref.actor.entropy_coeff": 0.0,
              "actor_rollout_ref.actor.use_torch_compile": False, "actor_rollout_ref.actor.ppo_epochs": 1,
              "trainer.n_gpus_per_node": layout.dp, "trainer.nnodes": 1}
    values.update({f"algorithm.{k}": v for k, v in (algorithm or {}).items()})
    values.update({f"actor_rollout_ref.actor.{k}": v for k, v in (actor or {}).items()})
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    if oma is not None:
        OmegaConf.update(cfg, "algorithm.oma", dict(oma), force_add=True)
    return cfg


def base_config(root: Path) -> tuple[Any, str]:
    from omegaconf import OmegaConf

    path = root / "verl" / "trainer" / "config" / "ppo_trainer.yaml"
    if path.is_file():
        return OmegaConf.load(path), "the checkout's verl/trainer/config/ppo_trainer.yaml"
    return OmegaConf.create(MINIMAL_CONFIG), "oma's minimal stand-in for ppo_trainer.yaml (the checkout has none)"


def pipeline(checkout: Checkout, ro: Rollout, cfg: Any, layout: Layout, seed: int, *, row_id_late: bool = False) -> Any:
    """``RayPPOTrainer.fit`` from the rollout to ``compute_advantage``, with the patch's ``row_id`` line (after
    ``adjust_batch`` with ``row_id_late``, the misplaced patch the hook must refuse)."""
    np.random.seed(seed)  # adjust_batch picks its copies with numpy's global generator
    batch = proto(checkout, ro)
    with _quiet():
        batch.batch["step_rewards"] = checkout.step_returns(batch=batch, gamma=cfg.algorithm.gamma)
        if not row_id_late:
            batch.non_tensor_batch["row_id"] = np.arange(len(batch))
        batch = checkout.adjust_batch(cfg, batch)
        if row_id_late:
            batch.non_tensor_batch["row_id"] = np.arange(len(batch))
        batch.batch["response_mask"] = checkout.compute_response_mask(batch)
        batch.reorder(torch.as_tensor(np.random.default_rng(seed).permutation(len(batch))))
        checkout.balance_batch(batch, layout.dp)
        batch.batch["token_level_scores"] = checkout.reward_manager(batch)
        batch, _ = checkout.apply_invalid_action_penalty(
            batch, invalid_action_penalty_coef=cfg.actor_rollout_ref.actor.invalid_action_penalty_coef)
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    return batch


def advantage_kwargs(cfg: Any) -> dict[str, Any]:
    """The arguments ``RayPPOTrainer.fit`` passes to verl-agent's ``compute_advantage``."""
    a = cfg.algorithm
    return {"adv_estimator": a.adv_estimator, "gamma": a.gamma, "lam": a.lam, "num_repeat": cfg.actor_rollout_ref.rollout.n,
            "norm_adv_by_std_in_grpo": a.get("norm_adv_by_std_in_grpo", True),
            "multi_turn": cfg.actor_rollout_ref.rollout.multi_turn.enable, "use_pf_ppo": a.use_pf_ppo,
            "pf_ppo_reweight_method": a.pf_ppo.reweight_method, "pf_ppo_weight_pow": a.pf_ppo.weight_pow,
            "step_advantage_w": a.gigpo.step_advantage_w, "gigpo_mode": a.gigpo.mode,
            "gigpo_enable_similarity": a.gigpo.enable_similarity, "gigpo_similarity_thresh": a.gigpo.similarity_thresh}


# ------------------------------------------------------------------------------------ the comparisons


def compare_advantages(checkout: Checkout, batch: Any, cfg: Any) -> float:
    """Worst |Δ| of ``advantages`` on the response mask: verl-agent's ``compute_advantage`` vs oma's hook
    (``cfg`` sets ``algorithm.oma`` to row + native)."""
    from oma.integrations.verl_agent import compute_advantage

    theirs, ours = copy.deepcopy(batch), copy.deepcopy(batch)
    with _quiet():
        checkout.compute_advantage(theirs, **advantage_kwargs(cfg))
    compute_advantage(ours, cfg, {})
    mask = batch.batch["response_mask"].bool()
    return float((theirs.batch["advantages"].double() - ours.batch["advantages"].double()).abs()[mask].max())


def refusals(checkout: Checkout, base: Any, ro: Rollout, seed: int) -> list[Row]:
    """What oma must refuse on this checkout: the ``row_id`` line placed after its own ``adjust_batch``, and,
    under Mass Alignment, the recipes' KL loss and the entropy bonus at the checkout's default coefficient."""
    from oma.integrations.verl_agent import check_config, compute_advantage
    from oma.integrations.verl_agent.batch import VerlAgentConfigError

    layout, ma = LAYOUTS[0], {"accounting": "trajectory", "mass": "uniform"}
    gigpo = {"adv_estimator": "gigpo", "gigpo.mode": "mean_std_norm"}  # the ALFWorld recipe's
    late = pipeline(checkout, ro, config(base, layout), layout, seed, row_id_late=True)
    entropy = {"entropy_coeff": base.actor_rollout_ref.actor.get("entropy_coeff", 0.0)}
    cases = [("row_id after adjust_batch", "the hook refuses",
              lambda: compute_advantage(late, config(base, layout, gigpo, ma), {}), "the row_id line runs after adjust_batch"),
             ("use_kl_loss=True, kl_loss_coef=0.01", "check_config refuses under MA",
              lambda: check_config(config(base, layout, gigpo, ma, {"use_kl_loss": True, "kl_loss_coef": 0.01})),
              "use_kl_loss=True"),
             (f"entropy_coeff={entropy['entropy_coeff']} (the checkout's default)", "check_config refuses under MA",
              lambda: check_config(config(base, layout, gigpo, ma, entropy)), "entropy_coeff=")]
    rows = []
    for what, compared, call, expected in cases:
        try:
            call()
            detail, ok = "not refused", False
        except VerlAgentConfigError as exc:
            detail, ok = ("" if expected in str(exc) else f"refused for another reason: {exc}"), expected in str(exc)
        rows.append(Row(what, compared, layout.name, "refused" if detail != "not refused" else "accepted", None, ok, detail))
    return rows


def compare_scores(batch: Any) -> float:
    """Worst |Δ| of the row scores: verl-agent's (``token_level_rewards.sum(-1)`` after its reward manager and
    ``apply_invalid_action_penalty``) vs oma's from ``episode_rewards`` and ``is_action_valid`` (what it uses on
    a dumped batch without ``token_level_rewards``)."""
    from oma.integrations.verl_agent.batch import scores

    theirs = batch.batch["token_level_rewards"].double().sum(-1)
    columns = {k: batch.non_tensor_batch[k] for k in ("episode_rewards", "is_action_valid")}
    return float((theirs - scores(columns, len(theirs), PENALTY)).abs().max())


def logprob_tables(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(old, new) log-probabilities [rows, RESPONSE] per original row: ratios inside and outside the clip range."""
    gen = torch.Generator().manual_seed(seed + 1)
    old = -2.0 * torch.rand(rows, RESPONSE, generator=gen)
    return old, old + 0.3 * torch.randn(rows, RESPONSE, generator=gen)


def their_actor(checkout: Checkout, batch: Any, cfg: Any, layout: Layout, new: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The loss of verl-agent's ``update_policy`` over the step and its gradient by the new log-probabilities,
    averaged over the ranks. The forward pass, the optimizer step and the device are replaced; the policy loss
    functions it calls are wrapped to multiply their loss by a probe scalar s = 1, whose gradient is then the
    loss as ``update_policy`` scales it (1/GA, or rows/mini-batch rows with ``use_dynamic_bsz``)."""
    from omegaconf import OmegaConf

    dp_actor = checkout.dp_actor
    actor_cfg = OmegaConf.create(OmegaConf.to_container(cfg.actor_rollout_ref.actor, resolve=True))
    actor_cfg.ppo_mini_batch_size = actor_cfg.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // layout.dp
    table = new.clone().requires_grad_(True)
    probe = torch.ones((), dtype=torch.float64, requires_grad=True)

    def scaled(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            pg_loss, *rest = fn(*args, **kwargs)
            return (pg_loss * probe, *rest)
        return call

    patches = [(dp_actor, name, scaled(getattr(dp_actor, name)))
               for name in ("compute_policy_loss", "compute_policy_loss_gspo")]
    patches += [(module, "get_torch_device", _CpuDevice) for module in list(sys.modules.values())
                if str(getattr(module, "__file__", None) or "").startswith(str(checkout.root))
                and hasattr(module, "get_torch_device")]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    with _quiet():
        actor = dp_actor.DataParallelPPOActor(config=actor_cfg, actor_module=torch.nn.Module(),
                                              actor_optimizer=_NoOptimizer())
    actor._forward_micro_batch = lambda micro_batch, temperature, calculate_entropy=False: (
        None, table[micro_batch["input_ids"][:, 0]])
    actor._optimizer_step = lambda: torch.zeros(())
    try:
        for module, name, value in patches:
            setattr(module, name, value)
        with _quiet():
            for chunk in batch.chunk(layout.dp):  # Dispatch.DP_COMPUTE_PROTO: contiguous chunks, one per rank
                chunk.meta_info["temperature"] = 1.0
                actor.update_policy(chunk)
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
    if probe.grad is None or table.grad is None:
        raise CheckoutError("update_policy computed no policy loss through compute_policy_loss(_gspo)")
    return float(probe.grad) / layout.dp, table.grad / layout.dp


class _CpuDevice:
    """``get_torch_device()`` for the actor: the CPU, with the memory counters its GPU-memory logger reads."""

    def __call__(self) -> _CpuDevice:
        return self

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def memory_allocated() -> int:
        return 0

    memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info() -> tuple[int, int]:
        return 0, 0


_CpuDevice = _CpuDevice()  # type: ignore[misc]


class _NoOptimizer:
    def zero_grad(self) -> None:
        return None


def intended(checkout: Checkout, batch: Any, result: Any, actor_cfg: Any, old: torch.Tensor,
             new: torch.Tensor) -> tuple[float, torch.Tensor, float]:
    r"""Σ W·ℓ(A) and its gradient by the new log-probabilities, and Σ_r c_r·|S_r|. W is c_r on row r's response
    tokens; S_r = Σ_t ℓ_rt(A_r), from the checkout's own policy loss on row r alone (``seq-mean-token-sum``, or
    GSPO's ``seq-mean-token-mean`` times the row's tokens)."""
    mask = batch.batch["response_mask"]
    tokens = mask.sum(-1)
    w = result.weights
    c = w.sum(-1) / tokens.clamp_min(1).double()
    if not torch.allclose(w, c[:, None] * mask.double(), rtol=1e-12, atol=1e-15):
        raise AssertionError("oma's weights are not constant along a row's response tokens")
    gspo = actor_cfg.policy_loss.loss_mode == "gspo"
    fn = checkout.core_algos.compute_policy_loss_gspo if gspo else checkout.core_algos.compute_policy_loss
    clip = {"cliprange": actor_cfg.clip_ratio, "cliprange_low": actor_cfg.clip_ratio_low,
            "cliprange_high": actor_cfg.clip_ratio_high, "clip_ratio_c": actor_cfg.get("clip_ratio_c", 3.0)}
    ids = batch.batch["input_ids"][:, 0]
    table = new.clone().requires_grad_(True)
    total, scale = torch.zeros((), dtype=torch.float64), 0.0
    for r in torch.nonzero(c > 0).flatten().tolist():
        adv = (result.adv[r] * mask[r : r + 1]).float()
        pg, *_ = fn(old_log_prob=old[ids[r]][None], log_prob=table[ids[r]][None], advantages=adv,
                    response_mask=mask[r : r + 1], **clip, loss_agg_mode="seq-mean-token-sum")
        s = pg.double() * (tokens[r].double() if gspo else 1.0)
        total = total + c[r] * s
        scale += float(c[r] * s.detach().abs())
    total.backward()
    return float(total.detach()), table.grad, scale


def compare_actor(checkout: Checkout, batch: Any, cfg: Any, layout: Layout, seed: int) -> float:
    """Worst relative deviation of verl-agent's actor loss and gradient from Σ W·ℓ(A) (``cfg`` sets MA)."""
    from oma.integrations.verl_agent import align_batch, check_config, compute_advantage
    from oma.integrations.verl_agent.trainer import NON_TENSOR_COLUMNS, TENSOR_COLUMNS

    data = copy.deepcopy(batch)
    compute_advantage(data, cfg, {})
    setup = check_config(cfg)
    columns = {k: batch.non_tensor_batch[k] for k in NON_TENSOR_COLUMNS if k in batch.non_tensor_batch}
    columns.update({k: batch.batch[k] for k in TENSOR_COLUMNS if k in batch.batch.keys()})
    result = align_batch(columns, setup.options, actor=setup.actor, invalid_penalty=setup.invalid_penalty)
    old, new = logprob_tables(int(batch.non_tensor_batch["row_id"].max()) + 1, seed)
    data.batch["old_log_probs"] = old[data.batch["input_ids"][:, 0]]
    got, got_grad = their_actor(checkout, data, cfg, layout, new)
    want, want_grad, scale = intended(checkout, batch, result, cfg.actor_rollout_ref.actor, old, new)
    loss_dev = abs(got - want) / max(scale, 1e-30)
    grad_dev = float((got_grad - want_grad).abs().max() / want_grad.abs().max().clamp_min(1e-30))
    return max(loss_dev, grad_dev)


# ------------------------------------------------------------------------------------ the patch


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _assigns_batch(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "batch" for t in node.targets)


def _is_row_id(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "non_tensor_batch"
        and isinstance(t.slice, ast.Constant) and t.slice.value == "row_id" for t in node.targets)


def check_fit(path: Path) -> tuple[str, list[Row]]:
    """The patch's three places in ``RayPPOTrainer.fit`` (docs/verl-agent.md#quick-start): on a patched
    checkout, present and in order; on an unpatched one, the lines it goes next to."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fit = next((f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == "RayPPOTrainer"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "fit"), None)
    if fit is None:
        return f"{path.name} has no RayPPOTrainer.fit", [Row("patch", "RayPPOTrainer.fit", "", "missing", None, False)]
    nodes = sorted((n for n in ast.walk(fit) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))
    oma = {a.asname or a.name: a.name for n in nodes if isinstance(n, ast.ImportFrom)
           and (n.module or "").startswith("oma.integrations.verl_agent") for a in n.names}
    calls = [n for n in nodes if isinstance(n, ast.Call)]

    def is_oma(call: ast.Call, name: str) -> bool:
        f = call.func
        if isinstance(f, ast.Attribute):
            return f.attr == name and ast.unparse(f.value).endswith("verl_agent")
        return isinstance(f, ast.Name) and oma.get(f.id) == name

    def first(found: list[int]) -> int | None:
        return min(found) if found else None

    tracking = first([n.lineno for n in nodes if isinstance(n, ast.ImportFrom) and n.module == "verl.utils.tracking"
                      and any(a.name == "Tracking" for a in n.names)])
    adjust = first([n.lineno for n in nodes if _assigns_batch(n) and isinstance(n.value, ast.Call)
                    and _callee(n.value) == "adjust_batch"])
    theirs = [n.lineno for n in calls if _callee(n) == "compute_advantage" and not is_oma(n, "compute_advantage")]
    at = f"{path.name}, RayPPOTrainer.fit"

    def found(line: int | None) -> str:
        return f"line {line}" if line else "missing"

    if not oma:
        anchor = first([n.lineno for n in nodes if _assigns_batch(n) and isinstance(n.value, ast.Call)
                        and _callee(n.value) == "compute_advantage"])
        return f"{at} is unpatched; the patch goes next to these lines", [
            Row("patch anchor", "from verl.utils.tracking import Tracking", "", found(tracking), None, tracking is not None),
            Row("patch anchor", "batch = adjust_batch(self.config, batch)", "", found(adjust), None, adjust is not None),
            Row("patch anchor", "batch = compute_advantage(", "", found(anchor), None, anchor is not None)]
    check = first([n.lineno for n in calls if is_oma(n, "check_config")])
    if check is None or adjust is None or check > adjust or (tracking is not None and check < tracking):
        check_detail = "" if check is None else f"not between the Tracking import and adjust_batch (line {adjust})"
    else:
        check_detail = None
    row_id = max((n.lineno for n in nodes if _is_row_id(n)), default=None)
    reassigned = [n.lineno for n in nodes if _assigns_batch(n) and row_id and adjust and row_id < n.lineno < adjust]
    if row_id is None or adjust is None:
        row_detail = "" if row_id is None else "no batch = adjust_batch(...) in fit"
    elif row_id > adjust:
        row_detail = f"misplaced: after adjust_batch (line {adjust}), so the copies get numbers of their own"
    elif reassigned:
        row_detail = f"batch is reassigned at line {reassigned[0]}, before adjust_batch (line {adjust})"
    else:
        row_detail = None
    call = first([n.lineno for n in calls if is_oma(n, "compute_advantage")])
    penalty = first([n.lineno for n in calls if _callee(n) == "apply_invalid_action_penalty"])
    if call is None:
        call_detail = ""
    elif theirs:
        call_detail = f"verl-agent's compute_advantage is still called at line {theirs[0]}"
    elif penalty is not None and call < penalty:
        call_detail = f"before apply_invalid_action_penalty (line {penalty}): the scores lack the penalty"
    else:
        call_detail = None
    return f"{at} is patched", [
        Row("patch 1/3", "check_config(self.config)", "", found(check), None, check_detail is None, check_detail or ""),
        Row("patch 2/3", "row_id = np.arange(len(batch)) before adjust_batch", "", found(row_id), None, row_detail is None,
            row_detail or ""),
        Row("patch 3/3", "oma's compute_advantage for verl-agent's", "", found(call), None, call_detail is None,
            call_detail or "")]


# ------------------------------------------------------------------------------------ the command


def _git(root: Path) -> str:
    """The checkout's commit, when ``root`` is the top of a git work tree (an archive has none)."""
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root:
        return "no git work tree: its commit is not known here"
    dirty = ", with local changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"commit {git('log', '-1', '--format=%H of %cs')}{dirty}"


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=112, subsequent_indent="    ", break_on_hyphens=False)


def run(path: str | Path | None, *, seed: int = 0, out: Any = None) -> int:
    """The command (module docstring): prints the report to ``out`` (stdout) and returns the exit status."""
    out = out or sys.stdout
    root = find_checkout(path)
    with _isolated(root) as stubs:
        checkout = load(root, stubs)
        base, base_from = base_config(root)
        ro = rollout(seed)
        head, rows = _compare(checkout, base, ro, seed)
    fit_state, fit_rows = check_fit(root / "verl" / "trainer" / "ppo" / "ray_trainer.py")
    rows += fit_rows
    notes = [f"verl-agent at {root} ({_git(root)})",
             f"imported from it: {', '.join(checkout.imported)}",
             "stubbed, as sys.modules entries of this check only: "
             + "; ".join(f"{name} ({why})" for name, why in stubs.names.items())]
    if checkout.trainer_error:
        notes.append(f"verl.trainer.ppo.ray_trainer not imported ({checkout.trainer_error}): compute_advantage, "
                     "apply_invalid_action_penalty, compute_response_mask and _balance_batch are oma's stand-ins calling "
                     "core_algos / core_gigpo directly")
    notes += [f"config: {base_from}, with algorithm.gamma={GAMMA}, invalid_action_penalty_coef={PENALTY}, "
              f"rollout.n={EPISODES}, no KL loss, entropy_coeff=0",
              f"batch: {GROUPS} uids of 3-5 episodes, {len(set(ro.columns['traj_uid']))} episodes, {ro.rows} agent "
              "steps (2-6 per episode), "
              f"{int((~ro.columns['is_action_valid'].astype(bool)).sum())} invalid actions, string uid/traj_uid; "
              "rewards 0/1, so every score and step return is a dyadic fraction and no float32 group mean is inexact "
              "(verl-agent's zero-spread artefact cannot arise); row_id set before adjust_batch, rows permuted at "
              "random, then _balance_batch",
              *head,
              "penalty: verl-agent's row scores (reward manager, apply_invalid_action_penalty) vs oma's from "
              "episode_rewards and is_action_valid (its reading of a dumped batch)",
              "advantages: verl-agent's compute_advantage vs oma's hook with accounting=row mass=native: worst |Δ| on "
              "the response mask",
              "actor: gigpo (mean_std_norm) with accounting=trajectory mass=uniform, trajectory group, and row native: "
              "verl-agent's update_policy on the advantages oma's hook writes (forward pass: a fixed table of "
              "log-probabilities; optimizer step and device replaced; the ranks in turn on DataProto.chunk) vs "
              "Σ W·ℓ(A), ℓ verl-agent's own policy loss on each row alone: worst relative deviation of the loss "
              "summed over the optimizer steps, and of its gradient",
              "refusals: oma's hook (gigpo, trajectory + uniform) on the batch of verl-agent's own adjust_batch with "
              "the row_id line after it; check_config under MA with the recipes' KL loss and with the checkout's "
              "default entropy_coeff",
              f"patch: {fit_state}"]
    lines = [_wrap(note) for note in notes] + [""]
    lines += table(rows)
    failed = sum(not r.ok for r in rows)
    lines.append(f"{len(rows) - failed} of {len(rows)} checks pass" + (f"; {failed} FAIL" if failed else ""))
    print("\n".join(lines), file=out)
    return 1 if failed else 0


def table(rows: list[Row]) -> list[str]:
    """The rows as a table, one line each."""
    cells = [("estimator / mode / place", "compared", "layouts", "worst", "tolerance", "result")]
    cells += [(r.what, r.compared, r.layouts or "-", f"{r.worst:.1e}" if isinstance(r.worst, float) else r.worst,
               f"{r.tol:.0e}" if r.tol is not None else "-",
               ("pass" if r.ok else "FAIL") + (f"  {r.detail}" if r.detail else "")) for r in rows]
    w = [max(len(c[i]) for c in cells) for i in range(5)]
    return [f"{c[0]:<{w[0]}}  {c[1]:<{w[1]}}  {c[2]:<{w[2]}}  {c[3]:>{w[3]}}  {c[4]:>{w[4]}}  {c[5]}" for c in cells]


def _compare(checkout: Checkout, base: Any, ro: Rollout, seed: int) -> tuple[list[str], list[Row]]:
    fixed = [layout for layout in LAYOUTS if layout.max_tokens is None]
    batches, head = {}, ["layouts (rows per optimizer step = ppo_mini_batch_size × rollout.n):"]
    for layout in LAYOUTS:
        batches[layout.name] = pipeline(checkout, ro, config(base, layout), layout, seed)
        head.append("  " + layout.describe(len(batches[layout.name]), len(batches[layout.name]) - ro.rows))
    worst = max(compare_scores(batches[layout.name]) for layout in fixed)
    rows = [Row("invalid-action penalty", "row scores, |Δ|", " ".join(x.name for x in fixed), worst, ADVANTAGE_TOL,
                worst <= ADVANTAGE_TOL)]
    for label, algorithm in ESTIMATORS:
        worst = max(compare_advantages(checkout, batches[layout.name],
                                       config(base, layout, algorithm, {"accounting": "row", "mass": "native"}))
                    for layout in fixed)
        rows.append(Row(label, "advantages, |Δ|", " ".join(x.name for x in fixed), worst, ADVANTAGE_TOL,
                        worst <= ADVANTAGE_TOL))
    gigpo = {"adv_estimator": "gigpo", "gigpo.mode": "mean_std_norm"}
    for label, mode, loss_mode in CARRIERS:
        mode_of_term = "seq-mean-token-mean" if loss_mode == "gspo" else mode
        used = [x for x in LAYOUTS if x.max_tokens is None or mode_of_term in ("seq-mean-token-sum", "seq-mean-token-mean")]
        worst = max(compare_actor(checkout, batches[layout.name],
                                  config(base, layout, gigpo, oma,
                                         {"loss_agg_mode": mode, "policy_loss.loss_mode": loss_mode}), layout, seed)
                    for layout in used for oma in MASSES)
        rows.append(Row(label, "actor loss and gradient, relative", " ".join(x.name for x in used), worst, LOSS_TOL,
                        worst <= LOSS_TOL))
    return head, rows + refusals(checkout, base, ro, seed)


def main(path: str | None, *, seed: int = 0, prog: str = "python -m oma.integrations.verl_agent") -> int:
    """``check-install``: :func:`run`; a bad PATH or an unimportable checkout is one line on stderr, exit 2."""
    try:
        return run(path, seed=seed)
    except CheckoutError as exc:
        print(f"{prog} check-install: error: {exc}", file=sys.stderr)
        return 2
