"""A third-party algorithm brick in one file: REINFORCE with the group-mean baseline, no clipping.

pytest tests/contracts/test_algorithm_contract.py --brick examples.bricks.reinforce:Reinforce
"""

import numpy as np


class Reinforce:
    """Implements ``components.protocols.Algorithm``: A = r − mean(group), loss = −Σ w·A·logπ."""

    needs_reference_logprobs = False

    def advantages(self, rewards, group_ids):
        rewards = np.asarray(rewards, dtype=np.float64)
        _, group = np.unique(np.asarray(group_ids, dtype=str), return_inverse=True)
        means = np.bincount(group, weights=rewards) / np.bincount(group)
        return rewards - means[group]

    def sample_weights(self, num_sampled_tokens, trajectory_index):
        tokens_per_trajectory = np.bincount(trajectory_index, weights=num_sampled_tokens)
        num_trajectories = len(np.unique(trajectory_index))
        return 1.0 / (num_trajectories * np.maximum(tokens_per_trajectory[trajectory_index], 1.0))

    def loss(self, *, logprobs, old_logprobs, advantages, loss_mask, weights, **_unused):
        mask = loss_mask.to(logprobs.dtype)
        loss = -(advantages * logprobs * weights * mask).sum()
        return loss, {"num_tokens": float(mask.sum())}
