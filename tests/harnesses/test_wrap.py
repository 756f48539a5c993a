"""The user-agent wrapper: a small custom agent (the user's own code) becomes a harness and its run a
trajectory, through the real proxy, a real sandbox and the runner."""

from __future__ import annotations

import pytest

from components.protocols import HarnessOutcome, RewardResult, Sandbox, Task
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import TrajectoryStatus
from harnesses.wrap import AgentContext, FunctionHarness, WrappedAgentConfig, agent_harness

pytestmark = pytest.mark.timeout(300)


class AnswerFileReward:
    """Reward 1 when the agent left ``answer.txt`` saying 42 in its workspace."""

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        try:
            text = (await agent_sandbox.read_file("answer.txt")).decode()
        except FileNotFoundError:
            return RewardResult(reward=0.0, log="no answer.txt")
        return RewardResult(reward=float(text.strip() == "42"), log=f"answer.txt: {text.strip()!r}")


# The user's agent: ordinary OpenAI / Anthropic SDK code plus the sandbox; nothing Rein-specific but `ctx`.
@agent_harness(name="answer-agent")
async def answer_agent(ctx: AgentContext) -> None:
    messages = [
        {"role": "system", "content": "Answer with a shell command."},
        {"role": "user", "content": ctx.task.problem_statement},
    ]
    first = await ctx.openai.chat.completions.create(model=ctx.model, messages=messages, max_tokens=64)
    command = first.choices[0].message.content or "true"
    result = await ctx.sandbox.exec(["bash", "-c", command])
    ctx.log(f"$ {command}\n{result.stdout}{result.stderr}")
    messages += [
        {"role": "assistant", "content": command},
        {"role": "user", "content": f"exit code {result.exit_code}. Anything else?"},
    ]
    second = await ctx.anthropic.messages.create(
        model=ctx.model, max_tokens=64, system=messages[0]["content"], messages=messages[1:]
    )
    ctx.metrics["num_commands"] = 1.0
    ctx.metrics["num_closing_words"] = float(len(second.content[0].text.split()))


async def test_custom_agent_becomes_a_trajectory(scripted_proxy, slugify_task, sandbox_pool, tokenizer):
    assert isinstance(answer_agent, FunctionHarness) and answer_agent.name == "answer-agent"
    policy_replies = iter(["echo 42 > answer.txt", "No, that is all."])
    async with scripted_proxy(lambda prompt: next(policy_replies, "done")) as proxy:
        runner = RolloutRunner(
            RolloutConfig(group_size=2, max_concurrency=1),
            harness=answer_agent,
            sandboxes=sandbox_pool,
            sessions=proxy.registry,
            proxy_url=proxy.url,
            grader=AnswerFileReward(),
        )
        first, second = await runner.run([slugify_task], step=3)
    assert first.status == TrajectoryStatus.OK, first.failure_reason
    assert first.reward == 1.0 and first.trainable
    assert first.harness == "answer-agent" and first.step == 3 and first.group_id == second.group_id
    assert first.metrics["num_commands"] == 1.0 and first.metrics["num_closing_words"] == 4.0
    assert first.metrics["agent_wall_time_s"] > 0
    # Both SDK calls landed in one session: two assistant turns, each sampled token under the loss mask.
    sampled = [tokenizer.decode(s.token_ids[s.loss_mask == 1].tolist()) for s in first.segments]
    assert "echo 42 > answer.txt" in "".join(sampled) and "No, that is all." in "".join(sampled)
    assert "$ echo 42 > answer.txt" in first.log and "answer.txt: '42'" in first.log
    # The second sample of the group got the fallback reply and wrote nothing useful: reward 0.
    assert second.status == TrajectoryStatus.OK and second.reward == 0.0


async def test_wrapper_classifies_how_the_agent_ended(scripted_proxy, slugify_task, sandbox_pool):
    from components.rollout.failures import TurnLimitReached

    async def out_of_turns(ctx: AgentContext) -> None:
        raise TurnLimitReached("used all 3 turns")

    async def slow(ctx: AgentContext) -> None:
        await ctx.sandbox.exec(["sleep", "20"], timeout_s=30)

    async def custom_status(ctx: AgentContext) -> HarnessOutcome:
        return HarnessOutcome(status="context_overflow", failure_reason="my agent stopped at its own budget")

    async def wrong_return(ctx: AgentContext) -> str:
        return "done"

    sandbox = await sandbox_pool.acquire(slugify_task.sandbox_spec())
    try:
        cases = {
            out_of_turns: ("turn_limit", "used all 3 turns"),
            slow: ("timeout", "ran past 1 s"),
            custom_status: ("context_overflow", "own budget"),
            wrong_return: ("agent_error", "'done'"),
        }
        for fn, (status, reason) in cases.items():
            harness = FunctionHarness(fn, name=fn.__name__, config=WrappedAgentConfig(wall_time_s=1))
            outcome = await harness.run(
                task=slugify_task, sandbox=sandbox, base_url="http://127.0.0.1:9/s/x", api_key="x"
            )
            assert (outcome.status, reason in outcome.failure_reason) == (status, True), outcome
    finally:
        await sandbox_pool.release(sandbox)
    with pytest.raises(ValueError, match="agent"):
        agent_harness(lambda ctx: None, name="sync")
