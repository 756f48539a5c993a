"""Parsing what the model wrote: Hermes-style tool calls, reasoning, malformed blocks."""

from __future__ import annotations

import json

from components.tito.messages import ToolCall
from components.tito.tool_calls import assistant_text, canonical_arguments, parse_assistant_text


def test_tool_calls_are_parsed_and_removed_from_content():
    text = (
        'Looking.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"a.py\\"}"}</tool_call>'
    )
    parsed = parse_assistant_text(text, id_seed="s")
    assert parsed.content == "Looking."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("bash", {"cmd": "ls -la"}),
        ("read_file", {"path": "a.py"}),
    ]
    assert len({c.id for c in parsed.tool_calls}) == 2
    assert parse_assistant_text(text, id_seed="s") == parsed  # deterministic ids


def test_malformed_tool_calls_stay_plain_content():
    for body in (
        '{"name": "bash", "arguments": {"cmd": "ls"}',
        '{"arguments": {}}',
        "[1, 2]",
        '{"name": "x", "arguments": 3}',
    ):
        text = f"Try:\n<tool_call>\n{body}\n</tool_call>"
        parsed = parse_assistant_text(text)
        assert parsed.tool_calls == () and parsed.content == text
    unclosed = 'Now <tool_call>\n{"name": "bash", "arguments": {"cmd"'
    assert parse_assistant_text(unclosed).content == unclosed


def test_reasoning_is_split_off():
    parsed = parse_assistant_text("<think>\nplan it\n</think>\n\nAnswer.")
    assert (parsed.reasoning, parsed.content) == ("plan it", "Answer.")
    # The generation prompt may have opened <think> already.
    assert parse_assistant_text("plan\n</think>\nAnswer.").reasoning == "plan"
    assert parse_assistant_text("Just an answer.").reasoning is None


def test_rendered_tool_calls_parse_back_to_the_same_calls():
    calls = (ToolCall(id="a", name="bash", arguments='{"cmd": "echo \\"hi\\"", "n": [1, 2]}'),)
    parsed = parse_assistant_text(assistant_text("Running.", calls))
    assert parsed.content == "Running."
    assert [canonical_arguments(c.arguments) for c in parsed.tool_calls] == [
        canonical_arguments(calls[0].arguments)
    ]
    assert canonical_arguments('{"b": 1, "a": 2}') == canonical_arguments('{"a":2,"b":1}')
