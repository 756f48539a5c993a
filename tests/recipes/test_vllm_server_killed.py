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
restarted on its port).

The same fault in an async run (``--rollout-mode async``, 3 steps): the server is killed while step 2's group,
started as soon as version 1 is loaded, generates; in-flight rollouts end ``engine_error`` and their group is
dropped (``lost_to_infrastructure``) or replaced, every committed group is trained at most once, and the run waits
for the server, re-pushes the trainer's current version and finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from components.trajectory import INFRASTRUCTURE_STATUSES, TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.chaos.recipe_faults import assert_every_committed_group_trained_at_most_once
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


def start_recipe(tmp_path, vllm_server, *flags: str) -> subprocess.Popen:
    """``swe_grpo --engine vllm`` on the session's server (one task, groups of 2, 2 turns), output in
    ``tmp_path/recipe.log``."""
    command = recipe_command(
        "swe_grpo",
        "--model", str(vllm_server.model_dir), "--run-dir", str(tmp_path / "run"), "--engine", "vllm",
        "--vllm-url", vllm_server.url, "--vllm-server-return-timeout-s", "900", "--num-tasks", "1",
        "--group-size", "2", "--max-turns", "2", "--proxy-replicas", "1", "--wandb-mode", "offline", *flags,
    )  # fmt: skip
    with (tmp_path / "recipe.log").open("w") as log:
        return subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=recipe_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_while_version_1_generates(
    recipe: subprocess.Popen, vllm_server, log_path, *, held_above: int | None
):
    """Once the run has loaded its own version 0, then version 1 and resumed generation: freeze the server
    (``/pause?mode=keep``: running requests stay, new ones queue, all unanswered), SIGKILL it as soon as
    ``/load`` counts a request held there, and start it again. ``/load`` never counts down a request whose client
    went away, so only a count above ``held_above`` (default: the count read when version 1 is seen) is one held
    now. Returns when the server was killed."""
    deadline = time.monotonic() + 900
    seen: list[tuple[str, bool]] = []  # (label, paused) as polled, for the failure message

    def server_state() -> tuple[str, bool]:
        state = (weights_label(vllm_server.url), is_paused(vllm_server.url))
        if not seen or seen[-1] != state:
            seen.append(state)
        return state

    # (the shared server may hold an earlier test's version 1: the run first loads its own version 0)
    for started in (lambda: server_state()[0] != "1", lambda: server_state() == ("1", False)):
        while not started():
            assert recipe.poll() is None, (seen, log_path.read_text()[-3000:])
            assert time.monotonic() < deadline, "version 1 never generated"
            time.sleep(0.05)
    leaked = requests_in_flight(vllm_server.url) if held_above is None else held_above
    httpx.post(f"{vllm_server.url}/pause", params={"mode": "keep"}, timeout=30).raise_for_status()
    held_by = time.monotonic() + 120
    while requests_in_flight(vllm_server.url) <= leaked:
        assert time.monotonic() < held_by, "no version-1 request reached the frozen server within 120 s"
        time.sleep(0.05)
    vllm_server.process.kill()
    restart_vllm_server(vllm_server)


def finish(recipe: subprocess.Popen, log_path) -> None:
    """Wait for the recipe to exit 0 (its output on failure); kill its tree if the test fails first."""
    try:
        assert recipe.wait(timeout=1200) == 0, log_path.read_text()[-8000:]
    finally:
        if recipe.poll() is None:  # the recipe and the Ray processes it started
            os.killpg(recipe.pid, signal.SIGKILL)
            recipe.wait()


def rollouts(run_dir, *, step: int) -> list:
    """Step ``step``'s rollouts in the run's store and in its untrained store (groups left out of training)."""
    found = []
    for store in (TrajectoryStore(run_dir), TrajectoryStore(run_dir / "untrained")):
        found += [t for path in store.shard_paths() for t in store.read_shard(path) if t.step == step]
    return found


def assert_lost_to_the_dead_server(trajectories: list) -> None:
    """The rollouts whose calls the kill failed are engine_error (kept, with the reason naming the dead vLLM
    server, never trained); none is an agent error."""
    lost = [t for t in trajectories if t.status == TrajectoryStatus.ENGINE_ERROR]
    assert lost, [(t.step, t.status, t.failure_reason) for t in trajectories]
    assert all(not t.trainable and "vLLM" in t.failure_reason for t in lost), [t.failure_reason for t in lost]
    assert not [t for t in trajectories if t.status == TrajectoryStatus.AGENT_ERROR]


def test_server_killed_mid_step_comes_back_with_the_weights_and_the_lost_rollouts_are_replaced(
    tmp_path, vllm_server
):
    run_dir, log_path = tmp_path / "run", tmp_path / "recipe.log"
    recipe = start_recipe(tmp_path, vllm_server, "--num-steps", "2")
    try:
        # killed while step 1 (sampled by version 1) has a request in flight: no race with a short generation
        kill_while_version_1_generates(recipe, vllm_server, log_path, held_above=None)
        killed_at = time.monotonic()
    finally:
        finish(recipe, log_path)
    assert time.monotonic() - killed_at < 1200
    shards = shard_steps(run_dir)
    assert {step for step, _ in shards.values()} == {0, 1}
    store = TrajectoryStore(run_dir)
    step_1 = rollouts(run_dir, step=1)
    assert_lost_to_the_dead_server(step_1)
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


def test_server_killed_in_an_async_run_comes_back_and_every_group_is_trained_at_most_once(
    tmp_path, vllm_server
):
    run_dir, log_path = tmp_path / "run", tmp_path / "recipe.log"
    # before the run: the requests the shared server's /load counts though their clients went away
    held_before = requests_in_flight(vllm_server.url)
    recipe = start_recipe(tmp_path, vllm_server, "--num-steps", "3", "--rollout-mode", "async")
    try:
        # step 2's group waits for version 1 (max staleness 1) and starts the moment it is loaded: its requests
        # may reach the server before the test freezes it, so the count to beat is the one from before the run
        kill_while_version_1_generates(recipe, vllm_server, log_path, held_above=held_before)
    finally:
        finish(recipe, log_path)
    assert_every_committed_group_trained_at_most_once(run_dir, num_steps=3)
    assert_lost_to_the_dead_server([t for step in range(3) for t in rollouts(run_dir, step=step)])
    # the trainable rollouts were sampled within the staleness bound: step s by version s - 1 or s
    store = TrajectoryStore(run_dir)
    for trajectory in (t for path in store.shard_paths() for t in store.read_shard(path) if t.trainable):
        for segment in trajectory.segments:
            versions = set(segment.weight_versions[segment.loss_mask == 1].tolist())
            assert versions <= {trajectory.step - 1, trajectory.step}, (trajectory.step, versions)
    driver_log = (run_dir / "logs" / "driver.log").read_text()
    assert f"vLLM server {vllm_server.url} is back at version" in driver_log
    assert httpx.get(f"{vllm_server.url}/weight_info").json()["weight_version"] == "3"
