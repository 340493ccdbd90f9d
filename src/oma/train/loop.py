"""The stepwise multi-turn RL loop (docs/training.md), top to bottom in one file.

Per iteration: roll out G task seeds × n episodes (one row per agent step) → advantages from the host
contract, :mod:`oma.hosts` (OA via ``algo.accounting``) → PPO-style epochs over mini-batches of whole
trajectories, weights from :func:`oma.hosts.weights` (MA via ``algo.mass``) computed once per
mini-batch, exact micro-batch gradient accumulation → greedy evaluation on held-out tasks, metrics (the
hosts' ``oma/*`` among them), the batch for ``oma audit``, checkpoint.

Every random draw comes from a generator seeded by (seed, iteration, purpose), so a run is
reproducible and a resumed run yields the metrics of an uninterrupted one.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from torch import Tensor
from torch.optim.swa_utils import get_ema_multi_avg_fn

import oma.envs
from oma import hosts
from oma.agent.kinds import policy_kind, rows_kind
from oma.agent.policy import checked_step, unique_index
from oma.agent.rollout import Rollout, Rows
from oma.core import (
    clipped_tokens,
    discounted_returns,
    group_outcome_stats,
    kl_k3,
    segment_sum,
    token_objective,
    trajectory_minibatches,
    weighted_loss,
)
from oma.hosts import HostOptions, HostStep
from oma.core.segments import segments
from oma.files import atomic_write_text, read_jsonl
from oma.train.checkpoint import checkpoints, clean_debris, resume_from_checkpoint, save_checkpoint
from oma.train.config import ConfigError, TrainConfig, check_sizes, config_diff, saved_config, to_dict
from oma.train.lock import held
from oma.train.warmstart import build_policy, library_versions

TRAIN_SEEDS_PER_RUN_SEED = 100_000
"""Training task seeds of run seed s are s·100000 + k (mod the eval offset): fresh tasks every iteration."""


def _generator(seed: int, iteration: int, purpose: str) -> torch.Generator:
    salt = {"rollout": 1, "minibatch": 2, "eval": 3}[purpose]
    return torch.Generator().manual_seed(seed * 1_000_003 + iteration * 7919 + salt)


def task_seeds(cfg: TrainConfig, iteration: int) -> list[int]:
    g = cfg.env.tasks_per_iter
    first = cfg.seed * TRAIN_SEEDS_PER_RUN_SEED + (iteration - 1) * g
    return [(first + k) % cfg.env.eval_seed_offset for k in range(g)]


def make_env(cfg: TrainConfig) -> Callable[[], object]:
    """A factory of fresh environments of ``cfg`` (``env.name`` with ``env.options``); the options are
    checked once, here (ConfigError naming ``env.options``), and so are ``env.train_max_steps`` and
    ``env.eval_max_steps`` against the environment's cap: above it they would silently change nothing."""
    try:
        env = oma.envs.make(cfg.env.name, **cfg.env.options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"env.options: {e}") from None
    cap = getattr(env, "max_steps", None)  # oma's environments have one; TextEnv does not promise it
    for key, value in {"env.train_max_steps": cfg.env.train_max_steps,
                       "env.eval_max_steps": cfg.env.eval_max_steps}.items():
        if cap is not None and value is not None and value > cap:
            raise ConfigError(f"{key}: {value} is above {cfg.env.name}'s step cap of {cap}, which ends "
                              f"every episode first; raise env.options.max_steps to at least {value}, or lower it")
    check_sizes(cfg, cap)
    return lambda: oma.envs.make(cfg.env.name, **cfg.env.options)


# ================================================================================================
# Batch tensors: one response mask for the whole rollout, responses in columns 0..len-1
# ================================================================================================


@dataclass
class Batch:
    rows: Rows
    response_mask: Tensor  # bool [R, L]
    adv: Tensor  # float [R]
    logp_old: Tensor  # float [R, L]
    logp_ref: Tensor | None  # float [R, L]


def evaluates(iteration: int, eval_every: int, iterations: int) -> bool:
    """Whether a run of ``iterations`` evaluating every ``eval_every`` evaluates after ``iteration``: at the
    warm start (0), at every multiple of ``eval_every`` and at its last iteration."""
    return iteration % eval_every == 0 or iteration == iterations


def per_token(values: list[list[float]], width: int) -> Tensor:
    """float [R, width] from each row's per-response-token values (0 past a row's response)."""
    lengths = torch.tensor([len(v) for v in values], dtype=torch.long)
    out = torch.zeros(len(values), width)
    # row-major boolean indexing visits the rows' values in the order they are concatenated
    out[torch.arange(width) < lengths.unsqueeze(-1)] = torch.tensor([x for v in values for x in v], dtype=out.dtype)
    return out


def response_mask_of(rows: Rows) -> Tensor:
    lengths = torch.tensor([len(r) for r in rows.response_ids])
    return torch.arange(int(lengths.max())).unsqueeze(0) < lengths.unsqueeze(-1)


def forward_plan(rows: Rows, rows_idx: Tensor, micro_rows: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """How to run the forward passes of rows ``rows_idx``: once per distinct row, by length.

    Rows with the same prompt, response and allowed tokens (the n episodes of a task share their
    first steps; a looping policy repeats itself) have the same log-probs, so each distinct row is
    computed once; distinct rows are sorted by length before chunking, so a micro-batch pads to
    similar lengths. Returns, per micro-batch of at most ``micro_rows`` distinct rows:
    ``(rows to compute, positions in rows_idx they serve, which computed row each position reads)``.
    Every position of ``rows_idx`` is served exactly once, so Σ over the plan of
    ``weighted_loss(ℓ, W[positions])`` is the mini-batch loss (docs/training.md#exact-micro-batching).
    """
    idx = rows_idx.tolist()
    allowed = rows.allowed
    keys = [(tuple(rows.prompt_ids[i]), tuple(rows.response_ids[i]),
             allowed[i].numpy().tobytes() if allowed is not None else None) for i in idx]
    firsts, inverse = unique_index(keys)
    if not firsts:
        return []
    lengths = torch.tensor([len(keys[f][0]) + len(keys[f][1]) for f in firsts])
    by_length = torch.argsort(lengths, descending=True, stable=True)
    plan = []
    for chunk in by_length.split(micro_rows):
        local = torch.full((len(firsts),), -1, dtype=torch.long)
        local[chunk] = torch.arange(len(chunk))
        served = (local[inverse] >= 0).nonzero().squeeze(-1)
        plan.append((rows_idx[torch.tensor([firsts[u] for u in chunk.tolist()], dtype=torch.long)], served,
                     local[inverse[served]]))
    return plan


@torch.no_grad()
def batch_logprobs(model, rows: Rows, pad_id: int, micro_rows: int, width: int, temperature: float) -> Tensor:
    """Log-probs [R, width] of every row's response tokens under ``model``, each distinct row once."""
    out = torch.zeros(len(rows), width)
    for compute, served, local in forward_plan(rows, torch.arange(len(rows)), micro_rows):
        logp, _, _ = row_logprobs(model, rows, compute, pad_id, temperature=temperature)
        out[served, : logp.shape[1]] = logp[local]
    return out


def row_logprobs(model, rows: Rows, idx: Tensor, pad_id: int, *, temperature: float, with_entropy: bool = False):
    """``(logp, response_mask, entropy)`` of rows ``idx`` under the policy, as the kind that made them samples
    (:meth:`oma.agent.kinds.PolicyKind.logprobs`) at the rollout temperature: the distribution the rows were
    sampled from, verl's convention."""
    return rows_kind(rows).logprobs(model, rows, idx, pad_id, temperature=temperature, with_entropy=with_entropy)


def policy_rollout(cfg: TrainConfig, make_env, model, tokenizer, seeds: list[int], *, group_size: int,
                   temperature: float, generator: torch.Generator | None, max_steps: int | None = None) -> Rollout:
    """G = len(seeds) tasks × ``group_size`` episodes with the policy of ``cfg``'s kind, each ended after
    ``max_steps`` steps if the environment has not ended it (``None``: the environment's cap)."""
    return policy_kind(cfg).rollout(cfg, make_env, model, tokenizer, seeds, group_size=group_size,
                                    temperature=temperature, generator=generator, max_steps=max_steps)


def training_rollout(cfg: TrainConfig, make_env, model, tokenizer, iteration: int,
                     generator: torch.Generator | None) -> Rollout:
    """Iteration ``iteration``'s training batch: its G tasks × n episodes at the rollout temperature,
    each ended at ``env.train_max_steps`` if the environment has not ended it."""
    return policy_rollout(cfg, make_env, model, tokenizer, task_seeds(cfg, iteration), group_size=cfg.env.group_size,
                          temperature=cfg.policy.temperature, generator=generator, max_steps=cfg.env.train_max_steps)


def episode_scores(cfg: TrainConfig, rows: Rows) -> Tensor:
    """Each row's score for the outcome statistics (``algo.score``).

    ``return``: the episode's summed reward, ``rows.scores``. ``discounted``: G_0 = Σ_t γ^t r_t, the
    episode's return from its first step, so a win at step t scores γ^t. In both, a row's own
    invalid-action penalty is subtracted from its score only (the penalty is not discounted into G_0).
    """
    if cfg.algo.score == "return":
        return rows.scores
    penalty = cfg.env.invalid_penalty * (~rows.valid).to(rows.scores.dtype)
    returns = discounted_returns(rows.step_rewards + penalty, rows.traj_index, rows.step_index, gamma=cfg.algo.gamma)
    traj = segments(rows.traj_index)
    g0 = segment_sum(returns * (rows.step_index == 0), traj.inverse, traj.n)  # rollouts number steps from 0
    return g0[traj.inverse].to(rows.scores.dtype) - penalty


def host_options(cfg: TrainConfig, run_dir: Path | None = None) -> HostOptions:
    """``algo``'s switches as the host contract's options (:mod:`oma.hosts`; errors name ``algo.*``), with the
    batches dumped into ``run_dir`` when ``dump_batches`` is on."""
    a = cfg.algo
    return HostOptions(accounting=a.accounting, mass=a.mass, reducer=a.reducer, estimator=a.estimator,
                       norm_by_std=a.norm_by_std, gamma=a.gamma, step_advantage_w=a.step_advantage_w,
                       dump_dir=str(run_dir) if cfg.dump_batches and run_dir is not None else None, prefix="algo")


def host_step(rows: Rows, scores: Tensor, mask: Tensor) -> HostStep:
    """The iteration's batch as a host step: the rows already carry oma's ids; ``scores`` are the ones the
    advantages compare (:func:`episode_scores`), ``won`` decides success in the metrics and the dump."""
    return HostStep(group_index=rows.group_index, traj_index=rows.traj_index, scores=scores, response_mask=mask,
                    step_index=rows.step_index, anchor=rows.anchor, step_rewards=rows.step_rewards, won=rows.won)


def advantages(cfg: TrainConfig, rows: Rows, scores: Tensor) -> Tensor:
    """A [R] of the rows (:func:`oma.hosts.advantages`)."""
    return hosts.advantages(host_step(rows, scores, response_mask_of(rows)), host_options(cfg))


# ================================================================================================
# The loss of one mini-batch, accumulated over micro-batches (weights from the whole mini-batch)
# ================================================================================================


def minibatch_weights(cfg: TrainConfig, batch: Batch, rows_idx: Tensor) -> Tensor:
    """W [len(rows_idx), L] of one mini-batch: :func:`oma.hosts.weights` of its rows as a step of one
    mini-batch (their scores do not enter the weights).

    Why per mini-batch, not the hosts' whole step × k: oma train's mini-batches hold whole trajectories
    (:func:`oma.core.trajectory_minibatches`), so no trajectory is cut by a boundary, and each optimizer step
    aligns its own trajectories, as this trainer always has. It is the same :func:`oma.core.token_weights`
    call on the same rows, so the committed studies reproduce bit for bit."""
    rows = batch.rows
    step = HostStep(group_index=rows.group_index[rows_idx], traj_index=rows.traj_index[rows_idx],
                    scores=rows.scores[rows_idx], response_mask=batch.response_mask[rows_idx])
    return hosts.weights(step, host_options(cfg))


def minibatch_loss(model, batch: Batch, rows_idx: Tensor, cfg: TrainConfig, pad_id: int, *, backward: bool) -> dict[str, float]:
    """Σ over micro-batches of weighted_loss(ℓ, W[micro]) with W = :func:`minibatch_weights`.

    Micro-batches follow :func:`forward_plan` (each distinct row computed once, rows by length).
    With ``backward`` each micro-batch's loss is back-propagated as it is made (gradients
    accumulate to exactly the mini-batch gradient). Returns the loss and diagnostics, token means
    over the rows that carry a gradient: ``clipfrac`` (tokens whose objective term is clipped, on
    the ratio the objective clips: :func:`oma.core.clipped_tokens`), ``approx_kl_k1`` =
    mean(logp_old − logp) and ``approx_kl_k3`` (Schulman's k1 and k3 estimators of
    KL(π_old ‖ π)); ``kl_ref``: the k3 penalty term per unit of loss weight (``algo.kl_coef`` > 0).
    """
    a = cfg.algo
    rows = batch.rows
    mask = batch.response_mask[rows_idx]
    weights = minibatch_weights(cfg, batch, rows_idx)
    totals = {"loss": 0.0, "pg_loss": 0.0, "kl_ref": 0.0, "clipfrac": 0.0, "approx_kl_k1": 0.0, "approx_kl_k3": 0.0}
    # A row with A = 0 has ℓ = 0 and no gradient whatever its log-probs, unless a KL or entropy term
    # is on: its forward pass is skipped (its tokens still count in the weights' normalisers above).
    live = torch.ones(len(rows_idx), dtype=torch.bool)
    if not (a.kl_coef > 0 and batch.logp_ref is not None) and not a.entropy_coef:
        live = batch.adv[rows_idx] != 0
    n_tokens = max(1, int(mask[live].sum()))
    for compute, served, local in forward_plan(rows, rows_idx[live], cfg.optim.micro_batch_rows):
        served = live.nonzero().squeeze(-1)[served]
        logp_u, _, entropy_u = row_logprobs(model, rows, compute, pad_id, temperature=cfg.policy.temperature,
                                            with_entropy=bool(a.entropy_coef))
        width = logp_u.shape[1]
        idx = rows_idx[served]
        logp, m = logp_u[local], mask[served, :width]
        w = weights[served, :width]
        logp_old = batch.logp_old[idx, :width]
        adv = batch.adv[idx]
        pg = token_objective(logp, logp_old, adv, m, objective=a.objective, clip_low=a.clip_low, clip_high=a.clip_high)
        ell = pg
        if batch.logp_ref is not None and a.kl_coef > 0:
            kl = kl_k3(logp, batch.logp_ref[idx, :width], m)
            ell = ell + a.kl_coef * kl
            totals["kl_ref"] += float(weighted_loss(kl.detach(), w))
        if a.entropy_coef:
            ell = ell - a.entropy_coef * entropy_u[local]
        loss = weighted_loss(ell, w)
        if backward:
            loss.backward()
        with torch.no_grad():
            logp = logp.detach()
            totals["loss"] += float(loss)
            totals["pg_loss"] += float(weighted_loss(pg.detach(), w))
            totals["clipfrac"] += float(clipped_tokens(logp, logp_old, adv, m, objective=a.objective, clip_low=a.clip_low,
                                                       clip_high=a.clip_high).sum())
            totals["approx_kl_k1"] += float(((logp_old - logp) * m).sum())
            totals["approx_kl_k3"] += float(kl_k3(logp_old, logp, m).sum())
    for k in ("clipfrac", "approx_kl_k1", "approx_kl_k3"):
        totals[k] /= n_tokens
    total_w = float(weights.sum())  # the penalty was summed with the loss weights: report it per unit of weight
    totals["kl_ref"] = totals["kl_ref"] / total_w if total_w > 0 else 0.0
    return totals


class NormalizedSGD(torch.optim.Optimizer):
    """θ ← θ − lr · g / ‖g‖ (the global norm over all parameters; no step when g = 0).

    Every step has length ``lr`` whatever the gradient's scale, so two accountings that weight rows
    alike up to a constant take the same step, and only the direction (how the update is allocated
    between states and rows) differs: scale-free like Adam, without Adam's per-parameter
    normalisation (docs/experiments.md#the-tabular-lane).
    """

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.cat([x.flatten() for x in grads]))) if grads else 0.0
        if norm > 0:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"] / norm)


def make_optimizer(cfg: TrainConfig, params: list[Tensor]) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.optimizer == "sgd":
        return torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.optimizer == "normalized-sgd":
        return NormalizedSGD(params, lr=o.lr)
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, eps=o.adam_eps)


class WeightAverage:
    """θ̄, an exponential moving average of a model's trainable weights (``optim.ema`` = β).

    θ̄_0 = θ_0 (the warm start) and θ̄ ← β·θ̄ + (1 − β)·θ after every optimizer step, so after k steps

        θ̄_k = β^k·θ_0 + (1 − β)·Σ_{j=1..k} β^(k−j)·θ_j

    (Polyak averaging with exponential weights; Polyak & Juditsky 1992; ``torch.optim.swa_utils``'s EMA
    step). About the last 1/(1 − β) steps carry most of the weight. β = 0 would be θ̄ = θ. The live
    weights θ are what rollouts and updates use; :meth:`swapped_in` lends θ̄ to the model for an
    evaluation (studies/weight-average/journal.md#an-average-of-the-weights).
    """

    def __init__(self, model: torch.nn.Module, beta: float) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.live = [p for _, p in named]
        self.avg = [p.detach().clone() for p in self.live]
        self._step = get_ema_multi_avg_fn(beta)

    @torch.no_grad()
    def update(self) -> None:
        self._step(self.avg, [p.detach() for p in self.live], None)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds θ̄ inside the block and its own θ again after it, bit for bit."""
        kept = [p.detach().clone() for p in self.live]
        with torch.no_grad():
            for p, a in zip(self.live, self.avg):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, k in zip(self.live, kept):
                    p.copy_(k)

    def state_dict(self) -> dict[str, Tensor]:
        return {n: a.contiguous() for n, a in zip(self.names, self.avg)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if set(state) != set(self.names):
            raise ValueError(f"the averaged weights do not match the model: missing {sorted(set(self.names) - set(state))[:3]}, "
                             f"unexpected {sorted(set(state) - set(self.names))[:3]}")
        with torch.no_grad():
            for n, a in zip(self.names, self.avg):
                a.copy_(state[n])


def update(model, optimizer, batch: Batch, cfg: TrainConfig, pad_id: int, iteration: int,
           ema: WeightAverage | None = None) -> dict[str, float]:
    """PPO epochs over mini-batches of whole trajectories; one optimizer step per mini-batch (then one
    step of ``ema``, the averaged weights, when given)."""
    generator = _generator(cfg.seed, iteration, "minibatch")
    stats: list[dict[str, float]] = []
    model.train()
    for _ in range(cfg.optim.ppo_epochs):
        for rows_idx in trajectory_minibatches(batch.rows.traj_index, cfg.optim.num_minibatches, generator=generator):
            s = minibatch_loss(model, batch, rows_idx, cfg, pad_id, backward=True)
            s["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip))
            if not math.isfinite(s["grad_norm"]):  # stop before the step: the weights stay as the last checkpoint's
                raise FloatingPointError(
                    f"iteration {iteration}: the gradient norm is {s['grad_norm']} (loss {s['loss']}); the optimizer "
                    "step was not taken. Lower optim.lr or check the rollouts' scores for inf/NaN.")
            checked_step(optimizer, (p for p in model.parameters() if p.requires_grad), f"iteration {iteration}", "optim.lr")
            optimizer.zero_grad(set_to_none=True)
            if ema is not None:
                ema.update()
            stats.append(s)
    return {k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}


# ================================================================================================
# Evaluation and bookkeeping
# ================================================================================================


def host_metrics(cfg: TrainConfig, batch: Batch, step: HostStep, options: HostOptions, iteration: int) -> dict[str, float]:
    """The hosts' ``oma/*`` metrics (:func:`oma.hosts.metrics`) of the iteration's first epoch: its
    mini-batches as :func:`update` draws them, each weighted on its own (:func:`minibatch_weights`)."""
    layout = trajectory_minibatches(step.traj_index, cfg.optim.num_minibatches,
                                    generator=_generator(cfg.seed, iteration, "minibatch"))
    w = torch.zeros(step.response_mask.shape, dtype=torch.float64)
    for idx in layout:
        w[idx] = minibatch_weights(cfg, batch, idx)
    return hosts.metrics(replace(step, minibatches=layout), options, w)


def evaluate(cfg: TrainConfig, make_env, model, tokenizer, iteration: int) -> dict[str, float]:
    """Success on the fixed held-out task set, one episode per task, each ended at ``env.eval_max_steps`` if the
    environment has not ended it: greedy, then sampled.

    ``eval_success`` (greedy) is the success curve of docs/experiments.md#the-metrics. ``eval_sampled_success`` samples at
    ``policy.temperature`` from a generator seeded by the run seed and the iteration, so it is the
    same in a resumed run: it is the policy RL actually trains, and a small policy's greedy
    success can lag it, because one wrong argmax in a state the policy revisits loops to the cap.
    ``*_outcome`` is the mean episode reward (shop's partial credit under ``reward=score``; the
    success rate again for 0/1 rewards). ``time_eval``: the seconds both took.
    """
    t0 = time.perf_counter()
    seeds = [cfg.env.eval_seed_offset + k for k in range(cfg.env.eval_tasks)]
    out = {}
    for name, temperature, generator in (("eval", 0.0, None),
                                         ("eval_sampled", cfg.policy.temperature, _generator(cfg.seed, iteration, "eval"))):
        ro = policy_rollout(cfg, make_env, model, tokenizer, seeds, group_size=1, temperature=temperature,
                            generator=generator, max_steps=cfg.env.eval_max_steps)
        steps = sum(e.steps for e in ro.episodes)
        out.update({f"{name}_success": ro.success_rate,
                    f"{name}_outcome": sum(e.outcome for e in ro.episodes) / len(ro.episodes),
                    f"{name}_steps": steps / len(ro.episodes),
                    f"{name}_invalid": sum(e.invalid for e in ro.episodes) / max(1, steps)})
    return {**out, "time_eval": time.perf_counter() - t0}


def choice_mask(rows: Rows, mask: Tensor) -> Tensor:
    """bool [R, L]: the response tokens drawn among two or more options, within ``mask``, as the kind that
    made the rows records its choices (:meth:`oma.agent.kinds.PolicyKind.choice_mask`). The rest are
    forced: probability 1, entropy and gradient 0."""
    return rows_kind(rows).choice_mask(rows, mask)


def learning_signal(rows: Rows, scores: Tensor, mask: Tensor, adv: Tensor, logp_old: Tensor, entropy: Tensor,
                    logp_ref: Tensor | None) -> dict[str, float | None]:
    """What RL has to work with in this batch (docs/training.md#metrics).

    * ``zero_spread_groups``: share of groups whose trajectories all have the same score (``scores``,
      the ones the advantages compared), or that have one trajectory: their episode-level advantage is
      0 by convention, they teach nothing.
    * ``adv_abs_mean``: mean |A| over rows.
    * ``entropy``: per-token entropy (nats) of the rollout policy's (constrained) distribution,
      mean over response tokens.
    * ``choice_tokens``, ``entropy_choices``: the share of response tokens that were choices
      (:func:`choice_mask`), and the same entropy's mean over them alone (None when there is none):
      forced tokens have entropy 0, so ``entropy`` is ``entropy_choices`` × ``choice_tokens``.
    * ``kl_warm_start``: k3 estimate of KL(π_rollout ‖ π_warm-start), mean over response tokens
      (samples from the rollout policy); absent when no warm-start copy is kept.
    """
    n_tokens = max(1, int(mask.sum()))
    stats = group_outcome_stats(scores, rows.group_index, rows.traj_index, accounting="trajectory")
    out = {"zero_spread_groups": float(stats.degenerate.float().mean()) if len(rows) else 0.0,
           "adv_abs_mean": float(adv.abs().mean()) if len(rows) else 0.0,
           "entropy": float((entropy * mask).sum()) / n_tokens}
    choices = choice_mask(rows, mask)
    n_choices = int(choices.sum())
    out["choice_tokens"] = n_choices / n_tokens
    out["entropy_choices"] = float((entropy * choices).sum()) / n_choices if n_choices else None
    if logp_ref is not None:
        out["kl_warm_start"] = float(kl_k3(logp_old, logp_ref, mask).sum()) / n_tokens
    return out


def rollout_metrics(ro: Rollout) -> dict[str, float | None]:
    """The rollout's statistics; a mean over an empty class (no successes yet) is None, JSON null."""
    eps = ro.episodes
    wins = [e for e in eps if e.won]
    fails = [e for e in eps if not e.won]

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    return {
        "success": ro.success_rate,
        "rows": len(ro.rows),
        "rows_per_traj": len(ro.rows) / len(eps),
        "rows_per_traj_success": mean([e.steps for e in wins]),
        "rows_per_traj_failure": mean([e.steps for e in fails]),
        "outcome_mean": mean([e.outcome for e in eps]),
        "invalid_rate": sum(e.invalid for e in eps) / max(1, len(ro.rows)),
        "generated_tokens": ro.generated_tokens,
    }


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl, or of its compressed ``metrics.jsonl.gz`` (empty when there is
    none yet)."""
    try:
        return read_jsonl(run_dir / "metrics.jsonl")
    except FileNotFoundError:
        return []


def _non_finite(record: dict, prefix: str = "") -> list[str]:
    """``key=value`` of every inf or NaN in ``record``, nested records (the warm start's) included."""
    out = []
    for k, v in record.items():
        if isinstance(v, dict):
            out += _non_finite(v, f"{prefix}{k}.")
        elif isinstance(v, float) and not math.isfinite(v):
            out.append(f"{prefix}{k}={v}")
    return out


class MetricsLog:
    """metrics.jsonl (one object per line, the source of truth) and, optionally, TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:  # tensorboard is optional; metrics.jsonl always exists
                self.tb = None

    def write(self, record: dict) -> None:
        """Append ``record``; FloatingPointError naming its inf or NaN values (a diverged run: strict JSON has none)."""
        bad = _non_finite(record)
        if bad:
            raise FloatingPointError(f"iteration {record['iteration']}: {', '.join(bad)}; the run diverged, lower optim.lr "
                                     "or check the rollouts' scores for inf/NaN")
        with self.path.open("a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")  # strict JSON: undefined values are null
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "iteration":
                    self.tb.add_scalar(k, v, record["iteration"])
            self.tb.flush()

    def read(self) -> list[dict]:
        return read_metrics(self.path.parent)


def trainable_policy(cfg: TrainConfig, make_env: Callable[[], object], progress: Progress | None = None):
    """(model, tokenizer, warm-start info): the warm start (:func:`build_policy`) in the form RL trains it,
    with LoRA adapters on every linear layer when ``policy.lora_r`` > 0, so a checkpoint loads into it."""
    model, tokenizer, ws_info = build_policy(cfg, make_env, progress)
    if cfg.policy.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.policy.lora_r, lora_alpha=cfg.policy.lora_alpha,
                                                 target_modules="all-linear", lora_dropout=0.0))
    return model, tokenizer, ws_info


def _check_resume_config(run_dir: Path, cfg: TrainConfig) -> None:
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"--resume: {run_dir} is not a run directory (no config.json); check out_dir")
    diff = config_diff(saved_config(run_dir), to_dict(cfg), ("iterations", "out_dir"))
    if diff:
        raise ConfigError(f"--resume: the config differs from the run's saved config.json in {', '.join(diff)}; "
                          "only `iterations` may change when resuming")
    saved = checkpoints(run_dir)
    trained = int(saved[0].name.removeprefix("iter_")) if saved else 0
    if cfg.iterations < trained:  # it would rewrite config.json to fewer iterations than its metrics hold
        raise ConfigError(f"--resume: iterations={cfg.iterations} is below the {trained} iterations {run_dir} has "
                          f"trained (its checkpoint {saved[0].name}); give iterations >= {trained}")


def keep_through(path: Path, iteration: int) -> None:
    """Keep the JSON lines of ``path`` whose ``iteration`` is at most ``iteration`` (a resumed run rewrites
    what came after its checkpoint). A last line cut short by a kill is dropped; a bad line before it is an error;
    a line repeating an iteration of ``metrics.jsonl`` (one record each) is dropped, the first kept."""
    if not path.is_file():
        return
    # the trainer writes ASCII (json.dumps escapes the rest): a byte that is not UTF-8 is damage, and its line fails below
    lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    keep = []
    seen: set[int] = set()
    one_each = path.name == "metrics.jsonl"  # samples.jsonl holds several episodes of an iteration
    for n, ln in enumerate(lines):
        try:
            record = json.loads(ln)
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break
            raise ConfigError(f"{path}: line {n + 1} is not JSON; the file was damaged, not just cut short") from None
        if not isinstance(record, dict) or type(record.get("iteration")) is not int:
            raise ConfigError(f"{path}: line {n + 1} is not a record with an integer iteration; the file was damaged")
        if record["iteration"] <= iteration and not (one_each and record["iteration"] in seen):
            keep.append(ln)
            seen.add(record["iteration"])
    atomic_write_text(path, "".join(ln + "\n" for ln in keep))


# ================================================================================================
# The loop
# ================================================================================================


def train(cfg: TrainConfig, run_dir: Path, *, resume: bool = False, console: Console | None = None) -> dict:
    """Run (or resume) RL training into ``run_dir``; return the summary. The folder is locked while it runs
    (:mod:`oma.train.lock`): a second process training into it is refused, naming this one."""
    t_start = time.perf_counter()
    new_env = make_env(cfg)  # new_env() is a fresh environment; a bad env.options is refused before any file is touched
    if resume:
        _check_resume_config(run_dir, cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    with held(run_dir):
        return _train(cfg, run_dir, resume, console or Console(), new_env, t_start)


def _train(cfg: TrainConfig, run_dir: Path, resume: bool, console: Console, new_env: Callable[[], object],
           t_start: float) -> dict:
    torch.set_num_threads(cfg.threads)

    # ---- 0. setup: run directory, policy (warm start), optimizer, resume -------------------------
    if resume:
        clean_debris(run_dir)  # under the lock: a live process's temporary files are not debris
    atomic_write_text(run_dir / "config.json", json.dumps(to_dict(cfg), indent=2))
    log = MetricsLog(run_dir, cfg.tensorboard)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=False)
    with progress:
        model, tokenizer, ws_info = trainable_policy(cfg, new_env, progress)
        # A frozen copy of the warm start: the KL penalty's reference, and the `kl_warm_start` diagnostic.
        ref_model = copy.deepcopy(model).eval() if cfg.algo.kl_coef > 0 or cfg.log_kl_warm_start else None
        optimizer = make_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
        ema = WeightAverage(model, cfg.optim.ema) if cfg.optim.ema else None
        pad_id = policy_kind(cfg).pad_id(tokenizer)
        start = 0
        before = 0.0  # the run's seconds up to where this invocation starts: its checkpoint's record, when resuming
        if resume:
            state = resume_from_checkpoint(run_dir, model, optimizer, warn=lambda m: console.print(f"warning: {m}"), ema=ema)
            start = state["iteration"]
            before = state.get("wall_time_s")  # None: a checkpoint saved before the record existed
            keep_through(log.path, start)
            keep_through(run_dir / "samples.jsonl", start)
            console.print(f"resumed from {state['path']} (iteration {start})")
        else:
            keep_through(log.path, -1)
            (run_dir / "samples.jsonl").unlink(missing_ok=True)
            log.write({"iteration": 0, **evaluate(cfg, new_env, model, tokenizer, 0), "warm_start": ws_info})

        options = host_options(cfg, run_dir)
        # at least twice per run, so a short run killed halfway can resume too
        checkpoint_every = min(cfg.checkpoint_every, max(1, cfg.iterations // 2))
        rl = progress.add_task("RL", total=cfg.iterations, completed=start)
        for it in range(start + 1, cfg.iterations + 1):
            # ---- 1. rollout: G tasks × n episodes, one row per step ------------------------------
            t0 = time.perf_counter()
            ro = training_rollout(cfg, new_env, model, tokenizer, it, _generator(cfg.seed, it, "rollout"))
            rows = ro.rows
            t_rollout = time.perf_counter() - t0

            # ---- 2. advantages (oma.hosts; Outcome Alignment via algo.accounting), old log-probs --
            t0 = time.perf_counter()
            scores = episode_scores(cfg, rows)
            mask = response_mask_of(rows)
            step = host_step(rows, scores, mask)
            adv = hosts.advantages(step, options)
            t_adv = time.perf_counter() - t0
            t0 = time.perf_counter()
            width = mask.shape[1]
            # logp_old: recorded while sampling (same model, same constrained distribution, same temperature)
            logp_old, entropy = per_token(rows.logp, width), per_token(rows.entropy, width)
            evaluating = evaluates(it, cfg.eval_every, cfg.iterations)
            need_ref = cfg.algo.kl_coef > 0 or (cfg.log_kl_warm_start and evaluating)
            logp_ref = (batch_logprobs(ref_model, rows, pad_id, cfg.optim.micro_batch_rows, width, cfg.policy.temperature)
                        if need_ref else None)
            t_logp_ref = time.perf_counter() - t0
            batch = Batch(rows, mask, adv, logp_old, logp_ref)

            # ---- 3. update (Mass Alignment via algo.mass; exact micro-batch accumulation) --------
            t0 = time.perf_counter()
            upd = update(model, optimizer, batch, cfg, pad_id, it, ema)
            t_update = time.perf_counter() - t0

            # ---- 4. evaluate, log, dump, checkpoint ---------------------------------------------
            record = {"iteration": it, **rollout_metrics(ro), **upd,
                      **learning_signal(rows, scores, mask, adv, logp_old, entropy, logp_ref),
                      **host_metrics(cfg, batch, step, options, it),
                      "time_rollout": t_rollout, "time_advantages": t_adv, "time_logp_ref": t_logp_ref,
                      "time_update": t_update,
                      "tokens_per_s": ro.generated_tokens / max(t_rollout, 1e-9),
                      "rows_per_s": len(rows) / max(t_rollout + t_adv + t_logp_ref + t_update, 1e-9)}
            if evaluating:
                with ema.swapped_in() if ema is not None else nullcontext():  # the policy the run delivers
                    record.update(evaluate(cfg, new_env, model, tokenizer, it))
            log.write(record)
            _write_samples(run_dir, it, ro, cfg.samples_per_iter)
            if options.dump_dir is not None:
                hosts.dump(step, options, it)
            if it % checkpoint_every == 0 or it == cfg.iterations:
                save_checkpoint(run_dir, it, model, optimizer,
                                {"config": to_dict(cfg), "wall_time_s": _run_time(before, time.perf_counter() - t_start)}, ema)
            progress.update(rl, advance=1, description=(
                f"RL it {it}: success {record['success']:.2f} rows/traj {record['rows_per_traj']:.1f} "
                f"entropy {record['entropy']:.2f}"
                + (f" (choices {record['entropy_choices']:.2f})" if record["entropy_choices"] is not None else "")
                + f" flat groups {record['zero_spread_groups']:.2f} "
                f"{record['rows_per_s']:.0f} rows/s"
                + (f" eval {record['eval_success']:.2f} (sampled {record['eval_sampled_success']:.2f})"
                   if "eval_success" in record else "")))

    invocation = time.perf_counter() - t_start
    summary = _summary(log.read(), _run_time(before, invocation), invocation, ws_info)
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    _print_summary(console, summary, run_dir)
    return summary


def _write_samples(run_dir: Path, iteration: int, ro: Rollout, k: int) -> None:
    with (run_dir / "samples.jsonl").open("a") as f:
        for e in ro.episodes[:k]:
            f.write(json.dumps({"iteration": iteration, "seed": e.seed, "won": e.won, "steps": e.steps,
                                "transcript": [{"obs": o, "action": a} for o, a in e.transcript]}) + "\n")


def _run_time(before: float | None, invocation: float) -> float | None:
    """The run's wall time so far: ``before`` (its seconds up to the checkpoint this invocation resumed
    from; 0 for a fresh run, None when unknown) plus ``invocation``, this invocation's seconds so far.
    Work redone after a kill is counted once: a killed invocation's seconds past its last checkpoint are
    not in that checkpoint's record."""
    return None if before is None else before + invocation


def _summary(records: list[dict], wall: float | None, invocation: float, ws_info: dict) -> dict:
    evals = [r for r in records if "eval_success" in r]
    out = {}
    for key in ("eval_success", "eval_sampled_success"):
        curve = [(r["iteration"], r[key]) for r in evals if key in r]
        out.update({f"{key}_start": curve[0][1] if curve else None, f"{key}_end": curve[-1][1] if curve else None,
                    f"{key}_best": max(v for _, v in curve) if curve else None})
    return {
        **out,
        "eval_curve": [(r["iteration"], r["eval_success"]) for r in evals],
        "iterations": max((r["iteration"] for r in records), default=0),
        "wall_time_s": wall,
        "wall_time_s_this_invocation": invocation,
        "warm_start_cached": ws_info.get("cached", False),
        "versions": library_versions(),
    }


def _print_summary(console: Console, s: dict, run_dir: Path) -> None:
    table = Table(title=f"oma train — {run_dir}")
    table.add_column("held-out success")
    table.add_column("greedy", justify="right")
    table.add_column("sampled", justify="right")

    def row(label: str, which: str) -> None:
        values = (s[f"eval_success_{which}"], s[f"eval_sampled_success_{which}"])
        table.add_row(label, *("—" if v is None else f"{v:.3f}" for v in values))

    row("after warm start (iteration 0)", "start")
    row(f"after RL (iteration {s['iterations']})", "end")
    row("best evaluation", "best")
    wall, invocation = s["wall_time_s"], s["wall_time_s_this_invocation"]
    table.add_row("wall time", "—" if wall is None else f"{wall:.0f} s",
                  "" if wall == invocation else f"{invocation:.0f} s in this invocation")
    console.print(table)
