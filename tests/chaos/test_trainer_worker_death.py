"""Point 1 of the faults issue, a trainer worker (``components/training/trainer.py``): one of the two Ray Train
FSDP2 workers is SIGKILLed (by its pid) at a random point of a step that follows a checkpoint and one more step.
Ray Train restarts the worker group (``FailureConfig(max_failures=max_worker_restarts)``); the new workers
restore the newest checkpoint (weights, AdamW state, RNG); the driver trains the step sent since that checkpoint
again, then sends the interrupted step again. The step returns, the trainer's state says three steps, and its
weights equal three single-process steps on the same batches: no step was lost or trained twice. The weakened
variant (the steps since the checkpoint not trained again) leaves weights that differ. And a short real run
(``tictactoe_grpo``, sync, two trainer workers) with one worker killed at a random point after step 0 finishes,
every committed shard trained once, every step's rollouts sampled by the trainer's version."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time

import psutil
import pytest
import torch

from components.remote_waits import PENDING_WAITS
from components.training.data import build_micro_batches_locally, micro_batches_from_table
from components.training.grpo import GRPO
from components.training.step import build_optimizer, run_train_step
from components.training.trainer import Trainer
from tests.chaos.recipe_faults import (
    assert_every_committed_group_trained_at_most_once,
    assert_every_step_trained_once_with_its_version,
    run_with_a_process_killed,
)
from tests.components.training.training_synthetic import random_batch
from tests.components.training.two_worker_trainer import BATCHING, OPTIMIZER, two_worker_trainer_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEP_BOUND_S = 240


def _train_workers() -> set[int]:
    """This test process's Ray Train worker processes (Ray titles them ``ray::RayTrainWorker...``)."""
    found = set()
    for process in psutil.Process(os.getpid()).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ray::RayTrainWorker" in " ".join(process.cmdline()):
                found.add(process.pid)
    return found


def _single_process_steps(model_dir, batches) -> dict[str, torch.Tensor]:
    """The weights after ``batches`` trained one step each (version i for batch i) in this process."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, OPTIMIZER)
    for version, batch in enumerate(batches):
        local = build_micro_batches_locally(batch, GRPO(), BATCHING, current_version=version)
        run_train_step(
            model,
            optimizer,
            micro_batches_from_table(local.micro_batches),
            GRPO(),
            optimizer_config=OPTIMIZER,
        )
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _train_with_a_worker_killed(trainer: Trainer, batches) -> dict[str, float]:
    """Steps 0 and 1 (a checkpoint after step 0), then step 2 with one worker SIGKILLed at a random point."""
    trainer.step(batches[0], current_version=0)
    trainer.save_checkpoint()
    trainer.step(batches[1], current_version=1)
    workers = _train_workers()
    assert len(workers) == 2, workers
    result: dict[str, object] = {}
    step = threading.Thread(target=lambda: result.update(metrics=trainer.step(batches[2], current_version=2)))
    started = time.monotonic()
    step.start()
    while not any(wait.request.startswith("TrainOnShards") for wait in PENDING_WAITS.older_than(0.0)):
        assert step.is_alive() and time.monotonic() - started < STEP_BOUND_S, (
            "the step never reached the workers"
        )
        time.sleep(0.01)
    time.sleep(random.uniform(0.0, 0.3))  # a random point of the workers' step
    os.kill(random.choice(sorted(workers)), signal.SIGKILL)  # the fault
    step.join(STEP_BOUND_S)
    assert not step.is_alive(), "the step did not finish after the worker group's restart"
    assert time.monotonic() - started < STEP_BOUND_S
    while _train_workers() & workers or len(_train_workers()) < 2:  # (the step may have ended just before)
        assert time.monotonic() - started < STEP_BOUND_S, "the worker group was not restarted"
        time.sleep(0.2)
    return result["metrics"]


@pytest.fixture
def trainer(ray_session, tiny_model_dir, tmp_path):
    trainer = Trainer(
        two_worker_trainer_config(tiny_model_dir, tmp_path / "run", max_worker_restarts=1), algorithm=GRPO()
    )
    yield trainer
    trainer.shutdown()


def _batches():
    return [random_batch(num_groups=2, group_size=4, seed=seed) for seed in (21, 22, 23)]


def test_a_killed_trainer_worker_is_restarted_and_the_step_is_trained_once(trainer, tiny_model_dir, caplog):
    batches = _batches()
    with caplog.at_level(logging.WARNING, logger="components.training.trainer"):
        metrics = _train_with_a_worker_killed(trainer, batches)
        got = trainer.full_state_dict()
    assert metrics["trained"] == 1
    assert trainer.state.step == 3 and trainer.state.weight_version == 3
    assert "worker group was restarted" in caplog.text
    expected = _single_process_steps(tiny_model_dir, batches)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-5, msg=name)


def test_weakened_without_training_the_steps_since_the_checkpoint_again_the_weights_differ(
    trainer, tiny_model_dir, monkeypatch
):
    batches = _batches()
    monkeypatch.setattr(trainer, "_since_restore_point", _Forgetful())
    _train_with_a_worker_killed(trainer, batches)
    expected = _single_process_steps(tiny_model_dir, batches)
    got = trainer.full_state_dict()
    assert max(float((got[name] - tensor).abs().max()) for name, tensor in expected.items()) > 1e-4


class _Forgetful(list):
    """The weakened replay log: remembers no step."""

    def append(self, item: object) -> None:
        pass


def test_a_run_whose_trainer_worker_is_killed_finishes_with_every_step_trained_once(tmp_path, tiny_model_dir):
    """The recipe (two trainer workers, sync): one worker killed at a random point after step 0."""
    run = run_with_a_process_killed(tmp_path / "run", tiny_model_dir, "ray::RayTrainWorker")
    assert run.started_again, "Ray Train did not restart the worker group"
    # every committed shard trained once, and each step's rollouts sampled by the version the trainer had
    # reached: the engine's weights stayed the trainer's through the restart
    assert_every_step_trained_once_with_its_version(run.run_dir)
    log = (run.run_dir / "logs" / "driver.log").read_text()
    assert "the trainer's worker group was restarted" in log
    print(f"run {run.duration_s:.0f} s")


def test_an_async_run_whose_trainer_worker_is_killed_finishes(tmp_path, tiny_model_dir):
    """The same fault with rollouts overlapping training: every committed group trained at most once or
    dropped with a reason, every step done."""
    run = run_with_a_process_killed(tmp_path / "run", tiny_model_dir, "ray::RayTrainWorker", mode="async")
    assert run.started_again, "Ray Train did not restart the worker group"
    assert_every_committed_group_trained_at_most_once(run.run_dir)
    log = (run.run_dir / "logs" / "driver.log").read_text()
    assert "the trainer's worker group was restarted" in log
    print(f"run {run.duration_s:.0f} s")
