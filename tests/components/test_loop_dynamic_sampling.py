"""Dynamic sampling in the overlapped loop (``async``): a committed group whose rewards are all equal is recorded
as dropped in the ledger and another group is drawn, at most ``max_extra_groups`` per step; the trainer only
gets groups whose rewards differ while the cap allows. Scripted rollouts, the real store and ledger, no model."""

from __future__ import annotations

import asyncio

from components.rollout.buffer import TrajectoryLedger, group_index
from components.rollout.dynamic_sampling import ZERO_VARIANCE_DROP_REASON, DynamicSamplingConfig
from components.run.config import RolloutBrickConfig
from components.run.loop import run_recipe_loop
from tests.components.test_loop_scheduling import (
    NUM_STEPS,
    InstantTrainer,
    ScriptedRunner,
    loop_parts,
    metric_rows,
    tasks_for_step,
)


class FlatEveryThirdGroup(ScriptedRunner):
    """Members' rewards are their numbers (0, 1), except in every third group, where both get 1."""

    async def run_group(self, task, *, group_id, step, slots, on_member=None):
        members = await super().run_group(
            task, group_id=group_id, step=step, slots=slots, on_member=on_member
        )
        if group_index(group_id) % 3 == 0:
            return [m.__class__(**{**m.__dict__, "reward": 1.0}) for m in members]
        return members


async def test_flat_groups_are_dropped_and_replaced_in_async_mode(tmp_path):
    trainer = InstantTrainer()
    config, stack, run = loop_parts(tmp_path, trainer, max_concurrency=2)
    sampling = DynamicSamplingConfig(enabled=True, max_extra_groups=4)
    config = config.__class__(
        **{
            **config.__dict__,
            "rollout": RolloutBrickConfig(**{**config.rollout.__dict__, "dynamic_sampling": sampling}),
        }
    )
    runner = FlatEveryThirdGroup(trainer, member_s=lambda index, number: 0.02)
    await asyncio.wait_for(run_recipe_loop(config, run, stack, runner, tasks_for_step), 30)

    ledger = TrajectoryLedger.from_state(trainer.state.extra)
    assert sorted(ledger.step_shards) == list(range(NUM_STEPS))
    trained = [name for names in ledger.step_shards.values() for name in names]
    for name in trained:  # every trained group's rewards differ
        rewards = {t.reward for t in stack.store.read_shard(tmp_path / "trajectories" / name)}
        assert len(rewards) == 2, (name, rewards)
    dropped = [name for name, reason in ledger.dropped.items() if reason == ZERO_VARIANCE_DROP_REASON]
    flat = [
        path.name
        for path in stack.store.shard_paths()
        if group_index(stack.store.read_shard(path)[0].group_id) % 3 == 0
    ]
    assert dropped and sorted(dropped) == sorted(set(flat) - set(trained))
    rows = metric_rows(tmp_path)
    assert sum(row["dynamic_sampling/extra_groups"] for row in rows) == len(dropped)
    assert all(row["dynamic_sampling/extra_groups"] <= 4 for row in rows)
