"""Dynamic sampling (DAPO): a group whose trainable members all got the same reward has advantage 0 everywhere
and teaches nothing, so it is dropped before training and another group is drawn in its place, up to a cap of
extra groups per step. Sync mode (``sample_step``) rolls the replacements out in rounds; the overlapped loop
(``components/run/overlapped.py``) asks ``is_informative`` of each group as it completes and draws another group instead.
Dropped groups are still written to the run's store (every rollout is kept); they just never reach the trainer:
the overlapped loop commits each group and records the dropped ones in its ledger, the sync step writes its left-out
groups (``SampledStep.left_out``) to the run's untrained store (``RUN_DIR/untrained/trajectories``), beside the
step's shard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from components.config import require_non_negative
from components.protocols import Task
from components.recipe_config import option
from components.rollout.partial_groups import PartialGroupConfig, partial_group_metrics
from components.trajectory import Trajectory

ZERO_VARIANCE_DROP_REASON = "zero_reward_variance"


@dataclass(kw_only=True, frozen=True)
class DynamicSamplingConfig:
    """Drop groups whose rewards are all equal and draw others in their place."""

    enabled: bool = option(False, "drop groups whose rewards are all equal and roll out others instead")
    max_extra_groups: int = option(
        8, "at most this many extra groups per step; past it the step trains on what it has"
    )

    def __post_init__(self) -> None:
        require_non_negative(self.max_extra_groups, "max_extra_groups")


def is_informative(members: Sequence[Trajectory]) -> bool:
    """Whether the group's trainable members got at least two different rewards (a non-zero advantage)."""
    rewards = {t.reward for t in members if t.trainable}
    return len(rewards) > 1


def split_groups(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories grouped by ``group_id``, in order of first appearance."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return list(groups.values())


@dataclass(kw_only=True)
class SampledStep:
    """A step's groups after dynamic sampling and partial-group replacement: those to train, those dropped,
    and the draw counts."""

    kept: list[list[Trajectory]] = field(default_factory=list)
    dropped: list[list[Trajectory]] = field(default_factory=list)  # equal rewards (dynamic sampling)
    short: list[list[Trajectory]] = field(
        default_factory=list
    )  # replaced: too few survivors (partial groups)
    num_extra_groups: int = 0  # groups rolled out beyond the step's own for dynamic sampling

    @property
    def trajectories(self) -> list[Trajectory]:
        """Every rollout of the step, kept or not (what the store records)."""
        return [t for group in (*self.kept, *self.dropped, *self.short) for t in group]

    @property
    def trained(self) -> list[Trajectory]:
        """The kept groups' rollouts; when none was kept, every rollout (a step's shard is never empty; groups
        with equal rewards just get advantage 0)."""
        return [t for group in self.kept for t in group] or self.trajectories

    @property
    def left_out(self) -> list[Trajectory]:
        """The rollouts ``trained`` leaves out (dropped and short groups), kept elsewhere with their reasons."""
        return [t for group in (*self.dropped, *self.short) for t in group] if self.kept else []

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/extra_groups": float(self.num_extra_groups),
            "dynamic_sampling/dropped_groups": float(len(self.dropped)),
            "dynamic_sampling/kept_groups": float(len(self.kept)),
        }

    def partial_group_metrics(self) -> dict[str, float]:
        return partial_group_metrics(self.kept, num_replaced=len(self.short))


RollOut = Callable[[Sequence[Task], int], Awaitable[list[Trajectory]]]


async def sample_step(
    config: DynamicSamplingConfig,
    roll_out: RollOut,
    tasks: Sequence[Task],
    replacement_tasks: Callable[[int], Sequence[Task]],
    *,
    partial: PartialGroupConfig | None = None,
) -> SampledStep:
    """Roll out ``tasks`` (``roll_out(tasks, first_index)``, one group each) and, in rounds, replace: a short
    group (``partial``, see ``components/rollout/partial_groups.py``) by a new group of its own task, while
    ``partial.max_replacements`` allow; an uninformative group (dynamic sampling, when enabled) by a group of
    ``replacement_tasks(round)`` (round 1, 2, ...) until the step has as many informative groups as tasks or
    ``max_extra_groups`` extra groups were drawn."""
    partial = partial or PartialGroupConfig(min_group_size=0)
    step = SampledStep()
    wanted, next_index, round_ = len(tasks), len(tasks), 0
    task_of = {task.task_id: task for task in tasks}
    batch = await roll_out(tasks, 0)
    while True:
        again: list[Task] = []  # short groups' tasks, rolled out again
        for group in split_groups(batch):
            if partial.is_short(group) and len(step.short) < partial.max_replacements:
                step.short.append(group)
                again.append(task_of[group[0].task_id])
            elif is_informative(group) or not config.enabled:
                step.kept.append(group)
            else:
                step.dropped.append(group)
        missing = min(wanted - len(step.kept) - len(again), config.max_extra_groups - step.num_extra_groups)
        round_ += 1
        candidates = list(replacement_tasks(round_))[: max(missing, 0)] if config.enabled else []
        step.num_extra_groups += len(candidates)
        candidates = again + candidates
        if not candidates:
            return step
        task_of.update((task.task_id, task) for task in candidates)
        batch = await roll_out(candidates, next_index)
        next_index += len(candidates)
