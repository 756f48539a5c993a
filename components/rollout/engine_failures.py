"""Rollouts an inference server's death took (``engine_error``: the request in flight failed) are replaced, not
trained: the group that lost one is rolled out again with the same task under a new group id, once the fleet has
a live server again (``components/engine/server_fleet.py`` waits for it and re-pushes the run's weights). The
failed group stays in the step's shard with its reasons; its failed members are not trainable."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from components.protocols import Task
from components.rollout.dynamic_sampling import split_groups
from components.trajectory import Trajectory, TrajectoryStatus

logger = logging.getLogger(__name__)
WATCH_GRACE_S = 5.0  # > the fleet's health poll: a server that died is known to be down before the wait

RollOut = Callable[[Sequence[Task], int], Awaitable[list[Trajectory]]]


@runtime_checkable
class AwaitsLiveServer(Protocol):
    """An engine over servers that can die and come back (``ServerFleet``)."""

    async def await_live_server(self) -> None:
        """Return once a server is live with the run's weights; ``EngineError`` naming them after a bound."""
        ...


def lost_to_the_engine(group: Sequence[Trajectory]) -> bool:
    return any(t.status == TrajectoryStatus.ENGINE_ERROR for t in group)


async def replace_engine_failures(
    roll_out: RollOut,
    trajectories: Sequence[Trajectory],
    tasks: Mapping[str, Task],
    *,
    first_index: int,
    max_rounds: int,
    engine: object = None,
) -> list[Trajectory]:
    """The replacement rollouts (``roll_out(tasks, first_index)``) of every group of ``trajectories`` that lost a
    member to the engine, in rounds until none did or ``max_rounds`` rounds ran; each round first waits for
    ``engine`` to have a live server (when it is ``AwaitsLiveServer``: the run fails there, naming the
    servers, when none comes back in time)."""
    replacements: list[Trajectory] = []
    failed = [group for group in split_groups(trajectories) if lost_to_the_engine(group)]
    for round_ in range(max_rounds):
        batch = [tasks[group[0].task_id] for group in failed if group[0].task_id in tasks]
        if not batch:
            break
        logger.warning(
            "%d group(s) lost rollouts to the engine (%s): rolling them out again (round %d)",
            len(batch),
            next(t.failure_reason for t in failed[0] if t.status == TrajectoryStatus.ENGINE_ERROR),
            round_ + 1,
        )
        if isinstance(engine, AwaitsLiveServer):
            await asyncio.sleep(WATCH_GRACE_S)  # let the fleet's watch see the server that failed
            await engine.await_live_server()
        rolled = await roll_out(batch, first_index)
        first_index += len(batch)
        replacements += rolled
        failed = [group for group in split_groups(rolled) if lost_to_the_engine(group)]
    return replacements
