"""The ``async`` loop's scheduling, in seconds and without Ray: the real ``OverlappedLoop``, ``TrajectoryStore``,
``GroupBuffer``, ledger and monitor, over a scripted rollout runner (each member takes a chosen time and
samples its tokens, at its end, with the trainer's current version) and an instant trainer.

One group has a member that would take a minute: it is overtaken, its finished member is soon more than
``max_staleness`` versions behind, so the loop gives the group up without waiting (its slot goes back, a
replacement is rolled out — after every needed group was already started, the case that once stalled the
producer for good) and the run ends in seconds, every committed group trained exactly once."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from components.rollout.buffer import TrajectoryLedger, group_index
from components.run.config import RolloutBrickConfig, RunConfig
from components.run.loop import run_recipe_loop
from components.run.stack import RunStack
from components.training.checkpoint import TrainerState
from components.trajectory import Segment, Trajectory, TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from monitoring.logger import WandbLoggersConfig

GROUP_SIZE, GROUPS_PER_STEP, NUM_STEPS, MAX_STALENESS = 2, 2, 4, 2
SLOW_GROUP, SLOW_MEMBER_S, MEMBER_S = 0, 60.0, 0.05


class InstantTrainer:
    """The trainer's state machine (version += 1 per step; the ledger rides in ``state.extra``), no model."""

    def __init__(self) -> None:
        self.state = TrainerState()
        self.trained_shards: list[list[str]] = []

    def step(self, shards, current_version: int) -> dict[str, float]:
        assert current_version == self.state.weight_version
        self.trained_shards.append([Path(s).name for s in shards])
        self.state = replace(self.state, step=self.state.step + 1, weight_version=current_version + 1)
        return {"trained": 1.0, "train/num_tokens": 8.0}


class SlowTrainer(InstantTrainer):
    """An instant trainer that takes ``step_s`` per step (the loop runs ``step`` in a thread)."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.step_s = step_s

    def step(self, shards, current_version: int) -> dict[str, float]:
        time.sleep(self.step_s)
        return super().step(shards, current_version)


def slow_member_of_the_slow_group(index: int, number: int) -> float:
    return SLOW_MEMBER_S if index == SLOW_GROUP and number == 1 else MEMBER_S


class ScriptedRunner:
    """``RolloutRunner.run_group``'s contract: each member holds a slot while it runs, samples its tokens at its
    end with the trainer's current version, and is reported through ``on_member`` before its slot frees."""

    def __init__(self, trainer: InstantTrainer, member_s=slow_member_of_the_slow_group) -> None:
        self.trainer = trainer
        self.member_s = member_s
        self.most_running = 0
        self.running = 0

    async def run_group(self, task, *, group_id, step, slots, on_member=None):
        index = group_index(group_id)

        async def member(number: int) -> Trajectory:
            async with slots:
                self.running += 1
                self.most_running = max(self.most_running, self.running)
                try:
                    await asyncio.sleep(self.member_s(index, number))
                finally:
                    self.running -= 1
                version = self.trainer.state.weight_version
                trajectory = Trajectory(
                    trajectory_id=f"{group_id}-{number}",
                    group_id=group_id,
                    task_id=task.task_id,
                    harness="scripted",
                    status=TrajectoryStatus.OK,
                    reward=float(number),
                    step=step,
                    segments=(
                        Segment(
                            token_ids=np.arange(6),
                            loss_mask=np.array([0, 0, 0, 1, 1, 1]),
                            logprobs=np.array([0.0, 0.0, 0.0, -0.5, -0.5, -0.5]),
                            weight_versions=np.array([-1, -1, -1, version, version, version]),
                        ),
                    ),
                )
                if on_member is not None:
                    on_member(trajectory)
            return trajectory

        return list(await asyncio.gather(*(member(n) for n in range(GROUP_SIZE))))


async def no_push(trainer, version):
    return {}


async def no_checkpoint(step):
    return None


class NoTrackers:
    def open(self, run_dir, *, run_name, run_config):
        return []


class LoopStack(SimpleNamespace):
    """The parts of a ``RunStack`` the loop reads, with its real train-and-sync step (ledger, train, push)."""

    train_and_sync = RunStack.train_and_sync


def loop_parts(tmp_path, trainer, *, num_steps=NUM_STEPS, **rollout):
    """The async run's config and a stack of the real store over ``trainer``, no model, engine or checkpoints."""
    rollout = {"mode": "async", "max_staleness": MAX_STALENESS, "max_concurrency": 4, **rollout}
    config = RunConfig(
        model="tiny",
        num_steps=num_steps,
        group_size=GROUP_SIZE,
        rollout=RolloutBrickConfig(**rollout),
        monitoring=WandbLoggersConfig(wandb_mode="disabled"),
        checkpoint_every_steps=0,
    )
    stack = LoopStack(
        config=config,
        store=TrajectoryStore(tmp_path),
        trainer=trainer,
        ledger=TrajectoryLedger.from_state(trainer.state.extra),
        weight_sync=SimpleNamespace(push=no_push),
        engine=None,
        checkpoint_if_due=no_checkpoint,
        bricks=SimpleNamespace(loggers=NoTrackers()),
    )
    return config, stack, SimpleNamespace(path=tmp_path, model_path=tmp_path)


def tasks_for_step(step: int):
    return [SimpleNamespace(task_id=f"task-{step}-{i}") for i in range(GROUPS_PER_STEP)]


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


async def test_a_doomed_group_is_given_up_and_replaced_without_waiting_for_its_slow_member(tmp_path):
    trainer = InstantTrainer()
    config, stack, run = loop_parts(tmp_path, trainer)
    runner = ScriptedRunner(trainer)

    started = time.monotonic()
    await asyncio.wait_for(run_recipe_loop(config, run, stack, runner, tasks_for_step), 30)
    assert time.monotonic() - started < SLOW_MEMBER_S / 4  # never waited for the slow member

    ledger = TrajectoryLedger.from_state(trainer.state.extra)
    assert sorted(ledger.step_shards) == list(range(NUM_STEPS))
    trained = [name for names in ledger.step_shards.values() for name in names]
    committed = sorted(path.name for path in stack.store.shard_paths())
    assert sorted(trained) == committed and len(set(trained)) == len(trained)  # each exactly once
    trained_indices = {
        group_index(t.group_id)
        for name in trained
        for t in stack.store.read_shard(tmp_path / "trajectories" / name)
    }
    assert SLOW_GROUP not in trained_indices  # given up, never committed
    assert len(trained_indices) == NUM_STEPS * GROUPS_PER_STEP  # and replaced: every step got its groups
    rows = metric_rows(tmp_path)
    assert sum(row["staleness/groups_dropped"] for row in rows) == 1
    assert all(row["staleness/max"] <= MAX_STALENESS for row in rows)
    # a finished member's slot went to another group's rollout while the slow member kept its own
    assert runner.most_running == 4


async def test_a_busy_trainer_gets_groups_one_version_old_not_max_staleness(tmp_path):
    """When the trainer is the bottleneck, starting groups further ahead only fills the buffer with older groups:
    with ``max_steps_ahead`` 1 (the default) a trainer that finds its groups complete trains each one version
    after the one it started under, even with ``max_staleness`` 2 (the first step waits for the pipeline to
    fill, so the groups started meanwhile reach 2 for a few steps); always running two steps ahead (the loop's old rule,
    ``max_steps_ahead 2``) makes every later group 2 versions old at the same throughput."""
    num_steps, staleness = 7, {}
    for steps_ahead in (1, 2):
        run_dir = tmp_path / f"ahead-{steps_ahead}"
        trainer = SlowTrainer(step_s=0.3)
        config, stack, run = loop_parts(run_dir, trainer, num_steps=num_steps, max_steps_ahead=steps_ahead)
        runner = ScriptedRunner(trainer, member_s=lambda index, number: 0.02)
        await asyncio.wait_for(run_recipe_loop(config, run, stack, runner, tasks_for_step), 60)
        rows = metric_rows(run_dir)
        assert len(rows) == num_steps and sum(row["staleness/groups_dropped"] for row in rows) == 0
        assert all(row["pipeline/trainer_wait_s"] < 0.25 for row in rows[1:])  # the trainer is the bottleneck
        staleness[steps_ahead] = [row["staleness/max"] for row in rows]
    # once the fill has drained (a few steps), every step: one version
    assert max(staleness[1]) <= MAX_STALENESS and staleness[1][-3:] == [1.0] * 3, staleness
    assert staleness[2][-3:] == [2.0] * 3, staleness  # the weakened rule this guards against


async def test_the_producer_runs_further_ahead_while_the_trainer_waits_for_rollouts(tmp_path):
    """While the trainer waits for groups still rolling out, the slots go to later groups, up to
    ``max_staleness`` steps ahead: here 12 slots, 2 groups of 2 per step, so one step ahead would leave a third
    of the slots idle (at most 4 groups = 8 rollouts in line) while the trainer waits."""
    trainer = InstantTrainer()
    config, stack, run = loop_parts(tmp_path, trainer, max_concurrency=12, max_steps_ahead=1)
    runner = ScriptedRunner(trainer, member_s=lambda index, number: 0.5)
    await asyncio.wait_for(run_recipe_loop(config, run, stack, runner, tasks_for_step), 60)
    assert runner.most_running == (MAX_STALENESS + 1) * GROUPS_PER_STEP * GROUP_SIZE == 12
    rows = metric_rows(tmp_path)
    assert all(row["staleness/max"] <= MAX_STALENESS for row in rows)
