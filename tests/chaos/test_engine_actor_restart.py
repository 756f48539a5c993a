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
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngineConfig
from components.engine.ray_actor import RayEngineClient, start_engine_actor
from components.errors import EngineError
from components.protocols import SamplingParams
from components.rollout.failures import classify_exception
from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.recipes.recipe_runs import (
    REPO_ROOT,
    latest_trainer_state,
    metric_steps,
    recipe_command,
    recipe_env,
    shard_steps,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = [7, 8, 9, 10, 11]
RUN_BOUND_S = 420
GONE_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def next_weights(tmp_path_factory, default_model_dir):
    """The 'next version' of the policy: the tiny model's architecture with other random weights."""
    from components.models.tiny import build_tiny_model

    folder = build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-v1", tokenizer_dir=default_model_dir, seed=1
    )
    return load_file(str(folder / "model.safetensors"))


def _actor(tiny_model_dir, **options):
    config = EmbeddedEngineConfig(
        model_path=tiny_model_dir, num_threads=1, context_window=4096, eos_token_ids=()
    )
    return start_engine_actor(config, num_cpus=0.5, **options)


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


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def _engine_actors(processes: list[psutil.Process]) -> dict[int, psutil.Process]:
    """The engine actor's worker processes among ``processes`` (Ray titles them ``ray::EngineActor...``)."""
    found = {}
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if "ray::EngineActor" in " ".join(process.cmdline()):
                found[process.pid] = process
    return found


def _still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
    return left


def test_a_run_whose_engine_actor_is_killed_finishes_with_the_trainers_weights(tmp_path, tiny_model_dir):
    num_steps = 4
    run_dir = tmp_path / "run"
    flags = (
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", str(num_steps),
        "--group-size", "2", "--games-per-step", "2", "--rollout-mode", "sync", "--wandb-mode", "offline",
    )  # fmt: skip
    started = time.monotonic()
    driver = subprocess.Popen(
        recipe_command("tictactoe_grpo", *flags),
        cwd=REPO_ROOT,
        env=recipe_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # only for this test's own clean-up: the fault is the engine actor's SIGKILL
    )
    recorded: dict[int, psutil.Process] = {}
    try:
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().strip()):  # step 0 trained and pushed
            assert driver.poll() is None, driver.communicate()[0][-4000:]
            assert time.monotonic() - started < RUN_BOUND_S, "step 0 was not done in time"
            time.sleep(0.2)
        time.sleep(random.uniform(0.0, 2.0))  # a random point of step 1 (mostly rolling out) or later
        recorded.update((p.pid, p) for p in _tree(driver.pid))
        (killed,) = _engine_actors(list(recorded.values()))
        os.kill(killed, signal.SIGKILL)  # the fault
        restarted: set[int] = set()
        while driver.poll() is None:  # every process the run starts from here on is checked at the end too
            assert time.monotonic() - started < RUN_BOUND_S, "the run did not finish in time"
            tree = _tree(driver.pid)
            recorded.update((p.pid, p) for p in tree)
            restarted |= set(_engine_actors(tree)) - {killed}
            time.sleep(0.5)
        output = driver.communicate()[0]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0, output[-6000:]
    assert restarted, "Ray did not restart the engine actor"

    # nothing of the run is left
    ended_at = time.monotonic()
    while (left := _still_running(list(recorded.values()))) and time.monotonic() - ended_at < GONE_WITHIN_S:
        time.sleep(0.2)
    assert not left, f"left behind: {[(p.pid, p.name()) for p in left]}"

    # every step done; every committed trajectory trained at most once and none lost
    shards = shard_steps(run_dir)
    assert sorted(step for step, _ in shards.values()) == list(range(num_steps))
    ids = [i for _, names in shards.values() for i in names]
    assert len(ids) == len(set(ids)), "a trajectory was committed twice"
    consumed = latest_trainer_state(run_dir)["consumed_shards"]
    assert sorted(consumed) == sorted(shards), "a committed shard was trained twice or not at all"
    assert metric_steps(run_dir) == list(range(num_steps))

    store = TrajectoryStore(run_dir)
    trajectories = [t for path in store.shard_paths() for t in store.read_shard(path)]
    lost = [t for t in trajectories if t.status == TrajectoryStatus.ENGINE_ERROR]
    assert all(not t.trainable and "engine actor" in t.failure_reason for t in lost), [
        t.failure_reason for t in lost
    ]
    # what was trained was sampled by the trainer's version of its step (sync: step s by version s), the steps
    # after the restart included: the restarted actor's own start weights would say 0
    for trajectory in (t for t in trajectories if t.trainable):
        for segment in trajectory.segments:
            versions = set(segment.weight_versions[segment.loss_mask == 1].tolist())
            assert versions <= {trajectory.step}, (trajectory.step, versions)
    # the restarted actor was given the trainer's version of the moment (a push meeting the restart is re-sent)
    log = (run_dir / "logs" / "driver.log").read_text()
    restores = [int(v) for v in re.findall(r"the run's weights at version (\d+) pushed again", log)]
    assert all(0 <= version < num_steps for version in restores), restores
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    num_lost = sum(row["rollout/num_trajectories"] - row["rollout/num_trainable"] for row in rows)
    print(
        f"killed {killed}; rollouts lost and replaced {num_lost:g}, kept as engine_error {len(lost)}; ",
        end="",
    )
    print(f"restored at versions {restores}; run {time.monotonic() - started:.0f} s")
