"""Point 1 of the faults issue, a lost Ray node (multi-node: ``ray.cluster_utils.Cluster``): the toy recipe runs
``async`` with its rollout producer actor on one of two nodes that offer the ``rollout`` resource; once its first
group is committed, at a random moment, that node is removed from the cluster. Ray restarts the producer actor
on the other node (``max_restarts``, from its pinned parts); rollouts in flight on the lost node come back as
``sandbox_error`` trajectories naming the dead actor, never trained (a group left without survivors is replaced);
the run completes every step within a bound, and every committed group is trained at most once."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time

import pyarrow.parquet as pq
import pytest

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


def test_losing_the_rollout_producers_node_reschedules_it_and_the_run_completes(
    tmp_path, tiny_model_dir, three_node_cluster
):
    cluster, nodes = three_node_cluster
    run_dir = tmp_path / "run"
    flags = (
        *toy_flags(run_dir, mode="async", num_steps=NUM_STEPS, model_dir=tiny_model_dir, max_concurrency=2),
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
        while not list((run_dir / "trajectories").glob("shard-*.parquet")):
            assert driver.poll() is None, driver.communicate()[0][-4000:]
            assert time.monotonic() - started < RUN_BOUND_S, "no group committed in time"
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
    rows = [
        row
        for path in (run_dir / "trajectories").glob("shard-*.parquet")
        for row in pq.read_table(path, columns=["status", "failure_reason"]).to_pylist()
    ]
    lost_rollouts = [row for row in rows if "rollout producer actor died" in (row["failure_reason"] or "")]
    assert lost_rollouts, "no rollout was in flight on the lost node: the fault did not land mid-rollout"
    assert all(row["status"] == "sandbox_error" for row in lost_rollouts)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    assert [row["step"] for row in metrics] == list(range(NUM_STEPS))
    print(f"lost rollouts {len(lost_rollouts)}, groups dropped {dict(ledger['dropped'])}")
