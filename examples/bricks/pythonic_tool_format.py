"""An example tool format, one file: Llama 3.2 / Llama 4 "pythonic" calls, ``[bash(cmd='ls'), grep(pattern='x')]``
(vLLM's ``tool_chat_template_llama3.2_pythonic.jinja``). It passes the tool-format contract suite::

    pytest tests/contracts/test_tool_format_contract.py --brick examples.bricks.pythonic_tool_format:PythonicFormat

To use it in a run, add it to ``TOOL_FORMATS`` in ``components/tito/formats/__init__.py`` (or pass it as
``ChatTemplateRenderer(tool_format=...)``).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import ClassVar

from components.tito.formats.base import ParsedCalls, ToolFormatDefaults, arguments_object, arguments_text
from components.tito.messages import ToolCall, ToolSpec


class PythonicFormat(ToolFormatDefaults):
    """A Python list of calls with keyword arguments, as the whole reply (``ToolFormatDefaults``: no call ids in
    the text, no JSON arguments to stream: each call's arguments come whole once it is complete)."""

    name: ClassVar[str] = "pythonic"
    call_markers: ClassVar[tuple[str, ...]] = ()
    end_markers: ClassVar[tuple[str, ...]] = ("]",)  # the list closes: the stream parses the reply again
    stop_texts: ClassVar[tuple[str, ...]] = ("<|eom_id|>",)
    keeps_content_with_calls: ClassVar[bool] = False

    def matches_template(self, template: str) -> bool:
        return "[func_name1(params_name1=params_value1" in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        schemas = "\n".join(json.dumps(tool.to_openai(), ensure_ascii=False) for tool in tools)
        return (
            "You may call functions by replying only with a Python list of calls: "
            f"[func_name1(params_name1=params_value1), func_name2(...)]\n\n{schemas}"
        )

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return content
        rendered = []
        for call in calls:
            keywords = ", ".join(f"{key}={value!r}" for key, value in arguments_object(call).items())
            rendered.append(f"{call.name}({keywords})")
        return f"[{', '.join(rendered)}]"

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        stripped = text.strip()
        if not stripped.startswith("["):
            return ParsedCalls(content=stripped, tool_calls=())
        try:
            tree = ast.parse(stripped, mode="eval").body
            if not isinstance(tree, ast.List):
                raise ValueError("not a list")
            calls = []
            for node in tree.elts:
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                    raise ValueError("not a call with keyword arguments")
                arguments = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords}
                calls.append(ToolCall(id="", name=node.func.id, arguments=arguments_text(arguments)))
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return ParsedCalls(content=stripped, tool_calls=(), num_malformed=1, pending_from=0)
        return ParsedCalls(content="", tool_calls=tuple(calls))
