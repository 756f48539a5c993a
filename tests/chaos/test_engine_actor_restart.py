"""Point 1 of the faults issue, the embedded engine's actor (``components/engine/ray_actor.py``):

- at the actor level: the actor's process is SIGKILLed (by its pid) while a request is in flight. That request
  fails as ``EngineError`` naming the death (an ``engine_error`` rollout); Ray restarts the actor
  (``max_restarts``); the driver's client re-pushes the run's last weights and version, and a copy of the client
  (a proxy shard's) then generates with them: same version, same logprobs as before the death. The weakened
  variant, no client that pushes: the restarted actor serves nothing (it would serve its start weights stamped
  with the wrong version) and the waiting request fails at ``restart_wait_s`` with a message saying why.
- a short real run (``tictactoe_grpo``, sync): the engine actor killed at a random point after step 0; the run
  finishes every step within a bound, every committed trajectory is trained at most once, none that finished is
  lost, what was trained after the restart was sampled by the trainer's version, and no process is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import numpy as np
import pytest
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngineConfig
from components.engine.providers import EmbeddedEngineBrickConfig
from components.engine.ray_actor import RayEngineClient, start_engine_actor
from components.errors import EngineError
from components.protocols import SamplingParams
from components.rollout.failures import classify_exception
from components.trajectory import TrajectoryStatus
from tests.chaos.recipe_faults import (
    NUM_STEPS,
    assert_every_committed_group_trained_at_most_once,
    assert_every_step_trained_once_with_its_version,
    run_with_a_process_killed,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = [7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def next_weights(tmp_path_factory, default_model_dir):
    """The 'next version' of the policy: the tiny model's architecture with other random weights."""
    from components.models.tiny import build_tiny_model

    folder = build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-v1", tokenizer_dir=default_model_dir, seed=1
    )
    return load_file(str(folder / "model.safetensors"))


def _actor(tiny_model_dir, **options):
    settings = EmbeddedEngineBrickConfig(num_cpus=0.5)
    config = EmbeddedEngineConfig(
        model_path=tiny_model_dir, settings=settings, context_window=4096, eos_token_ids=()
    )
    return start_engine_actor(config, **options)


async def _kill_mid_request(client: RayEngineClient) -> BaseException:
    """SIGKILL the actor's process while a long generate is in flight; the generate's error."""
    pid = (await client.refresh())["pid"]
    in_flight = asyncio.ensure_future(client.generate(PROMPT, SamplingParams(max_tokens=2000, seed=1)))
    await asyncio.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(EngineError) as died:
        await asyncio.wait_for(in_flight, 60)
    return died.value


async def test_a_killed_engine_actor_is_restarted_with_the_runs_weights(
    ray_session, tiny_model_dir, next_weights
):
    handle = _actor(tiny_model_dir)
    driver_side = await RayEngineClient.connect(handle)
    shard_side = await asyncio.to_thread(RayEngineClient, handle)  # a proxy shard's copy: never pushes
    try:
        await driver_side.update_weights(next_weights, version=3)
        before = await shard_side.generate(PROMPT, SamplingParams(max_tokens=12, seed=0))
        assert before.weight_versions == (3,) * 12
        driver_side.start_watching()

        error = await _kill_mid_request(shard_side)
        assert "engine actor died" in str(error)
        assert classify_exception(error)[0] is TrajectoryStatus.ENGINE_ERROR

        started = time.monotonic()
        after = await asyncio.wait_for(
            shard_side.generate(PROMPT, SamplingParams(max_tokens=12, seed=0)), 120
        )
        assert time.monotonic() - started < 120
        assert driver_side.restores == [3]
        assert after.weight_versions == (3,) * 12, "the restarted engine serves another version"
        assert after.output_ids == before.output_ids
        scored = await shard_side.logprobs_of(PROMPT + list(after.output_ids), start=len(PROMPT))
        np.testing.assert_allclose(scored, before.logprobs, atol=1e-4)
    finally:
        await driver_side.aclose()
        ray_session.kill(handle)


async def test_weakened_without_a_pushing_client_the_restarted_actor_serves_nothing(
    ray_session, tiny_model_dir
):
    handle = _actor(tiny_model_dir, restart_wait_s=5.0)
    shard_side = await asyncio.to_thread(RayEngineClient, handle)
    try:
        await _kill_mid_request(shard_side)
        with pytest.raises(EngineError, match="did not get the run's weights back within 5 s"):
            await asyncio.wait_for(shard_side.generate(PROMPT, SamplingParams(max_tokens=4)), 120)
    finally:
        ray_session.kill(handle)


def test_a_run_whose_engine_actor_is_killed_finishes_with_the_trainers_weights(tmp_path, tiny_model_dir):
    run = run_with_a_process_killed(tmp_path / "run", tiny_model_dir, "ray::EngineActor")
    assert run.started_again, "Ray did not restart the engine actor"
    trajectories = assert_every_step_trained_once_with_its_version(run.run_dir)
    # rollouts the death failed are engine_error (kept only as survivors' partners, never trained); the steps
    # after the restart were sampled by the trainer's version (checked above: the actor's start weights say 0)
    lost = [t for t in trajectories if t.status == TrajectoryStatus.ENGINE_ERROR]
    assert all(not t.trainable and "engine actor" in t.failure_reason for t in lost), [
        t.failure_reason for t in lost
    ]
    # the restarted actor was given the run's version of the moment (a push meeting the restart is re-sent)
    log = (run.run_dir / "logs" / "driver.log").read_text()
    restores = [int(v) for v in re.findall(r"the run's weights at version (\d+) pushed again", log)]
    assert all(0 <= version < NUM_STEPS for version in restores), restores
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines() if line]
    num_lost = sum(row["rollout/num_trajectories"] - row["rollout/num_trainable"] for row in rows)
    print(
        f"rollouts lost and replaced {num_lost:g}, kept as engine_error {len(lost)}; restored at versions "
        f"{restores}; run {run.duration_s:.0f} s"
    )


def test_an_async_run_whose_engine_actor_is_killed_finishes(tmp_path, tiny_model_dir):
    """Async (rollouts overlap training): the same fault; every committed group trained at most once, none lost,
    and the restarted actor was given a version the trainer had reached."""
    run = run_with_a_process_killed(tmp_path / "run", tiny_model_dir, "ray::EngineActor", mode="async")
    assert run.started_again, "Ray did not restart the engine actor"
    assert_every_committed_group_trained_at_most_once(run.run_dir)
    log = (run.run_dir / "logs" / "driver.log").read_text()
    restores = [int(v) for v in re.findall(r"the run's weights at version (\d+) pushed again", log)]
    assert all(1 <= version <= NUM_STEPS for version in restores), restores
    print(f"restored at versions {restores}; run {run.duration_s:.0f} s")
