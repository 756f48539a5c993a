"""Where the rollout producer runs: in the driver (the default), or in a Ray actor that Ray places by its
resources (``rollout.placement actor``, ``rollout.actor_num_cpus``, ``rollout.actor_resources``) — on any node
of the cluster, e.g. one with sandbox capacity, apart from the trainer's GPUs.

The actor (``RolloutWorker``) holds the recipe's ``RolloutRunner``: the harness and its grader, the proxy's
session control and credentials, and its own sandbox provider (started on the actor's node). The driver keeps
what must stay in one place: the loop's rollout slots, the staleness gate and the store's single writer. Each
rollout is one actor call (``ActorRolloutRunner.run_group`` has ``RolloutRunner.run_group``'s contract), so a
member that finishes frees its driver-side slot at once and a doomed group's calls are cancelled in the actor.

The actor reaches the proxy over HTTP and its sessions through the session-shard actors, so it needs the
Ray Serve proxy (``proxy.kind serve``); the in-driver proxy (``local``) lives in the driver process only. (On a
real cluster Serve's HTTP address must be reachable from the actor's node.)
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from components.protocols import (
    GroupReward,
    Harness,
    Reward,
    SandboxProvider,
    SessionControl,
    Task,
)
from components.proxy.auth import SessionKeys
from components.remote_waits import PENDING_WAITS
from components.rewards.compose import RewardWeights
from components.rollout.runner import GroupRollouts, RolloutConfig, RolloutRunner
from components.trajectory import Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle

logger = logging.getLogger("rein.rollout.producer")

ResultT = TypeVar("ResultT")
ACTOR_CALL_MARGIN_S = 60.0  # beyond a call's own bounds: shipping it and its result


@dataclass(kw_only=True, frozen=True)
class RunnerParts:
    """What a ``RolloutRunner`` is built from, pickled as one object: a harness and its grader may share state
    (the toy games' grader reads what the harness recorded), so they must arrive as one graph."""

    config: RolloutConfig
    harness: Harness
    sandboxes: SandboxProvider
    sessions: SessionControl
    proxy_url: str
    grader: Reward
    session_keys: SessionKeys | None
    group_reward: GroupReward | None
    reward_weights: RewardWeights

    @classmethod
    def of(cls, runner: RolloutRunner) -> RunnerParts:
        return cls(
            config=runner.config,
            harness=runner.harness,
            sandboxes=runner.sandboxes,
            sessions=runner.sessions,
            proxy_url=runner.proxy_url,
            grader=runner.grader,
            session_keys=runner.session_keys,
            group_reward=runner.group_reward,
            reward_weights=runner.reward_weights,
        )

    def build(self) -> RolloutRunner:
        return RolloutRunner(
            self.config,
            harness=self.harness,
            sandboxes=self.sandboxes,
            sessions=self.sessions,
            proxy_url=self.proxy_url,
            grader=self.grader,
            session_keys=self.session_keys,
            group_reward=self.group_reward,
            reward_weights=self.reward_weights,
        )


class RolloutWorker:
    """The producer's Ray actor: one ``RolloutRunner`` over sandboxes started on the actor's own node."""

    def __init__(self, parts: RunnerParts) -> None:
        self.runner = parts.build()

    async def node_id(self) -> str:
        """The Ray node this actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def run_one(self, task: Task, group_id: str, step: int) -> Trajectory:
        return await self.runner.run_one(task, group_id=group_id, step=step)

    async def finish_group(self, task: Task, members: list[Trajectory]) -> list[Trajectory]:
        return await self.runner.finish_group(task, members)

    async def close(self) -> None:
        await self.runner.sandboxes.close()


class ActorRolloutRunner(GroupRollouts):
    """``RolloutRunner``'s ``run`` / ``run_group`` over a ``RolloutWorker`` actor (start it with ``start``):
    each rollout is one actor call.

    The actor is restarted by Ray when it or its node dies (``max_restarts``; on any node that offers its
    resources), from its parts pinned in the object store. A rollout in flight on the dead actor comes back as
    a ``sandbox_error`` trajectory naming the fault (its sandbox died with it), which the loop's partial-group
    rule replaces; the next rollouts run on the restarted actor."""

    def __init__(
        self,
        actor: ActorHandle[RolloutWorker],
        *,
        config: RolloutConfig,
        node_id: str,
        harness_name: str = "",
        parts: ObjectRef[RunnerParts] | None = None,
    ) -> None:
        self.actor = actor
        self.config = config
        self.node_id = node_id
        self.harness_name = harness_name
        self.parts = (
            parts  # the object ref the actor is built (and rebuilt) from, held while this runner lives
        )
        self._run_tag = uuid.uuid4().hex[:8]

    @classmethod
    async def start(
        cls,
        runner: RolloutRunner,
        *,
        num_cpus: float,
        resources: Mapping[str, float],
        start_timeout_s: float = 120.0,
    ) -> ActorRolloutRunner:
        """Move ``runner`` into a ``RolloutWorker`` actor with these Ray resources; fail clearly when no node
        can host it within ``start_timeout_s``."""
        import ray

        parts = ray.put(RunnerParts.of(runner))
        actor = (
            ray.remote(RolloutWorker)
            .options(num_cpus=num_cpus, resources=dict(resources), max_concurrency=1000, max_restarts=-1)
            .remote(parts)
        )
        try:
            node_id = await asyncio.wait_for(_await_ref(actor.node_id.remote()), start_timeout_s)
        except TimeoutError:
            ray.kill(actor)
            raise ValueError(
                f"rollout.actor_resources: no node could host the rollout producer actor within "
                f"{start_timeout_s:g} s (num_cpus {num_cpus:g}, resources {dict(resources)}); check the "
                "cluster's resources (ray status)"
            ) from None
        logger.info("rollout producer: actor on node %s (resources %s)", node_id, dict(resources))
        return cls(
            actor, config=runner.config, node_id=node_id, harness_name=runner.harness.name, parts=parts
        )

    async def run_one(self, task: Task, *, group_id: str, step: int) -> Trajectory:
        """One rollout in the actor; cancelling the waiter cancels it there."""
        from ray.exceptions import RayActorError

        config = self.config
        try:
            return await PENDING_WAITS.within(  # the rollout's own bounds, and a margin for the call itself
                _await_ref(self.actor.run_one.remote(task, group_id, step)),
                deadline_s=config.acquire_timeout_s
                + config.setup_timeout_s
                + config.harness_timeout_s
                + config.probe_timeout_s
                + config.release_timeout_s
                + ACTOR_CALL_MARGIN_S,
                component=f"rollout producer actor (started on node {self.node_id})",
                request=f"run_one({group_id})",
            )
        except RayActorError as error:
            reason = f"the rollout producer actor died during the rollout (Ray restarts it): {error}"
            logger.warning("group %s: %s", group_id, reason.splitlines()[0])
            return Trajectory(
                trajectory_id=uuid.uuid4().hex,
                group_id=group_id,
                task_id=task.task_id,
                harness=self.harness_name,
                status=TrajectoryStatus.SANDBOX_ERROR,
                failure_reason=reason,
                reward=None,
                step=step,
            )

    async def finish_group(self, task: Task, members: list[Trajectory]) -> list[Trajectory]:
        from ray.exceptions import RayActorError

        try:
            return await PENDING_WAITS.within(
                _await_ref(self.actor.finish_group.remote(task, members)),
                deadline_s=self.config.grading_timeout_s + ACTOR_CALL_MARGIN_S,
                component=f"rollout producer actor (started on node {self.node_id})",
                request=f"finish_group({task.task_id})",
            )
        except RayActorError as error:  # the group reward was not applied: no member may be trained
            reason = f"the rollout producer actor died while grading the group: {error}"
            return [
                replace(t, status=TrajectoryStatus.GRADING_ERROR, failure_reason=reason, reward=None)
                if t.trainable
                else t
                for t in members
            ]

    async def close(self) -> None:
        """Close the actor's sandboxes and end the actor."""
        import ray

        try:
            await asyncio.wait_for(_await_ref(self.actor.close.remote()), 60)
        except Exception as error:  # closing never hides the run's own outcome
            logger.warning("closing the rollout producer actor failed: %s", error)
        ray.kill(self.actor)


async def _await_ref(reference: ObjectRef[ResultT]) -> ResultT:
    """Await an actor call; cancelling the waiter cancels the call in the actor too."""
    import ray

    try:
        return await reference
    except asyncio.CancelledError:
        ray.cancel(reference)
        raise


def parse_resources(text: str) -> dict[str, float]:
    """``name=amount,...`` (e.g. ``rollout=1,sandbox_slots=8``) as Ray custom resources."""
    resources: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, separator, amount = item.partition("=")
        if not separator or not name.strip():
            raise ValueError(f"actor_resources: expected name=amount, got {item!r}")
        try:
            value = float(amount)
        except ValueError:
            raise ValueError(f"actor_resources: {name.strip()!r} needs a number, got {amount!r}") from None
        if value <= 0:
            raise ValueError(f"actor_resources: {name.strip()!r} must be > 0, got {value:g}")
        resources[name.strip()] = value
    return resources


__all__ = ["ActorRolloutRunner", "RolloutWorker", "RunnerParts", "parse_resources"]
