"""The micro-batch layout is stated once (``MICRO_BATCH_COLUMNS``): the Arrow schema, the padding row and the
``MicroBatch`` tensors all follow it, so a column added in one place and not the others fails here."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from components.sampling import SamplingDistribution
from components.training.data import (
    MICRO_BATCH_COLUMNS,
    MICRO_BATCH_SCHEMA,
    MicroBatch,
    Per,
    SampleBatchConfig,
    build_micro_batches_locally,
    padding_micro_batches,
)
from components.training.grpo import GRPO
from components.trajectory import Segment
from tests.components.training.training_synthetic import make_segment, make_trajectory


def routed_segment(length: int, *, seed: int) -> Segment:
    """A segment with MoE routes ([positions, 2 layers, top-2]) and its own sampling distribution."""
    plain = make_segment(2, length - 2, seed=seed)
    routes = np.random.default_rng(seed).integers(0, 4, (length - 1, 2, 2))
    return dataclasses.replace(
        plain, sampling=SamplingDistribution(temperature=0.7, top_k=5), routed_experts=routes
    )


def packed_rows() -> list[dict]:
    """Rows of every kind: several segments per row, with and without routes."""
    trajectories = [
        make_trajectory("plain", "g", 1.0, (make_segment(3, 4, seed=1), make_segment(2, 3, seed=2))),
        make_trajectory("routed", "g", 0.0, (routed_segment(6, seed=3), routed_segment(5, seed=4))),
    ]
    local = build_micro_batches_locally(
        trajectories, GRPO(), SampleBatchConfig(max_tokens_per_micro_batch=12), current_version=0
    )
    return local.micro_batches.to_pylist()


def check_row(row: dict) -> None:
    """Every column holds one value per what its ``per`` says, and becomes its tensor with its dtype."""
    num_tokens = row["num_tokens"]
    num_segments = max(row["sequence_ids"]) + 1
    batch = MicroBatch.from_row(row)
    for column in MICRO_BATCH_COLUMNS:
        value = row[column.name]
        if column.name == "routed_experts":  # flattened [tokens, moe_layers, top_k]
            assert len(value) == int(np.prod(row["routed_experts_shape"])) * bool(row["routed_experts_shape"])
        elif column.per == Per.TOKEN:
            assert len(value) == num_tokens, column.name
        elif column.per == Per.SEGMENT:
            assert len(value) == num_segments, column.name
        if column.tensor is not None:
            tensor = getattr(batch, column.tensor)
            if tensor is not None:
                assert tensor.dtype == getattr(torch, column.tensor_dtype), column.name
                values = tensor.reshape(-1).numpy()
                np.testing.assert_array_equal(values, np.asarray(value).astype(values.dtype), column.name)


def test_schema_padding_row_and_micro_batch_fields_follow_the_one_layout():
    assert MICRO_BATCH_SCHEMA.names == [column.name for column in MICRO_BATCH_COLUMNS]
    tensor_fields = {column.tensor for column in MICRO_BATCH_COLUMNS if column.tensor is not None}
    assert tensor_fields == {f.name for f in dataclasses.fields(MicroBatch)}

    (padding,) = padding_micro_batches(1).to_pylist()
    assert padding["num_tokens"] == 1 and padding["num_sampled_tokens"] == 0
    check_row(padding)
    assert MicroBatch.from_row(padding).routed_experts is None

    rows = packed_rows()
    assert any(row["routed_experts_shape"] for row in rows)
    assert any(max(row["sequence_ids"]) > 0 for row in rows)
    for row in rows:
        check_row(row)
