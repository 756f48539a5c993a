"""OpenAI Responses API ⇄ canonical turns, as Codex CLI uses it.

Accepted: ``input`` (a string, or items: ``message`` with input_text/output_text parts, ``function_call``,
``function_call_output``, ``custom_tool_call``/``custom_tool_call_output``; ``reasoning`` items are not
re-sent to the policy as items but their text is attached to the next assistant turn; other item types -
server-side tool calls, item references - are skipped), ``instructions`` (→ the system message), ``tools``
(function tools, and ``namespace`` tools: the function tools they group; web_search, local_shell, custom/freeform
tools and the like are skipped), ``max_output_tokens``,
``temperature``, ``top_p``, ``stream``. Ignored: ``model``, ``reasoning``, ``text``, ``store``, ``include``,
``parallel_tool_calls``, ``tool_choice``, ``prompt_cache_key``, ``metadata``. ``previous_response_id`` is
refused (400): the proxy keeps no response store, the client must send the whole input.

An assistant ``message`` item followed by ``function_call`` items is one assistant turn (text + tool calls).

A function inside a ``namespace`` tool (Codex's sub-agent tools: ``multi_agent_v1`` → ``spawn_agent`` …) is the
canonical tool ``namespace.name`` (a plain function's name cannot hold a dot), so the policy sees and calls it by
that name; a ``function_call`` item's ``namespace`` field joins its name the same way, and the policy's call of
``namespace.name`` goes back out as ``name`` with its ``namespace``.

A completion cut by the token budget is reported as status ``incomplete`` with
``incomplete_details.reason = "max_output_tokens"`` but through ``response.completed``, not
``response.incomplete``: agents such as Codex abort a turn on ``response.incomplete``, and for training the
truncated reply is simply the policy's output.
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
    get_str,
    read_tool_spec,
    require_list,
    require_object,
)
from components.proxy.openai_chat import content_text
from components.proxy.sessions import TurnOutcome, TurnRequest, TurnStarted
from components.tito.formats import ReplyDelta, call_argument_pieces, unsent_arguments
from components.tito.messages import ChatMessage, ToolCall, ToolSpec

MESSAGE_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
NAMESPACE_SEPARATOR = "."


def _qualified_name(item: JsonObject, where: str) -> str:
    """A call's or tool's canonical name: ``namespace.name`` when the item names a namespace."""
    name = get_str(item, "name", where)
    namespace = get_str(item, "namespace", where, default="")
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def _call_name_fields(name: str) -> dict[str, str]:
    """The ``name`` (and ``namespace``) fields of an output call of canonical tool ``name``."""
    namespace, dot, local_name = name.rpartition(NAMESPACE_SEPARATOR)
    return {"name": local_name, "namespace": namespace} if dot else {"name": name}


@dataclass(frozen=True, kw_only=True)
class ResponsesRequest:
    turn: TurnRequest
    model: str
    stream: bool
    echo: JsonObject  # request fields echoed back on the Response object


class _ConversationBuilder:
    """Folds Responses input items into canonical messages."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.pending_reasoning: str | None = None
        self.open_assistant = False  # whether the last message may still take tool calls of the same turn

    def add(self, message: ChatMessage) -> None:
        if message.role == "assistant" and self.pending_reasoning and not message.reasoning:
            message = ChatMessage(
                role="assistant",
                content=message.content,
                tool_calls=message.tool_calls,
                reasoning=self.pending_reasoning,
            )
        if message.role == "assistant":
            self.pending_reasoning = None
        self.messages.append(message)
        self.open_assistant = message.role == "assistant"

    def add_tool_call(self, call: ToolCall) -> None:
        if self.open_assistant:
            last = self.messages[-1]
            self.messages[-1] = ChatMessage(
                role="assistant",
                content=last.content,
                tool_calls=(*last.tool_calls, call),
                reasoning=last.reasoning,
            )
            return
        self.add(ChatMessage(role="assistant", tool_calls=(call,)))


def _output_text(value: JsonValue, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return content_text(value, where)


def _reasoning_text(item: JsonObject, where: str) -> str:
    texts = []
    for key in ("content", "summary"):
        for index, part in enumerate(get_list(item, key, where, default=[])):
            part = require_object(part, f"{where}.{key}[{index}]")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
        if texts:
            break
    return "\n".join(texts)


def parse_input(body: JsonObject) -> tuple[ChatMessage, ...]:
    """``instructions`` + ``input`` → canonical messages."""
    builder = _ConversationBuilder()
    instructions = get_str(body, "instructions", "body", default="")
    if instructions:
        builder.add(ChatMessage(role="system", content=instructions))
    raw_input = body.get("input")
    if raw_input is None:
        raise InvalidRequestError("body.input: missing; send a string or an array of input items")
    if isinstance(raw_input, str):
        builder.add(ChatMessage(role="user", content=raw_input))
        return tuple(builder.messages)
    for index, item in enumerate(require_list(raw_input, "body.input")):
        where = f"input[{index}]"
        item = require_object(item, where)
        item_type = item.get("type", "message")
        if not isinstance(item_type, str):
            raise InvalidRequestError(f"{where}.type: expected a string")
        if item_type == "message":
            role = get_str(item, "role", where)
            if role not in MESSAGE_ROLES:
                raise InvalidRequestError(
                    f"{where}.role: unknown role {role!r}; allowed: user, system, developer, assistant"
                )
            builder.add(
                ChatMessage(
                    role=MESSAGE_ROLES[role], content=content_text(item.get("content"), f"{where}.content")
                )
            )
        elif item_type in ("function_call", "custom_tool_call"):
            arguments_key = "arguments" if item_type == "function_call" else "input"
            arguments = item.get(arguments_key, "{}" if item_type == "function_call" else "")
            if not isinstance(arguments, str):
                raise InvalidRequestError(f"{where}.{arguments_key}: expected a string")
            builder.add_tool_call(
                ToolCall(
                    id=get_str(item, "call_id", where), name=_qualified_name(item, where), arguments=arguments
                )
            )
        elif item_type in ("function_call_output", "custom_tool_call_output"):
            output = _output_text(item.get("output"), f"{where}.output")
            builder.add(
                ChatMessage(role="tool", content=output, tool_call_id=get_str(item, "call_id", where))
            )
        elif item_type == "reasoning":
            text = _reasoning_text(item, where)
            builder.pending_reasoning = text or builder.pending_reasoning
        # Anything else (web_search_call, item_reference, compaction markers ...) carries nothing the policy
        # generated through this proxy: skipped.
    if not builder.messages:
        raise InvalidRequestError("body.input: contains no message")
    return tuple(builder.messages)


def parse_tools(value: JsonValue) -> tuple[ToolSpec, ...]:
    """Function tools, and the function tools of ``namespace`` tools as ``namespace.name``; every other tool type
    is skipped."""
    if value is None:
        return ()
    tools = []
    for index, raw in enumerate(require_list(value, "body.tools")):
        where = f"tools[{index}]"
        raw = require_object(raw, where)
        if raw.get("type") == "function":
            tools.append(read_tool_spec(raw, where, schema_key="parameters"))
        elif raw.get("type") == "namespace":
            namespace = get_str(raw, "name", where)
            for inner_index, inner in enumerate(require_list(raw.get("tools"), f"{where}.tools")):
                inner_where = f"{where}.tools[{inner_index}]"
                inner = require_object(inner, inner_where)
                if inner.get("type") != "function":
                    continue  # a custom (freeform) tool, skipped as at the top level
                tool = read_tool_spec(inner, inner_where, schema_key="parameters")
                tools.append(
                    ToolSpec(
                        name=f"{namespace}{NAMESPACE_SEPARATOR}{tool.name}",
                        description=tool.description,
                        parameters=tool.parameters,
                    )
                )
    return tuple(tools)


def _echoed_tools(tools: tuple[ToolSpec, ...]) -> list[JsonObject]:
    """The tools as the Response object lists them: function tools, namespaced ones inside their namespace."""
    echoed: list[JsonObject] = []
    namespace_tools: dict[str, list[JsonValue]] = {}  # each namespace's tool list, echoed inside it
    for tool in tools:
        names = _call_name_fields(tool.name)
        function = {
            "type": "function",
            "name": names["name"],
            "description": tool.description,
            "parameters": dict(tool.parameters),
            "strict": False,
        }
        if "namespace" not in names:
            echoed.append(function)
            continue
        namespace = names["namespace"]
        if namespace not in namespace_tools:
            namespace_tools[namespace] = []
            echoed.append(
                {
                    "type": "namespace",
                    "name": namespace,
                    "description": "",
                    "tools": namespace_tools[namespace],
                }
            )
        namespace_tools[namespace].append(function)
    return echoed


def parse_request(body: JsonObject) -> ResponsesRequest:
    """A Responses request body → a canonical turn plus the response options."""
    if body.get("previous_response_id") is not None:
        raise InvalidRequestError(
            "body.previous_response_id: not supported (the proxy stores no responses); send the whole "
            "conversation in input"
        )
    tools = parse_tools(body.get("tools"))
    turn = TurnRequest(
        messages=parse_input(body),
        tools=tools,
        max_tokens=get_int(body, "max_output_tokens", "body", minimum=1),
        temperature=get_number(body, "temperature", "body", default=1.0, minimum=0.0, maximum=2.0),
        top_p=get_number(body, "top_p", "body", default=1.0, minimum=0.0, maximum=1.0, open_low=True),
        want_deltas=get_bool(body, "stream", "body"),
    )
    model = body.get("model")
    instructions = body.get("instructions")
    echo = {
        "instructions": instructions if isinstance(instructions, str) else None,
        "max_output_tokens": turn.max_tokens,
        "temperature": turn.temperature,
        "top_p": turn.top_p,
        "tools": _echoed_tools(tools),
        "tool_choice": body["tool_choice"] if isinstance(body.get("tool_choice"), str | dict) else "auto",
        "parallel_tool_calls": body["parallel_tool_calls"]
        if isinstance(body.get("parallel_tool_calls"), bool)
        else True,
    }
    return ResponsesRequest(
        turn=turn,
        model=model if isinstance(model, str) and model else "rein-policy",
        stream=get_bool(body, "stream", "body"),
        echo=echo,
    )


def _output_items(outcome: TurnOutcome, response_id: str) -> list[JsonObject]:
    reply = outcome.reply
    suffix = response_id.removeprefix("resp_")
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    items: list[JsonObject] = []
    if reply.reasoning:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{suffix}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reply.reasoning}],
                "status": status,
            }
        )
    if reply.content or not reply.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{suffix}",
                "status": status,
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}
                ],
            }
        )
    for index, call in enumerate(reply.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{suffix}_{index}",
                "call_id": call.id or f"call_{suffix}_{index}",
                **_call_name_fields(call.name),
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _response_object(
    request: ResponsesRequest,
    *,
    response_id: str,
    created: int,
    status: str,
    output: list[JsonObject],
    outcome: TurnOutcome | None,
) -> JsonObject:
    usage = None
    incomplete_details = None
    if outcome is not None:
        usage = {
            "input_tokens": outcome.num_prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": outcome.num_completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": outcome.num_prompt_tokens + outcome.num_completion_tokens,
        }
        if outcome.reply.finish_reason == "length":
            incomplete_details = {"reason": "max_output_tokens"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete_details,
        "model": request.model,
        "output": output,
        "usage": usage,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "reasoning": None,
        "store": False,
        "truncation": "disabled",
        **request.echo,
    }


def render_response(
    outcome: TurnOutcome, request: ResponsesRequest, *, response_id: str, created: int
) -> JsonObject:
    """The finished ``response`` object."""
    status = "incomplete" if outcome.reply.finish_reason == "length" else "completed"
    return _response_object(
        request,
        response_id=response_id,
        created=created,
        status=status,
        output=_output_items(outcome, response_id),
        outcome=outcome,
    )


def _text_pieces(outcome: TurnOutcome, text: str) -> list[str]:
    """The message text as the stream's deltas: the reply's token-by-token content deltas when they make up
    exactly that text, else the text in one piece."""
    pieces = [d.text for d in outcome.deltas or () if d.kind == "content"]
    if pieces and "".join(pieces) == text:
        return pieces
    return [text] if text else []


def render_stream(
    outcome: TurnOutcome, request: ResponsesRequest, *, response_id: str, created: int
) -> list[bytes]:
    """The streaming events, numbered by ``sequence_number``, ending with ``response.completed``."""
    frames: list[bytes] = []

    def emit(event_type: str, **payload: JsonValue) -> None:
        data = {"type": event_type, "sequence_number": len(frames), **payload}
        frames.append(
            f"event: {event_type}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
        )

    pending = _response_object(
        request, response_id=response_id, created=created, status="in_progress", output=[], outcome=None
    )
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    items = _output_items(outcome, response_id)
    for output_index, item in enumerate(items):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            emit(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "status": "in_progress", "content": []},
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ids = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
            emit("response.content_part.added", **ids, part=part)
            for piece in _text_pieces(outcome, text):  # as the sampled tokens settled them
                emit("response.output_text.delta", **ids, delta=piece, logprobs=[])
            emit("response.output_text.done", **ids, text=text, logprobs=[])
            emit("response.content_part.done", **ids, part={**part, "text": text})
        elif item["type"] == "function_call":
            emit(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            ids = {"item_id": item["id"], "output_index": output_index}
            call_index = sum(1 for earlier in items[:output_index] if earlier["type"] == "function_call")
            for piece in call_argument_pieces(outcome.deltas, call_index, item["arguments"]):
                if piece:  # the arguments as the sampled tokens wrote them
                    emit("response.function_call_arguments.delta", **ids, delta=piece)
            emit(
                "response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"]
            )
        else:  # reasoning
            emit(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "status": "in_progress", "content": []},
            )
        emit("response.output_item.done", output_index=output_index, item=item)
    emit(
        "response.completed",
        response=render_response(outcome, request, response_id=response_id, created=created),
    )
    return frames


class LiveStream:
    """The events of a response streamed as the engine samples it: each output item (reasoning, the message,
    each function call) added when its first delta arrives, its text or arguments as the tokens write them, and
    done when the next item begins; then ``response.completed`` with the finished response."""

    def __init__(self, request: ResponsesRequest, *, response_id: str, created: int) -> None:
        self.request = request
        self.response_id = response_id
        self.created = created
        self._suffix = response_id.removeprefix("resp_")
        self._num_events = 0
        self._num_items = 0
        self._open: str | None = None  # reasoning | content | a call's index as text
        self._text = ""  # the open reasoning or message item's text so far
        self._call: JsonObject = {}  # the open function call item
        self._done_kinds: set[str] = set()

    def _emit(self, event_type: str, **payload: JsonValue) -> bytes:
        data = {"type": event_type, "sequence_number": self._num_events, **payload}
        self._num_events += 1
        return (
            f"event: {event_type}\ndata: ".encode() + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
        )

    def start(self, started: TurnStarted) -> list[bytes]:
        """``response.created`` and ``response.in_progress`` once the engine has begun sampling."""
        pending = _response_object(
            self.request,
            response_id=self.response_id,
            created=self.created,
            status="in_progress",
            output=[],
            outcome=None,
        )
        return [
            self._emit("response.created", response=pending),
            self._emit("response.in_progress", response=pending),
        ]

    def _ids(self) -> JsonObject:
        return {"item_id": self._item_id(), "output_index": self._num_items - 1}

    def _item_id(self) -> str:
        if self._open == "reasoning":
            return f"rs_{self._suffix}"
        if self._open == "content":
            return f"msg_{self._suffix}"
        return str(self._call["id"])

    def _begin(self, kind: str, item: JsonObject) -> list[bytes]:
        frames = self._close("completed")
        self._open, self._text = kind, ""
        self._num_items += 1
        frames.append(self._emit("response.output_item.added", output_index=self._num_items - 1, item=item))
        if kind == "content":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            frames.append(
                self._emit("response.content_part.added", **self._ids(), content_index=0, part=part)
            )
        return frames

    def _close(self, status: str) -> list[bytes]:
        kind = self._open
        if kind is None:
            return []
        frames, ids, item = [], self._ids(), {}
        if kind == "reasoning":
            item = {
                "type": "reasoning",
                "id": ids["item_id"],
                "summary": [],
                "content": [{"type": "reasoning_text", "text": self._text}],
                "status": status,
            }
        elif kind == "content":
            part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
            frames.append(
                self._emit("response.output_text.done", **ids, content_index=0, text=self._text, logprobs=[])
            )
            frames.append(self._emit("response.content_part.done", **ids, content_index=0, part=part))
            item = {
                "type": "message",
                "id": ids["item_id"],
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        else:
            item = {**self._call, "arguments": self._text, "status": "completed"}
            frames.append(
                self._emit(
                    "response.function_call_arguments.done", **ids, name=item["name"], arguments=self._text
                )
            )
        frames.append(self._emit("response.output_item.done", output_index=ids["output_index"], item=item))
        self._done_kinds.add(kind)
        self._open = None
        return frames

    def delta(self, delta: ReplyDelta) -> list[bytes]:
        """The events of one delta."""
        frames: list[bytes] = []
        if delta.kind in ("reasoning", "content"):
            if self._open != delta.kind:
                if delta.kind == "reasoning":
                    item = {"type": "reasoning", "id": f"rs_{self._suffix}", "summary": [], "content": []}
                else:
                    item = {
                        "type": "message",
                        "id": f"msg_{self._suffix}",
                        "role": "assistant",
                        "content": [],
                    }
                frames += self._begin(delta.kind, {**item, "status": "in_progress"})
            self._text += delta.text
            if delta.kind == "content":
                frames.append(
                    self._emit(
                        "response.output_text.delta",
                        **self._ids(),
                        content_index=0,
                        delta=delta.text,
                        logprobs=[],
                    )
                )
            return frames
        call, kind = delta.tool_call, str(delta.index)
        if self._open != kind and kind not in self._done_kinds and call is not None:
            self._call = {
                "type": "function_call",
                "id": f"fc_{self._suffix}_{delta.index}",
                "call_id": call.id or f"call_{self._suffix}_{delta.index}",
                **_call_name_fields(call.name),
            }
            frames += self._begin(kind, {**self._call, "arguments": "", "status": "in_progress"})
        if self._open != kind:
            return frames
        if delta.kind == "tool_call_arguments":
            piece = delta.text
        else:
            assert call is not None
            piece = unsent_arguments(self._text, call.arguments)
        if piece:
            self._text += piece
            frames.append(self._emit("response.function_call_arguments.delta", **self._ids(), delta=piece))
        if delta.kind == "tool_call":
            frames += self._close("completed")
        return frames

    def finish(self, outcome: TurnOutcome) -> list[bytes]:
        """The open item's end and ``response.completed``."""
        status = "incomplete" if outcome.reply.finish_reason == "length" else "completed"
        frames = self._close(status)
        if self._num_items == 0:  # nothing was said: the empty message a finished response has
            item = {"type": "message", "id": f"msg_{self._suffix}", "role": "assistant", "content": []}
            frames += self._begin("content", {**item, "status": "in_progress"}) + self._close(status)
        response = render_response(outcome, self.request, response_id=self.response_id, created=self.created)
        frames.append(self._emit("response.completed", response=response))
        return frames


KEEPALIVE_FRAME = b": keep-alive\n\n"


def error_body(status_code: int, error_type: str, message: str) -> JsonObject:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": error_type}}


def stream_error_frame(error_type: str, message: str) -> bytes:
    """An ``error`` event inside an already-started stream."""
    data = {"type": "error", "sequence_number": 0, "code": error_type, "message": message, "param": None}
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
