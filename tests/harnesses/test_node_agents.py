"""OpenClaw, opencode and Qwen Code (and Codex, for the proxy's turn bound), unmodified, each fix a built-in task in a real bubblewrap sandbox through
the real proxy: a scripted policy (the tiny model cannot fix anything) applies the reference patch with the
agent's own shell tool, then keeps working until the agent's turn bound stops it (OpenClaw has none: it answers
"Done." instead). The real grader gives the fix 1; the run's status comes from the agent's exit; every model call
asked for at most the run's output bound; the trajectory is recorded under the agent's name.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from components.engine.scripted_policies import step_policy, tool_call
from components.protocols import SandboxSpec, SessionOpen
from components.trajectory import TrajectoryStatus
from harnesses.agent_spec import AgentSpec
from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness
from harnesses.codex import CodexAgent
from harnesses.openclaw import OPENCLAW, OpenClawAgent
from harnesses.opencode import OPENCODE
from harnesses.qwen_code import QWEN_CODE
from tests.contracts.test_harness_contract import QuestionTask
from tests.failing_bricks import FailingEngine
from tests.harnesses.harness_fixtures import run_rollout, running_proxy
from tests.harnesses.recording_engine import RecordingEngine
from tests.required_tools import require_tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MAX_TURNS = 2
MAX_OUTPUT_TOKENS = 1024


def apply_patch_command(patch: str) -> str:
    return f"patch -p1 <<'REIN_EOF'\n{patch}REIN_EOF\necho patched"


@dataclass(frozen=True)
class Case:
    agent: AgentSpec
    shell_tool: str  # the agent's own shell tool and its argument
    shell_argument: str
    expected_status: TrajectoryStatus
    last_reply: str = ""  # after the fix; "": keep calling the shell tool (the turn bound ends the run)
    reason: str = ""  # what the failure reason must say
    output_bound: bool = True  # False: the program has no reply cap of its own (Codex: the proxy's default)


CASES = {
    "opencode": Case(  # its wrap-up after the last step (an assistant prefill) is refused by the proxy
        OPENCODE,
        "bash",
        "command",
        TrajectoryStatus.TURN_LIMIT,
        reason="wrap-up (an assistant prefill) refused",
    ),
    "qwen-code": Case(QWEN_CODE, "run_shell_command", "command", TrajectoryStatus.TURN_LIMIT),
    "openclaw": Case(OPENCLAW, "exec", "command", TrajectoryStatus.OK, last_reply="Done: the fix is in."),
    # Agents without a turn setting of their own, kept calling their shell: the proxy answers MAX_TURNS calls
    # (the session's max_calls), refuses the next with a 400, and the runner records turn_limit
    "openclaw-bounded-by-the-proxy": Case(
        OPENCLAW, "exec", "command", TrajectoryStatus.TURN_LIMIT, reason="the proxy refused a model call"
    ),
    "codex-bounded-by-the-proxy": Case(
        CodexAgent(),
        "exec_command",
        "cmd",
        TrajectoryStatus.TURN_LIMIT,
        reason="the proxy refused a model call",
        output_bound=False,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_node_agent_fixes_a_builtin_task(name, slugify_task, sandbox_pool, swe_grader, tokenizer):
    case = CASES[name]
    require_tool(case.agent.argv[0], "run `make .agents/.node-agents`")
    call = lambda command: tool_call(case.shell_tool, **{case.shell_argument: command})  # noqa: E731
    replies = [
        "Let me fix it.\n" + call(apply_patch_command(slugify_task.reference_patch)),
        case.last_reply or call("grep -n 'strip(separator)' minilib/text.py"),
    ]
    engine = RecordingEngine(tokenizer, step_policy(replies), context_window=65536)
    harness = BlackBoxHarness(
        case.agent,
        BlackBoxConfig(max_turns=MAX_TURNS, wall_time_s=300, max_output_tokens=MAX_OUTPUT_TOKENS),
    )
    async with running_proxy(engine, tokenizer, default_max_tokens=8192) as proxy:
        trajectory = await run_rollout(proxy, harness, sandbox_pool, swe_grader, slugify_task)
    detail = f"{trajectory.failure_reason}\n{trajectory.log[-4000:]}"
    assert trajectory.reward == 1.0, detail
    assert trajectory.status == case.expected_status, detail
    assert case.reason in trajectory.failure_reason, detail
    assert trajectory.harness == case.agent.name and trajectory.trainable
    # The agent ran the policy's command with its own tool.
    assert "patched" in trajectory.log + str(trajectory.messages), detail
    if case.output_bound:
        assert engine.max_tokens_seen and max(engine.max_tokens_seen) <= MAX_OUTPUT_TOKENS, (
            engine.max_tokens_seen
        )
    assert trajectory.segments and sum(s.num_sampled_tokens for s in trajectory.segments) > 0
    if case.agent.turn_bound == "proxy":  # the bound held: exactly MAX_TURNS calls were answered
        assert trajectory.metrics["num_policy_calls"] == MAX_TURNS, detail


class CountingFailingEngine(FailingEngine):
    """A failing engine that counts the generations asked of it (each attempt the agent made)."""

    def __init__(self) -> None:
        self.num_calls = 0

    async def generate(self, input_ids, params):
        self.num_calls += 1
        return await super().generate(input_ids, params)


@pytest.mark.parametrize("max_retries", [0, 1])
async def test_openclaw_retry_setting_bounds_its_retries(max_retries, tokenizer):
    """``OpenClawAgent(max_retries=N)`` (its ``retry.provider.maxRetries``, in the agent directory of its
    ``--state-dir``): against an engine that keeps failing, OpenClaw calls it exactly N + 1 times and ends in
    an error well within its wall time (its default budget, eight retries with back-off, would run to it)."""
    from sandboxes.bwrap import BwrapSandbox

    require_tool(OPENCLAW.argv[0], "run `make setup-test` (npm install of the agents)")
    config = BlackBoxConfig(max_turns=2, wall_time_s=100, max_output_tokens=32)
    harness = BlackBoxHarness(OpenClawAgent(max_retries=max_retries), config)
    engine = CountingFailingEngine()
    async with running_proxy(engine, tokenizer) as proxy:
        session_id = await proxy.registry.open_session(SessionOpen(task_id="retry", harness=harness.name))
        sandbox = await BwrapSandbox.create(harness.adapt_sandbox_spec(SandboxSpec(), proxy_url=proxy.url))
        try:
            outcome = await harness.run(
                task=QuestionTask(), sandbox=sandbox, base_url=f"{proxy.url}/s/{session_id}", api_key="unused"
            )
        finally:
            await sandbox.close()
    assert outcome.status == TrajectoryStatus.ENGINE_ERROR.value, outcome
    assert engine.num_calls == max_retries + 1, (engine.num_calls, outcome)
