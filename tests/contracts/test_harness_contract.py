"""The ``Harness`` contract (``components.protocols.Harness``), checked on any harness brick — what the rollout
runner relies on:

- the harness talks to the policy through ``base_url`` with ``api_key`` only: the suite's proxy runs isolated
  (an admin key), so only the session's own capability token opens the session, and the session must have
  recorded the harness's model calls;
- it returns a ``HarnessOutcome`` whose ``status`` is a ``TrajectoryStatus``, within its own bounds (the suite
  gives it ``BOUND_S``);
- failures are reported, never raised: a failing engine (HTTP 5xx), an unreachable proxy and a sandbox that
  died each end in an outcome whose status is not ``ok``.

Built-in: the white-box SWE agent (on a minilib task), the toy-game agent (on a tic-tac-toe game), a wrapped
Python agent (``harnesses.wrap``), and all seven black-box agents in their sandboxes, every check on each: Claude
Code, Codex, Gemini CLI, mini-swe-agent, opencode, Qwen Code and OpenClaw, each built with its own retry setting
at its minimum (their clients retry a failing engine with back-off otherwise); the two whose retries no setting
bounds (opencode; Qwen Code's stream retry) get a short wall time in the failure checks, ``RETRYING_WALL_TIME_S``.
A user's harness gets a small question task in an empty workspace.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from components.engine.scripted import ScriptedEngine
from components.errors import SandboxError
from components.protocols import (
    Harness,
    HarnessOutcome,
    SandboxAwareHarness,
    SandboxSpec,
    SessionDescription,
    SessionOpen,
    Task,
)
from components.trajectory import TrajectoryStatus
from tests.contracts.conftest import brick_params
from tests.failing_bricks import DeadSandbox, FailingEngine
from tests.harnesses.harness_fixtures import builtin_tasks, running_proxy  # noqa: F401 (a fixture)
from tests.required_tools import require_tool

pytestmark = pytest.mark.timeout(300)

BOUND_S = 120.0
# The wall time of an agent whose retries of a failing engine no setting bounds, in the failure checks: long
# enough to start under load and make its first call (the failing-engine check needs it), short of its back-off.
RETRYING_WALL_TIME_S = 20.0
ADMIN_KEY = "contract-suite-admin-key"
REPLY = "I looked at the problem and I am not sure what to do."


@dataclass(frozen=True)
class QuestionTask:
    """The task a user's harness gets: a question, an empty workspace."""

    task_id: str = "question-1"
    problem_statement: str = "What is 19 + 23? Write the number into answer.txt."

    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec()


@dataclass(frozen=True)
class BuiltInHarness:
    """A built-in harness and the kind of task it is made for (``failing``: the harness the failure checks run,
    when it differs)."""

    harness: Harness
    make_task: Callable[[pytest.FixtureRequest], Task]
    failing: Harness | None = None


def _minilib_task(request) -> Task:
    return next(iter(request.getfixturevalue("builtin_tasks").values()))


def _tictactoe_task(request) -> Task:
    from components.tasks.toys import TicTacToeEnv
    from harnesses.toy_agent import ToyGameTask

    return ToyGameTask(task_id="tictactoe-0", make_env=TicTacToeEnv, seed=0)


def _swe_agent() -> BuiltInHarness:
    from harnesses.swe_agent import SweAgentConfig, SweAgentHarness

    return BuiltInHarness(SweAgentHarness(SweAgentConfig(max_turns=2, wall_time_s=60)), _minilib_task)


def _toy_agent() -> BuiltInHarness:
    from harnesses.toy_agent import ToyAgentConfig, ToyAgentHarness

    return BuiltInHarness(ToyAgentHarness(ToyAgentConfig(max_turns=2, wall_time_s=60)), _tictactoe_task)


def _wrapped_agent() -> BuiltInHarness:
    from harnesses.wrap import AgentContext, agent_harness

    async def ask_then_run(ctx: AgentContext) -> None:
        reply = await ctx.openai.chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": ctx.task.problem_statement}]
        )
        await ctx.sandbox.write_file("reply.txt", reply.choices[0].message.content or "")

    return BuiltInHarness(agent_harness(ask_then_run, name="wrapped"), lambda request: QuestionTask())


def _declared_agent(
    module: str, make_agent: str, *, retries_unbounded: bool = False, **options
) -> Callable[[], BuiltInHarness]:
    """A declared black-box agent (``harnesses/agent_spec.py``: ``module.make_agent(**options)``, its retry
    setting among the options) on a minilib task, bounds kept small; ``retries_unbounded``: no setting bounds
    its retries, so the failure checks run it for ``RETRYING_WALL_TIME_S``."""

    def make() -> BuiltInHarness:
        import importlib

        from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness

        agent = getattr(importlib.import_module(module), make_agent)(**options)
        for program in (word for word in agent.argv[:2] if isinstance(word, str) and word.startswith("/")):
            require_tool(program, "run `make setup-test` (npm install of the agents)")  # Node and its entry
        config = BlackBoxConfig(max_turns=2, wall_time_s=100, max_output_tokens=32)
        failing = (
            BlackBoxHarness(agent, dataclasses.replace(config, wall_time_s=RETRYING_WALL_TIME_S))
            if retries_unbounded
            else None
        )
        return BuiltInHarness(BlackBoxHarness(agent, config), _minilib_task, failing)

    return make


BUILT_INS = {
    "swe-agent": _swe_agent,
    "toy-agent": _toy_agent,
    "wrapped-function": _wrapped_agent,
    "mini-swe-agent-blackbox": _declared_agent("harnesses.mini_swe_agent", "MiniSweAgent", max_attempts=1),
    "claude-code-blackbox": _declared_agent("harnesses.claude_code", "ClaudeCodeAgent", bare=True),
    "codex-blackbox": _declared_agent("harnesses.codex", "CodexAgent"),
    "gemini-cli-blackbox": _declared_agent("harnesses.gemini_cli", "GeminiCliAgent", max_attempts=1),
    "opencode-blackbox": _declared_agent("harnesses.opencode", "OpencodeAgent", retries_unbounded=True),
    "qwen-code-blackbox": _declared_agent(
        "harnesses.qwen_code", "QwenCodeAgent", max_retries=0, retries_unbounded=True
    ),
    "openclaw-blackbox": _declared_agent("harnesses.openclaw", "OpenClawAgent", max_retries=0),
}
FAILURE_CHECKS = {
    "test_a_failing_engine_is_reported_not_raised",
    "test_an_unreachable_proxy_is_reported_not_raised",
}


def pytest_generate_tests(metafunc):
    if "make_harness" in metafunc.fixturenames:
        metafunc.parametrize("make_harness", brick_params(metafunc.config, BUILT_INS))


@pytest.fixture
def harness_and_task(make_harness, request) -> tuple[Harness, Task]:
    brick = make_harness()
    if isinstance(brick, BuiltInHarness):
        failure_check = request.function.__name__ in FAILURE_CHECKS
        harness = brick.failing if failure_check and brick.failing else brick.harness
        task = brick.make_task(request)
    else:
        harness, task = brick, QuestionTask()
    assert isinstance(harness, Harness), f"{harness!r} does not implement components.protocols.Harness"
    assert isinstance(harness.name, str) and harness.name
    return harness, task


async def _open_sandbox(harness: Harness, task: Task, proxy_url: str):
    require_tool(shutil.which("bwrap"), "run `make setup` (apt-get install bubblewrap)")
    from sandboxes.bwrap import BwrapSandbox

    spec = task.sandbox_spec()
    if isinstance(harness, SandboxAwareHarness):
        spec = harness.adapt_sandbox_spec(spec, proxy_url=proxy_url)
    return await BwrapSandbox.create(spec)


async def _run(harness: Harness, task: Task, sandbox, base_url: str, api_key: str) -> HarnessOutcome:
    try:
        outcome = await asyncio.wait_for(
            harness.run(task=task, sandbox=sandbox, base_url=base_url, api_key=api_key), BOUND_S
        )
    except TimeoutError:
        pytest.fail(f"{harness.name} did not return within {BOUND_S:g} s")
    assert isinstance(outcome, HarnessOutcome), f"{harness.name} returned {outcome!r}"
    assert outcome.status in {status.value for status in TrajectoryStatus}, outcome.status
    assert all(isinstance(value, int | float) for value in outcome.metrics.values()), outcome.metrics
    return outcome


async def _run_in_session(
    harness, task, engine, tokenizer, *, sandbox=None
) -> tuple[HarnessOutcome, SessionDescription]:
    async with running_proxy(engine, tokenizer, admin_key=ADMIN_KEY) as proxy:
        session_id = await proxy.registry.open_session(
            SessionOpen(task_id=task.task_id, harness=harness.name)
        )
        token = proxy.server.config.session_keys.session_token(session_id)
        opened = sandbox or await _open_sandbox(harness, task, proxy.url)
        try:
            outcome = await _run(harness, task, opened, f"{proxy.url}/s/{session_id}", token)
        finally:
            if sandbox is None:
                await opened.close()
        return outcome, await proxy.registry.describe(session_id)


async def test_a_run_talks_through_its_session_and_returns_an_outcome(harness_and_task, tokenizer):
    harness, task = harness_and_task
    outcome, session = await _run_in_session(
        harness, task, ScriptedEngine(tokenizer, lambda _: REPLY), tokenizer
    )
    assert session.num_turns >= 1, f"the session recorded no model call: {outcome}"


async def test_a_failing_engine_is_reported_not_raised(harness_and_task, tokenizer):
    harness, task = harness_and_task
    outcome, session = await _run_in_session(harness, task, FailingEngine(), tokenizer)
    assert outcome.status != TrajectoryStatus.OK.value, outcome
    assert session.num_engine_errors >= 1, "the harness never reached the (failing) engine"


async def test_an_unreachable_proxy_is_reported_not_raised(harness_and_task, tmp_path):
    harness, task = harness_and_task
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    sandbox = await _open_sandbox(harness, task, closed_url)
    try:
        outcome = await _run(harness, task, sandbox, f"{closed_url}/s/nowhere", "no-such-token")
    finally:
        await sandbox.close()
    assert outcome.status != TrajectoryStatus.OK.value, outcome


async def test_a_dead_sandbox_is_reported_not_raised(harness_and_task, tokenizer):
    harness, task = harness_and_task
    engine = ScriptedEngine(tokenizer, lambda _: REPLY)
    outcome, _ = await _run_in_session(harness, task, engine, tokenizer, sandbox=DeadSandbox())
    assert isinstance(outcome, HarnessOutcome)  # any status: a harness that never touches the sandbox is fine


async def test_the_contract_catches_a_harness_that_raises(tokenizer):
    from examples.bricks.one_shot_harness import OneShotHarness

    class Raising(OneShotHarness):
        async def run(self, *, task, sandbox, base_url, api_key):
            await sandbox.exec(["true"])  # lets the dead sandbox's SandboxError escape
            return await super().run(task=task, sandbox=sandbox, base_url=base_url, api_key=api_key)

    with pytest.raises(SandboxError):
        await test_a_dead_sandbox_is_reported_not_raised((Raising(), QuestionTask()), tokenizer)


async def test_the_contract_catches_a_harness_that_ignores_its_session_key(tokenizer):
    from examples.bricks.one_shot_harness import OneShotHarness

    class OwnKey(OneShotHarness):
        async def run(self, *, task, sandbox, base_url, api_key):
            return await super().run(task=task, sandbox=sandbox, base_url=base_url, api_key="sk-my-own-key")

    with pytest.raises(AssertionError, match="recorded no model call"):
        await test_a_run_talks_through_its_session_and_returns_an_outcome(
            (OwnKey(), QuestionTask()), tokenizer
        )
