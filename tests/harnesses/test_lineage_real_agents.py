"""Lineage with the real programs: Claude Code (npm, the full agent) spawns a sub-agent through its own
``Agent`` tool, driven by a scripted policy through the real proxy inside a bubblewrap sandbox; the recorded
session is a tree whose sub-agent segment hangs under the main conversation right after the call."""

from __future__ import annotations

import dataclasses

import pytest

from components.engine.scripted_policies import tool_call
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import BranchKind, TrajectoryStatus
from harnesses.agent_paths import npm_agent_executable
from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness
from harnesses.claude_code import ClaudeCodeAgent

pytestmark = pytest.mark.timeout(600)

TASK_TEXT = "Fix the slugify bug."
SUBAGENT_PROMPT = "Find every caller of slugify in this repository and report the files that call it."
REPORT = "Sub-agent report: only minilib/text.py calls slugify."


def claude_code_policy(prompt: str) -> str:
    """The main conversation delegates to a sub-agent, then finishes; the sub-agent (whose conversation does
    not hold the user's task) reports at once."""
    if TASK_TEXT not in prompt:
        return REPORT
    if REPORT in prompt:
        return "Done."
    return tool_call(
        "Agent", description="find callers", prompt=SUBAGENT_PROMPT, subagent_type="general-purpose"
    )


@pytest.mark.slow
async def test_claude_code_sub_agent_is_a_labelled_branch(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader
):
    agent = ClaudeCodeAgent()  # the full agent: --bare has no Agent tool
    if not npm_agent_executable("claude").exists():
        pytest.fail("Claude Code is not installed: run `make .agents/.installed`")
    harness = BlackBoxHarness(agent, BlackBoxConfig(max_turns=4, wall_time_s=300, max_output_tokens=512))
    task = dataclasses.replace(slugify_task, problem_statement=TASK_TEXT)
    async with scripted_proxy(claude_code_policy, context_window=65536, default_max_tokens=512) as proxy:
        runner = RolloutRunner(
            RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=400),
            harness=harness,
            sandboxes=sandbox_pool,
            sessions=proxy.registry,
            proxy_url=proxy.url,
            grader=swe_grader,
        )
        [trajectory] = await runner.run([task], step=0)

    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}"
    assert trajectory.reward == 0.0  # nothing was fixed: graded all the same
    segments = trajectory.segments
    assert segments[0].branch_kind == BranchKind.ROOT
    subagents = [index for index, s in enumerate(segments) if s.branch_kind == BranchKind.SUBAGENT]
    assert len(subagents) == 1, [(s.reason.value, s.branch_kind.value, s.parent_segment) for s in segments]
    sub = segments[subagents[0]]
    main_index = sub.parent_segment
    main = segments[main_index]
    # the sub-agent branched from the main conversation right after the sampled Agent call
    assert main.loss_mask[sub.branch_position - 1] == 1 and main.loss_mask[sub.branch_position] == 0
    assert all(s.branch_kind in set(BranchKind) for s in segments)
    assert all(s.parent_segment < index for index, s in enumerate(segments))
