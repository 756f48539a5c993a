"""The ``async`` and ``partial`` rollout modes (see ``components/run/loop.py``): a rollout producer and the trainer,
joined by a buffer of complete groups, each group one shard committed as it completes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import require
from components.protocols import Task
from components.rollout.buffer import (
    Group,
    GroupBuffer,
    TrajectoryLedger,
    group_id_for,
    group_index,
    oldest_token_version,
    split_stale,
    staleness_histogram,
)
from components.rollout.dynamic_sampling import ZERO_VARIANCE_DROP_REASON, is_informative
from components.rollout.partial_groups import LOST_TO_INFRASTRUCTURE_DROP_REASON, partial_group_metrics
from components.run.step_metrics import EngineIdleProbe, engine_probe, step_monitor, timing_metrics
from components.trajectory import Trajectory
from components.trajectory_store import CorruptShard, TrajectoryStore

if TYPE_CHECKING:
    from components.run.loop import LoopInputs

logger = logging.getLogger("rein.loop")

STALENESS_DROP_REASON = "stale"


class RolloutSlots:
    """``capacity`` rollout slots shared by every group in flight: a member that finished frees its slot for
    another group's rollout at once (per-group slots idle while a group's fastest members wait for its slowest).
    The producer starts a group when ``has_room`` and ``reserve``s its members, which take slots as they free."""

    def __init__(self, capacity: int, changed: asyncio.Condition) -> None:
        self.capacity = capacity
        self.running = 0
        self.reserved = 0  # members of started groups not yet holding a slot
        self._semaphore = asyncio.Semaphore(capacity)
        self._changed = changed

    def has_room(self) -> bool:
        """A slot is free and every started group's members already hold one."""
        return self.reserved <= 0 and self.running < self.capacity

    def reserve(self, count: int) -> None:
        self.reserved += count

    async def __aenter__(self) -> None:
        await self._semaphore.acquire()
        self.reserved -= 1
        self.running += 1
        if self.has_room():  # the started group's last member got a slot and one is still free
            async with self._changed:
                self._changed.notify_all()

    async def __aexit__(self, *exc_info: object) -> None:
        self.running -= 1
        self._semaphore.release()
        async with self._changed:
            self._changed.notify_all()


class OverlappedLoop:
    """``async`` and ``partial``: a rollout producer and the trainer, joined by a buffer of complete groups."""

    def __init__(self, inputs: LoopInputs) -> None:
        self.inputs = inputs
        self.config = inputs.config
        self.run_dir = inputs.run
        self.stack = inputs.stack
        self.runner = inputs.runner
        self.tasks_for_step = inputs.tasks_for_step
        self.rollout = inputs.config.rollout
        self.groups_per_step = inputs.groups_per_step
        self.store: TrajectoryStore = self.stack.store
        self.buffer = GroupBuffer(self.config.group_size)
        self.ledger: TrajectoryLedger = self.stack.ledger  # the run's one resume ledger
        self.changed = asyncio.Condition()
        self.open_groups: set[int] = set()  # admitted, not yet trained or dropped
        self.taken_for_step = 0  # groups the trainer took for the step it is collecting or training
        self.redo: list[int] = []  # groups in flight at a crash (never committed): rolled out again
        self.trainer_waiting = False  # the trainer waits for groups still rolling out now (``_admissible``)
        self.trainer_waited = False  # ... or had to, for the step it trains now
        self.next_index = 0
        self.groups_wanted = 0  # more groups the producer must still start
        self.slots = RolloutSlots(self.rollout.max_concurrency, self.changed)
        self.failed: Exception | None = None  # a group that could not be committed stops the producer
        self.committed_since_step: list[Trajectory] = []
        self.dropped_groups = 0
        self.extra_groups = 0  # groups drawn this step in place of groups whose rewards were all equal
        self.replaced_short_groups = 0  # groups drawn this step in place of groups too short to train
        self.monitor: Any = None

    # --- resume --------------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild the buffer from the store: committed groups not in the ledger wait to be trained; groups
        whose index was given out but never committed were in flight at the crash and are redone."""
        settled = self.ledger.settled() | set(self.stack.trainer.state.consumed_shards)
        seen: set[int] = set()
        for path, item in self.store.iter_shards():
            if isinstance(item, CorruptShard) or not item:
                continue
            index = group_index(item[0].group_id)
            if index is None:
                require(
                    path.name in settled,
                    "rollout_mode",
                    f"{self.run_dir.path} holds shards of a sync run that are not trained yet; resume it in "
                    "rollout_mode sync",
                )
                continue
            seen.add(index)
            if path.name not in settled:
                self.buffer.add_group(item, path)
                self.open_groups.add(index)
        self.next_index = max(seen, default=-1) + 1
        self.redo = [index for index in range(self.next_index) if index not in seen]
        self.open_groups.update(self.redo)
        remaining = (self.config.num_steps - self.ledger.steps_done) * self.groups_per_step
        self.groups_wanted = max(0, remaining - len(self.open_groups))
        if seen:
            logger.info(
                "resume: %d steps done, %d committed groups to train, %d interrupted groups rolled out again, "
                "next group %d",
                self.ledger.steps_done,
                self.buffer.depth,
                len(self.redo),
                self.next_index,
            )

    # --- producer ------------------------------------------------------------------------------------------
    def _task_of(self, index: int) -> Task:
        return self.tasks_for_step(index // self.groups_per_step)[index % self.groups_per_step]

    def _admissible(self) -> bool:
        """Another group may start: the groups before it in line (the current step's, taken or not, and every
        open one) fill fewer than ``RolloutBrickConfig.steps_in_line`` steps, rollouts being the bottleneck while the
        trainer waits for groups now or had to for its last step."""
        in_line = self.taken_for_step + len(self.open_groups)
        rollout_bound = self.trainer_waiting or self.trainer_waited
        return in_line < self.rollout.steps_in_line(rollout_bound=rollout_bound) * self.groups_per_step

    async def _next_group(self) -> int:
        """The next group to roll out, once the producer is allowed to run that far ahead. With every needed
        group started it waits on: a group dropped for staleness later needs a replacement (the producer
        ends when the trainer has trained its last step)."""
        async with self.changed:
            while True:
                if self.failed is not None:
                    raise self.failed
                if self.redo:
                    return self.redo.pop(0)
                if self.groups_wanted > 0 and self._admissible():
                    index = self.next_index
                    self.next_index += 1
                    self.groups_wanted -= 1
                    self.open_groups.add(index)
                    return index
                await self.changed.wait()

    async def _roll_out_group(self, index: int) -> None:
        try:
            await self._commit_group(index)
        except Exception as error:  # e.g. the store cannot write: the producer, and so the run, fails
            async with self.changed:
                self.failed = error
                self.changed.notify_all()

    async def _commit_group(self, index: int) -> None:
        task = self._task_of(index)
        started = time.monotonic()
        finished: list[Trajectory] = []
        rollouts = asyncio.create_task(
            self.runner.run_group(
                task,
                group_id=group_id_for(index, task.task_id),
                step=index // self.groups_per_step,
                slots=self.slots,
                on_member=finished.append,
            )
        )
        doom = asyncio.create_task(self._give_up_when_doomed(index, finished))
        try:
            await asyncio.wait({rollouts, doom}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            doom.cancel()
            given_up = doom.done() and not doom.cancelled()
            if given_up or not rollouts.done():
                rollouts.cancel()
        if given_up:  # counted as dropped and replaced (``_abandon``): never committed
            return
        trajectories = rollouts.result()
        if self.config.distillation.enabled:  # scored while other groups roll out; stored: never scored again
            trajectories = await self.stack.score_with_teachers(trajectories)
        shard = await asyncio.to_thread(self.store.write, trajectories)  # atomic: the group is committed
        async with self.changed:
            if self._replaced(index, trajectories, shard):
                return
            self.buffer.add_group(trajectories, shard)
            self.committed_since_step.extend(trajectories)
            self.changed.notify_all()
        logger.debug(
            "group %d committed after %.2f s (buffer %d, open %d)",
            index,
            time.monotonic() - started,
            self.buffer.depth,
            len(self.open_groups),
        )
        if self.monitor is not None:  # the live display counts rollouts as they finish
            for trajectory in trajectories:
                self.monitor.rollout_finished(trajectory)

    def _replaced(self, index: int, trajectories: Sequence[Trajectory], shard: Path) -> bool:
        """A committed group left with too few survivors of infrastructure failures (``partial_groups``, while
        the step's ``max_replacements`` allow), or, with dynamic sampling, whose rewards are all equal (while
        ``max_extra_groups`` allow), is recorded as dropped and another group is drawn (called holding
        ``changed``)."""
        sampling, partial = self.rollout.dynamic_sampling, self.rollout.partial_groups
        if partial.is_short(trajectories) and self.replaced_short_groups < partial.max_replacements:
            self.ledger.record_dropped([shard], LOST_TO_INFRASTRUCTURE_DROP_REASON)
            self.replaced_short_groups += 1
            logger.info("group %d lost too many members to infrastructure failures: replaced", index)
        elif (
            not sampling.enabled
            or is_informative(trajectories)
            or self.extra_groups >= sampling.max_extra_groups
        ):
            return False
        else:
            self.ledger.record_dropped([shard], ZERO_VARIANCE_DROP_REASON)
            self.extra_groups += 1
        self.open_groups.discard(index)
        self.groups_wanted += 1
        self.changed.notify_all()
        if self.monitor is not None:
            for trajectory in trajectories:
                self.monitor.rollout_finished(trajectory)
        return True

    def _doomed(self, finished: Sequence[Trajectory]) -> bool:
        """``async``: the group's finished members already sampled a token more than ``max_staleness`` versions
        behind the trainer, so the group can only be dropped: its slow members are not worth waiting for."""
        if self.rollout.mode != "async":
            return False
        oldest = oldest_token_version(finished)
        version = self.stack.trainer.state.weight_version
        return oldest is not None and version - oldest > self.rollout.max_staleness

    async def _give_up_when_doomed(self, index: int, finished: Sequence[Trajectory]) -> None:
        """Return once the group is doomed (``_doomed``) and given up; re-checked on every change (a member
        that finished frees its slot, a step trained). Never returns in ``partial``."""
        async with self.changed:
            await self.changed.wait_for(lambda: self._doomed(finished))
            self._abandon(index)

    def _abandon(self, index: int) -> None:
        """Give a doomed group up before it is committed: counted as dropped for staleness, replaced (nothing
        was committed, so nothing enters the ledger; after a crash its index is simply rolled out again)."""
        self.open_groups.discard(index)
        self.dropped_groups += 1
        self.groups_wanted += 1
        self.changed.notify_all()
        logger.debug("group %d abandoned: a finished member is beyond max_staleness", index)

    async def produce(self) -> None:
        """Keep ``max_concurrency`` rollouts in flight until the run ends (``run`` cancels it): a group starts as
        soon as a rollout slot is free (its members queue for slots; the next group waits until they all run).
        A failed group fails the producer, and so the run."""
        running: set[asyncio.Task] = set()
        try:
            while True:
                async with self.changed:
                    await self.changed.wait_for(lambda: self.failed is not None or self.slots.has_room())
                index = await self._next_group()
                self.slots.reserve(self.config.group_size)
                logger.debug("group %d started (open %d)", index, len(self.open_groups))
                job = asyncio.create_task(self._roll_out_group(index))
                running.add(job)
                job.add_done_callback(running.discard)
        finally:
            for job in list(running):
                job.cancel()

    # --- trainer -------------------------------------------------------------------------------------------
    async def _collect_step(self) -> tuple[list[Group], list[int], float]:
        """This step's fresh groups (waiting as needed), the staleness of every group looked at, seconds waited."""
        fresh: list[Group] = []
        staleness: list[int] = []
        started = time.monotonic()
        ordered = self.rollout.mode == "partial"
        async with self.changed:
            while True:
                if ordered:  # the next groups_per_step indices, whether started yet or not
                    upcoming = range(self.next_index, self.next_index + self.groups_per_step)
                    wanted = [*sorted(self.open_groups), *upcoming][: self.groups_per_step]
                    groups = self.buffer.take_indices(wanted) or []
                else:
                    groups = self.buffer.take(self.groups_per_step - len(fresh))
                if groups:
                    version = self.stack.trainer.state.weight_version
                    split = split_stale(
                        groups, current_version=version, max_staleness=self.rollout.max_staleness
                    )
                    staleness += split.staleness
                    fresh += split.fresh
                    self.taken_for_step = len(fresh)
                    for group in groups:
                        self.open_groups.discard(group.index)
                    if split.stale:
                        self._drop(split.stale)
                    self.changed.notify_all()
                    if ordered or len(fresh) >= self.groups_per_step:
                        self.trainer_waited, self.trainer_waiting = self.trainer_waiting, False
                        return fresh, staleness, time.monotonic() - started
                if (
                    not self.trainer_waiting
                ):  # rollouts are the bottleneck: the producer may run further ahead
                    self.trainer_waiting = True
                    self.changed.notify_all()
                await self.changed.wait()

    def _drop(self, stale: Sequence[Group]) -> None:
        self.ledger.record_dropped((s for g in stale for s in g.shards), STALENESS_DROP_REASON)
        self.dropped_groups += len(stale)
        logger.info("dropped %d groups beyond max_staleness %d", len(stale), self.rollout.max_staleness)
        if self.rollout.mode == "async":
            self.groups_wanted += len(stale)  # the trainer still gets groups_per_step fresh groups

    async def _train(self, step: int, groups: Sequence[Group]) -> dict[str, float]:
        """The stack's one train-and-sync step on the groups' shards (it enters them in the ledger); the caller
        logs the step, then checkpoints (``RunStack.checkpoint_if_due``)."""
        return await self.stack.train_and_sync(step, [s for g in groups for s in g.shards])

    async def run(self) -> None:
        self.recover()
        first_step = self.ledger.steps_done
        rollouts_per_step = self.groups_per_step * self.config.group_size
        monitor = step_monitor(self.inputs, rollouts_per_step=rollouts_per_step, first_step=first_step)
        self.monitor = monitor
        producer = asyncio.create_task(self.produce())
        try:
            async with engine_probe(self.stack.engine) as probe:
                await self._steps(first_step, monitor, producer, probe)
        finally:
            if not producer.done():
                producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await producer
        leftover = self.buffer.depth + self.buffer.num_partial
        if leftover:
            logger.warning("%d committed groups were left untrained at the end of the run", leftover)

    async def _steps(
        self, first_step: int, monitor: Any, producer: asyncio.Task, probe: EngineIdleProbe
    ) -> None:
        with monitor:
            step_started = time.monotonic()
            for step in range(first_step, self.config.num_steps):
                monitor.start_step(step)
                groups, staleness, waited_s = await self._wait_for_groups(producer, monitor)
                buffer_depth = self.buffer.depth
                train_started = time.monotonic()
                train_metrics = await self._train(step, groups)
                async with self.changed:  # a new version: groups in flight may be doomed, the line moved on
                    self.taken_for_step = 0
                    self.changed.notify_all()
                logger.debug(
                    "step %d: waited %.2f s for %d groups (staleness %s), trained and pushed in %.2f s",
                    step,
                    waited_s,
                    len(groups),
                    staleness,
                    time.monotonic() - train_started,
                )
                now = time.monotonic()
                committed, self.committed_since_step = self.committed_since_step, []
                extra = timing_metrics(
                    committed,
                    max_concurrency=self.rollout.max_concurrency,
                    wall_s=now - step_started,
                    train_s=now - train_started,
                    trained_tokens=float(train_metrics.get("train/num_tokens", 0.0)),
                )
                extra.update(staleness_histogram(staleness))
                extra.update(probe.take())
                extra.update(self.inputs.stalls.take())
                extra["staleness/groups_dropped"] = float(self.dropped_groups)
                if self.rollout.dynamic_sampling.enabled:
                    extra["dynamic_sampling/extra_groups"] = float(self.extra_groups)
                extra.update(
                    partial_group_metrics(
                        [g.trajectories for g in groups], num_replaced=self.replaced_short_groups
                    )
                )
                extra["pipeline/buffer_depth"] = float(buffer_depth)
                extra["pipeline/rollouts_in_flight"] = float(self.slots.running)
                extra["pipeline/trainer_wait_s"] = waited_s
                trajectories = [t for g in groups for t in g.trajectories]
                monitor.end_step(
                    step,
                    trajectories,
                    train_metrics=train_metrics,
                    rollout_wall_time_s=waited_s,
                    extra_metrics=extra,
                )
                # after the step's row: a kill in between re-runs (and re-logs) the step
                await self.stack.checkpoint_if_due(step)
                self.dropped_groups = 0
                self.extra_groups = 0
                self.replaced_short_groups = 0
                step_started = now

    async def _wait_for_groups(
        self, producer: asyncio.Task, monitor: Any
    ) -> tuple[list[Group], list[int], float]:
        """``_collect_step``, showing the producer's state meanwhile; a failed producer fails the run."""
        waiter = asyncio.create_task(self._collect_step())
        try:
            while not waiter.done():
                if producer.done() and producer.exception() is not None:
                    raise producer.exception()  # type: ignore[misc]
                monitor.pipeline_changed(in_flight=self.slots.running, buffered=self.buffer.depth)
                watched = {waiter} if producer.done() else {waiter, producer}
                await asyncio.wait(watched, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiter.done():
                waiter.cancel()
        return waiter.result()
