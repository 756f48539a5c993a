"""Group rewards meet per-rollout rewards: ``verifiable × w + judge × w``, applied once a group is complete.

A ``GroupReward`` (e.g. ``RelativeJudge``) needs every member of a GRPO group, so it runs after the group's
rollouts are finalized and before they are committed to the store. Only trainable members are judged;
infrastructure failures pass through untouched. A group the judge could not score becomes ``grading_error``
(no reward, never trained), exactly like a verifiable grader that reached no verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from components.config import require, require_non_negative
from components.protocols import GroupReward, RewardResult, Sandbox, Task
from components.trajectory import Trajectory, TrajectoryStatus


@dataclass(frozen=True, kw_only=True)
class RewardWeights:
    """How the verifiable reward and the group reward add up (``verifiable=0``: the judge alone)."""

    verifiable: float = 1.0
    group: float = 1.0

    def __post_init__(self) -> None:
        require_non_negative(self.verifiable, "verifiable")
        require_non_negative(self.group, "group")
        require(self.verifiable + self.group > 0, "group", "the weights must not both be 0")


async def apply_group_reward(
    task: Task,
    trajectories: Sequence[Trajectory],
    group_reward: GroupReward,
    weights: RewardWeights,
) -> list[Trajectory]:
    """The group with its rewards combined (same order); untrainable members are returned as they were."""
    judged = [index for index, trajectory in enumerate(trajectories) if trajectory.trainable]
    results = await group_reward.score_group(task, [trajectories[index] for index in judged])
    require(len(results) == len(judged), "group_reward", "must return one result per trajectory")
    out = list(trajectories)
    for index, result in zip(judged, results, strict=True):
        trajectory = trajectories[index]
        log = f"{trajectory.log}\n=== group reward\n{result.log or result.error}".lstrip("\n")
        if result.reward is None:
            out[index] = dataclasses.replace(
                trajectory,
                status=TrajectoryStatus.GRADING_ERROR,
                failure_reason=f"group reward failed: {result.error}",
                reward=None,
                log=log,
            )
            continue
        verifiable = float(trajectory.reward)  # trainable → not None
        out[index] = dataclasses.replace(
            trajectory,
            reward=weights.verifiable * verifiable + weights.group * float(result.reward),
            metrics={
                **trajectory.metrics,
                "verifiable_reward": verifiable,
                "group_reward": float(result.reward),
            },
            log=log,
        )
    return out


class NoVerifiableReward:
    """The per-rollout ``Reward`` of a judge-only run: every finished rollout scores 0 (weight it 0)."""

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        return RewardResult(reward=0.0, log="no verifiable reward (judge only)")
