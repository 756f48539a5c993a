"""The trajectory data model and the one Arrow schema that defines it on disk.

A trajectory is one agent run on one task. Its tokens are a list of *segments*: each segment is one
append-only token sequence as the policy saw it (prompt tokens + sampled tokens + appended tool/user turns);
a new segment starts whenever a request no longer extends the previous one (``Segment.reason`` says why).
Segments form a tree (a session's lineage): each one records the segment it branched from
(``parent_segment``, -1 for the root), how many of the parent's tokens preceded the branch
(``branch_position``), and what kind of branch it is (``branch_kind``: a sub-agent, a compaction, a side call,
a retry, …), so that training can weight or filter branches by kind.
Every token of a segment was sampled from one distribution (``Segment.sampling``: temperature, top-p,
top-k), which the trainer recomputes logprobs under; MoE segments may carry the experts the engine routed
each position to (``Segment.routed_experts``), which the trainer replays (R3).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np
import pyarrow as pa

from components.json_types import JsonObject
from components.sampling import SamplingDistribution


class TrajectoryStatus(StrEnum):
    """How a rollout ended. Trainable statuses are policy outcomes; the others are infrastructure failures."""

    OK = "ok"
    TIMEOUT = "timeout"  # the agent ran past its wall-clock bound (policy behaviour: trainable)
    TURN_LIMIT = "turn_limit"  # the agent ran past its turn bound (trainable)
    CONTEXT_OVERFLOW = "context_overflow"  # the conversation outgrew the context window (trainable)
    AGENT_ERROR = "agent_error"  # the agent program crashed or broke protocol
    SANDBOX_ERROR = "sandbox_error"  # the sandbox died or could not be created
    ENGINE_ERROR = "engine_error"  # inference failed
    GRADING_ERROR = "grading_error"  # the grader could not reach a verdict
    DISCARDED = "discarded"  # the harness discarded the session


TRAINABLE_STATUSES = frozenset(
    {
        TrajectoryStatus.OK,
        TrajectoryStatus.TIMEOUT,
        TrajectoryStatus.TURN_LIMIT,
        TrajectoryStatus.CONTEXT_OVERFLOW,
    }
)
# failures that are no one's doing in the rollout (the agent's own crashes are ``agent_error``)
INFRASTRUCTURE_STATUSES = frozenset(
    {TrajectoryStatus.SANDBOX_ERROR, TrajectoryStatus.ENGINE_ERROR, TrajectoryStatus.GRADING_ERROR}
)
# A trajectory metric the proxy sets on every trajectory it finalizes: call-like text the model wrote that the
# tool format could not parse (broken JSON, cut short), served to the agent as content.
MALFORMED_TOOL_CALLS_METRIC = "num_malformed_tool_calls"


class SegmentReason(StrEnum):
    """Why a segment started."""

    START = "start"  # first request of the session
    HISTORY_REWRITTEN = "history_rewritten"  # earlier turns changed (compaction, summary, edits)
    TOOLS_CHANGED = "tools_changed"  # the tool list changed
    SYSTEM_CHANGED = "system_changed"  # the system prompt changed
    PREFIX_MISMATCH = (
        "prefix_mismatch"  # the template's render of the held turns no longer matches the held ids
    )
    RENDER_FAILED = "render_failed"  # incremental rendering failed; the full conversation was rendered anew
    SAMPLING_CHANGED = "sampling_changed"  # the request asked for another sampling distribution


class BranchKind(StrEnum):
    """How a segment relates to the segment it branched from (``Segment.parent_segment``)."""

    ROOT = "root"  # the session's first conversation: no parent
    SUBAGENT = "subagent"  # a conversation started by a tool call of the parent (Claude Code's Task tool,
    #                        Gemini CLI's invoke_agent, Codex's spawn_agent): its first prompt is that call's text
    COMPACTION = (
        "compaction"  # the parent's conversation resumed from a summary the policy wrote in the parent
    )
    SIDE_CALL = "side_call"  # a one-off request beside the parent (titles, summaries, classifiers, checks)
    RETRY = "retry"  # the request of an earlier turn of the parent, sent again
    FORK = "fork"  # the parent's conversation up to an earlier turn, continued differently (edited history)
    CONTINUATION = "continuation"  # the parent's whole conversation continued in a new segment (another
    #                                sampling distribution, or a turn that raced a concurrent one)


def sampled_turn_starts(loss_mask: np.ndarray) -> np.ndarray:
    """Where each turn starts: the first token of every maximal run of ``loss_mask == 1``."""
    mask = np.asarray(loss_mask) == 1
    return np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))


def _optional_arrays_equal(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return np.array_equal(a, b) if a is not None and b is not None else a is b


@dataclass(frozen=True, kw_only=True, eq=False)
class Segment:
    """One append-only token sequence. ``loss_mask`` is 1 exactly on tokens the policy sampled; ``logprobs``
    holds their sampling logprobs and 0 elsewhere; ``weight_versions`` the policy version per token (-1 for
    tokens the policy did not sample). ``sampling`` is the distribution every sampled token of the segment
    was drawn from (its logprobs are under it). ``routed_experts`` (MoE, when recorded) is
    ``[positions, moe_layers, top_k]`` expert ids for the first ``positions`` tokens (the last token is never
    fed to the model, so ``positions < len(token_ids)``); -1 marks a position without a route."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    weight_versions: np.ndarray
    reason: SegmentReason = SegmentReason.START
    sampling: SamplingDistribution = SamplingDistribution()
    routed_experts: np.ndarray | None = None
    parent_segment: int = -1  # index of the segment this one branched from in its trajectory; -1: none
    branch_position: int = 0  # how many of the parent's tokens preceded the branch point
    branch_kind: BranchKind = BranchKind.ROOT
    # on-policy distillation: a teacher's teacher-forced logprob of each sampled token (0 elsewhere), recorded
    # with the rollout so a resumed run never scores it again (``components/training/distillation.py``)
    teacher_logprobs: np.ndarray | None = None
    # turn-level credit: a process reward per turn of this segment (a turn is one maximal run of sampled
    # tokens, ``sampled_turn_starts``), in order; None when the harness and grader gave none
    # (``components/training/turn_credit.py``)
    turn_rewards: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", np.asarray(self.token_ids, dtype=np.int32))
        if self.teacher_logprobs is not None:
            teacher = np.asarray(self.teacher_logprobs, dtype=np.float32)
            if teacher.shape != np.shape(self.token_ids) or not np.isfinite(teacher).all():
                raise ValueError(
                    f"segment.teacher_logprobs: expected {len(self.token_ids)} finite entries, got {teacher.shape}"
                )
            object.__setattr__(self, "teacher_logprobs", teacher)
        object.__setattr__(self, "loss_mask", np.asarray(self.loss_mask, dtype=np.int8))
        if self.turn_rewards is not None:
            rewards = np.asarray(self.turn_rewards, dtype=np.float32)
            num_turns = len(sampled_turn_starts(self.loss_mask))
            if rewards.shape != (num_turns,) or not np.isfinite(rewards).all():
                raise ValueError(
                    f"segment.turn_rewards: expected {num_turns} finite entries (one per turn: a run of "
                    f"sampled tokens), got shape {rewards.shape}"
                )
            object.__setattr__(self, "turn_rewards", rewards)
        object.__setattr__(self, "logprobs", np.asarray(self.logprobs, dtype=np.float32))
        object.__setattr__(self, "weight_versions", np.asarray(self.weight_versions, dtype=np.int32))
        if not isinstance(self.sampling, SamplingDistribution):
            raise ValueError(
                f"segment.sampling: expected SamplingDistribution, got {type(self.sampling).__name__}"
            )
        if self.routed_experts is not None:
            routes = np.asarray(self.routed_experts)
            if routes.ndim != 3 or routes.shape[0] >= max(len(self.token_ids), 1):
                raise ValueError(
                    f"segment.routed_experts: expected [positions < {len(self.token_ids)}, moe_layers, top_k], "
                    f"got shape {routes.shape}"
                )
            if routes.size and (routes.min() < -1 or routes.max() > np.iinfo(np.int16).max):
                raise ValueError("segment.routed_experts: expert ids must be in [-1, 32767]")
            object.__setattr__(self, "routed_experts", routes.astype(np.int16))
        try:
            object.__setattr__(self, "reason", SegmentReason(self.reason))
        except ValueError:
            raise ValueError(
                f"segment.reason: unknown reason {self.reason!r}; allowed: {[r.value for r in SegmentReason]}"
            ) from None
        try:
            object.__setattr__(self, "branch_kind", BranchKind(self.branch_kind))
        except ValueError:
            raise ValueError(
                f"segment.branch_kind: unknown kind {self.branch_kind!r}; allowed: {[k.value for k in BranchKind]}"
            ) from None
        if (self.parent_segment == -1) != (self.branch_kind == BranchKind.ROOT):
            raise ValueError("segment.parent_segment: must be -1 exactly when branch_kind is root")
        if self.parent_segment < -1 or self.branch_position < 0:
            raise ValueError("segment.parent_segment / branch_position: must be >= -1 / >= 0")
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "weight_versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"segment.{name}: has {len(getattr(self, name))} entries for {n} token_ids")
        if self.token_ids.ndim != 1:
            raise ValueError("segment.token_ids: must be one-dimensional")
        if not np.isin(self.loss_mask, (0, 1)).all():
            raise ValueError("segment.loss_mask: entries must be 0 or 1")
        if not np.isfinite(self.logprobs).all():
            raise ValueError("segment.logprobs: entries must be finite")
        if (self.logprobs[self.loss_mask == 0] != 0).any():
            raise ValueError("segment.logprobs: must be 0 where loss_mask is 0")
        if (self.logprobs[self.loss_mask == 1] > 0).any():
            raise ValueError("segment.logprobs: sampled-token logprobs must be <= 0")

    @property
    def num_sampled_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def num_turns(self) -> int:
        """The segment's turns: maximal runs of sampled tokens (one per model call it records)."""
        return len(sampled_turn_starts(self.loss_mask))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Segment):
            return NotImplemented
        return (
            self.reason == other.reason
            and np.array_equal(self.token_ids, other.token_ids)
            and np.array_equal(self.loss_mask, other.loss_mask)
            and np.array_equal(self.logprobs, other.logprobs)
            and np.array_equal(self.weight_versions, other.weight_versions)
            and self.sampling == other.sampling
            and (self.parent_segment, self.branch_position, self.branch_kind)
            == (other.parent_segment, other.branch_position, other.branch_kind)
            and (
                np.array_equal(self.teacher_logprobs, other.teacher_logprobs)
                if self.teacher_logprobs is not None and other.teacher_logprobs is not None
                else self.teacher_logprobs is other.teacher_logprobs
            )
            and _optional_arrays_equal(self.turn_rewards, other.turn_rewards)
            and (
                np.array_equal(self.routed_experts, other.routed_experts)
                if self.routed_experts is not None and other.routed_experts is not None
                else self.routed_experts is other.routed_experts
            )
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """One agent run on one task, with its reward and the tokens training needs."""

    trajectory_id: str
    group_id: str  # the GRPO group: trajectories sampled for the same prompt
    task_id: str
    harness: str
    status: TrajectoryStatus
    failure_reason: str = ""  # empty exactly when status is ok
    reward: float | None = None
    step: int = 0  # the rollout step (policy version asked for) this trajectory was collected in
    metrics: Mapping[str, float] = field(default_factory=dict)
    segments: tuple[Segment, ...] = ()
    messages_json: str = "[]"  # the final conversation as the proxy saw it (for the viewer)
    log: str = ""  # harness and grading log (for the viewer)

    def __post_init__(self) -> None:
        for name in ("trajectory_id", "group_id", "task_id", "harness"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"trajectory.{name}: must be a non-empty string")
        try:
            object.__setattr__(self, "status", TrajectoryStatus(self.status))
        except ValueError:
            raise ValueError(
                f"trajectory.status: unknown status {self.status!r}; "
                f"allowed: {[s.value for s in TrajectoryStatus]}"
            ) from None
        if self.status == TrajectoryStatus.OK and self.failure_reason:
            raise ValueError("trajectory.failure_reason: must be empty when status is ok")
        if self.status != TrajectoryStatus.OK and not self.failure_reason:
            raise ValueError(f"trajectory.failure_reason: must say why the status is {self.status.value}")
        if self.reward is not None and not np.isfinite(self.reward):
            raise ValueError(f"trajectory.reward: must be finite or None, got {self.reward!r}")
        object.__setattr__(self, "segments", tuple(self.segments))
        for index, segment in enumerate(self.segments):
            if not isinstance(segment, Segment):
                raise ValueError(f"trajectory.segments: expected Segment, got {type(segment).__name__}")
            if segment.parent_segment >= index:
                raise ValueError(
                    f"trajectory.segments[{index}].parent_segment: {segment.parent_segment} must name an earlier segment"
                )
        metrics = {str(k): float(v) for k, v in dict(self.metrics).items()}
        object.__setattr__(self, "metrics", metrics)

    @property
    def trainable(self) -> bool:
        """Whether this trajectory may enter a training batch."""
        return self.status in TRAINABLE_STATUSES and self.reward is not None

    @property
    def messages(self) -> list[JsonObject]:
        return json.loads(self.messages_json)


SEGMENT_TYPE = pa.struct(
    [
        pa.field("reason", pa.string(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("weight_versions", pa.list_(pa.int32()), nullable=False),
        pa.field("temperature", pa.float64(), nullable=False),
        pa.field("top_p", pa.float64(), nullable=False),
        pa.field("top_k", pa.int32(), nullable=False),
        # R3 routes, compact: expert ids flattened in [positions, moe_layers, top_k] order, plus that shape
        # (both empty when the segment has no routes)
        pa.field("routed_experts", pa.list_(pa.int16()), nullable=False),
        pa.field("routed_experts_shape", pa.list_(pa.int32()), nullable=False),
        # lineage (trajectory/3); nullable so that trajectory/2 files read as roots
        pa.field("parent_segment", pa.int32(), nullable=True),
        pa.field("branch_position", pa.int64(), nullable=True),
        pa.field("branch_kind", pa.string(), nullable=True),
        # a teacher's logprobs per token (on-policy distillation); empty when not scored, null in older files
        pa.field("teacher_logprobs", pa.list_(pa.float32()), nullable=True),
        # a process reward per turn of the segment (trajectory/4); empty when none, null in older files
        pa.field("turn_rewards", pa.list_(pa.float32()), nullable=True),
    ]
)

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("failure_reason", pa.string(), nullable=False),
        pa.field("reward", pa.float64(), nullable=True),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("metrics", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("segments", pa.list_(SEGMENT_TYPE), nullable=False),
        pa.field("messages_json", pa.string(), nullable=False),
        pa.field("log", pa.string(), nullable=False),
    ],
    metadata={"rein.schema": "trajectory/4"},
)


def _segment_to_row(segment: Segment) -> dict[str, object]:
    return {
        "reason": segment.reason.value,
        "token_ids": segment.token_ids,
        "loss_mask": segment.loss_mask,
        "logprobs": segment.logprobs,
        "weight_versions": segment.weight_versions,
        "temperature": segment.sampling.temperature,
        "top_p": segment.sampling.top_p,
        "top_k": segment.sampling.top_k,
        "routed_experts": (
            segment.routed_experts.reshape(-1)
            if segment.routed_experts is not None
            else np.empty(0, np.int16)
        ),
        "routed_experts_shape": (
            list(segment.routed_experts.shape) if segment.routed_experts is not None else []
        ),
        "parent_segment": segment.parent_segment,
        "branch_position": segment.branch_position,
        "branch_kind": segment.branch_kind.value,
        "teacher_logprobs": (
            segment.teacher_logprobs if segment.teacher_logprobs is not None else np.empty(0, np.float32)
        ),
        "turn_rewards": segment.turn_rewards,  # null when none were given
    }


def with_turn_rewards(segments: Sequence[Segment], turn_rewards: Sequence[float]) -> tuple[Segment, ...]:
    """``segments`` with ``turn_rewards`` (one per model call, in call order) split over their turns in segment
    order; ``ValueError`` unless there is exactly one reward per turn."""

    rewards = np.asarray(turn_rewards, dtype=np.float64)
    bounds = np.cumsum([0, *(segment.num_turns for segment in segments)])
    if len(rewards) != bounds[-1]:
        raise ValueError(
            f"turn_rewards: {len(rewards)} rewards for {bounds[-1]} turns (one per model call the session recorded)"
        )
    return tuple(
        replace(segment, turn_rewards=rewards[bounds[i] : bounds[i + 1]])
        for i, segment in enumerate(segments)
    )


def trajectories_to_table(trajectories: Sequence[Trajectory]) -> pa.Table:
    """Trajectories → an Arrow table with ``TRAJECTORY_SCHEMA``."""
    rows = {name: [] for name in TRAJECTORY_SCHEMA.names}
    for t in trajectories:
        if not isinstance(t, Trajectory):
            raise ValueError(f"expected Trajectory, got {type(t).__name__}")
        rows["trajectory_id"].append(t.trajectory_id)
        rows["group_id"].append(t.group_id)
        rows["task_id"].append(t.task_id)
        rows["harness"].append(t.harness)
        rows["status"].append(t.status.value)
        rows["failure_reason"].append(t.failure_reason)
        rows["reward"].append(t.reward)
        rows["step"].append(t.step)
        rows["metrics"].append(list(t.metrics.items()))
        rows["segments"].append([_segment_to_row(s) for s in t.segments])
        rows["messages_json"].append(t.messages_json)
        rows["log"].append(t.log)
    return pa.Table.from_pydict(rows, schema=TRAJECTORY_SCHEMA)


def _segment_from_row(row: Mapping[str, Any]) -> Segment:
    shape = tuple(row["routed_experts_shape"])
    return Segment(
        sampling=SamplingDistribution(temperature=row["temperature"], top_p=row["top_p"], top_k=row["top_k"]),
        routed_experts=(np.asarray(row["routed_experts"], dtype=np.int16).reshape(shape) if shape else None),
        token_ids=np.asarray(row["token_ids"], dtype=np.int32),
        loss_mask=np.asarray(row["loss_mask"], dtype=np.int8),
        logprobs=np.asarray(row["logprobs"], dtype=np.float32),
        weight_versions=np.asarray(row["weight_versions"], dtype=np.int32),
        reason=SegmentReason(row["reason"]),
        # a trajectory/2 file has no lineage: its segments read as roots
        parent_segment=-1 if row.get("parent_segment") is None else row["parent_segment"],
        branch_position=row.get("branch_position") or 0,
        branch_kind=row.get("branch_kind") or BranchKind.ROOT,
        teacher_logprobs=(
            np.asarray(row["teacher_logprobs"], dtype=np.float32) if row.get("teacher_logprobs") else None
        ),
        turn_rewards=(
            None if row.get("turn_rewards") is None else np.asarray(row["turn_rewards"], dtype=np.float32)
        ),
    )


def trajectories_from_table(table: pa.Table) -> list[Trajectory]:
    """An Arrow table with ``TRAJECTORY_SCHEMA`` → trajectories (validated again)."""
    out = []
    for row in table.to_pylist():
        out.append(
            Trajectory(
                trajectory_id=row["trajectory_id"],
                group_id=row["group_id"],
                task_id=row["task_id"],
                harness=row["harness"],
                status=TrajectoryStatus(row["status"]),
                failure_reason=row["failure_reason"],
                reward=row["reward"],
                step=row["step"],
                metrics=dict(row["metrics"]),
                segments=tuple(_segment_from_row(s) for s in row["segments"]),
                messages_json=row["messages_json"],
                log=row["log"],
            )
        )
    return out
