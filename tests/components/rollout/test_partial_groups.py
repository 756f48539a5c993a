"""Partial groups in sync mode (``sample_step``): a group left with fewer than ``min_group_size`` survivors of
infrastructure failures is rolled out again (its own task, a new group id), at most ``max_replacements`` per step,
then the step trains on what it has; a group that lost members to the agent's own errors is never replaced; the
advantage of a partial group is computed over its survivors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from components.rollout.dynamic_sampling import DynamicSamplingConfig, sample_step
from components.rollout.partial_groups import PartialGroupConfig
from components.training.data import SampleBatchConfig, build_micro_batches_locally
from components.training.grpo import GRPO
from components.trajectory import Trajectory, TrajectoryStatus
from tests.components.rollout.test_dynamic_sampling import task
from tests.components.training.training_synthetic import make_segment, make_trajectory


class FailingRollouts:
    """Each task's group of three: member ``i`` of a task's ``n``-th draw fails with ``statuses[task][n][i]``
    (missing: ``ok``, reward ``i``)."""

    def __init__(self, statuses: dict[str, list[list[TrajectoryStatus | None]]]) -> None:
        self.statuses = statuses
        self.draws: dict[str, int] = {}
        self.calls: list[tuple[list[str], int]] = []

    async def __call__(self, tasks, first_index: int) -> list[Trajectory]:
        self.calls.append(([t.task_id for t in tasks], first_index))
        out = []
        for offset, one in enumerate(tasks):
            draw = self.draws.get(one.task_id, 0)
            self.draws[one.task_id] = draw + 1
            script = self.statuses.get(one.task_id, [])
            failures = script[draw] if draw < len(script) else []
            for member in range(3):
                status = failures[member] if member < len(failures) else None
                out.append(
                    Trajectory(
                        trajectory_id=f"g{first_index + offset}-{member}",
                        group_id=f"g{first_index + offset}",
                        task_id=one.task_id,
                        harness="test",
                        status=status or TrajectoryStatus.OK,
                        failure_reason="failed" if status else "",
                        reward=None if status else float(member),
                    )
                )
        return out


SANDBOX, ENGINE, AGENT = (
    TrajectoryStatus.SANDBOX_ERROR,
    TrajectoryStatus.ENGINE_ERROR,
    TrajectoryStatus.AGENT_ERROR,
)


def _sample(partial, statuses, tasks=("a", "b")):
    rollouts = FailingRollouts(statuses)
    step = asyncio.run(
        sample_step(
            DynamicSamplingConfig(), rollouts, [task(t) for t in tasks], lambda r: [], partial=partial
        )
    )
    return step, rollouts.calls


def test_a_short_group_is_rolled_out_again_and_a_partial_one_trains_with_its_survivors():
    statuses = {"a": [[SANDBOX, ENGINE, SANDBOX]], "b": [[ENGINE]]}  # a: all lost once; b: one lost
    step, calls = _sample(PartialGroupConfig(min_group_size=2), statuses)
    assert calls == [(["a", "b"], 0), (["a"], 2)]  # a's own task again, as a new group
    assert [g[0].group_id for g in step.kept] == ["g1", "g2"]
    assert [g[0].group_id for g in step.short] == ["g0"]
    assert step.partial_group_metrics() == {
        "partial_groups/trained_with_survivors": 1.0,
        "partial_groups/members_lost": 1.0,
        "partial_groups/replaced": 1.0,
    }
    assert {t.group_id for t in step.trained} == {"g1", "g2"}
    assert len(step.trajectories) == 9  # the short group's rollouts are still reported
    # ... and kept: the sync step writes what training leaves out to the run's untrained store
    assert {t.group_id for t in step.left_out} == {"g0"}
    assert {t.trajectory_id for t in step.left_out} | {t.trajectory_id for t in step.trained} == {
        t.trajectory_id for t in step.trajectories
    }


def test_replacements_are_capped_and_the_step_trains_on_what_it_has():
    always_down = {"a": [[SANDBOX, SANDBOX, SANDBOX]] * 10}
    step, calls = _sample(PartialGroupConfig(min_group_size=1, max_replacements=2), always_down)
    assert [names for names, _ in calls] == [["a", "b"], ["a"], ["a"]]  # two replacements, then it stops
    assert len(step.short) == 2 and len(step.kept) == 2  # the third lost group is kept: nothing waits on it
    assert step.partial_group_metrics()["partial_groups/replaced"] == 2.0


def test_groups_that_lost_members_to_the_agent_are_not_replaced():
    step, calls = _sample(PartialGroupConfig(min_group_size=3), {"a": [[AGENT, AGENT]]})
    assert len(calls) == 1 and not step.short


def test_weakened_min_group_size_zero_trains_a_group_with_no_survivor():
    step, calls = _sample(PartialGroupConfig(min_group_size=0), {"a": [[SANDBOX, SANDBOX, SANDBOX]]})
    assert len(calls) == 1 and not step.short
    assert step.partial_group_metrics()["partial_groups/trained_with_survivors"] == 1.0


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="min_group_size"):
        PartialGroupConfig(min_group_size=-1)
    with pytest.raises(ValueError, match="max_replacements"):
        PartialGroupConfig(max_replacements=-1)


def test_a_partial_groups_advantages_are_over_its_survivors():
    survivors = [
        make_trajectory(f"t{i}", "g", r, (make_segment(2, 3, seed=i),)) for i, r in enumerate((1.0, 0.0))
    ]
    lost = make_trajectory("t9", "g", None, (make_segment(2, 3, seed=9),), status=SANDBOX)
    with_lost = build_micro_batches_locally(
        [*survivors, lost], GRPO(), SampleBatchConfig(), current_version=0
    )
    alone = build_micro_batches_locally(survivors, GRPO(), SampleBatchConfig(), current_version=0)
    advantages = [
        np.concatenate(result.micro_batches["advantages"].to_pylist()) for result in (with_lost, alone)
    ]
    assert np.array_equal(*(np.sort(a) for a in advantages)) and np.abs(advantages[0]).max() > 0
    assert with_lost.metrics["num_failed_trajectories"] == 1
