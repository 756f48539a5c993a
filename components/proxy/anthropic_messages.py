"""Anthropic Messages ⇄ canonical turns, as Claude Code uses it.

Accepted: ``system`` (a string or text blocks), ``messages`` (roles user/assistant; content a string or blocks:
``text``, ``image``/``document`` (→ a short placeholder), ``tool_use``, ``tool_result`` (content a string or
blocks, ``is_error`` → the text is prefixed with ``Error: ``), ``thinking`` (→ the assistant turn's reasoning);
``redacted_thinking``, server-tool blocks and unknown block types are skipped), ``tools`` (custom tools with
``input_schema``; server tools such as ``web_search_20250305`` are skipped), ``max_tokens``, ``temperature``,
``top_p``, ``top_k`` (sampling settings: used only when the proxy lets agents choose), ``stop_sequences``,
``stream``. Ignored: ``model``, ``thinking`` budgets, ``cache_control``, ``metadata``, ``tool_choice``,
``?beta=true`` and ``anthropic-beta`` headers.

A ``system`` role inside ``messages`` (Claude Code sends mid-conversation notes that way) becomes a canonical
system message at that position.

Tool results inside a user message become canonical ``tool`` messages (in order) followed by one ``user``
message with the remaining text, if any. Streaming sends ``message_start``, then the reply's
blocks as its sampled tokens make them (``TitoSession.reply_deltas``: thinking and text blocks grow by one
``content_block_delta`` per settled piece, each tool_use block comes whole with one ``input_json_delta`` once
its call is complete), ``message_delta`` (stop_reason end_turn/tool_use/max_tokens and usage)
and ``message_stop``; ``event: ping`` frames keep the connection alive while the engine works.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from components.json_types import JsonObject, JsonValue
from components.proxy.errors import InvalidRequestError
from components.proxy.json_fields import (
    get_bool,
    get_int,
    get_list,
    get_number,
    get_stop,
    get_str,
    read_tool_spec,
    require_list,
    require_object,
)
from components.proxy.sessions import TurnOutcome, TurnRequest, TurnStarted
from components.tito.formats import ReplyDelta, call_argument_pieces, unsent_arguments
from components.tito.messages import ChatMessage, ToolCall, ToolSpec

PLACEHOLDERS = {"image": "[image]", "document": "[document]"}
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


@dataclass(frozen=True, kw_only=True)
class MessagesRequest:
    turn: TurnRequest
    model: str
    stream: bool


def _blocks(content: JsonValue, where: str) -> list[JsonObject]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks = []
    for index, block in enumerate(require_list(content, where)):
        block = require_object(block, f"{where}[{index}]")
        get_str(block, "type", f"{where}[{index}]")
        blocks.append(block)
    return blocks


def _text_of(content: JsonValue, where: str) -> str:
    """Text of a string or of text blocks (tool_result content, system)."""
    if content is None:
        return ""
    texts = []
    for index, block in enumerate(_blocks(content, where)):
        block_type = block["type"]
        if block_type == "text":
            texts.append(get_str(block, "text", f"{where}[{index}]"))
        elif block_type in PLACEHOLDERS:
            texts.append(PLACEHOLDERS[block_type])
    return "\n".join(texts)


def _user_messages(content: JsonValue, where: str) -> list[ChatMessage]:
    tool_messages = []
    texts = []
    for index, block in enumerate(_blocks(content, where)):
        block_where = f"{where}[{index}]"
        block_type = block["type"]
        if block_type == "text":
            texts.append(get_str(block, "text", block_where))
        elif block_type in PLACEHOLDERS:
            texts.append(PLACEHOLDERS[block_type])
        elif block_type == "tool_result":
            text = _text_of(block.get("content"), f"{block_where}.content")
            if get_bool(block, "is_error", block_where):
                text = f"Error: {text}"
            tool_messages.append(
                ChatMessage(
                    role="tool", content=text, tool_call_id=get_str(block, "tool_use_id", block_where)
                )
            )
        elif block_type in ("tool_use", "thinking"):
            raise InvalidRequestError(
                f"{block_where}.type: a {block_type!r} block belongs to an assistant message"
            )
    messages = tool_messages
    if texts or not tool_messages:
        messages.append(ChatMessage(role="user", content="\n".join(texts)))
    return messages


def _assistant_message(content: JsonValue, where: str) -> ChatMessage:
    texts = []
    reasoning = []
    calls = []
    for index, block in enumerate(_blocks(content, where)):
        block_where = f"{where}[{index}]"
        block_type = block["type"]
        if block_type == "text":
            texts.append(get_str(block, "text", block_where))
        elif block_type == "thinking":
            reasoning.append(get_str(block, "thinking", block_where))
        elif block_type == "tool_use":
            tool_input = block.get("input", {})
            if not isinstance(tool_input, dict):
                raise InvalidRequestError(f"{block_where}.input: expected an object")
            calls.append(
                ToolCall(
                    id=get_str(block, "id", block_where),
                    name=get_str(block, "name", block_where),
                    arguments=json.dumps(tool_input, ensure_ascii=False),
                )
            )
        elif block_type == "tool_result":
            raise InvalidRequestError(f"{block_where}.type: a 'tool_result' block belongs to a user message")
    return ChatMessage(
        role="assistant",
        content="".join(texts),
        tool_calls=tuple(calls),
        reasoning="\n".join(reasoning) or None,
    )


def parse_conversation(body: JsonObject) -> tuple[tuple[ChatMessage, ...], tuple[ToolSpec, ...]]:
    """``system`` + ``messages`` + ``tools`` → canonical messages and tool specs."""
    messages: list[ChatMessage] = []
    system = _text_of(body.get("system"), "body.system")
    if system:
        messages.append(ChatMessage(role="system", content=system))
    raw_messages = get_list(body, "messages", "body")
    if not raw_messages:
        raise InvalidRequestError("body.messages: must contain at least one message")
    for index, raw in enumerate(raw_messages):
        where = f"messages[{index}]"
        raw = require_object(raw, where)
        role = get_str(raw, "role", where)
        if "content" not in raw:
            raise InvalidRequestError(f"{where}.content: missing")
        if role == "user":
            messages.extend(_user_messages(raw["content"], f"{where}.content"))
        elif role == "assistant":
            messages.append(_assistant_message(raw["content"], f"{where}.content"))
        elif role == "system":  # Claude Code puts mid-conversation system notes into messages
            messages.append(ChatMessage(role="system", content=_text_of(raw["content"], f"{where}.content")))
        else:
            raise InvalidRequestError(
                f"{where}.role: unknown role {role!r}; allowed: user, assistant, system"
            )
    return tuple(messages), parse_tools(body.get("tools"))


def parse_tools(value: JsonValue) -> tuple[ToolSpec, ...]:
    """Custom tools; server tools (``type`` other than ``custom``) are skipped."""
    if value is None:
        return ()
    tools = []
    for index, raw in enumerate(require_list(value, "body.tools")):
        where = f"tools[{index}]"
        raw = require_object(raw, where)
        if raw.get("type", "custom") != "custom":
            continue
        tools.append(read_tool_spec(raw, where, schema_key="input_schema"))
    return tuple(tools)


def parse_request(body: JsonObject) -> MessagesRequest:
    """A Messages request body → a canonical turn plus the response options."""
    messages, tools = parse_conversation(body)
    turn = TurnRequest(
        messages=messages,
        tools=tools,
        max_tokens=get_int(body, "max_tokens", "body", minimum=1),
        temperature=get_number(body, "temperature", "body", default=1.0, minimum=0.0, maximum=1.0),
        top_p=get_number(body, "top_p", "body", default=1.0, minimum=0.0, maximum=1.0, open_low=True),
        top_k=get_int(body, "top_k", "body", default=0, minimum=0),
        stop=get_stop(body, "stop_sequences", "body"),
        want_deltas=get_bool(body, "stream", "body"),
    )
    model = body.get("model")
    return MessagesRequest(
        turn=turn,
        model=model if isinstance(model, str) and model else "rein-policy",
        stream=turn.want_deltas,
    )


def _tool_input(arguments: str) -> JsonObject:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _content_blocks(outcome: TurnOutcome, message_id: str) -> list[JsonObject]:
    reply = outcome.reply
    blocks: list[JsonObject] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    suffix = message_id.removeprefix("msg_")
    for index, call in enumerate(reply.tool_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id or f"toolu_{suffix}_{index}",
                "name": call.name,
                "input": _tool_input(call.arguments),
            }
        )
    return blocks


def _usage(outcome: TurnOutcome) -> JsonObject:
    return {
        "input_tokens": outcome.num_prompt_tokens,
        "output_tokens": outcome.num_completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def render_response(
    outcome: TurnOutcome, request: MessagesRequest, *, response_id: str, created: int
) -> JsonObject:
    """The ``message`` object."""
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": _content_blocks(outcome, response_id),
        "stop_reason": STOP_REASONS.get(outcome.reply.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": _usage(outcome),
    }


def _event(event_type: str, payload: JsonObject) -> bytes:
    return (
        f"event: {event_type}\ndata: ".encode() + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"
    )


def _stream_block(block: JsonObject) -> tuple[JsonObject, list[JsonObject]]:
    """A finished content block as its empty start form and its deltas."""
    if block["type"] == "text":
        return {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}]
    if block["type"] == "thinking":
        empty = {"type": "thinking", "thinking": "", "signature": ""}
        return empty, [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": ""},
        ]
    return {**block, "input": {}}, [
        {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
    ]


def _stream_blocks(
    outcome: TurnOutcome, content: list[JsonObject]
) -> list[tuple[JsonObject, list[JsonObject]]]:
    """The blocks to stream: each finished block whole, or (with the reply's token deltas) thinking and text
    blocks growing delta by delta and each tool_use block as soon as its call is complete."""
    if outcome.deltas is None:
        return [_stream_block(block) for block in content]
    tool_blocks = iter(block for block in content if block["type"] == "tool_use")

    def tool_block(index: int) -> tuple[JsonObject, list[JsonObject]]:
        empty, whole = _stream_block(next(tool_blocks))
        pieces = call_argument_pieces(outcome.deltas, index, whole[0]["partial_json"])
        return empty, [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]

    blocks: list[tuple[JsonObject, list[JsonObject]]] = []
    kind = None
    for delta in outcome.deltas:
        if delta.kind == "tool_call_arguments":
            continue  # sent with its call's block (``call_argument_pieces``)
        if delta.kind == "tool_call":
            blocks.append(tool_block(delta.index))
            kind = "tool_call"
            continue
        if delta.kind != kind:
            empty, closing = _stream_block(
                {"type": "thinking", "thinking": ""}
                if delta.kind == "reasoning"
                else {"type": "text", "text": ""}
            )
            blocks.append((empty, closing[1:]))  # the thinking block's signature delta closes it
            kind = delta.kind
        if delta.kind == "reasoning":
            blocks[-1][1].insert(len(blocks[-1][1]) - 1, {"type": "thinking_delta", "thinking": delta.text})
        else:
            blocks[-1][1].append({"type": "text_delta", "text": delta.text})
    return blocks or [_stream_block(block) for block in content]


def render_stream(
    outcome: TurnOutcome, request: MessagesRequest, *, response_id: str, created: int
) -> list[bytes]:
    """The streaming events of the finished message."""
    message = render_response(outcome, request, response_id=response_id, created=created)
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {**message["usage"], "output_tokens": 0},
    }
    frames = [_event("message_start", {"type": "message_start", "message": start})]
    for index, (empty, deltas) in enumerate(_stream_blocks(outcome, message["content"])):
        frames.append(
            _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
            )
        )
        for delta in deltas:
            frames.append(
                _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        frames.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    frames.append(
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": message["usage"],
            },
        )
    )
    frames.append(_event("message_stop", {"type": "message_stop"}))
    return frames


class LiveStream:
    """The events of a message streamed as the engine samples it: ``message_start``, a thinking block and a text
    block growing delta by delta, a tool_use block per call opened when its arguments begin (its
    ``input_json_delta`` pieces as the tokens write them), then ``message_delta`` and ``message_stop``."""

    def __init__(self, request: MessagesRequest, *, response_id: str, created: int) -> None:
        self.request = request
        self.response_id = response_id
        self._index = -1  # the open content block's index (-1: none yet)
        self._open: str | None = None  # its kind: reasoning | content | a call's index as text
        self._sent_arguments: dict[int, str] = {}

    def start(self, started: TurnStarted) -> list[bytes]:
        """``message_start`` once the engine has begun sampling."""
        message = {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "model": self.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": started.num_prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [_event("message_start", {"type": "message_start", "message": message})]

    def _block(self, kind: str, empty: JsonObject) -> list[bytes]:
        frames = self._close()
        self._index += 1
        self._open = kind
        start = {"type": "content_block_start", "index": self._index, "content_block": empty}
        return [*frames, _event("content_block_start", start)]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        frames = []
        if self._open == "reasoning":
            frames.append(self._delta({"type": "signature_delta", "signature": ""}))
        frames.append(_event("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
        return frames

    def _delta(self, delta: JsonObject) -> bytes:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )

    def delta(self, delta: ReplyDelta) -> list[bytes]:
        """The events of one delta."""
        frames: list[bytes] = []
        if delta.kind == "reasoning":
            if self._open != "reasoning":
                frames += self._block("reasoning", {"type": "thinking", "thinking": "", "signature": ""})
            return [*frames, self._delta({"type": "thinking_delta", "thinking": delta.text})]
        if delta.kind == "content":
            if self._open != "content":
                frames += self._block("content", {"type": "text", "text": ""})
            return [*frames, self._delta({"type": "text_delta", "text": delta.text})]
        call, kind = delta.tool_call, str(delta.index)
        if self._open != kind and delta.index not in self._sent_arguments and call is not None:
            suffix = self.response_id.removeprefix("msg_")
            empty = {
                "type": "tool_use",
                "id": call.id or f"toolu_{suffix}_{delta.index}",
                "name": call.name,
                "input": {},
            }
            frames += self._block(kind, empty)
            self._sent_arguments[delta.index] = ""
        if delta.kind == "tool_call_arguments":
            piece = delta.text
        else:
            assert call is not None
            whole = json.dumps(_tool_input(call.arguments), ensure_ascii=False)
            piece = unsent_arguments(self._sent_arguments[delta.index], whole)
        if piece and self._open == kind:
            self._sent_arguments[delta.index] += piece
            frames.append(self._delta({"type": "input_json_delta", "partial_json": piece}))
        if delta.kind == "tool_call" and self._open == kind:
            frames += self._close()
        return frames

    def finish(self, outcome: TurnOutcome) -> list[bytes]:
        """The closing events."""
        stop_reason = STOP_REASONS.get(outcome.reply.finish_reason, "end_turn")
        frames = self._close()
        if self._index < 0:  # nothing was said: the empty text block a finished message has
            frames += self._block("content", {"type": "text", "text": ""}) + self._close()
        message_delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": _usage(outcome),
        }
        frames.append(_event("message_delta", message_delta))
        frames.append(_event("message_stop", {"type": "message_stop"}))
        return frames


def parse_count_tokens(body: JsonObject) -> tuple[tuple[ChatMessage, ...], tuple[ToolSpec, ...]]:
    """A ``count_tokens`` body → canonical messages and tools."""
    return parse_conversation(body)


KEEPALIVE_FRAME = _event("ping", {"type": "ping"})


def error_body(status_code: int, error_type: str, message: str) -> JsonObject:
    """Anthropic's error shape (context overflow keeps the stable type ``context_overflow``)."""
    return {"type": "error", "error": {"type": error_type, "message": message}}


def stream_error_frame(error_type: str, message: str) -> bytes:
    """An ``event: error`` inside an already-started stream."""
    return _event("error", error_body(0, error_type, message))
