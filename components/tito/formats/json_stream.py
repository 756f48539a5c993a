"""A JSON value's canonical text (``json.dumps(value, ensure_ascii=False)``, what a ``ToolCall`` carries) as its
raw text arrives, character by character, in time linear in the text: a stream sends tool-call arguments as
the model writes them. It stops (``failed``) at anything it cannot canonicalize before the end (invalid JSON,
a duplicate key); the stream then sends the rest of the arguments once the call is complete."""

from __future__ import annotations

import json

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUMBER = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")


def _escaped(char: str) -> str:
    return json.dumps(char, ensure_ascii=False)[1:-1]


class JsonStream:
    """Feed raw JSON text; ``feed`` returns the canonical text it settles; ``done`` once the value is closed."""

    def __init__(self) -> None:
        self.done = False
        self.failed = False
        self.num_chars = 0  # characters consumed (work done: linear in the text)
        self._stack: list[tuple[str, set[str]]] = []  # open containers and their keys so far
        self._state = "value"  # value | value_or_close | key | key_or_close | colon | after | string | atom
        self._in_key = False
        self._buffer = ""  # key text, number or literal being read
        self._escape: str | None = None  # None, "" (after a backslash) or the hex digits of a \\u escape
        self._high_surrogate = ""

    def feed(self, text: str) -> str:
        out: list[str] = []
        for char in text:
            if self.done or self.failed:
                break
            self.num_chars += 1
            self._char(char, out)
        return "".join(out)

    def _fail(self) -> None:
        self.failed = True

    def _close_value(self) -> None:
        self._state = "after"
        if not self._stack:
            self.done = True

    def _char(self, char: str, out: list[str]) -> None:
        state = self._state
        if state == "string":
            self._string_char(char, out)
        elif state == "atom":
            if char in _NUMBER or char.isalpha():
                self._buffer += char
                return
            self._end_atom(out)
            if not self.failed and not self.done:
                self._char(char, out)
        elif char in " \t\r\n":
            return
        elif state in ("value", "value_or_close"):
            if state == "value_or_close" and char == "]":
                self._close_container("[", out)
            else:
                self._start_value(char, out)
        elif state in ("key", "key_or_close"):
            if state == "key_or_close" and char == "}":
                self._close_container("{", out)
            elif char == '"':
                self._state, self._in_key, self._buffer = "string", True, ""
            else:
                self._fail()
        elif state == "colon":
            if char != ":":
                self._fail()
            else:
                self._state = "value"
        elif char == "," and self._stack:
            out.append(", ")
            self._state = "key" if self._stack[-1][0] == "{" else "value"
        elif char in "}]" and self._stack:
            self._close_container("{" if char == "}" else "[", out)
        else:
            self._fail()

    def _start_value(self, char: str, out: list[str]) -> None:
        if char in "{[":
            out.append(char)
            self._stack.append((char, set()))
            self._state = "key_or_close" if char == "{" else "value_or_close"
        elif char == '"':
            out.append('"')
            self._state, self._in_key = "string", False
        elif char in _NUMBER or char in "tfn":
            self._state, self._buffer = "atom", char
        else:
            self._fail()

    def _close_container(self, opener: str, out: list[str]) -> None:
        if self._stack[-1][0] != opener:
            self._fail()
            return
        self._stack.pop()
        out.append("}" if opener == "{" else "]")
        self._close_value()

    def _end_atom(self, out: list[str]) -> None:
        try:
            value = json.loads(self._buffer)
        except (json.JSONDecodeError, RecursionError):
            self._fail()
            return
        if isinstance(value, str | dict | list):  # pragma: no cover - an atom is never one of these
            self._fail()
            return
        out.append(json.dumps(value))
        self._close_value()

    def _string_char(self, char: str, out: list[str]) -> None:
        if self._escape is not None:
            self._escape_char(char, out)
        elif char == "\\":
            self._escape = ""
        elif char == '"':
            self._flush_surrogate(out)
            self._end_string(out)
        elif ord(char) < 0x20:
            self._fail()
        else:
            self._decoded(char, out)

    def _escape_char(self, char: str, out: list[str]) -> None:
        assert self._escape is not None
        if self._escape == "" and char != "u":
            if char not in _ESCAPES:
                self._fail()
                return
            self._escape = None
            self._decoded(_ESCAPES[char], out)
            return
        if char == "u" and self._escape == "":
            self._escape = "u"
            return
        if char not in "0123456789abcdefABCDEF":
            self._fail()
            return
        self._escape += char
        if len(self._escape) == 5:
            code = chr(int(self._escape[1:], 16))
            self._escape = None
            if 0xD800 <= ord(code) < 0xDC00:
                self._flush_surrogate(out)
                self._high_surrogate = code
            elif 0xDC00 <= ord(code) < 0xE000 and self._high_surrogate:
                pair = (self._high_surrogate + code).encode("utf-16", "surrogatepass").decode("utf-16")
                self._high_surrogate = ""
                self._decoded(pair, out, flush=False)
            else:
                self._decoded(code, out)

    def _flush_surrogate(self, out: list[str]) -> None:
        if self._high_surrogate:
            lone, self._high_surrogate = self._high_surrogate, ""
            self._decoded(lone, out, flush=False)

    def _decoded(self, char: str, out: list[str], *, flush: bool = True) -> None:
        if flush:
            self._flush_surrogate(out)
        if self._in_key:
            self._buffer += char
        else:
            out.append(_escaped(char))

    def _end_string(self, out: list[str]) -> None:
        if not self._in_key:
            out.append('"')
            self._close_value()
            return
        keys = self._stack[-1][1]
        if self._buffer in keys:  # json.loads keeps the last value at the first key's place: not a prefix
            self._fail()
            return
        keys.add(self._buffer)
        out.append(json.dumps(self._buffer, ensure_ascii=False) + ": ")
        self._state, self._in_key = "colon", False
