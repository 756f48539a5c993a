"""Trajectories → packed training micro-batches, with Ray (parallel read and pack tasks; the packed blocks a Ray
Dataset streamed into the trainer's workers) or a plain pyarrow path (tests, benchmarks, single-process
training) built from the same three functions:

1. ``explode_segments``: one row per segment (every segment is a training sample sharing its trajectory's
   reward); trajectories that are not trainable (infrastructure failures, no reward) become one empty row so
   they are counted, and never reach a batch.
2. ``plan_step`` (on the driver, over a small summary: ids, rewards, token counts, versions): group
   advantages from the ``Algorithm``, the staleness measured (the loop bounds it: ``components/run/overlapped.py``), and
   per-segment weights from the ``Algorithm``
   (GRPO's default gives a segment its share of its trajectory's sampled tokens, so a trajectory split into
   many segments weighs the same as one that was not). Groups whose rewards are all equal get advantage 0
   and contribute no policy gradient (counted).
3. ``pack_micro_batches``: first-fit-decreasing packing of segments into rows of at most
   ``max_tokens_per_micro_batch`` tokens; positions restart at 0 for every segment, which HF models turn into
   a block-diagonal causal mask (segments never attend to each other).

A micro-batch row's layout is stated once, in ``MICRO_BATCH_COLUMNS``: each column's Arrow type, what it holds
one value per (token, segment of the row, row), its value in a padding row and the ``MicroBatch`` tensor it
becomes; ``MICRO_BATCH_SCHEMA``, ``padding_micro_batches`` and ``MicroBatch.from_row`` follow from it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from components.config import option, require_positive
from components.protocols import Algorithm
from components.remote_waits import PENDING_WAITS
from components.training.distillation import DistillationConfig, token_advantages
from components.training.overlong import OverlongConfig, length_penalty, overlong_trajectories
from components.training.turn_credit import TurnCreditConfig, spread_over_turns, turn_advantages
from components.trajectory import (
    TRAINABLE_STATUSES,
    TRAJECTORY_SCHEMA,
    BranchKind,
    Trajectory,
    trajectories_to_table,
)

if TYPE_CHECKING:
    import ray.data
    import torch

logger = logging.getLogger(__name__)

TRAJECTORY_COLUMNS = ["trajectory_id", "group_id", "status", "reward", "segments"]
NO_SAMPLED_VERSION = np.iinfo(np.int32).max
TOKEN_LIST_COLUMNS = ("token_ids", "loss_mask", "logprobs", "weight_versions")
# per-segment columns carried from the trajectory schema as they are, with the value an empty row gets
SEGMENT_LIST_COLUMNS = ("routed_experts", "routed_experts_shape", "teacher_logprobs", "turn_rewards")
SAMPLING_COLUMNS = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("status", pa.string()),
        pa.field("trainable", pa.bool_()),
        pa.field("segment_index", pa.int32()),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("loss_mask", pa.list_(pa.int8())),
        pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("weight_versions", pa.list_(pa.int32())),
        pa.field("temperature", pa.float64()),
        pa.field("top_p", pa.float64()),
        pa.field("top_k", pa.int32()),
        pa.field("routed_experts", pa.list_(pa.int16())),
        pa.field("routed_experts_shape", pa.list_(pa.int32())),
        pa.field("teacher_logprobs", pa.list_(pa.float32())),  # empty unless a teacher scored the segment
        pa.field("turn_rewards", pa.list_(pa.float32())),  # null unless per-turn rewards were given
        pa.field("num_turns", pa.int32()),  # runs of sampled tokens (model calls)
        pa.field("num_tokens", pa.int32()),
        pa.field("num_sampled_tokens", pa.int32()),
        pa.field("min_sampled_version", pa.int32()),
        pa.field("branch_kind", pa.string()),  # the segment's lineage kind ("root" for trajectory/2 files)
        pa.field("unreadable_shard", pa.string()),  # set (with no tokens) on the one row of a corrupt shard
    ]
)
SUMMARY_COLUMNS = [
    "trajectory_id",
    "group_id",
    "reward",
    "status",
    "trainable",
    "segment_index",
    "num_tokens",
    "num_sampled_tokens",
    "min_sampled_version",
    "branch_kind",
    "unreadable_shard",
    "num_turns",
    "turn_rewards",
]


class Per(StrEnum):
    """What a micro-batch column holds one value per."""

    TOKEN = "token"
    SEGMENT = "segment"  # segment of the row, indexed by ``sequence_ids``
    ROW = "row"


@dataclass(frozen=True)
class MicroBatchColumn:
    """One column of a packed micro-batch row."""

    name: str
    arrow_type: pa.DataType
    per: Per
    padding: object  # its value in a one-token padding row (nothing to learn)
    tensor: str | None  # the ``MicroBatch`` field it becomes; None: not a tensor of its own
    tensor_dtype: str = ""  # that field's torch dtype


# The one statement of a micro-batch row's layout. ``loss_mask`` is 0 on a segment's first token (nothing
# inside the segment predicts it); ``segment_*`` is the distribution each segment was sampled from (the trainer
# recomputes its logprobs under it; top_k 0: none); ``routed_experts`` holds the row's R3 routes flattened
# [tokens, moe_layers, top_k], -1 where a token has none, empty (and its shape []) when no segment has routes.
# fmt: off
MICRO_BATCH_COLUMNS = (
    #                name                    Arrow type              per          padding MicroBatch field and dtype
    MicroBatchColumn("input_ids",            pa.list_(pa.int32()),   Per.TOKEN,   [0],    "input_ids", "int64"),
    MicroBatchColumn("position_ids",         pa.list_(pa.int32()),   Per.TOKEN,   [0],    "position_ids", "int64"),
    MicroBatchColumn("sequence_ids",         pa.list_(pa.int32()),   Per.TOKEN,   [0],    "sequence_ids", "int64"),
    MicroBatchColumn("loss_mask",            pa.list_(pa.int8()),    Per.TOKEN,   [0],    "loss_mask", "float32"),
    MicroBatchColumn("old_logprobs",         pa.list_(pa.float32()), Per.TOKEN,   [0.0],  "old_logprobs", "float32"),
    MicroBatchColumn("advantages",           pa.list_(pa.float32()), Per.TOKEN,   [0.0],  "advantages", "float32"),
    MicroBatchColumn("weights",              pa.list_(pa.float32()), Per.TOKEN,   [0.0],  "weights", "float32"),
    MicroBatchColumn("weight_versions",      pa.list_(pa.int32()),   Per.TOKEN,   [-1],   "weight_versions", "int64"),
    MicroBatchColumn("segment_temperature",  pa.list_(pa.float64()), Per.SEGMENT, [1.0],  "temperature", "float32"),
    MicroBatchColumn("segment_top_p",        pa.list_(pa.float64()), Per.SEGMENT, [1.0],  "top_p", "float32"),
    MicroBatchColumn("segment_top_k",        pa.list_(pa.int32()),   Per.SEGMENT, [0],    "top_k", "int64"),
    MicroBatchColumn("routed_experts",       pa.list_(pa.int16()),   Per.TOKEN,   [],     "routed_experts", "int64"),
    MicroBatchColumn("routed_experts_shape", pa.list_(pa.int32()),   Per.ROW,     [],     None),
    MicroBatchColumn("num_tokens",           pa.int32(),             Per.ROW,     1,      None),
    MicroBatchColumn("num_sampled_tokens",   pa.int32(),             Per.ROW,     0,      None),
)
# fmt: on
MICRO_BATCH_SCHEMA = pa.schema([pa.field(column.name, column.arrow_type) for column in MICRO_BATCH_COLUMNS])


@dataclass(kw_only=True, frozen=True)
class SampleBatchConfig:
    """How trajectories become micro-batches."""

    max_tokens_per_micro_batch: int = option(
        1024,
        "token budget of one packed training row (bounds trainer memory; a longer segment gets its own row)",
        flag="max-tokens-per-micro-batch",
    )
    drop_zero_advantage_groups: bool = option(
        False, "skip groups with equal rewards (no policy gradient) entirely"
    )
    # Per lineage kind (``BranchKind`` values: subagent, compaction, side_call, retry, …) a factor on the
    # segments' sample weights; 0 leaves that kind out of training. Kinds not named keep factor 1.
    branch_weights: Mapping[str, float] = field(default_factory=dict)
    overlong: OverlongConfig = option(OverlongConfig(), "overlong (truncated) trajectories (overlong.py)")
    # the weights of a teacher's per-token signal and the task advantage, for segments a teacher scored
    distillation: DistillationConfig = option(
        DistillationConfig(),
        "distillation's advantage weights",
        set_by="the run's distillation brick (TrainerBrickConfig.for_run)",
    )
    turn_credit: TurnCreditConfig = option(
        TurnCreditConfig(),
        "per-turn advantages from process rewards (turn_credit.py); off: one per trajectory",
    )

    def __post_init__(self) -> None:
        require_positive(self.max_tokens_per_micro_batch, "max_tokens_per_micro_batch")
        kinds = [k.value for k in BranchKind]
        for kind, factor in dict(self.branch_weights).items():
            if kind not in kinds:
                raise ValueError(f"branch_weights: unknown branch kind {kind!r}; allowed: {kinds}")
            if (
                isinstance(factor, bool)
                or not isinstance(factor, int | float)
                or not math.isfinite(factor)
                or factor < 0
            ):
                raise ValueError(f"branch_weights.{kind}: must be a finite number >= 0, got {factor!r}")


# ------------------------------------------------------------------------------------------------------------
# 1. trajectories → segments
# ------------------------------------------------------------------------------------------------------------


def _list_offsets(array: pa.Array) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.asarray(array.offsets) - array.offsets[0].as_py()


def _list_values(array: pa.Array) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array.flatten().to_numpy(zero_copy_only=False)


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    cumulative = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
    return cumulative[offsets[1:]] - cumulative[offsets[:-1]]


def _segment_min(values: np.ndarray, offsets: np.ndarray, empty: int) -> np.ndarray:
    lengths = np.diff(offsets)
    out = np.full(len(lengths), empty, dtype=np.int64)
    nonempty = lengths > 0
    if nonempty.any():
        out[nonempty] = np.minimum.reduceat(values, offsets[:-1][nonempty])
    return out


def explode_segments(table: pa.Table) -> pa.Table:
    """Trajectory rows → one row per segment (``SEGMENT_SCHEMA``); untrainable trajectories → one empty row."""
    table = table.select(TRAJECTORY_COLUMNS).combine_chunks()
    statuses = table["status"].to_numpy(zero_copy_only=False)
    rewards = table["reward"]
    trainable = np.isin(statuses, [s.value for s in TRAINABLE_STATUSES]) & ~np.asarray(
        rewards.is_null().to_numpy(zero_copy_only=False)
    )
    segments = table["segments"].combine_chunks()
    segments = pc.if_else(pa.array(trainable), segments, pa.scalar([], type=segments.type))
    num_segments = pc.list_value_length(segments).to_numpy(zero_copy_only=False)
    # an untrainable (or segment-less) trajectory keeps one empty row so that it is counted
    parents = np.asarray(pc.list_parent_indices(segments))
    empty_rows = np.flatnonzero(num_segments == 0)
    flat = pc.list_flatten(segments)
    segment_index = np.arange(len(parents)) - np.concatenate([[0], np.cumsum(num_segments)])[parents]
    columns: dict[str, pa.Array] = {}
    for name in (*TOKEN_LIST_COLUMNS, *SEGMENT_LIST_COLUMNS):
        values = flat.field(name)
        empties = pa.array([[]] * len(empty_rows), type=values.type)
        columns[name] = pa.concat_arrays([values, empties]) if len(empty_rows) else values
    for name, default in SAMPLING_COLUMNS.items():
        values = flat.field(name)
        defaults = pa.array([default] * len(empty_rows), type=values.type)
        columns[name] = pa.concat_arrays([values, defaults]) if len(empty_rows) else values
    kinds = pc.fill_null(flat.field("branch_kind"), BranchKind.ROOT.value)  # trajectory/2: roots
    columns["branch_kind"] = (
        pa.concat_arrays([kinds, pa.array([BranchKind.ROOT.value] * len(empty_rows), pa.string())])
        if len(empty_rows)
        else kinds
    )
    rows = np.concatenate([parents, empty_rows]).astype(np.int64)
    mask_offsets = _list_offsets(columns["loss_mask"])
    mask_values = _list_values(columns["loss_mask"]).astype(np.int64)
    versions = _list_values(columns["weight_versions"]).astype(np.int64)
    sampled_versions = np.where(mask_values == 1, versions, NO_SAMPLED_VERSION)
    previous = np.concatenate([[0], mask_values[:-1]])
    segment_starts = mask_offsets[:-1][mask_offsets[:-1] < len(mask_values)]
    previous[segment_starts] = 0  # a segment's first sampled token starts a turn
    turn_starts = ((mask_values == 1) & (previous != 1)).astype(np.int64)
    out = {
        "trajectory_id": table["trajectory_id"].take(rows),
        "group_id": table["group_id"].take(rows),
        "reward": rewards.take(rows),
        "status": table["status"].take(rows),
        "trainable": pa.array(trainable[rows]),
        "segment_index": pa.array(np.concatenate([segment_index, np.full(len(empty_rows), -1)]), pa.int32()),
        **columns,
        "num_turns": pa.array(_segment_sums(turn_starts, mask_offsets), pa.int32()),
        "num_tokens": pa.array(np.diff(mask_offsets), pa.int32()),
        "num_sampled_tokens": pa.array(_segment_sums(mask_values, mask_offsets), pa.int32()),
        "min_sampled_version": pa.array(
            _segment_min(sampled_versions, mask_offsets, NO_SAMPLED_VERSION), pa.int32()
        ),
        "unreadable_shard": pa.nulls(len(rows), pa.string()),
    }
    return pa.table(out, schema=SEGMENT_SCHEMA)


def explode_shard(path: Path | str) -> pa.Table:
    """One shard file → its segment rows; a corrupt shard → one row naming it (counted, never trained on)."""
    try:
        table = pq.read_table(path, schema=TRAJECTORY_SCHEMA, columns=TRAJECTORY_COLUMNS)
    except (OSError, pa.ArrowException) as error:
        logger.warning("skipping unreadable trajectory shard %s: %s", path, error)
        row = {name: [None] for name in SEGMENT_SCHEMA.names}
        row.update(
            trajectory_id=[f"unreadable:{path}"], trainable=[False], unreadable_shard=[f"{path}: {error}"]
        )
        return pa.table(row, schema=SEGMENT_SCHEMA)
    return explode_segments(table)


# ------------------------------------------------------------------------------------------------------------
# 2. the step plan: advantages, staleness, weights
# ------------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class StepPlan:
    """Per kept segment ("trajectory_id#segment_index") its advantage and token weight, plus counts."""

    segment_advantage: dict[str, float] = field(default_factory=dict)
    segment_weight: dict[str, float] = field(default_factory=dict)
    # with turn-level credit: per kept segment one advantage per turn (replacing ``segment_advantage``)
    segment_turn_advantages: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_segments(self) -> int:
        return len(self.segment_weight)


def _segment_keys(trajectory_ids: Sequence[str], segment_index: Sequence[int]) -> list[str]:
    return [f"{t}#{int(i)}" for t, i in zip(trajectory_ids, segment_index, strict=True)]


def plan_step(
    summary: pa.Table, algorithm: Algorithm, config: SampleBatchConfig, *, current_version: int
) -> StepPlan:
    """Advantages, staleness and sample weights for one step, from the segment summary columns."""
    unreadable = summary["unreadable_shard"].is_valid().to_numpy(zero_copy_only=False)
    plan = StepPlan()
    metrics = plan.metrics
    metrics["num_unreadable_shards"] = float(unreadable.sum())
    summary = summary.filter(pa.array(~unreadable))
    trajectory_ids = summary["trajectory_id"].to_numpy(zero_copy_only=False).astype(str)
    trainable = summary["trainable"].to_numpy(zero_copy_only=False).astype(bool)
    all_trajectories = np.unique(trajectory_ids)
    failed = np.unique(trajectory_ids[~trainable])
    metrics["num_trajectories"] = float(len(all_trajectories))
    metrics["num_failed_trajectories"] = float(len(failed))

    rows = np.flatnonzero(trainable)
    ids = trajectory_ids[rows]
    unique_ids, first_row, trajectory_index = np.unique(ids, return_index=True, return_inverse=True)
    group_ids = summary["group_id"].to_numpy(zero_copy_only=False).astype(str)[rows]
    rewards = summary["reward"].to_numpy(zero_copy_only=False).astype(np.float64)[rows]
    num_sampled = summary["num_sampled_tokens"].to_numpy(zero_copy_only=False).astype(np.int64)[rows]
    min_version = summary["min_sampled_version"].to_numpy(zero_copy_only=False).astype(np.int64)[rows]
    segment_index = summary["segment_index"].to_numpy(zero_copy_only=False).astype(np.int64)[rows]
    branch_kinds = summary["branch_kind"].fill_null(BranchKind.ROOT.value).to_numpy(zero_copy_only=False)
    branch_kinds = branch_kinds.astype(str)[rows]

    statuses = summary["status"].to_numpy(zero_copy_only=False).astype(str)[rows]
    trajectory_sampled = np.bincount(trajectory_index, weights=num_sampled, minlength=len(unique_ids))
    overlong = overlong_trajectories(config.overlong, statuses[first_row], trajectory_sampled)
    penalty = length_penalty(config.overlong, overlong, trajectory_sampled)
    metrics["num_overlong_trajectories"] = float(overlong.sum())
    metrics["overlong_penalty_mean"] = float(penalty.mean()) if len(penalty) else 0.0
    raw_rewards = rewards[first_row]
    trajectory_rewards = raw_rewards + penalty
    trajectory_groups = group_ids[first_row]
    advantages = np.asarray(
        algorithm.advantages(trajectory_rewards, list(trajectory_groups)), dtype=np.float64
    )
    _, group_index = np.unique(trajectory_groups, return_inverse=True)
    num_groups = int(group_index.max()) + 1 if len(group_index) else 0
    group_max = np.full(num_groups, -np.inf)
    group_min = np.full(num_groups, np.inf)
    np.maximum.at(group_max, group_index, trajectory_rewards)
    np.minimum.at(group_min, group_index, trajectory_rewards)
    zero_advantage_group = group_max == group_min
    metrics["num_groups"] = float(num_groups)
    metrics["num_zero_advantage_groups"] = float(zero_advantage_group.sum())
    metrics["reward_mean"] = float(raw_rewards.mean()) if len(raw_rewards) else 0.0

    trajectory_min_version = np.full(len(unique_ids), NO_SAMPLED_VERSION, dtype=np.int64)
    np.minimum.at(trajectory_min_version, trajectory_index, min_version)
    has_sampled = trajectory_min_version != NO_SAMPLED_VERSION
    staleness = np.where(has_sampled, current_version - trajectory_min_version, 0)
    metrics["num_trajectories_without_sampled_tokens"] = float((~has_sampled).sum())
    metrics["staleness_max"] = float(staleness[has_sampled].max()) if has_sampled.any() else 0.0
    keep_trajectory = has_sampled.copy()
    if config.drop_zero_advantage_groups:
        keep_trajectory &= ~zero_advantage_group[group_index]
    if config.overlong.mode == "mask":
        keep_trajectory &= ~overlong

    branch_factor = np.array([config.branch_weights.get(kind, 1.0) for kind in branch_kinds], np.float64)
    metrics["num_segments_dropped_by_branch_kind"] = float(((branch_factor == 0) & (num_sampled > 0)).sum())
    keep_row = keep_trajectory[trajectory_index] & (num_sampled > 0) & (branch_factor > 0)
    weights = np.asarray(
        algorithm.sample_weights(num_sampled[keep_row], trajectory_index[keep_row]), dtype=np.float64
    )
    weights = weights * branch_factor[keep_row]
    for kind in np.unique(branch_kinds[keep_row]):
        metrics[f"num_trained_segments_{kind}"] = float((branch_kinds[keep_row] == kind).sum())
    keys = _segment_keys(ids[keep_row], segment_index[keep_row])
    plan.segment_advantage = dict(zip(keys, advantages[trajectory_index[keep_row]].tolist(), strict=True))
    plan.segment_weight = dict(zip(keys, weights.tolist(), strict=True))
    if config.turn_credit.enabled:
        turns = _TurnRows(summary, rows, trajectory_index, segment_index, len(unique_ids))
        per_trajectory = turn_advantages(
            config.turn_credit, algorithm, turns.rewards, trajectory_rewards, list(trajectory_groups)
        )
        plan.segment_turn_advantages = {
            key: per_trajectory[trajectory_index[row]][turns.start[row] : turns.start[row] + turns.count[row]]
            for key, row in zip(keys, np.flatnonzero(keep_row), strict=True)
        }
        metrics["num_turns"] = float(sum(len(r) for r in turns.rewards))
        metrics["num_turns_with_rewards"] = float(turns.num_given)
        metrics["turn_reward_mean"] = turns.given_mean
    metrics["num_trained_trajectories"] = float(keep_trajectory.sum())
    metrics["num_trained_segments"] = float(keep_row.sum())
    metrics["num_segments_without_sampled_tokens"] = float((num_sampled == 0).sum())
    metrics["num_sampled_tokens"] = float(num_sampled[keep_row].sum())
    metrics["advantage_abs_mean"] = (
        float(np.abs(advantages[keep_trajectory]).mean()) if keep_trajectory.any() else 0.0
    )
    return plan


class _TurnRows:
    """Each trainable trajectory's turn rewards in segment order (0 for turns without one), and where each
    segment row's turns start in its trajectory's list."""

    def __init__(
        self,
        summary: pa.Table,
        rows: np.ndarray,
        trajectory_index: np.ndarray,
        segment_index: np.ndarray,
        num_trajectories: int,
    ) -> None:
        self.count = summary["num_turns"].fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)[rows]
        given = summary["turn_rewards"].take(pa.array(rows)).to_pylist()
        self.start = np.zeros(len(rows), np.int64)
        lists: list[list[float]] = [[] for _ in range(num_trajectories)]
        given_values: list[float] = []
        for row in np.lexsort((segment_index, trajectory_index)):
            turns = lists[trajectory_index[row]]
            self.start[row] = len(turns)
            values = given[row]
            turns.extend(values if values is not None else [0.0] * int(self.count[row]))
            given_values.extend(values or ())
        self.rewards = [np.asarray(turns, np.float64) for turns in lists]
        self.num_given = len(given_values)
        self.given_mean = float(np.mean(given_values)) if given_values else 0.0


# ------------------------------------------------------------------------------------------------------------
# 3. packing
# ------------------------------------------------------------------------------------------------------------


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of total ≤ budget (an item over budget gets its own bin)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for index in order:
        length = lengths[index]
        for b, free in enumerate(room):
            if length <= free:
                bins[b].append(index)
                room[b] -= length
                break
        else:
            bins.append([index])
            room.append(budget - length)
    return bins


def pack_micro_batches(
    segments: pa.Table,
    *,
    plan: StepPlan,
    max_tokens: int,
    distillation: DistillationConfig | None = None,
) -> pa.Table:
    """Packed micro-batch rows (``MICRO_BATCH_SCHEMA``) of the planned segments in ``segments``; a segment a
    teacher scored gets per-token advantages (``distillation.token_advantages``)."""
    distillation = distillation or DistillationConfig()
    keys = _segment_keys(
        segments["trajectory_id"].to_pylist(),
        segments["segment_index"].fill_null(-1).to_numpy(zero_copy_only=False),
    )
    selected = [i for i, key in enumerate(keys) if key in plan.segment_weight]
    if not selected:
        return MICRO_BATCH_SCHEMA.empty_table()
    segments = segments.take(selected).combine_chunks()
    keys = [keys[i] for i in selected]
    offsets = _list_offsets(segments["token_ids"])
    token_ids = _list_values(segments["token_ids"])
    loss_mask = _list_values(segments["loss_mask"]).astype(np.int8)
    logprobs = _list_values(segments["logprobs"])
    versions = _list_values(segments["weight_versions"])
    temperatures = segments["temperature"].to_numpy(zero_copy_only=False)
    top_ps = segments["top_p"].to_numpy(zero_copy_only=False)
    top_ks = segments["top_k"].to_numpy(zero_copy_only=False)
    route_offsets = _list_offsets(segments["routed_experts"])
    route_values = _list_values(segments["routed_experts"])
    route_shapes = segments["routed_experts_shape"].to_pylist()
    teacher_offsets = _list_offsets(segments["teacher_logprobs"])
    teacher_values = _list_values(segments["teacher_logprobs"])
    lengths = np.diff(offsets).tolist()
    rows: dict[str, list] = {name: [] for name in MICRO_BATCH_SCHEMA.names}
    for bin_indices in first_fit_decreasing(lengths, max_tokens):
        bin_indices = sorted(bin_indices)
        pieces = [slice(offsets[i], offsets[i + 1]) for i in bin_indices]
        bin_lengths = [lengths[i] for i in bin_indices]
        mask = np.concatenate([loss_mask[p] for p in pieces])
        starts = np.cumsum([0, *bin_lengths])
        mask[starts[:-1]] = 0  # a segment's first token has no prediction inside the segment
        rows["input_ids"].append(np.concatenate([token_ids[p] for p in pieces]))
        rows["position_ids"].append(np.concatenate([np.arange(n, dtype=np.int32) for n in bin_lengths]))
        rows["sequence_ids"].append(np.repeat(np.arange(len(bin_indices), dtype=np.int32), bin_lengths))
        rows["loss_mask"].append(mask)
        rows["old_logprobs"].append(np.concatenate([logprobs[p] for p in pieces]))
        rows["advantages"].append(
            np.concatenate(
                [
                    _segment_advantages(
                        plan.segment_advantage[keys[i]],
                        turn_advantages=plan.segment_turn_advantages.get(keys[i]),
                        loss_mask=loss_mask[p],
                        logprobs=logprobs[p],
                        teacher=teacher_values[teacher_offsets[i] : teacher_offsets[i + 1]],
                        distillation=distillation,
                    )
                    for i, p in zip(bin_indices, pieces, strict=True)
                ]
            )
        )
        rows["weights"].append(
            np.repeat(np.array([plan.segment_weight[keys[i]] for i in bin_indices], np.float32), bin_lengths)
        )
        rows["weight_versions"].append(np.concatenate([versions[p] for p in pieces]))
        rows["segment_temperature"].append(temperatures[bin_indices])
        rows["segment_top_p"].append(top_ps[bin_indices])
        rows["segment_top_k"].append(top_ks[bin_indices])
        routes = _packed_routes(
            [(route_values[route_offsets[i] : route_offsets[i + 1]], route_shapes[i]) for i in bin_indices],
            starts,
        )
        rows["routed_experts"].append(np.empty(0, np.int16) if routes is None else routes.reshape(-1))
        rows["routed_experts_shape"].append([] if routes is None else list(routes.shape))
        rows["num_tokens"].append(int(starts[-1]))
        rows["num_sampled_tokens"].append(int(mask.sum()))
    return pa.table(rows, schema=MICRO_BATCH_SCHEMA)


def _segment_advantages(
    advantage: float,
    *,
    turn_advantages: np.ndarray | None,
    loss_mask: np.ndarray,
    logprobs: np.ndarray,
    teacher: np.ndarray,
    distillation: DistillationConfig,
) -> np.ndarray:
    """The segment's advantage on each token (each turn's own with turn-level credit); with a teacher's
    logprobs, mixed with its per-token signal."""
    task = (
        np.full(len(loss_mask), advantage, np.float32)
        if turn_advantages is None
        else spread_over_turns(turn_advantages, loss_mask)
    )
    if len(teacher) == 0:
        return task
    return token_advantages(
        distillation, task, loss_mask=loss_mask, student_logprobs=logprobs, teacher_logprobs=teacher
    )


def _packed_routes(
    segment_routes: Sequence[tuple[np.ndarray, Sequence[int]]], starts: np.ndarray
) -> np.ndarray | None:
    """The segments' recorded routes (flat values, shape) placed at their offsets in one row's
    [tokens, moe_layers, top_k] routes, -1 elsewhere; None when no segment of the row has routes."""
    shapes = {tuple(shape[1:]) for _, shape in segment_routes if shape}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(
            f"routed_experts: segments of one micro-batch disagree on [moe_layers, top_k]: {shapes}"
        )
    ((layers, top_k),) = shapes
    routes = np.full((int(starts[-1]), layers, top_k), -1, dtype=np.int16)
    for (values, shape), start in zip(segment_routes, starts[:-1], strict=True):
        if shape:
            routes[start : start + shape[0]] = values.reshape(shape)
    return routes


def padding_micro_batches(count: int) -> pa.Table:
    """``count`` one-token micro-batches with nothing to learn (keep every rank's number of forwards equal)."""
    one = {column.name: column.padding for column in MICRO_BATCH_COLUMNS}
    return pa.Table.from_pylist([one] * count, schema=MICRO_BATCH_SCHEMA)


# ------------------------------------------------------------------------------------------------------------
# Sources and the two pipelines
# ------------------------------------------------------------------------------------------------------------

TrajectorySource = Sequence[Path | str] | Sequence[Trajectory]


def _is_trajectories(source: TrajectorySource) -> bool:
    if not source:
        raise ValueError("trajectories: got no shard paths and no trajectories")
    kinds = {isinstance(item, Trajectory) for item in source}
    if kinds == {True}:
        return True
    if not all(isinstance(item, str | Path) for item in source):
        raise ValueError("trajectories: expected a list of shard paths or a list of Trajectory objects")
    return False


def read_segments(source: TrajectorySource) -> pa.Table:
    """Segment rows (``SEGMENT_SCHEMA``) of shard files or in-memory trajectories, in this process."""
    if _is_trajectories(source):
        return explode_segments(trajectories_to_table(source))
    return pa.concat_tables([explode_shard(path) for path in source])


@dataclass(kw_only=True)
class LocalStepBatches:
    """One step's micro-batches in this process (the plain pyarrow path)."""

    micro_batches: pa.Table
    metrics: dict[str, float]


def build_micro_batches_locally(
    source: TrajectorySource, algorithm: Algorithm, config: SampleBatchConfig, *, current_version: int
) -> LocalStepBatches:
    """The whole pipeline in this process with pyarrow only (no Ray)."""
    segments = read_segments(source)
    plan = plan_step(segments.select(SUMMARY_COLUMNS), algorithm, config, current_version=current_version)
    packed = pack_micro_batches(
        segments, plan=plan, max_tokens=config.max_tokens_per_micro_batch, distillation=config.distillation
    )
    return LocalStepBatches(
        micro_batches=packed, metrics=dict(plan.metrics, num_micro_batches=packed.num_rows)
    )


@dataclass(kw_only=True)
class RayStepBatches:
    """One step's packed micro-batches as a materialized Ray Dataset."""

    dataset: ray.data.Dataset
    num_micro_batches: int
    metrics: dict[str, float]

    def split_for_ranks(self, world_size: int) -> tuple[list[ray.data.Dataset], int]:
        """Contiguous near-equal shards, one per rank, and the micro-batch count every rank must run (ranks
        with fewer pad with ``padding_micro_batches``: FSDP needs the same number of forwards everywhere)."""
        per_rank = -(-self.num_micro_batches // world_size)
        indices = [min(per_rank * rank, self.num_micro_batches) for rank in range(1, world_size)]
        shards = self.dataset.split_at_indices(indices) if world_size > 1 else [self.dataset]
        return shards, per_rank


# Reading, exploding or packing a step's shards (seconds here); a wait past it is a stalled cluster.
READ_DEADLINE_S = 600.0


def _read_block(source: list[str] | pa.Table) -> tuple[pa.Table, pa.Table]:
    """One block's segment rows (from shard paths, or a table of trajectories) and their summary columns."""
    block = explode_segments(source) if isinstance(source, pa.Table) else read_segments(source)
    return block, block.select(SUMMARY_COLUMNS)


def _pack_block(block: pa.Table, plan: StepPlan, max_tokens: int, distillation: DistillationConfig) -> pa.Table:
    return pack_micro_batches(block, plan=plan, max_tokens=max_tokens, distillation=distillation)


def _contiguous_chunks(items: list[str], count: int) -> list[list[str]]:
    bounds = np.linspace(0, len(items), count + 1).round().astype(int)
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def build_micro_batches_with_ray(
    source: TrajectorySource,
    algorithm: Algorithm,
    config: SampleBatchConfig,
    *,
    current_version: int,
    max_read_tasks: int = 4,
) -> RayStepBatches:
    """The pipeline on Ray: shards → segment blocks (parallel read+explode tasks, one block per task, at most
    ``max_read_tasks``; each returns its block and its small summary columns) → the plan on the driver over
    the summaries → each block packed where it lies (parallel tasks) → a materialized Ray Dataset over the
    packed blocks, which the trainer splits per rank. Plain tasks, not Ray Data's executor: a step's blocks are
    few and already sized, and each Ray Data execution cost ~0.4 s here, two of them per step (measured:
    1.3-1.4 s vs 0.4-0.5 s for a step of 3.4 M tokens, ``benchmarks/data_pipeline.py``)."""
    import ray
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    if _is_trajectories(source):
        sources: Sequence[list[str] | pa.Table] = [trajectories_to_table(source).select(TRAJECTORY_COLUMNS)]
    else:
        paths = [str(path) for path in source]
        sources = _contiguous_chunks(paths, min(len(paths), max_read_tasks))
    read = ray.remote(num_returns=2)(_read_block)
    blocks_and_summaries = [read.remote(item) for item in sources]
    summaries = PENDING_WAITS.get_within(
        [summary for _, summary in blocks_and_summaries],
        deadline_s=READ_DEADLINE_S,
        component="batching tasks",
        request=f"read+explode of {len(sources)} blocks",
    )
    plan = plan_step(pa.concat_tables(summaries), algorithm, config, current_version=current_version)
    pack = ray.remote(_pack_block)
    plan_ref = ray.put(plan)
    packed = [
        pack.remote(block, plan_ref, config.max_tokens_per_micro_batch, config.distillation)
        for block, _ in blocks_and_summaries
    ]
    PENDING_WAITS.ready_within(
        packed, deadline_s=READ_DEADLINE_S, component="batching tasks", request=f"packing of {len(packed)} blocks"
    )
    dataset = ray.data.from_arrow_refs(packed)
    num_micro_batches = dataset.count()
    metrics = dict(plan.metrics, num_micro_batches=float(num_micro_batches))
    return RayStepBatches(dataset=dataset, num_micro_batches=num_micro_batches, metrics=metrics)


# ------------------------------------------------------------------------------------------------------------
# The torch view of one packed row
# ------------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class MicroBatch:
    """One packed row as torch tensors (what a train step consumes): the ``tensor`` fields of
    ``MICRO_BATCH_COLUMNS``, each of its column's ``tensor_dtype``."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    sequence_ids: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    weights: torch.Tensor
    weight_versions: torch.Tensor
    routed_experts: torch.Tensor | None = None  # [tokens, moe layers, top-k] for routing replay
    # per segment of the row (indexed by ``sequence_ids``): the distribution its tokens were sampled from;
    # None: temperature 1, no truncation
    temperature: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None

    @classmethod
    def from_row(cls, row: dict) -> MicroBatch:
        """From a ``MICRO_BATCH_SCHEMA`` row (numpy arrays or lists)."""
        import torch

        tensors = {
            column.tensor: torch.as_tensor(
                np.asarray(row[column.name]), dtype=getattr(torch, column.tensor_dtype)
            )
            for column in MICRO_BATCH_COLUMNS
            if column.tensor is not None
        }
        shape = row.get("routed_experts_shape")
        route_shape = tuple(int(n) for n in shape) if shape is not None else ()
        tensors["routed_experts"] = tensors["routed_experts"].reshape(route_shape) if route_shape else None
        return cls(**tensors)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


def micro_batches_from_table(table: pa.Table) -> list[MicroBatch]:
    """Every row of a micro-batch table as a ``MicroBatch``."""
    return [MicroBatch.from_row(row) for row in table.to_pylist()]
