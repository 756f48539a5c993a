"""Overlong responses (DAPO): a trajectory cut off by the context window (status ``context_overflow``) or longer
than ``max_sampled_tokens`` sampled tokens is *overlong*. Its reward says little about the answer it never
finished, so the step either trains on it as it is (``keep``), leaves it out of the loss (``mask``: it still
counts in its group's baseline), or shapes every trajectory's reward with DAPO's soft length penalty
(``penalty``): 0 up to ``max_sampled_tokens − buffer_tokens`` sampled tokens, then falling linearly to
``−penalty`` at ``max_sampled_tokens``, and ``−penalty`` for an overlong trajectory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from components.config import option, require, require_non_negative, require_one_of
from components.trajectory import TrajectoryStatus

OverlongMode = Literal["keep", "mask", "penalty"]


@dataclass(kw_only=True, frozen=True)
class OverlongConfig:
    """What the step does with overlong (truncated) trajectories."""

    mode: OverlongMode = option(
        "keep",
        "overlong trajectories: keep (train as is), mask (no loss), penalty (soft length penalty)",
        flag="trainer-overlong-mode",
    )
    max_sampled_tokens: int = option(
        0,
        "a trajectory with more sampled tokens is overlong (0: only a context overflow is)",
        flag="trainer-overlong-max-sampled-tokens",
    )
    buffer_tokens: int = option(
        0,
        "penalty: the penalty ramps up over this many tokens below the maximum",
        flag="trainer-overlong-buffer-tokens",
    )
    penalty: float = option(
        1.0, "penalty: the reward subtracted from an overlong trajectory", flag="trainer-overlong-penalty"
    )

    def __post_init__(self) -> None:
        require_one_of(self.mode, "mode", ("keep", "mask", "penalty"))
        require_non_negative(self.max_sampled_tokens, "max_sampled_tokens")
        require(
            0 <= self.buffer_tokens <= self.max_sampled_tokens,
            "buffer_tokens",
            f"must be in [0, max_sampled_tokens = {self.max_sampled_tokens}], got {self.buffer_tokens!r}",
        )
        require_non_negative(self.penalty, "penalty")


def overlong_trajectories(
    config: OverlongConfig, statuses: np.ndarray, num_sampled: np.ndarray
) -> np.ndarray:
    """Per trajectory: cut off by the context window, or more than ``max_sampled_tokens`` sampled tokens."""
    overlong = np.asarray(statuses).astype(str) == TrajectoryStatus.CONTEXT_OVERFLOW.value
    if config.max_sampled_tokens:
        overlong |= np.asarray(num_sampled) > config.max_sampled_tokens
    return overlong


def length_penalty(config: OverlongConfig, overlong: np.ndarray, num_sampled: np.ndarray) -> np.ndarray:
    """DAPO's soft overlong punishment per trajectory (≤ 0; all zeros unless mode is ``penalty``)."""
    penalty = np.zeros(len(overlong))
    if config.mode != "penalty":
        return penalty
    if config.buffer_tokens:
        start = config.max_sampled_tokens - config.buffer_tokens
        ramp = np.clip((np.asarray(num_sampled, dtype=np.float64) - start) / config.buffer_tokens, 0.0, 1.0)
        penalty = -config.penalty * ramp
    return np.where(overlong, -config.penalty, penalty)
