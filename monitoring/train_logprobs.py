"""Per-token train-side logprobs for the viewer: ``RUN_DIR/train_logprobs/*.parquet``.

One row per (trajectory, segment): ``trajectory_id`` (string), ``segment`` (index into the trajectory's
segments), ``logprobs`` (list of float: one per token of the segment - 0 on prompt tokens - or one per sampled
token). The trainer writes them (optional); the viewer colours sampled tokens by |train − rollout| with them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

TRAIN_LOGPROBS_DIR_NAME = "train_logprobs"
TRAIN_LOGPROBS_SCHEMA = pa.schema(
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("segment", pa.int32(), nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
    ]
)


def write_train_logprobs(
    run_dir: Path | str, step: int, rows: Iterable[tuple[str, int, Sequence[float]]], *, rank: int = 0
) -> Path | None:
    """Write one step's (trajectory_id, segment, logprobs) rows atomically; None when there are none."""
    columns: dict[str, list] = {"trajectory_id": [], "segment": [], "logprobs": []}
    for trajectory_id, segment, logprobs in rows:
        values = np.asarray(logprobs, dtype=np.float32)
        if values.ndim != 1 or not np.isfinite(values).all():
            raise ValueError(
                f"logprobs of {trajectory_id!r} segment {segment}: must be a finite 1-d sequence"
            )
        columns["trajectory_id"].append(str(trajectory_id))
        columns["segment"].append(int(segment))
        columns["logprobs"].append(values)
    if not columns["trajectory_id"]:
        return None
    directory = Path(run_dir) / TRAIN_LOGPROBS_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{int(step):08d}-rank-{int(rank)}.parquet"
    temp = directory / f".tmp-{final.name}"
    try:
        pq.write_table(pa.Table.from_pydict(columns, schema=TRAIN_LOGPROBS_SCHEMA), temp, compression="zstd")
        os.replace(temp, final)
    finally:
        temp.unlink(missing_ok=True)
    return final


def read_train_logprobs(run_dir: Path | str) -> dict[tuple[str, int], np.ndarray]:
    """Every row keyed by (trajectory id, segment index); unreadable files are skipped with a warning."""
    directory = Path(run_dir) / TRAIN_LOGPROBS_DIR_NAME
    out: dict[tuple[str, int], np.ndarray] = {}
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.parquet")):
        if path.name.startswith("."):
            continue
        try:
            table = pq.read_table(path)
            segment_column = "segment" if "segment" in table.column_names else "segment_index"
            for row in table.select(["trajectory_id", segment_column, "logprobs"]).to_pylist():
                out[(str(row["trajectory_id"]), int(row[segment_column]))] = np.asarray(
                    row["logprobs"], dtype=np.float64
                )
        except Exception as error:  # the viewer still works without them
            logger.warning("skipping unreadable train-logprob file %s: %s", path, error)
    return out
