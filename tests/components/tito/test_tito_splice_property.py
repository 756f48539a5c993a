"""Property: wherever the model's text re-encodes identically, spliced prompt ids equal a full template render."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.tito import ChatMessage, TitoSession, ToolSpec

TOOLS = (
    ToolSpec(name="bash", parameters={"type": "object", "properties": {"cmd": {"type": "string"}}}),
    ToolSpec(name="grep", parameters={"type": "object", "properties": {"pattern": {"type": "string"}}}),
)
WORDS = st.sampled_from(
    ["fix", "the", "bug", "in", "parser.py", "now", "ok", "3", "tests", "failed", "{x}", "é"]
)
TEXT = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)
CALL = st.tuples(st.sampled_from(["bash", "grep"]), TEXT)
TURN = st.tuples(
    st.one_of(st.just(""), TEXT),  # reply content
    st.lists(CALL, max_size=3),  # tool calls in the reply
    st.lists(TEXT, min_size=3, max_size=3),  # tool outputs (one per call) or the next user message
)


def reply_text(content: str, calls: list[tuple[str, str]]) -> str:
    argument = {"bash": "cmd", "grep": "pattern"}
    blocks = [
        "<tool_call>\n"
        + json.dumps({"name": n, "arguments": {argument[n]: a}}, ensure_ascii=False)
        + "\n</tool_call>"
        for n, a in calls
    ]
    return "\n".join(([content] if content else []) + blocks) or "ok"


@pytest.fixture(params=["chatml_hermes_tools", "qwen_like_native_tools"])
def any_tokenizer(request, tokenizer, qwen_like_tokenizer):
    return tokenizer if request.param == "chatml_hermes_tools" else qwen_like_tokenizer


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(TURN, min_size=1, max_size=6), with_system=st.booleans(), with_tools=st.booleans())
def test_spliced_prompts_equal_the_full_render(any_tokenizer, make_result, turns, with_system, with_tools):
    tokenizer = any_tokenizer
    tools = TOOLS if with_tools else ()
    tito = TitoSession(tokenizer, context_window=100_000)
    messages = [ChatMessage(role="system", content="Be an agent.")] if with_system else []
    messages.append(ChatMessage(role="user", content="Start."))
    for content, calls, followers in turns:
        turn = tito.prepare(messages, tools, max_tokens=64)
        assert list(turn.prompt_ids) == tito.renderer.render_ids(messages, tools, add_generation_prompt=True)
        reply = tito.complete(turn, make_result(tokenizer, reply_text(content, calls)))
        messages.append(reply.to_message())
        if reply.tool_calls:
            messages += [
                ChatMessage(role="tool", content=output, tool_call_id=call.id)
                for call, output in zip(reply.tool_calls, followers, strict=False)
            ]
        else:
            messages.append(ChatMessage(role="user", content=followers[0]))
    final = tito.prepare(messages, tools, max_tokens=64)
    assert final.new_segment_reason is None or len(turns) == 0
    assert list(final.prompt_ids) == tito.renderer.render_ids(messages, tools, add_generation_prompt=True)
    assert len(tito.segments()) == 1
