"""Placement on Ray: the rollout producer runs as a Ray actor wherever its resources put it. A two-node Ray
cluster (``ray.cluster_utils.Cluster``: a head node, and a second raylet that alone offers the custom resource
``rollout``) runs the toy recipe in ``async`` mode with ``--rollout-placement actor --rollout-actor-resources
rollout=1``: the producer actor lands on the second node (the driver log names its node), the run completes
and trains every committed group exactly once."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.recipes.recipe_runs import REPO_ROOT, latest_trainer_state, recipe_command, recipe_env
from tests.recipes.test_async_loop import assert_every_committed_group_trained_once, toy_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def two_node_cluster():
    """A head node (the driver's trainer, engine, proxy) and a second node that alone offers ``rollout``."""
    from ray.cluster_utils import Cluster

    # the raylets' workers import the repository's modules (as a job's working_dir would provide them)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), previous]))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "include_dashboard": False, "object_store_memory": 256 * 2**20},
    )
    second = cluster.add_node(num_cpus=1, resources={"rollout": 1}, object_store_memory=128 * 2**20)
    cluster.wait_for_nodes()
    try:
        yield cluster, second.node_id
    finally:
        cluster.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def test_producer_actor_runs_on_the_node_that_offers_its_resource(tmp_path, tiny_model_dir, two_node_cluster):
    cluster, rollout_node = two_node_cluster
    run_dir = tmp_path / "run"
    num_steps = 2
    flags = (
        *toy_flags(run_dir, mode="async", num_steps=num_steps, model_dir=tiny_model_dir),
        "--rollout-placement", "actor", "--rollout-actor-resources", "rollout=1",
        "--proxy", "serve", "--proxy-replicas", "1",
    )  # fmt: skip
    completed = subprocess.run(
        recipe_command("tictactoe_grpo", *flags),
        cwd=REPO_ROOT,
        env={**recipe_env(), "RAY_ADDRESS": cluster.address},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, f"{completed.stdout[-4000:]}\n{completed.stderr[-8000:]}"
    log = (run_dir / "logs" / "driver.log").read_text()
    placed = re.findall(r"rollout producer: actor on node (\w+)", log)
    assert placed == [rollout_node], (placed, rollout_node)
    assert_every_committed_group_trained_once(run_dir, num_steps=num_steps)
    assert latest_trainer_state(run_dir)["weight_version"] == num_steps  # both steps trained and pushed


def test_placement_actor_needs_the_serve_proxy(tmp_path, tiny_model_dir):
    """The in-driver proxy cannot serve a producer on another node: a clear error before anything starts."""
    from components.proxy.providers import LocalProxyConfig
    from components.run.config import RolloutBrickConfig, RunConfig

    with pytest.raises(ValueError, match="actor_resources"):
        RolloutBrickConfig(placement="actor", actor_resources="rollout")
    with pytest.raises(ValueError, match="rollout.placement.*proxy kind serve"):
        RunConfig(model="tiny", rollout=RolloutBrickConfig(placement="actor"), proxy=LocalProxyConfig())
    completed = subprocess.run(
        recipe_command(
            "tictactoe_grpo",
            *toy_flags(tmp_path / "run", mode="async", num_steps=1, model_dir=tiny_model_dir),
            "--rollout-placement",
            "actor",
            "--proxy",
            "local",
        ),  # fmt: skip
        cwd=REPO_ROOT,
        env=recipe_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode != 0
    assert "rollout.placement" in completed.stderr and "proxy kind serve" in completed.stderr, (
        completed.stderr[-3000:]
    )
