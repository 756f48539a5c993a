"""Token-level policy-gradient loss with PPO-style clip-higher, truncated importance sampling against the
rollout policy, and an optional KL penalty to a reference policy.

Three policies meet here (the "decoupled" PPO objective used by slime's TIS and verl's rollout correction):
- the *behaviour* policy that sampled the tokens (the engine; its logprobs are ``old_logprobs``),
- the *proximal* policy: the trainer's weights before this step's update (``proximal_logprobs``; when not
  given, the current logprobs detached - exact when the step makes one optimizer update),
- the current policy being optimised (``logprobs``, with gradient).

PPO clipping bounds the current/proximal ratio - per token (PPO, GRPO), or per sequence (GSPO: the
length-normalised ratio exp(mean_t log r_t), so that a whole sequence is in or out of the trust region); the
proximal/behaviour ratio (engine-vs-trainer mismatch, staleness) is corrected with a truncated importance
weight, per token or per sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from components.config import option, require, require_non_negative, require_one_of, require_positive

ImportanceSamplingLevel = Literal["token", "sequence", "none"]
RatioLevel = Literal["token", "sequence"]


@dataclass(kw_only=True, frozen=True)
class PolicyLossConfig:
    """The clipped, importance-corrected policy-gradient loss."""

    clip_low: float = option(0.2, "ratio floor 1 - clip_low")
    clip_high: float = option(
        0.28, "ratio ceiling 1 + clip_high ('clip-higher': > clip_low keeps exploration)"
    )
    importance_sampling: ImportanceSamplingLevel = option(
        "token", "truncated importance sampling against the rollout logprobs: per token, sequence or none"
    )
    importance_sampling_cap: float = option(2.0, "importance weights are truncated at this value")
    kl_coef: float = option(
        0.0, "weight of the k3 KL estimate to the reference policy (0: no reference model)"
    )
    ratio_level: RatioLevel = option("token", "the clipped ratio: per token, or per sequence (GSPO)")

    def __post_init__(self) -> None:
        require(0 <= self.clip_low < 1, "clip_low", f"must be in [0, 1), got {self.clip_low!r}")
        require_non_negative(self.clip_high, "clip_high")
        require_one_of(self.importance_sampling, "importance_sampling", ("token", "sequence", "none"))
        require_positive(self.importance_sampling_cap, "importance_sampling_cap")
        require_non_negative(self.kl_coef, "kl_coef")
        require_one_of(self.ratio_level, "ratio_level", ("token", "sequence"))


def per_sequence_sum(values: torch.Tensor, sequence_ids: torch.Tensor) -> torch.Tensor:
    """The sum of ``values`` over each sequence's tokens, broadcast back to its tokens."""
    sequence_ids = sequence_ids.long()
    num_sequences = int(sequence_ids.max().item()) + 1 if sequence_ids.numel() else 0
    sums = torch.zeros(num_sequences, dtype=values.dtype, device=values.device)
    return sums.index_add(0, sequence_ids, values)[sequence_ids]


def importance_weights(
    log_ratio: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    level: ImportanceSamplingLevel,
    cap: float,
    sequence_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Truncated IS weights min(exp(log_ratio), cap) per token, or per sequence (exp of the summed log ratio
    over the sequence's sampled tokens, broadcast to its tokens)."""
    if level == "none":
        return torch.ones_like(log_ratio)
    log_cap = math.log(cap)
    if level == "token":
        return torch.exp(torch.clamp(log_ratio, max=log_cap))
    if sequence_ids is None:
        raise ValueError("importance_sampling: 'sequence' needs sequence_ids for the tokens")
    return torch.exp(torch.clamp(per_sequence_sum(log_ratio * loss_mask, sequence_ids), max=log_cap))


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
    sequence's ratio broadcast to its tokens).

    Returns the weighted *sum* (weights already carry the step's normalisation, so micro-batch and rank
    losses add up to the step loss) and token statistics as sums over masked tokens (``*_sum`` keys) plus
    ``num_tokens``.
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
    is_weight = importance_weights(
        (proximal_logprobs - old_logprobs).detach(),
        mask,
        level=config.importance_sampling,
        cap=config.importance_sampling_cap,
        sequence_ids=sequence_ids,
    )
    token_loss = is_weight * pg_loss
    stats: dict[str, float] = {}
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        log_ref_ratio = ref_logprobs - logprobs
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0  # k3 estimator: unbiased, always >= 0
        token_loss = token_loss + config.kl_coef * kl
        stats["kl_sum"] = float((kl.detach() * mask).sum())
    loss = (token_loss * weights * mask).sum()
    with torch.no_grad():
        stats["pg_clip_fraction_sum"] = float(((clipped_loss > unclipped_loss).to(mask.dtype) * mask).sum())
        untruncated = importance_weights(
            (proximal_logprobs - old_logprobs).detach(),
            mask,
            level=config.importance_sampling,
            cap=math.inf,
            sequence_ids=sequence_ids,
        )
        stats["is_truncated_fraction_sum"] = float(((is_weight < untruncated).to(mask.dtype) * mask).sum())
        stats["is_weight_applied_sum"] = float((is_weight * mask).sum())
        stats["num_tokens"] = float(mask.sum())
    return loss, stats


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
