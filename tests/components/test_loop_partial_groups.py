"""Partial groups in the overlapped loop (``async``): a committed group whose members were all lost to
infrastructure failures is recorded as dropped (``lost_to_infrastructure``) and replaced; a group that lost one
member trains with its survivor; both are counted per step. The weakened variant (``min_group_size 0``) trains
the lost groups. Scripted rollouts, the real store and ledger, no model."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from components.rollout.buffer import TrajectoryLedger, group_index
from components.rollout.partial_groups import LOST_TO_INFRASTRUCTURE_DROP_REASON, PartialGroupConfig
from components.run.loop import run_recipe_loop
from components.trajectory import TrajectoryStatus
from tests.components.test_loop_scheduling import (
    NUM_STEPS,
    InstantTrainer,
    ScriptedRunner,
    loop_parts,
    metric_rows,
    tasks_for_step,
)


class SandboxesDie(ScriptedRunner):
    """Group 1 loses both members to sandbox failures, group 2 its member 0; the others are whole."""

    async def run_group(self, task, *, group_id, step, slots, on_member=None):
        members = await super().run_group(task, group_id=group_id, step=step, slots=slots)
        index = group_index(group_id)
        lost = {1: {0, 1}, 2: {0}}.get(index, set())
        members = [
            replace(m, status=TrajectoryStatus.SANDBOX_ERROR, reward=None, failure_reason="sandbox died")
            if number in lost
            else m
            for number, m in enumerate(members)
        ]
        for member in members:
            if on_member is not None:
                on_member(member)
        return members


async def _run(tmp_path, partial: PartialGroupConfig):
    trainer = InstantTrainer()
    config, stack, run = loop_parts(tmp_path, trainer, max_concurrency=2, partial_groups=partial)
    runner = SandboxesDie(trainer, member_s=lambda index, number: 0.02)
    await asyncio.wait_for(run_recipe_loop(config, run, stack, runner, tasks_for_step), 30)
    ledger = TrajectoryLedger.from_state(trainer.state.extra)
    trained = {name for names in ledger.step_shards.values() for name in names}
    groups = {
        path.name: group_index(stack.store.read_shard(path)[0].group_id) for path in stack.store.shard_paths()
    }
    return ledger, trained, groups, metric_rows(tmp_path)


async def test_lost_groups_are_replaced_and_partial_groups_train_with_their_survivors(tmp_path):
    ledger, trained, groups, rows = await _run(tmp_path, PartialGroupConfig(min_group_size=1))
    assert sorted(ledger.step_shards) == list(range(NUM_STEPS))
    lost = [name for name, index in groups.items() if index == 1]
    assert ledger.dropped == {lost[0]: LOST_TO_INFRASTRUCTURE_DROP_REASON}
    assert lost[0] not in trained
    survivor = next(name for name, index in groups.items() if index == 2)
    assert survivor in trained  # one member left: trained with it
    assert sum(len(names) for names in ledger.step_shards.values()) == NUM_STEPS * 2  # replaced: steps full
    assert sum(row["partial_groups/replaced"] for row in rows) == 1
    assert sum(row["partial_groups/trained_with_survivors"] for row in rows) == 1
    assert sum(row["partial_groups/members_lost"] for row in rows) == 1


async def test_weakened_min_group_size_zero_trains_the_lost_group(tmp_path):
    ledger, trained, groups, rows = await _run(tmp_path, PartialGroupConfig(min_group_size=0))
    lost = next(name for name, index in groups.items() if index == 1)
    assert lost in trained and not ledger.dropped
    assert sum(row["partial_groups/replaced"] for row in rows) == 0
