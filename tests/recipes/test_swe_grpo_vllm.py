"""The README's vLLM commands: ``recipes/swe_grpo.py --engine vllm --vllm-url …`` in each rollout mode against
the session's real vLLM server (default ``proxy=serve``: the vLLM client travels into the Ray session-shard
actors). ``sync`` with one server (run by ``ray job submit``, as the README's cluster command:
``tests/recipes/test_ray_job.py::test_ray_job_submit_runs_one_swe_step_on_vllm``, whose checks are these); ``async``
with several (``--vllm-url A,B``: here two spellings of the one
server's address, ``127.0.0.1`` and ``localhost``, since a second CPU server costs minutes of start-up: the
fleet places, pauses and reloads them as two servers); ``partial`` with one. The trainer's new weights reach the
server through ``RUN_DIR/weights`` and carry the new version."""

from __future__ import annotations

import json

import httpx
import pytest

from components.trajectory_store import TrajectoryStore
from tests.recipes.recipe_runs import assert_complete_run, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run_one_step(run_dir, vllm_server, urls: str, *mode_flags: str) -> None:
    run_recipe(
        "swe_grpo",
        "--model", str(vllm_server.model_dir), "--run-dir", str(run_dir), "--engine", "vllm",
        "--vllm-url", urls, "--num-steps", "1", "--num-tasks", "1", "--group-size", "2",
        "--max-turns", "2", "--proxy-replicas", "1", "--wandb-mode", "offline", *mode_flags,
        timeout_s=840,
    )  # fmt: skip
    assert_one_vllm_step(run_dir, vllm_server, urls)


def assert_one_vllm_step(run_dir, vllm_server, urls: str) -> None:
    """A complete one-step run (groups of 2) on ``urls``, sampled by version 0, whose weights reached the server
    as version 1."""
    assert_complete_run(run_dir, num_steps=1, rollouts_per_step=2)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["engine"]["kind"] == "vllm" and config["engine"]["url"] == urls
    store = TrajectoryStore(run_dir)
    rollouts = [t for path in store.shard_paths() for t in store.read_shard(path)]
    assert rollouts and all(t.status != "engine_error" for t in rollouts), [
        t.failure_reason for t in rollouts
    ]
    for trajectory in rollouts:  # step 0 was sampled by version 0
        for segment in trajectory.segments:
            assert set(segment.weight_versions[segment.loss_mask == 1].tolist()) <= {0}
    # the step's weights reached the server, labelled with the new version
    assert httpx.get(f"{vllm_server.url}/weight_info").json()["weight_version"] == "1"


def test_swe_grpo_async_step_on_several_vllm_servers(tmp_path, vllm_server):
    urls = f"{vllm_server.url},{vllm_server.url.replace('127.0.0.1', 'localhost')}"
    run_one_step(tmp_path / "run", vllm_server, urls, "--rollout-mode", "async")


def test_swe_grpo_partial_step_on_a_real_vllm_server(tmp_path, vllm_server):
    run_one_step(tmp_path / "run", vllm_server, vllm_server.url, "--rollout-mode", "partial")
