"""XML-parameter tool-call arguments (GLM-4.5's ``<arg_key>``/``<arg_value>``, Qwen3-Coder's
``<parameter=KEY>``) as the canonical JSON text a ``ToolCall`` carries, while they are written: string
parameters character by character, other values once their parameter closes (they are read by the tool's
schema). Linear in the text; ``failed`` at anything it cannot turn into a beginning of the final arguments (a
duplicate key); the stream then sends the rest once the call is complete."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from components.tito.formats.base import parameter_schema, xml_value
from components.tito.messages import ToolSpec


@dataclass(frozen=True)
class XmlParameters:
    """How a family writes one parameter: ``KEY_OPEN key KEY_CLOSE [whitespace VALUE_OPEN] value VALUE_CLOSE``."""

    key_open: str
    key_close: str
    value_open: str  # "" where the value follows the key's close directly
    value_close: str
    trims_newlines: bool  # one newline after the key and one before the value's close are not the value's


def _held(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could still grow into ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class XmlArgumentsStream:
    """Feed a call's parameter text; ``feed`` returns the canonical JSON arguments text it settles."""

    def __init__(self, syntax: XmlParameters, tools: Sequence[ToolSpec], tool_name: str) -> None:
        self.syntax = syntax
        self.tools = tools
        self.tool_name = tool_name
        self.done = False
        self.failed = False
        self.num_chars = 0
        self._buffer = ""
        self._state = "start"  # start | between | key | gap | value
        self._key = ""
        self._keys: set[str] = set()
        self._string = False
        self._value = ""  # a non-string value, read at its close
        self._value_started = False

    def feed(self, text: str) -> str:
        if self.done or self.failed:
            return ""
        self.num_chars += len(text)
        self._buffer += text
        out: list[str] = []
        while not (self.done or self.failed) and self._step(out):
            pass
        return "".join(out)

    def _step(self, out: list[str]) -> bool:
        """One move on the buffer; False when it needs more text."""
        syntax, buffer = self.syntax, self._buffer
        if self._state == "start":
            out.append("{")
            self._state = "between"
            return True
        if self._state == "between":
            rest = buffer.lstrip()
            if not rest:
                self._buffer = ""
                return False
            if rest.startswith(syntax.key_open):
                self._buffer, self._state, self._key = rest[len(syntax.key_open) :], "key", ""
                return True
            if syntax.key_open.startswith(rest):
                self._buffer = rest
                return False
            out.append("}")  # the parameters end (the call's closing markup follows)
            self.done = True
            return False
        if self._state == "key":
            end = buffer.find(syntax.key_close)
            if end < 0:
                return False
            key = buffer[:end].strip()
            if key in self._keys:
                self.failed = True
                return False
            self._keys.add(key)
            self._key = key
            out.append(("" if len(self._keys) == 1 else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
            kinds = parameter_schema(self.tools, self.tool_name, key).get("type")
            self._string = kinds == "string" or kinds == ["string"]
            self._buffer, self._state = buffer[end + len(syntax.key_close) :], "gap"
            return True
        if self._state == "gap":
            rest = buffer.lstrip() if syntax.value_open else buffer
            if syntax.value_open:
                if len(rest) < len(syntax.value_open):
                    return False
                if not rest.startswith(syntax.value_open):
                    self.failed = True
                    return False
                rest = rest[len(syntax.value_open) :]
            elif syntax.trims_newlines:
                if not rest:
                    return False
                rest = rest.removeprefix("\n")
            self._buffer, self._state, self._value = rest, "value", ""
            if self._string:
                out.append('"')
            return True
        return self._value_step(out)

    def _value_step(self, out: list[str]) -> bool:
        syntax, buffer = self.syntax, self._buffer
        close = ("\n" if syntax.trims_newlines else "") + syntax.value_close
        end = buffer.find(syntax.value_close)
        if end >= 0:
            raw = buffer[:end]
            if syntax.trims_newlines:
                raw = raw.removesuffix("\n")
            self._buffer, self._state = buffer[end + len(syntax.value_close) :], "between"
            if self._string:
                out.append(json.dumps(raw, ensure_ascii=False)[1:-1] + '"')
            else:
                value = xml_value(self._value + raw, parameter_schema(self.tools, self.tool_name, self._key))
                out.append(json.dumps(value, ensure_ascii=False))
            return True
        keep = max(_held(buffer, close), _held(buffer, syntax.value_close))
        settled, self._buffer = buffer[: len(buffer) - keep], buffer[len(buffer) - keep :]
        if self._string:
            out.append(json.dumps(settled, ensure_ascii=False)[1:-1])
        else:
            self._value += settled
        return False
