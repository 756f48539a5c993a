"""The pieces between the rollout producer and the trainer: complete GRPO groups, their staleness, the ledger.

- ``GroupBuffer`` collects committed trajectories by group and hands out *complete* groups only: a group is
  trainable once all ``group_size`` members finished (a failed member is a finished member: it is committed
  with its failure status and simply carries no reward).
- ``group_staleness`` measures a group against the policy version the trainer is at: per token, the oldest
  sampled token of the whole group decides (prompt tokens, version -1, never count).
- ``TrajectoryLedger`` records which committed shard went into which step, and which were dropped (for
  staleness) — saved in the checkpoint's trainer state, so a resumed run trains every committed trajectory
  exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from components.config import require, require_non_negative, require_positive
from components.json_types import JsonObject, JsonValue
from components.trajectory import Trajectory

# Group ids the producer gives out: ``g<index>-<task id>``, so a resumed run knows each group's index.
_GROUP_ID = re.compile(r"^g(?P<index>\d{8})-")


def group_id_for(index: int, task_id: str) -> str:
    """The id of the producer's ``index``-th group (stable across restarts: resume completes it)."""
    require_non_negative(index, "index")
    return f"g{index:08d}-{task_id}"


def group_index(group_id: str) -> int | None:
    """The producer's index of a group id made by ``group_id_for`` (None for any other id)."""
    match = _GROUP_ID.match(group_id)
    return int(match["index"]) if match else None


@dataclass(frozen=True, kw_only=True)
class Member:
    """One committed trajectory and the shard that holds it."""

    trajectory: Trajectory
    shard: Path


@dataclass(frozen=True, kw_only=True)
class Group:
    """A complete GRPO group: every member finished (ok or classified failure) and committed."""

    group_id: str
    index: int
    members: tuple[Member, ...]

    @property
    def shards(self) -> list[Path]:
        """The shards holding the members (one, when the producer committed the group as a whole)."""
        return list(dict.fromkeys(member.shard for member in self.members))

    @property
    def trajectories(self) -> list[Trajectory]:
        return [member.trajectory for member in self.members]


def oldest_token_version(trajectories: Iterable[Trajectory]) -> int | None:
    """The oldest weight version of any sampled token (None when no token was sampled)."""
    oldest: int | None = None
    for trajectory in trajectories:
        for segment in trajectory.segments:
            versions = segment.weight_versions[(segment.loss_mask == 1) & (segment.weight_versions >= 0)]
            if versions.size:
                low = int(versions.min())
                oldest = low if oldest is None else min(oldest, low)
    return oldest


def group_staleness(trajectories: Iterable[Trajectory], current_version: int) -> int:
    """How many versions the group's oldest sampled token lags ``current_version`` (0 when nothing sampled:
    a group of failures has no off-policy token to weigh)."""
    oldest = oldest_token_version(trajectories)
    return 0 if oldest is None else max(0, current_version - oldest)


@dataclass(frozen=True, kw_only=True)
class StalenessSplit:
    fresh: list[Group]
    stale: list[Group]
    staleness: list[int]  # of every group, fresh or stale, in input order (for the histogram)


def split_stale(groups: Sequence[Group], *, current_version: int, max_staleness: int) -> StalenessSplit:
    """Groups within ``max_staleness`` versions of ``current_version``, and those beyond it (to drop)."""
    require_non_negative(max_staleness, "max_staleness")
    fresh, stale, staleness = [], [], []
    for group in groups:
        lag = group_staleness(group.trajectories, current_version)
        staleness.append(lag)
        (stale if lag > max_staleness else fresh).append(group)
    return StalenessSplit(fresh=fresh, stale=stale, staleness=staleness)


def staleness_histogram(staleness: Sequence[int], *, max_bucket: int = 4) -> dict[str, float]:
    """Groups per staleness (``staleness/groups_N``; the last bucket holds ``max_bucket`` and more)."""
    counts = np.bincount(
        np.minimum(np.asarray(staleness, dtype=np.int64), max_bucket), minlength=max_bucket + 1
    )
    histogram = {f"staleness/groups_{lag}": float(count) for lag, count in enumerate(counts[:max_bucket])}
    histogram[f"staleness/groups_{max_bucket}_plus"] = float(counts[max_bucket])
    histogram["staleness/mean"] = float(np.mean(staleness)) if len(staleness) else 0.0
    histogram["staleness/max"] = float(max(staleness)) if len(staleness) else 0.0
    return histogram


class GroupBuffer:
    """Committed trajectories by group; hands out complete groups only, oldest-completed first."""

    def __init__(self, group_size: int) -> None:
        require_positive(group_size, "group_size")
        self.group_size = group_size
        self._partial: dict[str, list[Member]] = {}
        self._complete: dict[str, Group] = {}  # insertion order = completion order

    def add(self, trajectory: Trajectory, shard: Path) -> Group | None:
        """Add one committed trajectory; return its group when this member completed it."""
        index = group_index(trajectory.group_id)
        require(index is not None, "group_id", f"{trajectory.group_id!r} was not made by group_id_for")
        require(
            trajectory.group_id not in self._complete,
            "group_id",
            f"group {trajectory.group_id!r} is already complete ({self.group_size} members)",
        )
        members = self._partial.setdefault(trajectory.group_id, [])
        require(
            all(m.trajectory.trajectory_id != trajectory.trajectory_id for m in members),
            "trajectory_id",
            f"{trajectory.trajectory_id!r} was added twice",
        )
        members.append(Member(trajectory=trajectory, shard=Path(shard)))
        if len(members) < self.group_size:
            return None
        del self._partial[trajectory.group_id]
        group = Group(group_id=trajectory.group_id, index=index, members=tuple(members))
        self._complete[group.group_id] = group
        return group

    def add_group(self, trajectories: Sequence[Trajectory], shard: Path) -> Group | None:
        """Add every member of a group committed as one shard; return the group once complete."""
        completed = None
        for trajectory in trajectories:
            completed = self.add(trajectory, shard)
        return completed

    @property
    def depth(self) -> int:
        """Complete groups waiting for the trainer."""
        return len(self._complete)

    @property
    def num_partial(self) -> int:
        """Groups with some but not all members committed."""
        return len(self._partial)

    def members_of(self, group_id: str) -> int:
        """Committed members of a group (complete or not)."""
        if group_id in self._complete:
            return self.group_size
        return len(self._partial.get(group_id, ()))

    def take(self, count: int) -> list[Group]:
        """Up to ``count`` complete groups, in the order they completed (the trainer never waits for a slow
        group while faster ones are ready)."""
        taken = list(self._complete.values())[:count]
        for group in taken:
            del self._complete[group.group_id]
        return taken

    def take_indices(self, indices: Iterable[int]) -> list[Group] | None:
        """Exactly the groups with these producer indices, once all of them are complete; else None (nothing
        taken). The ordered (``partial``) mode trains step by step like ``sync`` does."""
        by_index = {group.index: group for group in self._complete.values()}
        wanted = list(indices)
        if not all(index in by_index for index in wanted):
            return None
        for index in wanted:
            del self._complete[by_index[index].group_id]
        return [by_index[index] for index in wanted]


LEDGER_KEY = "trajectory_ledger"


@dataclass(kw_only=True)
class TrajectoryLedger:
    """Which committed shard went into which step, and which were dropped and why. Lives in the trainer
    state's ``extra`` (checkpointed with the weights), so it is exactly as old as the weights it describes."""

    step_shards: dict[int, list[str]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # shard name -> reason

    @property
    def steps_done(self) -> int:
        return len(self.step_shards)

    def record_step(self, step: int, shards: Iterable[Path | str]) -> None:
        names = [Path(shard).name for shard in shards]
        require(step not in self.step_shards, "step", f"step {step} is already in the ledger")
        require(not set(names) & self.settled(), "shards", "a shard was already trained or dropped")
        self.step_shards[step] = names

    def record_dropped(self, shards: Iterable[Path | str], reason: str) -> None:
        for shard in shards:
            name = Path(shard).name
            require(name not in self.settled(), "shards", f"{name} was already trained or dropped")
            self.dropped[name] = reason

    def trained(self) -> set[str]:
        return {name for names in self.step_shards.values() for name in names}

    def settled(self) -> set[str]:
        """Shards that must never be trained again: trained into a step, or dropped."""
        return self.trained() | set(self.dropped)

    def to_state(self) -> JsonObject:
        return {
            "step_shards": {str(k): list(v) for k, v in self.step_shards.items()},
            "dropped": dict(self.dropped),
        }

    @classmethod
    def from_state(cls, extra: Mapping[str, JsonValue]) -> TrajectoryLedger:
        data = extra.get(LEDGER_KEY) or {}
        return cls(
            step_shards={int(k): list(v) for k, v in dict(data.get("step_shards", {})).items()},
            dropped={str(k): str(v) for k, v in dict(data.get("dropped", {})).items()},
        )
