"""Point 1 and 4 of the faults issue for the sandbox backend, in a real run: ``swe_grpo`` on bubblewrap whose
``bwrap`` (``--sandbox-bwrap-bwrap-path``, a wrapper around the real one) starts failing at a random point after
step 0, the way a backend that went down fails every create. The resilience layer retries each acquire, then its
circuit breaker opens and the run stops with one message naming the fault, within a bound, leaving no process
behind and no shard trained twice; once the backend is back, the same command resumes the run to its end with
every committed shard trained exactly once."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import psutil
import pytest

from tests.chaos.recipe_faults import (
    assert_every_committed_group_trained_at_most_once,
    assert_every_step_trained_once,
    still_running,
    wait_until_step_0_is_trained,
)
from tests.recipes.recipe_runs import (
    latest_trainer_state,
    metric_steps,
    run_recipe,
    shard_steps,
    spawn_recipe,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NUM_STEPS = 3
STOPPED_WITHIN_S = 240  # from the outage to the driver's exit
GONE_WITHIN_S = 30.0
WRAPPER = """#!/bin/sh
if [ -e "{down}" ]; then echo "chaos: the sandbox backend is down" >&2; exit 1; fi
exec /usr/bin/bwrap "$@"
"""


def _processes(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_backend_that_goes_down_stops_the_run_by_name_and_it_resumes_once_back(
    tmp_path, tiny_model_dir, mode
):
    down, wrapper = tmp_path / "down", tmp_path / "bwrap"
    wrapper.write_text(WRAPPER.format(down=down))
    wrapper.chmod(0o755)
    run_dir = tmp_path / "run"
    flags = (
        "--model", str(tiny_model_dir), "--run-dir", str(run_dir), "--num-steps", str(NUM_STEPS),
        "--num-tasks", "2", "--group-size", "2", "--max-turns", "2", "--proxy", "local",
        "--wandb-mode", "offline", "--sandbox-num-warm", "0", "--sandbox-bwrap-bwrap-path", str(wrapper),
        "--sandbox-resilience-max-attempts", "2", "--sandbox-resilience-backoff-initial-s", "0.2",
        "--sandbox-resilience-breaker-threshold", "2", "--rollout-mode", mode,
    )  # fmt: skip
    driver = spawn_recipe("swe_grpo", *flags)
    seen: dict[int, psutil.Process] = {}
    try:
        wait_until_step_0_is_trained(driver, run_dir, bound_s=420)
        time.sleep(random.uniform(0.0, 2.0))
        down.touch()  # the fault: from here every sandbox create fails
        went_down = time.monotonic()
        while driver.poll() is None:
            assert time.monotonic() - went_down < STOPPED_WITHIN_S, "the run did not stop in time"
            seen.update((p.pid, p) for p in _processes(driver.pid))
            time.sleep(0.5)
        output = driver.communicate()[0]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    # stopped by the breaker, with one line naming it (no traceback), not by some later crash
    assert driver.returncode != 0
    assert "the run stopped: SandboxBackendDownError" in output, output[-6000:]
    assert "Traceback" not in output.split("the run stopped")[-1], output[-6000:]
    ended = time.monotonic()
    while (left := still_running(list(seen.values()))) and time.monotonic() - ended < GONE_WITHIN_S:
        time.sleep(0.2)
    assert not left, f"left behind: {[(p.pid, p.name()) for p in left]}"
    committed, state = shard_steps(run_dir), latest_trainer_state(run_dir)
    if mode == "sync":  # the step shards the checkpoint trained
        trained = state["consumed_shards"]
    else:  # the overlapped loop's ledger: the groups each step trained
        trained = [
            name for names in state["extra"]["trajectory_ledger"]["step_shards"].values() for name in names
        ]
    assert len(trained) == len(set(trained)) and set(trained) <= set(committed)
    stopped_at = len(metric_steps(run_dir))
    assert 1 <= stopped_at < NUM_STEPS

    down.unlink()  # the backend is back: the same command resumes and finishes
    run_recipe("swe_grpo", *flags, timeout_s=600)
    if mode == "sync":
        assert_every_step_trained_once(run_dir, NUM_STEPS)
    else:
        assert_every_committed_group_trained_at_most_once(run_dir, NUM_STEPS)
    print(
        f"{mode}: stopped after {stopped_at} steps, {ended - went_down:.0f} s after the outage; resumed to the end"
    )
