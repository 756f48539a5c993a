"""Which exception ending an agent run is the policy's doing and which is the infrastructure's."""

from __future__ import annotations

import httpx
import openai
import pytest

from components.errors import ContextOverflowError, EngineError, SandboxError
from components.rollout.failures import TurnLimitReached, classify_exception, outcome_from_exception
from components.rollout.log_text import clip_text
from components.trajectory import TrajectoryStatus


def _status_error(code: int, body: dict) -> openai.APIStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:1/s/x/v1/chat/completions")
    response = httpx.Response(code, json=body, request=request)
    return openai.APIStatusError(f"Error code: {code}", response=response, body=body)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (SandboxError("gone", sandbox_id="sb1"), TrajectoryStatus.SANDBOX_ERROR),
        (ContextOverflowError(num_prompt_tokens=10, context_window=5), TrajectoryStatus.CONTEXT_OVERFLOW),
        (EngineError("boom"), TrajectoryStatus.ENGINE_ERROR),
        (TurnLimitReached("out of turns"), TrajectoryStatus.TURN_LIMIT),
        (TimeoutError(), TrajectoryStatus.TIMEOUT),
        (_status_error(413, {"error": {"type": "context_overflow"}}), TrajectoryStatus.CONTEXT_OVERFLOW),
        (_status_error(400, {"error": {"code": "context_overflow"}}), TrajectoryStatus.CONTEXT_OVERFLOW),
        (_status_error(500, {"error": {"message": "engine died"}}), TrajectoryStatus.ENGINE_ERROR),
        (_status_error(400, {"error": {"message": "bad role"}}), TrajectoryStatus.AGENT_ERROR),
        (KeyError("oops"), TrajectoryStatus.AGENT_ERROR),
    ],
)
def test_classify_exception(exc, status):
    got, reason = classify_exception(exc)
    assert got == status
    assert reason


def test_connection_error_is_engine_error():
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    assert classify_exception(openai.APIConnectionError(request=request))[0] == TrajectoryStatus.ENGINE_ERROR


def test_agent_crash_keeps_traceback_in_log():
    try:
        raise RuntimeError("my agent bug")
    except RuntimeError as exc:
        outcome = outcome_from_exception(exc, metrics={"num_turns": 2}, log="turn 1")
    assert outcome.status == "agent_error"
    assert "my agent bug" in outcome.failure_reason
    assert outcome.log.startswith("turn 1") and "Traceback" in outcome.log
    assert outcome.metrics == {"num_turns": 2}


def test_clip_text_keeps_head_and_tail():
    text = "A" * 100 + "B" * 100
    clipped = clip_text(text, 20)
    assert clipped.startswith("A" * 10) and clipped.endswith("B" * 10) and "elided" in clipped
    assert clip_text("short", 20) == "short"
