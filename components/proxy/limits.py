"""What one request may send the proxy: header and body bytes, messages, tools (issue #28.5).

An agent's session is untrusted input. The HTTP parser itself (uvicorn's h11, ``ProxyServer``) stops buffering a
request's head at ``request_head_limit_bytes`` - an ASGI middleware only sees headers once they are all parsed
and held. ``RequestSizeLimits`` is an ASGI middleware in front of every route: it
refuses headers larger than ``max_header_bytes``, a ``Content-Length`` over
``max_request_body_bytes`` before reading a byte of the body, and a body sent without one (chunked) as soon as
the bytes received pass the limit — so the proxy never holds more than the limit (plus one network chunk) of a
request in memory. The rest of a refused body is read and dropped, up to ``max_discarded_body_bytes``, so that
the client sees the refusal (closing on unread bytes resets the connection); past that the connection is
closed without one. ``check_turn_shape`` then bounds what the parsed body asks the proxy to render and tokenize:
messages (Responses: input items), tools, and each tool's size. Each refusal is answered in the protocol's own
error shape: 413 ``request_too_large`` for bodies, 400 ``invalid_request_error`` for the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from components.json_types import JsonObject, JsonValue
from components.proxy.errors import InvalidRequestError

# (request path, HTTP status, error type, message) → the JSON error body in that route's protocol's shape
ErrorBody = Callable[[str, int, str, str], JsonObject]


def request_head_limit_bytes(max_header_bytes: int) -> int:
    """What the HTTP parser may buffer of one request's head (request line and headers) before it refuses the
    request (400, connection closed): twice ``max_header_bytes``, so that a head up to that size still reaches
    ``RequestSizeLimits`` and is refused in the protocol's own error shape."""
    return 2 * max_header_bytes


class RequestTooLargeError(InvalidRequestError):
    """The request body is larger than ``ProxyConfig.max_request_body_bytes``."""

    status_code = 413
    error_type = "request_too_large"


class RequestSizeLimits:
    """ASGI middleware: header bytes and body bytes of every HTTP request, bounded before the app holds them."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_header_bytes: int,
        max_body_bytes: int,
        max_discarded_body_bytes: int,
        error_body: ErrorBody,
    ) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.max_discarded_body_bytes = max_discarded_body_bytes
        self.error_body = error_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])  # ": " and CRLF
        if header_bytes > self.max_header_bytes:
            message = (
                f"request headers are {header_bytes} bytes, over the proxy's limit of {self.max_header_bytes} "
                "(ProxyConfig.max_header_bytes)"
            )
            await self._refuse(send, path, 400, "invalid_request_error", message)
            return
        declared = [value for name, value in scope["headers"] if name.lower() == b"content-length"]
        if declared:
            try:
                length = int(declared[0])
            except ValueError:
                await self._refuse(send, path, 400, "invalid_request_error", "Content-Length is not a number")
                return
            if length > self.max_body_bytes:
                if length <= self.max_discarded_body_bytes:
                    await self._discard(receive, 0)
                await self._refuse(send, path, 413, RequestTooLargeError.error_type, self._too_large(length))
                return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        """``receive`` that raises ``RequestTooLargeError`` once the body passes the limit (chunked bodies)."""
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    if message.get("more_body", False):
                        await self._discard(receive, received)
                    raise RequestTooLargeError(self._too_large(received, at_least=True))
            return message

        return counted

    async def _discard(self, receive: Receive, num_received: int) -> None:
        """Read the rest of a refused body without keeping it (up to ``max_discarded_body_bytes``): a server
        that closes on unread bytes resets the connection, and the client would never see the 413."""
        while num_received <= self.max_discarded_body_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            num_received += len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    def _too_large(self, num_bytes: int, *, at_least: bool = False) -> str:
        size = f"at least {num_bytes}" if at_least else str(num_bytes)
        return (
            f"request body is {size} bytes, over the proxy's limit of {self.max_body_bytes} "
            "(ProxyConfig.max_request_body_bytes)"
        )

    async def _refuse(self, send: Send, path: str, status: int, error_type: str, message: str) -> None:
        body = json.dumps(self.error_body(path, status, error_type, message)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        headers.append((b"connection", b"close"))  # the unread body is not drained: this connection ends
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def check_turn_shape(
    body: JsonObject,
    messages_field: str,
    tools: JsonValue,
    *,
    max_messages: int,
    max_tools: int,
    max_tool_bytes: int,
) -> None:
    """Refuse (400) a parsed turn request with too many messages or tool definitions (``tools``: as the
    protocol lists them, e.g. each of Gemini's function declarations), or a tool definition too large."""
    messages = body.get(messages_field)
    if isinstance(messages, list) and len(messages) > max_messages:
        raise InvalidRequestError(
            f"{messages_field}: {len(messages)} items, over the proxy's limit of {max_messages} "
            "(ProxyConfig.max_messages)"
        )
    if not isinstance(tools, list):
        return
    if len(tools) > max_tools:
        raise InvalidRequestError(
            f"tools: {len(tools)} tool definitions, over the proxy's limit of {max_tools} (ProxyConfig.max_tools)"
        )
    for index, tool in enumerate(tools):
        size = len(json.dumps(tool, ensure_ascii=False).encode())
        if size > max_tool_bytes:
            raise InvalidRequestError(
                f"tool definition {index}: {size} bytes, over the proxy's limit of {max_tool_bytes} per tool "
                "(ProxyConfig.max_tool_bytes)"
            )
