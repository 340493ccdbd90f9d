r"""``python -m oma.integrations.rllm check-install [PATH]``: oma's rLLM hook checked against rLLM's own code
(docs/rllm.md#checked-against-rllms-own-code).

PATH is an rLLM checkout (the folder that holds ``rllm/``); without it, the parent of the installed ``rllm``
package. The checkout's modules are imported with its folder first on ``sys.path``, ``ray`` and any module its
imports need but the environment lacks stubbed (the helpers of :mod:`oma.integrations.verl_agent.check_install`),
and all of it undone afterwards. verl is the installed one: rLLM pins verl 0.8.0, whose ``agg_loss`` the check
calls; verl 0.9.1's is the same function for the four modes rLLM's verl backend takes (0.9 adds ``token-sum``).

On a synthetic batch of rLLM ``Episode`` objects (tasks rolled out 4 times, trajectories of 1-4 steps whose
later steps either extend the running sequence or re-render it, so that rLLM merges some and splits others),
it runs rLLM's own pipeline: ``transform_episodes_to_dataproto``, ``_build_trajectory_groups``,
``collect_reward_and_advantage_from_trajectory_groups`` (GRPO with and without std, RLOO, REINFORCE),
``VerlBackend._pad_dataproto_to_world_size`` (on three layouts of data-parallel ranks, mini- and
micro-batches) and ``update_dataproto_with_advantages``, in the order ``UnifiedTrainer`` calls them. Then per estimator and ``loss_agg_mode`` it prints the worst

1. \|Δ\| between the ``advantages`` oma's hook writes under ``mass=native`` and rLLM's own;
2. \|Δ\| between oma's weights W under ``mass=native`` and verl's loss coefficient: d(loss)/d(ℓ) through
   verl's own ``agg_loss`` per micro-batch, with the engine's global token count, rLLM's
   ``global_batch_size`` and ``dp_size``, the ranks' gradients averaged;
3. under ``mass=uniform`` and ``group``: \|coef·A′ − W·A\| per token, verl's loss with the advantages A′ the
   hook writes against Σ W·ℓ(A) with oma's W.

Exits 0 when all pass, 1 when a comparison fails, 2 when PATH is no rLLM checkout or cannot be imported.
"""

from __future__ import annotations

import copy
import importlib.util
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from oma.integrations.rllm.batch import AGG_MODES, ActorLoss, align_batch
from oma.integrations._checkout import CheckoutError, import_from, isolated
from oma.integrations._checkout import quiet as _quiet

OWN = ("rllm",)
REQUIRED = ("rllm/trainer/verl/transform.py", "rllm/trainer/verl/verl_backend.py", "rllm/trainer/algorithms/advantage.py",
            "rllm/trainer/algorithms/transform.py", "rllm/types.py")
TOL = 1e-6
LSF = 64.0
ESTIMATORS = (("grpo", "grpo", True), ("grpo, no std", "grpo", False), ("rloo", "rloo", True),
              ("reinforce", "reinforce", True))
LAYOUTS = (  # dp, data.train_batch_size, ppo_mini_batch_size, micro-batch rows per rank
    (1, 3, 3, 2), (2, 3, 1, 1), (4, 3, 3, 3))
TASKS, ROLLOUTS = 3, 4


def find_checkout(path: str | Path | None) -> Path:
    if path is None:
        spec = importlib.util.find_spec("rllm")
        if spec is None or not spec.submodule_search_locations:
            raise CheckoutError("no rLLM checkout given and no rllm package installed: pass PATH, the folder that holds rllm/")
        path = Path(next(iter(spec.submodule_search_locations))).parent
    root = Path(path).resolve()
    missing = [r for r in REQUIRED if not (root / r).is_file()]
    if missing:
        raise CheckoutError(f"{root}: not an rLLM checkout: expected {missing[0]}")
    return root


def episodes(types: Any, model_output: Any, seed: int) -> list[Any]:
    """rLLM Episodes: TASKS tasks × ROLLOUTS rollouts, one ``solver`` trajectory each; a later step extends the
    running sequence (rLLM merges it) or, with probability 0.4, re-renders it (a new row)."""
    rng = random.Random(seed)
    out = []
    for t in range(TASKS):
        for k in range(ROLLOUTS):
            full = [rng.randrange(10, 99) for _ in range(rng.randint(1, 3))]
            steps = []
            for s in range(rng.randint(1, 4)):
                completion = [rng.randrange(10, 99) for _ in range(rng.randint(1, 3))]
                if s and rng.random() < 0.4:
                    full = [7, *full]
                prompt = full + [rng.randrange(10, 99) for _ in range(rng.randint(0, 2))] if s else full
                steps.append(types.Step(model_output=model_output(prompt_ids=list(prompt), completion_ids=completion,
                                                                  logprobs=[-0.5] * len(completion))))
                full = list(prompt) + completion
            traj = types.Trajectory(uid=f"traj-{t}-{k}", name="solver", steps=steps,
                                    reward=round(rng.uniform(-1, 2), 3) + 1e-3 * k)
            out.append(types.Episode(id=f"task{t}:{k}", trajectories=[traj]))
    return out


@dataclass
class Rllm:
    transform: Any
    groups: Any
    advantage: Any
    config: Any
    backend: Any
    agg_loss: Any


def load(stubs: Any) -> tuple[Rllm, Any, Any]:
    types = import_from("rllm.types", stubs, OWN, CheckoutError)
    model_output = import_from("rllm.engine.rollout.rollout_engine", stubs, OWN, CheckoutError).ModelOutput
    return (Rllm(import_from("rllm.trainer.verl.transform", stubs, OWN, CheckoutError),
                 import_from("rllm.trainer.algorithms.transform", stubs, OWN, CheckoutError)._build_trajectory_groups,
                 import_from("rllm.trainer.algorithms.advantage", stubs, OWN, CheckoutError),
                 import_from("rllm.trainer.algorithms.config", stubs, OWN, CheckoutError),
                 import_from("rllm.trainer.verl.verl_backend", stubs, OWN, CheckoutError).VerlBackend,
                 importlib.import_module("verl.trainer.ppo.core_algos").agg_loss), types, model_output)


def padded(r: Rllm, batch: Any, layout: tuple[int, int, int, int]) -> Any:
    """rLLM's own ``_pad_dataproto_to_world_size`` on a stand-in backend (its config and dp size)."""
    dp, train_batch_size, ppo_mbs, _ = layout
    fake = SimpleNamespace(config=SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(n=ROLLOUTS), actor=SimpleNamespace(ppo_mini_batch_size=ppo_mbs)),
        data=SimpleNamespace(train_batch_size=train_batch_size)))
    fake._get_aggregate_dp_size = lambda: dp
    fake._remove_padding = lambda b: r.backend._remove_padding(fake, b)
    return r.backend._pad_dataproto_to_world_size(fake, copy.deepcopy(batch))


def coefficients(r: Rllm, mask: torch.Tensor, mode: str, dp: int, mini: int, micro: int, gbs: int) -> torch.Tensor:
    """d(loss)/d(ℓ) of verl 0.8.0's engine actor over the step, through verl's own ``agg_loss``: ranks take
    contiguous chunks, mini-batches in order, each micro-batch's loss with the mini-batch's global token count,
    rLLM's ``global_batch_size`` and ``dp_size``; gradients summed over micro-batches, averaged over ranks."""
    ell = torch.ones(mask.shape, dtype=torch.float64, requires_grad=True)
    rows = mask.shape[0]
    per_rank, local = rows // dp, mini // dp
    total = torch.zeros((), dtype=torch.float64)
    for j in range(per_rank // local):
        ranks = [torch.arange(d * per_rank + j * local, d * per_rank + (j + 1) * local) for d in range(dp)]
        tokens = int(sum(int(mask[idx].sum()) for idx in ranks))
        for idx in ranks:
            for part in idx.split(micro):
                total = total + r.agg_loss(ell[part], mask[part].double(), mode, dp_size=dp, batch_num_tokens=tokens,
                                           global_batch_size=gbs, loss_scale_factor=LSF) / dp
    total.backward()
    return ell.grad


def columns(batch: Any) -> dict[str, Any]:
    return {**batch.non_tensor_batch, **{k: batch.batch[k] for k in ("response_mask", "advantages", "traj_rewards")}}


def compare(r: Rllm, types: Any, model_output: Any, seed: int) -> tuple[list[tuple[str, str, list[float]]], dict]:
    """Per estimator and mode: the worst deviations [advantages, native W, uniform, group] over the layouts;
    and rLLM's merge metrics of the batch."""
    out = []
    engine = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0), processor=None)
    for label, name, std in ESTIMATORS:
        eps = episodes(types, model_output, seed)
        with _quiet():
            batch = r.transform.transform_episodes_to_dataproto(eps, engine, 64, 128)
            merge = batch.meta_info.pop("merge_metrics", None) or {}
            cfg = r.config.AlgorithmConfig(estimator=r.config.rLLMAdvantageEstimator(name), norm_adv_by_std_in_grpo=std)
            r.advantage.collect_reward_and_advantage_from_trajectory_groups(r.groups(eps), cfg)
        steps = np.asarray(batch.non_tensor_batch["step_ids"])
        if len(set(steps.tolist())) == len(steps) or merge.get("batch/merge_compression_ratio", 1.0) <= 1.0:
            raise CheckoutError("the synthetic batch lacks a split or a merged trajectory; try another --seed")
        for mode in AGG_MODES:
            worst = [0.0, 0.0, 0.0, 0.0]
            for layout in LAYOUTS:
                with _quiet():  # rLLM's order: pad in process_backend_batch, then compute_advantages
                    b = r.transform.update_dataproto_with_advantages(padded(r, batch, layout), eps)
                m, gbs = b.meta_info["rllm_actor_mini_batch_size"], b.meta_info["rllm_actor_global_batch_size"]
                actor = ActorLoss(mini_batch_rows=m, global_batch_size=gbs, dp=layout[0], loss_agg_mode=mode,
                                  loss_scale_factor=LSF if mode == "seq-mean-token-sum-norm" else None)
                mask = b.batch["response_mask"]
                coef = coefficients(r, mask, mode, layout[0], m, layout[3], gbs)
                adv = b.batch["advantages"].double()
                native = align_batch(columns(b), {"mass": "native"}, actor=actor)
                worst[0] = max(worst[0], float((native.advantages.double() - adv).abs().max()))
                worst[1] = max(worst[1], float((native.weights - coef).abs().max()))
                for i, mass in ((2, "uniform"), (3, "group")):
                    res = align_batch(columns(b), {"mass": mass, "loss_scale_factor": LSF}, actor=actor)
                    worst[i] = max(worst[i], float((coef * res.advantages.double() - res.weights * adv).abs().max()))
            out.append((label, mode, worst))
    return out, merge


def _git(root: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"


def run(path: str | Path | None, *, seed: int = 0, out: Any = None) -> int:
    out = out or sys.stdout
    try:
        root = find_checkout(path)
        with isolated(root, OWN, {"ray": "no cluster: the check runs the backend's functions in this process"}) as stubs:
            r, types, model_output = load(stubs)
            rows, merge = compare(r, types, model_output, seed)
            stubbed = sorted(stubs.names)
    except CheckoutError as exc:
        print(f"check-install: {exc}", file=out)
        return 2
    verl = importlib.import_module("verl").__version__ if importlib.util.find_spec("verl") else "missing"
    print(f"rLLM checkout {root} ({_git(root)}); verl {verl} (agg_loss); stubbed: {', '.join(stubbed) or 'none'}", file=out)
    print(f"synthetic batch: {TASKS * ROLLOUTS} trajectories, rLLM's merge: rows per trajectory mean "
          f"{merge.get('batch/steps_per_traj/mean', 0):.2f} max {merge.get('batch/steps_per_traj/max', 0)}, agent steps per row "
          f"{merge.get('batch/merge_compression_ratio', 0):.2f}", file=out)
    print(f"seed {seed}; layouts (dp, train_batch_size, ppo_mini_batch_size, micro rows): {list(LAYOUTS)}", file=out)
    print(f"{'estimator':<14} {'loss_agg_mode':<24} {'adv native':>11} {'W native':>11} {'uniform':>11} {'group':>11}", file=out)
    failed = False
    for label, mode, worst in rows:
        bad = max(worst) > TOL
        failed |= bad
        print(f"{label:<14} {mode:<24} " + " ".join(f"{w:>11.2e}" for w in worst) + ("  FAIL" if bad else ""), file=out)
    print(f"{'FAIL' if failed else 'ok'}: worst |Δ| {max(max(w) for _, _, w in rows):.2e} (tolerance {TOL:g})", file=out)
    return 1 if failed else 0


def main(path: str | None = None, *, seed: int = 0) -> int:
    return run(path, seed=seed)
