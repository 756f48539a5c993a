"""OpenAI Chat Completions through the proxy with the official ``openai`` SDK (real HTTP)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.components.proxy.proxy_helpers import (
    BASH_TOOL_OPENAI,
    assert_one_segment_record,
    reply_ids,
    streamed_tool_calls,
    tool_call_text,
)


def test_chat_completion_and_record(start_proxy, tokenizer):
    replies = ["Paris is the capital of France."]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session(task_id="t1")
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    response = client.chat.completions.create(
        model="gpt-4o",  # any name is accepted
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
        ],
        temperature=0.7,
        top_p=0.9,
        seed=3,
        max_tokens=64,
        parallel_tool_calls=False,
        metadata={"ignored": "yes"},
    )
    assert response.choices[0].message.content == replies[0]
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.prompt_tokens == len(proxy.engine.prompts[0])
    assert response.usage.completion_tokens == len(reply_ids(tokenizer, replies[0]))
    assert response.model == "gpt-4o"
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_chat_streaming_with_usage(start_proxy, tokenizer):
    replies = ["Streaming works fine."]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say something."}]}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == replies[0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(reply_ids(tokenizer, replies[0]))
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_tool_calls_over_three_turns_are_one_segment(start_proxy, tokenizer):
    replies = [
        tool_call_text("bash", {"cmd": "ls"}, prefix="Let me look."),
        tool_call_text("bash", {"cmd": "cat README.md"}),
        "The README says hello.",
    ]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    messages = [
        {"role": "system", "content": "You run commands."},
        {"role": "user", "content": "What is in README?"},
    ]
    tool_outputs = ["README.md\nsrc", "hello"]
    for turn in range(3):
        stream = turn == 1  # mix streaming and non-streaming turns in one session
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model="m", messages=messages, tools=[BASH_TOOL_OPENAI], stream=True
                )
            )
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            message = {
                "role": "assistant",
                "content": content or None,
                "tool_calls": streamed_tool_calls(chunks),
            }
        else:
            response = client.chat.completions.create(model="m", messages=messages, tools=[BASH_TOOL_OPENAI])
            finish = response.choices[0].finish_reason
            message = response.choices[0].message.model_dump(exclude_none=True)
        if turn < 2:
            assert finish == "tool_calls"
            assert message["tool_calls"][0]["function"]["name"] == "bash"
            messages.append(message)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": message["tool_calls"][0]["id"],
                    "content": tool_outputs[turn],
                }
            )
        else:
            assert finish == "stop"
            assert message["content"] == "The README says hello."
    first_call = proxy.engine.prompts[1]
    assert tokenizer.decode(first_call).count("<tool_response>") == 1
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_logprobs_when_asked(start_proxy, tokenizer):
    proxy = start_proxy(script=["one two"])
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    response = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count"}], logprobs=True, top_logprobs=2
    )
    entries = response.choices[0].logprobs.content
    assert len(entries) == len(reply_ids(tokenizer, "one two"))
    assert all(e.logprob == 0.0 for e in entries)
    assert "".join(e.token for e in entries[:-1]) == "one two"
    assert entries[0].top_logprobs[0].token == entries[0].token


def test_x_session_id_header_on_bare_path(start_proxy):
    proxy = start_proxy(script=["ok"])
    session_id = proxy.open_session()
    client = openai.OpenAI(
        base_url=proxy.url + "/v1", api_key="unused", default_headers={"X-Session-Id": session_id}
    )
    response = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert response.choices[0].message.content == "ok"
    assert proxy.describe(session_id).num_turns == 1


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown role 'wizard'"),
        ({"messages": "hello"}, "body.messages: expected an array"),
        ({"model": "m"}, "body.messages: missing"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "only n=1"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "body.temperature"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
            "unknown tool call id 'call_9'",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "body.max_tokens: must be >= 1"),
    ],
)
def test_bad_input_is_a_400_naming_the_problem(start_proxy, body, needle):
    proxy = start_proxy()
    session_id = proxy.open_session()
    response = httpx.post(f"{proxy.session_url(session_id)}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"]


def test_malformed_json_and_unknown_session(start_proxy):
    proxy = start_proxy()
    session_id = proxy.open_session()
    response = httpx.post(
        f"{proxy.session_url(session_id)}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]["message"]
    client = openai.OpenAI(
        base_url=proxy.session_url("no-such-session") + "/v1", api_key="unused", max_retries=0
    )
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "POST /sessions" in str(caught.value)
