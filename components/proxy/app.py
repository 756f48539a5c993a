"""The proxy's HTTP app: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages and Google's Gemini API
on one server.

Session URL: ``http://HOST:PORT[/ROUTE_PREFIX]/s/{session_id}``. Point an Anthropic or a Gemini client there
(``ANTHROPIC_BASE_URL``, ``GOOGLE_GEMINI_BASE_URL``, ``HttpOptions(base_url=...)``) and an OpenAI client at
``…/s/{session_id}/v1``. The bare paths (``/v1/...``) serve the same protocols with the session in an
``X-Session-Id`` header.

Routes (each under ``/s/{session_id}`` and bare):
  POST /v1/chat/completions      OpenAI Chat Completions (also ``/chat/completions``)
  POST /v1/responses             OpenAI Responses (also ``/responses``)
  POST /v1/messages              Anthropic Messages (also ``/messages``; ``?beta=true`` ignored)
  POST /v1/messages/count_tokens Anthropic token counting
  POST /{v}/models/{model}:generateContent   Gemini API (``v`` = v1beta, v1, v1alpha; also
       :streamGenerateContent[?alt=sse], :countTokens; GET /{v}/models[/{model}])
  GET  /v1/models                the served model
Session control:
  POST /sessions                 body (optional) {session_id, task_id, group_id, harness, step, policy}
                                 → {"session_id", "policy", "base_url"[, "api_key": the session token]}
                                 (``policy``: the named policy every turn of the session is sampled by, see
                                 ``components.proxy.sessions``; the requests' ``model`` field never picks one)
  GET  /s/{id}/trajectory        the recorded segments so far
  POST /s/{id}/finalize          body {reward, status, failure_reason, metrics, task_id, group_id, harness,
                                 step, log, turn_rewards} → the trajectory as JSON (written to RUN_DIR/trajectories)
  POST /s/{id}/discard           drop the session
  GET  /health

Auth (``components.proxy.auth``): in isolated mode, the default (``ProxyConfig.admin_key``, generated when none
is given), the session-control routes and ``/health`` need the admin key, and a session's model routes need that
session's capability token (``POST /sessions`` returns it as ``api_key``); a token opens nothing else. With
``ProxyConfig.api_key`` (shared-key mode) one key opens every route; only the explicit
``insecure_open_control_plane`` opens every route to anyone.

Request bounds (``components.proxy.limits``): header and body bytes are checked by an ASGI middleware before the
body is held, messages and tools once it is parsed, streams by ``max_stream_duration_s``.

Every protocol is parsed into the same ``TurnRequest`` and answered by the same ``SessionRegistry.run_turn``.
Errors use the protocol's own shape (OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error", ...}``,
Google ``{"error": {"code", "message", "status"}}``):
bad input 400, unknown session 404, missing API key 401, context overflow 413 with type
``context_overflow``; only engine failures (502) and genuine bugs (500) are 5xx.

Streaming follows the engine: with an engine that streams (``StreamingEngine``: the embedded engine, its Ray
actor, vLLM) each protocol's ``LiveStream`` writes the deltas as the sampled tokens settle them; with one that
does not, the finished generation is replayed (``render_stream``). The server waits up to ``keepalive_interval_s`` for the
turn before committing to a status code, so errors found while preparing the prompt (overflow, bad history)
keep their 4xx status; after that it sends keep-alive frames (``: keep-alive`` comments for OpenAI,
``event: ping`` for Anthropic, blank lines for Gemini) every ``keepalive_interval_s`` until the engine answers,
and a failure then is sent as an in-stream error event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from components.json_types import JsonObject, JsonValue
from components.protocols import SessionOpen, SessionOutcome
from components.proxy import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from components.proxy.config import ProxyConfig
from components.proxy.errors import (
    AuthenticationError,
    InvalidRequestError,
    SessionNotFoundError,
    classify_error,
)
from components.proxy.json_fields import get_int, get_list, get_str, parse_json_object, require_object
from components.proxy.limits import RequestSizeLimits, check_turn_shape
from components.proxy.sessions import (
    SessionRegistry,
    TurnEvent,
    TurnOutcome,
    TurnRequest,
    TurnStarted,
    trajectory_to_json,
    validate_session_id,
)
from components.tito.formats import ReplyDelta

logger = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _LiveStream(Protocol):
    """A protocol's frames for a turn streamed as the engine samples it (each protocol's ``LiveStream``)."""

    def start(self, started: TurnStarted) -> list[bytes]: ...

    def delta(self, delta: ReplyDelta) -> list[bytes]: ...

    def finish(self, outcome: TurnOutcome) -> list[bytes]: ...


class _ParsedTurn(Protocol):
    """What a protocol's ``parse`` makes of a request body (its own request record, which the protocol's
    renderers take back): the canonical turn, and whether the reply is streamed."""

    @property
    def turn(self) -> TurnRequest: ...

    @property
    def stream(self) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class _Protocol:
    name: str
    id_prefix: str
    parse: Callable[[JsonObject], _ParsedTurn]
    # (outcome, the parsed request, *, response_id, created): ``...`` as each protocol takes its own request type
    render_response: Callable[..., JsonObject | list[JsonObject]]
    render_stream: Callable[..., list[bytes]]  # the replay of a finished generation
    # (the parsed request, *, response_id, created) → the frames of a turn streamed as it is sampled
    live_stream: Callable[..., _LiveStream]
    error_body: Callable[[int, str, str], JsonObject]
    stream_error_frame: Callable[[str, str], bytes]
    keepalive_frame: bytes
    messages_field: str  # the body field listing the conversation (bounded by ProxyConfig.max_messages)
    # The tool definitions ProxyConfig.max_tools / max_tool_bytes bound, as the body lists them
    tool_definitions: Callable[[JsonObject], JsonValue] = lambda body: body.get("tools")


CHAT = _Protocol(
    name="openai_chat",
    id_prefix="chatcmpl-",
    parse=openai_chat.parse_request,
    render_response=openai_chat.render_response,
    render_stream=openai_chat.render_stream,
    live_stream=openai_chat.LiveStream,
    error_body=openai_chat.error_body,
    stream_error_frame=openai_chat.stream_error_frame,
    keepalive_frame=openai_chat.KEEPALIVE_FRAME,
    messages_field="messages",
)
RESPONSES = _Protocol(
    name="openai_responses",
    id_prefix="resp_",
    parse=openai_responses.parse_request,
    render_response=openai_responses.render_response,
    render_stream=openai_responses.render_stream,
    live_stream=openai_responses.LiveStream,
    error_body=openai_responses.error_body,
    stream_error_frame=openai_responses.stream_error_frame,
    keepalive_frame=openai_responses.KEEPALIVE_FRAME,
    messages_field="input",
)
MESSAGES = _Protocol(
    name="anthropic_messages",
    id_prefix="msg_",
    parse=anthropic_messages.parse_request,
    render_response=anthropic_messages.render_response,
    render_stream=anthropic_messages.render_stream,
    live_stream=anthropic_messages.LiveStream,
    error_body=anthropic_messages.error_body,
    stream_error_frame=anthropic_messages.stream_error_frame,
    keepalive_frame=anthropic_messages.KEEPALIVE_FRAME,
    messages_field="messages",
)
GEMINI = _Protocol(
    name="gemini_generate_content",
    id_prefix="",
    parse=gemini_generate_content.parse_request,
    render_response=gemini_generate_content.render_response,
    render_stream=gemini_generate_content.render_stream,
    live_stream=gemini_generate_content.LiveStream,
    error_body=gemini_generate_content.error_body,
    stream_error_frame=gemini_generate_content.stream_error_frame,
    keepalive_frame=gemini_generate_content.KEEPALIVE_FRAME,
    messages_field="contents",
    tool_definitions=gemini_generate_content.tool_definitions,
)


def _protocol_of_path(path: str) -> _Protocol:
    """The protocol whose error shape a path's errors take (for routing errors and unhandled ones)."""
    if path.endswith("/responses"):
        return RESPONSES
    if "/messages" in path:
        return MESSAGES
    if any(f"/{version}/models/" in path for version in gemini_generate_content.API_VERSIONS) or any(
        path.endswith(f"/{version}/models") for version in ("v1beta", "v1alpha")
    ):
        return GEMINI
    return CHAT


def _json(payload: object, status_code: int = 200) -> Response:
    """``payload`` (anything ``json.dumps`` takes) as a JSON response."""
    return Response(
        json.dumps(payload, ensure_ascii=False).encode(),
        status_code=status_code,
        media_type="application/json",
    )


class _ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that closes its frame generator however the response ends (a client that
    disconnected included), so that a streamed turn never outlives its response."""

    def __init__(self, frames: AsyncGenerator[bytes, None]) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self.frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.frames.aclose()


def _consume_exception(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class _ProxyHandlers:
    def __init__(self, registry: SessionRegistry, config: ProxyConfig) -> None:
        self.registry = registry
        self.config = config

    # -- helpers ------------------------------------------------------------------------------------------

    @staticmethod
    def _presented_key(request: Request) -> str | None:
        authorization = request.headers.get("authorization", "")
        if authorization.startswith("Bearer "):
            return authorization.removeprefix("Bearer ")
        # Anthropic's header, then Google's (header or ``?key=``)
        return (
            request.headers.get("x-api-key")
            or request.headers.get("x-goog-api-key")
            or request.query_params.get("key")
        )

    def _check_api_key(self, request: Request) -> None:
        """Shared-key mode only: the one key opens every route."""
        key = self.config.api_key
        if key is None:
            return
        authorization = request.headers.get("authorization", "")
        if authorization == f"Bearer {key}" or key in (
            request.headers.get("x-api-key"),
            request.headers.get("x-goog-api-key"),
            request.query_params.get("key"),
        ):
            return
        raise AuthenticationError(
            "missing or wrong API key: send `Authorization: Bearer KEY`, `x-api-key: KEY` or `x-goog-api-key: KEY`"
        )

    def _check_admin(self, request: Request) -> None:
        """Control routes: the admin key in isolated mode (a session token never opens them)."""
        keys = self.config.session_keys
        if keys is None:
            self._check_api_key(request)
        elif not keys.is_admin_key(self._presented_key(request)):
            raise AuthenticationError("this route needs the proxy's admin key")

    def _check_session_access(self, request: Request, session_id: str) -> None:
        """Model routes: in isolated mode, the capability token of this very session."""
        keys = self.config.session_keys
        if keys is None:
            self._check_api_key(request)
        elif not keys.is_session_token(session_id, self._presented_key(request)):
            raise AuthenticationError(
                "missing or wrong session token: send this session's token as the API key "
                "(`Authorization: Bearer TOKEN` or `x-api-key: TOKEN`)"
            )

    def _authorized_session_id(self, request: Request) -> str:
        # Authorization is checked before the session is looked up, so a wrong token cannot probe which
        # sessions exist (401 either way).
        raw = request.path_params.get("session_id") or request.headers.get(SESSION_HEADER) or ""
        self._check_session_access(request, raw)
        return self._session_id(request)

    @staticmethod
    def _session_id(request: Request) -> str:
        session_id = request.path_params.get("session_id") or request.headers.get(SESSION_HEADER)
        if not session_id:
            raise SessionNotFoundError(
                "no session: create one with POST /sessions, then use its base_url http://HOST:PORT/s/{session_id} "
                "(or send the id in an X-Session-Id header)"
            )
        try:
            return validate_session_id(session_id)
        except InvalidRequestError as error:
            raise SessionNotFoundError(f"unknown session: {error}") from None

    def _bounded(self, body: JsonObject, protocol: _Protocol) -> JsonObject:
        """``body``, once its messages and tools are within the config's limits (400 otherwise)."""
        config = self.config
        check_turn_shape(
            body,
            protocol.messages_field,
            protocol.tool_definitions(body),
            max_messages=config.max_messages,
            max_tools=config.max_tools,
            max_tool_bytes=config.max_tool_bytes,
        )
        return body

    @staticmethod
    def _error(protocol: _Protocol, error: BaseException) -> Response:
        status_code, error_type, message = classify_error(error)
        return _json(protocol.error_body(status_code, error_type, message), status_code)

    # -- protocol endpoints -------------------------------------------------------------------------------

    async def _turn(
        self, request: Request, protocol: _Protocol, parse: Callable[[JsonObject], _ParsedTurn] | None = None
    ) -> Response:
        try:
            session_id = self._authorized_session_id(request)
            parsed = (parse or protocol.parse)(
                self._bounded(parse_json_object(await request.body()), protocol)
            )
        except Exception as error:
            return self._error(protocol, error)
        response_id = protocol.id_prefix + uuid.uuid4().hex[:24]
        created = int(time.time())
        if not parsed.stream:
            try:
                outcome = await self.registry.run_turn(session_id, parsed.turn)
            except Exception as error:
                return self._error(protocol, error)
            return _json(protocol.render_response(outcome, parsed, response_id=response_id, created=created))
        events = self.registry.stream_turn(session_id, parsed.turn)
        first = asyncio.ensure_future(anext(events))
        done, _ = await asyncio.wait({first}, timeout=self.config.keepalive_interval_s)
        if done:
            try:
                event = first.result()
            except Exception as error:
                await events.aclose()
                return self._error(protocol, error)
            if isinstance(event, TurnOutcome):  # an engine that does not stream: the finished turn, replayed
                frames = protocol.render_stream(event, parsed, response_id=response_id, created=created)
                await events.aclose()
                return Response(b"".join(frames), media_type="text/event-stream", headers=SSE_HEADERS)
        first.add_done_callback(_consume_exception)
        return _ClosingStreamingResponse(
            self._event_stream(
                events, first, protocol, parsed, response_id, created, keepalive_first=not done
            )
        )

    async def _event_stream(
        self,
        events: AsyncIterator[TurnEvent],
        pending: asyncio.Future[TurnEvent],
        protocol: _Protocol,
        parsed: _ParsedTurn,
        response_id: str,
        created: int,
        *,
        keepalive_first: bool,
    ) -> AsyncGenerator[bytes, None]:
        """The turn's frames: keep-alives while nothing arrives, then the live deltas (or the replay of a
        finished turn); a failure after the first byte is an in-stream error event. Leaving early (a client
        that disconnected) cancels the turn, which aborts the engine's request."""
        if keepalive_first:
            yield protocol.keepalive_frame
        live: _LiveStream | None = None
        deadline = time.monotonic() + self.config.max_stream_duration_s - self.config.keepalive_interval_s
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    message = (
                        f"the turn did not finish within {self.config.max_stream_duration_s} s "
                        "(ProxyConfig.max_stream_duration_s)"
                    )
                    yield protocol.stream_error_frame("timeout_error", message)
                    return
                done, _ = await asyncio.wait(
                    {pending}, timeout=min(self.config.keepalive_interval_s, remaining)
                )
                if not done:
                    yield protocol.keepalive_frame
                    continue
                try:
                    event = pending.result()
                except Exception as error:
                    _, error_type, message = classify_error(error)
                    yield protocol.stream_error_frame(error_type, message)
                    return
                if isinstance(event, TurnOutcome):
                    if live is None:  # an engine that does not stream: the finished turn, replayed
                        frames = protocol.render_stream(
                            event, parsed, response_id=response_id, created=created
                        )
                    else:
                        frames = live.finish(event)
                    for frame in frames:
                        yield frame
                    return
                if isinstance(event, TurnStarted):
                    live = protocol.live_stream(parsed, response_id=response_id, created=created)
                    frames = live.start(event)
                else:
                    assert live is not None, "a delta before TurnStarted"
                    frames = live.delta(event)
                for frame in frames:
                    yield frame
                pending = asyncio.ensure_future(anext(events))
                pending.add_done_callback(_consume_exception)
        finally:
            if (
                not pending.done()
            ):  # the stream stops early (timeout, client gone): end the turn, abort the engine
                pending.cancel()
                with suppress(BaseException):
                    await asyncio.wait({pending})
            await events.aclose()

    async def chat_completions(self, request: Request) -> Response:
        return await self._turn(request, CHAT)

    async def responses(self, request: Request) -> Response:
        return await self._turn(request, RESPONSES)

    async def messages(self, request: Request) -> Response:
        return await self._turn(request, MESSAGES)

    async def count_tokens(self, request: Request) -> Response:
        try:
            session_id = self._authorized_session_id(request)
            body = self._bounded(parse_json_object(await request.body()), MESSAGES)
            messages, tools = anthropic_messages.parse_count_tokens(body)
            num_tokens = await self.registry.count_tokens(session_id, messages, tools)
        except Exception as error:
            return self._error(MESSAGES, error)
        return _json({"input_tokens": num_tokens})

    async def gemini_model_method(self, request: Request) -> Response:
        """``POST /{version}/models/{model}:{method}``: generateContent, streamGenerateContent, countTokens."""
        model, _, method = request.path_params["model_method"].rpartition(":")
        if not model or method not in gemini_generate_content.METHODS:
            message = (
                f"POST {request.url.path}: unknown method {method!r}; this proxy serves models/MODEL:"
                + ", models/MODEL:".join(gemini_generate_content.METHODS)
            )
            return self._error(GEMINI, SessionNotFoundError(message))
        if method == gemini_generate_content.COUNT_TOKENS:
            try:
                session_id = self._authorized_session_id(request)
                body = self._bounded(parse_json_object(await request.body()), GEMINI)
                inner = body.get("generateContentRequest", body.get("generate_content_request"))
                if isinstance(inner, dict):  # the request counted is bounded as one sent whole
                    self._bounded(inner, GEMINI)
                messages, tools = gemini_generate_content.parse_count_tokens(body)
                num_tokens = await self.registry.count_tokens(session_id, messages, tools)
            except Exception as error:
                return self._error(GEMINI, error)
            return _json(gemini_generate_content.render_count_tokens(num_tokens))
        alt = request.query_params.get("alt")
        return await self._turn(
            request,
            GEMINI,
            parse=lambda body: gemini_generate_content.parse_request(
                body, model=model, method=method, alt=alt
            ),
        )

    async def gemini_models(self, request: Request) -> Response:
        """``GET /{version}/models`` and ``GET /{version}/models/{model}``: the served policy as a Model."""
        try:
            self._authorized_session_id(request)
        except Exception as error:
            return self._error(GEMINI, error)
        name = request.path_params.get("model") or self.config.served_model_name
        model = gemini_generate_content.model_resource(name)
        return _json(model if "model" in request.path_params else {"models": [model]})

    async def models(self, request: Request) -> Response:
        try:
            keys = self.config.session_keys
            bare = (
                request.path_params.get("session_id") is None and request.headers.get(SESSION_HEADER) is None
            )
            if keys is None:
                self._check_api_key(request)
            elif not (bare and keys.is_admin_key(self._presented_key(request))):
                self._authorized_session_id(request)
        except Exception as error:
            return self._error(CHAT, error)
        name = self.config.served_model_name
        model = {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "rein",
            "type": "model",
            "display_name": name,
            "created_at": "1970-01-01T00:00:00Z",
        }
        return _json(
            {"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name}
        )

    # -- session control ----------------------------------------------------------------------------------

    async def open_session(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            raw = await request.body()
            body = parse_json_object(raw) if raw.strip() else {}
            opening = SessionOpen(
                session_id=get_str(body, "session_id", "body", default=None),
                task_id=get_str(body, "task_id", "body", default=""),
                group_id=get_str(body, "group_id", "body", default=""),
                harness=get_str(body, "harness", "body", default=""),
                step=get_int(body, "step", "body", default=0, minimum=0),
                policy=get_str(body, "policy", "body", default=""),
                max_calls=get_int(body, "max_calls", "body", default=0, minimum=0),
            )
            session_id = await self.registry.open_session(opening)
        except Exception as error:
            return self._error(CHAT, error)
        root = str(request.url).split("?", 1)[0].removesuffix("/").removesuffix("/sessions")
        opened = {
            "session_id": session_id,
            "policy": opening.policy,
            "base_url": f"{root}/s/{session_id}",
        }
        keys = self.config.session_keys
        if keys is not None:
            opened["api_key"] = keys.session_token(session_id)  # the one credential to hand the agent
        return _json(opened)

    async def trajectory(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            return _json((await self.registry.describe(self._session_id(request))).to_json())
        except Exception as error:
            return self._error(CHAT, error)

    async def finalize(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            session_id = self._session_id(request)
            raw = await request.body()
            body = parse_json_object(raw) if raw.strip() else {}
            reward = body.get("reward")
            if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
                raise InvalidRequestError("body.reward: expected a number or null")
            metrics = require_object(body.get("metrics") or {}, "body.metrics")
            for name, value in metrics.items():
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidRequestError(f"body.metrics.{name}: expected a number")
            turn_rewards = get_list(body, "turn_rewards", "body", default=None)
            for index, value in enumerate(turn_rewards or ()):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidRequestError(f"body.turn_rewards[{index}]: expected a number")
            outcome = SessionOutcome(
                reward=None if reward is None else float(reward),
                status=get_str(body, "status", "body", default=None),
                failure_reason=get_str(body, "failure_reason", "body", default=""),
                metrics=metrics,
                task_id=get_str(body, "task_id", "body", default=None),
                group_id=get_str(body, "group_id", "body", default=None),
                harness=get_str(body, "harness", "body", default=None),
                step=get_int(body, "step", "body", minimum=0),
                log=get_str(body, "log", "body", default=""),
                turn_rewards=None if turn_rewards is None else tuple(turn_rewards),
            )
            trajectory = await self.registry.finalize(session_id, outcome)
        except Exception as error:
            return self._error(CHAT, error)
        return _json(trajectory_to_json(trajectory))

    async def discard(self, request: Request) -> Response:
        try:
            self._check_admin(request)
            session_id = self._session_id(request)
            await self.registry.discard(session_id)
        except Exception as error:
            return self._error(CHAT, error)
        return _json({"session_id": session_id, "discarded": True})

    async def health(self, request: Request) -> Response:
        if self.config.session_keys is not None:  # isolated mode: the host's, like every control route
            try:
                self._check_admin(request)
            except Exception as error:
                return self._error(CHAT, error)
        return _json({"status": "ok"})


def _not_found_handler(request: Request, error: Exception) -> Response:
    status_code = getattr(error, "status_code", 404)
    message = f"{request.method} {request.url.path}: {getattr(error, 'detail', 'not found')}"
    if status_code == 404:
        message += "; protocol routes live under /s/{session_id}/v1/ (chat/completions, responses, messages)"
    error_type = "not_found_error" if status_code == 404 else "invalid_request_error"
    protocol = _protocol_of_path(request.url.path)
    return _json(protocol.error_body(status_code, error_type, message), status_code)


def _limit_error_body(path: str, status_code: int, error_type: str, message: str) -> JsonObject:
    return _protocol_of_path(path).error_body(status_code, error_type, message)


def _internal_error_handler(request: Request, error: Exception) -> Response:
    status_code, error_type, message = classify_error(error)
    protocol = _protocol_of_path(request.url.path)
    return _json(protocol.error_body(status_code, error_type, message), status_code)


def build_app(registry: SessionRegistry, config: ProxyConfig | None = None) -> FastAPI:
    """The proxy as an ASGI app serving ``registry``'s sessions."""
    config = config or ProxyConfig()
    handlers = _ProxyHandlers(registry, config)
    app = FastAPI(title="Rein inference proxy", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.registry = registry
    app.state.config = config
    for prefix in ("", "/s/{session_id}"):
        for path in ("/v1/chat/completions", "/chat/completions"):
            app.add_route(prefix + path, handlers.chat_completions, methods=["POST"])
        for path in ("/v1/responses", "/responses"):
            app.add_route(prefix + path, handlers.responses, methods=["POST"])
        for path in ("/v1/messages", "/messages"):
            app.add_route(prefix + path, handlers.messages, methods=["POST"])
        app.add_route(prefix + "/v1/messages/count_tokens", handlers.count_tokens, methods=["POST"])
        app.add_route(prefix + "/v1/models", handlers.models, methods=["GET"])
        for version in gemini_generate_content.API_VERSIONS:
            app.add_route(
                prefix + f"/{version}/models/{{model_method}}", handlers.gemini_model_method, methods=["POST"]
            )
            if version != "v1":  # GET /v1/models[/{id}] is OpenAI's
                app.add_route(prefix + f"/{version}/models", handlers.gemini_models, methods=["GET"])
                app.add_route(
                    prefix + f"/{version}/models/{{model}}", handlers.gemini_models, methods=["GET"]
                )
    app.add_route("/sessions", handlers.open_session, methods=["POST"])
    app.add_route("/s/{session_id}/trajectory", handlers.trajectory, methods=["GET"])
    app.add_route("/s/{session_id}/finalize", handlers.finalize, methods=["POST"])
    app.add_route("/s/{session_id}/discard", handlers.discard, methods=["POST"])
    app.add_route("/health", handlers.health, methods=["GET"])
    app.add_exception_handler(StarletteHTTPException, _not_found_handler)
    app.add_exception_handler(Exception, _internal_error_handler)
    app.add_middleware(
        RequestSizeLimits,
        max_header_bytes=config.max_header_bytes,
        max_body_bytes=config.max_request_body_bytes,
        max_discarded_body_bytes=config.max_discarded_body_bytes,
        error_body=_limit_error_body,
    )
    return app
