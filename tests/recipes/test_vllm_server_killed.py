"""The real vLLM server SIGKILLed in the middle of a recipe step, then started again (issue #22 / #27 point 1):
``recipes/swe_grpo.py --engine vllm`` (sync, proxy shards in Ray actors). The rollouts in flight become
``engine_error`` rollouts (not agent errors), kept in the step's shard with the reason and never trained; the run
waits for the server (``--vllm-server-return-timeout-s``), re-pushes the current weights and their version
(everything trained was sampled by version 1, not the server's start-up weights), replaces a group left with no
survivors once the server is back, and finishes every step: nothing lost, nothing hangs. Uses the session's server (killed, restarted on its port)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.recipes.recipe_runs import REPO_ROOT, recipe_command, recipe_env, shard_steps
from tests.vllm_fixture import restart_vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.vllm_kills_server(restarts=True)]


def requests_in_flight(url: str) -> int:
    """The server's running + waiting requests (0 while it is too busy to answer within 5 s)."""
    try:
        return int(httpx.get(f"{url}/load", timeout=5).json().get("server_load", 0))
    except httpx.HTTPError:
        return 0


def weights_label(url: str) -> str:
    try:
        return httpx.get(f"{url}/weight_info", timeout=5).json()["weight_version"]
    except httpx.HTTPError:
        return ""


def test_server_killed_mid_step_comes_back_with_the_weights_and_the_lost_rollouts_are_replaced(
    tmp_path, vllm_server
):
    run_dir = tmp_path / "run"
    command = recipe_command(
        "swe_grpo",
        "--model", str(vllm_server.model_dir), "--run-dir", str(run_dir), "--engine", "vllm",
        "--vllm-url", vllm_server.url, "--vllm-server-return-timeout-s", "900", "--num-steps", "2",
        "--num-tasks", "1", "--group-size", "2", "--max-turns", "2", "--proxy-replicas", "1",
        "--wandb-mode", "offline",
    )  # fmt: skip
    log = (tmp_path / "recipe.log").open("w")
    recipe = subprocess.Popen(
        command, cwd=REPO_ROOT, env=recipe_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        # kill it while step 1 (sampled by version 1) has a request in flight
        deadline = time.monotonic() + 900
        while True:
            assert recipe.poll() is None, (tmp_path / "recipe.log").read_text()[-6000:]
            assert time.monotonic() < deadline, "step 1 never started generating"
            if requests_in_flight(vllm_server.url) > 0 and weights_label(vllm_server.url) == "1":
                break
            time.sleep(0.1)
        vllm_server.process.kill()
        killed_at = time.monotonic()
        restart_vllm_server(vllm_server)
        assert recipe.wait(timeout=1200) == 0, (tmp_path / "recipe.log").read_text()[-8000:]
    finally:
        if recipe.poll() is None:  # the recipe and the Ray processes it started
            os.killpg(recipe.pid, signal.SIGKILL)
            recipe.wait()
        log.close()
    assert time.monotonic() - killed_at < 1200
    shards = shard_steps(run_dir)
    assert sorted(step for step, _ in shards.values()) == [0, 1]
    store = TrajectoryStore(run_dir)
    step_1 = [t for path in store.shard_paths() for t in store.read_shard(path) if t.step == 1]
    # A rollout the dead server failed is engine_error (kept, with the reason, never trained); one whose agent
    # retried and whose retry waited for the server's return finished normally. Either way none is an agent error.
    lost = [t for t in step_1 if t.status == TrajectoryStatus.ENGINE_ERROR]
    assert all(not t.trainable and "vLLM" in t.failure_reason for t in lost), [t.failure_reason for t in lost]
    assert not [t for t in step_1 if t.status == TrajectoryStatus.AGENT_ERROR]
    # the step still trained a group: a replacement of the group the server took (rolled out once it was back),
    # or that group's survivors (--rollout-partial-groups-min-group-size)
    trained = [t for t in step_1 if t.trainable]
    assert trained, [(t.status, t.failure_reason) for t in step_1]
    for trajectory in trained:  # every trained token was sampled by the run's version 1, the re-pushed weights
        for segment in trajectory.segments:  # included (the restarted server's own weights would say 0)
            assert set(segment.weight_versions[segment.loss_mask == 1].tolist()) == {1}
    driver_log = (run_dir / "logs" / "driver.log").read_text()
    assert f"vLLM server {vllm_server.url} is back at version 1" in driver_log
    assert httpx.get(f"{vllm_server.url}/weight_info").json()["weight_version"] == "2"
