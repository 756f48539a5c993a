"""Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>{…}
<|tool_call_end|>…<|tool_calls_section_end|>`` after the content (Kimi K2's chat template; vLLM's ``kimi_k2``
parser). The ``functions.NAME:INDEX`` id is part of what the model writes: it is kept as the call's id."""

from __future__ import annotations

import dataclasses
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

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_CALL = re.compile(
    re.escape(CALL_BEGIN)
    + r"\s*([^<\s]+?)\s*"
    + re.escape(ARGUMENT_BEGIN)
    + r"\s*(.*?)\s*"
    + re.escape(CALL_END),
    re.DOTALL,
)
_ID = re.compile(r"^(?:functions\.)?(.+?)(?::\d+)?$")
_OPENING = re.compile(re.escape(CALL_BEGIN) + r"\s*([^<\s]+?)\s*" + re.escape(ARGUMENT_BEGIN) + r"\s*(?=\{)")


def kimi_call_id(call: ToolCall, index: int) -> str:
    """The ``functions.NAME:INDEX`` id the model writes for a call."""
    return call.id if re.fullmatch(r"functions\.[^:]+:\d+", call.id) else f"functions.{call.name}:{index}"


class KimiK2Format:
    """Kimi K2's tool-call section."""

    name: ClassVar[str] = "kimi_k2"
    call_markers: ClassVar[tuple[str, ...]] = (SECTION_BEGIN,)
    end_markers: ClassVar[tuple[str, ...]] = (CALL_END, SECTION_END)
    stop_texts: ClassVar[tuple[str, ...]] = ()
    keeps_content_with_calls: ClassVar[bool] = True
    writes_call_ids: ClassVar[bool] = True

    def matches_template(self, template: str) -> bool:
        return SECTION_BEGIN in template or "tool_declare" in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            f"# Tools\n\n{tools_json_lines(tools)}\n\nTo call tools, write {SECTION_BEGIN} then, per call, "
            f"{CALL_BEGIN}functions.NAME:INDEX{ARGUMENT_BEGIN}{{json arguments}}{CALL_END}, then {SECTION_END}."
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        body = "".join(
            f"{CALL_BEGIN}{kimi_call_id(call, index)}{ARGUMENT_BEGIN}{template_json(arguments_object(call))}{CALL_END}"
            for index, call in enumerate(calls)
        )
        return f"{content}{SECTION_BEGIN}{body}{SECTION_END}"

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        begin = text.find(SECTION_BEGIN)
        if begin < 0:
            return ParsedCalls(content=text.strip(), tool_calls=())
        end = text.find(SECTION_END, begin)
        section = text[begin + len(SECTION_BEGIN) : end if end >= 0 else len(text)]
        calls = []
        for match in _CALL.finditer(section):
            arguments = json_object(match.group(2))
            name_match = _ID.match(match.group(1))
            if arguments is None or name_match is None:
                return ParsedCalls(content=text.strip(), tool_calls=(), num_malformed=1)
            call_id = match.group(1) if match.group(1).startswith("functions.") else ""
            calls.append(ToolCall(id=call_id, name=name_match.group(1), arguments=arguments_text(arguments)))
        if end < 0 or not calls or _CALL.sub("", section).strip():
            return ParsedCalls(
                content=text.strip(), tool_calls=(), num_malformed=1, pending_from=begin if end < 0 else None
            )
        return ParsedCalls(
            content=(text[:begin] + text[end + len(SECTION_END) :]).strip(), tool_calls=tuple(calls)
        )

    def open_call(self, block: str) -> CallOpening | None:
        opening = last_opening(_OPENING, block)
        name = None if opening is None else _ID.match(opening.name)
        return None if opening is None or name is None else dataclasses.replace(opening, name=name.group(1))
