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

from dataclasses import dataclass

import numpy as np

from components.config import option, require, require_non_negative
from components.registry import ALGORITHMS
from components.training.algorithms.grpo import GroupRelativeAdvantages
from components.training.algorithms.weighting import trajectory_mean_weights
from components.training.losses import ClippedPolicyGradient, PolicyLossConfig


def gspo_loss(**overrides) -> PolicyLossConfig:
    """The shared loss with GSPO's sequence-level ratio, its ~1e-4-wide clip range and sequence-level IS."""
    return PolicyLossConfig(
        **{"clip_low": 3e-4, "clip_high": 4e-4, "importance_sampling": "sequence", **overrides},
        ratio_level="sequence",
    )


@ALGORITHMS.register("gspo")
@dataclass(kw_only=True, frozen=True)
class GSPOConfig:
    """GSPO: sequence-level ratio and clipping (the paper's clip range is ~1e-4 wide, not PPO's 0.2)."""

    normalize_advantages_by_std: bool = option(True, "divide (reward - group mean) by the group's std")
    std_epsilon: float = option(1e-6, "added to the group std before dividing")
    loss: PolicyLossConfig = option(gspo_loss(), "the clipped policy-gradient loss (ratio_level sequence)")

    def __post_init__(self) -> None:
        require_non_negative(self.std_epsilon, "std_epsilon")
        require(self.loss.ratio_level == "sequence", "loss.ratio_level", "GSPO clips the sequence ratio")

    def build(self) -> GSPO:
        """The GSPO brick with this config."""
        return GSPO(self)


class GSPO(GroupRelativeAdvantages, ClippedPolicyGradient):
    """Group Sequence Policy Optimization: implements ``components.protocols.Algorithm`` (its loss is the shared
    clipped policy-gradient loss with the sequence-level ratio)."""

    def __init__(self, config: GSPOConfig | None = None) -> None:
        self.config = config or GSPOConfig()
        self.loss_config = self.config.loss

    def sample_weights(self, num_sampled_tokens: np.ndarray, trajectory_index: np.ndarray) -> np.ndarray:
        """1 / (trajectories · the trajectory's sampled tokens): a sequence loss spread over its tokens sums
        back to one loss per trajectory, and trajectories are averaged."""
        return trajectory_mean_weights(num_sampled_tokens, trajectory_index)
