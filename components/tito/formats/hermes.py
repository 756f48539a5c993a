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
    arguments_object,
    arguments_text,
    json_object,
    last_opening,
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


class HermesFormat:
    """``<tool_call>`` JSON blocks (Hermes 2 Pro, Qwen2.5, Qwen3)."""

    name: ClassVar[str] = "hermes"
    call_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    end_markers: ClassVar[tuple[str, ...]] = (CLOSE,)
    stop_texts: ClassVar[tuple[str, ...]] = ()
    keeps_content_with_calls: ClassVar[bool] = True
    writes_call_ids: ClassVar[bool] = False

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
        calls: list[ToolCall] = []
        kept: list[str] = []
        position = 0
        for match in _BLOCK.finditer(text):
            call = call_from_json(match.group(1))
            if call is None:
                continue
            kept.append(text[position : match.start()])
            position = match.end()
            calls.append(call)
        tail = text[position:]
        pending = None
        last_close = text.rfind(CLOSE)
        opened = text.find(OPEN, last_close + len(CLOSE) if last_close >= 0 else 0)
        if opened >= position:
            pending = opened
        malformed = text.count(OPEN) - len(calls)  # blocks that stay content: broken, or never closed
        kept.append(tail)
        return ParsedCalls(
            content="".join(kept).strip(),
            tool_calls=tuple(calls),
            num_malformed=malformed,
            pending_from=pending,
        )

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block)
