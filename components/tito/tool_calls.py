"""Tool-call text helpers shared by the TITO core: the Hermes/Qwen format as functions (the format Rein teaches
models whose chat template knows nothing about tools), and the canonical forms replies are matched by.

Every model family's own format lives in ``components/tito/formats/`` (one file each); this module keeps the
Hermes entry points the rest of Rein and its tests use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from components.json_types import JsonObject
from components.tito.formats.base import tool_call_id
from components.tito.formats.hermes import CLOSE as TOOL_CALL_CLOSE
from components.tito.formats.hermes import OPEN as TOOL_CALL_OPEN
from components.tito.formats.hermes import HermesFormat, tool_responses_text
from components.tito.formats.reasoning import THINK_CLOSE, THINK_OPEN, ThinkReasoning
from components.tito.formats.reply import ParsedReply, ReplyParser
from components.tito.messages import ToolCall, ToolSpec

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ParsedAssistantText",
    "assistant_text",
    "canonical_arguments",
    "format_tool_call",
    "parse_assistant_text",
    "squash_whitespace",
    "strip_think",
    "template_tool_call",
    "tool_call_id",
    "tool_responses_text",
    "tools_system_prompt",
]

ParsedAssistantText = ParsedReply
_HERMES = HermesFormat()
_HERMES_PARSER = ReplyParser(_HERMES, ThinkReasoning())
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_WHITESPACE = re.compile(r"\s+")


def tools_system_prompt(tools: Sequence[ToolSpec]) -> str:
    """The Hermes/Qwen instructions that describe ``tools`` to a model whose template has no tool support."""
    return _HERMES.tools_prompt(tools)


def format_tool_call(call: ToolCall) -> str:
    """One tool call as the ``<tool_call>`` block the model is taught to write."""
    return _HERMES.render_call(call)


def assistant_text(content: str, tool_calls: Sequence[ToolCall]) -> str:
    """An assistant turn's content with its tool calls written as ``<tool_call>`` blocks after it."""
    return _HERMES.render_calls(content, tool_calls)


def parse_assistant_text(text: str, *, id_seed: str = "") -> ParsedReply:
    """Split sampled text into content, ``<think>`` reasoning and ``<tool_call>`` blocks (Hermes format).

    Reasoning is the text before ``</think>`` when the reply holds one (the template may have opened
    ``<think>`` in the generation prompt). A tool call block whose JSON is malformed stays in the content.
    """
    return _HERMES_PARSER.parse(text, id_seed=id_seed)


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


def template_tool_call(call: ToolCall) -> JsonObject:
    """A tool call in the OpenAI form HF chat templates take (arguments parsed into an object)."""
    return {
        "type": "function",
        "id": call.id,
        "function": {"name": call.name, "arguments": call.parsed_arguments()},
    }
