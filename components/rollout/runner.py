"""The rollout runner: for every task × group sample, acquire a sandbox → open a proxy session → run the
harness → grade → finalize the trajectory → release the sandbox, many rollouts at once.

Every way a rollout can end is classified, never raised: a harness crash is ``agent_error``, running out of
turns or time ``turn_limit`` / ``timeout``, a dead sandbox ``sandbox_error``, a prompt over the context window
(the proxy marks the session) ``context_overflow``, a failing engine or proxy ``engine_error``, a grader that
cannot reach a verdict ``grading_error``. Infrastructure failures carry no reward and are not trainable;
``turn_limit``, ``timeout`` and ``context_overflow`` runs are graded and kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TypeVar

from components.config import require_positive
from components.errors import SandboxBackendDownError, grading_failure_reason
from components.protocols import (
    CallBoundedHarness,
    GroupReward,
    Harness,
    HarnessOutcome,
    Reward,
    Sandbox,
    SandboxAwareHarness,
    SandboxProvider,
    SessionControl,
    SessionOpen,
    SessionOutcome,
    Task,
    TaskWithSetup,
)
from components.proxy.auth import SessionKeys
from components.proxy.errors import InvalidRequestError
from components.proxy.sessions import validate_policy_name
from components.rewards.compose import RewardWeights, apply_group_reward
from components.rollout.failures import classify_exception
from components.rollout.log_text import clip_text
from components.trajectory import (
    INFRASTRUCTURE_STATUSES,
    TRAINABLE_STATUSES,
    Trajectory,
    TrajectoryStatus,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

OPEN_PROXY_API_KEY = "rein"  # what harnesses send to a proxy without per-session tokens (any key is accepted)


@dataclass(kw_only=True, frozen=True)
class RolloutConfig:
    """How many rollouts, how many at once, and the hard bounds that keep one rollout from hanging."""

    group_size: int = 4  # samples per task per step (one GRPO group)
    max_concurrency: int = (
        8  # rollouts in flight at once (each holds one agent sandbox, plus one while grading)
    )
    acquire_timeout_s: float = 120.0  # waiting for a sandbox
    setup_timeout_s: float = 300.0  # the task's set-up commands in the fresh sandbox
    # Hard bound on one harness run; harnesses end themselves earlier (their own turn / time bounds).
    harness_timeout_s: float = 1800.0
    grading_timeout_s: float = 600.0
    probe_timeout_s: float = 15.0  # the liveness check of the sandbox after the harness ran
    release_timeout_s: float = 60.0
    max_log_chars: int = 200_000  # harness + grading log kept per trajectory
    # Multi-LoRA: the named policy every session of this runner is bound to (the proxy's ``policies``, e.g.
    # ``EmbeddedEngine.policy(name)``); "": the proxy's default engine (a run with a single policy)
    policy: str = ""

    def __post_init__(self) -> None:
        if self.policy:
            validate_policy_name(self.policy)
        for name in (
            "group_size",
            "max_concurrency",
            "acquire_timeout_s",
            "setup_timeout_s",
            "harness_timeout_s",
            "grading_timeout_s",
            "probe_timeout_s",
            "release_timeout_s",
            "max_log_chars",
        ):
            require_positive(getattr(self, name), name)


class _Rollout:
    """The evolving verdict of one rollout."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.status = TrajectoryStatus.OK
        self.failure_reason = ""
        self.reward: float | None = None
        self.metrics: dict[str, float] = {}
        self.logs: list[str] = []
        self.open_session_id: str | None = None  # set while the proxy holds an unfinalized session
        self.turn_rewards: tuple[float, ...] = ()  # per model call (harness or grader), for turn-level credit

    def fail(self, status: TrajectoryStatus, reason: str) -> None:
        self.status = status
        self.failure_reason = reason or status.value


async def gather_or_cancel(coroutines: Iterable[Awaitable[T]]) -> list[T]:
    """``asyncio.gather``, except that one raising (rollouts never raise, but a step can stop: a backend that is
    down) cancels and awaits the rest, so nothing keeps running after the step has failed."""
    jobs = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*jobs))
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise


class GroupRollouts:
    """Groups and steps of rollouts over two primitives a subclass provides: ``run_one`` (one rollout, never
    raises) and ``finish_group`` (the group reward over a complete group). ``RolloutRunner`` runs them in this
    process; ``ActorRolloutRunner`` (``components/rollout/producer.py``) in a Ray actor."""

    config: RolloutConfig
    _run_tag: str

    async def run_one(self, task: Task, *, group_id: str, step: int) -> Trajectory:
        raise NotImplementedError

    async def finish_group(self, task: Task, members: list[Trajectory]) -> list[Trajectory]:
        raise NotImplementedError

    async def run(self, tasks: Sequence[Task], step: int, *, first_index: int = 0) -> list[Trajectory]:
        """Roll out every task ``group_size`` times (concurrently, bounded by ``max_concurrency``); one
        trajectory per rollout, in task order then sample order. A single rollout's failure never raises.
        Group ids number the tasks from ``first_index`` (more groups for the same step get new ids)."""
        slots = asyncio.Semaphore(self.config.max_concurrency)
        groups = [
            self.run_group(
                task,
                group_id=f"{self._run_tag}-s{step}-t{first_index + task_index}-{task.task_id}",
                step=step,
                slots=slots,
            )
            for task_index, task in enumerate(tasks)
        ]
        return [trajectory for members in await gather_or_cancel(groups) for trajectory in members]

    async def run_group(
        self,
        task: Task,
        *,
        group_id: str,
        step: int,
        slots: AbstractAsyncContextManager[object] | None = None,
        on_member: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """One GRPO group: ``task`` rolled out ``group_size`` times, each rollout inside ``async with slots``
        (shared by the caller's groups, so a member that finished frees its slot for another group's rollout
        at once; default: ``max_concurrency`` slots of its own), then the group reward over the whole group.
        ``on_member`` sees each member as it finishes (the caller may cancel a group it can no longer use:
        cancelling cancels its rollouts)."""
        slots = slots if slots is not None else asyncio.Semaphore(self.config.max_concurrency)

        async def member() -> Trajectory:
            async with slots:  # told before the slot is freed (a slot's release wakes the caller)
                trajectory = await self.run_one(task, group_id=group_id, step=step)
                if on_member is not None:
                    on_member(trajectory)
            return trajectory

        members = await gather_or_cancel(member() for _ in range(self.config.group_size))
        return await self.finish_group(task, list(members))


class RolloutRunner(GroupRollouts):
    """Runs one harness over tasks × ``group_size`` and returns finalized trajectories."""

    def __init__(
        self,
        config: RolloutConfig,
        *,
        harness: Harness,
        sandboxes: SandboxProvider,
        sessions: SessionControl,
        proxy_url: str,
        grader: Reward,
        session_keys: SessionKeys | None = None,
        group_reward: GroupReward | None = None,
        reward_weights: RewardWeights | None = None,
    ) -> None:
        """``session_keys``: the proxy's credentials (``ProxyConfig.session_keys``) when it runs isolated; each
        harness then gets its own session's capability token as its API key, never the admin key. None: the
        proxy runs shared-key or with ``insecure_open_control_plane`` and harnesses get a placeholder key (a
        default proxy refuses it). ``group_reward`` (e.g. a relative
        judge) scores each complete group after its rollouts, combined with the grader's reward by
        ``reward_weights``."""
        self.config = config
        self.harness = harness
        self.sandboxes = sandboxes
        self.sessions = sessions
        self.proxy_url = proxy_url.rstrip("/")
        self.grader = grader
        self.session_keys = session_keys
        self.group_reward = group_reward
        self.reward_weights = reward_weights or RewardWeights()
        self._run_tag = uuid.uuid4().hex[:8]

    def session_url(self, session_id: str) -> str:
        """The base URL a harness uses for one session."""
        return f"{self.proxy_url}/s/{session_id}"

    def session_api_key(self, session_id: str) -> str:
        """The only credential a harness (and so the agent in its sandbox) gets for one session."""
        if self.session_keys is None:
            return OPEN_PROXY_API_KEY
        return self.session_keys.session_token(session_id)

    async def run_one(self, task: Task, *, group_id: str, step: int) -> Trajectory:
        """One rollout of ``task`` (no slot of its own: the caller bounds concurrency); never raises."""
        return await self._rollout_never_raises(task, group_id=group_id, step=step)

    async def finish_group(self, task: Task, members: list[Trajectory]) -> list[Trajectory]:
        """A complete group's members with the group reward applied (unchanged without one)."""
        return await self._apply_group_reward(task, members)

    async def _apply_group_reward(self, task: Task, members: list[Trajectory]) -> list[Trajectory]:
        """The group reward (if any) over a complete group; its failure is the group's ``grading_error``."""
        if self.group_reward is None:
            return members
        try:
            return await asyncio.wait_for(
                apply_group_reward(task, members, self.group_reward, self.reward_weights),
                self.config.grading_timeout_s,
            )
        except Exception as exc:
            logger.warning("group reward of %s failed: %s", task.task_id, exc)
            reason = f"group reward failed: {type(exc).__name__}: {exc}"
            return [
                dataclasses.replace(
                    t, status=TrajectoryStatus.GRADING_ERROR, failure_reason=reason, reward=None
                )
                if t.trainable
                else t
                for t in members
            ]

    async def _rollout_never_raises(self, task: Task, *, group_id: str, step: int) -> Trajectory:
        rollout = _Rollout()
        try:
            return await self._rollout(task, rollout, group_id=group_id, step=step)
        except (
            asyncio.CancelledError,
            SandboxBackendDownError,
        ):  # the caller gave up, or the backend is down
            if rollout.open_session_id is not None:
                with contextlib.suppress(Exception):
                    await self.sessions.discard(rollout.open_session_id)
            raise
        except Exception as exc:  # a bug of ours or a provider's: still one classified, untrainable record
            logger.exception("rollout of %s failed unexpectedly", task.task_id)
            status, reason = classify_exception(exc)
            if status in TRAINABLE_STATUSES:
                status = TrajectoryStatus.AGENT_ERROR
            rollout.fail(status, f"rollout failed: {reason}")
            if rollout.open_session_id is not None:
                try:
                    await self.sessions.discard(rollout.open_session_id)
                except Exception:
                    pass
            return self._local_trajectory(task, rollout, group_id=group_id, step=step)

    async def _rollout(self, task: Task, rollout: _Rollout, *, group_id: str, step: int) -> Trajectory:
        try:
            spec = task.sandbox_spec()
            if isinstance(self.harness, SandboxAwareHarness):
                spec = self.harness.adapt_sandbox_spec(spec, proxy_url=self.proxy_url)
            sandbox = await asyncio.wait_for(self.sandboxes.acquire(spec), self.config.acquire_timeout_s)
        except SandboxBackendDownError:
            raise  # the backend is down: the step stops (``sandboxes.resilient``), no record per rollout
        except Exception as exc:
            rollout.fail(
                TrajectoryStatus.SANDBOX_ERROR, f"could not get a sandbox: {type(exc).__name__}: {exc}"
            )
            return self._local_trajectory(task, rollout, group_id=group_id, step=step)
        rollout.metrics["sandbox_acquire_s"] = time.monotonic() - rollout.started
        try:
            if isinstance(task, TaskWithSetup):
                try:
                    await asyncio.wait_for(task.run_setup(sandbox), self.config.setup_timeout_s)
                except Exception as exc:
                    rollout.fail(
                        TrajectoryStatus.SANDBOX_ERROR, f"task set-up failed: {type(exc).__name__}: {exc}"
                    )
                    return self._local_trajectory(task, rollout, group_id=group_id, step=step)
            try:
                session_id = await self.sessions.open_session(
                    SessionOpen(
                        task_id=task.task_id,
                        group_id=group_id,
                        harness=self.harness.name,
                        step=step,
                        policy=self.config.policy,
                        max_calls=(
                            self.harness.max_policy_calls
                            if isinstance(self.harness, CallBoundedHarness)
                            else 0
                        ),
                    )
                )
            except Exception as exc:
                rollout.fail(TrajectoryStatus.ENGINE_ERROR, f"could not open a proxy session: {exc}")
                return self._local_trajectory(task, rollout, group_id=group_id, step=step)
            rollout.open_session_id = session_id
            await self._run_harness(task, sandbox, session_id, rollout)
            await self._check_sandbox(sandbox, rollout)
            await self._apply_session_marks(session_id, rollout)
            if rollout.status in TRAINABLE_STATUSES:
                await self._grade(task, sandbox, rollout)
            return await self._finalize(task, session_id, rollout, group_id=group_id, step=step)
        finally:
            try:
                await asyncio.wait_for(self.sandboxes.release(sandbox), self.config.release_timeout_s)
            except Exception:
                logger.warning(
                    "releasing sandbox %s failed", getattr(sandbox, "sandbox_id", "?"), exc_info=True
                )

    async def _run_harness(self, task: Task, sandbox: Sandbox, session_id: str, rollout: _Rollout) -> None:
        started = time.monotonic()
        try:
            outcome = await asyncio.wait_for(
                self.harness.run(
                    task=task,
                    sandbox=sandbox,
                    base_url=self.session_url(session_id),
                    api_key=self.session_api_key(session_id),
                ),
                self.config.harness_timeout_s,
            )
        except TimeoutError:
            outcome = HarnessOutcome(
                status=TrajectoryStatus.TIMEOUT.value,
                failure_reason=f"harness did not return within the runner's {self.config.harness_timeout_s:g} s",
            )
        except Exception as exc:  # the harness broke its contract (it should report, not raise)
            status, reason = classify_exception(exc)
            outcome = HarnessOutcome(
                status=status.value, failure_reason=reason, log=f"{type(exc).__name__}: {exc}"
            )
        rollout.metrics.update({k: float(v) for k, v in outcome.metrics.items()})
        rollout.turn_rewards = tuple(outcome.turn_rewards)
        rollout.metrics["harness_wall_time_s"] = time.monotonic() - started
        if outcome.log:
            rollout.logs.append(f"=== harness {self.harness.name}\n{outcome.log}")
        try:
            status = TrajectoryStatus(outcome.status)
        except ValueError:
            rollout.fail(
                TrajectoryStatus.AGENT_ERROR, f"harness returned an unknown status {outcome.status!r}"
            )
            return
        if status != TrajectoryStatus.OK:
            rollout.fail(status, outcome.failure_reason)

    async def _check_sandbox(self, sandbox: Sandbox, rollout: _Rollout) -> None:
        """A sandbox that died under the harness makes the rollout an infrastructure failure, whatever the
        harness concluded from its dying commands."""
        if rollout.status in INFRASTRUCTURE_STATUSES:
            return
        try:
            probe = await asyncio.wait_for(
                sandbox.exec(["true"], timeout_s=self.config.probe_timeout_s), self.config.probe_timeout_s + 5
            )
            alive = probe.exit_code == 0
            detail = f"liveness probe exited {probe.exit_code}"
        except Exception as exc:
            alive, detail = False, f"{type(exc).__name__}: {exc}"
        if not alive:
            rollout.fail(TrajectoryStatus.SANDBOX_ERROR, f"sandbox died during the rollout ({detail})")

    async def _apply_session_marks(self, session_id: str, rollout: _Rollout) -> None:
        """The proxy knows what the harness may have mistaken for its own crash: a prompt over the context
        window, or engine failures."""
        try:
            described = await self.sessions.describe(session_id)
        except Exception as exc:
            logger.warning("describing session %s failed: %s", session_id, exc)
            return
        rollout.metrics["num_policy_calls"] = float(described.num_turns)
        overflowed = described.status == TrajectoryStatus.CONTEXT_OVERFLOW.value
        if overflowed and rollout.status in (
            TrajectoryStatus.OK,
            TrajectoryStatus.AGENT_ERROR,
            TrajectoryStatus.ENGINE_ERROR,
        ):
            rollout.fail(TrajectoryStatus.CONTEXT_OVERFLOW, "the conversation outgrew the context window")
        elif described.num_engine_errors and rollout.status not in INFRASTRUCTURE_STATUSES:
            # A black-box agent only sees an HTTP 5xx and goes on (retries, changes course) or exits in its own
            # way; the proxy saw the cause. Either way the conversation is no clean sample of the policy.
            rollout.fail(
                TrajectoryStatus.ENGINE_ERROR,
                f"engine failed {described.num_engine_errors} time(s) "
                f"(last: {described.last_engine_error}); the agent then ended with "
                f"{rollout.status.value}: {rollout.failure_reason or 'ok'}",
            )
        elif (
            described.status == TrajectoryStatus.TURN_LIMIT.value
            and rollout.status
            in (
                TrajectoryStatus.OK,
                TrajectoryStatus.AGENT_ERROR,
            )
        ):  # the agent had no turn bound of its own: the proxy refused its call past the bound, and it stopped
            rollout.fail(
                TrajectoryStatus.TURN_LIMIT,
                f"the proxy refused a model call past the session's bound of {described.num_turns} calls; the "
                f"agent then ended with {rollout.status.value}: {rollout.failure_reason or 'ok'}",
            )

    async def _grade(self, task: Task, sandbox: Sandbox, rollout: _Rollout) -> None:
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(self.grader.score(task, sandbox), self.config.grading_timeout_s)
        except TimeoutError:
            rollout.fail(
                TrajectoryStatus.GRADING_ERROR, f"grading took over {self.config.grading_timeout_s:g} s"
            )
            return
        except Exception as exc:
            rollout.fail(TrajectoryStatus.GRADING_ERROR, f"grader raised {type(exc).__name__}: {exc}")
            return
        finally:
            rollout.metrics["grading_wall_time_s"] = time.monotonic() - started
        if result.log:
            rollout.logs.append(f"=== grading\n{result.log}")
        if result.reward is None:
            rollout.fail(
                TrajectoryStatus.GRADING_ERROR, grading_failure_reason(result.error_kind, result.error)
            )
            return
        rollout.reward = float(result.reward)
        rollout.turn_rewards = tuple(result.turn_rewards) or rollout.turn_rewards

    def _final_metrics(self, rollout: _Rollout) -> dict[str, float]:
        return {**rollout.metrics, "rollout_wall_time_s": time.monotonic() - rollout.started}

    def _final_log(self, rollout: _Rollout) -> str:
        return clip_text("\n".join(rollout.logs), self.config.max_log_chars)

    async def _finalize(
        self, task: Task, session_id: str, rollout: _Rollout, *, group_id: str, step: int
    ) -> Trajectory:
        rollout.open_session_id = None  # finalize closes it, or the fallback below discards it
        outcome = SessionOutcome(
            reward=rollout.reward,
            status=rollout.status.value,
            failure_reason=rollout.failure_reason,
            metrics=self._final_metrics(rollout),
            task_id=task.task_id,
            group_id=group_id,
            harness=self.harness.name,
            step=step,
            log=self._final_log(rollout),
            # only a trainable rollout's: a failed one may have lost calls its harness counted
            turn_rewards=(
                tuple(rollout.turn_rewards)
                if rollout.turn_rewards and rollout.status in TRAINABLE_STATUSES
                else None
            ),
        )
        try:
            try:
                return await self.sessions.finalize(session_id, outcome)
            except InvalidRequestError as refused:
                # What the harness or grader reported does not fit the session (e.g. turn rewards for another
                # number of model calls): their contract broken, not the infrastructure's. The session's
                # tokens are kept, as an agent error (never trained, never replaced as an infrastructure loss).
                rollout.reward = None
                rollout.fail(
                    TrajectoryStatus.AGENT_ERROR, f"the session refused the rollout's outcome: {refused}"
                )
                logger.warning("session %s refused the outcome: %s", session_id, refused)
                outcome = dataclasses.replace(
                    outcome,
                    reward=None,
                    status=rollout.status.value,
                    failure_reason=rollout.failure_reason,
                    turn_rewards=None,
                )
                return await self.sessions.finalize(session_id, outcome)
        except Exception as exc:
            logger.warning("finalizing session %s failed: %s", session_id, exc)
            try:
                await self.sessions.discard(session_id)
            except Exception:
                pass
            rollout.reward = None
            rollout.fail(TrajectoryStatus.ENGINE_ERROR, f"could not finalize the proxy session: {exc}")
            return self._local_trajectory(task, rollout, group_id=group_id, step=step)

    def _local_trajectory(self, task: Task, rollout: _Rollout, *, group_id: str, step: int) -> Trajectory:
        """A record of a rollout the proxy holds nothing for (failed before or after its session)."""
        return Trajectory(
            trajectory_id=uuid.uuid4().hex,
            group_id=group_id,
            task_id=task.task_id,
            harness=self.harness.name,
            status=rollout.status,
            failure_reason=rollout.failure_reason or rollout.status.value,
            reward=None,
            step=step,
            metrics=self._final_metrics(rollout),
            log=self._final_log(rollout),
        )
