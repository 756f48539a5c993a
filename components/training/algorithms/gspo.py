"""GSPO (Group Sequence Policy Optimization, Zheng et al. 2025): GRPO's group-relative advantages, but the
importance ratio and its clipping are per *sequence*: s_i = exp(mean_t log(π(y_t)/π_old(y_t))) over the
sequence's sampled tokens (length-normalised, so long and short sequences have comparable ratios), and the
sequence's loss is max(−A_i·s_i, −A_i·clip(s_i, 1−ε_low, 1+ε_high)) — a whole sequence is in or out of the
trust region, which keeps MoE training stable where token ratios are noisy.

As in GRPO's loss here, the clipped ratio is current/proximal policy (the trainer's weights before the step),
and the engine-vs-trainer mismatch is corrected by a truncated importance weight (per sequence by default).
A sequence is one packed segment (``sequence_ids``); each sequence's loss is spread evenly over its sampled
tokens and weighted per trajectory, so the step loss is the mean over trajectories of their sequences' losses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from components.config import require, require_non_negative, require_one_of, require_positive
from components.training.algorithms.grpo import group_relative_advantages
from components.training.algorithms.weighting import trajectory_mean_weights
from components.training.losses import ImportanceSamplingLevel, importance_weights


@dataclass(kw_only=True, frozen=True)
class GSPOConfig:
    """GSPO: sequence-level ratio and clipping (the paper's clip range is ~1e-4 wide, not PPO's 0.2)."""

    clip_low: float = 3e-4  # sequence ratio floor 1 - clip_low
    clip_high: float = 4e-4  # sequence ratio ceiling 1 + clip_high
    normalize_advantages_by_std: bool = True
    std_epsilon: float = 1e-6
    importance_sampling: ImportanceSamplingLevel = "sequence"  # truncated IS against rollout logprobs
    importance_sampling_cap: float = 2.0
    kl_coef: float = 0.0  # k3 KL to a frozen reference policy, per token (0: no reference model)

    def __post_init__(self) -> None:
        require(0 <= self.clip_low < 1, "clip_low", f"must be in [0, 1), got {self.clip_low!r}")
        require_non_negative(self.clip_high, "clip_high")
        require_non_negative(self.std_epsilon, "std_epsilon")
        require_one_of(self.importance_sampling, "importance_sampling", ("token", "sequence", "none"))
        require_positive(self.importance_sampling_cap, "importance_sampling_cap")
        require_non_negative(self.kl_coef, "kl_coef")


def per_sequence_mean(values: torch.Tensor, mask: torch.Tensor, sequence_ids: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over each sequence's masked tokens, broadcast back to its tokens."""
    sequence_ids = sequence_ids.long()
    num_sequences = int(sequence_ids.max().item()) + 1 if sequence_ids.numel() else 0
    sums = torch.zeros(num_sequences, dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, sequence_ids, values * mask)
    counts = torch.zeros(num_sequences, dtype=values.dtype, device=values.device)
    counts = counts.index_add(0, sequence_ids, mask)
    return (sums / counts.clamp(min=1.0))[sequence_ids]


class GSPO:
    """Group Sequence Policy Optimization: implements ``components.protocols.Algorithm``."""

    def __init__(self, config: GSPOConfig | None = None) -> None:
        self.config = config or GSPOConfig()

    @property
    def needs_reference_logprobs(self) -> bool:
        return self.config.kl_coef > 0

    def advantages(self, rewards: np.ndarray, group_ids: Sequence[str]) -> np.ndarray:
        """Per-trajectory group-relative advantages (as GRPO)."""
        return group_relative_advantages(
            rewards,
            group_ids,
            normalize_by_std=self.config.normalize_advantages_by_std,
            std_epsilon=self.config.std_epsilon,
        )

    def sample_weights(self, num_sampled_tokens: np.ndarray, trajectory_index: np.ndarray) -> np.ndarray:
        """1 / (trajectories · the trajectory's sampled tokens): a sequence loss spread over its tokens sums
        back to one loss per trajectory, and trajectories are averaged."""
        return trajectory_mean_weights(num_sampled_tokens, trajectory_index)

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
        """Σ_t weights·mask·(IS·max(−A·s, −A·clip(s)) + β·KL), s the sequence ratio broadcast to its tokens."""
        if sequence_ids is None:
            raise ValueError("sequence_ids: GSPO needs each token's sequence (its ratio is per sequence)")
        config = self.config
        mask = loss_mask.to(logprobs.dtype)
        if proximal_logprobs is None:
            proximal_logprobs = logprobs.detach()
        sequence_ratio = torch.exp(per_sequence_mean(logprobs - proximal_logprobs, mask, sequence_ids))
        clipped_ratio = torch.clamp(sequence_ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
        unclipped_loss = -advantages * sequence_ratio
        clipped_loss = -advantages * clipped_ratio
        pg_loss = torch.maximum(unclipped_loss, clipped_loss)
        behaviour_log_ratio = (proximal_logprobs - old_logprobs).detach()
        is_weight = importance_weights(
            behaviour_log_ratio,
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
            kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
            token_loss = token_loss + config.kl_coef * kl
            stats["kl_sum"] = float((kl.detach() * mask).sum())
        loss = (token_loss * weights * mask).sum()
        with torch.no_grad():
            stats["pg_clip_fraction_sum"] = float(
                ((clipped_loss > unclipped_loss).to(mask.dtype) * mask).sum()
            )
            untruncated = importance_weights(
                behaviour_log_ratio,
                mask,
                level=config.importance_sampling,
                cap=math.inf,
                sequence_ids=sequence_ids,
            )
            stats["is_truncated_fraction_sum"] = float(
                ((is_weight < untruncated).to(mask.dtype) * mask).sum()
            )
            stats["is_weight_applied_sum"] = float((is_weight * mask).sum())
            stats["num_tokens"] = float(mask.sum())
        return loss, stats
