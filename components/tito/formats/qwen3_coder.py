"""Qwen3-Coder: XML calls ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>
\\n</tool_call>`` (vLLM's ``tool_chat_template_qwen3coder.jinja``). Values are plain text: strings as they
are, objects and arrays as JSON, other scalars as jinja's ``string`` writes them; parsing reads them back by
the tool's parameter schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from components.tito.formats.base import (
    CallOpening,
    ParsedCalls,
    arguments_object,
    arguments_text,
    jinja_string,
    parameter_schema,
    template_json,
    xml_value,
)
from components.tito.messages import ToolCall, ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*</tool_call>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _value_text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return template_json(value)
    return value if isinstance(value, str) else jinja_string(value)


class Qwen3CoderFormat:
    """``<function=…><parameter=…>`` XML (Qwen3-Coder)."""

    name: ClassVar[str] = "qwen3_coder"
    call_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    end_markers: ClassVar[tuple[str, ...]] = (CLOSE,)
    stop_texts: ClassVar[tuple[str, ...]] = ()
    keeps_content_with_calls: ClassVar[bool] = True
    writes_call_ids: ClassVar[bool] = False

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
                f"<parameter={key}>\n{_value_text(value)}\n</parameter>\n"
                for key, value in arguments_object(call).items()
            )
            blocks.append(f"{OPEN}\n<function={call.name}>\n{parameters}</function>\n{CLOSE}")
        head = f"{content.strip()}\n\n" if content.strip() else ""
        return head + "\n".join(blocks)

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        calls: list[ToolCall] = []
        kept: list[str] = []
        position = 0
        for match in _BLOCK.finditer(text):
            name = match.group(1).strip()
            body = match.group(2)
            arguments = {}
            for parameter in _PARAMETER.finditer(body):
                key = parameter.group(1).strip()
                arguments[key] = xml_value(parameter.group(2), parameter_schema(tools, name, key))
            leftover = _PARAMETER.sub("", body).strip()
            if not name or leftover:
                continue
            kept.append(text[position : match.start()])
            position = match.end()
            calls.append(ToolCall(id="", name=name, arguments=arguments_text(arguments)))
        pending = None
        last_close = text.rfind(CLOSE)
        opened = text.find(OPEN, last_close + len(CLOSE) if last_close >= 0 else 0)
        if opened >= position:
            pending = opened
        malformed = text.count(OPEN) - len(calls)  # blocks that stay content: broken, or never closed
        kept.append(text[position:])
        return ParsedCalls(
            content="".join(kept).strip(),
            tool_calls=tuple(calls),
            num_malformed=malformed,
            pending_from=pending,
        )

    def open_call(self, block: str) -> CallOpening | None:
        return None  # XML parameters, not JSON text: each call's arguments come whole once it is complete
