"""The white-box coding agent end to end: a scripted policy behind the real proxy (real HTTP, official OpenAI
SDK), its tools in a real bubblewrap sandbox, graded by the real grader in a fresh sandbox."""

from __future__ import annotations

import json

import numpy as np
import pytest

from components.engine.scripted_policies import fixing_policy, step_policy, tool_call
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TrajectoryStatus
from harnesses.swe_agent import SweAgentBrickConfig, SweAgentConfig, SweAgentHarness

pytestmark = pytest.mark.timeout(300)


def _runner(proxy, harness, pool, grader, **config):
    return RolloutRunner(
        RolloutConfig(**{"group_size": 1, "max_concurrency": 2, **config}),
        harness=harness,
        sandboxes=pool,
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=grader,
    )


@pytest.mark.slow
async def test_scripted_policy_solves_a_builtin_task_end_to_end(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    harness = SweAgentHarness(SweAgentConfig(max_turns=10, wall_time_s=120))
    async with scripted_proxy(fixing_policy(slugify_task)) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=7)

    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log}"
    assert trajectory.reward == 1.0, trajectory.log
    assert trajectory.trainable
    assert (trajectory.task_id, trajectory.step, trajectory.harness) == (slugify_task.task_id, 7, "swe-agent")
    # The proxy recorded the policy's tokens: sampled ids under the loss mask, with their logprobs.
    assert trajectory.segments, "no token segments recorded"
    sampled = np.concatenate([s.token_ids[s.loss_mask == 1] for s in trajectory.segments])
    prompt_tokens = sum(int((s.loss_mask == 0).sum()) for s in trajectory.segments)
    assert prompt_tokens > 0 and len(sampled) > 0
    sampled_text = tokenizer.decode(sampled.tolist())
    assert sampled_text.count("<tool_call>") == 6 and '"submit"' in sampled_text
    # Metrics the harness and runner report.
    metrics = trajectory.metrics
    assert metrics["num_turns"] == 6
    assert metrics["num_tool_calls"] == 6
    assert metrics["num_tool_calls_edit_file"] == 1 and metrics["num_tool_calls_view_file"] == 2
    assert metrics["num_invalid_tool_calls"] == 1
    assert metrics["num_rereads_after_edit"] == 1
    assert metrics["submitted"] == 1.0
    assert metrics["num_response_tokens"] == len(sampled)
    for name in ("rollout_wall_time_s", "harness_wall_time_s", "grading_wall_time_s"):
        assert metrics[name] > 0
    # The malformed call was answered with an error the policy can read, and the run went on.
    tool_messages = [m for m in trajectory.messages if m["role"] == "tool"]
    assert any("unknown tool 'open_file'" in m["content"] for m in tool_messages)
    # `bash` runs in the sandbox with the project's Python on PATH: the visible tests pass after the fix.
    test_run = next(m["content"] for m in tool_messages if "passed" in m["content"])
    assert test_run.startswith("exit code 0") and "failed" not in test_run
    assert "=== grading" in trajectory.log


async def test_policy_that_never_submits_hits_the_turn_limit_and_is_still_graded(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader
):
    def policy(prompt: str) -> str:  # text only once, then tool calls that never submit
        return tool_call("bash", command="ls") if "no tool call" in prompt else "I am thinking about it."

    harness = SweAgentHarness(SweAgentConfig(max_turns=3, wall_time_s=60))
    async with scripted_proxy(policy) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.TURN_LIMIT
    assert "3 turns" in trajectory.failure_reason
    assert trajectory.reward == 0.0 and trajectory.trainable  # kept for training, graded
    assert trajectory.metrics["num_turns"] == 3
    assert trajectory.metrics["num_text_only_replies"] == 1  # the first reply had no tool call: reminded
    user_turns = [m["content"] for m in trajectory.messages if m["role"] == "user"]
    assert any("no tool call" in text for text in user_turns)


async def test_edit_file_needs_an_exact_unique_match(scripted_proxy, slugify_task, sandbox_pool, swe_grader):
    policy = step_policy(
        [
            tool_call("edit_file", path="minilib/text.py", old_str="this text is nowhere", new_str="x"),
            tool_call("edit_file", path="minilib/text.py", old_str="def ", new_str="def  "),
            tool_call("edit_file", path="missing.py", old_str="a", new_str="b"),
            '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>',
            tool_call("submit"),
        ]
    )
    harness = SweAgentHarness(SweAgentConfig(max_turns=8, wall_time_s=60))
    async with scripted_proxy(policy) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.OK
    assert trajectory.reward == 0.0  # nothing was fixed
    errors = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert "was not found in minilib/text.py" in errors[0]
    assert "occurs" in errors[1] and "times" in errors[1]
    assert "no such file: missing.py" in errors[2]
    assert "missing required argument 'command'" in errors[3]
    assert trajectory.metrics["num_invalid_tool_calls"] == 4
    assert json.loads(json.dumps(trajectory.metrics))  # plain floats


async def test_wall_time_bound_gives_timeout(scripted_proxy, slugify_task, sandbox_pool, swe_grader):
    policy = step_policy([tool_call("bash", command="sleep 30")])
    harness = SweAgentHarness(
        SweAgentConfig(max_turns=5, wall_time_s=2, settings=SweAgentBrickConfig(command_timeout_s=20))
    )
    async with scripted_proxy(policy) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.TIMEOUT, trajectory.failure_reason
    assert trajectory.reward == 0.0 and trajectory.trainable
    assert trajectory.metrics["harness_wall_time_s"] < 15


async def test_tool_call_process_reward_lands_on_each_model_calls_turn(
    scripted_proxy, slugify_task, sandbox_pool, swe_grader, tokenizer
):
    """With ``tool_call_reward`` w, each model call's process reward (w × mean(+1 run, −1 refused), −w for no
    tool call) is stored on that call's turn: the k-th run of sampled tokens holds the k-th reply."""
    replies = [
        "Let me think first.",  # no tool call: -w
        tool_call("bash", command="ls") + "\n" + tool_call("open_file", path="x"),  # run + refused: 0
        tool_call("bash", command="exit 3"),  # ran (a non-zero exit code is information): +w
        tool_call("edit_file", path="minilib/text.py", old_str="this text is nowhere", new_str="x"),  # -w
        tool_call("submit"),  # +w
    ]

    def policy(prompt: str) -> str:  # by the tool results so far (the second reply makes two calls)
        if "no tool call" not in prompt:
            return replies[0]
        return replies[{0: 1, 2: 2, 3: 3, 4: 4}[prompt.count("<tool_response>")]]

    harness = SweAgentHarness(
        SweAgentConfig(max_turns=8, wall_time_s=60, settings=SweAgentBrickConfig(tool_call_reward=0.5))
    )
    async with scripted_proxy(policy) as proxy:
        [trajectory] = await _runner(proxy, harness, sandbox_pool, swe_grader).run([slugify_task], step=0)
    assert trajectory.status == TrajectoryStatus.OK, f"{trajectory.failure_reason}\n{trajectory.log}"
    turns: list[tuple[str, float]] = []  # (the turn's sampled text, its stored reward), in call order
    for segment in trajectory.segments:
        mask = segment.loss_mask == 1
        starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        assert segment.turn_rewards is not None and len(segment.turn_rewards) == len(starts)
        for start, reward in zip(starts, segment.turn_rewards, strict=True):
            end = start + int(np.argmin(np.append(mask[start:], False)))
            turns.append((tokenizer.decode(segment.token_ids[start:end].tolist()), float(reward)))
    assert [reward for _, reward in turns] == [-0.5, 0.0, 0.5, -0.5, 0.5]
    for (text, _), reply in zip(turns, replies, strict=True):
        assert reply.strip() in text, (text, reply)
