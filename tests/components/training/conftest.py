"""Fixtures of the trainer tests: one two-worker trainer per module (see ``two_worker_trainer``)."""

from __future__ import annotations

import pytest

from components.training.grpo import GRPO
from components.training.trainer import Trainer
from tests.components.training.two_worker_trainer import two_worker_trainer_config


@pytest.fixture(scope="module")
def trainer_overrides() -> dict:
    """``TrainerConfig`` fields a module sets for its ``trainer`` (e.g. LoRA); none by default."""
    return {}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("trainer-run")


@pytest.fixture(scope="module")
def trainer(ray_session, tiny_model_dir, run_dir, trainer_overrides):
    trainer = Trainer(
        two_worker_trainer_config(tiny_model_dir, run_dir, **trainer_overrides), algorithm=GRPO()
    )
    yield trainer
    trainer.shutdown()
