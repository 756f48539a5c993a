"""How an agent run's ending maps to a trajectory status: the one place that decides which exception is the
policy's doing (trainable) and which is the infrastructure's (excluded from training). Used by the harnesses
(to report an outcome) and by the rollout runner (for harnesses that raise instead)."""

from __future__ import annotations

import traceback
from collections.abc import Mapping

import anthropic
import openai

from components.errors import ContextOverflowError, EngineError, SandboxError
from components.protocols import HarnessOutcome
from components.trajectory import TrajectoryStatus

CONTEXT_OVERFLOW_MARKERS = ("context_overflow", "context window", "context length", "prompt is too long")


class TurnLimitReached(Exception):  # noqa: N818 - an ending, not an error
    """Raised by agent code to end a run because it used up its turns (status ``turn_limit``)."""


def _api_error_text(exc: openai.APIError | anthropic.APIError) -> str:
    body = getattr(exc, "body", None)
    return f"{exc} {body!r}".lower()


def classify_exception(exc: BaseException) -> tuple[TrajectoryStatus, str]:
    """The status and a one-line reason for an exception that ended an agent run."""
    name = type(exc).__name__
    if isinstance(exc, SandboxError):
        return TrajectoryStatus.SANDBOX_ERROR, f"sandbox failed: {exc}"
    if isinstance(exc, ContextOverflowError):
        return TrajectoryStatus.CONTEXT_OVERFLOW, str(exc)
    if isinstance(exc, EngineError):
        return TrajectoryStatus.ENGINE_ERROR, f"engine failed: {exc}"
    if isinstance(exc, TurnLimitReached):
        return TrajectoryStatus.TURN_LIMIT, str(exc) or "turn limit reached"
    if isinstance(exc, TimeoutError):
        return TrajectoryStatus.TIMEOUT, str(exc) or "wall-clock limit reached"
    if isinstance(exc, openai.APIStatusError | anthropic.APIStatusError):
        text = _api_error_text(exc)
        if exc.status_code == 413 or any(marker in text for marker in CONTEXT_OVERFLOW_MARKERS):
            return TrajectoryStatus.CONTEXT_OVERFLOW, f"context overflow (HTTP {exc.status_code}): {exc}"
        if exc.status_code >= 500:
            return TrajectoryStatus.ENGINE_ERROR, f"inference failed (HTTP {exc.status_code}): {exc}"
        # A 4xx other than overflow: the agent sent something the proxy could not accept.
        return TrajectoryStatus.AGENT_ERROR, f"request rejected (HTTP {exc.status_code}): {exc}"
    if isinstance(exc, openai.APIConnectionError | anthropic.APIConnectionError):
        return TrajectoryStatus.ENGINE_ERROR, f"could not reach the inference proxy: {name}: {exc}"
    return TrajectoryStatus.AGENT_ERROR, f"agent crashed: {name}: {exc}"


def outcome_from_exception(
    exc: BaseException, *, metrics: Mapping[str, float] | None = None, log: str = ""
) -> HarnessOutcome:
    """A ``HarnessOutcome`` for a run that ended with ``exc``; the traceback goes to the log."""
    status, reason = classify_exception(exc)
    trace = "".join(traceback.format_exception(exc)) if status == TrajectoryStatus.AGENT_ERROR else ""
    return HarnessOutcome(
        status=status.value,
        failure_reason=reason,
        metrics=dict(metrics or {}),
        log=(log + ("\n" if log else "") + trace) if trace else log,
    )
