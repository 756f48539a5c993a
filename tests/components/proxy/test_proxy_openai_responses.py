"""OpenAI Responses API through the proxy with the official ``openai`` SDK, the way Codex uses it."""

from __future__ import annotations

import httpx
import openai

from tests.components.proxy.proxy_helpers import assert_one_segment_record, reply_ids, tool_call_text

SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "strict": False,
}


def test_responses_streaming_with_tool_round_trip(start_proxy, tokenizer):
    replies = [tool_call_text("shell", {"command": "ls"}, prefix="Listing files."), "There are two files."]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    tools = [SHELL_TOOL, {"type": "web_search"}]  # non-function tools are ignored
    input_items = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Use the shell."}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "What files are here?"}],
        },
    ]
    with client.responses.stream(
        model="gpt-5-codex",
        instructions="You are Codex.",
        input=input_items,
        tools=tools,
        reasoning={"effort": "high"},
    ) as stream:
        events = list(stream)
        first = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for expected in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert expected in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert first.output_text == "Listing files."
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "shell" and calls[0].arguments == '{"command": "ls"}'
    assert first.usage.output_tokens == len(reply_ids(tokenizer, replies[0]))

    # Codex sends back the whole history: the assistant message, the function call and its output.
    input_items += [item.model_dump(exclude_none=True) for item in first.output]
    input_items.append(
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.txt\nb.txt"}
    )
    with client.responses.stream(
        model="gpt-5-codex", instructions="You are Codex.", input=input_items, tools=tools
    ) as stream:
        second = stream.get_final_response()
    assert second.output_text == "There are two files."
    assert second.status == "completed"
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_responses_non_streaming_string_input(start_proxy, tokenizer):
    proxy = start_proxy(script=["Hi there."])
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    response = client.responses.create(model="m", input="Hello", max_output_tokens=3)
    assert response.status == "incomplete"  # the 4-token reply was cut at 3
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.output_text == tokenizer.decode(reply_ids(tokenizer, "Hi there.")[:3])


def test_responses_bad_input(start_proxy):
    proxy = start_proxy()
    session_id = proxy.open_session()
    url = f"{proxy.session_url(session_id)}/v1/responses"
    cases = [
        ({"model": "m"}, "body.input: missing"),
        ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "unknown role 'robot'"),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "unknown tool call id",
        ),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id: missing"),
    ]
    for body, needle in cases:
        response = httpx.post(url, json=body)
        assert response.status_code == 400, (body, response.text)
        assert needle in response.json()["error"]["message"], (body, response.text)


SPAWN_NAMESPACE = {  # the shape Codex sends its sub-agent tools in (``[features] multi_agent``)
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Spawn a sub-agent.",
            "parameters": {"type": "object", "properties": {"message": {"type": "string"}}},
            "strict": False,
        },
        {"type": "custom", "name": "freeform", "description": "A freeform tool."},  # skipped, as at top level
    ],
}


def test_responses_namespace_tools_round_trip(start_proxy, tokenizer):
    """A namespaced function is the policy's tool ``namespace.name``: the prompt shows it so, the policy's call
    goes out as ``name`` with its ``namespace``, and the call sent back with its namespace extends the record."""
    spawn = tool_call_text("multi_agent_v1.spawn_agent", {"message": "Count the files."})
    replies = [spawn, "Done."]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    tools = [SHELL_TOOL, SPAWN_NAMESPACE]
    input_items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}]
    with client.responses.stream(model="m", input=input_items, tools=tools) as stream:
        first = stream.get_final_response()
    prompt = tokenizer.decode(proxy.engine.prompts[0])
    assert '"name": "multi_agent_v1.spawn_agent"' in prompt and '"name": "shell"' in prompt
    assert "freeform" not in prompt
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.namespace, c.name) for c in calls] == [("multi_agent_v1", "spawn_agent")]
    assert [(t.type, t.name) for t in first.tools] == [("function", "shell"), ("namespace", "multi_agent_v1")]
    assert [t.name for t in first.tools[1].tools] == ["spawn_agent"]

    input_items += [item.model_dump(exclude_none=True) for item in first.output]
    input_items.append(
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"agent_id": "a"}'}
    )
    second = client.responses.create(model="m", input=input_items, tools=tools)
    assert second.output_text == "Done."
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)
