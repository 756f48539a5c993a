"""Google's Gemini API (``models/{model}:generateContent``) ⇄ canonical turns, as Gemini CLI and the
``google-genai`` SDK use it.

Routes (under ``/{version}``, ``version`` one of ``v1``, ``v1beta``, ``v1alpha``): ``POST
models/{model}:generateContent``, ``:streamGenerateContent`` (``?alt=sse``: server-sent events; without it a
JSON array of the same chunks, as Google serves it), ``:countTokens``; ``GET models`` and ``models/{model}``.
The API key travels as ``x-goog-api-key`` or ``?key=`` (both accepted besides the proxy's usual headers).

Accepted request fields (lowerCamelCase, or the proto's snake_case names, as Google's JSON parser accepts
both): ``contents`` (roles ``user``/``model``, and ``function`` as older clients send function responses;
parts: ``text`` (``thought: true`` on a model part → the turn's reasoning), ``functionCall`` (``id``, ``name``,
``args``), ``functionResponse`` (``id``, ``name``, ``response``: ``{"output": …}`` → the output, ``{"error": …}``
→ ``Error: …``, anything else → its JSON), ``inlineData``/``fileData`` (→ a short placeholder),
``executableCode``/``codeExecutionResult`` (→ their text); ``thoughtSignature``, ``videoMetadata`` and
``partMetadata`` are ignored), ``systemInstruction`` (its text parts → the system message), ``tools``
(``functionDeclarations`` with ``parameters`` as a Gemini ``Schema`` (upper-case types, ``nullable``) or
``parametersJsonSchema`` as plain JSON schema; ``googleSearch``, ``codeExecution`` and other built-in tools are
skipped), ``generationConfig`` (``maxOutputTokens``, ``temperature`` in [0, 2], ``topP``, ``topK``,
``stopSequences``, ``seed``, ``candidateCount`` (1 only), ``responseLogprobs``/``logprobs``). Ignored:
``toolConfig``, ``safetySettings``, ``cachedContent``, ``labels``, ``thinkingConfig``, response MIME types and
schemas, penalties, and the model name in the path.

A function call without an ``id`` gets one from its position (``call_{content}_{part}``); a function response
without a known ``id`` answers the oldest unanswered call of the same name. Replies carry ``id`` on every
``functionCall`` (the field Google defines for matching responses to calls).

Finish reasons: ``STOP`` (function calls included, as Gemini reports them) and ``MAX_TOKENS``. Streaming
replays the finished generation as one chunk per part (thought, text, function calls), the last with
``finishReason`` and the full ``usageMetadata``; keep-alive frames are blank lines (``\\r\\n``), which both
Google SDKs skip - an SSE comment would break their parsers. Errors use Google's shape ``{"error": {"code",
"message", "status", "details": [ErrorInfo]}}``; the ``ErrorInfo.reason`` carries the proxy's stable error
type (``CONTEXT_OVERFLOW`` for a prompt over the window, with HTTP 413).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from components.json_types import JsonArray, JsonObject, JsonValue
from components.proxy.errors import InvalidRequestError
from components.proxy.json_fields import get_bool, get_int, get_list, get_str, require_list, require_object
from components.proxy.sessions import TurnOutcome, TurnRequest, TurnStarted
from components.tito.formats import ReplyDelta
from components.tito.messages import ChatMessage, ToolCall, ToolSpec

API_VERSIONS = ("v1", "v1beta", "v1alpha")
GENERATE = "generateContent"
STREAM_GENERATE = "streamGenerateContent"
COUNT_TOKENS = "countTokens"
METHODS = (GENERATE, STREAM_GENERATE, COUNT_TOKENS)
ROLES = {"user": "user", "function": "user", "model": "model"}
FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
# HTTP status → google.rpc.Code name (https://github.com/googleapis/googleapis/blob/master/google/rpc/code.proto)
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",  # Google reports a prompt over the input limit as INVALID_ARGUMENT
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# the proxy's error types → their HTTP status (for errors that surface inside an already-started stream)
ERROR_TYPE_CODES = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "not_found_error": 404,
    "context_overflow": 413,
    "engine_error": 502,
    "internal_error": 500,
}
PLACEHOLDERS = {"image": "[image]", "audio": "[audio]", "video": "[video]"}
# Gemini ``Schema`` keys that differ from JSON schema; the others (description, enum, format, items, …) match
_SCHEMA_NESTED_MAPS = ("properties", "$defs", "defs")
_SCHEMA_NESTED_LISTS = ("anyOf", "any_of", "oneOf", "allOf", "prefixItems")
_SCHEMA_DROPPED = ("propertyOrdering", "property_ordering", "nullable", "example")


@dataclass(frozen=True, kw_only=True)
class GenerateContentRequest:
    turn: TurnRequest
    model: str
    stream: bool  # server-sent events (``:streamGenerateContent?alt=sse``)
    json_array: bool = False  # ``:streamGenerateContent`` without ``alt=sse``: the chunks as one JSON array
    num_top_logprobs: int = 0


def _field(obj: JsonObject, camel: str) -> JsonValue:
    """A field by its lowerCamelCase name or its snake_case proto name."""
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake)


def _placeholder(mime_type: JsonValue) -> str:
    kind = mime_type.split("/", 1)[0] if isinstance(mime_type, str) else ""
    return PLACEHOLDERS.get(kind, "[file]")


def _function_response_text(response: JsonValue, where: str) -> str:
    if response is None:
        return ""
    response = require_object(response, f"{where}.response")
    if set(response) == {"output"}:
        output = response["output"]
        return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    if set(response) == {"error"}:
        error = response["error"]
        return "Error: " + (error if isinstance(error, str) else json.dumps(error, ensure_ascii=False))
    return json.dumps(response, ensure_ascii=False)


class _CallLedger:
    """Ids for function calls and the calls each function response answers."""

    def __init__(self) -> None:
        self.unanswered: list[ToolCall] = []

    def call(self, raw: JsonObject, where: str, default_id: str) -> ToolCall:
        args = raw.get("args")
        args = {} if args is None else require_object(args, f"{where}.args")
        call = ToolCall(
            id=get_str(raw, "id", where, default="") or default_id,
            name=get_str(raw, "name", where),
            arguments=json.dumps(args, ensure_ascii=False),
        )
        self.unanswered.append(call)
        return call

    def answer(self, raw: JsonObject, where: str) -> str:
        call_id = get_str(raw, "id", where, default="")
        name = get_str(raw, "name", where)
        for index, call in enumerate(self.unanswered):
            if call.id == call_id:
                return self.unanswered.pop(index).id
        for index, call in enumerate(self.unanswered):
            if call.name == name:
                return self.unanswered.pop(index).id
        raise InvalidRequestError(
            f"{where}: function response for {name!r} (id {call_id!r}) answers no earlier function call; "
            "each functionResponse must follow a model functionCall of the same name or id"
        )


def _parts(content: JsonObject, where: str) -> list[JsonObject]:
    parts = get_list(content, "parts", where)
    if not parts:
        raise InvalidRequestError(f"{where}.parts: must contain at least one part")
    return [require_object(part, f"{where}.parts[{index}]") for index, part in enumerate(parts)]


def _plain_text(part: JsonObject, where: str) -> str | None:
    """The text a non-function part stands for (None for parts that carry nothing for the policy)."""
    if "text" in part:
        return get_str(part, "text", where)
    for key in ("inlineData", "fileData"):
        data = _field(part, key)
        if data is not None:
            return _placeholder(_field(require_object(data, f"{where}.{key}"), "mimeType"))
    code = _field(part, "executableCode")
    if code is not None:
        return get_str(require_object(code, f"{where}.executableCode"), "code", f"{where}.executableCode")
    result = _field(part, "codeExecutionResult")
    if result is not None:
        result = require_object(result, f"{where}.codeExecutionResult")
        return get_str(result, "output", f"{where}.codeExecutionResult", default="")
    return None


def _model_message(content: JsonObject, where: str, index: int, ledger: _CallLedger) -> ChatMessage:
    texts, reasoning, calls = [], [], []
    for part_index, part in enumerate(_parts(content, where)):
        part_where = f"{where}.parts[{part_index}]"
        if _field(part, "functionResponse") is not None:
            raise InvalidRequestError(f"{part_where}: a functionResponse belongs to a user content")
        call = _field(part, "functionCall")
        if call is not None:
            calls.append(
                ledger.call(
                    require_object(call, f"{part_where}.functionCall"),
                    f"{part_where}.functionCall",
                    f"call_{index}_{part_index}",
                )
            )
            continue
        text = _plain_text(part, part_where)
        if text is None:
            continue
        if get_bool(part, "thought", part_where):
            reasoning.append(text)
        else:
            texts.append(text)
    return ChatMessage(
        role="assistant",
        content="".join(texts),
        tool_calls=tuple(calls),
        reasoning="".join(reasoning) or None,
    )


def _user_messages(content: JsonObject, where: str, ledger: _CallLedger) -> list[ChatMessage]:
    tool_messages, texts = [], []
    for part_index, part in enumerate(_parts(content, where)):
        part_where = f"{where}.parts[{part_index}]"
        if _field(part, "functionCall") is not None:
            raise InvalidRequestError(f"{part_where}: a functionCall belongs to a model content")
        response = _field(part, "functionResponse")
        if response is not None:
            response_where = f"{part_where}.functionResponse"
            response = require_object(response, response_where)
            text = _function_response_text(response.get("response"), response_where)
            for nested_index, nested in enumerate(get_list(response, "parts", response_where, default=[])):
                nested_text = _plain_text(
                    require_object(nested, f"{response_where}.parts[{nested_index}]"),
                    f"{response_where}.parts[{nested_index}]",
                )
                text = "\n".join(t for t in (text, nested_text) if t)
            tool_messages.append(
                ChatMessage(role="tool", content=text, tool_call_id=ledger.answer(response, response_where))
            )
            continue
        text = _plain_text(part, part_where)
        if text is not None:
            texts.append(text)
    messages = tool_messages
    if texts or not tool_messages:
        messages.append(ChatMessage(role="user", content="".join(texts)))
    return messages


def _system_text(value: JsonValue) -> str:
    if value is None:
        return ""
    if isinstance(value, str):  # the REST API takes a Content; a bare string is a common client shortcut
        return value
    system = require_object(value, "body.systemInstruction")
    texts = []
    for index, part in enumerate(get_list(system, "parts", "body.systemInstruction", default=[])):
        text = _plain_text(require_object(part, f"systemInstruction.parts[{index}]"), "systemInstruction")
        if text:
            texts.append(text)
    return "\n".join(texts)


def parse_contents(body: JsonObject) -> tuple[ChatMessage, ...]:
    """``systemInstruction`` + ``contents`` → canonical messages."""
    messages: list[ChatMessage] = []
    system = _system_text(_field(body, "systemInstruction"))
    if system:
        messages.append(ChatMessage(role="system", content=system))
    contents = get_list(body, "contents", "body")
    if not contents:
        raise InvalidRequestError("body.contents: must contain at least one content")
    ledger = _CallLedger()
    for index, raw in enumerate(contents):
        where = f"contents[{index}]"
        raw = require_object(raw, where)
        role = get_str(raw, "role", where, default="user")
        if role not in ROLES:
            raise InvalidRequestError(f"{where}.role: unknown role {role!r}; allowed: user, model")
        if ROLES[role] == "model":
            messages.append(_model_message(raw, where, index, ledger))
        else:
            messages.extend(_user_messages(raw, where, ledger))
    return tuple(messages)


def schema_to_json_schema(schema: JsonValue, where: str) -> JsonObject:
    """A Gemini ``Schema`` (OpenAPI subset: upper-case ``type``, ``nullable``) → JSON schema."""
    schema = require_object(schema, where)
    out: JsonObject = {}
    for key, value in schema.items():
        if key in _SCHEMA_DROPPED:
            continue
        if key == "type":
            if not isinstance(value, str):
                raise InvalidRequestError(f"{where}.type: expected a string, got {value!r}")
            if value.upper() != "TYPE_UNSPECIFIED":
                out["type"] = value.lower()
        elif key in _SCHEMA_NESTED_MAPS:
            nested = require_object(value, f"{where}.{key}")
            out[key] = {
                name: schema_to_json_schema(sub, f"{where}.{key}.{name}") for name, sub in nested.items()
            }
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = schema_to_json_schema(value, f"{where}.{key}")
        elif key in _SCHEMA_NESTED_LISTS:
            items = require_list(value, f"{where}.{key}")
            camel = "anyOf" if key == "any_of" else key
            out[camel] = [schema_to_json_schema(sub, f"{where}.{key}[{i}]") for i, sub in enumerate(items)]
        else:
            out[key] = value
    if schema.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def tool_definitions(body: JsonObject) -> JsonValue:
    """What ``ProxyConfig.max_tools`` counts: each function declaration of ``body.tools`` (one ``Tool`` may list
    any number) and each other tool entry; ``body.tools`` itself when it is not a list."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return tools
    definitions: JsonArray = []
    for tool in tools:
        declarations = _field(tool, "functionDeclarations") if isinstance(tool, dict) else None
        definitions.extend(declarations if isinstance(declarations, list) else [tool])
    return definitions


def parse_tools(value: JsonValue) -> tuple[ToolSpec, ...]:
    """``tools[].functionDeclarations`` → tool specs (built-in tools such as ``googleSearch`` are skipped)."""
    if value is None:
        return ()
    specs = []
    for tool_index, tool in enumerate(require_list(value, "body.tools")):
        tool_where = f"tools[{tool_index}]"
        tool = require_object(tool, tool_where)
        declarations = _field(tool, "functionDeclarations")
        if declarations is None:
            continue
        for index, raw in enumerate(require_list(declarations, f"{tool_where}.functionDeclarations")):
            where = f"{tool_where}.functionDeclarations[{index}]"
            raw = require_object(raw, where)
            json_schema = _field(raw, "parametersJsonSchema")
            schema = raw.get("parameters")
            if json_schema is not None and schema is not None:
                raise InvalidRequestError(f"{where}: set parameters or parametersJsonSchema, not both")
            if json_schema is not None:
                parameters = dict(require_object(json_schema, f"{where}.parametersJsonSchema"))
            elif schema is not None:
                parameters = schema_to_json_schema(schema, f"{where}.parameters")
            else:
                parameters = {"type": "object", "properties": {}}
            specs.append(
                ToolSpec(
                    name=get_str(raw, "name", where),
                    description=get_str(raw, "description", where, default=""),
                    parameters=parameters,
                )
            )
    return tuple(specs)


def _number(config: JsonObject, key: str, *, default: float, low: float, high: float, open_low: bool = False):
    value = _field(config, key)
    if value is None:
        return default
    where = f"generationConfig.{key}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{where}: expected a number, got {value!r}")
    if (value <= low if open_low else value < low) or value > high:
        raise InvalidRequestError(
            f"{where}: must be in {'(' if open_low else '['}{low}, {high}], got {value!r}"
        )
    return float(value)


def _int(config: JsonObject, key: str, *, default: int | None = None, minimum: int = 0) -> int | None:
    value = _field(config, key)
    return get_int({key: value}, key, "generationConfig", default=default, minimum=minimum)


def _generation_config(body: JsonObject) -> JsonObject:
    config = _field(body, "generationConfig")
    return {} if config is None else require_object(config, "body.generationConfig")


def parse_request(body: JsonObject, *, model: str, method: str, alt: str | None) -> GenerateContentRequest:
    """A generateContent / streamGenerateContent body → a canonical turn plus the response options."""
    config = _generation_config(body)
    num_candidates = _int(config, "candidateCount", default=1, minimum=1)
    if num_candidates != 1:
        raise InvalidRequestError(
            f"generationConfig.candidateCount: only 1 is supported (one sample per policy call), got {num_candidates}"
        )
    stop = _field(config, "stopSequences")
    stop_sequences = tuple(
        get_str({"s": item}, "s", f"generationConfig.stopSequences[{index}]")
        for index, item in enumerate(require_list(stop, "generationConfig.stopSequences") if stop else [])
    )
    want_logprobs = get_bool(
        {"b": _field(config, "responseLogprobs")}, "b", "generationConfig.responseLogprobs"
    )
    turn = TurnRequest(
        messages=parse_contents(body),
        tools=parse_tools(body.get("tools")),
        max_tokens=_int(config, "maxOutputTokens", minimum=1),
        temperature=_number(config, "temperature", default=1.0, low=0.0, high=2.0),
        top_p=_number(config, "topP", default=1.0, low=0.0, high=1.0, open_low=True),
        top_k=_int(config, "topK", default=0) or 0,
        stop=tuple(s for s in stop_sequences if s),
        seed=_int(config, "seed", minimum=-(2**31)),
        want_token_logprobs=want_logprobs,
        want_deltas=method == STREAM_GENERATE,
    )
    if alt not in (None, "sse", "json"):
        raise InvalidRequestError(f"alt: must be 'sse' or 'json', got {alt!r}")
    stream = method == STREAM_GENERATE
    return GenerateContentRequest(
        turn=turn,
        model=model,
        stream=stream and alt == "sse",
        json_array=stream and alt != "sse",
        num_top_logprobs=(_int(config, "logprobs", default=0) or 0) if want_logprobs else 0,
    )


def parse_count_tokens(body: JsonObject) -> tuple[tuple[ChatMessage, ...], tuple[ToolSpec, ...]]:
    """A ``countTokens`` body: ``contents`` (with ``systemInstruction``/``tools`` as Vertex takes them) or a
    whole ``generateContentRequest`` → canonical messages and tools."""
    inner = _field(body, "generateContentRequest")
    if inner is not None:
        if body.get("contents") is not None:
            raise InvalidRequestError("body: set contents or generateContentRequest, not both")
        body = require_object(inner, "body.generateContentRequest")
    return parse_contents(body), parse_tools(body.get("tools"))


def _args(arguments: str) -> JsonObject:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _reply_parts(outcome: TurnOutcome, response_id: str) -> list[JsonObject]:
    reply = outcome.reply
    parts: list[JsonObject] = []
    if reply.reasoning:
        parts.append({"text": reply.reasoning, "thought": True})
    if reply.content or not reply.tool_calls:
        parts.append({"text": reply.content})
    for index, call in enumerate(reply.tool_calls):
        parts.append(
            {
                "functionCall": {
                    "id": call.id or f"call_{response_id[-12:]}_{index}",
                    "name": call.name,
                    "args": _args(call.arguments),
                }
            }
        )
    return parts


def _usage(outcome: TurnOutcome, *, final: bool = True) -> JsonObject:
    usage: JsonObject = {
        "promptTokenCount": outcome.num_prompt_tokens,
        "totalTokenCount": outcome.num_prompt_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": outcome.num_prompt_tokens}],
    }
    if final:
        usage["candidatesTokenCount"] = outcome.num_completion_tokens
        usage["totalTokenCount"] = outcome.num_prompt_tokens + outcome.num_completion_tokens
    return usage


def _logprobs(outcome: TurnOutcome, num_top: int) -> JsonObject:
    entries = outcome.token_logprobs or ()
    chosen = [{"token": e.token, "logProbability": e.logprob} for e in entries]
    result: JsonObject = {
        "chosenCandidates": chosen,
        "logProbabilitySum": sum(e.logprob for e in entries),
    }
    if num_top:  # the engine returns only the sampled token's logprob: each position lists just that one
        result["topCandidates"] = [{"candidates": [candidate]} for candidate in chosen]
    return result


def _candidate(outcome: TurnOutcome, request: GenerateContentRequest, parts, finish: bool) -> JsonObject:
    candidate: JsonObject = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = FINISH_REASONS.get(outcome.reply.finish_reason, "STOP")
        if outcome.token_logprobs is not None:
            entries = outcome.token_logprobs
            candidate["avgLogprobs"] = sum(e.logprob for e in entries) / len(entries) if entries else 0.0
            candidate["logprobsResult"] = _logprobs(outcome, request.num_top_logprobs)
    return candidate


def _text_groups(outcome: TurnOutcome, part: JsonObject) -> list[list[JsonObject]]:
    """A text part as one chunk per token delta (when the reply's deltas make up exactly its text), else one."""
    kind = "reasoning" if part.get("thought") else "content"
    pieces = [d.text for d in outcome.deltas or () if d.kind == kind]
    if len(pieces) > 1 and "".join(pieces) == part["text"]:
        return [[{**part, "text": piece}] for piece in pieces]
    return [[part]]


def _chunks(outcome: TurnOutcome, request: GenerateContentRequest, response_id: str) -> list[JsonObject]:
    parts = _reply_parts(outcome, response_id)
    # one chunk per text piece as the sampled tokens settled it, function calls together (Gemini sends
    # parallel calls in one chunk)
    groups = [group for p in parts if "functionCall" not in p for group in _text_groups(outcome, p)]
    calls = [p for p in parts if "functionCall" in p]
    if calls:
        groups.append(calls)
    return [
        {
            "candidates": [_candidate(outcome, request, group, finish=index == len(groups) - 1)],
            "usageMetadata": _usage(outcome, final=index == len(groups) - 1),
            "modelVersion": request.model,
            "responseId": response_id,
        }
        for index, group in enumerate(groups)
    ]


def render_response(
    outcome: TurnOutcome, request: GenerateContentRequest, *, response_id: str, created: int
) -> JsonObject | list[JsonObject]:
    """The ``GenerateContentResponse`` (a JSON array of its chunks for a non-SSE stream)."""
    if request.json_array:
        return _chunks(outcome, request, response_id)
    return {
        "candidates": [_candidate(outcome, request, _reply_parts(outcome, response_id), finish=True)],
        "usageMetadata": _usage(outcome),
        "modelVersion": request.model,
        "responseId": response_id,
    }


def _frame(payload: JsonObject) -> bytes:
    # ASCII JSON: the JS SDK's line regex stops at U+2028/U+2029, which unescaped JSON may contain
    return b"data: " + json.dumps(payload).encode() + b"\r\n\r\n"


def render_stream(
    outcome: TurnOutcome, request: GenerateContentRequest, *, response_id: str, created: int
) -> list[bytes]:
    """The SSE frames of the finished generation."""
    return [_frame(chunk) for chunk in _chunks(outcome, request, response_id)]


class LiveStream:
    """The SSE chunks of a generation streamed as the engine samples it: one chunk per reasoning or text delta,
    then the function calls together, whole, with the finish reason and usage (the Gemini API has no partial
    function-call arguments)."""

    def __init__(self, request: GenerateContentRequest, *, response_id: str, created: int) -> None:
        self.request = request
        self.response_id = response_id
        self._num_prompt_tokens = 0

    def _chunk(self, candidate: JsonObject, usage: JsonObject) -> bytes:
        return _frame(
            {
                "candidates": [candidate],
                "usageMetadata": usage,
                "modelVersion": self.request.model,
                "responseId": self.response_id,
            }
        )

    def start(self, started: TurnStarted) -> list[bytes]:
        """Nothing yet: Gemini's stream begins with the first piece."""
        self._num_prompt_tokens = started.num_prompt_tokens
        return []

    def delta(self, delta: ReplyDelta) -> list[bytes]:
        """A chunk per reasoning or text piece (calls come whole at the end)."""
        if delta.kind not in ("reasoning", "content") or not delta.text:
            return []
        part: JsonObject = (
            {"text": delta.text, "thought": True} if delta.kind == "reasoning" else {"text": delta.text}
        )
        tokens = self._num_prompt_tokens
        usage: JsonObject = {
            "promptTokenCount": tokens,
            "totalTokenCount": tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}],
        }
        return [self._chunk({"content": {"parts": [part], "role": "model"}, "index": 0}, usage)]

    def finish(self, outcome: TurnOutcome) -> list[bytes]:
        """The last chunk: the calls (or an empty text part), the finish reason and the usage."""
        parts = [p for p in _reply_parts(outcome, self.response_id) if "functionCall" in p] or [{"text": ""}]
        return [self._chunk(_candidate(outcome, self.request, parts, finish=True), _usage(outcome))]


def render_count_tokens(num_tokens: int) -> JsonObject:
    """The ``CountTokensResponse``."""
    return {
        "totalTokens": num_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": num_tokens}],
    }


def model_resource(name: str, context_window: int | None = None) -> JsonObject:
    """A ``Model`` resource for ``GET models/{model}``."""
    model: JsonObject = {
        "name": f"models/{name}",
        "baseModelId": name,
        "version": "rein",
        "displayName": name,
        "description": "the policy served by this Rein proxy session",
        "supportedGenerationMethods": list(METHODS),
    }
    if context_window is not None:
        model["inputTokenLimit"] = context_window
    return model


KEEPALIVE_FRAME = b"\r\n"


def error_body(status_code: int, error_type: str, message: str) -> JsonObject:
    """Google's error shape (``google.rpc.Status`` under ``error``), the proxy's error type as ErrorInfo."""
    code = status_code or ERROR_TYPE_CODES.get(error_type, 500)
    return {
        "error": {
            "code": code,
            "message": message,
            "status": STATUS_NAMES.get(code, "UNKNOWN"),
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": error_type.upper(),
                    "domain": "rein.proxy",
                }
            ],
        }
    }


def stream_error_frame(error_type: str, message: str) -> bytes:
    """An error inside an already-started stream: a ``data:`` chunk holding the error (both SDKs raise on it)."""
    return _frame(error_body(0, error_type, message))
