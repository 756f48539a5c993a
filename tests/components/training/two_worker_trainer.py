"""The two-worker FSDP2 trainer the trainer tests share (full fine-tuning in ``test_fsdp_trainer``, LoRA in
``test_lora``): its optimiser, its micro-batching and its config; the ``trainer`` fixture (``conftest``) builds
one per module from these, with the module's ``trainer_overrides``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.training.data import SampleBatchConfig
from components.training.step import OptimizerConfig
from components.training.trainer import TrainerConfig

OPTIMIZER = OptimizerConfig(learning_rate=1e-3, max_grad_norm=1.0)
BATCHING = SampleBatchConfig(max_tokens_per_micro_batch=40)


def two_worker_trainer_config(model_dir: Path, run_dir: Path, **overrides: Any) -> TrainerConfig:
    """Two workers of half a CPU each over ``model_dir``, checkpoints under ``run_dir``; ``overrides`` win."""
    values: dict[str, Any] = dict(
        model_path=model_dir,
        run_dir=run_dir,
        num_workers=2,
        cpus_per_worker=0.5,
        optimizer=OPTIMIZER,
        batching=BATCHING,
    )
    values.update(overrides)
    return TrainerConfig(**values)
