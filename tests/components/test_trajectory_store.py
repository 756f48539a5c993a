"""TrajectoryStore: exact round trips, validation before writing, and crash safety under SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from components.trajectory import Segment, SegmentReason, Trajectory, TrajectoryStatus
from components.trajectory_store import TEMP_PREFIX, TrajectoryStore


def make_segment(
    num_prompt: int, num_sampled: int, *, version: int = 0, reason=SegmentReason.START
) -> Segment:
    rng = np.random.default_rng(num_prompt * 1000 + num_sampled)
    mask = np.array([0] * num_prompt + [1] * num_sampled, dtype=np.int8)
    logprobs = np.where(mask == 1, -rng.random(len(mask)).astype(np.float32), 0).astype(np.float32)
    return Segment(
        token_ids=rng.integers(0, 49152, len(mask)),
        loss_mask=mask,
        logprobs=logprobs,
        weight_versions=np.where(mask == 1, version, -1),
        reason=reason,
    )


def make_trajectory(index: int, **overrides) -> Trajectory:
    fields = dict(
        trajectory_id=f"t{index}",
        group_id=f"g{index // 4}",
        task_id=f"task{index % 3}",
        harness="swe_agent",
        status=TrajectoryStatus.OK,
        reward=float(index % 2),
        step=index // 8,
        metrics={"turns": 3.0, "tool_calls/bash": 2.0},
        segments=(
            make_segment(5, 3),
            make_segment(0, 0, reason=SegmentReason.HISTORY_REWRITTEN),
            make_segment(7, 4, version=2, reason=SegmentReason.TOOLS_CHANGED),
        ),
        messages_json='[{"role": "user", "content": "fix it"}]',
        log="graded",
    )
    fields.update(overrides)
    return Trajectory(**fields)


def test_round_trip_is_exact(tmp_path: Path):
    trajectories = [
        make_trajectory(0),
        make_trajectory(1, segments=()),
        make_trajectory(
            2, status=TrajectoryStatus.SANDBOX_ERROR, failure_reason="sandbox sb-1 died", reward=None
        ),
        make_trajectory(3, status="context_overflow", failure_reason="prompt of 40000 tokens", reward=0.0),
    ]
    store = TrajectoryStore(tmp_path)
    path = store.write(trajectories)
    assert path is not None and path.exists() and path.parent == tmp_path / "trajectories"
    result = TrajectoryStore(tmp_path).read_all()
    assert result.corrupt_shards == []
    assert result.trajectories == trajectories
    back = {t.trajectory_id: t for t in result.trajectories}
    assert back["t2"].reward is None and not back["t2"].trainable
    assert back["t3"].trainable and back["t3"].status is TrajectoryStatus.CONTEXT_OVERFLOW
    assert back["t0"].segments[2].weight_versions.dtype == np.int32
    assert back["t0"].segments[1].token_ids.size == 0


def test_empty_batch_writes_nothing(tmp_path: Path):
    store = TrajectoryStore(tmp_path)
    assert store.write([]) is None
    assert store.shard_paths() == []


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: make_segment_with(loss_mask=[1, 0]), "loss_mask: has 2 entries for 3"),
        (lambda: make_segment_with(logprobs=[0.0, -1.0]), "logprobs: has 2 entries for 3"),
        (lambda: make_segment_with(weight_versions=[0]), "weight_versions: has 1 entries for 3"),
        (lambda: make_segment_with(logprobs=[-0.5, 0.0, -1.0]), "must be 0 where loss_mask is 0"),
        (lambda: make_segment_with(loss_mask=[0, 2, 1]), "entries must be 0 or 1"),
        (lambda: make_segment_with(reason="bogus"), "unknown reason 'bogus'"),
        (lambda: make_trajectory(0, status="exploded"), "unknown status 'exploded'"),
        (lambda: make_trajectory(0, status="timeout"), "failure_reason: must say why"),
        (lambda: make_trajectory(0, failure_reason="oops"), "must be empty when status is ok"),
        (lambda: make_trajectory(0, reward=float("nan")), "reward: must be finite"),
    ],
)
def test_invalid_trajectories_raise_before_writing(tmp_path: Path, build, message):
    store = TrajectoryStore(tmp_path)
    with pytest.raises(ValueError, match=message):
        store.write([make_trajectory(0), build()])
    assert store.shard_paths() == []
    assert list((tmp_path / "trajectories").iterdir()) == []


def make_segment_with(**overrides) -> Segment:
    fields = dict(
        token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.1, -0.2], weight_versions=[-1, 0, 0]
    )
    fields.update(overrides)
    return Segment(**fields)


def test_write_rejects_non_trajectories(tmp_path: Path):
    with pytest.raises(ValueError, match="expected Trajectory"):
        TrajectoryStore(tmp_path).write([{"trajectory_id": "x"}])


def test_corrupt_and_torn_shards_are_reported_not_fatal(tmp_path: Path, caplog):
    store = TrajectoryStore(tmp_path)
    good = store.write([make_trajectory(0), make_trajectory(1)])
    truncated = store.write([make_trajectory(2)])
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    garbage = store.directory / "shard-99999999999999999999-garbage.parquet"
    garbage.write_bytes(b"not a parquet file at all")
    torn = store.directory / f"{TEMP_PREFIX}shard-123.parquet"
    torn.write_bytes(b"PAR1 half")
    dead_writer = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    torn_by_dead_writer = store.directory / f"{TEMP_PREFIX}{int(dead_writer.stdout)}-shard-456.parquet"
    torn_by_dead_writer.write_bytes(b"PAR1 half")
    in_flight = store.directory / f"{TEMP_PREFIX}{os.getpid()}-shard-789.parquet"  # a live writer's
    in_flight.write_bytes(b"PAR1 being written")

    result = TrajectoryStore(tmp_path).read_all()  # reopening cleans the torn temp files
    assert not torn.exists() and not torn_by_dead_writer.exists()
    assert in_flight.exists(), "a live writer's temp file must survive a reader opening the store"
    assert [t.trajectory_id for t in result.trajectories] == ["t0", "t1"]
    assert sorted(c.path for c in result.corrupt_shards) == sorted([truncated, garbage])
    assert all(c.error for c in result.corrupt_shards)
    assert str(garbage) in caplog.text
    assert good.exists()


WRITER = textwrap.dedent(
    """
    from tests.components.test_trajectory_store import make_trajectory
    from components.trajectory_store import TrajectoryStore
    store = TrajectoryStore({run_dir!r})
    i = 0
    while True:
        batch = [make_trajectory(i + k, trajectory_id=f"w{kill}-{{i + k}}") for k in range(5)]
        store.write(batch)
        i += 5
        print(i, flush=True)  # acknowledged only after write() returned
    """
)


def test_sigkill_at_random_moments_never_exposes_partial_shards(tmp_path: Path):
    root = Path(__file__).resolve().parents[2]
    rng = random.Random(1234)
    acknowledged = 0
    for kill in range(20):
        script = WRITER.format(run_dir=str(tmp_path), kill=kill)
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=root,  # ``python -c`` imports from the working directory: the ``tests`` package
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        first = process.stdout.readline()  # wait until the writer is up and wrote at least once
        assert first.strip(), f"writer failed to start on kill {kill}"
        time.sleep(rng.uniform(0.0, 0.05))
        process.send_signal(signal.SIGKILL)
        remaining, _ = process.communicate()
        lines = [first] + remaining.splitlines()
        acknowledged_now = int(lines[-1]) if lines[-1].strip() else int(lines[-2])
        result = TrajectoryStore(tmp_path).read_all()
        assert result.corrupt_shards == [], f"kill {kill}: corrupt shard visible"
        ids = [t.trajectory_id for t in result.trajectories]
        assert len(ids) == len(set(ids)), "a trajectory is visible twice"
        visible_now = len(result.trajectories) - acknowledged
        # Every acknowledged write is visible; the one batch in flight at the kill is visible whole or not at all.
        assert visible_now in (acknowledged_now, acknowledged_now + 5), (kill, acknowledged_now, visible_now)
        acknowledged += visible_now
        assert not list((tmp_path / "trajectories").glob(f"{TEMP_PREFIX}*"))
