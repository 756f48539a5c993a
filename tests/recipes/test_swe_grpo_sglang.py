"""The README's GPU command on CPU: ``recipes/swe_grpo.py --engine sglang --sglang-url …`` with the default
``proxy=serve`` (the SGLang client travels into the Ray session-shard actors), against the fake SGLang server
running as its own HTTP server process with SGLang's API keys, and slow to become healthy."""

from __future__ import annotations

import json

import httpx
import pytest

from components.trajectory_store import TrajectoryStore
from tests.components.engine.fake_sglang import FakeSGLangProcess
from tests.recipes.recipe_runs import assert_complete_run, run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_swe_grpo_on_sglang_behind_the_default_serve_proxy(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    with FakeSGLangProcess(
        tiny_model_dir, api_key="user-key", admin_api_key="admin-key", startup_delay_s=5
    ) as server:
        run_recipe(
            "swe_grpo",
            "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--engine", "sglang",
            "--sglang-url", server.url, "--sglang-api-key", "user-key", "--sglang-admin-api-key", "admin-key",
            "--num-steps", "2", "--num-tasks", "1", "--group-size", "2", "--max-turns", "2",
            "--proxy-replicas", "1", "--wandb-mode", "offline",
            timeout_s=540,
        )  # fmt: skip
        headers = {"Authorization": "Bearer user-key"}
        log = httpx.get(f"{server.url}/_fake/requests", headers=headers).json()
        info = httpx.get(f"{server.url}/model_info", headers=headers).json()
    assert_complete_run(run_dir, num_steps=2, rollouts_per_step=2)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["proxy"]["kind"] == "serve" and config["engine"]["kind"] == "sglang"
    assert config["engine"]["api_key"] == "***" and config["engine"]["admin_api_key"] == "***"
    paths = [entry["path"] for entry in log]
    assert paths.count("/generate") >= 4, "the rollouts did not generate on the SGLang server"
    # Both steps' weights reached the server, each inside pause … continue, with the admin key.
    store = TrajectoryStore(run_dir)
    rollouts = [t for path in store.shard_paths() for t in store.read_shard(path)]
    outcomes = [(t.step, t.status, t.failure_reason[:200]) for t in rollouts]
    assert info["weight_version"] == "2", (outcomes, (run_dir / "logs" / "driver.log").read_text()[-3000:])
    control = [
        p for p in paths if p in ("/pause_generation", "/update_weights_from_disk", "/continue_generation")
    ]
    assert control == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"] * 2
    # Step 1's rollouts were sampled by version 1, and every sampled token says so.
    for trajectory in rollouts:
        for segment in trajectory.segments:
            sampled = segment.weight_versions[segment.loss_mask == 1]
            assert set(sampled.tolist()) <= {trajectory.step}, (trajectory.step, set(sampled.tolist()))
