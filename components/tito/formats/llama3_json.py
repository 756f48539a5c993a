"""Llama 3.1 / 3.2 JSON tool calls: the whole reply is ``{"name": …, "parameters": {…}}`` (several joined by
``; ``), optionally after ``<|python_tag|>`` (vLLM's ``tool_chat_template_llama3.{1,2}_json.jinja``). A turn
that calls ends with ``<|eom_id|>`` or ``<|eot_id|>``; the template drops the content of a turn with calls."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar

from components.tito.formats.base import (
    CallOpening,
    ParsedCalls,
    ToolFormatDefaults,
    arguments_object,
    last_opening,
    template_json,
    tools_json_lines,
)
from components.tito.formats.hermes import call_from_json
from components.tito.messages import ToolCall, ToolSpec

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_OPENING = re.compile(r'\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"parameters"\s*:\s*(?=\{)')


class Llama3JsonFormat(ToolFormatDefaults):
    """``{"name": …, "parameters": …}`` replies (Llama 3.1, 3.2, 3.3)."""

    name: ClassVar[str] = "llama3_json"
    call_markers: ClassVar[tuple[str, ...]] = (PYTHON_TAG,)
    end_markers: ClassVar[tuple[str, ...]] = ("}",)
    stop_texts: ClassVar[tuple[str, ...]] = ("<|eom_id|>",)
    keeps_content_with_calls: ClassVar[bool] = False

    def matches_template(self, template: str) -> bool:
        return "<|start_header_id|>" in template and '"parameters": ' in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "Given the following functions, please respond with a JSON for a function call with its proper "
            "arguments that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
            "value}. Do not use variables.\n\n" + tools_json_lines(tools)
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        return "; ".join(
            f'{{"name": "{call.name}", "parameters": {template_json(arguments_object(call))}}}'
            for call in calls
        )

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        start = len(text) - len(text.lstrip())
        body_start = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
        tagged = body_start != start
        if not text.startswith("{", body_start + len(text[body_start:]) - len(text[body_start:].lstrip())):
            if tagged:  # a python_tag without JSON: built-in tool code, not a function call
                return ParsedCalls(content=text.strip(), tool_calls=(), num_malformed=1)
            return ParsedCalls(content=text.strip(), tool_calls=())
        calls: list[ToolCall] = []
        position = body_start
        while True:
            rest = text[position:]
            position += len(rest) - len(rest.lstrip())
            try:
                value, end = _DECODER.raw_decode(text, position)
            except json.JSONDecodeError:
                return ParsedCalls(content=text.strip(), tool_calls=(), num_malformed=1, pending_from=start)
            call = call_from_json(json.dumps(value)) if isinstance(value, dict) else None
            if call is None:
                return ParsedCalls(content=text.strip(), tool_calls=(), num_malformed=1)
            calls.append(call)
            rest = text[end:].lstrip()
            if not rest.startswith(";"):
                break
            position = len(text) - len(rest) + 1
        return ParsedCalls(content=text[end:].strip(), tool_calls=tuple(calls))

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block)
