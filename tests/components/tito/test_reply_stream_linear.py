"""The streaming parser's work is linear in the reply: it parses the text again only when a marker arrives (or
for a few pieces after one), never at every token, and a long call's arguments stream piece by piece."""

from __future__ import annotations

import json

import pytest

from components.tito.formats import ReplyParser, reasoning_format_named, tool_format_named
from components.tito.messages import ToolCall, ToolSpec

TOOLS = (
    ToolSpec(
        name="write",
        parameters={"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}},
    ),
)


def _stream(name: str, text: str, piece: int = 4):
    parser = ReplyParser(tool_format_named(name), reasoning_format_named("think"))
    stream = parser.stream(TOOLS)
    deltas = []
    for start in range(0, len(text), piece):
        deltas += stream.feed(text[start : start + piece])
    deltas += stream.finish()
    return parser, stream, deltas


@pytest.mark.parametrize(
    "name", ["hermes", "qwen3_coder", "glm45", "kimi_k2", "deepseek_v3", "harmony", "mistral", "llama3_json"]
)
@pytest.mark.parametrize("size", [200, 4000])
def test_parse_work_does_not_grow_with_the_reply(name, size):
    fmt = tool_format_named(name)
    code = "".join(f'line {i}: é 中 "quoted" \n' for i in range(size // 8))
    call = ToolCall(
        id="functions.write:0", name="write", arguments=json.dumps({"path": "a.py", "text": code})
    )
    text = "<think>Plan the file.</think>" + fmt.render_calls(
        "I will write it." + " Words." * (size // 8), [call]
    )
    parser, stream, deltas = _stream(name, text)
    # a stream that parsed at every piece would parse len(text) / 4 times (hundreds to thousands)
    assert stream.num_parses <= 40, (stream.num_parses, len(text) // 4)
    whole = parser.parse(text, TOOLS)
    assert "".join(d.text for d in deltas if d.kind == "content") == whole.content
    [final] = [d for d in deltas if d.kind == "tool_call"]
    assert final.tool_call == whole.tool_calls[0]
    pieces = [d.text for d in deltas if d.kind == "tool_call_arguments"]
    assert "".join(final.argument_pieces) == whole.tool_calls[0].arguments
    assert len(pieces) > len(text) // 4 // 3 and final.argument_pieces[: len(pieces)] == tuple(pieces)


def test_a_weakened_stream_that_parses_at_every_piece_is_caught():
    """The bound above lands on the old behaviour: parsing at every piece (``_mode`` pinned to ``parse``)."""
    fmt = tool_format_named("hermes")
    call = ToolCall(id="", name="write", arguments=json.dumps({"text": "x" * 4000}))
    parser = ReplyParser(fmt, reasoning_format_named("think"))
    stream = parser.stream()
    text = fmt.render_calls("Writing.", [call])
    for start in range(0, len(text), 4):
        stream._mode = "parse"  # the weakened variant
        stream.feed(text[start : start + 4])
    assert stream.num_parses > 40


def test_arguments_the_stream_cannot_settle_come_whole_and_exact():
    """A duplicate key (json keeps the last value at the first key's place): what was streamed is not a
    beginning of the parsed arguments, so a wire protocol sends them whole (``call_argument_pieces``)."""
    from components.tito.formats import call_argument_pieces

    text = (
        '<tool_call>\n{"name": "write", "arguments": {"path": "a", "text": "b", "path": "c"}}\n</tool_call>'
    )
    _, _, deltas = _stream("hermes", text, piece=2)
    live = "".join(d.text for d in deltas if d.kind == "tool_call_arguments")
    [final] = [d for d in deltas if d.kind == "tool_call"]
    assert final.tool_call.arguments == '{"path": "c", "text": "b"}' and live == '{"path": "a", "text": "b", '
    assert final.argument_pieces == (final.tool_call.arguments,)
    assert call_argument_pieces(deltas, 0, final.tool_call.arguments) == (final.tool_call.arguments,)
    assert call_argument_pieces(deltas, 0, "{}") == ("{}",)  # pieces that do not join to it: whole


@pytest.mark.parametrize("name", ["llama3_json", "mistral"])
def test_content_full_of_call_end_markers_is_not_parsed_again_at_each(name):
    """``}`` and ``]`` end these families' calls; in plain content (code) they start no parse."""
    text = "Here is the code: " + "def f(x): return {'a': [x]}\n" * 500
    parser, stream, deltas = _stream(name, text)
    assert stream.num_parses <= 10, stream.num_parses
    assert "".join(d.text for d in deltas if d.kind == "content") == parser.parse(text, TOOLS).content
