"""Shared by the training-signal tests: rollouts with the embedded engine, and the trainer's logprobs of
stored trajectories compared token for token with the rollout's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from components.training.data import SampleBatchConfig, build_micro_batches_locally, micro_batches_from_table
from components.training.forward import forward_sampled_tokens
from components.training.grpo import GRPO, GRPOConfig
from components.trajectory import Segment, Trajectory, TrajectoryStatus


def load_model(model_dir, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    # the grouped-GEMM expert kernel has no float64; the eager one computes the same experts
    extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **extra)
    model.eval()
    return model


def trajectory_of(segments: Sequence[Segment], *, trajectory_id: str, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        trajectory_id=trajectory_id,
        group_id="g",
        task_id="t",
        harness="test",
        status=TrajectoryStatus.OK,
        reward=reward,
        segments=tuple(segments),
    )


def packed(trajectories: Sequence[Trajectory], *, max_tokens: int):
    """The trajectories' micro-batches, packed as the trainer packs them."""
    batches = build_micro_batches_locally(
        list(trajectories),
        GRPO(GRPOConfig()),
        SampleBatchConfig(max_tokens_per_micro_batch=max_tokens),
        current_version=0,
    )
    return micro_batches_from_table(batches.micro_batches)


def train_rollout_logprobs(model, trajectories: Sequence[Trajectory], *, max_tokens: int = 1 << 16):
    """(trainer logprobs, rollout logprobs) of every sampled token, micro-batch by micro-batch."""
    train, rollout = [], []
    with torch.no_grad():
        for batch in packed(trajectories, max_tokens=max_tokens):
            view = forward_sampled_tokens(model, batch, with_entropy=False)
            train.append(view.logprobs.double().numpy())
            rollout.append(view.old_logprobs.double().numpy())
    return np.concatenate(train), np.concatenate(rollout)


def max_abs_gap(model, trajectories: Sequence[Trajectory], *, max_tokens: int = 1 << 16) -> float:
    """Max over sampled tokens of |trainer logprob - rollout logprob| (not a mean)."""
    train, rollout = train_rollout_logprobs(model, trajectories, max_tokens=max_tokens)
    assert np.isfinite(train).all()
    return float(np.abs(train - rollout).max())
