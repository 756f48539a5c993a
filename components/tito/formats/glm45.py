"""GLM-4.5 / 4.6: ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n</tool_call>``, each
call on a new line after the content (GLM-4.5's chat template; vLLM's ``glm45_moe`` parser). Values are plain
text for strings and JSON otherwise; parsing reads them back by the tool's parameter schema."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from components.tito.formats.base import (
    CallOpening,
    ParsedCalls,
    arguments_object,
    arguments_text,
    parameter_schema,
    template_json,
    tools_json_lines,
    xml_value,
)
from components.tito.messages import ToolCall, ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>([^\n<]*)\n?(.*?)</tool_call>", re.DOTALL)
_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else template_json(value)


class Glm45Format:
    """``<arg_key>``/``<arg_value>`` calls (GLM-4.5, GLM-4.6)."""

    name: ClassVar[str] = "glm45"
    call_markers: ClassVar[tuple[str, ...]] = (OPEN,)
    end_markers: ClassVar[tuple[str, ...]] = (CLOSE,)
    stop_texts: ClassVar[tuple[str, ...]] = ("<|observation|>",)
    keeps_content_with_calls: ClassVar[bool] = True
    writes_call_ids: ClassVar[bool] = False

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
                f"<arg_key>{key}</arg_key>\n<arg_value>{_value_text(value)}</arg_value>\n"
                for key, value in arguments_object(call).items()
            )
            blocks.append(f"\n{OPEN}{call.name}\n{arguments}{CLOSE}")
        return content.strip() + "".join(blocks)

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        calls: list[ToolCall] = []
        kept: list[str] = []
        position = 0
        for match in _BLOCK.finditer(text):
            name = match.group(1).strip()
            body = match.group(2)
            arguments = {
                key.strip(): xml_value(value, parameter_schema(tools, name, key.strip()))
                for key, value in _ARGUMENT.findall(body)
            }
            if not name or _ARGUMENT.sub("", body).strip():
                continue
            kept.append(text[position : match.start()])
            position = match.end()
            calls.append(ToolCall(id="", name=name, arguments=arguments_text(arguments)))
        last_close = text.rfind(CLOSE)
        opened = text.find(OPEN, last_close + len(CLOSE) if last_close >= 0 else 0)
        kept.append(text[position:])
        return ParsedCalls(
            content="".join(kept).strip(),
            tool_calls=tuple(calls),
            num_malformed=text.count(OPEN) - len(calls),
            pending_from=opened if opened >= position else None,
        )

    def open_call(self, block: str) -> CallOpening | None:
        return None  # XML parameters, not JSON text: each call's arguments come whole once it is complete
