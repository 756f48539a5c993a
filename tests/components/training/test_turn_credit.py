"""Turn-level credit (``components/training/turn_credit.py``), by hand: per-turn returns with a discount, the
group baseline per turn index, the advantages on each turn's tokens in the packed micro-batches, the per-turn
rewards' column (validated, split over segments, Parquet round trip, older files without it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from components.training.data import SampleBatchConfig, build_micro_batches_locally
from components.training.grpo import GRPO, GRPOConfig
from components.training.turn_credit import TurnCreditConfig, spread_over_turns, turn_advantages, turn_returns
from components.trajectory import (
    TRAJECTORY_SCHEMA,
    Segment,
    sampled_turn_starts,
    trajectories_from_table,
    trajectories_to_table,
    with_turn_rewards,
)
from components.trajectory_store import TrajectoryStore
from tests.components.training.training_synthetic import make_trajectory

CENTRED = GRPO(GRPOConfig(normalize_advantages_by_std=False))  # advantage = return − group mean


def two_turn_segment(first: int, second: int, *, seed: int = 0) -> Segment:
    """prompt (2) · turn 0 (``first`` sampled) · tool reply (3) · turn 1 (``second`` sampled) · closing (1)."""
    mask = np.array([0, 0] + [1] * first + [0, 0, 0] + [1] * second + [0], np.int8)
    rng = np.random.default_rng(seed)
    return Segment(
        token_ids=rng.integers(0, 1000, len(mask)),
        loss_mask=mask,
        logprobs=np.where(mask == 1, -0.5, 0.0),
        weight_versions=np.where(mask == 1, 0, -1),
    )


def test_returns_by_hand():
    # r = [1, 0, 2], R = 3, γ = 0.5: G_2 = 2 + 3 = 5, G_1 = 0 + 0.5·5 = 2.5, G_0 = 1 + 0.5·2.5 = 2.25
    config = TurnCreditConfig(enabled=True, discount=0.5)
    assert turn_returns(config, np.array([1.0, 0.0, 2.0]), 3.0).tolist() == [2.25, 2.5, 5.0]
    # weights: w_turn 2, w_final 0.5: G_2 = 4 + 1.5 = 5.5, G_1 = 2.75, G_0 = 2 + 1.375 = 3.375
    weighted = TurnCreditConfig(enabled=True, discount=0.5, turn_reward_weight=2.0, final_reward_weight=0.5)
    assert turn_returns(weighted, np.array([1.0, 0.0, 2.0]), 3.0).tolist() == [3.375, 2.75, 5.5]
    # γ = 0: each turn sees only its own reward, and the last one the final reward too
    assert turn_returns(TurnCreditConfig(discount=0.0), np.array([1.0, 0.0, 2.0]), 3.0).tolist() == [1, 0, 5]
    assert turn_returns(config, np.zeros(0), 1.0).tolist() == []


def test_the_baseline_is_the_group_at_the_same_turn_index():
    # group g: A has turns [1, 0] and R = 1 → G_A = [2, 1]; B has one turn [0], R = 0 → G_B = [0];
    # turn 0: {2, 0}, mean 1 → +1, −1; turn 1: only A reached it → its own mean, 0. Group h alone: 0.
    config = TurnCreditConfig(enabled=True)
    a, b, c = turn_advantages(
        config, CENTRED, [np.array([1.0, 0.0]), np.array([0.0]), np.array([5.0])], np.array([1.0, 0, 0]),
        ["g", "g", "h"],
    )  # fmt: skip
    assert a.tolist() == [1.0, 0.0] and b.tolist() == [-1.0] and c.tolist() == [0.0]


def test_each_turns_advantage_lands_on_its_own_tokens_in_the_micro_batches():
    # t1: one segment with two turns (2 and 3 sampled tokens), turn rewards [1, 0], R = 1 → G = [1 + 0.5·1, 1]
    #     = [1.5, 1] with γ = 0.5; t2: two segments of one turn each (2, 2), rewards [0] and [0], R = 0 →
    #     G = [0, 0]. Turn 0: {1.5, 0} → ±0.75; turn 1: {1, 0} → ±0.5.
    t1 = make_trajectory("t1", "g", 1.0, with_turn_rewards((two_turn_segment(2, 3, seed=1),), [1.0, 0.0]))
    single = Segment(
        token_ids=np.arange(5), loss_mask=[0, 0, 1, 1, 0], logprobs=[0, 0, -0.5, -0.5, 0],
        weight_versions=[-1, -1, 0, 0, -1],
    )  # fmt: skip
    t2 = make_trajectory("t2", "g", 0.0, with_turn_rewards((single, single), [0.0, 0.0]))
    config = SampleBatchConfig(turn_credit=TurnCreditConfig(enabled=True, discount=0.5))
    batches = build_micro_batches_locally([t1, t2], CENTRED, config, current_version=0)
    assert batches.metrics["num_turns"] == 4 and batches.metrics["num_turns_with_rewards"] == 4
    assert batches.metrics["turn_reward_mean"] == pytest.approx(0.25)
    by_segment: dict[tuple[int, ...], list[float]] = {}
    for row in batches.micro_batches.to_pylist():
        ids, mask, advantages = (np.asarray(row[k]) for k in ("input_ids", "loss_mask", "advantages"))
        sequence = np.asarray(row["sequence_ids"])
        for index in np.unique(sequence):
            here = sequence == index
            by_segment.setdefault(tuple(ids[here]), []).extend(advantages[here][mask[here] == 1].tolist())
    assert by_segment[tuple(t1.segments[0].token_ids)] == [0.75, 0.75, 0.5, 0.5, 0.5]
    assert by_segment[tuple(single.token_ids)] == [-0.75, -0.75, -0.5, -0.5]  # t2's turn 0, then turn 1
    # off: every token of a trajectory carries its one advantage (R − mean = ±0.5), turn rewards ignored
    plain = build_micro_batches_locally([t1, t2], CENTRED, SampleBatchConfig(), current_version=0)
    values = {
        round(v, 6)
        for row in plain.micro_batches.to_pylist()
        for v, m in zip(row["advantages"], row["loss_mask"], strict=True)
        if m
    }
    assert values == {0.5, -0.5}


def test_turns_without_rewards_count_zero_and_the_final_reward_still_credits_them():
    # no turn rewards anywhere: G_k = γ^{K−1−k}·R. t1: R = 1, two turns, γ = 0.5 → [0.5, 1]; t2: R = 0 → [0, 0]
    t1 = make_trajectory("t1", "g", 1.0, (two_turn_segment(1, 1),))
    t2 = make_trajectory("t2", "g", 0.0, (two_turn_segment(1, 1, seed=2),))
    config = SampleBatchConfig(turn_credit=TurnCreditConfig(enabled=True, discount=0.5))
    rows = build_micro_batches_locally([t1, t2], CENTRED, config, current_version=0).micro_batches.to_pylist()
    sampled = sorted(a for row in rows for a, m in zip(row["advantages"], row["loss_mask"], strict=True) if m)
    assert sampled == [-0.5, -0.25, 0.25, 0.5]


def test_turn_rewards_are_one_per_turn_or_a_clear_error():
    segment = two_turn_segment(2, 3)
    assert sampled_turn_starts(segment.loss_mask).tolist() == [2, 7] and segment.num_turns == 2
    with pytest.raises(ValueError, match=r"segment\.turn_rewards: expected 2"):
        Segment(**{**vars(segment), "turn_rewards": np.array([1.0])})
    with pytest.raises(ValueError, match=r"turn_rewards: 3 rewards for 4 turns"):
        with_turn_rewards((segment, segment), [1.0, 2.0, 3.0])
    first, second = with_turn_rewards((segment, segment), [1.0, 2.0, 3.0, 4.0])
    assert first.turn_rewards.tolist() == [1.0, 2.0] and second.turn_rewards.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match="discount"):
        TurnCreditConfig(discount=1.5)
    with pytest.raises(ValueError, match="turn_reward_weight"):
        TurnCreditConfig(turn_reward_weight=-1.0)
    assert spread_over_turns(np.array([3.0, 4.0]), segment.loss_mask).tolist() == [
        0, 0, 3, 3, 0, 0, 0, 4, 4, 4, 0
    ]  # fmt: skip


def test_turn_rewards_survive_the_store_and_older_files_read_without_them(tmp_path):
    trajectory = make_trajectory("t1", "g", 1.0, with_turn_rewards((two_turn_segment(2, 2),), [0.5, 0.25]))
    store = TrajectoryStore(tmp_path / "new")
    (read,) = store.read_shard(store.write([trajectory]))
    assert read == trajectory and read.segments[0].turn_rewards.tolist() == [0.5, 0.25]
    assert TRAJECTORY_SCHEMA.metadata[b"rein.schema"] == b"trajectory/4"
    # a trajectory/3 file: the segment struct without turn_rewards
    table = trajectories_to_table([trajectory])
    segment_type = TRAJECTORY_SCHEMA.field("segments").type.value_type
    old_type = pa.struct([f for f in segment_type if f.name != "turn_rewards"])
    old_schema = TRAJECTORY_SCHEMA.set(
        TRAJECTORY_SCHEMA.get_field_index("segments"),
        pa.field("segments", pa.list_(old_type), nullable=False),
    ).with_metadata({"rein.schema": "trajectory/3"})
    rows = [
        {**row, "segments": [{k: v for k, v in s.items() if k != "turn_rewards"} for s in row["segments"]]}
        for row in table.to_pylist()
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=old_schema), tmp_path / "old.parquet")
    (old,) = trajectories_from_table(pq.read_table(tmp_path / "old.parquet", schema=TRAJECTORY_SCHEMA))
    assert old.segments[0].turn_rewards is None
    assert old.segments[0].token_ids.tolist() == trajectory.segments[0].token_ids.tolist()
