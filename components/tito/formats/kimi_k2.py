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
    ToolFormatDefaults,
    arguments_object,
    arguments_text,
    json_object,
    last_opening,
    section_calls,
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


def _call(match: re.Match[str]) -> ToolCall | None:
    arguments = json_object(match.group(2))
    name = _ID.match(match.group(1))
    if arguments is None or name is None:
        return None
    call_id = match.group(1) if match.group(1).startswith("functions.") else ""
    return ToolCall(id=call_id, name=name.group(1), arguments=arguments_text(arguments))


class KimiK2Format(ToolFormatDefaults):
    """Kimi K2's tool-call section."""

    name: ClassVar[str] = "kimi_k2"
    call_markers: ClassVar[tuple[str, ...]] = (SECTION_BEGIN,)
    end_markers: ClassVar[tuple[str, ...]] = (CALL_END, SECTION_END)
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
        return section_calls(text, (SECTION_BEGIN, SECTION_END), _CALL, _call)

    def open_call(self, block: str) -> CallOpening | None:
        opening = last_opening(_OPENING, block)
        name = None if opening is None else _ID.match(opening.name)
        return None if opening is None or name is None else dataclasses.replace(opening, name=name.group(1))
