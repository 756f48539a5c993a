"""The real vLLM server SIGKILLed in the middle of a recipe step, then started again (issue #22 / #27 point 1):
``recipes/swe_grpo.py --engine vllm`` (sync, proxy shards in Ray actors). The kill lands while a generation is in
flight: once step 1 generates, the test freezes the server (``/pause?mode=keep``) and kills it when ``/load``
counts a new request held there (``/load`` alone is no proof: vLLM never counts down a request whose client went
away). The rollout whose call it fails is an ``engine_error`` rollout (not an agent error, though the agent only
saw a 5xx: the proxy counted the failure), never trained; its group, left with too few survivors, is replaced,
and the replaced group is kept with its reasons in the run's untrained store (``RUN_DIR/untrained``: earlier runs
of this test found no ``engine_error`` in the step shards because the sync step stored no replaced group at
all). The run waits for the server (``--vllm-server-return-timeout-s``), re-pushes the current
weights and their version (everything trained was sampled by version 1, not the server's start-up weights) and
finishes every step; the trainer's consumed shards name every committed shard at most once and skip only groups
hit by the failure: nothing lost, nothing trained twice, nothing hangs. A server that never comes back fails the
wait within its bound, naming the server and the flag: ``tests/components/engine/test_vllm.py::
test_a_killed_server_fails_requests_in_flight_with_a_clear_engine_error``. Uses the session's server (killed,
restarted on its port)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from components.trajectory import INFRASTRUCTURE_STATUSES, TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.recipes.recipe_runs import (
    REPO_ROOT,
    latest_trainer_state,
    recipe_command,
    recipe_env,
    shard_steps,
)
from tests.vllm_fixture import restart_vllm_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500), pytest.mark.vllm_kills_server(restarts=True)]


def requests_in_flight(url: str) -> int:
    """The server's running + waiting requests (0 while it is too busy to answer within 5 s)."""
    try:
        return int(httpx.get(f"{url}/load", timeout=5).json().get("server_load", 0))
    except httpx.HTTPError:
        return 0


def is_paused(url: str) -> bool:
    try:
        return bool(httpx.get(f"{url}/is_paused", timeout=5).json().get("is_paused", True))
    except httpx.HTTPError:
        return True


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
        # Kill it while step 1 (sampled by version 1) has a request in flight: once version 1 is loaded and the
        # run resumed generation, freeze the server (/pause?mode=keep: running requests stay, new ones queue, all
        # unanswered), then kill it as soon as /load counts one. No race with a short generation.
        deadline = time.monotonic() + 900
        # (the shared server may hold an earlier test's version 1: the run first loads its own version 0)
        seen: list[tuple[str, bool]] = []  # (label, paused) as polled, for the failure message

        def server_state() -> tuple[str, bool]:
            state = (weights_label(vllm_server.url), is_paused(vllm_server.url))
            if not seen or seen[-1] != state:
                seen.append(state)
            return state

        for started in (lambda: server_state()[0] != "1", lambda: server_state() == ("1", False)):
            while not started():
                assert recipe.poll() is None, (seen, (tmp_path / "recipe.log").read_text()[-3000:])
                assert time.monotonic() < deadline, "step 1 never started"
                time.sleep(0.05)
        # vLLM's /load never counts down a request whose client went away (its counter skips cancelled handlers),
        # so only a count above the one read now is a request held unanswered
        leaked = requests_in_flight(vllm_server.url)
        httpx.post(f"{vllm_server.url}/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
        held_by = time.monotonic() + 120
        while requests_in_flight(vllm_server.url) <= leaked:
            assert time.monotonic() < held_by, "no step-1 request reached the frozen server within 120 s"
            time.sleep(0.05)
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
    assert {step for step, _ in shards.values()} == {0, 1}
    store = TrajectoryStore(run_dir)
    step_1 = [t for path in store.shard_paths() for t in store.read_shard(path) if t.step == 1]
    untrained = TrajectoryStore(run_dir / "untrained")  # groups replaced for too few survivors
    left_out = [t for path in untrained.shard_paths() for t in untrained.read_shard(path) if t.step == 1]
    # The rollout whose call the kill failed is engine_error (kept, in the step's shard or with its replaced
    # group, with the reason naming the dead vLLM server, never trained); none is an agent error.
    step_1 += left_out
    lost = [t for t in step_1 if t.status == TrajectoryStatus.ENGINE_ERROR]
    assert lost, [(t.status, t.failure_reason) for t in step_1]
    assert all(not t.trainable and "vLLM" in t.failure_reason for t in lost), [t.failure_reason for t in lost]
    assert not [t for t in step_1 if t.status == TrajectoryStatus.AGENT_ERROR]
    # At most once, nothing lost: the last checkpoint's record of the shards the trainer consumed (a sync run's
    # ledger) names each committed shard at most once; a shard it skipped is a group that lost members to the
    # dead server (dropped and replaced) or holds nothing trainable.
    consumed = latest_trainer_state(run_dir)["consumed_shards"]
    assert len(consumed) == len(set(consumed)), "a shard was trained twice"
    assert set(consumed) <= set(shards), "the trainer consumed a shard the store does not hold"
    for path in store.shard_paths():
        group = store.read_shard(path)
        if path.name not in consumed and any(t.trainable for t in group):
            assert any(t.status in INFRASTRUCTURE_STATUSES for t in group), f"{path.name} was lost untrained"
    ids = [trajectory_id for _, names in shards.values() for trajectory_id in names]
    assert len(ids) == len(set(ids)), "a trajectory was committed twice"
    # what step 1 trained (survivors, or replacements sent once the server was back) was sampled by the run's
    # version 1, the re-pushed weights included (the restarted server's own weights would say 0)
    for trajectory in (t for t in step_1 if t.trainable):
        for segment in trajectory.segments:
            assert set(segment.weight_versions[segment.loss_mask == 1].tolist()) == {1}
    driver_log = (run_dir / "logs" / "driver.log").read_text()
    assert f"vLLM server {vllm_server.url} is back at version 1" in driver_log
    assert httpx.get(f"{vllm_server.url}/weight_info").json()["weight_version"] == "2"
