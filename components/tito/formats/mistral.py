"""Mistral: ``[TOOL_CALLS] [{"name": …, "arguments": {…}, "id": "abcdefghi"}, …]`` (vLLM's
``tool_chat_template_mistral_parallel.jinja``; the 9-character call id is part of what the model writes), and
the newer ``[TOOL_CALLS]NAME[ARGS]{…}`` form. The template drops the content of a turn with calls."""

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
    arguments_text,
    json_object,
    last_opening,
    template_json,
)
from components.tito.messages import ToolCall, ToolSpec

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_DECODER = json.JSONDecoder()
_NAMED = re.compile(r"\s*([A-Za-z0-9_.-]+)\[ARGS\]")
_OPENING = re.compile(
    r'\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*(?=\{)|([A-Za-z0-9_.-]+)\[ARGS\]\s*(?=\{)'
)


def short_id(call_id: str) -> str:
    """The 9 characters of a call id the template writes."""
    return call_id[-9:]


class MistralFormat(ToolFormatDefaults):
    """``[TOOL_CALLS]`` JSON arrays (Mistral 7B v0.3, Mixtral, Mistral Nemo/Small)."""

    name: ClassVar[str] = "mistral"
    call_markers: ClassVar[tuple[str, ...]] = (TOOL_CALLS,)
    end_markers: ClassVar[tuple[str, ...]] = ("]", "}")
    keeps_content_with_calls: ClassVar[bool] = False
    writes_call_ids: ClassVar[bool] = True

    def matches_template(self, template: str) -> bool:
        return TOOL_CALLS in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            f"[AVAILABLE_TOOLS] [{', '.join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)}]"
            "[/AVAILABLE_TOOLS]\nTo call tools, reply with [TOOL_CALLS] and a JSON array of "
            '{"name": …, "arguments": {…}, "id": "<9 letters or digits>"} objects.'
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return f" {content}" if content else content
        bodies = [
            f'{{"name": {template_json(call.name)}, "arguments": {template_json(arguments_object(call))}, '
            f'"id": "{short_id(call.id)}"}}'
            for call in calls
        ]
        return f"{TOOL_CALLS} [{', '.join(bodies)}]"

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        marker = text.find(TOOL_CALLS)
        if marker < 0:
            return ParsedCalls(content=text.strip(), tool_calls=())
        content = text[:marker].strip()
        rest = text[marker + len(TOOL_CALLS) :]
        calls = self._array_calls(rest) if rest.lstrip().startswith("[") else self._named_calls(rest)
        if calls is None:
            return ParsedCalls(content=text.strip(), tool_calls=(), num_malformed=1, pending_from=marker)
        return ParsedCalls(content=content, tool_calls=calls)

    @staticmethod
    def _array_calls(rest: str) -> tuple[ToolCall, ...] | None:
        try:
            value, end = _DECODER.raw_decode(rest, len(rest) - len(rest.lstrip()))
        except json.JSONDecodeError:
            return None
        if not isinstance(value, list) or not value or rest[end:].strip():
            return None
        calls = []
        for item in value:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                return None
            arguments = item.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json_object(arguments)
            if not isinstance(arguments, dict):
                return None
            call_id = item.get("id") if isinstance(item.get("id"), str) else ""
            calls.append(ToolCall(id=call_id, name=item["name"], arguments=arguments_text(arguments)))
        return tuple(calls)

    @staticmethod
    def _named_calls(rest: str) -> tuple[ToolCall, ...] | None:
        calls = []
        for piece in rest.split(TOOL_CALLS):
            match = _NAMED.match(piece)
            if match is None:
                return None
            arguments = json_object(piece[match.end() :].strip())
            if arguments is None:
                return None
            calls.append(ToolCall(id="", name=match.group(1), arguments=arguments_text(arguments)))
        return tuple(calls)

    def open_call(self, block: str) -> CallOpening | None:
        opening = last_opening(_OPENING, block)
        if opening is None:
            opening = last_opening(_OPENING, block, name_group=2)
        return opening
