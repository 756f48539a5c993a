"""Dynamic sampling: groups whose rewards are all equal are dropped and replaced, up to the cap, with counts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from components.rollout.dynamic_sampling import DynamicSamplingConfig, is_informative, sample_step
from components.trajectory import Trajectory, TrajectoryStatus

# a task's rewards in the order its rollouts come: equal rewards make a group that teaches nothing
REWARDS = {"flat": [1.0, 1.0], "varied": [0.0, 1.0], "zero": [0.0, 0.0]}


def trajectory(task_id: str, group_id: str, index: int, *, failed: bool = False) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group_id}-{index}",
        group_id=group_id,
        task_id=task_id,
        harness="test",
        status=TrajectoryStatus.SANDBOX_ERROR if failed else TrajectoryStatus.OK,
        failure_reason="sandbox died" if failed else "",
        reward=None if failed else REWARDS[task_id.split("-")[0]][index],
    )


class Rollouts:
    """Rolls out each task as one group of two with the rewards ``REWARDS`` gives its kind; records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    async def __call__(self, tasks, first_index: int) -> list[Trajectory]:
        self.calls.append(([t.task_id for t in tasks], first_index))
        return [
            trajectory(task.task_id, f"g{first_index + i}", member)
            for i, task in enumerate(tasks)
            for member in range(2)
        ]


@dataclass(frozen=True)
class NamedTask:
    task_id: str


def task(task_id: str) -> NamedTask:
    return NamedTask(task_id)


def sample(config, tasks, replacements):
    rollouts = Rollouts()
    step = asyncio.run(sample_step(config, rollouts, tasks, lambda round_: replacements.get(round_, [])))
    return step, rollouts.calls


def test_uninformative_groups_are_replaced_until_the_step_is_full():
    tasks = [task("flat-a"), task("varied-a"), task("zero-a")]
    replacements = {1: [task("flat-b"), task("varied-b")], 2: [task("varied-c"), task("varied-d")]}
    step, calls = sample(DynamicSamplingConfig(enabled=True), tasks, replacements)
    # round 1 draws the two missing groups (one of them flat again), round 2 only the one still missing
    assert calls == [(["flat-a", "varied-a", "zero-a"], 0), (["flat-b", "varied-b"], 3), (["varied-c"], 5)]
    assert [g[0].task_id for g in step.kept] == ["varied-a", "varied-b", "varied-c"]
    assert [g[0].task_id for g in step.dropped] == ["flat-a", "zero-a", "flat-b"]
    assert step.metrics() == {
        "dynamic_sampling/extra_groups": 3.0,
        "dynamic_sampling/dropped_groups": 3.0,
        "dynamic_sampling/kept_groups": 3.0,
    }
    assert len(step.trajectories) == 12 and len(step.trained) == 6
    assert len({t.group_id for t in step.trajectories}) == 6  # replacement groups get new ids


def test_the_cap_bounds_extra_groups_and_the_step_trains_on_what_it_has():
    tasks = [task("flat-a"), task("zero-a")]
    replacements = {r: [task("flat-x"), task("flat-y")] for r in range(1, 10)}
    step, calls = sample(DynamicSamplingConfig(enabled=True, max_extra_groups=3), tasks, replacements)
    assert [len(names) for names, _ in calls] == [2, 2, 1]  # 3 extra groups, then it stops
    assert step.kept == [] and step.num_extra_groups == 3 and len(step.dropped) == 5
    assert len(step.trained) == 10  # nothing informative: the shard still holds the step's rollouts


def test_disabled_keeps_every_group_and_draws_nothing():
    step, calls = sample(DynamicSamplingConfig(), [task("flat-a"), task("varied-a")], {1: [task("varied-b")]})
    assert len(calls) == 1 and len(step.kept) == 2 and step.dropped == [] and step.num_extra_groups == 0


def test_a_group_is_informative_only_through_its_trainable_members():
    varied = [trajectory("varied-a", "g", 0), trajectory("varied-a", "g", 1)]
    assert is_informative(varied)
    assert not is_informative([varied[0], trajectory("varied-a", "g", 1, failed=True)])
    with pytest.raises(ValueError, match="max_extra_groups"):
        DynamicSamplingConfig(max_extra_groups=-1)
