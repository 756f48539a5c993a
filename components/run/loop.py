"""The one recipe loop: every recipe builds its bricks (tasks, harness, grader → a ``RolloutRunner``) and hands
them to ``run_recipe_loop``, which runs the steps in the mode ``rollout_mode`` names.

``sync`` (the reference)::

    engine  |== rollouts step 0 ==|            |== rollouts step 1 ==|
    trainer |                     |== train 0 ==|push|                |== train 1 ==|push|

  Each step rolls out its groups, writes them as one shard, trains, pushes the weights; the engine idles while
  the trainer trains and the trainer idles while the slowest rollout finishes.

``async``::

    engine  |== g0 ==|== g2 ====|== g4 ==|== g6 ==|...     (max_concurrency rollouts always in flight)
            |== g1 =========|== g3 ==|== g5 =====|...
    trainer |  wait  |== train 0 (g0,g1) ==|push|== train 1 (g2,g3) ==|push|...

  A producer keeps ``max_concurrency`` rollouts in flight across steps (slots are per rollout: a member that
  finished frees its slot for another group's rollout at once); each GRPO group is committed (one atomic shard)
  the moment its last member finishes; the trainer steps as soon as ``groups_per_step`` complete groups are
  buffered, in the order they completed, and pushes the new weights while rollouts keep running.

  How far ahead the producer runs: a group starts only while, trained in order, it would stay within
  ``max_staleness`` versions. While the trainer is the bottleneck (its last step found its groups complete)
  the producer runs ``max_steps_ahead`` steps (default 1) ahead of the step the trainer is on: further ahead
  would only fill the buffer with older groups. While rollouts are the bottleneck (the trainer waits for
  groups, or had to for its last step) it runs up to ``max_staleness`` steps ahead, so the slots go to later
  groups instead of idling behind a slow tail.

  A group whose oldest sampled token lags the trainer's version by more than ``max_staleness`` (a slow group
  overtaken by faster ones) is dropped, counted (``staleness/groups_dropped``), recorded in the ledger (never
  silently trained) and replaced; when its finished members already lag that much it is given up without
  waiting for its slow members.

The rollouts run in the driver, or (``rollout.placement actor``) in a Ray actor placed by its resources
(``components/rollout/producer.py``); the slots, the gate and the store's single writer stay in the driver.

``partial``::

    engine  |== step 0 groups ==|== step 1 groups ==...==|== step 2 groups ==|
    trainer |                   |== train 0 ==|push|     |== train 1 ==|push|

  Rollouts of step n+1 start while step n trains (up to ``max_steps_ahead`` steps ahead, as slots free up);
  steps train their own groups in order (as ``sync``: never overtaken, so never too stale); a rollout still
  generating when new weights arrive continues with them (the engine re-prefills in-flight requests and
  stamps every token with its version), so no rollout is thrown away.

In both overlapped modes every sampled token carries the version that produced it, and the trainer's truncated
importance-sampling weights are computed per token from those behaviour logprobs.

Resume (same ``--run-dir``), overlapped modes: which shard went into which step, and which were dropped, is the
``trajectory_ledger`` in the checkpoint's trainer state, written together with the weights it describes.
On restart, committed groups not in the ledger go back into the buffer (trained exactly once, after the
restart); groups that were in flight (never committed) are rolled out again; the engine starts from the
checkpoint's weights and version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from components.config import require
from components.protocols import Task
from components.remote_waits import StallReporter
from components.rollout.buffer import staleness_histogram
from components.run.overlapped import OverlappedLoop
from components.run.step_metrics import EngineIdleProbe, engine_probe, step_monitor, timing_metrics

if TYPE_CHECKING:
    from components.rollout import RolloutRunner
    from components.rollout.producer import ActorRolloutRunner
    from components.run.config import RunConfig
    from components.run.directory import RunDirectory
    from components.run.stack import RunStack

logger = logging.getLogger("rein.loop")

TasksForStep = Callable[[int], Sequence[Task]]


def tasks_for_step(tasks: Sequence[Task], *, step: int, num_tasks: int) -> list[Task]:
    """``num_tasks`` tasks for ``step``, walking through ``tasks`` in order (wrapping around)."""
    return [tasks[(step * num_tasks + index) % len(tasks)] for index in range(num_tasks)]


@dataclass(frozen=True, kw_only=True)
class LoopInputs:
    """What a recipe hands the loop: its config and run, the started stack, its bricks (as a runner), and
    which tasks make each step's groups."""

    config: RunConfig
    run: RunDirectory
    stack: RunStack
    runner: RolloutRunner | ActorRolloutRunner
    tasks_for_step: TasksForStep
    groups_per_step: int
    stalls: StallReporter


async def run_recipe_loop(
    config: RunConfig, run: RunDirectory, stack: RunStack, runner: RolloutRunner, tasks_for_step: TasksForStep
) -> None:
    """Run the recipe's steps in ``config.rollout.mode`` (see the module doc), with the run's monitor; the
    rollouts run in the driver or, with ``rollout.placement actor``, in a Ray actor placed by its resources."""
    groups_per_step = len(tasks_for_step(0))
    require(groups_per_step > 0, "tasks", "a step needs at least one task")
    if config.rollout.placement == "driver":
        await _run_steps(config, run, stack, runner, tasks_for_step, groups_per_step)
        return
    from components.rollout.producer import ActorRolloutRunner

    remote = await ActorRolloutRunner.start(
        runner, num_cpus=config.rollout.actor_num_cpus, resources=config.rollout.actor_resource_amounts
    )
    try:
        await _run_steps(config, run, stack, remote, tasks_for_step, groups_per_step)
    finally:
        await remote.close()


async def _run_steps(
    config: RunConfig,
    run: RunDirectory,
    stack: RunStack,
    runner: RolloutRunner | ActorRolloutRunner,
    tasks_for_step: TasksForStep,
    groups_per_step: int,
) -> None:
    inputs = LoopInputs(
        config=config,
        run=run,
        stack=stack,
        runner=runner,
        tasks_for_step=tasks_for_step,
        groups_per_step=groups_per_step,
        stalls=StallReporter(run.path, report_after_s=config.rollout.stall_report_after_s),
    )
    reporter = asyncio.create_task(inputs.stalls.run())  # no silent hang: see components/remote_waits.py
    try:
        if config.rollout.mode == "sync":
            await _run_sync(inputs)
        else:
            await OverlappedLoop(inputs).run()
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter


async def _run_sync(inputs: LoopInputs) -> None:
    """Today's strict loop: roll out → one shard → train → push → log (and checkpoint); see
    ``components/run/stack.py``."""
    config, stack = inputs.config, inputs.stack
    pending = stack.pending_steps(config.num_steps)
    first_step = pending[0] if pending else config.num_steps
    rollouts_per_step = inputs.groups_per_step * config.group_size
    monitor = step_monitor(inputs, rollouts_per_step=rollouts_per_step, first_step=first_step)
    async with engine_probe(stack.engine) as probe:
        with monitor:
            await _sync_steps(inputs, pending, monitor, probe)


async def _sync_steps(
    inputs: LoopInputs, pending: Sequence[int], monitor: Any, probe: EngineIdleProbe
) -> None:
    """Steps of ``sync``: roll out → one shard → train → push → log (and checkpoint)."""
    config, stack, runner, groups_per_step = (
        inputs.config,
        inputs.stack,
        inputs.runner,
        inputs.groups_per_step,
    )
    for step in pending:
        monitor.start_step(step)
        started = time.monotonic()
        # 1. rollout (or, after a restart, the step's stored shard)
        trajectories, shard = await stack.rollout_or_load(
            step,
            runner,
            inputs.tasks_for_step(step),
            # dynamic sampling's replacements: the tasks of the same step of a later pass over the run
            replacement_tasks=lambda round_, step=step: inputs.tasks_for_step(
                step + round_ * config.num_steps
            ),
        )
        for trajectory in trajectories:
            monitor.rollout_finished(trajectory)
        rollout_s = time.monotonic() - started
        # 2. train, 3. sync weights to the engine
        train_metrics = await stack.train_and_sync(step, [shard] if shard else [])
        wall_s = time.monotonic() - started
        pipeline = timing_metrics(
            trajectories,
            max_concurrency=config.rollout.max_concurrency,
            wall_s=wall_s,
            train_s=wall_s - rollout_s,
            trained_tokens=float(train_metrics.get("train/num_tokens", 0.0)),
        )
        pipeline.update(staleness_histogram([0] * groups_per_step))
        pipeline.update(stack.last_sampling_metrics)
        pipeline.update(probe.take())
        pipeline.update(inputs.stalls.take())
        # 4. log, 5. checkpoint when due (after the log: see ``RunStack.train_and_sync``)
        monitor.end_step(
            step,
            trajectories,
            train_metrics=train_metrics,
            rollout_wall_time_s=rollout_s,
            extra_metrics=pipeline,
        )
        await stack.checkpoint_if_due(step)
