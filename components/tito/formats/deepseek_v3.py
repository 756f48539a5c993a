"""DeepSeek V3 / R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```
<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`` after the content (vLLM's ``tool_chat_template_deepseekv3.jinja``)."""

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
    section_calls,
    template_json,
    tools_json_lines,
)
from components.tito.messages import ToolCall, ToolSpec

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEPARATOR = "<｜tool▁sep｜>"
_CALL = re.compile(
    re.escape(CALL_BEGIN)
    + r"\s*(\w+)\s*"
    + re.escape(SEPARATOR)
    + r"\s*([^\n]+?)\s*\n```(?:json)?\s*\n?(.*?)\s*```\s*"
    + re.escape(CALL_END),
    re.DOTALL,
)
_OPENING = re.compile(
    re.escape(CALL_BEGIN) + r"\s*(\w+)\s*" + re.escape(SEPARATOR) + r"\s*([^\n]+?)\s*\n```(?:json)?\s*(?=\{)"
)


def _call(match: re.Match[str]) -> ToolCall | None:
    arguments = json_object(match.group(3))
    return (
        None
        if arguments is None
        else ToolCall(id="", name=match.group(2), arguments=arguments_text(arguments))
    )


class DeepSeekV3Format(ToolFormatDefaults):
    """DeepSeek V3's special-token tool calls with fenced JSON arguments."""

    name: ClassVar[str] = "deepseek_v3"
    call_markers: ClassVar[tuple[str, ...]] = (CALLS_BEGIN,)
    end_markers: ClassVar[tuple[str, ...]] = (CALL_END, CALLS_END)

    def matches_template(self, template: str) -> bool:
        return CALLS_BEGIN in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n"
            + tools_json_lines(tools)
            + f"\n</tools>\n\nFor function call returns, you should first print {CALLS_BEGIN}"
            f"For each function call, you should return object like:\n{CALL_BEGIN}function{SEPARATOR}"
            f"<function_name>\n```json\n<function_arguments_in_json_format>\n```{CALL_END}"
            f"At the end of function call returns, you should print {CALLS_END}"
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        blocks = [
            f"{CALL_BEGIN}function{SEPARATOR}{call.name}\n```json\n{template_json(arguments_object(call))}\n```{CALL_END}"
            for call in calls
        ]
        return f"{content}{CALLS_BEGIN}{chr(10).join(blocks)}{CALLS_END}"

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        return section_calls(text, (CALLS_BEGIN, CALLS_END), _CALL, _call)

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block, name_group=2)
