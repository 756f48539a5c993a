"""GRPO as one ``Algorithm`` brick: group-relative advantages, per-trajectory sample weighting and the
clipped, importance-corrected token-level loss. Dr.GRPO (``dr_grpo.py``) is a config of the same brick
(``DrGRPOConfig``): no division by the group std and no length normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from components.config import option, require_non_negative, require_one_of, require_positive
from components.registry import ALGORITHMS
from components.training.algorithms.weighting import trajectory_mean_weights
from components.training.losses import ClippedPolicyGradient, PolicyLossConfig

if TYPE_CHECKING:
    from components.training.algorithms.gspo import GSPOConfig

SampleWeighting = Literal["trajectory", "token", "constant"]


@ALGORITHMS.register("grpo")
@dataclass(kw_only=True, frozen=True)
class GRPOConfig:
    """Group Relative Policy Optimisation."""

    normalize_advantages_by_std: bool = option(
        True, "divide (reward - group mean) by the group's sample std (+ std_epsilon); false: Dr.GRPO"
    )
    std_epsilon: float = option(1e-6, "added to the group std before dividing")
    # How a sampled token's loss is weighted in the step (every option gives each trajectory the same total
    # weight however many segments it was split into):
    #   "trajectory": each trajectory's loss is the mean over its sampled tokens, trajectories averaged
    #                 (GRPO); a segment's share is its share of its trajectory's sampled tokens.
    #   "token":      every sampled token in the step counts the same (DAPO token-level mean).
    #   "constant":   token losses summed per trajectory and divided by ``constant_normalizer_tokens``,
    #                 trajectories averaged (Dr.GRPO: no length normalisation).
    sample_weighting: SampleWeighting = option(
        "trajectory",
        "loss aggregation: trajectory (mean over each trajectory's tokens, trajectories averaged), token "
        "(every token of the step counts the same, DAPO), constant (sum over a trajectory / "
        "constant_normalizer_tokens, Dr.GRPO)",
    )
    constant_normalizer_tokens: int = option(1024, "the divisor of sample_weighting constant")
    loss: PolicyLossConfig = option(PolicyLossConfig(), "the clipped, importance-corrected loss")

    def __post_init__(self) -> None:
        require_non_negative(self.std_epsilon, "std_epsilon")
        require_one_of(self.sample_weighting, "sample_weighting", ("trajectory", "token", "constant"))
        require_positive(self.constant_normalizer_tokens, "constant_normalizer_tokens")

    def build(self) -> GRPO:
        """The GRPO brick with this config."""
        return GRPO(self)


def group_relative_advantages(
    rewards: np.ndarray, group_ids: Sequence[str], *, normalize_by_std: bool, std_epsilon: float
) -> np.ndarray:
    """reward − group mean (÷ (group sample std + ε) when asked); a group of one gets advantage 0."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if len(rewards) != len(group_ids):
        raise ValueError(f"group_ids: has {len(group_ids)} entries for {len(rewards)} rewards")
    _, group_index = np.unique(np.asarray(group_ids, dtype=object).astype(str), return_inverse=True)
    num_groups = int(group_index.max()) + 1 if len(rewards) else 0
    counts = np.bincount(group_index, minlength=num_groups).astype(np.float64)
    means = np.bincount(group_index, weights=rewards, minlength=num_groups) / np.maximum(counts, 1)
    centred = rewards - means[group_index]
    if not normalize_by_std:
        return centred
    squares = np.bincount(group_index, weights=centred**2, minlength=num_groups)
    std = np.sqrt(squares / np.maximum(counts - 1, 1))
    return centred / (std[group_index] + std_epsilon)


class GroupRelativeAdvantages:
    """``Algorithm.advantages`` from a config with ``normalize_advantages_by_std`` and ``std_epsilon`` (GRPO's
    and GSPO's)."""

    config: GRPOConfig | GSPOConfig

    def advantages(self, rewards: np.ndarray, group_ids: Sequence[str]) -> np.ndarray:
        """Per-trajectory group-relative advantages."""
        return group_relative_advantages(
            rewards,
            group_ids,
            normalize_by_std=self.config.normalize_advantages_by_std,
            std_epsilon=self.config.std_epsilon,
        )


class GRPO(GroupRelativeAdvantages, ClippedPolicyGradient):
    """GRPO (and Dr.GRPO, by config): implements ``components.protocols.Algorithm``."""

    def __init__(self, config: GRPOConfig | None = None) -> None:
        self.config = config or GRPOConfig()
        self.loss_config = self.config.loss

    def sample_weights(self, num_sampled_tokens: np.ndarray, trajectory_index: np.ndarray) -> np.ndarray:
        """Per-segment weight of each of its sampled tokens; the step loss is Σ weight·token loss."""
        num_sampled_tokens = np.asarray(num_sampled_tokens, dtype=np.float64)
        trajectory_index = np.asarray(trajectory_index, dtype=np.int64)
        if len(num_sampled_tokens) == 0:
            return np.zeros(0)
        num_trajectories = len(np.unique(trajectory_index))
        if self.config.sample_weighting == "token":
            return np.full(len(num_sampled_tokens), 1.0 / max(num_sampled_tokens.sum(), 1.0))
        if self.config.sample_weighting == "constant":
            return np.full(
                len(num_sampled_tokens), 1.0 / (num_trajectories * self.config.constant_normalizer_tokens)
            )
        return trajectory_mean_weights(num_sampled_tokens, trajectory_index)
