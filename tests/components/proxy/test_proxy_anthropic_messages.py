"""Anthropic Messages through the proxy with the official ``anthropic`` SDK, the way Claude Code uses it."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.components.proxy.proxy_helpers import assert_one_segment_record, reply_ids, tool_call_text

READ_TOOL = {
    "name": "Read",
    "description": "Read a file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "cache_control": {"type": "ephemeral"},
}
CLAUDE_CODE_HEADERS = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}


def _client(proxy, session_id: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=proxy.session_url(session_id),
        api_key="unused",
        default_headers=CLAUDE_CODE_HEADERS,
        max_retries=0,
    )


def test_messages_non_streaming(start_proxy, tokenizer):
    replies = ["Hello, I am the policy."]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    message = _client(proxy, session_id).messages.create(
        model="claude-opus-4-8",
        max_tokens=256,
        system=[{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "someone"},
        extra_query={"beta": "true"},
    )
    assert message.content[0].type == "text" and message.content[0].text == replies[0]
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == len(reply_ids(tokenizer, replies[0]))
    assert message.usage.input_tokens == len(proxy.engine.prompts[0])
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_messages_tool_use_round_trips_streaming(start_proxy, tokenizer):
    replies = [
        tool_call_text("Read", {"path": "a.py"}, prefix="I will read it."),
        tool_call_text("Read", {"path": "b.py"}),
        "Both files are empty.",
    ]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = _client(proxy, session_id)
    messages = [{"role": "user", "content": "Read a.py and b.py"}]
    tool_results = [
        {"content": "", "is_error": False},
        {"content": [{"type": "text", "text": "no such file"}], "is_error": True},
    ]
    for turn in range(3):
        with client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=512,
            system="You are a coder.",
            messages=messages,
            tools=[READ_TOOL],
        ) as stream:
            final = stream.get_final_message()
        if turn < 2:
            assert final.stop_reason == "tool_use"
            tool_use = [block for block in final.content if block.type == "tool_use"]
            assert len(tool_use) == 1 and tool_use[0].name == "Read"
            assert tool_use[0].input == {"path": ["a.py", "b.py"][turn]}
            messages.append({"role": "assistant", "content": [block.model_dump() for block in final.content]})
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": tool_use[0].id, **tool_results[turn]}],
                }
            )
        else:
            assert final.stop_reason == "end_turn"
            assert final.content[0].text == "Both files are empty."
    assert "Error: no such file" in tokenizer.decode(proxy.engine.prompts[2])
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_messages_raw_stream_event_order(start_proxy):
    proxy = start_proxy(script=[tool_call_text("Read", {"path": "x"}, prefix="ok")])
    session_id = proxy.open_session()
    events = list(
        _client(proxy, session_id).messages.create(
            model="m",
            max_tokens=64,
            messages=[{"role": "user", "content": "go"}],
            tools=[READ_TOOL],
            stream=True,
        )
    )
    types = [e.type for e in events]
    num_json = types.count("content_block_delta") - 1  # the tool_use block's input as its tokens wrote it
    assert num_json > 1
    assert types == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        *["content_block_delta"] * num_json,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[4].content_block.type == "tool_use"
    assert all(e.delta.type == "input_json_delta" for e in events[5 : 5 + num_json])
    assert json.loads("".join(e.delta.partial_json for e in events[5 : 5 + num_json])) == {"path": "x"}
    assert events[-2].delta.stop_reason == "tool_use"


def test_count_tokens(start_proxy):
    proxy = start_proxy()
    session_id = proxy.open_session()
    client = _client(proxy, session_id)
    request = {"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "Count me"}]}
    counted = client.messages.count_tokens(**request)
    client.messages.create(max_tokens=16, **request)
    assert counted.input_tokens == len(proxy.engine.prompts[0])


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "unknown role 'tool'"),
        ({"max_tokens": 5, "messages": [{"role": "user"}]}, "messages[0].content: missing"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
            "type: missing",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}],
            },
            "unknown tool call id 't9'",
        ),
        ({"max_tokens": "many", "messages": [{"role": "user", "content": "x"}]}, "body.max_tokens"),
    ],
)
def test_bad_input_is_an_anthropic_400(start_proxy, body, needle):
    proxy = start_proxy()
    session_id = proxy.open_session()
    response = httpx.post(f"{proxy.session_url(session_id)}/v1/messages?beta=true", json=body)
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    assert needle in payload["error"]["message"]


def test_unknown_session_is_an_anthropic_404(start_proxy):
    proxy = start_proxy()
    with pytest.raises(anthropic.NotFoundError) as caught:
        _client(proxy, "missing").messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["type"] == "error"
    assert "POST /sessions" in caught.value.body["error"]["message"]
