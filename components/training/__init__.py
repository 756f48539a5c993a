"""Training: trajectories → Ray Data micro-batches → Ray Train FSDP2 policy-gradient steps → weight sync."""

from components.training.algorithms import GRPO, GSPO, RLOO, DrGRPO, GRPOConfig
from components.training.checkpoint import TrainerState, latest_checkpoint
from components.training.data import (
    SampleBatchConfig,
    build_micro_batches_locally,
    build_micro_batches_with_ray,
)
from components.training.losses import PolicyLossConfig
from components.training.step import OptimizerConfig
from components.training.trainer import Trainer, TrainerConfig, TrainerError
from components.training.weight_sync import WeightSync, WeightSyncConfig

__all__ = [
    "GRPO",
    "GSPO",
    "RLOO",
    "DrGRPO",
    "GRPOConfig",
    "OptimizerConfig",
    "PolicyLossConfig",
    "SampleBatchConfig",
    "Trainer",
    "TrainerConfig",
    "TrainerError",
    "TrainerState",
    "WeightSync",
    "WeightSyncConfig",
    "build_micro_batches_locally",
    "build_micro_batches_with_ray",
    "latest_checkpoint",
]
