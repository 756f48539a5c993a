"""Qwen3-Coder: XML calls ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>
\\n</tool_call>`` (vLLM's ``tool_chat_template_qwen3coder.jinja``). Values are plain text: strings as they
are, objects and arrays as JSON, other scalars as jinja's ``string`` writes them; parsing reads them back by
the tool's parameter schema."""

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
    template_json,
    xml_calls,
    xml_text,
)
from components.tito.formats.hermes import CLOSE, OPEN  # the same <tool_call> block markers
from components.tito.formats.xml_stream import XmlArgumentsStream, XmlParameters
from components.tito.messages import ToolCall, ToolSpec

_BLOCK = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*</tool_call>", re.DOTALL)
_ARGUMENTS = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

_OPENING = re.compile(r"^<tool_call>\s*<function=([^>\n]+)>\n?")
_SYNTAX = XmlParameters("<parameter=", ">", "", "</parameter>", trims_newlines=True)


class Qwen3CoderFormat(ToolFormatDefaults):
    """``<function=…><parameter=…>`` XML (Qwen3-Coder)."""

    name: ClassVar[str] = "qwen3_coder"
    call_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    end_markers: ClassVar[tuple[str, ...]] = (CLOSE,)

    def matches_template(self, template: str) -> bool:
        return "<function=" in template and "<parameter=" in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        lines = []
        for tool in tools:
            lines.append(
                f"<function>\n<name>{tool.name}</name>\n<description>{tool.description}</description>"
            )
            lines.append(f"<parameters>{template_json(dict(tool.parameters))}</parameters>\n</function>")
        return (
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
            + "\n".join(lines)
            + "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
            "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
            "value_1\n</parameter>\n</function>\n</tool_call>"
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            parameters = "".join(
                f"<parameter={key}>\n{xml_text(value)}\n</parameter>\n"
                for key, value in arguments_object(call).items()
            )
            blocks.append(f"{OPEN}\n<function={call.name}>\n{parameters}</function>\n{CLOSE}")
        head = f"{content.strip()}\n\n" if content.strip() else ""
        return head + "\n".join(blocks)

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        return xml_calls(text, (_BLOCK, _ARGUMENTS), tools)

    def arguments_stream(self, tool_name: str, tools: Sequence[ToolSpec]) -> XmlArgumentsStream:
        return XmlArgumentsStream(_SYNTAX, tools, tool_name)

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block)
