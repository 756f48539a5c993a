"""The trainer brick's config: ``TrainerBrickConfig`` is what a run sets (``--trainer-…``, ``trainer:`` in a
config file) and builds the trainer; ``TrainerConfig`` is that plus what the run itself decides (the policy's
folder, the run directory, the sampling temperature, the seed). Every default lives here or in the config it
nests (``OptimizerConfig``: the learning rate; ``SampleBatchConfig``: the micro-batch token budget;
``LoraSettings``), and nothing is copied from one class into another."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from components.config import option, require, require_non_negative, require_positive
from components.lora import LoraSettings
from components.training.data import SampleBatchConfig
from components.training.distillation import DistillationConfig
from components.training.step import OptimizerConfig

if TYPE_CHECKING:
    from components.protocols import Algorithm
    from components.training.trainer import Trainer


@dataclass(kw_only=True, frozen=True)
class TrainerBrickConfig:
    """The trainer brick: the Ray Train FSDP2 worker group, its optimizer and how it batches samples."""

    num_workers: int = option(2, "Ray Train FSDP2 workers", flag="trainer-workers")
    cpus_per_worker: float = option(1.0, "Ray CPUs per trainer worker")
    use_gpu: bool = option(
        False,
        "train on GPUs (one per worker, NCCL, bf16 parameters with fp32 gradient reduction); CPU: gloo, fp32",
    )
    torch_threads_per_worker: int = option(1, "torch threads of each worker")
    optimizer: OptimizerConfig = option(OptimizerConfig(), "AdamW with gradient clipping")
    batching: SampleBatchConfig = option(
        SampleBatchConfig(), "how trajectories become packed micro-batches (components/training/data.py)"
    )
    lora: LoraSettings = option(
        LoraSettings(), "LoRA (peft): rank 0 trains every weight; rank > 0 trains and syncs only the adapter"
    )
    gradient_checkpointing: bool = option(
        False, "recompute activations in backward (less trainer memory, about 1/3 more compute)"
    )
    num_updates_per_step: int = option(
        1, "optimizer updates per step (PPO mini-batches; > 1 makes clipping bite)"
    )
    entropy_coef: float = option(0.0, "entropy bonus weight, added to every algorithm's loss")
    keep_checkpoints: int = option(2, "newest complete checkpoints kept (0: all)")
    start_timeout_s: float = option(600.0, "bound on the worker group's start")
    step_timeout_s: float = option(3600.0, "bound on one trainer command (a step, a checkpoint)")
    max_worker_restarts: int = option(
        2,
        "times Ray Train restarts the worker group after a worker dies (from the newest checkpoint; the steps "
        "since are trained again, then the interrupted command is sent again)",
    )

    def __post_init__(self) -> None:
        require_positive(self.num_workers, "num_workers")
        require_positive(self.cpus_per_worker, "cpus_per_worker")
        require_positive(self.torch_threads_per_worker, "torch_threads_per_worker")
        require_positive(self.num_updates_per_step, "num_updates_per_step")
        require_non_negative(self.entropy_coef, "entropy_coef")
        require_non_negative(self.keep_checkpoints, "keep_checkpoints")
        require_non_negative(self.max_worker_restarts, "max_worker_restarts")
        require_positive(self.start_timeout_s, "start_timeout_s")
        require_positive(self.step_timeout_s, "step_timeout_s")

    def for_run(
        self,
        *,
        model_path: Path,
        run_dir: Path,
        temperature: float = 1.0,
        seed: int = 0,
        distillation: DistillationConfig | None = None,
        resume: bool = True,
    ) -> TrainerConfig:
        """This brick's config with what the run decides (``distillation``: the run's, its loss weights)."""
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(TrainerBrickConfig)}
        if distillation is not None:
            fields["batching"] = dataclasses.replace(self.batching, distillation=distillation)
        return TrainerConfig(
            **fields,
            model_path=model_path,
            run_dir=run_dir,
            temperature=temperature,
            seed=seed,
            resume=resume,
        )


@dataclass(kw_only=True, frozen=True)
class TrainerConfig(TrainerBrickConfig):
    """The trainer of one run: the brick's fields and the run's."""

    model_path: Path  # HF folder of the initial policy (also the reference policy for a KL penalty)
    run_dir: Path  # checkpoints go to run_dir/checkpoints, Ray Train's own files to run_dir/ray_train
    # the temperature ``score`` computes logprobs at; training recomputes each segment's logprobs under the
    # sampling distribution recorded with it (Segment.sampling)
    temperature: float = 1.0
    seed: int = 0
    resume: bool = True  # start from the newest complete checkpoint in run_dir/checkpoints when there is one

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "model_path", Path(self.model_path))
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        require(
            (self.model_path / "config.json").exists(), "model_path", f"{self.model_path} has no config.json"
        )
        require_positive(self.temperature, "temperature")

    def build(self, *, algorithm: Algorithm) -> Trainer:
        """The started trainer (its worker group up and waiting for commands)."""
        from components.training.trainer import Trainer

        return Trainer(self, algorithm=algorithm)

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"
