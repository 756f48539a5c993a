"""OpenAI Chat Completions ⇄ canonical turns.

Accepted: ``messages`` (roles system/developer/user/assistant/tool; content as a string or an array of content
parts - non-text parts become a short placeholder such as ``[image]``), ``tools`` (function tools; other tool
types are ignored), ``tool_choice``, ``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``,
``stop``, ``seed``, ``n`` (1 only), ``stream`` with ``stream_options.include_usage``, ``logprobs`` and
``top_logprobs``. Anything else (other model names, ``parallel_tool_calls``, ``reasoning_effort``,
``metadata``, ``user`` ...) is accepted and ignored.

``top_logprobs``: the engine returns only the sampled token's logprob, so each position's ``top_logprobs``
lists just the sampled token. Streaming sends the reply as its sampled tokens make it (``TitoSession.reply_deltas``,
through the model family's streaming parser): a role chunk, then reasoning and content deltas as the tokens
settle them and one ``tool_calls`` delta per call as soon as it is complete, a finish chunk, an optional usage
chunk, then ``data: [DONE]``. With ``logprobs`` the content comes as one chunk carrying them all.
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
    json_text,
    read_tool_spec,
    require_list,
    require_object,
)
from components.proxy.sessions import TokenLogprob, TurnOutcome, TurnRequest, TurnStarted
from components.tito.formats import ReplyDelta, call_argument_pieces, unsent_arguments
from components.tito.messages import ChatMessage, ToolCall, ToolSpec

ROLE_ALIASES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
PLACEHOLDERS = {
    "image_url": "[image]",
    "input_image": "[image]",
    "image": "[image]",
    "input_audio": "[audio]",
    "file": "[file]",
    "input_file": "[file]",
}
TEXT_PART_TYPES = ("text", "input_text", "output_text", "refusal")


@dataclass(frozen=True, kw_only=True)
class ChatCompletionsRequest:
    turn: TurnRequest
    model: str
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int


def content_text(content: JsonValue, where: str) -> str:
    """A message ``content``: a string, null, or an array of content parts → text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = require_list(content, where)
    texts = []
    for index, part in enumerate(parts):
        part_where = f"{where}[{index}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        part = require_object(part, part_where)
        part_type = get_str(part, "type", part_where)
        if part_type in TEXT_PART_TYPES:
            texts.append(
                get_str(part, "text" if part_type != "refusal" else "refusal", part_where, default="")
            )
        elif part_type in PLACEHOLDERS:
            texts.append(PLACEHOLDERS[part_type])
        else:
            raise InvalidRequestError(f"{part_where}.type: unsupported content part type {part_type!r}")
    return "\n".join(texts)


def parse_tool_calls(value: JsonValue, where: str) -> tuple[ToolCall, ...]:
    """Assistant ``tool_calls`` → canonical tool calls."""
    calls = []
    for index, raw in enumerate(require_list(value, where)):
        call_where = f"{where}[{index}]"
        raw = require_object(raw, call_where)
        function = require_object(raw.get("function"), f"{call_where}.function")
        calls.append(
            ToolCall(
                id=get_str(raw, "id", call_where),
                name=get_str(function, "name", f"{call_where}.function"),
                arguments=json_text(function.get("arguments", "{}"), f"{call_where}.function.arguments"),
            )
        )
    return tuple(calls)


def parse_message(raw: JsonValue, where: str) -> ChatMessage:
    """One Chat Completions message → a canonical message."""
    raw = require_object(raw, where)
    role = get_str(raw, "role", where)
    if role not in ROLE_ALIASES:
        raise InvalidRequestError(
            f"{where}.role: unknown role {role!r}; allowed: system, developer, user, assistant, tool"
        )
    role = ROLE_ALIASES[role]
    content = content_text(raw.get("content"), f"{where}.content")
    if role == "assistant":
        reasoning = raw.get("reasoning_content", raw.get("reasoning"))
        if reasoning is not None and not isinstance(reasoning, str):
            raise InvalidRequestError(f"{where}.reasoning_content: expected a string")
        tool_calls = (
            parse_tool_calls(raw["tool_calls"], f"{where}.tool_calls") if raw.get("tool_calls") else ()
        )
        return ChatMessage(
            role="assistant", content=content, tool_calls=tool_calls, reasoning=reasoning or None
        )
    if role == "tool":
        return ChatMessage(role="tool", content=content, tool_call_id=get_str(raw, "tool_call_id", where))
    return ChatMessage(role=role, content=content)


def parse_tools(value: JsonValue, where: str) -> tuple[ToolSpec, ...]:
    """``tools`` → function tool specs (other tool types are skipped)."""
    if value is None:
        return ()
    tools = []
    for index, raw in enumerate(require_list(value, where)):
        tool_where = f"{where}[{index}]"
        raw = require_object(raw, tool_where)
        if raw.get("type", "function") != "function":
            continue
        function = require_object(raw.get("function"), f"{tool_where}.function")
        tools.append(read_tool_spec(function, f"{tool_where}.function", schema_key="parameters"))
    return tuple(tools)


def parse_request(body: JsonObject) -> ChatCompletionsRequest:
    """A Chat Completions request body → a canonical turn plus the response options."""
    where = "body"
    raw_messages = get_list(body, "messages", where)
    if not raw_messages:
        raise InvalidRequestError("body.messages: must contain at least one message")
    messages = tuple(parse_message(m, f"messages[{i}]") for i, m in enumerate(raw_messages))
    num_choices = get_int(body, "n", where, default=1, minimum=1)
    if num_choices != 1:
        raise InvalidRequestError(
            f"body.n: only n=1 is supported (one sample per policy call), got {num_choices}"
        )
    max_tokens = get_int(body, "max_completion_tokens", where, minimum=1)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", where, minimum=1)
    stream = get_bool(body, "stream", where)
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        include_usage = get_bool(
            require_object(stream_options, "body.stream_options"), "include_usage", where
        )
    logprobs = get_bool(body, "logprobs", where)
    top_logprobs = get_int(body, "top_logprobs", where, default=0, minimum=0) or 0
    turn = TurnRequest(
        messages=messages,
        tools=parse_tools(body.get("tools"), "body.tools"),
        max_tokens=max_tokens,
        temperature=get_number(body, "temperature", where, default=1.0, minimum=0.0, maximum=2.0),
        top_p=get_number(body, "top_p", where, default=1.0, minimum=0.0, maximum=1.0, open_low=True),
        stop=get_stop(body, "stop", where),
        seed=get_int(body, "seed", where),
        want_token_logprobs=logprobs,
        want_deltas=stream and not logprobs,
    )
    model = body.get("model")
    return ChatCompletionsRequest(
        turn=turn,
        model=model if isinstance(model, str) and model else "rein-policy",
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


def _tool_calls_json(outcome: TurnOutcome, response_id: str) -> list[JsonObject]:
    return [
        {
            "id": call.id or f"call_{response_id[-12:]}_{index}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for index, call in enumerate(outcome.reply.tool_calls)
    ]


def _logprobs_json(token_logprobs: tuple[TokenLogprob, ...] | None, with_top: bool) -> JsonObject | None:
    if token_logprobs is None:
        return None
    content = []
    for entry in token_logprobs:
        token_bytes = list(entry.token.encode("utf-8"))
        top = [{"token": entry.token, "logprob": entry.logprob, "bytes": token_bytes}] if with_top else []
        content.append(
            {"token": entry.token, "logprob": entry.logprob, "bytes": token_bytes, "top_logprobs": top}
        )
    return {"content": content, "refusal": None}


def _usage_json(outcome: TurnOutcome) -> JsonObject:
    return {
        "prompt_tokens": outcome.num_prompt_tokens,
        "completion_tokens": outcome.num_completion_tokens,
        "total_tokens": outcome.num_prompt_tokens + outcome.num_completion_tokens,
    }


def render_response(
    outcome: TurnOutcome, request: ChatCompletionsRequest, *, response_id: str, created: int
) -> JsonObject:
    """The ``chat.completion`` object."""
    reply = outcome.reply
    tool_calls = _tool_calls_json(outcome, response_id)
    message: JsonObject = {
        "role": "assistant",
        "content": reply.content if (reply.content or not tool_calls) else None,
        "refusal": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": request.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason,
                "logprobs": _logprobs_json(outcome.token_logprobs, request.top_logprobs > 0),
            }
        ],
        "usage": _usage_json(outcome),
    }


def _frame(payload: JsonObject) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def render_stream(
    outcome: TurnOutcome, request: ChatCompletionsRequest, *, response_id: str, created: int
) -> list[bytes]:
    """The ``chat.completion.chunk`` SSE frames, ending with ``data: [DONE]``."""
    reply = outcome.reply
    usage_field = {"usage": None} if request.include_usage else {}

    def chunk(
        delta: JsonObject, finish_reason: str | None = None, logprobs: JsonObject | None = None
    ) -> bytes:
        return _frame(
            {
                "id": response_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": request.model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
                ],
                **usage_field,
            }
        )

    frames = [chunk({"role": "assistant", "content": ""})]
    if outcome.deltas is not None:
        for delta in outcome.deltas:
            if delta.kind == "reasoning":
                frames.append(chunk({"reasoning_content": delta.text}))
            elif delta.kind == "content":
                frames.append(chunk({"content": delta.text}))
            elif delta.kind == "tool_call" and delta.tool_call is not None:
                call = delta.tool_call
                pieces = call_argument_pieces(outcome.deltas, delta.index, call.arguments)
                first = {"index": delta.index, "id": call.id, "type": "function"}
                for number, piece in enumerate(pieces):  # the arguments as the sampled tokens wrote them
                    head = first if number == 0 else {"index": delta.index}
                    function = (
                        {"name": call.name, "arguments": piece} if number == 0 else {"arguments": piece}
                    )
                    frames.append(chunk({"tool_calls": [{**head, "function": function}]}))
    elif reply.reasoning:
        frames.append(chunk({"reasoning_content": reply.reasoning}))
    if outcome.deltas is None:
        logprobs = _logprobs_json(outcome.token_logprobs, request.top_logprobs > 0)
        if reply.content or logprobs is not None:
            frames.append(chunk({"content": reply.content}, logprobs=logprobs))
        for index, call in enumerate(_tool_calls_json(outcome, response_id)):
            frames.append(chunk({"tool_calls": [{"index": index, **call}]}))
    frames.append(chunk({}, finish_reason=reply.finish_reason))
    if request.include_usage:
        frames.append(
            _frame(
                {
                    "id": response_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": request.model,
                    "system_fingerprint": None,
                    "choices": [],
                    "usage": _usage_json(outcome),
                }
            )
        )
    frames.append(b"data: [DONE]\n\n")
    return frames


class LiveStream:
    """The ``chat.completion.chunk`` frames of a turn streamed as the engine samples it: the role chunk, each
    reasoning and content delta, each call's first chunk (id, name) once its arguments begin and its argument
    pieces as the tokens write them, then the finish chunk, usage and ``[DONE]``."""

    def __init__(self, request: ChatCompletionsRequest, *, response_id: str, created: int) -> None:
        self.request = request
        self.response_id = response_id
        self.created = created
        self._sent_arguments: dict[int, str] = {}  # per call index: the arguments sent so far

    def _chunk(self, delta: JsonObject, finish_reason: str | None = None) -> bytes:
        return _frame(
            {
                "id": self.response_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.request.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
                **({"usage": None} if self.request.include_usage else {}),
            }
        )

    def start(self, started: TurnStarted) -> list[bytes]:
        """The frames once the engine has begun sampling."""
        return [self._chunk({"role": "assistant", "content": ""})]

    def delta(self, delta: ReplyDelta) -> list[bytes]:
        """The frames of one delta."""
        if delta.kind == "reasoning":
            return [self._chunk({"reasoning_content": delta.text})]
        if delta.kind == "content":
            return [self._chunk({"content": delta.text})]
        if delta.kind == "tool_call_arguments":
            return [self._arguments(delta.index, delta.tool_call, delta.text)]
        call = delta.tool_call
        assert call is not None
        if delta.index not in self._sent_arguments:
            return [self._arguments(delta.index, call, call.arguments)]
        rest = unsent_arguments(self._sent_arguments[delta.index], call.arguments)
        return [self._arguments(delta.index, None, rest)] if rest else []

    def _arguments(self, index: int, call: ToolCall | None, piece: str) -> bytes:
        first = index not in self._sent_arguments
        self._sent_arguments[index] = self._sent_arguments.get(index, "") + piece
        head: JsonObject = {"index": index}
        function: JsonObject = {"arguments": piece}
        if first and call is not None:
            head = {
                "index": index,
                "id": call.id or f"call_{self.response_id[-12:]}_{index}",
                "type": "function",
            }
            function = {"name": call.name, "arguments": piece}
        return self._chunk({"tool_calls": [{**head, "function": function}]})

    def finish(self, outcome: TurnOutcome) -> list[bytes]:
        """The closing frames."""
        frames = [self._chunk({}, finish_reason=outcome.reply.finish_reason)]
        if self.request.include_usage:
            frames.append(
                _frame(
                    {
                        "id": self.response_id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.request.model,
                        "system_fingerprint": None,
                        "choices": [],
                        "usage": _usage_json(outcome),
                    }
                )
            )
        frames.append(b"data: [DONE]\n\n")
        return frames


KEEPALIVE_FRAME = b": keep-alive\n\n"


def error_body(status_code: int, error_type: str, message: str) -> JsonObject:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": error_type}}


def stream_error_frame(error_type: str, message: str) -> bytes:
    """An error inside an already-started stream (the SDKs raise on a data frame with ``error``)."""
    return _frame(error_body(0, error_type, message)) + b"data: [DONE]\n\n"
