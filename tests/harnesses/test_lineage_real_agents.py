"""Lineage with the real programs, each driven by a scripted policy through the real proxy inside a bubblewrap
sandbox: Claude Code (npm, the full agent) spawns a sub-agent through its own ``Agent`` tool, and the recorded
session is a tree whose sub-agent segment hangs under the main conversation right after the call; Claude Code
and Codex compact their own history (their auto-compaction, brought forward by their own settings), and the
conversation resumed from the summary hangs as ``compaction`` under the summary request that sampled it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from components.engine.scripted_policies import tool_call
from components.trajectory import BranchKind, TrajectoryStatus
from harnesses.agent_paths import npm_agent_executable
from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness
from harnesses.claude_code import ClaudeCodeAgent
from harnesses.codex import CodexAgent
from tests.harnesses.harness_fixtures import run_rollout

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
        trajectory = await run_rollout(proxy, harness, sandbox_pool, swe_grader, task)

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


SUMMARY_REQUEST = "Your task is to create a detailed summary of"  # each of Claude Code's compact prompts
MAX_CALLS = 6
SUMMARY = "Summary: the user asked to fix slugify; I listed the repository; nothing is fixed yet."


def assert_one_compaction(trajectory, tokenizer, *, summary_request_kind: BranchKind) -> None:
    """The run ended well and holds one ``compaction`` segment, hanging right after the summary its parent (the
    summary request, of ``summary_request_kind`` under the root) sampled."""
    segments = trajectory.segments
    lineage = [(s.reason.value, s.branch_kind.value, s.parent_segment, s.branch_position) for s in segments]
    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}"
    compactions = [index for index, s in enumerate(segments) if s.branch_kind == BranchKind.COMPACTION]
    assert len(compactions) == 1, lineage
    resumed = segments[compactions[0]]
    parent = segments[resumed.parent_segment]
    assert parent.branch_kind == summary_request_kind and parent.parent_segment == 0, lineage
    before = slice(0, resumed.branch_position)
    sampled = tokenizer.decode(parent.token_ids[before][parent.loss_mask[before] == 1].tolist())
    assert SUMMARY in sampled, (lineage, sampled[-300:])
    assert parent.loss_mask[resumed.branch_position - 1] == 1, lineage


def compacting_policy(prompt: str) -> str:
    """Shell calls with long results (the context grows), the summary when asked for it, and once resumed from
    the summary (or after ``MAX_CALLS`` calls) the main conversation ends."""
    if SUMMARY_REQUEST in prompt:
        return SUMMARY
    if SUMMARY in prompt or prompt.count("<tool_response>") >= MAX_CALLS:
        return "Done."
    return tool_call("Bash", command="seq 1 1000", description="count")  # long results: the context grows


@pytest.mark.slow
async def test_claude_code_auto_compaction_is_a_labelled_branch(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    """Claude Code's own auto-compaction (its source read in the binary: ``autocompact`` routes through its
    reactive compactor once the context passes the threshold), brought forward by its environment settings:
    the summary request is the main conversation sent with its compact prompt (a fork of it), and the
    conversation it resumes from the summary is labelled ``compaction`` under the segment that sampled it."""
    if not npm_agent_executable("claude").exists():
        pytest.fail("Claude Code is not installed: run `make .agents/.installed`")
    config = BlackBoxConfig(
        max_turns=10,
        wall_time_s=300,
        max_output_tokens=512,
        # its proactive auto-compaction runs only with a configured window (its minimum, 100k tokens), then at
        # the override's share of it (10%: ~10k tokens), and only with at least one earlier assistant turn to
        # summarise and a fixed prefix (system prompt, tools; small in --bare mode) below the threshold: the
        # long tool results cross it after a few calls
        extra_env={"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "10"},
    )
    harness = BlackBoxHarness(ClaudeCodeAgent(bare=True), config)
    task = dataclasses.replace(slugify_task, problem_statement=TASK_TEXT)
    async with scripted_proxy(compacting_policy, context_window=65536, default_max_tokens=512) as proxy:
        trajectory = await run_rollout(proxy, harness, sandbox_pool, swe_grader, task)
    # the summary request is the main conversation up to its last held turn sent again with the compact prompt
    # (a fork of it)
    assert_one_compaction(trajectory, tokenizer, summary_request_kind=BranchKind.FORK)


CODEX_SUMMARY_REQUEST = "You are performing a CONTEXT CHECKPOINT COMPACTION"  # codex's compact prompt


def codex_compacting_policy(prompt: str) -> str:
    """As ``compacting_policy``, with Codex's shell tool and compact prompt."""
    if CODEX_SUMMARY_REQUEST in prompt:
        return SUMMARY
    if SUMMARY in prompt or prompt.count("<tool_response>") >= MAX_CALLS:
        return "Done."
    return tool_call("exec_command", cmd="seq 1 1000")


@pytest.mark.slow
async def test_codex_auto_compaction_is_a_labelled_branch(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    """Codex's own auto-compaction (``model_auto_compact_token_limit`` in its config.toml): its summary request
    (the history with its compact prompt) samples the summary, and the conversation it resumes from the
    summary is labelled ``compaction`` under it."""
    harness = BlackBoxHarness(
        CodexAgent(auto_compact_token_limit=12_000),
        BlackBoxConfig(max_turns=10, wall_time_s=300, max_output_tokens=512),
    )
    task = dataclasses.replace(slugify_task, problem_statement=TASK_TEXT)
    async with scripted_proxy(codex_compacting_policy, context_window=65536, default_max_tokens=512) as proxy:
        trajectory = await run_rollout(proxy, harness, sandbox_pool, swe_grader, task)
    # codex sends its compact prompt without tools: rendered anew, a side call beside the main conversation
    assert_one_compaction(trajectory, tokenizer, summary_request_kind=BranchKind.SIDE_CALL)


CODEX_SPAWN = "multi_agent_v1.spawn_agent"  # a namespaced tool, as the proxy presents it to the policy
CODEX_WAIT = "multi_agent_v1.wait_agent"
SPAWNED_ID = re.compile(r'"agent_id"\s*:\s*"([^"]+)"')


def codex_multi_agent_policy(prompt: str) -> str:
    """The main conversation spawns one sub-agent through Codex's namespaced tool, waits for it, and ends once
    its report arrived; the sub-agent (whose conversation does not hold the user's task) reports at once."""
    if TASK_TEXT not in prompt:
        return REPORT
    if REPORT in prompt:
        return "Done."
    spawned = SPAWNED_ID.search(prompt)
    if spawned:
        return tool_call(CODEX_WAIT, targets=[spawned.group(1)], timeout_ms=60_000)
    return tool_call(CODEX_SPAWN, message=SUBAGENT_PROMPT)


@pytest.mark.slow
async def test_codex_sub_agent_is_a_labelled_branch(scripted_proxy, slugify_task, sandbox_pool, swe_grader):
    """Codex with ``[features] multi_agent``: its ``spawn_agent`` (a ``namespace`` tool of the Responses API)
    starts a sub-agent whose conversation goes through the same session; it is labelled ``subagent`` under the
    main conversation, branched right after the sampled spawn call."""
    harness = BlackBoxHarness(
        CodexAgent(multi_agent=True), BlackBoxConfig(max_turns=8, wall_time_s=300, max_output_tokens=512)
    )
    task = dataclasses.replace(slugify_task, problem_statement=TASK_TEXT)
    async with scripted_proxy(
        codex_multi_agent_policy, context_window=65536, default_max_tokens=512
    ) as proxy:
        trajectory = await run_rollout(proxy, harness, sandbox_pool, swe_grader, task)

    segments = trajectory.segments
    lineage = [(s.reason.value, s.branch_kind.value, s.parent_segment, s.branch_position) for s in segments]
    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}"
    assert segments[0].branch_kind == BranchKind.ROOT, lineage
    subagents = [index for index, s in enumerate(segments) if s.branch_kind == BranchKind.SUBAGENT]
    assert len(subagents) == 1, lineage
    sub = segments[subagents[0]]
    main = segments[sub.parent_segment]
    assert sub.parent_segment == 0, lineage
    # the sub-agent branched from the main conversation right after the sampled spawn call
    assert main.loss_mask[sub.branch_position - 1] == 1 and main.loss_mask[sub.branch_position] == 0, lineage
    assert all(s.parent_segment < index for index, s in enumerate(segments))
