"""Synthetic trajectories with known rewards for the training tests."""

from __future__ import annotations

import numpy as np

from components.trajectory import Segment, SegmentReason, Trajectory, TrajectoryStatus


def make_segment(
    num_prompt: int, num_sampled: int, *, version: int = 0, seed: int = 0, vocab: int = 49152, tail: int = 0
) -> Segment:
    """A segment: ``num_prompt`` prompt tokens, ``num_sampled`` sampled ones, then ``tail`` tool tokens."""
    rng = np.random.default_rng(seed)
    mask = np.array([0] * num_prompt + [1] * num_sampled + [0] * tail, dtype=np.int8)
    logprobs = np.where(mask == 1, -rng.uniform(0.05, 3.0, len(mask)), 0).astype(np.float32)
    return Segment(
        token_ids=rng.integers(0, vocab, len(mask)),
        loss_mask=mask,
        logprobs=logprobs,
        weight_versions=np.where(mask == 1, version, -1),
        reason=SegmentReason.START,
    )


def make_trajectory(
    trajectory_id: str,
    group_id: str,
    reward: float | None,
    segments: tuple[Segment, ...],
    *,
    status: TrajectoryStatus = TrajectoryStatus.OK,
) -> Trajectory:
    return Trajectory(
        trajectory_id=trajectory_id,
        group_id=group_id,
        task_id=f"task-{group_id}",
        harness="synthetic",
        status=status,
        failure_reason="" if status == TrajectoryStatus.OK else f"synthetic {status.value}",
        reward=reward,
        segments=segments,
    )


def random_batch(
    num_groups: int = 2, group_size: int = 4, *, seed: int = 0, vocab: int = 49152
) -> list[Trajectory]:
    """Groups of trajectories with varied rewards, 1-3 segments each."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(num_groups):
        for i in range(group_size):
            num_segments = int(rng.integers(1, 4))
            segments = tuple(
                make_segment(
                    int(rng.integers(2, 12)),
                    int(rng.integers(1, 10)),
                    seed=int(rng.integers(1 << 30)),
                    vocab=vocab,
                )
                for _ in range(num_segments)
            )
            out.append(make_trajectory(f"g{g}-t{i}", f"g{g}", float(rng.random()), segments))
    return out
