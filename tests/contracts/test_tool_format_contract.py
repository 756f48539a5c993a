"""The ``ToolFormat`` / ``ReasoningFormat`` contracts (``components/tito/formats/base.py``), checked on every
registered format, or on yours with ``--brick``::

    pytest tests/contracts/test_tool_format_contract.py --brick mypackage.formats:MyFormat

Properties (hypothesis, few examples each): random replies (content, parallel calls, unicode, empty content,
long arguments of several JSON types) round-trip through ``render_calls`` → ``parse``, whole and streamed in
random pieces; a reply cut inside its last call never raises, keeps the text as content and counts the call as
malformed; reasoning round-trips through ``render`` → ``split``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.tito.formats import (
    REASONING_FORMATS,
    TOOL_FORMATS,
    ReasoningFormat,
    ReplyParser,
    ToolFormat,
)
from components.tito.formats.reasoning import HarmonyReasoning, NoReasoning, ThinkReasoning
from components.tito.messages import ToolCall, ToolSpec
from tests.contracts.conftest import brick_params

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))

TOOLS = (
    ToolSpec(
        name="bash",
        parameters={
            "type": "object",
            "properties": {
                "cmd": {"type": "string"},
                "timeout": {"type": "integer"},
                "ok": {"type": "boolean"},
            },
        },
    ),
    ToolSpec(
        name="edit_file",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "patch": {"type": "object"},
                "text": {"type": "string"},
            },
        },
    ),
)
# Text a model writes: words, punctuation, unicode; no markup characters of any format.
ALPHABET = st.sampled_from(list("abcxyz ABC019.,:;!?-_=+/'\"()é中ß🙂\n\t"))
TEXT = st.text(ALPHABET, min_size=1, max_size=40).map(str.strip).filter(bool)
LONG_TEXT = st.text(ALPHABET, min_size=200, max_size=600).map(str.strip).filter(bool)
BASH_ARGS = st.fixed_dictionaries(
    {"cmd": st.one_of(TEXT, LONG_TEXT)}, optional={"timeout": st.integers(0, 10**6), "ok": st.booleans()}
)
EDIT_ARGS = st.fixed_dictionaries(
    {"path": TEXT},
    optional={"patch": st.dictionaries(st.sampled_from("abc"), TEXT, max_size=2), "text": TEXT},
)
CALLS = st.lists(
    st.one_of(st.tuples(st.just("bash"), BASH_ARGS), st.tuples(st.just("edit_file"), EDIT_ARGS)),
    min_size=0,
    max_size=3,
)


def pytest_generate_tests(metafunc):
    if "make_format" in metafunc.fixturenames:
        metafunc.parametrize("make_format", brick_params(metafunc.config, dict(TOOL_FORMATS)))
    if "make_reasoning" in metafunc.fixturenames:
        built_in = {name: cls for name, cls in REASONING_FORMATS.items() if name != "none"}
        metafunc.parametrize("make_reasoning", brick_params(metafunc.config, built_in))


@pytest.fixture
def tool_format(make_format) -> ToolFormat:
    brick = make_format()
    assert isinstance(brick, ToolFormat), f"{brick!r} does not implement ToolFormat"
    return brick


def _calls(drawn) -> list[ToolCall]:
    return [
        ToolCall(id=f"call_{index:09d}abc", name=name, arguments=json.dumps(arguments, ensure_ascii=False))
        for index, (name, arguments) in enumerate(drawn)
    ]


def _same_calls(parsed, calls) -> None:
    assert [c.name for c in parsed] == [c.name for c in calls]
    assert [json.loads(c.arguments) for c in parsed] == [json.loads(c.arguments) for c in calls]


@SETTINGS
@given(content=st.one_of(st.just(""), TEXT), drawn=CALLS)
def test_render_then_parse_gives_the_reply_back(tool_format, content, drawn):
    calls = _calls(drawn)
    if calls and not tool_format.keeps_content_with_calls:
        content = ""
    text = tool_format.render_calls(content, calls)
    parsed = tool_format.parse(text, TOOLS)
    assert parsed.content == content
    _same_calls(parsed.tool_calls, calls)
    assert parsed.num_malformed == 0


@SETTINGS
@given(content=st.one_of(st.just(""), TEXT), drawn=CALLS, cuts=st.lists(st.integers(1, 7), max_size=400))
def test_a_stream_in_random_pieces_gives_the_same_reply(tool_format, content, drawn, cuts):
    calls = _calls(drawn)
    if calls and not tool_format.keeps_content_with_calls:
        content = ""
    text = tool_format.render_calls(content, calls)
    parser = ReplyParser(tool_format, NoReasoning())
    whole = parser.parse(text, TOOLS, id_seed="s")
    stream = parser.stream(TOOLS, id_seed="s")
    deltas, position = [], 0
    for size in cuts:
        deltas += stream.feed(text[position : position + size])
        position += size
    deltas += stream.feed(text[position:])
    deltas += stream.finish()
    streamed_calls = [d.tool_call for d in deltas if d.kind == "tool_call"]
    assert streamed_calls == list(whole.tool_calls)  # same calls, same ids, each sent once
    _arguments_streamed_as_written(tool_format, deltas)
    assert "".join(d.text for d in deltas if d.kind == "content") == whole.content
    for marker in tool_format.call_markers:  # no call markup ever leaks into content deltas
        assert all(marker not in d.text for d in deltas if d.kind == "content")


@SETTINGS
@given(
    reasoning=TEXT,
    content=st.one_of(st.just(""), TEXT),
    drawn=CALLS,
    cuts=st.lists(st.integers(1, 9), max_size=300),
)
def test_reasoning_then_calls_stream_as_parsed(tool_format, reasoning, content, drawn, cuts):
    calls = _calls(drawn)
    if calls and not tool_format.keeps_content_with_calls:
        content = ""
    # the reasoning format the family pairs with: harmony's analysis channel, else <think>
    harmony = HarmonyReasoning().matches_template(tool_format.render_calls("", []))
    reasoning_format = HarmonyReasoning() if harmony else ThinkReasoning()
    text = reasoning_format.render(reasoning, tool_format.render_calls(content, calls))
    parser = ReplyParser(tool_format, reasoning_format)
    whole = parser.parse(text, TOOLS, id_seed="s")
    assert whole.reasoning == reasoning and whole.content == content
    _same_calls(whole.tool_calls, calls)
    stream = parser.stream(TOOLS, id_seed="s")
    deltas, position = [], 0
    for size in cuts:
        deltas += stream.feed(text[position : position + size])
        position += size
    deltas += stream.feed(text[position:]) + stream.finish()
    assert "".join(d.text for d in deltas if d.kind == "reasoning") == reasoning
    assert "".join(d.text for d in deltas if d.kind == "content") == content
    assert [d.tool_call for d in deltas if d.kind == "tool_call"] == list(whole.tool_calls)
    _arguments_streamed_as_written(tool_format, deltas)


def _arguments_streamed_as_written(tool_format, deltas, *, whole_calls_streamed: bool = False) -> None:
    """What came of each call's JSON arguments as ``tool_call_arguments`` deltas, while they were written, is
    where its ``argument_pieces`` begin, and those join to exactly its arguments. ``whole_calls_streamed`` (a
    stream fed one character at a time): all of a call's arguments came that way."""
    live: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.kind == "tool_call_arguments":
            assert (delta.index not in live) == (
                delta.tool_call is not None
            )  # the first piece names the call
            live.setdefault(delta.index, []).append(delta.text)
    for delta in deltas:
        if delta.kind == "tool_call":
            arguments = delta.tool_call.arguments
            pieces = tuple(live.get(delta.index, ()))
            assert "".join(delta.argument_pieces) == arguments
            assert delta.argument_pieces[: len(pieces)] == pieces
            if whole_calls_streamed:
                assert "".join(pieces) == arguments


@pytest.mark.built_in_only  # every built-in family streams its arguments; a brick may send them whole
@SETTINGS
@given(content=st.one_of(st.just(""), TEXT), drawn=CALLS.filter(bool))
def test_call_arguments_stream_character_by_character(tool_format, content, drawn):
    calls = _calls(drawn)
    if not tool_format.keeps_content_with_calls:
        content = ""
    text = tool_format.render_calls(content, calls)
    parser = ReplyParser(tool_format, NoReasoning())
    stream = parser.stream(TOOLS, id_seed="s")
    deltas = [delta for char in text for delta in stream.feed(char)] + stream.finish()
    assert [d.tool_call for d in deltas if d.kind == "tool_call"] == list(
        parser.parse(text, TOOLS, id_seed="s").tool_calls
    )
    _arguments_streamed_as_written(tool_format, deltas, whole_calls_streamed=True)


@SETTINGS
@given(drawn=CALLS.filter(bool))
def test_a_call_cut_short_stays_content_and_is_counted(tool_format, drawn):
    calls = _calls(drawn)[:1]
    text = tool_format.render_calls("", calls)[:-3]
    parsed = tool_format.parse(text, TOOLS)  # never raises
    assert parsed.tool_calls == ()
    assert parsed.num_malformed >= 1
    assert parsed.content == text.strip()


def test_garbage_never_raises(tool_format):
    for text in ("", "<", "[TOOL_CALLS]", "{", '{"name": 3}', "<tool_call>\n{}\n</tool_call>", "<|message|>"):
        parsed = ReplyParser(tool_format, NoReasoning()).parse(text, TOOLS)
        assert isinstance(parsed.content, str)


@pytest.mark.built_in_only
@SETTINGS
@given(reasoning=TEXT, rest=TEXT)
def test_reasoning_round_trips(make_reasoning, reasoning, rest):
    brick = make_reasoning()
    assert isinstance(brick, ReasoningFormat)
    found, remainder = brick.split(brick.render(reasoning, rest))
    assert found == reasoning
    assert remainder.strip().endswith(rest)
    assert brick.split(rest) == (None, rest)


# Parameter schemas as clients send them: a type list (pydantic's Optional), anyOf, no type, enums, nesting.
ODD_SCHEMAS = (
    {"type": ["string", "null"]},
    {"type": ["integer", "array"], "items": {"type": "string"}},
    {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    {},
    {"enum": ["a", 1, None]},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
    {"type": "object", "additionalProperties": {"type": ["boolean", "null"]}},
    {"$ref": "#/$defs/Thing"},
)


def test_any_parameter_schema_renders_into_the_prompt(tool_format):
    tools = [
        ToolSpec(
            name=f"tool_{index}",
            description="d",
            parameters={"type": "object", "properties": {"arg": schema}, "required": ["arg"]},
        )
        for index, schema in enumerate(ODD_SCHEMAS)
    ]
    prompt = tool_format.tools_prompt(tools)  # never raises, whatever JSON schema a client sends
    assert isinstance(prompt, str)
    if prompt:  # formats that render tools in the prompt name every one (others leave them to the template)
        assert all(tool.name in prompt for tool in tools)
