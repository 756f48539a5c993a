"""Hermes/Qwen-style tool calling in plain text, for chat templates that know nothing about tools.

Tools are described to the model inside its system message (``<tools>…</tools>``), a past tool call is written
as ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` and tool results come back as
``<tool_response>…</tool_response>`` blocks in one user turn. ``parse_assistant_text`` turns what the model
wrote back into content, reasoning (``<think>…</think>``) and tool calls; a malformed block stays plain content.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.tito.messages import ToolCall, ToolSpec

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_WHITESPACE = re.compile(r"\s+")


def tools_system_prompt(tools: Sequence[ToolSpec]) -> str:
    """The Hermes/Qwen instructions that describe ``tools`` to a model whose template has no tool support."""
    lines = "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def format_tool_call(call: ToolCall) -> str:
    """One tool call as the text block the model is taught to write."""
    body = json.dumps({"name": call.name, "arguments": call.parsed_arguments()}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def assistant_text(content: str, tool_calls: Sequence[ToolCall]) -> str:
    """An assistant turn's content with its tool calls written as text blocks after it."""
    blocks = [format_tool_call(call) for call in tool_calls]
    return "\n".join(([content] if content else []) + blocks)


def tool_responses_text(contents: Sequence[str]) -> str:
    """Consecutive tool results as one user turn's content."""
    return "\n".join(f"<tool_response>\n{content}\n</tool_response>" for content in contents)


@dataclass(frozen=True, kw_only=True)
class ParsedAssistantText:
    """What the model wrote, split into its parts."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]


def tool_call_id(seed: str, index: int) -> str:
    """A deterministic tool call id (harnesses only need it to be unique within the conversation)."""
    return "call_" + hashlib.sha1(f"{seed}/{index}".encode()).hexdigest()[:24]


def _parse_tool_call_json(body: str) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` of one ``<tool_call>`` body, or None when it is not a valid call."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return data["name"], json.dumps(arguments, ensure_ascii=False)


def parse_assistant_text(text: str, *, id_seed: str = "") -> ParsedAssistantText:
    """Split sampled text into content, ``<think>`` reasoning and ``<tool_call>`` blocks.

    Reasoning is the text before ``</think>`` when the reply holds one (the template may have opened
    ``<think>`` in the generation prompt). A tool call block whose JSON is malformed stays in the content.
    """
    reasoning = None
    if THINK_CLOSE in text:
        before, _, text = text.partition(THINK_CLOSE)
        reasoning = before.replace(THINK_OPEN, "", 1).strip()
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        parsed = _parse_tool_call_json(match.group(1))
        if parsed is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        name, arguments = parsed
        calls.append(ToolCall(id=tool_call_id(id_seed, len(calls)), name=name, arguments=arguments))
    kept.append(text[position:])
    return ParsedAssistantText(content="".join(kept).strip(), reasoning=reasoning, tool_calls=tuple(calls))


def squash_whitespace(text: str) -> str:
    """Text with every whitespace run removed: the form two re-serialisations of one reply agree on."""
    return _WHITESPACE.sub("", text)


def strip_think(text: str) -> str:
    """Text without ``<think>…</think>`` blocks (and without reasoning before a lone ``</think>``)."""
    text = _THINK_BLOCK.sub("", text)
    if THINK_CLOSE in text:
        text = text.partition(THINK_CLOSE)[2]
    return text


def canonical_arguments(arguments: str) -> str:
    """Tool arguments in a form independent of key order and whitespace."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except json.JSONDecodeError:
        return squash_whitespace(arguments)


def template_tool_call(call: ToolCall) -> dict[str, Any]:
    """A tool call in the OpenAI form HF chat templates take (arguments parsed into an object)."""
    return {
        "type": "function",
        "id": call.id,
        "function": {"name": call.name, "arguments": call.parsed_arguments()},
    }
