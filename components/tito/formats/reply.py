"""Sampled text → reasoning, content and tool calls, with one tool format and one reasoning format; whole
(``ReplyParser.parse``) or token by token (``ReplyParser.stream``: deltas as the text arrives)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from components.tito.formats.base import (
    ArgumentsStream,
    ReasoningFormat,
    ToolFormat,
    partial_marker_cut,
    tool_call_id,
)
from components.tito.messages import ToolCall, ToolSpec


@dataclass(frozen=True, kw_only=True)
class ParsedReply:
    """What the model wrote, split into its parts."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    num_malformed_tool_calls: int = 0  # call-like blocks that stayed content (broken or unfinished)


@dataclass(frozen=True, kw_only=True)
class ReplyDelta:
    """One piece of a streamed reply: reasoning or content text, or one finished tool call."""

    kind: Literal["reasoning", "content", "tool_call_arguments", "tool_call"]
    text: str = ""
    tool_call: ToolCall | None = None
    index: int = 0  # the tool call's position in the reply
    # ``tool_call``: its arguments as streamed (``tool_call_arguments``) and the rest; they join to its arguments
    argument_pieces: tuple[str, ...] = ()


class ReplyParser:
    """Splits replies of one model family (its tool and reasoning formats) offered ``tools``."""

    def __init__(
        self,
        tool_format: ToolFormat,
        reasoning_format: ReasoningFormat,
        *,
        reasoning_opened_by_prompt: bool = False,
    ) -> None:
        self.tool_format = tool_format
        self.reasoning_format = reasoning_format
        self.reasoning_opened_by_prompt = reasoning_opened_by_prompt

    def parse(self, text: str, tools: Sequence[ToolSpec] = (), *, id_seed: str = "") -> ParsedReply:
        """The parts of a finished reply (never raises: malformed calls stay content and are counted)."""
        reasoning, rest = self.reasoning_format.split(text, opened_by_prompt=self.reasoning_opened_by_prompt)
        found = self.tool_format.parse(rest, tools)
        return ParsedReply(
            content=found.content,
            reasoning=reasoning,
            tool_calls=self._with_ids(found.tool_calls, id_seed),
            num_malformed_tool_calls=found.num_malformed,
        )

    def stream(self, tools: Sequence[ToolSpec] = (), *, id_seed: str = "") -> ReplyStream:
        """A parser to feed the reply's text piece by piece."""
        return ReplyStream(self, tools, id_seed)

    def _with_ids(self, calls: Sequence[ToolCall], id_seed: str) -> tuple[ToolCall, ...]:
        return tuple(
            call if call.id else dataclasses.replace(call, id=tool_call_id(id_seed, index))
            for index, call in enumerate(calls)
        )


class ReplyStream:
    """Deltas of a reply as its text arrives: content as soon as no marker can still change it, reasoning once
    its block closes, each tool call's JSON arguments as they are written (``tool_call_arguments``) and the
    call whole once it is complete (``tool_call``, with ``argument_pieces``: what was streamed of its arguments
    and the rest, together exactly its arguments).

    Linear in the reply: the text is parsed again only when a marker arrives (a call, its end, reasoning) or
    while the content's end is not yet the text's end (a few pieces after each marker); in between, content
    grows by the new text and a call's arguments go through the format's ``arguments_stream``.
    """

    def __init__(self, parser: ReplyParser, tools: Sequence[ToolSpec], id_seed: str) -> None:
        self.parser = parser
        self.tools = tuple(tools)
        self.id_seed = id_seed
        self.text = ""
        self.num_parses = 0  # full parses of the settled text (work done; see the class docstring)
        self._reasoning = ""
        self._content = ""
        self._num_calls = 0
        fmt = parser.tool_format
        self._markers = (*fmt.call_markers, *parser.reasoning_format.markers)
        self._gates = tuple(m for m in {*self._markers, *fmt.end_markers} if m)  # while a call is open
        self._opening_gates = tuple(
            m for m in set(self._markers) if m
        )  # elsewhere: a call or reasoning begins
        self._longest = max((len(m) for m in self._gates), default=1)
        self._seen = 0  # settled text already looked at for markers
        self._mode = "parse"  # parse (every piece) | content | reasoning | call
        self._held = ""  # whitespace at the content's end (sent once more content follows)
        self._call_at = 0  # where the unfinished call block starts in the text
        self._call_base = 0  # calls before that block
        self._next_ordinal = 0
        self._arguments: ArgumentsStream | None = None
        self._fed_to = 0
        self._look_from = 0
        self._last_end = 0
        self._ordinal = 0
        self._name = ""
        self._pieces: dict[int, list[str]] = {}

    def feed(self, piece: str) -> list[ReplyDelta]:
        """The deltas ``piece`` settles."""
        self.text += piece
        end = partial_marker_cut(self.text, self._markers)
        window = self.text[max(0, self._seen - self._longest + 1) : end]
        self._seen = max(self._seen, end)
        gates = self._gates if self._mode == "call" else self._opening_gates
        if self._mode == "parse" or any(marker in window for marker in gates):
            return self._deltas(final=False, end=end)
        if self._mode == "content":
            return self._more_content(self.text[self._last_end : end], end)
        if self._mode == "call":
            return self._call_arguments(end)
        return []

    def finish(self) -> list[ReplyDelta]:
        """The rest, once the reply is complete (what ``ReplyParser.parse`` finds, past what was sent)."""
        return self._deltas(final=True, end=len(self.text))

    def _more_content(self, new: str, end: int) -> list[ReplyDelta]:
        self._last_end = end
        text = self._held + new
        kept = text.rstrip()
        if not kept:
            self._held = text
            return []
        if not self._content:
            kept = kept.lstrip()
        self._held = text[len(text.rstrip()) :]
        self._content += kept
        return [ReplyDelta(kind="content", text=kept)]

    def _call_arguments(self, end: int) -> list[ReplyDelta]:
        self._last_end = end
        out: list[ReplyDelta] = []
        if self._arguments is None:
            if end - self._look_from > _MAX_OPENING:
                return out  # no opening in sight: this block's arguments come whole
            opening = self.parser.tool_format.open_call(self.text[self._call_at : end])
            if opening is None or opening.ordinal < self._next_ordinal:
                return out
            self._arguments = self.parser.tool_format.arguments_stream(opening.name, self.tools)
            self._fed_to = self._call_at + opening.arguments_at
            self._ordinal, self._name = opening.ordinal, opening.name
        index = self._call_base + self._ordinal
        text = self._arguments.feed(self.text[self._fed_to : end])
        self._fed_to = end
        if text:
            first = index not in self._pieces
            self._pieces.setdefault(index, []).append(text)
            # the id ``parse`` gives a call whose format writes none (a live stream's first piece carries it)
            call = (
                ToolCall(id=tool_call_id(self.id_seed, index), name=self._name, arguments="")
                if first
                else None
            )
            out.append(ReplyDelta(kind="tool_call_arguments", text=text, tool_call=call, index=index))
        if self._arguments.done or self._arguments.failed:
            self._arguments = None
            self._next_ordinal = self._ordinal + 1
            self._look_from = end
        return out

    def _deltas(self, *, final: bool, end: int) -> list[ReplyDelta]:
        self.num_parses += 1
        self._last_end = end
        parser = self.parser
        text = self.text
        opened = parser.reasoning_opened_by_prompt
        mode = "parse"
        after = None
        if final:
            parsed = parser.parse(text, self.tools, id_seed=self.id_seed)
            reasoning, content, calls = parsed.reasoning or "", parsed.content, parsed.tool_calls
        else:
            settled = text[:end]
            if parser.reasoning_format.in_progress(settled, opened_by_prompt=opened):
                reasoning, content, calls = "", "", ()  # the reasoning is sent once its block closes
                mode = "reasoning"
            else:
                split_reasoning, rest = parser.reasoning_format.split(settled, opened_by_prompt=opened)
                reasoning = split_reasoning or ""
                found = parser.tool_format.parse(rest, self.tools)
                pending = found.pending_from
                if pending is not None:
                    found = parser.tool_format.parse(rest[:pending], self.tools)
                content = found.content if pending is None else ""
                calls = parser._with_ids(found.tool_calls, self.id_seed)
                after = (settled, rest, pending, len(calls))
        out: list[ReplyDelta] = []
        if reasoning.startswith(self._reasoning) and len(reasoning) > len(self._reasoning):
            out.append(ReplyDelta(kind="reasoning", text=reasoning[len(self._reasoning) :]))
            self._reasoning = reasoning
        if content.startswith(self._content) and len(content) > len(self._content):
            out.append(ReplyDelta(kind="content", text=content[len(self._content) :]))
            self._content = content
        for index in range(self._num_calls, len(calls)):
            pieces = settled_pieces(self._pieces.get(index, ()), calls[index].arguments)
            out.append(
                ReplyDelta(kind="tool_call", tool_call=calls[index], index=index, argument_pieces=pieces)
            )
        self._num_calls = max(self._num_calls, len(calls))
        self._mode = mode if after is None else self._mode_after(*after)
        if self._mode == "call":
            out.extend(self._call_arguments(end))
        return out

    def _mode_after(self, settled: str, rest: str, pending: int | None, num_calls: int) -> str:
        """What the next pieces can do without a parse: grow the content, or an unfinished call's arguments."""
        if not settled.endswith(rest):
            return "parse"
        if pending is not None:
            at = len(settled) - len(rest) + pending
            if at != self._call_at or self._call_base != num_calls:
                self._call_at, self._call_base, self._next_ordinal = at, num_calls, 0
                self._arguments, self._look_from = None, at
            return "call"
        content = self._content
        if not content:
            return "parse"
        last_marker = max((settled.rfind(m) + len(m) for m in self._gates if m in settled), default=0)
        tail = settled[last_marker:]
        if not tail.strip() or not content.endswith(tail.strip()):
            return "parse"
        self._held = tail[len(tail.rstrip()) :]
        return "content"


_MAX_OPENING = 512  # characters of a call block in which its arguments' opening must appear to be streamed


def settled_pieces(streamed: Sequence[str], arguments: str) -> tuple[str, ...]:
    """A finished call's arguments as the pieces streamed so far and the rest (all of it whole when what was
    streamed is not a beginning of the final arguments)."""
    sent = "".join(streamed)
    if not arguments.startswith(sent):
        return (arguments,)
    rest = arguments[len(sent) :]
    return (*streamed, rest) if rest else tuple(streamed) or (arguments,)


def call_argument_pieces(deltas: Sequence[ReplyDelta] | None, index: int, arguments: str) -> tuple[str, ...]:
    """How a wire protocol streams call ``index``'s ``arguments``: the pieces its tokens wrote, when the reply's
    deltas have them and they join to exactly ``arguments``; else the arguments whole."""
    for delta in deltas or ():
        if delta.kind == "tool_call" and delta.index == index and "".join(delta.argument_pieces) == arguments:
            return delta.argument_pieces or (arguments,)
    return (arguments,)


def unsent_arguments(sent: str, arguments: str) -> str:
    """What a live stream still owes of a finished call's ``arguments`` after sending ``sent`` of them: the
    rest when ``sent`` begins them, else nothing (pieces already on the wire cannot be taken back)."""
    return arguments[len(sent) :] if arguments.startswith(sent) else ""
