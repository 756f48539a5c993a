"""What can go wrong in a proxy request, each mapped to one HTTP status and error type.

The protocol layers render these in their own error shape (OpenAI ``{"error": {...}}``, Anthropic
``{"type": "error", "error": {...}}``); ``ContextOverflowError`` from ``components.errors`` maps to 413.
"""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """The request is malformed (bad JSON, wrong type, missing field, unknown role, dangling tool result)."""

    status_code = 400
    error_type = "invalid_request_error"


class SessionNotFoundError(LookupError):
    """The session id is unknown, or the session was already finalized or discarded."""

    status_code = 404
    error_type = "not_found_error"


class AuthenticationError(PermissionError):
    """The proxy has an API key and the request did not carry it."""

    status_code = 401
    error_type = "authentication_error"


class RemoteCallError(Exception):
    """A proxy error carried across a Ray actor boundary (plain args, so it always pickles)."""

    def __init__(self, status_code: int, error_type: str, message: str, details: dict | None = None) -> None:
        super().__init__(status_code, error_type, message, details or {})
        self.status_code = status_code
        self.error_type = error_type
        self.message = message
        self.details = details or {}

    def __str__(self) -> str:
        return self.message


def to_remote(error: BaseException) -> RemoteCallError:
    """An exception of any type → a ``RemoteCallError`` with its HTTP status, type and message."""
    from components.errors import ContextOverflowError

    status_code, error_type, message = classify_error(error)
    details = {}
    if isinstance(error, ContextOverflowError):
        details = {"num_prompt_tokens": error.num_prompt_tokens, "context_window": error.context_window}
    return RemoteCallError(status_code, error_type, message, details)


def from_remote(error: RemoteCallError) -> BaseException:
    """The typed exception a ``RemoteCallError`` stands for (itself when there is none)."""
    from components.errors import ContextOverflowError, EngineError

    if error.status_code == 413 and error.details:
        return ContextOverflowError(**error.details)
    for error_class in (InvalidRequestError, SessionNotFoundError, AuthenticationError):
        if error.status_code == error_class.status_code:
            return error_class(error.message)
    if error.error_type == "engine_error":
        return EngineError(error.message)
    return error


def classify_error(error: BaseException) -> tuple[int, str, str]:
    """An exception → (HTTP status, error type, message). Only engine failures (502) and bugs (500) are 5xx."""
    import logging

    from components.errors import ContextOverflowError, EngineError, MissingLogprobsError

    cause = getattr(error, "cause", None)  # a Ray task error carries the actor's exception
    if isinstance(cause, BaseException):
        error = cause
    if isinstance(error, RemoteCallError):
        return error.status_code, error.error_type, error.message
    if isinstance(error, InvalidRequestError | SessionNotFoundError | AuthenticationError):
        return error.status_code, error.error_type, str(error)
    if isinstance(error, ContextOverflowError):
        return 413, "context_overflow", str(error)
    if isinstance(error, MissingLogprobsError | EngineError):
        return 502, "engine_error", f"the inference engine failed: {error}"
    if isinstance(error, ValueError):
        return 400, "invalid_request_error", str(error)
    logging.getLogger(__name__).error("internal proxy error", exc_info=error)
    return 500, "internal_error", f"internal proxy error: {type(error).__name__}: {error}"
