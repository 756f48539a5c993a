"""A short real run with one of its processes SIGKILLed (the chaos tests of the engine actor and the trainer's
workers): ``tictactoe_grpo`` in sync mode, a process picked by its Ray title killed at a random point after step 0,
and the checks every such run must pass afterwards."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from components.trajectory_store import TrajectoryStore
from tests.recipes.recipe_runs import (
    latest_trainer_state,
    metric_steps,
    shard_steps,
    spawn_recipe,
)

RUN_BOUND_S = 420
GONE_WITHIN_S = 30.0
NUM_STEPS = 4


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).children(recursive=True)
    return []


def titled(processes: list[psutil.Process], title: str) -> set[int]:
    """The pids among ``processes`` whose Ray title starts with ``title`` (e.g. ``ray::EngineActor``)."""
    found = set()
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if " ".join(process.cmdline()).startswith(title):
                found.add(process.pid)
    return found


def still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
    return left


def wait_until_step_0_is_trained(driver: subprocess.Popen, run_dir: Path, *, bound_s: float) -> None:
    """Until the run's first metrics row (step 0 trained and its weights pushed); fails with the driver's output
    if it exits first, or after ``bound_s``."""
    metrics, started = run_dir / "metrics.jsonl", time.monotonic()
    while not (metrics.exists() and metrics.read_text().strip()):
        assert driver.poll() is None, driver.communicate()[0][-4000:]
        assert time.monotonic() - started < bound_s, "step 0 was not done in time"
        time.sleep(0.2)


@dataclass(frozen=True)
class KilledRun:
    run_dir: Path
    killed: int  # the pid killed (of the first title)
    started_again: set[int]  # pids with the first title started after the kill
    duration_s: float
    restarted: dict[str, set[int]] = field(default_factory=dict)  # per title killed: pids started after it


def run_with_a_process_killed(
    run_dir: Path,
    model_dir: Path,
    title: str,
    *,
    mode: str = "sync",
    extra_flags: tuple[str, ...] = (),
    also_kill: tuple[str, ...] = (),
) -> KilledRun:
    """Run ``tictactoe_grpo`` (``mode``, ``NUM_STEPS`` steps, plus ``extra_flags``); once step 0 is done, at a
    random point, SIGKILL one process of the run titled ``title`` (then, each after another random 0-2 s, one
    titled each of ``also_kill``). Asserts the run then finishes within ``RUN_BOUND_S`` and leaves no process of
    its own behind within ``GONE_WITHIN_S``."""
    flags = (
        "--model", str(model_dir), "--run-dir", str(run_dir), "--num-steps", str(NUM_STEPS),
        "--group-size", "2", "--games-per-step", "2", "--rollout-mode", mode, "--wandb-mode", "offline",
        *extra_flags,
    )  # fmt: skip
    started = time.monotonic()
    driver = spawn_recipe("tictactoe_grpo", *flags)  # own session: for clean-up; the fault is one SIGKILL
    recorded: dict[int, psutil.Process] = {}
    titles = (title, *also_kill)
    restarted: dict[str, set[int]] = {name: set() for name in titles}
    before: dict[str, set[int]] = {}
    try:
        wait_until_step_0_is_trained(driver, run_dir, bound_s=RUN_BOUND_S)
        killed = 0
        for name in titles:
            time.sleep(
                random.uniform(0.0, 2.0)
            )  # a random point of step 1 (rolling out or training) or later
            recorded.update((p.pid, p) for p in _tree(driver.pid))
            before[name] = titled(list(recorded.values()), name)
            assert before[name], f"no process titled {name} in the run"
            victim = random.choice(sorted(before[name]))
            os.kill(victim, signal.SIGKILL)  # the fault
            killed = killed or victim
        while driver.poll() is None:  # every process the run starts from here on is checked at the end too
            assert time.monotonic() - started < RUN_BOUND_S, "the run did not finish in time"
            tree = _tree(driver.pid)
            recorded.update((p.pid, p) for p in tree)
            for name in titles:
                restarted[name] |= titled(tree, name) - before[name]
            time.sleep(0.5)
        output = driver.communicate()[0]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0, output[-6000:]
    duration_s = time.monotonic() - started
    ended_at = time.monotonic()
    while (left := still_running(list(recorded.values()))) and time.monotonic() - ended_at < GONE_WITHIN_S:
        time.sleep(0.2)
    assert not left, f"left behind: {[(p.pid, p.name()) for p in left]}"
    return KilledRun(
        run_dir=run_dir,
        killed=killed,
        started_again=restarted[title],
        duration_s=duration_s,
        restarted=restarted,
    )


def assert_every_step_trained_once(run_dir: Path, num_steps: int = NUM_STEPS) -> None:
    """Sync: every step done; every committed shard trained exactly once (the last checkpoint's consumed
    shards); no trajectory committed twice."""
    shards = shard_steps(run_dir)
    assert sorted(step for step, _ in shards.values()) == list(range(num_steps))
    ids = [i for _, names in shards.values() for i in names]
    assert len(ids) == len(set(ids)), "a trajectory was committed twice"
    consumed = latest_trainer_state(run_dir)["consumed_shards"]
    assert sorted(consumed) == sorted(shards), "a committed shard was trained twice or not at all"
    assert metric_steps(run_dir) == list(range(num_steps))


def assert_every_step_trained_once_with_its_version(run_dir: Path) -> list:
    """``assert_every_step_trained_once``, and every trained token sampled by its step's version (sync: step s
    by version s). Returns the stored trajectories."""
    assert_every_step_trained_once(run_dir)
    store = TrajectoryStore(run_dir)
    trajectories = [t for path in store.shard_paths() for t in store.read_shard(path)]
    for trajectory in (t for t in trajectories if t.trainable):
        for segment in trajectory.segments:
            versions = set(segment.weight_versions[segment.loss_mask == 1].tolist())
            assert versions <= {trajectory.step}, (trajectory.step, versions)
    return trajectories


def assert_every_committed_group_trained_at_most_once(run_dir: Path, num_steps: int = NUM_STEPS) -> None:
    """Async: the ledger of the last checkpoint trains every step, no committed group twice, and accounts for
    every committed group (trained, or dropped as stale or lost to infrastructure); no trajectory repeats."""
    shards = shard_steps(run_dir)
    ids = [i for _, names in shards.values() for i in names]
    assert len(ids) == len(set(ids)), "a trajectory was committed twice"
    ledger = latest_trainer_state(run_dir)["extra"]["trajectory_ledger"]
    trained = [name for names in ledger["step_shards"].values() for name in names]
    assert sorted(int(step) for step in ledger["step_shards"]) == list(range(num_steps))
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert sorted(trained + list(ledger["dropped"])) == sorted(shards), "a committed group went missing"
    assert set(ledger["dropped"].values()) <= {"stale", "lost_to_infrastructure"}
    assert metric_steps(run_dir) == list(range(num_steps))
