"""Crash-safe Parquet shards of trajectories under ``RUN_DIR/trajectories/``.

A shard is written to a hidden temp file in the same directory, flushed and fsynced, renamed into place with
``os.replace`` and the directory fsynced: a reader lists only renamed ``*.parquet`` files, so it never sees
a partial shard. A temp file's name carries its writer's pid; temp files whose writer is gone (torn by a
crash) are removed on the next open, while a live writer's are left alone (a reader may open the store
mid-write). A corrupt shard (truncated,
garbage) is reported with its path and skipped - never silently, never crashing the reader.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from components.errors import TrajectoryStoreError
from components.trajectory import (
    TRAJECTORY_SCHEMA,
    Trajectory,
    trajectories_from_table,
    trajectories_to_table,
)

logger = logging.getLogger(__name__)

SHARD_SUFFIX = ".parquet"
TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True, kw_only=True)
class CorruptShard:
    path: Path
    error: str


@dataclass(kw_only=True)
class StoreReadResult:
    """Everything readable, plus the shards that were not."""

    trajectories: list[Trajectory] = field(default_factory=list)
    corrupt_shards: list[CorruptShard] = field(default_factory=list)


def _writer_alive(temp_path: Path) -> bool:
    """Whether the process that is writing ``temp_path`` (pid in its name) still runs."""
    pid_text = temp_path.name.removeprefix(TEMP_PREFIX).split("-", 1)[0]
    if not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TrajectoryStore:
    """Append-only store of trajectory shards in ``run_dir/trajectories``. One writer per process."""

    def __init__(self, run_dir: Path | str) -> None:
        self.directory = Path(run_dir) / "trajectories"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._clean_temp_files()

    def _clean_temp_files(self) -> None:
        for path in self.directory.glob(f"{TEMP_PREFIX}*"):
            if not _writer_alive(path):
                logger.info("removing torn temp shard %s", path)
                path.unlink(missing_ok=True)

    def write(self, trajectories: Sequence[Trajectory]) -> Path | None:
        """Write one shard atomically; return its path (None for an empty batch).

        Validation happens before anything touches the disk: an invalid trajectory raises ``ValueError``.
        """
        if not trajectories:
            return None
        table = trajectories_to_table(trajectories)
        name = f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:12]}{SHARD_SUFFIX}"
        final = self.directory / name
        temp = self.directory / f"{TEMP_PREFIX}{os.getpid()}-{name}"
        try:
            with open(temp, "wb") as handle:
                pq.write_table(table, handle, compression="zstd")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, final)
            _fsync_dir(self.directory)
        except OSError as error:
            temp.unlink(missing_ok=True)
            raise TrajectoryStoreError(f"could not write shard {final}: {error}") from error
        return final

    def shard_paths(self) -> list[Path]:
        """Completed shards, oldest first."""
        return sorted(
            p for p in self.directory.glob(f"*{SHARD_SUFFIX}") if not p.name.startswith(TEMP_PREFIX)
        )

    @staticmethod
    def read_shard(path: Path) -> list[Trajectory]:
        """Read one shard; raises on a corrupt file."""
        table = pq.read_table(path, schema=TRAJECTORY_SCHEMA)
        return trajectories_from_table(table)

    def iter_shards(self) -> Iterator[tuple[Path, list[Trajectory] | CorruptShard]]:
        """Each shard with its trajectories, or a ``CorruptShard`` saying why it could not be read."""
        for path in self.shard_paths():
            try:
                yield path, self.read_shard(path)
            except (OSError, pa.ArrowException, ValueError, KeyError, TypeError) as error:
                logger.warning("skipping corrupt trajectory shard %s: %s", path, error)
                yield path, CorruptShard(path=path, error=f"{type(error).__name__}: {error}")

    def read_all(self) -> StoreReadResult:
        """All readable trajectories and every corrupt shard."""
        result = StoreReadResult()
        for _, item in self.iter_shards():
            if isinstance(item, CorruptShard):
                result.corrupt_shards.append(item)
            else:
                result.trajectories.extend(item)
        return result
