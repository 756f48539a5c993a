"""Token-level policy-gradient loss with PPO-style clip-higher, truncated importance sampling against the
rollout policy, and an optional KL penalty to a reference policy.

Three policies meet here (the "decoupled" PPO objective used by slime's TIS and verl's rollout correction):
- the *behaviour* policy that sampled the tokens (the engine; its logprobs are ``old_logprobs``),
- the *proximal* policy: the trainer's weights before this step's update (``proximal_logprobs``; when not
  given, the current logprobs detached - exact when the step makes one optimizer update),
- the current policy being optimised (``logprobs``, with gradient).

PPO clipping bounds the current/proximal ratio - per token (PPO, GRPO), or per sequence (GSPO: the
length-normalised ratio exp(mean_t log r_t), so that a whole sequence is in or out of the trust region); the
proximal/behaviour ratio (engine-vs-trainer mismatch, staleness) is corrected by an importance weight: truncated,
masked, per token or per sequence, or IcePop (``components/training/mismatch.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from components.config import require, require_non_negative, require_one_of, require_positive
from components.recipe_config import option
from components.training.mismatch import CORRECTIONS, mismatch_correction, per_sequence_sum, rollout_kl

ImportanceSamplingLevel = Literal[
    "token", "sequence", "geometric", "token_mask", "sequence_mask", "icepop", "none"
]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclass(kw_only=True, frozen=True)
class PolicyLossConfig:
    """The clipped, importance-corrected policy-gradient loss."""

    clip_low: float = option(0.2, "PPO ratio floor is 1 - clip_low")
    clip_high: float = option(
        0.28, "PPO ratio ceiling is 1 + clip_high ('clip-higher': above clip_low keeps exploration)"
    )
    importance_sampling: ImportanceSamplingLevel = option(
        "token",
        "rollout-vs-trainer mismatch correction (components/training/mismatch.py): token (truncated IS), "
        "sequence (truncated product), geometric (truncated geometric-mean sequence IS), token_mask / "
        "sequence_mask (masked IS: outside [floor, cap] dropped), icepop, none",
    )
    importance_sampling_cap: float = option(
        2.0, "IS weights are truncated at this value (token, sequence, geometric); the mask ceiling (*_mask)"
    )
    importance_sampling_floor: float = option(
        0.0, "masked IS (token_mask, sequence_mask): ratios below this are dropped (0: no floor)"
    )
    icepop_low: float = option(0.5, "IcePop: tokens whose trainer/rollout ratio is below this are dropped")
    icepop_high: float = option(5.0, "IcePop: tokens whose trainer/rollout ratio is above this are dropped")
    kl_coef: float = option(
        0.0, "weight of the KL penalty to the frozen reference policy (0: no reference model)"
    )
    kl_estimator: KLEstimator = option(
        "k3", "per-token KL estimate: k1 (log ratio), k2 (half squared log ratio), k3 (unbiased, >= 0)"
    )
    ratio_level: RatioLevel = option("token", "the clipped ratio: per token, or per sequence (GSPO)")

    def __post_init__(self) -> None:
        require(0 <= self.clip_low < 1, "clip_low", f"must be in [0, 1), got {self.clip_low!r}")
        require_non_negative(self.clip_high, "clip_high")
        require_one_of(self.importance_sampling, "importance_sampling", tuple(CORRECTIONS))
        require_positive(self.importance_sampling_cap, "importance_sampling_cap")
        require(
            0 <= self.importance_sampling_floor < self.importance_sampling_cap,
            "importance_sampling_floor",
            f"must be in [0, importance_sampling_cap), got {self.importance_sampling_floor!r}",
        )
        require_positive(self.icepop_low, "icepop_low")
        require(
            self.icepop_high > self.icepop_low,
            "icepop_high",
            f"must be > icepop_low ({self.icepop_low!r}), got {self.icepop_high!r}",
        )
        require_non_negative(self.kl_coef, "kl_coef")
        require_one_of(self.kl_estimator, "kl_estimator", ("k1", "k2", "k3"))
        require_one_of(self.ratio_level, "ratio_level", ("token", "sequence"))


def importance_weights(
    log_ratio: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    level: ImportanceSamplingLevel,
    cap: float,
    sequence_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The IS weights of correction ``level`` with cap ``cap`` (the other bands at their defaults)."""
    config = PolicyLossConfig(importance_sampling=level, importance_sampling_cap=cap)
    return mismatch_correction(config, log_ratio, loss_mask, sequence_ids).weights


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from tokens π sampled: k1 = log π − log π_ref, k2 = ½ k1²,
    k3 = π_ref/π − 1 − log(π_ref/π) (Schulman's estimators)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    return torch.expm1(-log_ratio) + log_ratio


def policy_gradient_loss(
    config: PolicyLossConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    weights: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    proximal_logprobs: torch.Tensor | None = None,
    sequence_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ_t weights·mask·(IS·max(-A·r, -A·clip(r)) + β·KL) over 1-D per-token tensors (r per token, or the
    sequence's ratio broadcast to its tokens; IS from the configured mismatch correction).

    Returns the weighted *sum* (weights already carry the step's normalisation, so micro-batch and rank
    losses add up to the step loss) and token statistics as sums over masked tokens (``*_sum`` keys) plus
    ``num_tokens``: the clipped, IS-truncated and IS-masked token counts, and the rollout-vs-trainer KL
    (``rollout_kl_k1_sum``, ``rollout_kl_k3_sum``).
    """
    mask = loss_mask.to(logprobs.dtype)
    if proximal_logprobs is None:
        proximal_logprobs = logprobs.detach()
    log_ratio = logprobs - proximal_logprobs
    if config.ratio_level == "sequence":
        if sequence_ids is None:
            raise ValueError("sequence_ids: a sequence-level ratio (GSPO) needs each token's sequence")
        # exp(mean over the sequence's sampled tokens): long and short sequences get comparable ratios
        num_tokens = per_sequence_sum(mask, sequence_ids).clamp(min=1.0)
        log_ratio = per_sequence_sum(log_ratio * mask, sequence_ids) / num_tokens
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * clipped_ratio
    pg_loss = torch.maximum(unclipped_loss, clipped_loss)
    rollout_log_ratio = (proximal_logprobs - old_logprobs).detach()
    correction = mismatch_correction(config, rollout_log_ratio, mask, sequence_ids)
    token_loss = correction.weights * pg_loss
    stats: dict[str, float] = {}
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_estimate(logprobs, ref_logprobs, config.kl_estimator)
        token_loss = token_loss + config.kl_coef * kl
        stats["kl_sum"] = float((kl.detach() * mask).sum())
    loss = (token_loss * weights * mask).sum()
    with torch.no_grad():
        stats["pg_clip_fraction_sum"] = float(((clipped_loss > unclipped_loss).to(mask.dtype) * mask).sum())
        stats["is_truncated_fraction_sum"] = correction.num_truncated
        stats["is_masked_fraction_sum"] = correction.num_masked
        stats["is_weight_applied_sum"] = float((correction.weights * mask).sum())
        stats["rollout_kl_k1_sum"], stats["rollout_kl_k3_sum"] = rollout_kl(rollout_log_ratio, mask)
        stats["num_tokens"] = float(mask.sum())
    return loss, stats


def entropy_bonus(
    entropy: torch.Tensor, *, weights: torch.Tensor, loss_mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """−coef·Σ_t weights·mask·entropy: added to the loss, a positive ``coef`` rewards a spread-out policy."""
    return -coef * (entropy * weights * loss_mask.to(entropy.dtype)).sum()


class ClippedPolicyGradient:
    """An ``Algorithm``'s ``loss`` and ``needs_reference_logprobs`` from its ``PolicyLossConfig`` (``loss_config``):
    the one loss that GRPO, Dr.GRPO, RLOO (token ratio) and GSPO (sequence ratio) share."""

    loss_config: PolicyLossConfig

    @property
    def needs_reference_logprobs(self) -> bool:
        return self.loss_config.kl_coef > 0

    def loss(
        self,
        *,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        weights: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        proximal_logprobs: torch.Tensor | None = None,
        sequence_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped, importance-corrected policy-gradient loss (see ``policy_gradient_loss``)."""
        return policy_gradient_loss(
            self.loss_config,
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=advantages,
            loss_mask=loss_mask,
            weights=weights,
            ref_logprobs=ref_logprobs,
            proximal_logprobs=proximal_logprobs,
            sequence_ids=sequence_ids,
        )
