"""RLOO (REINFORCE leave-one-out, Ahmadian et al. 2024): each rollout's baseline is the mean reward of the
*other* rollouts of its group, A_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − mean_j r_j), an unbiased baseline
without a critic and without dividing by the group std. The loss is the same clipped, importance-corrected
token-level policy-gradient loss as GRPO's (one optimizer update per step makes it plain REINFORCE)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from components.config import option
from components.registry import ALGORITHMS
from components.training.algorithms.weighting import trajectory_mean_weights
from components.training.losses import ClippedPolicyGradient, PolicyLossConfig


@ALGORITHMS.register("rloo")
@dataclass(kw_only=True, frozen=True)
class RLOOConfig:
    """RLOO: leave-one-out baseline, per-trajectory token mean (each trajectory weighs the same)."""

    loss: PolicyLossConfig = option(PolicyLossConfig(), "the clipped, importance-corrected loss")

    def build(self) -> RLOO:
        """The RLOO brick with this config."""
        return RLOO(self)


def leave_one_out_advantages(rewards: np.ndarray, group_ids: Sequence[str]) -> np.ndarray:
    """r_i − (mean of the other rewards of i's group); a group of one gets advantage 0 (no baseline)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if len(rewards) != len(group_ids):
        raise ValueError(f"group_ids: has {len(group_ids)} entries for {len(rewards)} rewards")
    if len(rewards) == 0:
        return rewards
    _, group_index = np.unique(np.asarray(group_ids, dtype=object).astype(str), return_inverse=True)
    counts = np.bincount(group_index).astype(np.float64)
    sums = np.bincount(group_index, weights=rewards)
    others = counts[group_index] - 1
    baseline = (sums[group_index] - rewards) / np.maximum(others, 1)
    return np.where(others > 0, rewards - baseline, 0.0)


class RLOO(ClippedPolicyGradient):
    """REINFORCE leave-one-out: implements ``components.protocols.Algorithm``."""

    def __init__(self, config: RLOOConfig | None = None) -> None:
        self.config = config or RLOOConfig()
        self.loss_config = self.config.loss

    def advantages(self, rewards: np.ndarray, group_ids: Sequence[str]) -> np.ndarray:
        """Per-trajectory leave-one-out advantages."""
        return leave_one_out_advantages(rewards, group_ids)

    def sample_weights(self, num_sampled_tokens: np.ndarray, trajectory_index: np.ndarray) -> np.ndarray:
        """Each trajectory's loss is the mean over its sampled tokens; trajectories averaged."""
        return trajectory_mean_weights(num_sampled_tokens, trajectory_index)
