"""The group buffer hands out complete groups only; the staleness filter works per token (the oldest sampled
token of a group decides); the ledger records every shard once, trained or dropped, across a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.rollout.buffer import (
    LEDGER_KEY,
    GroupBuffer,
    TrajectoryLedger,
    group_id_for,
    group_index,
    group_staleness,
    split_stale,
    staleness_histogram,
)
from components.run.config import RolloutBrickConfig
from components.training.checkpoint import TrainerState
from components.trajectory import Segment, Trajectory, TrajectoryStatus


def trajectory(
    index: int, member: int, versions: list[int] | None = None, *, status: TrajectoryStatus = TrajectoryStatus.OK
) -> Trajectory:
    """A member of the producer's group ``index``; ``versions``: the weight version of each sampled token."""
    segments = ()
    if versions is not None:
        prompt = [1, 2, 3]
        segments = (
            Segment(
                token_ids=np.arange(len(prompt) + len(versions)),
                loss_mask=np.array([0] * len(prompt) + [1] * len(versions)),
                logprobs=np.array([0.0] * len(prompt) + [-0.5] * len(versions)),
                weight_versions=np.array([-1] * len(prompt) + versions),
            ),
        )
    ok = status == TrajectoryStatus.OK
    return Trajectory(
        trajectory_id=f"t{index}-{member}",
        group_id=group_id_for(index, "task"),
        task_id="task",
        harness="test",
        status=status,
        failure_reason="" if ok else status.value,
        reward=1.0 if ok else None,
        segments=segments,
    )


def test_group_ids_carry_the_producer_index():
    assert group_index(group_id_for(42, "tictactoe-7")) == 42
    assert group_index("a1b2c3-s0-t0-task") is None


def test_buffer_hands_out_complete_groups_only_in_completion_order():
    buffer = GroupBuffer(group_size=3)
    assert buffer.add(trajectory(0, 0, [0]), Path("a")) is None
    assert buffer.add(trajectory(1, 0, [0]), Path("b")) is None
    assert buffer.take(5) == [] and buffer.depth == 0 and buffer.num_partial == 2
    # a failed member is a finished member: group 1 completes with one infrastructure failure
    buffer.add(trajectory(1, 1, status=TrajectoryStatus.SANDBOX_ERROR), Path("b"))
    assert buffer.add(trajectory(1, 2, [0]), Path("b")) is not None
    assert buffer.depth == 1 and buffer.members_of(group_id_for(0, "task")) == 1
    taken = buffer.take(5)
    assert [g.index for g in taken] == [1] and len(taken[0].members) == 3
    assert taken[0].shards == [Path("b")]  # a group committed as one shard
    assert buffer.take(5) == []
    buffer.add(trajectory(0, 1, [0]), Path("a"))
    buffer.add(trajectory(0, 2, [0]), Path("a"))
    assert [g.index for g in buffer.take(1)] == [0]


def test_buffer_rejects_duplicates_and_overfull_groups():
    buffer = GroupBuffer(group_size=2)
    buffer.add(trajectory(0, 0, [0]), Path("a"))
    with pytest.raises(ValueError, match="trajectory_id"):
        buffer.add(trajectory(0, 0, [0]), Path("a"))
    buffer.add(trajectory(0, 1, [0]), Path("a"))
    with pytest.raises(ValueError, match="group_id"):
        buffer.add(trajectory(0, 2, [0]), Path("a"))
    foreign = Trajectory(
        trajectory_id="x", group_id="no-index", task_id="t", harness="h", status=TrajectoryStatus.OK, reward=0.0
    )
    with pytest.raises(ValueError, match="group_id"):
        buffer.add(foreign, Path("c"))


def test_ordered_take_waits_for_every_wanted_group():
    buffer = GroupBuffer(group_size=1)
    buffer.add(trajectory(1, 0, [0]), Path("b"))
    assert buffer.take_indices([0, 1]) is None and buffer.depth == 1  # nothing taken while 0 is missing
    buffer.add(trajectory(0, 0, [0]), Path("a"))
    assert [g.index for g in buffer.take_indices([0, 1])] == [0, 1]
    assert buffer.depth == 0


@settings(max_examples=300, deadline=None)
@given(
    group=st.lists(
        st.lists(st.integers(min_value=0, max_value=20), max_size=12), min_size=1, max_size=6
    ),  # per member: the version stamp of each sampled token (an empty list: nothing sampled)
    current_version=st.integers(min_value=0, max_value=25),
    max_staleness=st.integers(min_value=0, max_value=6),
)
def test_staleness_is_decided_by_the_oldest_sampled_token(group, current_version, max_staleness):
    members = [trajectory(0, i, versions) for i, versions in enumerate(group)]
    stamps = [v for versions in group for v in versions]
    expected = max(0, current_version - min(stamps)) if stamps else 0
    assert group_staleness(members, current_version) == expected
    buffer = GroupBuffer(group_size=len(members))
    complete = buffer.add_group(members, Path("s"))
    split = split_stale([complete], current_version=current_version, max_staleness=max_staleness)
    assert split.staleness == [expected]
    assert (split.stale == [complete]) == (expected > max_staleness)
    assert (split.fresh == [complete]) == (expected <= max_staleness)


def test_prompt_tokens_never_count_toward_staleness():
    member = trajectory(0, 0, [5, 7])  # prompt tokens carry version -1 and loss_mask 0
    assert group_staleness([member], 7) == 2
    assert group_staleness([trajectory(0, 1)], 7) == 0  # nothing sampled: no off-policy token


def test_staleness_histogram_counts_groups_per_lag():
    histogram = staleness_histogram([0, 1, 1, 2, 9])
    assert histogram["staleness/groups_0"] == 1 and histogram["staleness/groups_1"] == 2
    assert histogram["staleness/groups_2"] == 1 and histogram["staleness/groups_4_plus"] == 1
    assert histogram["staleness/mean"] == pytest.approx(13 / 5) and histogram["staleness/max"] == 9


def test_ledger_records_each_shard_once_and_survives_the_checkpoint_state():
    ledger = TrajectoryLedger()
    ledger.record_step(0, [Path("/run/trajectories/a.parquet"), "b.parquet"])
    ledger.record_dropped(["c.parquet"], "stale")
    with pytest.raises(ValueError, match="shards"):
        ledger.record_step(1, ["a.parquet"])  # already trained
    with pytest.raises(ValueError, match="shards"):
        ledger.record_dropped(["b.parquet"], "stale")
    with pytest.raises(ValueError, match="step"):
        ledger.record_step(0, ["d.parquet"])
    state = TrainerState(step=1, weight_version=1, extra={LEDGER_KEY: ledger.to_state()})
    restored = TrajectoryLedger.from_state(TrainerState.from_json(state.to_json()).extra)
    assert restored.step_shards == {0: ["a.parquet", "b.parquet"]}
    assert restored.dropped == {"c.parquet": "stale"}
    assert restored.settled() == {"a.parquet", "b.parquet", "c.parquet"} and restored.steps_done == 1
    assert TrajectoryLedger.from_state({}).steps_done == 0
    json.dumps(ledger.to_state())  # plain JSON in trainer_state.json


def test_rollout_config_names_bad_fields():
    with pytest.raises(ValueError, match="mode"):
        RolloutBrickConfig(mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_staleness"):
        RolloutBrickConfig(mode="async", max_staleness=-1)
    with pytest.raises(ValueError, match="max_staleness"):
        RolloutBrickConfig(mode="partial", max_staleness=0)
    with pytest.raises(ValueError, match="max_steps_ahead"):
        RolloutBrickConfig(mode="async", max_steps_ahead=-1)
    # the steps in line for the trainer, counting the one it is on: while the trainer is the bottleneck
    # max_steps_ahead more, capped by max_staleness; while rollouts are, max_staleness more
    def in_line(rollout_bound: bool, **fields) -> int:
        return RolloutBrickConfig(mode="async", **fields).steps_in_line(rollout_bound=rollout_bound)

    assert in_line(False, max_staleness=3) == 2 and in_line(True, max_staleness=3) == 4  # default: 1 ahead
    assert in_line(False, max_staleness=3, max_steps_ahead=3) == 4
    assert in_line(False, max_staleness=1, max_steps_ahead=5) == 2 and in_line(True, max_staleness=1) == 2
    assert in_line(False, max_staleness=0) == in_line(True, max_staleness=0) == 1  # none starts while it trains
