r"""Per-token objectives ℓ[R, L] of the optimizers OMA wraps (docs/math.md#token-objectives-unchanged-by-oma).

OMA never changes these: importance ratios, clipping and credit assignment stay the optimizer's
own. They are per-token values; the scalar is made in one place, :func:`oma.core.weighted_loss`,
with the weights of :func:`oma.core.token_weights`. Masked tokens (``response_mask`` False) get
ℓ = 0 and zero gradient, whatever the inputs hold there (padding log-probs may be -inf).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from oma.core.validate import check_finite_where, check_float, check_mask, check_option, check_same_device

Objective = Literal["ppo", "gspo"]
r"""Token objective.

* ``"ppo"``: PPO-clip with asymmetric ("clip-higher") bounds (Schulman et al. 2017; DAPO, Yu et al.
  2025, arXiv 2503.14476), as GRPO uses it: $ℓ = −\min(ρA, \operatorname{clip}(ρ, 1−ε_\text{low}, 1+ε_\text{high})A)$ with
  token ratio $ρ = \exp(\log p − \log p_\text{old})$. Bias: long responses' many tokens each carry a ratio,
  so clipping acts token by token.
* ``"gspo"``: GSPO-token (Zheng et al. 2025, arXiv 2507.18071): one sequence ratio per row,
  $s_r = \exp(\operatorname{mean}_t(\log p − \log p_\text{old}))$, used at every token as $\tilde ρ = \operatorname{sg}(s_r)\exp(\log p − \operatorname{sg}(\log p))$,
  so the value is sequence-level while each token keeps its own gradient path. The GSPO paper
  uses much tighter clip bounds ($ε ≈$ 3e-4 / 4e-4) than PPO.
"""

OBJECTIVES: tuple[str, ...] = get_args(Objective)

# verl clamps log-ratios before exp for stability (core_algos.compute_policy_loss_vanilla: ±20,
# compute_policy_loss_gspo: ≤ 10); we do the same so baseline losses match verl token for token.
_PPO_LOG_RATIO_CLAMP = 20.0
_GSPO_LOG_RATIO_MAX = 10.0


def _check_objective_inputs(logp: Tensor, logp_old: Tensor, advantages: Tensor, response_mask: Tensor) -> Tensor:
    response_mask = check_mask("response_mask", response_mask)
    shape = tuple(response_mask.shape)
    check_float("logp", logp, shape, finite=False)
    check_float("logp_old", logp_old, shape, finite=False)
    advantages = check_float("advantages", advantages, finite=False)
    if tuple(advantages.shape) == shape[:1]:
        advantages = advantages.unsqueeze(-1)
    elif tuple(advantages.shape) != shape:
        raise ValueError(f"advantages must have shape [R]={shape[:1]} or [R, L]={shape}, got {tuple(advantages.shape)}")
    check_same_device(logp=logp, logp_old=logp_old, advantages=advantages, response_mask=response_mask)
    for name, t in (("logp", logp), ("logp_old", logp_old), ("advantages", advantages)):
        check_finite_where(name, t, response_mask)
    return advantages


def token_objective(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    objective: Objective = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float | None = None,
) -> Tensor:
    r"""Per-token policy loss ℓ[R, L] (to be minimised), docs/math.md#token-objectives-unchanged-by-oma.

    * ``ppo``: $ρ = \exp(\log p − \log p_\text{old})$, $ℓ = −\min(ρA, \operatorname{clip}(ρ, 1−ε_\text{low}, 1+ε_\text{high})A)$.
    * ``gspo``: $s_r = \exp(\operatorname{mean}_{t\ \text{valid}}(\log p − \log p_\text{old}))$,
      $\tilde ρ = \operatorname{sg}(s_r)\exp(\log p − \operatorname{sg}(\log p))$,
      $ℓ = −\min(\tilde ρ A, \operatorname{clip}(\tilde ρ, 1−ε_\text{low}, 1+ε_\text{high})A)$.

    Optional dual clip (Ye et al. 2020, arXiv 1912.09729; verl's ``clip_ratio_c``, default 3 there):
    for $A < 0$, $ℓ = \min(ℓ, −cA)$, bounding the loss of very large ratios.

    Special cases: a row with one valid token has $s_r = ρ$, so ``gspo`` equals ``ppo`` in value
    and gradient; with ``clip_ratio_c=3.0`` this equals verl's ``compute_policy_loss_vanilla`` /
    ``compute_policy_loss_gspo`` loss matrix. $ℓ$ is positively homogeneous in $A$: $ℓ(wA) = w\,ℓ(A)$ for
    $w > 0$, which is what lets Mass Alignment ride on the advantage inside verl.

    Args:
        logp: float [R, L], log-probs of the taken tokens under the current policy.
        logp_old: float [R, L], log-probs under the rollout (behaviour) policy.
        advantages: float [R] (one per row) or [R, L] (per token).
        response_mask: bool [R, L], True = trainable token.
        objective: ``"ppo"`` or ``"gspo"`` (see :data:`Objective`).
        clip_low: ε_low ≥ 0, < 1.
        clip_high: ε_high ≥ 0.
        clip_ratio_c: dual-clip bound c > 1, or None for none.

    Returns: ℓ, shape [R, L], 0 at masked tokens.
    """
    check_option("objective", objective, OBJECTIVES)
    advantages = _check_objective_inputs(logp, logp_old, advantages, response_mask)
    if not (0.0 <= clip_low < 1.0) or clip_high < 0.0:
        raise ValueError(f"clip_low must be in [0, 1) and clip_high >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None), got {clip_ratio_c}")
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    ratio = _ratio(logp, logp_old, response_mask, objective)
    loss = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))
    if clip_ratio_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_ratio_c), loss)
    return torch.where(response_mask, loss, zero)


def _ratio(logp: Tensor, logp_old: Tensor, response_mask: Tensor, objective: str) -> Tensor:
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Zero the log-ratio at masked tokens *before* exp so -inf padding never reaches a gradient.
    log_ratio = torch.where(response_mask, logp - logp_old, zero)
    if objective == "ppo":
        return torch.exp(log_ratio.clamp(-_PPO_LOG_RATIO_CLAMP, _PPO_LOG_RATIO_CLAMP))
    n_valid = response_mask.sum(-1, keepdim=True).clamp_min(1)
    seq_log_ratio = log_ratio.sum(-1, keepdim=True) / n_valid
    logp_safe = torch.where(response_mask, logp, zero)
    log_ratio_tilde = logp_safe - logp_safe.detach() + seq_log_ratio.detach()
    return torch.exp(log_ratio_tilde.clamp(max=_GSPO_LOG_RATIO_MAX))


def clipped_tokens(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    objective: Objective = "ppo",
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> Tensor:
    r"""bool [R, L]: the tokens whose objective term is clipped (zero gradient) in :func:`token_objective`.

    The ratio is the one the objective clips: the token ratio ρ under ``ppo``, the row's sequence
    ratio s_r under ``gspo`` (so under GSPO a row is clipped whole). A token is clipped when
    ρ > 1+ε_high with A > 0 or ρ < 1−ε_low with A < 0 (verl's ``pg_clipfrac`` counts the same
    tokens); its mean over ``response_mask`` is the clip fraction. Masked tokens are False.
    """
    check_option("objective", objective, OBJECTIVES)
    advantages = _check_objective_inputs(logp, logp_old, advantages, response_mask)
    with torch.no_grad():
        ratio = _ratio(logp, logp_old, response_mask, objective)
        clipped = ((ratio > 1.0 + clip_high) & (advantages > 0)) | ((ratio < 1.0 - clip_low) & (advantages < 0))
    return clipped & response_mask


def kl_k3(logp: Tensor, logp_ref: Tensor, response_mask: Tensor) -> Tensor:
    r"""Per-token k3 estimator of KL(π ‖ π_ref) (Schulman 2020, "Approximating KL divergence").

    k3 = exp(logp_ref − logp) − (logp_ref − logp) − 1 ≥ 0, unbiased for KL(π‖π_ref) under samples
    from π, low variance. As verl's ``kl_penalty(..., "low_var_kl")``: the log-ratio is clamped to
    ±20 and k3 to [−10, 10]. Returns float [R, L], 0 at masked tokens; multiply by β and aggregate
    with the same weights as the policy term.
    """
    response_mask = check_mask("response_mask", response_mask)
    shape = tuple(response_mask.shape)
    check_float("logp", logp, shape, finite=False)
    check_float("logp_ref", logp_ref, shape, finite=False)
    check_same_device(logp=logp, logp_ref=logp_ref, response_mask=response_mask)
    check_finite_where("logp", logp, response_mask)
    check_finite_where("logp_ref", logp_ref, response_mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    diff = torch.where(response_mask, logp_ref - logp, zero).clamp(-20.0, 20.0)
    k3 = (torch.exp(diff) - diff - 1.0).clamp(-10.0, 10.0)
    return torch.where(response_mask, k3, zero)


def token_entropy(logits: Tensor, response_mask: Tensor) -> Tensor:
    r"""Per-token entropy $H = −Σ_v p_v \log p_v$ of the policy's next-token distribution.

    Args: logits float [R, L, V]; response_mask bool [R, L]. Returns float [R, L], 0 at masked
    tokens. An entropy *bonus* enters the loss as −coef·H, aggregated with the policy weights.
    """
    response_mask = check_mask("response_mask", response_mask)
    logits = check_float("logits", logits, finite=False)
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(response_mask.shape):
        raise ValueError(f"logits must have shape [R, L, V] with [R, L]={tuple(response_mask.shape)}, got {tuple(logits.shape)}")
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return torch.where(response_mask, entropy, torch.zeros((), dtype=entropy.dtype, device=entropy.device))
