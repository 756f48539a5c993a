"""Point 1 and 4 of the faults issue for the proxy's actors inside a real run: ``tictactoe_grpo --proxy serve``
(two Serve replicas over two session shards) with one Serve replica and then one session shard SIGKILLed at
random points after step 0, in sync and in async mode. ``test_proxy_faults.py`` pins what each death does to the
requests it meets (a scripted engine, a chosen moment); here the run as a whole must absorb both:

- a Serve replica: Serve starts another; the toy agent's request in flight is retried by its client through the
  surviving replica, so the run goes on (a rollout it still failed is kept untrained with its reason);
- a session shard: Ray restarts it empty; the sessions it held end as ``engine_error`` rollouts naming the dead
  shard, never trained, and the steps after it run on the restarted shard.

Each run must finish within the bound, leave no process behind, and train every committed shard exactly once
(sync) or every committed group at most once (async)."""

from __future__ import annotations

import pytest

from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.chaos.recipe_faults import (
    assert_every_committed_group_trained_at_most_once,
    assert_every_step_trained_once_with_its_version,
    run_with_a_process_killed,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SERVE_PROXY = ("--proxy", "serve", "--proxy-replicas", "2", "--proxy-num-session-shards", "2")
REPLICA, SHARD = "ray::ServeReplica", "ray::SessionShard"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_whose_serve_replica_and_session_shard_are_killed_finishes(tmp_path, tiny_model_dir, mode):
    run = run_with_a_process_killed(
        tmp_path / "run", tiny_model_dir, REPLICA, mode=mode, extra_flags=SERVE_PROXY, also_kill=(SHARD,)
    )
    assert run.restarted[REPLICA], "Serve did not start a replica in place of the killed one"
    assert run.restarted[SHARD], "Ray did not restart the killed session shard"
    if mode == "sync":
        assert_every_step_trained_once_with_its_version(run.run_dir)
    else:
        assert_every_committed_group_trained_at_most_once(run.run_dir)
    store = TrajectoryStore(run.run_dir)
    failed = [t for path in store.shard_paths() for t in store.read_shard(path) if not t.trainable]
    assert all(t.failure_reason for t in failed), [(t.status, t.failure_reason) for t in failed]
    # a session the shard held when it died is lost with it: an engine_error naming the shard, never trained
    lost = [t for t in failed if "session shard" in t.failure_reason]
    assert all(t.status == TrajectoryStatus.ENGINE_ERROR for t in lost), [
        (t.status, t.failure_reason) for t in lost
    ]
    print(
        f"{mode}: {len(lost)} sessions lost with the shard, {len(failed)} failed; run {run.duration_s:.0f} s"
    )
