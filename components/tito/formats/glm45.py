"""GLM-4.5 / 4.6: ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n</tool_call>``, each
call on a new line after the content (GLM-4.5's chat template; vLLM's ``glm45_moe`` parser). Values are plain
text for strings and JSON otherwise; parsing reads them back by the tool's parameter schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from components.tito.formats.base import (
    CallOpening,
    ParsedCalls,
    ToolFormatDefaults,
    arguments_object,
    last_opening,
    tools_json_lines,
    xml_calls,
    xml_text,
)
from components.tito.formats.hermes import CLOSE, OPEN  # the same <tool_call> block markers
from components.tito.formats.xml_stream import XmlArgumentsStream, XmlParameters
from components.tito.messages import ToolCall, ToolSpec

_BLOCK = re.compile(r"<tool_call>([^\n<]*)\n?(.*?)</tool_call>", re.DOTALL)
_ARGUMENTS = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)

_OPENING = re.compile(r"^<tool_call>([^\n<]+)\n")
_SYNTAX = XmlParameters("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", trims_newlines=False)


class Glm45Format(ToolFormatDefaults):
    """``<arg_key>``/``<arg_value>`` calls (GLM-4.5, GLM-4.6)."""

    name: ClassVar[str] = "glm45"
    call_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    end_markers: ClassVar[tuple[str, ...]] = (CLOSE,)
    stop_texts: ClassVar[tuple[str, ...]] = ("<|observation|>",)

    def matches_template(self, template: str) -> bool:
        return "<arg_key>" in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{tools_json_lines(tools)}\n</tools>\n\nFor each function call, output the function name and "
            "arguments within the following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}"
            "</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>"
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            arguments = "".join(
                f"<arg_key>{key}</arg_key>\n<arg_value>{xml_text(value)}</arg_value>\n"
                for key, value in arguments_object(call).items()
            )
            blocks.append(f"\n{OPEN}{call.name}\n{arguments}{CLOSE}")
        return content.strip() + "".join(blocks)

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        return xml_calls(text, (_BLOCK, _ARGUMENTS), tools)

    def arguments_stream(self, tool_name: str, tools: Sequence[ToolSpec]) -> XmlArgumentsStream:
        return XmlArgumentsStream(_SYNTAX, tools, tool_name)

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block)
