"""Gemini CLI, unmodified (npm ``@google/gemini-cli``), inside a real bubblewrap sandbox, speaking Google's
Gemini API to the real proxy: a scripted policy drives its own tools (``replace``, ``run_shell_command``) to
fix a built-in task, graded by the real grader; its turn and output bounds and its exit mapping."""

from __future__ import annotations

import json

import pytest

from components.engine.scripted_policies import first_hunk_edit, step_policy, tool_call
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TrajectoryStatus
from harnesses.blackbox import AgentExit, BlackBoxConfig, BlackBoxHarness
from harnesses.gemini_cli import GEMINI_EXECUTABLE, GeminiCliAgent

pytestmark = pytest.mark.timeout(600)


def _runner(proxy, harness, pool, grader):
    return RolloutRunner(
        RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=400),
        harness=harness,
        sandboxes=pool,
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=grader,
    )


def _require_gemini_cli() -> None:
    if not GEMINI_EXECUTABLE.exists():
        pytest.fail("Gemini CLI is not installed: run `make .agents/.installed`")


@pytest.mark.slow
async def test_gemini_cli_fixes_a_builtin_task(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    _require_gemini_cli()
    path, old, new = first_hunk_edit(slugify_task.reference_patch)
    policy = step_policy(
        [
            "I will fix it.\n"
            + tool_call("replace", file_path=path, old_string=old, new_string=new, instruction="fix the bug"),
            tool_call(
                "run_shell_command",
                command="python -m pytest -q -p no:cacheprovider tests",
                description="test",
            ),
            "The bug is fixed.",
        ]
    )
    harness = BlackBoxHarness(
        GeminiCliAgent(), BlackBoxConfig(max_turns=6, wall_time_s=240, max_output_tokens=512)
    )
    async with scripted_proxy(policy, default_max_tokens=4096) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=3)

    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log[-4000:]}"
    assert trajectory.reward == 1.0, trajectory.log[-4000:]
    assert trajectory.trainable and trajectory.harness == "gemini-cli"
    assert trajectory.metrics["num_turns"] == 3 and trajectory.metrics["num_tool_calls"] == 2
    # the three policy turns are one append-only segment: Gemini CLI sends its history back unchanged
    assert len(trajectory.segments) == 1, [s.reason for s in trajectory.segments]
    sampled = tokenizer.decode(
        trajectory.segments[0].token_ids[trajectory.segments[0].loss_mask == 1].tolist()
    )
    assert sampled.count("<tool_call>") == 2 and "The bug is fixed." in sampled
    assert trajectory.messages[-1] == {"role": "assistant", "content": "The bug is fixed."}
    assert any(m["role"] == "tool" and "passed" in m["content"] for m in trajectory.messages)


@pytest.mark.slow
async def test_gemini_cli_turn_and_output_bounds(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    """Every reply is a shell call followed by rambling text: the output bound cuts each reply after the call
    (so the CLI still runs it), and the turn bound stops the run after two turns (turn_limit, trainable)."""
    _require_gemini_cli()
    reply = tool_call("run_shell_command", command="echo again") + " and then" * 100
    max_output_tokens = 40
    harness = BlackBoxHarness(
        GeminiCliAgent(), BlackBoxConfig(max_turns=2, wall_time_s=240, max_output_tokens=max_output_tokens)
    )
    async with scripted_proxy([reply], default_max_tokens=4096) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
        num_calls = proxy.engine.num_calls

    assert trajectory.status == TrajectoryStatus.TURN_LIMIT, (
        f"{trajectory.failure_reason}\n{trajectory.log[-3000:]}"
    )
    assert (
        "maxSessionTurns 2" in trajectory.failure_reason and trajectory.trainable and trajectory.reward == 0.0
    )
    assert num_calls == 2 and trajectory.metrics["num_policy_calls"] == 2
    [segment] = trajectory.segments
    assert segment.num_sampled_tokens == 2 * max_output_tokens  # each reply cut exactly at the bound
    # the cut reply's shell call still ran: its output came back as the tool result of the second turn
    assert any(m["role"] == "tool" and "again" in m["content"] for m in trajectory.messages)


def test_gemini_cli_exit_mapping():
    agent, config = GeminiCliAgent(), BlackBoxConfig(max_turns=3)
    result = '{\n  "session_id": "s",\n  "response": "done",\n  "stats": {"models": {"m": {"api": {"totalRequests": 2}, "tokens": {"candidates": 7}}}, "tools": {"totalCalls": 1}}\n}'

    def exit_of(code, stdout="", stderr="", timed_out=False):
        return agent.read_exit(
            AgentExit(exit_code=code, timed_out=timed_out, stdout=stdout, stderr=stderr), config
        )

    status, reason, metrics = exit_of(0, "YOLO mode is enabled.\n" + result)
    assert (status, reason) == (TrajectoryStatus.OK, "")
    assert metrics == {"num_turns": 2.0, "num_tool_calls": 1.0, "num_response_tokens": 7.0}
    error = '{"session_id": "s", "error": {"type": "%s", "message": "%s", "code": %d}}'
    assert exit_of(53, stderr=error % ("FatalTurnLimitedError", "Reached max session turns", 53))[0] == (
        TrajectoryStatus.TURN_LIMIT
    )
    overflow = error % ("Error", "got status: INVALID_ARGUMENT. 413 context_overflow", 1)
    assert exit_of(1, stderr=overflow)[0] == TrajectoryStatus.CONTEXT_OVERFLOW
    assert (
        exit_of(1, stderr=error % ("Error", "got status: UNAVAILABLE. 502", 1))[0]
        == TrajectoryStatus.ENGINE_ERROR
    )
    assert exit_of(41, stderr=error % ("Error", "Invalid auth method selected.", 41))[:2] == (
        TrajectoryStatus.AGENT_ERROR,
        "gemini: Invalid auth method selected.",
    )
    assert exit_of(0, stdout="no json")[0] == TrajectoryStatus.AGENT_ERROR
    assert exit_of(124, timed_out=True)[0] == TrajectoryStatus.TIMEOUT

    def settings(config):
        launch = agent.launch(prompt="p", base_url="http://h/s/x", api_key="k", home="/h/a", config=config)
        assert launch.env["GOOGLE_GEMINI_BASE_URL"] == "http://h/s/x" and launch.env["GEMINI_API_KEY"] == "k"
        return json.loads(launch.home_files[".gemini/settings.json"])

    bounded = settings(BlackBoxConfig(max_turns=5, max_output_tokens=64))
    assert bounded["model"]["maxSessionTurns"] == 5
    [override] = bounded["modelConfigs"]["customOverrides"]
    assert override["modelConfig"]["generateContentConfig"] == {"maxOutputTokens": 64}
    [unbounded] = settings(BlackBoxConfig(max_turns=5))["modelConfigs"]["customOverrides"]
    assert unbounded["modelConfig"]["generateContentConfig"] == {}
