"""Partial groups: a GRPO group that lost members to infrastructure failures (``sandbox_error``, ``engine_error``,
``grading_error``: never the policy's doing, never trained) is trained with its survivors when at least
``min_group_size`` of them are left (the advantage is computed over the survivors only: ``plan_step`` sees
trainable members alone), else it is *short*: replaced by another group, up to ``max_replacements`` per step.
Past the cap a short group is trained with whatever survivors it has, so a step never waits for groups that
will not come. Sync mode replaces short groups in ``sample_step`` (``components/rollout/dynamic_sampling.py``),
the overlapped loop as each group commits (``components/run/overlapped.py``); both count them (``partial_groups/*``).
A group that lost members to the agent's own errors is not short: replacing it would hide a policy's failures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from components.config import option, require_non_negative
from components.trajectory import INFRASTRUCTURE_STATUSES, Trajectory

LOST_TO_INFRASTRUCTURE_DROP_REASON = "lost_to_infrastructure"


@dataclass(kw_only=True, frozen=True)
class PartialGroupConfig:
    """When a group that lost members to infrastructure failures is trained, and when it is replaced."""

    min_group_size: int = option(
        1,
        "a group that lost members to infrastructure failures is trained with its survivors when at least this "
        "many are left, else replaced by another group (0: always trained with what is left)",
    )
    max_replacements: int = option(
        4, "at most this many replacement groups per step; past it a short group trains with what it has"
    )

    def __post_init__(self) -> None:
        require_non_negative(self.min_group_size, "min_group_size")
        require_non_negative(self.max_replacements, "max_replacements")

    def is_short(self, members: Sequence[Trajectory]) -> bool:
        """The group lost members to infrastructure and fewer than ``min_group_size`` trainable ones are left."""
        return num_lost(members) > 0 and sum(t.trainable for t in members) < self.min_group_size


def num_lost(members: Sequence[Trajectory]) -> int:
    """The group's members lost to infrastructure failures."""
    return sum(t.status in INFRASTRUCTURE_STATUSES for t in members)


def partial_group_metrics(groups: Sequence[Sequence[Trajectory]], *, num_replaced: int) -> dict[str, float]:
    """Counts for monitoring over the groups a step trains, and the short groups replaced for it."""
    partial = [group for group in groups if num_lost(group) > 0]
    return {
        "partial_groups/trained_with_survivors": float(len(partial)),
        "partial_groups/members_lost": float(sum(num_lost(group) for group in partial)),
        "partial_groups/replaced": float(num_replaced),
    }
