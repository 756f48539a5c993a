"""Hermes / Qwen2.5 / Qwen3: ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`` blocks after the
content, one per line (Qwen3's template; vLLM's ``tool_chat_template_hermes.jinja``). Also the format Rein
teaches models whose template knows nothing about tools."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from components.tito.formats.base import (
    CallOpening,
    ParsedCalls,
    ToolFormatDefaults,
    arguments_object,
    arguments_text,
    json_object,
    last_opening,
    tagged_calls,
    template_json,
    tools_json_lines,
)
from components.tito.messages import ToolCall, ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_OPENING = re.compile(
    r'^<tool_call>\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)


def call_from_json(body: str) -> ToolCall | None:
    """A ``{"name": …, "arguments": {…}}`` object (``parameters`` accepted too) as a call, or None."""
    data = json_object(body)
    if data is None or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = json_object(arguments)
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id="", name=data["name"], arguments=arguments_text(arguments))


def tool_responses_text(contents: Sequence[str]) -> str:
    """Consecutive tool results as one user turn's content (for templates without tool support)."""
    return "\n".join(f"<tool_response>\n{content}\n</tool_response>" for content in contents)


class HermesFormat(ToolFormatDefaults):
    """``<tool_call>`` JSON blocks (Hermes 2 Pro, Qwen2.5, Qwen3)."""

    name: ClassVar[str] = "hermes"
    call_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    end_markers: ClassVar[tuple[str, ...]] = (CLOSE,)

    def matches_template(self, template: str) -> bool:
        return OPEN in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{tools_json_lines(tools)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    @staticmethod
    def render_call(call: ToolCall) -> str:
        """One call as its ``<tool_call>`` block."""
        body = f'{{"name": "{call.name}", "arguments": {template_json(arguments_object(call))}}}'
        return f"{OPEN}\n{body}\n{CLOSE}"

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        return "\n".join(([content] if content else []) + [self.render_call(call) for call in calls])

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        return tagged_calls(text, _BLOCK, (OPEN, CLOSE), lambda match: call_from_json(match.group(1)))

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block)
