"""gpt-oss harmony: the reply is a run of messages ``<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]
<|message|>BODY`` ended by ``<|end|>`` (then ``<|start|>assistant`` and the next one), ``<|call|>`` (a tool call)
or ``<|return|>`` (the final answer). Reasoning is the ``analysis`` channel (``HarmonyReasoning``); the
``final`` channel and recipient-less ``commentary`` preambles are content; ``to=functions.NAME`` messages are
calls. The generation prompt is ``<|start|>assistant``; ``<|call|>`` and ``<|return|>`` end the turn."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import ClassVar

from components.json_types import JsonValue
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

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
_ENDINGS = re.compile(r"<\|end\|>|<\|call\|>|<\|return\|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_OPENING = re.compile(r"to=functions\.([^\s<]+)[^\n]*?<\|message\|>\s*(?=\{)")


def harmony_messages(text: str) -> list[tuple[str, str | None, str, int, bool, int]]:
    """``(channel, recipient, body, start offset, closed, end offset)`` of each message in sampled harmony
    text (the end offset is past its ending and the next message's ``<|start|>assistant``)."""
    out = []
    position = 0
    while position < len(text):
        body_at = text.find(MESSAGE, position)
        if body_at < 0:
            break
        header = text[position:body_at]
        ending = _ENDINGS.search(text, body_at)
        body_end = ending.start() if ending else len(text)
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        start = position
        position = ending.end() if ending else len(text)
        if text.startswith(START, position):
            position += len(START)
            if text.startswith("assistant", position) or "assistant".startswith(text[position:]):
                position = min(position + len("assistant"), len(text))  # the role (or its first letters)
        out.append(
            (
                channel.group(1) if channel else "",
                recipient.group(1) if recipient else None,
                text[body_at + len(MESSAGE) : body_end],
                start,
                ending is not None,
                position,
            )
        )
    return out


def _typescript(schema: JsonValue) -> str:
    """A parameter's JSON schema as the TypeScript type harmony's tool prompt shows: an enum as its values, a
    type list (``["string", "null"]``) or ``anyOf``/``oneOf`` as a union, anything else unknown as ``any``."""
    if not isinstance(schema, dict):
        return "any"
    if isinstance(enum := schema.get("enum"), list):
        return " | ".join(json.dumps(v) for v in enum)
    kind = schema.get("type")
    if isinstance(kind, list):  # as gpt-oss's own template: the type names joined
        return " | ".join(str(k) for k in kind) or "any"
    for union in ("anyOf", "oneOf"):
        if isinstance(choices := schema.get(union), list) and choices:
            return " | ".join(_typescript(choice) for choice in choices)
    if not isinstance(kind, str):
        return "any"
    return {"integer": "number", "array": "any[]", "object": "object"}.get(kind, kind)


class HarmonyFormat(ToolFormatDefaults):
    """gpt-oss (harmony response format) tool calls."""

    name: ClassVar[str] = "harmony"
    call_markers: ClassVar[tuple[str, ...]] = ("to=functions.", CHANNEL, MESSAGE, END, CALL, RETURN, START)
    stop_texts: ClassVar[tuple[str, ...]] = (CALL, RETURN)

    def matches_template(self, template: str) -> bool:
        return CHANNEL in template

    def tools_prompt(self, tools: Sequence[ToolSpec]) -> str:
        lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
        for tool in tools:
            if tool.description:
                lines.append(f"// {tool.description}")
            properties = tool.parameters.get("properties") or {}
            if properties:
                lines.append(f"type {tool.name} = (_: {{")
                required = set(tool.parameters.get("required") or ())
                for key, schema in properties.items():
                    optional = "" if key in required else "?"
                    lines.append(f"{key}{optional}: {_typescript(schema)},")
                lines.append("}) => any;")
            else:
                lines.append(f"type {tool.name} = () => any;")
            lines.append("")
        lines.append("} // namespace functions")
        return "\n".join(lines)

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        if not calls:
            return f"{CHANNEL}final{MESSAGE}{content}"
        messages = [f"{CHANNEL}commentary{MESSAGE}{content}{END}"] if content else []
        messages += [
            f"{CHANNEL}commentary to=functions.{call.name} <|constrain|>json{MESSAGE}"
            f"{template_json(arguments_object(call))}"
            for call in calls
        ]
        joined = ""
        for index, message in enumerate(messages):
            if index:
                joined += ("" if joined.endswith(END) else CALL) + START + "assistant"
            joined += message
        return joined

    def parse(self, text: str, tools: Sequence[ToolSpec]) -> ParsedCalls:
        messages = harmony_messages(text)
        if not messages:  # plain text, or a message header still arriving
            head = text.lstrip()
            header = CHANNEL in text or head.startswith("<|") or (bool(head) and "<|".startswith(head))
            return ParsedCalls(content=text.strip(), tool_calls=(), pending_from=0 if header else None)
        contents: list[str] = []
        calls: list[ToolCall] = []
        malformed = 0
        pending = None
        for channel, recipient, body, start, closed, _ in messages:
            if recipient is None:
                if channel in ("final", "commentary", ""):
                    contents.append(body.strip())
                continue
            arguments = json_object(body.strip() or "{}")
            if arguments is None:  # the whole reply stays content
                malformed += 1
                pending = start if not closed else pending
                continue
            if not closed:  # the last message: its end was the stop token, or more text may follow
                pending = start
            calls.append(ToolCall(id="", name=recipient, arguments=arguments_text(arguments)))
        if malformed:
            return ParsedCalls(
                content=text.strip(), tool_calls=(), num_malformed=malformed, pending_from=pending
            )
        return ParsedCalls(
            content="\n".join(c for c in contents if c),
            tool_calls=tuple(calls),
            num_malformed=malformed,
            pending_from=pending,
        )

    def open_call(self, block: str) -> CallOpening | None:
        return last_opening(_OPENING, block)
