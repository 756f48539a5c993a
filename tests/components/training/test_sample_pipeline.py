"""Trajectories → micro-batches: exact advantages, weights, masks and packing; failures, stale and
zero-advantage groups handled; the Ray Data pipeline gives the same samples as the plain pyarrow one."""

from __future__ import annotations

import numpy as np
import pytest

from components.training.data import (
    SampleBatchConfig,
    build_micro_batches_locally,
    build_micro_batches_with_ray,
    first_fit_decreasing,
)
from components.training.grpo import GRPO
from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.components.training.training_synthetic import make_segment, make_trajectory, random_batch

STD_OF_ONE_ZERO = np.sqrt(0.5)  # sample std of rewards [1, 0]


def known_batch():
    """Group a: t1 (reward 1, two segments), t2 (reward 0), t3 failed. Group b: t4, t5 with equal rewards."""
    t1 = make_trajectory("t1", "a", 1.0, (make_segment(3, 2, seed=1), make_segment(4, 3, seed=2, tail=1)))
    t2 = make_trajectory("t2", "a", 0.0, (make_segment(2, 5, seed=3),))
    t3 = make_trajectory(
        "t3", "a", None, (make_segment(2, 4, seed=4),), status=TrajectoryStatus.SANDBOX_ERROR
    )
    t4 = make_trajectory("t4", "b", 0.5, (make_segment(2, 2, seed=5),))
    t5 = make_trajectory("t5", "b", 0.5, (make_segment(3, 6, seed=6),))
    return [t1, t2, t3, t4, t5]


def segments_of(micro_batches):
    """Each packed segment back out of the rows: {first token ids tuple: per-token columns}."""
    out = {}
    for row in micro_batches.to_pylist():
        sequence_ids = np.asarray(row["sequence_ids"])
        assert row["num_tokens"] == len(row["input_ids"]) == len(sequence_ids)
        assert (np.diff(sequence_ids) >= 0).all()  # each segment is one contiguous run
        bounds = [0, *np.flatnonzero(np.diff(sequence_ids)) + 1, len(sequence_ids)]
        for s, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            piece = {
                k: np.asarray(row[k][start:end])
                for k in (
                    "input_ids",
                    "position_ids",
                    "sequence_ids",
                    "loss_mask",
                    "old_logprobs",
                    "advantages",
                    "weights",
                    "weight_versions",
                )
            }
            assert piece["position_ids"].tolist() == list(range(end - start))
            assert set(piece["sequence_ids"].tolist()) == {s}
            out[tuple(piece["input_ids"].tolist())] = piece
    return out


def test_first_fit_decreasing_packs_exactly():
    assert first_fit_decreasing([5, 8, 7], 12) == [[1], [2, 0]]
    assert first_fit_decreasing([20, 3], 12) == [[0], [1]]  # an oversized item gets its own bin


def test_known_batch_advantages_weights_masks_and_packing():
    trajectories = known_batch()
    result = build_micro_batches_locally(
        trajectories, GRPO(), SampleBatchConfig(max_tokens_per_micro_batch=12), current_version=0
    )
    m = result.metrics
    assert m["num_trajectories"] == 5 and m["num_failed_trajectories"] == 1
    assert m["num_groups"] == 2 and m["num_zero_advantage_groups"] == 1
    assert m["num_trained_trajectories"] == 4 and m["num_trained_segments"] == 5
    assert all(n <= 12 for n in result.micro_batches["num_tokens"].to_pylist())
    packed = segments_of(result.micro_batches)
    assert len(packed) == 5  # the failed trajectory's segment never reaches a batch
    by_id = {t.trajectory_id: t for t in trajectories}
    expected_advantage = {"t1": 0.5 / STD_OF_ONE_ZERO, "t2": -0.5 / STD_OF_ONE_ZERO, "t4": 0.0, "t5": 0.0}
    # "trajectory" weighting: 1 / (4 trajectories × the trajectory's sampled tokens) per token
    sampled = {"t1": 5, "t2": 5, "t4": 2, "t5": 6}
    for tid in expected_advantage:
        for segment in by_id[tid].segments:
            piece = packed[tuple(segment.token_ids.tolist())]
            expected_mask = segment.loss_mask.copy()
            expected_mask[0] = 0
            assert piece["loss_mask"].tolist() == expected_mask.tolist()
            assert piece["old_logprobs"].tolist() == segment.logprobs.tolist()
            assert piece["weight_versions"].tolist() == segment.weight_versions.tolist()
            assert piece["advantages"] == pytest.approx(expected_advantage[tid], abs=1e-5)
            assert piece["weights"] == pytest.approx(1 / (4 * sampled[tid]), rel=1e-6)
    # t1 (two segments) and t2 (one) carry the same total weight
    total = {
        tid: sum(
            float(
                (
                    packed[tuple(s.token_ids.tolist())]["weights"]
                    * packed[tuple(s.token_ids.tolist())]["loss_mask"]
                ).sum()
            )
            for s in by_id[tid].segments
        )
        for tid in ("t1", "t2")
    }
    assert total["t1"] == pytest.approx(total["t2"]) == pytest.approx(0.25)


def test_staleness_is_measured_from_each_trajectorys_oldest_sampled_token():
    old = make_trajectory("old", "g", 1.0, (make_segment(2, 3, version=2, seed=1),))
    mixed = make_trajectory(
        "mixed", "g", 0.0, (make_segment(2, 3, version=4, seed=2), make_segment(2, 3, version=2, seed=3))
    )
    fresh = make_trajectory("fresh", "g", 0.5, (make_segment(2, 3, version=3, seed=4),))
    result = build_micro_batches_locally(
        [old, mixed, fresh], GRPO(), SampleBatchConfig(), current_version=5
    )
    assert result.metrics["staleness_max"] == 3  # the loop bounds staleness (components/run/overlapped.py), not the trainer
    assert len(segments_of(result.micro_batches)) == 4  # every segment is trained


def test_zero_advantage_groups_can_be_dropped_and_bad_input_is_refused():
    result = build_micro_batches_locally(
        known_batch(), GRPO(), SampleBatchConfig(drop_zero_advantage_groups=True), current_version=0
    )
    assert result.metrics["num_trained_trajectories"] == 2
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        SampleBatchConfig(max_tokens_per_micro_batch=0)
    with pytest.raises(ValueError, match="trajectories"):
        build_micro_batches_locally([], GRPO(), SampleBatchConfig(), current_version=0)
    with pytest.raises(ValueError, match="trajectories"):
        build_micro_batches_locally([{"not": "a trajectory"}], GRPO(), SampleBatchConfig(), current_version=0)


def test_ray_data_pipeline_matches_the_plain_one(ray_session, tmp_path):
    import pyarrow as pa

    store = TrajectoryStore(tmp_path)
    trajectories = known_batch() + random_batch(num_groups=3, group_size=4, seed=7)
    corrupt = store.directory / "shard-corrupt.parquet"
    corrupt.write_bytes(b"PAR1 torn")
    paths = [store.write(trajectories[:7]), corrupt, store.write(trajectories[7:])]
    config = SampleBatchConfig(max_tokens_per_micro_batch=32)
    local = build_micro_batches_locally(paths, GRPO(), config, current_version=0)
    distributed = build_micro_batches_with_ray(paths, GRPO(), config, current_version=0)
    assert local.metrics["num_unreadable_shards"] == distributed.metrics["num_unreadable_shards"] == 1
    shards, per_rank = distributed.split_for_ranks(2)
    assert [s.count() for s in shards] == [per_rank, distributed.num_micro_batches - per_rank]
    rows = pa.concat_tables([pa.concat_tables(ray_session.get(s.to_arrow_refs())) for s in shards])
    expected, got = segments_of(local.micro_batches), segments_of(rows)
    assert expected.keys() == got.keys()
    for key, piece in expected.items():
        for column, values in piece.items():
            if column != "sequence_ids":
                np.testing.assert_allclose(got[key][column], values, rtol=1e-6)
    for key in (
        "num_failed_trajectories",
        "num_zero_advantage_groups",
        "num_trained_segments",
        "num_sampled_tokens",
    ):
        assert distributed.metrics[key] == local.metrics[key]


def test_branch_weights_scale_or_drop_segments_by_lineage_kind():
    """``branch_weights``: side calls left out, sub-agent segments at half weight, the rest unchanged."""
    import dataclasses

    from components.trajectory import BranchKind

    root = make_segment(3, 4, seed=1)
    side = dataclasses.replace(
        make_segment(2, 3, seed=2), parent_segment=0, branch_position=5, branch_kind=BranchKind.SIDE_CALL
    )
    sub = dataclasses.replace(
        make_segment(2, 2, seed=3), parent_segment=0, branch_position=7, branch_kind=BranchKind.SUBAGENT
    )
    batch = [
        make_trajectory("t1", "g", 1.0, (root, side, sub)),
        make_trajectory("t2", "g", 0.0, (make_segment(2, 4, seed=4),)),
    ]
    plain = segments_of(
        build_micro_batches_locally(batch, GRPO(), SampleBatchConfig(), current_version=0).micro_batches
    )
    config = SampleBatchConfig(branch_weights={"side_call": 0.0, "subagent": 0.5})
    result = build_micro_batches_locally(batch, GRPO(), config, current_version=0)
    weighted = segments_of(result.micro_batches)
    key = {name: tuple(s.token_ids.tolist()) for name, s in (("root", root), ("side", side), ("sub", sub))}
    assert key["side"] in plain and key["side"] not in weighted
    # the dropped side call's tokens leave the trajectory; its kept tokens share its weight, the sub-agent's at half
    assert weighted[key["sub"]]["weights"] == pytest.approx(
        0.5 * weighted[key["root"]]["weights"][0], rel=1e-6
    )
    assert plain[key["sub"]]["weights"] == pytest.approx(plain[key["root"]]["weights"][0], rel=1e-6)
    assert result.metrics["num_segments_dropped_by_branch_kind"] == 1
    assert (
        result.metrics["num_trained_segments_subagent"] == 1
        and result.metrics["num_trained_segments_root"] == 2
    )
    with pytest.raises(ValueError, match="unknown branch kind 'sidecall'"):
        SampleBatchConfig(branch_weights={"sidecall": 0.0})
    with pytest.raises(ValueError, match="branch_weights.retry"):
        SampleBatchConfig(branch_weights={"retry": -1.0})
