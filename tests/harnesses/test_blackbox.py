"""The black-box adapter: unmodified agent programs in a real bubblewrap sandbox, talking to the real proxy
through the sandbox's proxy-only network path.

The adapter mechanics are checked with a tiny shell "agent" (which is also how small adding an agent is);
then Claude Code, Codex CLI and mini-swe-agent each run one built-in task end to end with the tiny random
model behind the proxy: the reward is 0, and the trajectory must be recorded and classified as a policy
outcome (ok / turn_limit / timeout), never as an infrastructure failure caused by a protocol error.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import pytest

from components.proxy.auth import SessionKeys
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TRAINABLE_STATUSES, TrajectoryStatus
from harnesses.agent_paths import npm_agent_executable
from harnesses.blackbox import (
    AgentExit,
    AgentLaunch,
    BlackBoxConfig,
    BlackBoxHarness,
    default_exit_status,
)
from harnesses.claude_code import ClaudeCodeAgent
from harnesses.codex import CodexAgent
from harnesses.mini_swe_agent import MiniSweAgent
from tests.harnesses.harness_fixtures import running_proxy

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class ShellAgent:
    """A minimal black-box agent: a shell script that reports what it was given."""

    script: str
    name: str = "shell-agent"
    turn_bound: Literal["agent", "proxy"] = "agent"

    def read_only_paths(self) -> tuple[str, ...]:
        return ()

    def launch(
        self, *, prompt: str, base_url: str, api_key: str, home: str, config: BlackBoxConfig
    ) -> AgentLaunch:
        return AgentLaunch(
            argv=("bash", "-c", self.script, "agent", prompt),
            env={"AGENT_BASE_URL": base_url},
            home_files={".config/agent/settings.toml": f'model = "{config.model}"\n'},
            report_command='echo "report from $HOME"',
        )

    def read_exit(
        self, run: AgentExit, config: BlackBoxConfig
    ) -> tuple[TrajectoryStatus, str, dict[str, float]]:
        status, reason = default_exit_status(run, config)
        return status, reason, {"num_stdout_lines": float(len(run.stdout.splitlines()))}


async def test_adapter_writes_home_passes_url_and_keeps_exit_and_logs(slugify_task, sandbox_pool):
    script = (
        'echo "prompt: $1"; echo "url: $AGENT_BASE_URL"; echo "home: $HOME"; '
        'cat "$HOME/.config/agent/settings.toml"; echo "to stderr" >&2; exit 3'
    )
    harness = BlackBoxHarness(
        ShellAgent(script), BlackBoxConfig(model="m1", prompt_template="Fix: {problem_statement}")
    )
    sandbox = await sandbox_pool.acquire(slugify_task.sandbox_spec())
    try:
        outcome = await harness.run(
            task=slugify_task, sandbox=sandbox, base_url="http://127.0.0.1:1/s/abc/", api_key="x"
        )
        workspace = await sandbox.exec(["ls", "-A"])
    finally:
        await sandbox_pool.release(sandbox)
    assert outcome.status == TrajectoryStatus.AGENT_ERROR
    assert "exited with status 3" in outcome.failure_reason and "to stderr" in outcome.failure_reason
    assert f"prompt: Fix: {slugify_task.problem_statement}" in outcome.log
    assert "url: http://127.0.0.1:1/s/abc\n" in outcome.log
    assert 'model = "m1"' in outcome.log
    assert (
        "home: /home/sandbox/.rein-agent" in outcome.log
        and "report from /home/sandbox/.rein-agent" in outcome.log
    )
    assert outcome.metrics["agent_exit_code"] == 3.0 and outcome.metrics["num_stdout_lines"] == 4.0
    assert ".rein-agent" not in workspace.stdout  # the throwaway HOME never lands in the graded workspace


async def test_adapter_enforces_wall_time(slugify_task, sandbox_pool):
    harness = BlackBoxHarness(
        ShellAgent("echo started; sleep 60"), BlackBoxConfig(wall_time_s=1, kill_grace_s=1)
    )
    sandbox = await sandbox_pool.acquire(slugify_task.sandbox_spec())
    try:
        outcome = await harness.run(
            task=slugify_task, sandbox=sandbox, base_url="http://127.0.0.1:1/s/abc", api_key="x"
        )
    finally:
        await sandbox_pool.release(sandbox)
    assert outcome.status == TrajectoryStatus.TIMEOUT
    assert "started" in outcome.log  # output up to the kill is kept
    assert outcome.metrics["agent_wall_time_s"] < 20


def test_adapter_widens_the_sandbox_for_the_program(slugify_task):
    harness = BlackBoxHarness(CodexAgent(), BlackBoxConfig(wall_time_s=100))
    spec = harness.adapt_sandbox_spec(slugify_task.sandbox_spec(), proxy_url="http://127.0.0.1:8123")
    assert spec.proxy_url == "http://127.0.0.1:8123"
    assert set(slugify_task.sandbox_spec().read_only_paths) < set(spec.read_only_paths)
    assert any(path.endswith("/.agents") for path in spec.read_only_paths)
    assert spec.limits.memory_mb >= 32_768 and spec.limits.command_timeout_s >= 100
    assert spec.workspace_source == slugify_task.sandbox_spec().workspace_source
    with pytest.raises(ValueError, match="max_turns"):
        BlackBoxConfig(max_turns=0)
    with pytest.raises(ValueError, match="home_dir"):
        BlackBoxConfig(home_dir="/tmp")  # emptied before each run: must not be a top-level directory
    with pytest.raises(ValueError, match="argv"):
        AgentLaunch(argv=())
    with pytest.raises(ValueError, match="home_files"):
        AgentLaunch(argv=("x",), home_files={"../escape": ""})


# ---------------------------------------------------------------------------------------------------------
# Real agents, tiny model
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def tiny_model_proxy(tiny_model_dir, tokenizer) -> AsyncIterator:
    """The proxy in front of the embedded engine running the tiny random model (replies capped at 32 tokens
    for agents that do not say, so that rambling random text stays cheap)."""
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir))
    try:
        # Isolated mode: each agent holds only its own session's token (ANTHROPIC_API_KEY, codex's env_key,
        # litellm's api_key) and reaches the proxy with it from inside the sandbox.
        async with running_proxy(
            engine, tokenizer, default_max_tokens=32, admin_key=PROXY_KEYS.admin_key
        ) as proxy:
            yield proxy
    finally:
        engine.close()


PROXY_KEYS = SessionKeys.generate()

# How each agent ends with random 32-token replies: Claude Code gives up on replies cut at its output limit
# (the policy's doing: ok), Codex takes a reply without tool calls as its final answer (ok), mini-swe-agent
# answers format errors until its step limit (turn_limit).
REAL_AGENTS = {
    "claude-code": (ClaudeCodeAgent(bare=True), TrajectoryStatus.OK),
    "codex": (CodexAgent(), TrajectoryStatus.OK),
    "mini-swe-agent": (MiniSweAgent(), TrajectoryStatus.TURN_LIMIT),
}
if os.environ.get("REIN_TEST_FULL_CLAUDE_CODE") == "1":  # ~20k-token prompts: over a minute on 2 CPU cores
    REAL_AGENTS["claude-code-full"] = (ClaudeCodeAgent(), TrajectoryStatus.OK)


@pytest.mark.slow
@pytest.mark.parametrize("agent_name", list(REAL_AGENTS))
async def test_real_agent_runs_a_builtin_task_end_to_end(
    agent_name, tiny_model_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    if not npm_agent_executable("claude").exists():
        pytest.fail("the npm agents are not installed: run `make .agents/.installed`")
    agent, expected_status = REAL_AGENTS[agent_name]
    harness = BlackBoxHarness(agent, BlackBoxConfig(max_turns=2, wall_time_s=240, max_output_tokens=32))
    runner = RolloutRunner(
        RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=400),
        harness=harness,
        sandboxes=sandbox_pool,
        sessions=tiny_model_proxy.registry,
        proxy_url=tiny_model_proxy.url,
        grader=swe_grader,
        session_keys=PROXY_KEYS,
    )
    [trajectory] = await runner.run([slugify_task], step=1)

    assert trajectory.status in TRAINABLE_STATUSES, f"{trajectory.failure_reason}\n{trajectory.log[-4000:]}"
    assert trajectory.status == expected_status, trajectory.failure_reason
    assert trajectory.reward == 0.0, trajectory.log[-4000:]  # random weights fix nothing
    assert trajectory.trainable and trajectory.harness == agent.name
    # The agent's requests reached the policy through the proxy and were recorded token for token.
    assert trajectory.metrics["num_policy_calls"] >= 1
    assert trajectory.segments and sum(s.num_sampled_tokens for s in trajectory.segments) > 0
    assert all(s.loss_mask.sum() < len(s.token_ids) for s in trajectory.segments)  # prompt tokens unmasked
    assert f"$ {agent.name} (exit" in trajectory.log
    assert trajectory.messages and trajectory.messages[-1]["role"] == "assistant"
