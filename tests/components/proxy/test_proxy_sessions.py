"""Session control (HTTP and Python API), recording into the TrajectoryStore, context overflow, keep-alives,
the API key, and the scripted engines themselves."""

from __future__ import annotations

import asyncio

import anthropic
import httpx
import openai
import pytest

from components.engine.scripted import EchoEngine, ScriptedEngine
from components.errors import ContextOverflowError
from components.protocols import (
    FinishReason,
    InferenceEngine,
    SamplingParams,
    SessionDescription,
    SessionOpen,
    SessionOutcome,
)
from components.proxy.errors import InvalidRequestError, SessionNotFoundError
from components.proxy.sessions import LocalSessionRegistry, TurnRequest
from components.tito.messages import ChatMessage
from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.components.proxy.proxy_helpers import DelayedEngine, reply_ids


def test_http_session_lifecycle_writes_trajectory(start_proxy, tokenizer, tmp_path):
    proxy = start_proxy(script=["Done."], run_dir=tmp_path)
    created = httpx.post(
        f"{proxy.url}/sessions", json={"task_id": "task-7", "group_id": "g1", "harness": "h", "step": 3}
    )
    assert created.status_code == 200
    session = created.json()
    assert session["base_url"] == f"{proxy.url}/s/{session['session_id']}"
    client = openai.OpenAI(base_url=session["base_url"] + "/v1", api_key="unused")
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "do it"}])
    record = httpx.get(f"{session['base_url']}/trajectory").json()
    assert record["num_turns"] == 1 and record["num_segments"] == 1
    assert list(record) == [  # the HTTP body of a SessionDescription, field by field
        *("session_id", "policy", "status", "num_turns", "num_engine_errors", "num_malformed_tool_calls"),
        *("tool_format", "reasoning_format", "last_engine_error", "num_segments", "segments"),
    ]
    assert SessionDescription.from_json(record) == proxy.describe(session["session_id"])
    finalized = httpx.post(
        f"{session['base_url']}/finalize", json={"reward": 1.0, "metrics": {"num_steps": 1}, "log": "fine"}
    )
    assert finalized.status_code == 200, finalized.text
    body = finalized.json()
    assert (
        body["status"] == "ok" and body["reward"] == 1.0 and body["task_id"] == "task-7" and body["step"] == 3
    )
    assert body["messages"][-1] == {"role": "assistant", "content": "Done."}
    stored = TrajectoryStore(tmp_path).read_all().trajectories
    assert len(stored) == 1
    assert stored[0].trajectory_id == session["session_id"] and stored[0].group_id == "g1"
    assert stored[0].segments[0].token_ids.tolist() == record["segments"][0]["token_ids"]
    assert stored[0].trainable
    # A finalized session is gone; its id cannot be reused.
    again = client.chat.completions.with_raw_response
    with pytest.raises(openai.NotFoundError, match="already finalized"):
        again.create(model="m", messages=[{"role": "user", "content": "more"}])
    assert httpx.post(f"{proxy.url}/sessions", json={"session_id": session["session_id"]}).status_code == 400


def test_discard_and_bad_finalize(start_proxy, tmp_path):
    proxy = start_proxy(run_dir=tmp_path)
    session_id = proxy.open_session()
    bad = httpx.post(f"{proxy.session_url(session_id)}/finalize", json={"status": "great"})
    assert bad.status_code == 400 and "status" in bad.json()["error"]["message"]
    bad = httpx.post(f"{proxy.session_url(session_id)}/finalize", json={"reward": "high"})
    assert bad.status_code == 400 and "body.reward" in bad.json()["error"]["message"]
    assert httpx.post(f"{proxy.session_url(session_id)}/discard").json() == {
        "session_id": session_id,
        "discarded": True,
    }
    assert httpx.get(f"{proxy.session_url(session_id)}/trajectory").status_code == 404
    assert TrajectoryStore(tmp_path).read_all().trajectories == []


async def test_python_registry_api(tokenizer, tmp_path):
    from components.proxy.config import ProxyConfig

    engine = ScriptedEngine(tokenizer, ["first", "second"])
    registry = LocalSessionRegistry(engine, tokenizer, ProxyConfig(run_dir=tmp_path, default_max_tokens=32))
    session_id = await registry.open_session(SessionOpen(task_id="t", group_id="g", harness="white-box"))
    messages = (ChatMessage(role="user", content="hello"),)
    outcome = await registry.run_turn(session_id, TurnRequest(messages=messages))
    assert outcome.reply.content == "first" and outcome.reply.finish_reason == "stop"
    follow_up = (*messages, outcome.reply.to_message(), ChatMessage(role="user", content="again"))
    outcome = await registry.run_turn(session_id, TurnRequest(messages=follow_up, temperature=0.0))
    assert outcome.reply.content == "second"
    with pytest.raises(InvalidRequestError, match="unknown tool call id"):
        await registry.run_turn(
            session_id, TurnRequest(messages=(ChatMessage(role="tool", content="x", tool_call_id="c1"),))
        )
    side_request = (
        ChatMessage(role="system", content="Write a title."),
        ChatMessage(role="user", content="hello"),
    )
    await registry.run_turn(session_id, TurnRequest(messages=side_request))  # e.g. a harness's title request
    trajectory = await registry.finalize(
        session_id, SessionOutcome(reward=0.5, status="timeout", failure_reason="ran out of time")
    )
    assert trajectory.status == TrajectoryStatus.TIMEOUT and trajectory.trainable
    assert [s.reason.value for s in trajectory.segments] == ["start", "system_changed"]
    assert trajectory.segments[0].num_sampled_tokens == len(reply_ids(tokenizer, "first")) + len(
        reply_ids(tokenizer, "second")
    )
    # The viewer's conversation is the main one, not the later side request.
    assert [m["role"] for m in trajectory.messages] == ["user", "assistant", "user", "assistant"]
    assert trajectory.messages[-1]["content"] == "second"
    with pytest.raises(SessionNotFoundError):
        await registry.discard(session_id)
    assert len(TrajectoryStore(tmp_path).read_all().trajectories) == 1


def test_context_overflow_is_413_and_keeps_a_trainable_record(start_proxy, tokenizer, tmp_path):
    engine = ScriptedEngine(tokenizer, ["short answer"], context_window=200)
    proxy = start_proxy(engine, run_dir=tmp_path)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="m", messages=messages)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "word " * 300},
    ]
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="m", messages=messages)
    assert caught.value.status_code == 413
    assert caught.value.body["type"] == "context_overflow"
    anthropic_client = anthropic.Anthropic(base_url=proxy.session_url(session_id), api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as caught_anthropic:
        anthropic_client.messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "word " * 300}], stream=True
        )
    assert caught_anthropic.value.status_code == 413
    assert caught_anthropic.value.body == {
        "type": "error",
        "error": {"type": "context_overflow", "message": caught_anthropic.value.body["error"]["message"]},
    }
    assert proxy.describe(session_id).status == "context_overflow"
    body = httpx.post(f"{proxy.session_url(session_id)}/finalize", json={"reward": 0.0}).json()
    assert body["status"] == "context_overflow" and "context window" in body["failure_reason"]
    (trajectory,) = TrajectoryStore(tmp_path).read_all().trajectories
    assert trajectory.trainable and trajectory.segments[0].num_sampled_tokens == len(
        reply_ids(tokenizer, "short answer")
    )


def test_keepalive_frames_while_the_engine_works(start_proxy, tokenizer):
    engine = DelayedEngine(ScriptedEngine(tokenizer, ["slow reply"]), delay_s=0.6)
    proxy = start_proxy(engine, keepalive_interval_s=0.1)
    session_id = proxy.open_session()
    base = proxy.session_url(session_id)
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "stream": True},
    ) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    assert lines.count(": keep-alive") >= 3
    assert [line for line in lines if line][-1] == "data: [DONE]"
    # The official SDK reads through Anthropic pings, and records the turn in the same session.
    client = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    with httpx.stream(
        "POST",
        f"{base}/v1/messages",
        json={"max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ) as response:
        raw = response.read().decode()
    assert raw.count("event: ping") >= 3 and raw.index("event: ping") < raw.index("event: message_start")
    with client.messages.stream(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert stream.get_final_message().content[0].text == "slow reply"


def test_engine_failure_after_stream_start_is_an_in_stream_error(start_proxy, tokenizer):
    class FailingEngine(DelayedEngine):
        async def generate(self, input_ids, params):
            await asyncio.sleep(self.delay_s)
            raise RuntimeError("GPU on fire")

    proxy = start_proxy(
        FailingEngine(ScriptedEngine(tokenizer, ["x"]), delay_s=0.3), keepalive_interval_s=0.05
    )
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIError, match="GPU on fire"):
        list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    response = httpx.post(
        f"{proxy.session_url(session_id)}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 500 and "GPU on fire" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("raised", "status", "num_engine_errors"),
    [(ValueError("top_p refused by this engine"), 400, 0), (RuntimeError("GPU on fire"), 500, 1)],
)
def test_only_engine_failures_count_as_engine_errors(
    start_proxy, tokenizer, raised, status, num_engine_errors
):
    """A request the engine refuses (bad parameters) is the client's error; the runner must not read it as an
    engine failure (which would turn the agent's own mistake into an untrainable engine_error)."""

    class RaisingEngine(DelayedEngine):
        async def generate(self, input_ids, params):
            raise raised

    proxy = start_proxy(RaisingEngine(ScriptedEngine(tokenizer, ["x"]), delay_s=0.0))
    session_id = proxy.open_session()
    response = httpx.post(
        f"{proxy.session_url(session_id)}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == status and str(raised) in response.json()["error"]["message"]
    assert proxy.describe(session_id).num_engine_errors == num_engine_errors


def test_api_key(start_proxy):
    proxy = start_proxy(script=["ok"], api_key="sekret")
    assert httpx.post(f"{proxy.url}/sessions").status_code == 401
    session_id = httpx.post(f"{proxy.url}/sessions", headers={"Authorization": "Bearer sekret"}).json()[
        "session_id"
    ]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=proxy.session_url(session_id) + "/v1", api_key="wrong", max_retries=0
        ).models.list()
    openai_client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="sekret")
    assert openai_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}]
    ).choices
    anthropic_client = anthropic.Anthropic(base_url=proxy.session_url(session_id), api_key="sekret")
    assert anthropic_client.messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
    ).content
    assert httpx.get(f"{proxy.url}/health").json() == {"status": "ok"}


def test_models_and_unknown_routes(start_proxy):
    proxy = start_proxy(served_model_name="policy-x")
    models = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == ["policy-x"]
    missing = httpx.get(f"{proxy.url}/v2/nothing")
    assert missing.status_code == 404 and "/s/{session_id}/v1/" in missing.json()["error"]["message"]
    assert httpx.get(f"{proxy.url}/v1/chat/completions").status_code == 405


async def test_scripted_and_echo_engines_honour_the_contract(tokenizer):
    scripted = ScriptedEngine(tokenizer, ["abc def", "xyz"], context_window=50)
    echo = EchoEngine(eos_token_id=2, reply_ids=(5, 6, 7), context_window=50)
    for engine in (scripted, echo):
        assert isinstance(engine, InferenceEngine)
        with pytest.raises(ContextOverflowError):
            await engine.generate(list(range(50)), SamplingParams())
        clamped = await engine.generate(list(range(48)), SamplingParams(max_tokens=10))
        assert len(clamped.output_ids) == 2 and clamped.finish_reason == FinishReason.LENGTH
        await engine.update_weights({}, version=4)
        assert (await engine.generate([1], SamplingParams())).weight_versions[0] == 4
    result = await echo.generate([1, 2], SamplingParams())
    assert result.output_ids == (5, 6, 7, 2) and result.logprobs == (0.0,) * 4
    assert result.finish_reason == FinishReason.STOP
    fresh = ScriptedEngine(tokenizer, ["abc def", "xyz"])
    assert (await fresh.generate([1], SamplingParams())).output_ids == tuple(reply_ids(tokenizer, "abc def"))
    assert (await fresh.generate([1], SamplingParams())).output_ids == tuple(reply_ids(tokenizer, "xyz"))
    assert (await fresh.generate([1], SamplingParams())).output_ids == tuple(reply_ids(tokenizer, "xyz"))
    by_prompt = ScriptedEngine(tokenizer, lambda prompt: prompt[-3:])
    assert (
        tokenizer.decode(
            (await by_prompt.generate(tokenizer.encode("hello"), SamplingParams())).output_ids[:-1]
        )
        == "llo"
    )


def test_budget_cuts_by_the_proxy_are_reported_as_stops(start_proxy, tokenizer):
    proxy = start_proxy(script=["one two three four five six"], max_completion_tokens=3, default_max_tokens=2)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    ask = [{"role": "user", "content": "count"}]
    capped = client.chat.completions.create(model="m", messages=ask, max_tokens=100)  # cut by the proxy's cap
    assert capped.choices[0].finish_reason == "stop" and capped.usage.completion_tokens == 3
    defaulted = client.chat.completions.create(model="m", messages=ask)  # cut by the proxy's default budget
    assert defaulted.choices[0].finish_reason == "stop" and defaulted.usage.completion_tokens == 2
    own = client.chat.completions.create(
        model="m", messages=ask, max_tokens=3
    )  # cut by the client's own budget
    assert own.choices[0].finish_reason == "length"
    message = anthropic.Anthropic(base_url=proxy.session_url(session_id), api_key="x").messages.create(
        model="m", max_tokens=10000, messages=ask
    )
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 3


@pytest.mark.parametrize("max_calls", [2, 0])
def test_a_sessions_call_bound_refuses_the_next_call_in_each_protocols_shape(
    start_proxy, tmp_path, max_calls
):
    """``max_calls`` (the turn bound of agents without their own): the proxy answers that many model calls,
    then refuses each further one with a 400 in the protocol's own error shape, and the session ends as
    ``turn_limit`` with the answered calls recorded. Weakened (``max_calls`` 0, no bound): the calls go on."""
    proxy = start_proxy(script=["Done."], run_dir=tmp_path)
    session = httpx.post(f"{proxy.url}/sessions", json={"task_id": "t", "max_calls": max_calls}).json()
    chat = openai.OpenAI(base_url=session["base_url"] + "/v1", api_key="unused", max_retries=0)
    messages = anthropic.Anthropic(base_url=session["base_url"], api_key="unused", max_retries=0)
    history = [{"role": "user", "content": "go on"}]
    for _ in range(2):
        chat.chat.completions.create(model="m", messages=history)
    if max_calls:
        with pytest.raises(openai.BadRequestError, match="bound of 2 model calls is reached") as refused:
            chat.chat.completions.create(model="m", messages=history)
        assert refused.value.body["type"] == "invalid_request_error"
        with pytest.raises(anthropic.BadRequestError, match="bound of 2 model calls") as refused_too:
            messages.messages.create(model="m", max_tokens=16, messages=history)
        assert refused_too.value.body == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": str(refused_too.value.body["error"]["message"]),
            },
        }
    else:
        chat.chat.completions.create(model="m", messages=history)
        messages.messages.create(model="m", max_tokens=16, messages=history)
    record = httpx.get(f"{session['base_url']}/trajectory").json()
    assert record["num_turns"] == (2 if max_calls else 4)
    assert record["status"] == ("turn_limit" if max_calls else "open")
    finalized = httpx.post(f"{session['base_url']}/finalize", json={"reward": 0.0}).json()
    assert finalized["status"] == ("turn_limit" if max_calls else "ok")
    negative = httpx.post(f"{proxy.url}/sessions", json={"max_calls": -1})
    assert negative.status_code == 400 and "max_calls" in negative.json()["error"]["message"], negative.text
