"""Turn-level credit for multi-turn agents: a harness or grader may give a reward per turn (a process reward,
``Segment.turn_rewards``) beside the trajectory's final reward, and each turn then gets its own advantage from
its discounted return instead of the trajectory's one advantage on every token.

A *turn* is one model call: one maximal run of sampled tokens (``loss_mask == 1``) in a segment, numbered in
segment order. With turn rewards r_0 … r_{K−1} (0 where none were given) and final reward R, turn k's return is

    G_k = Σ_{j=k}^{K−1} γ^{j−k} · w_turn · r_j  +  γ^{K−1−k} · w_final · R

(γ = ``discount``, w_turn = ``turn_reward_weight``, w_final = ``final_reward_weight``). The baseline is the
algorithm's own: its ``advantages`` run over the returns of the same turn index across the group (GRPO: G_k −
the mean of the group's k-th turns, ÷ their std), so turn k is compared with what the other rollouts of the
prompt did at their k-th turn (a turn-index anchor, a coarse form of GiGPO's step groups); a turn no other
rollout of its group reached gets advantage 0 from a group-relative algorithm. Off (``enabled`` false), the
step is GRPO's trajectory-level credit, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from components.config import require, require_non_negative
from components.protocols import Algorithm
from components.recipe_config import option
from components.trajectory import sampled_turn_starts


@dataclass(kw_only=True, frozen=True)
class TurnCreditConfig:
    """Per-turn advantages from per-turn (process) and final rewards."""

    enabled: bool = option(
        False,
        "advantages per turn from discounted returns (false: one per trajectory)",
        flag="trainer-turn-credit-enabled",
    )
    discount: float = option(
        1.0,
        "gamma: a turn's return counts later rewards discounted by gamma per turn",
        flag="trainer-turn-credit-discount",
    )
    turn_reward_weight: float = option(
        1.0,
        "weight of the per-turn (process) rewards in a turn's return",
        flag="trainer-turn-credit-turn-reward-weight",
    )
    final_reward_weight: float = option(
        1.0,
        "weight of the trajectory's final reward in a turn's return",
        flag="trainer-turn-credit-final-reward-weight",
    )

    def __post_init__(self) -> None:
        require(0.0 <= self.discount <= 1.0, "discount", f"must be in [0, 1], got {self.discount!r}")
        require_non_negative(self.turn_reward_weight, "turn_reward_weight")
        require_non_negative(self.final_reward_weight, "final_reward_weight")


def turn_returns(config: TurnCreditConfig, turn_rewards: np.ndarray, final_reward: float) -> np.ndarray:
    """G_k for every turn k (see the module docstring)."""
    rewards = config.turn_reward_weight * np.asarray(turn_rewards, dtype=np.float64)
    returns = np.zeros(len(rewards))
    if len(rewards) == 0:
        return returns
    returns[-1] = rewards[-1] + config.final_reward_weight * float(final_reward)  # G_{K-1}
    for k in range(len(rewards) - 2, -1, -1):
        returns[k] = rewards[k] + config.discount * returns[k + 1]  # G_k = r_k + γ·G_{k+1}
    return returns


def turn_advantages(
    config: TurnCreditConfig,
    algorithm: Algorithm,
    turn_rewards: Sequence[np.ndarray],
    final_rewards: np.ndarray,
    group_ids: Sequence[str],
) -> list[np.ndarray]:
    """Per trajectory, one advantage per turn: the algorithm's advantages over the returns of each (group,
    turn index)."""
    returns = [turn_returns(config, r, f) for r, f in zip(turn_rewards, final_rewards, strict=True)]
    flat = np.concatenate(returns) if returns else np.zeros(0)
    keys = [f"{group}#turn{k}" for group, g in zip(group_ids, returns, strict=True) for k in range(len(g))]
    advantages = np.asarray(algorithm.advantages(flat, keys), dtype=np.float64) if len(flat) else flat
    bounds = np.cumsum([0, *(len(g) for g in returns)])
    return [advantages[bounds[i] : bounds[i + 1]] for i in range(len(returns))]


def spread_over_turns(turn_values: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    """Each turn's value on its sampled tokens (0 elsewhere)."""
    mask = np.asarray(loss_mask) == 1
    values = np.asarray(turn_values, dtype=np.float32)
    is_start = np.zeros(len(mask), dtype=bool)
    is_start[sampled_turn_starts(mask)] = True
    assert int(is_start.sum()) == len(values), (int(is_start.sum()), len(values))
    if not len(values):
        return np.zeros(len(mask), np.float32)
    turn_of_token = np.maximum(np.cumsum(is_start) - 1, 0)
    return np.where(mask, values[turn_of_token], 0.0).astype(np.float32)
