"""Point 1 of the faults issue, a lost Ray node (multi-node: ``ray.cluster_utils.Cluster``): the toy recipe runs
``async`` with its rollout producer actor on one of two nodes that offer the ``rollout`` resource; once its first
group is committed, at a random moment, that node is removed from the cluster. Ray restarts the producer actor
on the other node (``max_restarts``, from its pinned parts); rollouts in flight on the lost node come back as
``sandbox_error`` trajectories naming the dead actor, never trained (a group left without survivors is replaced);
the run completes every step within a bound, and every committed group is trained at most once. The same fault in
a sync run (the producer actor also used, ``--rollout-placement actor``): the node is removed at a random moment
once step 0 is trained (step 1 rolling out, or later); the run completes with every step's shard trained exactly
once, and any rollout lost with the node is a ``sandbox_error`` naming the dead actor, never trained."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from tests.chaos.recipe_faults import assert_every_step_trained_once
from tests.recipes.recipe_runs import REPO_ROOT, latest_trainer_state, recipe_command, recipe_env
from tests.recipes.test_async_loop import committed_groups, toy_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NUM_STEPS = 3
RUN_BOUND_S = 600


@pytest.fixture
def three_node_cluster():
    """A head node (trainer, engine, proxy) and two nodes that each offer one ``rollout``."""
    from ray.cluster_utils import Cluster

    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), previous]))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "include_dashboard": False, "object_store_memory": 256 * 2**20},
    )
    nodes = [
        cluster.add_node(num_cpus=1, resources={"rollout": 1}, object_store_memory=128 * 2**20)
        for _ in range(2)
    ]
    cluster.wait_for_nodes()
    try:
        yield cluster, nodes
    finally:
        cluster.shutdown()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def run_losing_the_producers_node(cluster, nodes, run_dir, model_dir, *, mode: str) -> None:
    """The toy recipe in ``mode`` on ``cluster``, its producer actor's node removed at a random moment once the
    run has something committed (async: a group; sync: step 0 trained); asserts it finishes within the bound."""
    flags = (
        *toy_flags(run_dir, mode=mode, num_steps=NUM_STEPS, model_dir=model_dir, max_concurrency=2),
        "--rollout-placement", "actor", "--rollout-actor-resources", "rollout=1",
        "--proxy", "serve", "--proxy-replicas", "1",
    )  # fmt: skip
    started = time.monotonic()
    driver = subprocess.Popen(
        recipe_command("tictactoe_grpo", *flags),
        cwd=REPO_ROOT,
        env={**recipe_env(), "RAY_ADDRESS": cluster.address},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log = run_dir / "logs" / "driver.log"
        while not _committed_something(run_dir, mode):
            assert driver.poll() is None, driver.communicate()[0][-4000:]
            assert time.monotonic() - started < RUN_BOUND_S, "nothing committed in time"
            time.sleep(0.2)
        (placed,) = re.findall(r"rollout producer: actor on node (\w+)", log.read_text())
        (lost,) = [node for node in nodes if node.node_id == placed]
        time.sleep(random.uniform(0.0, 2.0))
        cluster.remove_node(lost)  # the fault: the node and everything on it are gone
        output, _ = driver.communicate(timeout=RUN_BOUND_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0, output[-6000:]
    assert time.monotonic() - started < RUN_BOUND_S


def _committed_something(run_dir, mode: str) -> bool:
    """Async: a group committed; sync: step 0 trained (its metrics row)."""
    if mode == "async":
        return bool(list((run_dir / "trajectories").glob("shard-*.parquet")))
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and bool(metrics.read_text().strip())


def lost_with_the_node(*stores) -> list[dict]:
    """The rollouts (status, reason) whose producer actor died with the node, in the given store folders."""
    rows = [
        row
        for store in stores
        for path in store.glob("shard-*.parquet")
        for row in pq.read_table(path, columns=["status", "failure_reason"]).to_pylist()
    ]
    return [row for row in rows if "rollout producer actor died" in (row["failure_reason"] or "")]


def test_losing_the_rollout_producers_node_reschedules_it_and_the_run_completes(
    tmp_path, tiny_model_dir, three_node_cluster
):
    cluster, nodes = three_node_cluster
    run_dir = tmp_path / "run"
    run_losing_the_producers_node(cluster, nodes, run_dir, tiny_model_dir, mode="async")

    groups = committed_groups(run_dir)
    state = latest_trainer_state(run_dir)
    ledger = state["extra"]["trajectory_ledger"]
    trained = [name for names in ledger["step_shards"].values() for name in names]
    assert sorted(int(step) for step in ledger["step_shards"]) == list(range(NUM_STEPS))
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert sorted(trained + list(ledger["dropped"])) == sorted(groups), "a committed group went missing"
    assert set(ledger["dropped"].values()) <= {"stale", "lost_to_infrastructure"}
    ids = [i for group in groups.values() for i in group["ids"]]
    assert len(ids) == len(set(ids)), "a trajectory was committed twice"
    lost_rollouts = lost_with_the_node(run_dir / "trajectories")
    assert lost_rollouts, "no rollout was in flight on the lost node: the fault did not land mid-rollout"
    assert all(row["status"] == "sandbox_error" for row in lost_rollouts)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [row["step"] for row in metrics] == list(range(NUM_STEPS))
    print(f"lost rollouts {len(lost_rollouts)}, groups dropped {dict(ledger['dropped'])}")


def test_a_sync_run_losing_the_producers_node_completes_with_every_step_trained_once(
    tmp_path, tiny_model_dir, three_node_cluster
):
    cluster, nodes = three_node_cluster
    run_dir = tmp_path / "run"
    run_losing_the_producers_node(cluster, nodes, run_dir, tiny_model_dir, mode="sync")
    assert_every_step_trained_once(run_dir, NUM_STEPS)
    lost_rollouts = lost_with_the_node(run_dir / "trajectories", run_dir / "untrained" / "trajectories")
    assert all(row["status"] == "sandbox_error" for row in lost_rollouts), lost_rollouts
    print(f"lost rollouts {len(lost_rollouts)}")
