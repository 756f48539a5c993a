"""Sampled text → reasoning, content and tool calls, with one tool format and one reasoning format; whole
(``ReplyParser.parse``) or token by token (``ReplyParser.stream``: deltas as the text arrives)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from components.tito.formats.base import ReasoningFormat, ToolFormat, partial_marker_cut, tool_call_id
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

    kind: Literal["reasoning", "content", "tool_call"]
    text: str = ""
    tool_call: ToolCall | None = None
    index: int = 0  # the tool call's position in the reply


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
    """Deltas of a reply as its text arrives: reasoning and content as soon as no marker can still change
    them, each tool call once it is complete."""

    def __init__(self, parser: ReplyParser, tools: Sequence[ToolSpec], id_seed: str) -> None:
        self.parser = parser
        self.tools = tuple(tools)
        self.id_seed = id_seed
        self.text = ""
        self._reasoning = ""
        self._content = ""
        self._num_calls = 0
        self._markers = (*parser.tool_format.call_markers, *parser.reasoning_format.markers)

    def feed(self, piece: str) -> list[ReplyDelta]:
        """The deltas ``piece`` settles."""
        self.text += piece
        return self._deltas(final=False)

    def finish(self) -> list[ReplyDelta]:
        """The rest, once the reply is complete (what ``ReplyParser.parse`` finds, past what was sent)."""
        return self._deltas(final=True)

    def _deltas(self, *, final: bool) -> list[ReplyDelta]:
        parser = self.parser
        text = self.text
        opened = parser.reasoning_opened_by_prompt
        if final:
            parsed = parser.parse(text, self.tools, id_seed=self.id_seed)
            reasoning, content, calls = parsed.reasoning or "", parsed.content, parsed.tool_calls
        else:
            settled = text[: partial_marker_cut(text, self._markers)]
            if parser.reasoning_format.in_progress(settled, opened_by_prompt=opened):
                reasoning, content, calls = "", "", ()  # the reasoning is sent once its block closes
            else:
                split_reasoning, rest = parser.reasoning_format.split(settled, opened_by_prompt=opened)
                reasoning = split_reasoning or ""
                found = parser.tool_format.parse(rest, self.tools)
                if found.pending_from is not None:
                    found = parser.tool_format.parse(rest[: found.pending_from], self.tools)
                content = found.content if found.pending_from is None else ""
                calls = parser._with_ids(found.tool_calls, self.id_seed)
        out: list[ReplyDelta] = []
        if reasoning.startswith(self._reasoning) and len(reasoning) > len(self._reasoning):
            out.append(ReplyDelta(kind="reasoning", text=reasoning[len(self._reasoning) :]))
            self._reasoning = reasoning
        if content.startswith(self._content) and len(content) > len(self._content):
            out.append(ReplyDelta(kind="content", text=content[len(self._content) :]))
            self._content = content
        for index in range(self._num_calls, len(calls)):
            out.append(ReplyDelta(kind="tool_call", tool_call=calls[index], index=index))
        self._num_calls = max(self._num_calls, len(calls))
        return out
