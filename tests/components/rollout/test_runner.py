"""The rollout runner classifies every way a rollout can end, never hangs, and keeps one rollout's failure
from touching the others. Real proxy (real HTTP), real bubblewrap pool, real grader; the harnesses and
graders that misbehave are small real implementations of the protocols."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from components.engine.scripted_policies import step_policy, tool_call
from components.errors import SandboxBackendDownError, SandboxError
from components.protocols import HarnessOutcome, RewardResult, Sandbox, SandboxSpec, Task
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TrajectoryStatus
from harnesses.swe_agent import SweAgentBrickConfig, SweAgentConfig, SweAgentHarness
from harnesses.wrap import AgentContext, agent_harness
from sandboxes.resilient import ResilientSandboxProvider, SandboxResilienceConfig
from tests.failing_bricks import FailingEngine
from tests.harnesses.harness_fixtures import running_proxy

pytestmark = pytest.mark.timeout(300)

OK_TASK, CRASH_TASK, KILL_TASK, BAD_GRADE_TASK = (
    "minilib-text-slugify-edges",
    "minilib-text-truncate-exact",
    "minilib-text-wrap-width",
    "minilib-text-camel-acronyms",
)


def _kill_sandbox_processes(sandbox: Sandbox) -> None:
    """SIGKILL every host process running as the sandbox's own uid (its supervisor and its commands)."""
    uid = sandbox.host_uid
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
        if uid_line and int(uid_line.split()[1]) == uid:
            try:
                os.kill(int(name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@agent_harness(name="mixed-agent")
async def mixed_agent(ctx: AgentContext) -> None:
    """Behaves by task: a normal short run, a crash, or a run whose sandbox is killed under it."""
    reply = await ctx.openai.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": ctx.task.problem_statement}], max_tokens=32
    )
    ctx.log(f"policy said: {reply.choices[0].message.content}")
    if ctx.task.task_id == CRASH_TASK:
        raise RuntimeError("the agent has a bug")
    if ctx.task.task_id == KILL_TASK:
        command = asyncio.create_task(ctx.sandbox.exec(["sleep", "30"], timeout_s=40))
        await asyncio.sleep(0.5)
        _kill_sandbox_processes(ctx.sandbox)
        await command  # raises SandboxError: the sandbox died
    result = await ctx.sandbox.exec(["bash", "-c", "echo checked > note.txt && cat note.txt"])
    ctx.metrics["note_written"] = float(result.stdout.strip() == "checked")


class GraderFailingFor:
    """The real grader, except that it raises for some tasks and reaches no verdict for others."""

    def __init__(self, inner, *, raise_for=(), no_verdict_for=(), hang_for=()) -> None:
        self.inner = inner
        self.raise_for, self.no_verdict_for, self.hang_for = (
            set(raise_for),
            set(no_verdict_for),
            set(hang_for),
        )

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        if task.task_id in self.raise_for:
            raise OSError("grading infrastructure broke")
        if task.task_id in self.no_verdict_for:
            return RewardResult(reward=None, error="test runner did not start")
        if task.task_id in self.hang_for:
            await asyncio.sleep(3600)
        return await self.inner.score(task, agent_sandbox)


def _runner(proxy, harness, sandboxes, grader, **config) -> RolloutRunner:
    return RolloutRunner(
        RolloutConfig(**{"group_size": 1, "max_concurrency": 4, **config}),
        harness=harness,
        sandboxes=sandboxes,
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=grader,
    )


@pytest.mark.slow
async def test_failures_in_one_batch_are_classified_and_isolated(
    scripted_proxy, builtin_tasks, sandbox_pool, swe_grader
):
    tasks = [builtin_tasks[i] for i in (OK_TASK, CRASH_TASK, KILL_TASK, BAD_GRADE_TASK)]
    grader = GraderFailingFor(swe_grader, raise_for=[BAD_GRADE_TASK])
    started = time.monotonic()
    async with scripted_proxy(["Let me try."]) as proxy:
        runner = _runner(proxy, mixed_agent, sandbox_pool, grader, group_size=2, max_concurrency=4)
        trajectories = await runner.run(tasks, step=5)
        assert proxy.registry.num_open_sessions == 0  # every session was finalized
    assert time.monotonic() - started < 120

    assert len(trajectories) == 8
    assert [t.task_id for t in trajectories] == [t.task_id for t in tasks for _ in range(2)]
    by_task = {}
    for trajectory in trajectories:
        by_task.setdefault(trajectory.task_id, []).append(trajectory)
        assert trajectory.step == 5 and trajectory.harness == "mixed-agent"
        assert trajectory.metrics["rollout_wall_time_s"] > 0
    # One group per task: same group id within a task, different across tasks.
    assert all(len({t.group_id for t in group}) == 1 for group in by_task.values())
    assert len({group[0].group_id for group in by_task.values()}) == 4

    expected = {
        OK_TASK: TrajectoryStatus.OK,
        CRASH_TASK: TrajectoryStatus.AGENT_ERROR,
        KILL_TASK: TrajectoryStatus.SANDBOX_ERROR,
        BAD_GRADE_TASK: TrajectoryStatus.GRADING_ERROR,
    }
    for task_id, status in expected.items():
        for trajectory in by_task[task_id]:
            assert trajectory.status == status, f"{task_id}: {trajectory.status} {trajectory.failure_reason}"
    for trajectory in by_task[OK_TASK]:
        assert trajectory.reward == 0.0 and trajectory.trainable  # graded for real: nothing was fixed
        assert trajectory.metrics["note_written"] == 1.0
        assert trajectory.segments and trajectory.segments[0].num_sampled_tokens > 0
    for trajectory in by_task[CRASH_TASK]:
        assert "the agent has a bug" in trajectory.failure_reason
        assert "Traceback" in trajectory.log and not trajectory.trainable
        assert trajectory.segments  # the policy call before the crash is still on record
    for trajectory in by_task[KILL_TASK]:
        assert "sandbox" in trajectory.failure_reason and trajectory.reward is None
    for trajectory in by_task[BAD_GRADE_TASK]:
        assert "grading infrastructure broke" in trajectory.failure_reason and trajectory.reward is None
        assert not trajectory.trainable


async def test_harness_reporting_ok_over_a_dead_sandbox_is_a_sandbox_error(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader
):
    @agent_harness(name="oblivious")
    async def oblivious(ctx: AgentContext) -> None:
        _kill_sandbox_processes(ctx.sandbox)  # dies behind the agent's back; the agent never notices

    async with scripted_proxy(["hi"]) as proxy:
        [trajectory] = await _runner(proxy, oblivious, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.SANDBOX_ERROR
    assert "died" in trajectory.failure_reason


async def test_grader_without_verdict_and_hanging_grader(
    scripted_proxy, builtin_tasks, sandbox_pool, swe_grader
):
    @agent_harness(name="idle")
    async def idle(ctx: AgentContext) -> None:
        return None

    tasks = [builtin_tasks[OK_TASK], builtin_tasks[CRASH_TASK]]
    grader = GraderFailingFor(swe_grader, no_verdict_for=[OK_TASK], hang_for=[CRASH_TASK])
    async with scripted_proxy(["hi"]) as proxy:
        trajectories = await _runner(proxy, idle, sandbox_pool, grader, grading_timeout_s=2).run(
            tasks, step=1
        )
    assert [t.status for t in trajectories] == [TrajectoryStatus.GRADING_ERROR] * 2
    assert "test runner did not start" in trajectories[0].failure_reason
    assert "grading took over 2 s" in trajectories[1].failure_reason


async def test_harness_that_never_returns_is_cut_off(scripted_proxy, slugify_task, sandbox_pool, swe_grader):
    class StuckHarness:
        name = "stuck"

        async def run(self, *, task, sandbox, base_url, api_key) -> HarnessOutcome:
            await asyncio.sleep(3600)

    async with scripted_proxy(["hi"]) as proxy:
        runner = _runner(proxy, StuckHarness(), sandbox_pool, swe_grader, harness_timeout_s=1)
        [trajectory] = await runner.run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.TIMEOUT
    assert trajectory.reward == 0.0  # a timeout is the policy's outcome: graded and kept


async def test_engine_failure_is_an_engine_error(tokenizer, slugify_task, sandbox_pool, swe_grader):
    harness = SweAgentHarness(SweAgentConfig(max_turns=3, settings=SweAgentBrickConfig(max_retries=0)))
    async with running_proxy(FailingEngine(), tokenizer) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.ENGINE_ERROR, trajectory.failure_reason
    assert trajectory.reward is None and not trajectory.trainable


async def test_context_overflow_is_kept_and_graded(scripted_proxy, slugify_task, sandbox_pool, swe_grader):
    # The file view makes the conversation outgrow a small context window on the next call.
    policy = step_policy([tool_call("view_file", path="minilib/text.py"), tool_call("submit")])
    harness = SweAgentHarness(SweAgentConfig(max_turns=5, max_tokens=64))
    async with scripted_proxy(policy, context_window=1200) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.CONTEXT_OVERFLOW, trajectory.failure_reason
    assert trajectory.reward == 0.0 and trajectory.trainable
    assert trajectory.segments and trajectory.segments[0].num_sampled_tokens > 0


async def test_sandbox_that_cannot_be_acquired(scripted_proxy, slugify_task, swe_grader):
    class NoSandboxes:
        async def acquire(self, spec: SandboxSpec) -> Sandbox:
            raise SandboxError("no capacity left")

        async def release(self, sandbox: Sandbox) -> None:
            raise AssertionError("nothing was acquired")

    async with scripted_proxy(["hi"]) as proxy:
        trajectories = await _runner(proxy, mixed_agent, NoSandboxes(), swe_grader, group_size=3).run(
            [slugify_task], step=2
        )
        assert proxy.registry.num_open_sessions == 0
    assert Counter(t.status for t in trajectories) == {TrajectoryStatus.SANDBOX_ERROR: 3}
    assert all("no capacity left" in t.failure_reason and t.step == 2 for t in trajectories)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="group_size"):
        RolloutConfig(group_size=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        RolloutConfig(max_concurrency=0)


async def test_a_backend_that_stays_down_stops_the_step_instead_of_every_rollout(
    scripted_proxy, slugify_task, swe_grader
):
    """With the breaker (``sandboxes.resilient``) the step raises one clear error after ``breaker_threshold``
    failed acquires; the weakened variant (no breaker) tries the dead backend for every rollout."""

    class DeadBackend:
        num_acquires = 0

        async def acquire(self, spec: SandboxSpec) -> Sandbox:
            DeadBackend.num_acquires += 1
            raise SandboxError("backend unreachable")

        async def release(self, sandbox: Sandbox) -> None:
            raise AssertionError("nothing was acquired")

        async def close(self) -> None:
            pass

    quick = {"max_attempts": 2, "backoff_initial_s": 0.0, "backoff_max_s": 0.0, "breaker_cooldown_s": 600.0}
    async with scripted_proxy(["hi"]) as proxy:
        weakened = ResilientSandboxProvider(
            DeadBackend(), SandboxResilienceConfig(breaker_threshold=0, **quick)
        )
        trajectories = await _runner(
            proxy, mixed_agent, weakened, swe_grader, group_size=6, max_concurrency=1
        ).run([slugify_task], step=0)
        assert Counter(t.status for t in trajectories) == {TrajectoryStatus.SANDBOX_ERROR: 6}
        assert DeadBackend.num_acquires == 12  # every rollout burned its tries on the dead backend

        DeadBackend.num_acquires = 0
        guarded = ResilientSandboxProvider(
            DeadBackend(), SandboxResilienceConfig(breaker_threshold=2, **quick)
        )
        with pytest.raises(SandboxBackendDownError, match="backend unreachable"):
            await _runner(proxy, mixed_agent, guarded, swe_grader, group_size=6, max_concurrency=1).run(
                [slugify_task], step=0
            )
        assert DeadBackend.num_acquires == 4  # two acquires of two tries, then the breaker refused
        assert proxy.registry.num_open_sessions == 0
