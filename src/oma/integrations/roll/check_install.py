r"""``python -m oma.integrations.roll check-install [PATH]``: oma's ROLL hook checked against ROLL's own code
(docs/roll.md#checked-against-rolls-own-code).

PATH is a ROLL checkout, the folder that holds ``roll/``; without it, the parent of an importable ``roll``
package. The check imports that checkout's own modules (:mod:`oma.integrations._checkout`: its folder first
on ``sys.path``, ``ray`` and any module its imports need but the environment lacks stubbed for the check
only, all of it undone afterwards). Nothing imports ROLL before the command runs.

On a synthetic stepwise batch built as the checkout's ``DataProto`` (groups of episodes of uneven length,
string ids, ``sample_uuid`` as ``AgenticPipeline.run`` sets it), it runs ROLL's pipeline as
``AgenticPipeline.run`` does: ``compute_discounted_returns``, ``AgenticPipeline.adjust_batch`` (mode
``copy``: padding copies), ``compute_response_level_rewards``, ``compute_token_reward``,
``agentic_compute_advantage``. Then it compares

1. ROLL's ``advantages`` with oma's hook under ``accounting=row mass=native`` (``grpo``, ``reinforce``,
   ``gigpo``; ``reward_normalization.method`` ``mean_std`` and ``mean``): the worst \|Δ\| on the loss mask;
2. that ``install`` finds and wraps the checkout's ``agentic_compute_advantage``;
3. under Mass Alignment (``mass=uniform`` and ``group``, each ``loss_agg_mode``), the loss of
   :class:`oma.integrations.roll.worker.ActorWorker` on the checkout's agentic actor (its ``loss_func``: the
   carrier, then ROLL's own), micro-batch by micro-batch over the backward batches of the checkout's
   ``DataProto.make_iterator`` (shuffled, as ``ActorWorker.train_step``), with Σ W·ℓ(A), ℓ PPO-clip on a
   fixed table of log-probabilities: the worst \|Δ\| of the loss relative to Σ \|W·ℓ(A)\| (the advantages of
   a group sum to about 0, so the loss itself is small), and of the gradient relative to its largest entry.

Prints a table; exits 0 when everything passes, 1 when a comparison fails, 2 when PATH is no ROLL checkout
or its modules cannot be imported.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from oma.integrations._checkout import CheckoutError, import_from, isolated, quiet

OWN = ("roll",)
REQUIRED = ("roll/pipeline/agentic/agentic_pipeline.py", "roll/pipeline/agentic/utils.py", "roll/utils/functionals.py",
            "roll/distributed/scheduler/protocol.py", "roll/pipeline/agentic/agentic_config.py")
ADVANTAGE_TOL = 1e-6
"""Absolute, on advantages of order 1 (ROLL in float32, oma in float64; the scores are dyadic, exact in float32)."""
LOSS_TOL = 1e-5
"""Relative, the float32 advantages' rounding."""
GROUPS, EPISODES, LENGTH, GAMMA = 4, 3, 12, 0.5
"""Groups, episodes per group (3 or 4), padded length of a row (prompt and response), ``step_reward_gamma``."""
LAYOUTS = ((1, 2, 2), (2, 2, 1), (2, 1, 3))
"""(dp, per_device_train_batch_size, gradient_accumulation_steps): a backward batch of dp·per_device·GA rows."""



def find_checkout(path: str | Path | None) -> Path:
    if path is None:
        spec = importlib.util.find_spec("roll")
        if spec is None or not spec.origin:
            raise CheckoutError("no PATH given and no roll package is importable: pass a ROLL checkout (the folder with roll/)")
        root = Path(spec.origin).resolve().parent.parent
    else:
        root = Path(path).expanduser().resolve()
    missing = [rel for rel in REQUIRED if not (root / rel).is_file()]
    if missing:
        raise CheckoutError(f"{root}: not a ROLL checkout: expected {missing[0]}")
    return root


def _commit(root: Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown (no git)"


def rollout(m: Any, seed: int, estimator: str) -> Any:
    """A rollout as ROLL's step env manager returns it, as the checkout's ``DataProto``: one row per step,
    rewards dyadic (exact in float32); GiGPO's states named inside their group."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("traj_group_id", "traj_id", "step", "episode_scores", "step_scores",
                                             "state_hash", "response_mask", "scores", "attention_mask")}
    for g in range(GROUPS):
        gid = f"sokoban_{g}_0_{100 + g}"
        for e in range(EPISODES + g % 2):  # groups of 3 and 4 episodes: mass=group differs from uniform
            tid, steps, outcome = f"{gid}_{e}", int(rng.integers(1, 5)), float(rng.integers(0, 2))
            for k in range(steps):
                n = int(rng.integers(1, LENGTH - 2))
                mask = [1] * 2 + [0] * (LENGTH - 2)  # prompt tokens attended, not trained
                attn = [1] * (2 + n) + [0] * (LENGTH - 2 - n)
                for t in range(2, 2 + n):
                    mask[t] = 1 if t > 2 or rng.random() < 0.5 else 0
                mask[1], mask[0] = 0, 0
                mask[1 + n] = 1
                reward = float(rng.integers(-2, 3)) / 4
                score = [0.0] * LENGTH
                score[1 + n] = reward
                for key, value in (("traj_group_id", gid), ("traj_id", tid), ("step", k), ("episode_scores", outcome),
                                   ("step_scores", reward), ("state_hash", f"{gid}|{k}|{int(rng.integers(0, 2))}"),
                                   ("response_mask", mask), ("scores", score), ("attention_mask", attn)):
                    cols[key].append(value)
    rows = len(cols["traj_id"])
    attn = torch.tensor(cols["attention_mask"])
    tensors = {"response_mask": torch.tensor(cols["response_mask"]), "attention_mask": attn,
               "position_ids": (attn.cumsum(-1) - 1).clamp(min=0), "input_ids": torch.randint(5, 100, (rows, LENGTH)),
               "scores": torch.tensor(cols["scores"], dtype=torch.float32),
               "old_log_probs": torch.zeros(rows, LENGTH - 1), "ref_log_probs": torch.zeros(rows, LENGTH - 1)}
    non = {k: np.array(cols[k], dtype=object) for k in ("traj_group_id", "traj_id", "step", "episode_scores",
                                                        "step_scores", "state_hash")}
    non["sample_uuid"] = np.array([f"{t}_{i}" for i, t in enumerate(cols["traj_id"])], dtype=object)
    return m.protocol.DataProto.from_dict(tensors=tensors, non_tensors=non, meta_info={})


def pipeline_config(m: Any, estimator: str, method: str, layout: tuple[int, int, int], mode: str) -> Any:
    """The keys of ``AgenticConfig`` the functions read (a namespace: the real one needs a cluster's worth of
    fields), with the checkout's own ``RewardNormalizationConfig``."""
    dp, per_device, ga = layout
    with quiet():
        norm = m.config.RewardNormalizationConfig(grouping="traj_group_id", method=method)
    training = SimpleNamespace(per_device_train_batch_size=per_device, gradient_accumulation_steps=ga)
    return SimpleNamespace(
        adv_estimator=estimator, reward_normalization=norm, episode_reward_weight=1.0, step_reward_weight=1.0,
        step_reward_gamma=GAMMA, reward_clip=None, gamma=1.0, lambd=0.95, advantage_clip=None, whiten_advantages=False,
        whiten_rewards=False, kl_penalty="kl", add_token_level_kl=False, batch_adjust_mode="copy", loss_agg_mode=mode,
        actor_train=SimpleNamespace(training_args=training, infer_batch_size=1, worker_cls="oma.integrations.roll.worker.ActorWorker",
                                    strategy_args=SimpleNamespace(strategy_name="megatron_train"), apply_loss_scale=True),
        use_kl_loss=False, entropy_loss_coef=0, is_pure_opd=False, use_opd=False, reference_configs={})


def their_pipeline(m: Any, batch: Any, cfg: Any, dp: int, seed: int) -> Any:
    """``AgenticPipeline.run``'s steps up to the advantages, on the checkout's functions."""
    batch = m.utils.compute_discounted_returns(batch, cfg.adv_estimator, cfg.step_reward_gamma)
    owner = SimpleNamespace(pipeline_config=cfg, actor_train=SimpleNamespace(dp_size=dp))
    np.random.seed(seed)
    batch = m.pipeline.AgenticPipeline.adjust_batch(owner, batch, mode=cfg.batch_adjust_mode)
    batch, _ = m.utils.compute_response_level_rewards(batch=batch, pipeline_config=cfg)
    kl = SimpleNamespace(value=0.0, update=lambda **kw: None)
    batch, _ = m.functionals.compute_token_reward(batch, cfg, kl)
    return batch


def advantage_kwargs(cfg: Any) -> dict[str, Any]:
    return {"gamma": cfg.gamma, "lambd": cfg.lambd, "adv_estimator": cfg.adv_estimator,
            "advantage_clip": cfg.advantage_clip, "whiten_advantages": cfg.whiten_advantages,
            "whiten_rewards": cfg.whiten_rewards, "pipeline_config": cfg}


def compare_advantages(m: Any, estimator: str, method: str, seed: int) -> tuple[float, int, int]:
    from oma.integrations.roll import check_config, compute_advantage

    cfg = pipeline_config(m, estimator, method, (2, 2, 2), "seq-mean-token-mean")
    batch = their_pipeline(m, rollout(m, seed, estimator), cfg, 2, seed)
    theirs = m.utils.agentic_compute_advantage(data=copy.deepcopy(batch), **advantage_kwargs(cfg)).batch["advantages"]
    setup = check_config(_as_mapping(cfg), {"accounting": "row", "mass": "native"})
    ours = compute_advantage(batch, setup=setup, original=m.utils.agentic_compute_advantage, **advantage_kwargs(cfg))
    copies = len(batch) - len(set(batch.non_tensor_batch["sample_uuid"].tolist()))
    return float((ours.batch["advantages"].double() - theirs.double()).abs().max()), len(batch), copies


def _as_mapping(cfg: Any) -> dict[str, Any]:
    """The namespace as the keys check_config reads (the checkout's RewardNormalizationConfig as it resolved)."""
    norm = cfg.reward_normalization
    return {"adv_estimator": cfg.adv_estimator, "reward_normalization": {
        "grouping": norm.grouping, "method": norm.method, "norm_mean_type": norm.norm_mean_type,
        "norm_std_type": norm.norm_std_type}, "loss_agg_mode": cfg.loss_agg_mode, "gamma": cfg.gamma,
        "step_reward_weight": cfg.step_reward_weight, "episode_reward_weight": cfg.episode_reward_weight,
        "actor_train": {"worker_cls": cfg.actor_train.worker_cls,
                        "strategy_args": {"strategy_name": cfg.actor_train.strategy_args.strategy_name}}}


def ppo_clip(ratio: torch.Tensor, adv: torch.Tensor, clip: float = 0.2) -> torch.Tensor:
    """ROLL's ``loss_func`` policy term per token: −min(r·A, clip(r)·A)."""
    return -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)


def actor(m: Any, mode: str) -> Any:
    """oma's ``ActorWorker`` on the checkout's agentic actor, without a cluster: its ``loss_func`` as ROLL calls
    it, the model's log-probabilities handed in as ``output_tensor`` (the strategy's ``op_compute_log_probs``
    returns them as they are) and the old ones read from the batch (``enable_old_logprobs_recompute``)."""
    worker = object.__new__(m.worker.ActorWorker)
    worker.pipeline_config = SimpleNamespace(
        loss_agg_mode=mode, enable_old_logprobs_recompute=True, ratio_type="token", use_pg_clip_range=False,
        pg_clip=0.2, dual_clip_loss=False, train_infer_correction=SimpleNamespace(is_weight=SimpleNamespace(enabled=False)),
        use_kl_loss=False, kl_loss_coef=0.0, entropy_loss_coef=0.0)
    worker.strategy = SimpleNamespace(op_compute_log_probs=lambda logits, input_ids, attention_mask: logits)
    worker.get_old_log_probs_with_cache = lambda data, log_probs: data.batch["old_log_probs"]
    return worker


def compare_loss(m: Any, mass: str, mode: str, layout: tuple[int, int, int], seed: int) -> tuple[float, float]:
    """|Δ| between the loss oma's ``ActorWorker.loss_func`` (the checkout's ``loss_func`` after
    :func:`~oma.integrations.roll.batch.carry`) makes over the step's micro-batches and Σ W·ℓ(A) with oma's
    weights, relative to Σ |W·ℓ(A)|; and of their gradients in the log-probabilities, relative to the largest."""
    from oma.integrations.roll import check_config, compute_advantage
    from oma.integrations.roll.batch import ADV_KEY, WEIGHTS_KEY

    dp, per_device, ga = layout
    cfg = pipeline_config(m, "grpo", "mean_std", layout, mode)
    batch = their_pipeline(m, rollout(m, seed, "grpo"), cfg, dp, seed)
    setup = check_config(_as_mapping(cfg), {"accounting": "trajectory", "mass": mass})
    batch = compute_advantage(batch, setup=setup, original=m.utils.agentic_compute_advantage, **advantage_kwargs(cfg))
    rows = len(batch)
    batch.batch["row"] = torch.arange(rows)
    batch.batch["train_infer_is_weight"] = torch.ones(rows, LENGTH - 1)
    batch.meta_info["loss_mask_keys"] = ["response_mask"]
    logp = (torch.randn(rows, LENGTH - 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 0.3)
    mask = batch.batch["response_mask"][:, 1:].double()
    backward_rows = dp * per_device * ga
    ours_leaf = logp.clone().requires_grad_()
    terms = batch.batch[WEIGHTS_KEY].double() / backward_rows * ppo_clip(ours_leaf.exp(), batch.batch[ADV_KEY].double()) * mask
    ours, scale = terms.sum(), float(terms.abs().sum())  # OA's advantages sum to ~0: compare to Σ|W·ℓ|
    ours.backward()
    theirs_leaf = logp.float().clone().requires_grad_()
    worker, theirs = actor(m, mode), torch.zeros((), dtype=torch.float64)
    for backward in batch.make_iterator(mini_batch_size=backward_rows, epochs=1, seed=seed, dataloader_kwargs={"shuffle": True}):
        bmask = backward.batch["response_mask"][:, 1:]
        # what the strategy's _get_batch_num_tokens / _get_global_valid_samples all-reduce over the ranks
        meta = {"batch_num_tokens": {"response_mask": max(int(bmask.sum()), 1)},
                "global_valid_samples": {"default": len(backward), "response_mask": int(bmask.any(-1).sum())}}
        for micro in backward.chunk(chunks=dp * ga):
            micro.meta_info = {**micro.meta_info, **meta}
            loss, _ = worker.loss_func(micro, theirs_leaf[micro.batch["row"]])
            theirs = theirs + loss.double() * (ga * dp) / ga / dp  # loss_scale, the mean over micro-batches, over ranks
    theirs.backward()
    grad_ours, grad_theirs = ours_leaf.grad, theirs_leaf.grad.double()
    value = abs(float(theirs) - float(ours)) / max(scale, 1e-12)
    grad = float((grad_theirs - grad_ours).abs().max()) / max(float(grad_ours.abs().max()), 1e-12)
    return value, grad


@contextlib.contextmanager
def _chdir(folder: str) -> Iterator[None]:
    """``contextlib.chdir``, which Python 3.10 lacks."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def install_hook(m: Any) -> None:
    """``install`` on the checkout's pipeline module (a copy of its namespace: the module itself is left alone)
    finds the functions it wraps."""
    from oma.integrations.roll import install

    cfg = pipeline_config(m, "grpo", "mean_std", LAYOUTS[0], "seq-mean-token-mean")
    module = SimpleNamespace(**vars(m.pipeline))
    with quiet():
        install({"accounting": "trajectory", "mass": "uniform"}, _as_mapping(cfg), module=module)
    wrapped = getattr(module.agentic_compute_advantage, "__wrapped_by_oma__", None)
    print(f"\ninstall(): wraps {m.pipeline.__name__}.agentic_compute_advantage "
          f"({'ok' if wrapped is m.pipeline.agentic_compute_advantage else 'FAIL'})")


def run(path: str | None) -> int:
    try:
        root = find_checkout(path)
        # ROLL's logger makes ./output/logs on import: the check leaves the caller's folder as it was
        with tempfile.TemporaryDirectory() as scratch, _chdir(scratch), isolated(root, OWN, {"ray": "no cluster: the check runs the driver's functions in this process"}) as stubs:
            m = SimpleNamespace(**{k: import_from(name, stubs, OWN, CheckoutError) for k, name in (
                ("protocol", "roll.distributed.scheduler.protocol"), ("functionals", "roll.utils.functionals"),
                ("utils", "roll.pipeline.agentic.utils"), ("config", "roll.pipeline.agentic.agentic_config"),
                ("pipeline", "roll.pipeline.agentic.agentic_pipeline"))})
            try:  # oma's actor subclasses the checkout's: imported here, dropped after
                m.worker = import_from("oma.integrations.roll.worker", stubs, OWN, CheckoutError)
                return _report(root, m, stubs)
            finally:
                sys.modules.pop("oma.integrations.roll.worker", None)
    except CheckoutError as exc:
        print(f"check-install: {exc}", file=sys.stderr)
        return 2


def _report(root: Path, m: Any, stubs: Any) -> int:
    torch.manual_seed(0)
    print(f"ROLL checkout {root} at commit {_commit(root)}")
    print(f"stubbed for the check: {', '.join(f'{k} ({v})' for k, v in stubs.names.items())}")
    failed = 0
    print("\nadvantages, accounting=row mass=native vs ROLL's agentic_compute_advantage (worst |Δ| over 3 seeds)")
    for estimator in ("grpo", "reinforce", "gigpo"):
        for method in ("mean_std", "mean"):
            with quiet():
                results = [compare_advantages(m, estimator, method, seed) for seed in range(3)]
            worst = max(r[0] for r in results)
            ok = worst <= ADVANTAGE_TOL
            failed += not ok
            print(f"  {estimator:9s} {method:8s} rows {'/'.join(str(r[1]) for r in results):12s} "
                  f"copies {'/'.join(str(r[2]) for r in results):8s} worst |Δ| {worst:.2e}  {'ok' if ok else 'FAIL'}")
    install_hook(m)
    print("\nloss, OMA on (accounting=trajectory): oma's ActorWorker.loss_func (ROLL's, after the carrier) over shuffled")
    print(f"backward and micro-batches vs Σ W·ℓ(A), value and gradient; layouts dp x per_device x GA: "
          f"{' '.join('x'.join(map(str, lo)) for lo in LAYOUTS)}")
    for mass in ("uniform", "group"):
        for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            with quiet():
                results = [compare_loss(m, mass, mode, layout, seed) for seed, layout in enumerate(LAYOUTS)]
            value, grad = max(r[0] for r in results), max(r[1] for r in results)
            ok = value <= LOSS_TOL and grad <= LOSS_TOL
            failed += not ok
            print(f"  mass={mass:8s} {mode:24s} worst rel |Δ| loss {value:.2e} gradient {grad:.2e}  {'ok' if ok else 'FAIL'}")
    print(f"\n{'all passed' if not failed else f'{failed} comparisons FAILED'}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oma.integrations.roll check-install")
    parser.add_argument("path", nargs="?", help="a ROLL checkout (the folder with roll/)")
    return run(parser.parse_args(argv).path)
