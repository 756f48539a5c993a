"""The relative judge: scores come out as the judge ranked them, malformed replies are retried and then become
grading errors, verdicts are cached and accounted, and the judge's calls never enter a policy trajectory.

The OpenAI-compatible judge is a real HTTP server on loopback spoken to by the official ``openai`` SDK; the
engine judge is a ``ScriptedEngine`` called with real chat-template token ids; the runner test drives real
rollouts through a real proxy and real bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import uuid
from collections.abc import Callable

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from components.engine.scripted import ScriptedEngine
from components.protocols import RewardResult, Sandbox, Task
from components.rewards import (
    EngineJudgeClient,
    JudgeConfig,
    JudgeError,
    OpenAIJudgeClient,
    RelativeJudge,
    RewardWeights,
    parse_scores,
)
from components.rollout import RolloutConfig, RolloutRunner
from components.trajectory import Trajectory, TrajectoryStatus
from harnesses.wrap import AgentContext, agent_harness

pytestmark = pytest.mark.timeout(120)

RUBRIC = "Reward runs that fix the bug; more FIXED markers mean a better run."


def _trajectory(text: str, *, status: TrajectoryStatus = TrajectoryStatus.OK, reward: float | None = 0.0):
    return Trajectory(
        trajectory_id=uuid.uuid4().hex,
        group_id="g",
        task_id="t",
        harness="h",
        status=status,
        failure_reason="" if status == TrajectoryStatus.OK else "broke",
        reward=reward,
        messages_json=json.dumps(
            [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": text}]
        ),
    )


class _Task:
    task_id = "t"
    problem_statement = "Fix the bug in slugify."

    def sandbox_spec(self):  # pragma: no cover - never called by the judge
        raise NotImplementedError


def ranking_reply(prompt: str) -> str:
    """A deterministic judge: each trajectory's score is its share of FIXED markers (more = better)."""
    sections = re.split(r"# Trajectory (\d+)\n", prompt)[1:]
    counts = {
        int(number): body.split("Answer with JSON only")[0].count("FIXED")
        for number, body in zip(sections[::2], sections[1::2], strict=True)
    }
    top = max(counts.values()) or 1
    scores = [{"trajectory": n, "explanation": "counted", "score": counts[n] / top} for n in sorted(counts)]
    return "Here is my verdict:\n```json\n" + json.dumps({"scores": scores}) + "\n```"


@contextlib.asynccontextmanager
async def judge_server(reply: Callable[[str, int], str | int]):
    """A real OpenAI-compatible chat endpoint on loopback; ``reply(prompt, call_index)`` gives the text, or an
    HTTP status code to fail with. Yields the list of received request bodies."""
    app = FastAPI()
    received: list[dict] = []

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        received.append(body)
        prompt = "\n".join(str(m["content"]) for m in body["messages"])
        text = reply(prompt, len(received) - 1)
        if isinstance(text, int):
            return JSONResponse({"error": {"message": "judge overloaded"}}, status_code=text)
        return {
            "id": "chatcmpl-judge",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": len(prompt) // 4,
                "completion_tokens": len(text) // 4,
                "total_tokens": 0,
            },
        }

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1", received
    finally:
        server.should_exit = True
        await serving


def test_parse_scores_accepts_exactly_one_valid_score_per_trajectory():
    text = 'ok ```json\n{"scores": [{"trajectory": 2, "score": 0.25}, {"trajectory": 1, "score": 1}]}\n```'
    assert parse_scores(text, 2) == [1.0, 0.25]
    bad = {
        "no json here": "no JSON object",
        '{"scores": [{"trajectory": 1, "score": 1.5}]}': "not a number in [0, 1]",
        '{"scores": [{"trajectory": 1, "score": true}]}': "not a number in [0, 1]",
        '{"scores": [{"trajectory": 3, "score": 0.5}]}': "not one of 1..2",
        '{"scores": [{"trajectory": 1, "score": 0.5}, {"trajectory": 1, "score": 0.5}]}': "scored twice",
        '{"scores": [{"trajectory": 1, "score": 0.5}]}': "have no score",
        '{"verdict": 1}': 'no "scores" list',
        '{"scores": [1, 2}': "does not parse",
    }
    for reply, message in bad.items():
        with pytest.raises(JudgeError, match=re.escape(message)):
            parse_scores(reply, 2)


async def test_openai_judge_ranks_the_group_caches_and_accounts():
    group = [_trajectory("tried FIXED"), _trajectory("FIXED FIXED FIXED FIXED"), _trajectory("gave up")]
    async with judge_server(lambda prompt, _: ranking_reply(prompt)) as (url, received):
        judge = RelativeJudge(
            JudgeConfig(rubric=RUBRIC, usd_per_million_input_tokens=3.0, usd_per_million_output_tokens=15.0),
            OpenAIJudgeClient(base_url=url, model="judge-model"),
        )
        results = await judge.score_group(_Task(), group)
        assert [r.reward for r in results] == [0.25, 1.0, 0.0]
        assert len(received) == 1 and received[0]["model"] == "judge-model"
        assert RUBRIC in received[0]["messages"][1]["content"]  # the rubric and all three runs in one call
        again = await judge.score_group(_Task(), group)
        assert [r.reward for r in again] == [0.25, 1.0, 0.0]
        assert len(received) == 1  # served from the cache
    metrics = judge.metrics
    assert metrics["judge_calls"] == 1 and metrics["judge_cache_hits"] == 1
    assert metrics["judge_input_tokens"] > 0 and metrics["judge_output_tokens"] > 0
    expected_cost = (metrics["judge_input_tokens"] * 3.0 + metrics["judge_output_tokens"] * 15.0) / 1e6
    assert metrics["judge_cost_usd"] == pytest.approx(expected_cost)


async def test_malformed_reply_is_retried_with_the_error_shown_then_accepted():
    def reply(prompt: str, call: int) -> str | int:
        return "I think the second one is best." if call == 0 else ranking_reply(prompt)

    group = [_trajectory("nothing"), _trajectory("FIXED")]
    async with judge_server(reply) as (url, received):
        judge = RelativeJudge(JudgeConfig(rubric=RUBRIC), OpenAIJudgeClient(base_url=url, model="j"))
        results = await judge.score_group(_Task(), group)
    assert [r.reward for r in results] == [0.0, 1.0]
    assert len(received) == 2
    assert "unusable" in received[1]["messages"][-1]["content"]  # the retry tells the judge what was wrong
    assert judge.metrics["judge_failed_calls"] == 1


@pytest.mark.parametrize("failure", ["malformed", "http_500"])
async def test_a_judge_that_keeps_failing_yields_grading_errors_not_zeros(failure):
    def reply(prompt: str, call: int) -> str | int:
        return 500 if failure == "http_500" else '{"scores": "all good"}'

    async with judge_server(reply) as (url, received):
        judge = RelativeJudge(
            JudgeConfig(rubric=RUBRIC, max_attempts=3), OpenAIJudgeClient(base_url=url, model="j")
        )
        results = await judge.score_group(_Task(), [_trajectory("a"), _trajectory("b")])
    assert all(r.reward is None and "no usable verdict in 3 attempts" in r.error for r in results)
    assert len(received) >= 3
    assert judge.metrics["judge_failed_calls"] == 3


async def test_engine_judge_scores_through_the_chat_template(tokenizer):
    engine = ScriptedEngine(tokenizer, ranking_reply)
    judge = RelativeJudge(JudgeConfig(rubric=RUBRIC), EngineJudgeClient(engine, tokenizer))
    results = await judge.score_group(_Task(), [_trajectory("FIXED FIXED"), _trajectory("FIXED")])
    assert [r.reward for r in results] == [1.0, 0.5]
    prompt = tokenizer.decode(list(engine.prompts[0]))
    assert "<|im_start|>system" in prompt and RUBRIC in prompt  # rendered by the model's own chat template
    assert judge.metrics["judge_input_tokens"] == len(engine.prompts[0])


class ConstantReward:
    """A verifiable reward that gives every finished rollout 1.0."""

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        return RewardResult(reward=1.0, log="constant")


@agent_harness(name="marker-agent")
async def marker_agent(ctx: AgentContext) -> None:
    """Asks the policy once; the scripted policy answers with some FIXED markers."""
    await ctx.openai.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": ctx.task.problem_statement}], max_tokens=32
    )


@pytest.mark.slow
async def test_runner_combines_group_rewards_and_never_records_the_judges_calls(
    scripted_proxy, builtin_tasks, sandbox_pool, tokenizer
):
    replies = iter(["FIXED", "FIXED FIXED FIXED FIXED", "nothing", "FIXED FIXED"])

    def policy_or_judge(prompt: str) -> str:
        return ranking_reply(prompt) if "# Rubric" in prompt else next(replies)

    task = builtin_tasks["minilib-text-slugify-edges"]
    async with scripted_proxy(policy_or_judge) as proxy:
        # The judge runs on the very engine that serves the policy: had its calls gone through the proxy, they
        # would have opened sessions and been recorded.
        judge = RelativeJudge(JudgeConfig(rubric=RUBRIC), EngineJudgeClient(proxy.engine, tokenizer))
        runner = RolloutRunner(
            RolloutConfig(group_size=4, max_concurrency=1),
            harness=marker_agent,
            sandboxes=sandbox_pool,
            sessions=proxy.registry,
            proxy_url=proxy.url,
            grader=ConstantReward(),
            group_reward=judge,
            reward_weights=RewardWeights(verifiable=0.5, group=1.0),
        )
        trajectories = await runner.run([task], step=0)
        assert proxy.registry.num_open_sessions == 0
    assert [t.status for t in trajectories] == [TrajectoryStatus.OK] * 4
    judged = [t.metrics["group_reward"] for t in trajectories]
    assert judged == [0.25, 1.0, 0.0, 0.5]  # the judge's ranking of the four policy replies
    assert [t.reward for t in trajectories] == [0.5 + score for score in judged]
    assert all(t.metrics["verifiable_reward"] == 1.0 for t in trajectories)
    assert judge.metrics["judge_calls"] == 1
    for trajectory in trajectories:
        assert len(trajectory.segments) == 1  # only the policy's own turn
        decoded = tokenizer.decode(trajectory.segments[0].token_ids.tolist())
        assert "# Rubric" not in decoded and "# Rubric" not in trajectory.messages_json
