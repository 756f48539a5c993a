"""How a step's sampled tokens are weighted, shared by the algorithms that average per trajectory."""

from __future__ import annotations

import numpy as np


def trajectory_mean_weights(num_sampled_tokens: np.ndarray, trajectory_index: np.ndarray) -> np.ndarray:
    """1 / (trajectories · the trajectory's sampled tokens) per segment: each trajectory's loss is the mean over
    its sampled tokens (however many segments hold them), and trajectories are averaged."""
    num_sampled_tokens = np.asarray(num_sampled_tokens, dtype=np.float64)
    trajectory_index = np.asarray(trajectory_index, dtype=np.int64)
    if len(num_sampled_tokens) == 0:
        return np.zeros(0)
    num_trajectories = len(np.unique(trajectory_index))
    per_trajectory = np.bincount(trajectory_index, weights=num_sampled_tokens)
    return 1.0 / (num_trajectories * np.maximum(per_trajectory[trajectory_index], 1.0))
