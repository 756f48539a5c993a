"""Property-based fuzzing of every protocol endpoint over real HTTP: whatever arrives, never a 5xx, always a
well-formed answer (JSON error in the protocol's shape, or a completed response)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.engine.scripted import ScriptedEngine
from components.proxy.config import ProxyConfig
from components.proxy.server import ProxyServer
from components.proxy.sessions import LocalSessionRegistry

SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=12)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
TEXT = st.text(max_size=16)
ROLES = (
    st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "wizard", ""])
    | JSON_VALUES
)
CALL_IDS = st.sampled_from(["call_1", "toolu_1", "x"]) | JSON_VALUES
CONTENT_PARTS = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["text", "input_text", "output_text", "image_url", "tool_result", "tool_use", "thinking", "zzz"]
        )
        | JSON_VALUES
    },
    optional={
        "text": TEXT | JSON_VALUES,
        "tool_use_id": CALL_IDS,
        "id": CALL_IDS,
        "name": TEXT,
        "input": JSON_VALUES,
        "content": TEXT | JSON_VALUES,
        "is_error": JSON_VALUES,
        "thinking": TEXT,
    },
)
CONTENT = TEXT | st.lists(CONTENT_PARTS, max_size=3) | JSON_VALUES
TOOL_CALLS = st.lists(
    st.fixed_dictionaries(
        {
            "id": CALL_IDS,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": TEXT, "arguments": TEXT | JSON_VALUES}),
        }
    ),
    max_size=2,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": ROLES, "content": CONTENT},
        optional={"tool_calls": TOOL_CALLS | JSON_VALUES, "tool_call_id": CALL_IDS},
    ),
    max_size=4,
)
RESPONSES_ITEMS = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["message", "function_call", "function_call_output", "reasoning", "web_search_call", "zzz"]
            )
            | JSON_VALUES
        },
        optional={
            "role": ROLES,
            "content": CONTENT,
            "call_id": CALL_IDS,
            "name": TEXT,
            "arguments": TEXT | JSON_VALUES,
            "output": TEXT | JSON_VALUES,
            "summary": JSON_VALUES,
        },
    ),
    max_size=4,
)
TOOLS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function", "custom", "web_search"]) | JSON_VALUES},
        optional={
            "name": TEXT | JSON_VALUES,
            "function": JSON_VALUES,
            "parameters": JSON_VALUES,
            "input_schema": JSON_VALUES,
        },
    ),
    max_size=2,
)
SAMPLING = {
    "max_tokens": st.integers(-2, 40) | JSON_VALUES,
    "max_output_tokens": st.integers(-2, 40) | JSON_VALUES,
    "temperature": st.floats(-1, 3) | JSON_VALUES,
    "top_p": st.floats(-0.5, 1.5) | JSON_VALUES,
    "stop": JSON_VALUES,
    "stop_sequences": JSON_VALUES,
    "seed": JSON_VALUES,
    "n": st.integers(0, 3) | JSON_VALUES,
    "stream": st.booleans() | JSON_VALUES,
    "stream_options": JSON_VALUES,
    "logprobs": st.booleans() | JSON_VALUES,
    "tools": TOOLS | JSON_VALUES,
    "system": TEXT | st.lists(CONTENT_PARTS, max_size=2) | JSON_VALUES,
    "instructions": TEXT | JSON_VALUES,
}
BODIES = (
    st.fixed_dictionaries({"messages": MESSAGES | JSON_VALUES}, optional=SAMPLING)
    | st.fixed_dictionaries({"input": RESPONSES_ITEMS | TEXT | JSON_VALUES}, optional=SAMPLING)
    | JSON_VALUES
)
ENDPOINTS = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]
FUZZ_SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def fuzz_target(tokenizer):
    engine = ScriptedEngine(
        tokenizer, ['ok <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'], context_window=4096
    )
    config = ProxyConfig(port=0, default_max_tokens=16)
    registry = LocalSessionRegistry(engine, tokenizer, config)
    server = ProxyServer(registry, config)
    server.start_in_thread()
    session_id = server.call(lambda: registry.open_session())
    token = config.session_keys.session_token(session_id)  # the closed default: the session's own token
    with httpx.Client(
        base_url=server.session_url(session_id), headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield client
    server.stop_thread()


def _check(response: httpx.Response, endpoint: str) -> None:
    assert response.status_code < 500, (endpoint, response.status_code, response.text[:500])
    if response.headers["content-type"].startswith("text/event-stream"):
        assert response.status_code == 200 and response.text.strip()
        return
    payload = response.json()
    if response.status_code >= 400:
        if "/messages" in endpoint:
            assert payload["type"] == "error" and payload["error"]["message"]
        else:
            assert payload["error"]["message"] and payload["error"]["type"]


@FUZZ_SETTINGS
@given(endpoint=st.sampled_from(ENDPOINTS), body=BODIES)
def test_structured_bodies_never_5xx(fuzz_target, endpoint, body):
    response = fuzz_target.post(
        endpoint, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    _check(response, endpoint)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endpoint=st.sampled_from(ENDPOINTS), raw=st.binary(max_size=64))
def test_raw_bytes_never_5xx(fuzz_target, endpoint, raw):
    _check(fuzz_target.post(endpoint, content=raw), endpoint)


GEMINI_PARTS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "text": TEXT | JSON_VALUES,
            "thought": JSON_VALUES,
            "functionCall": st.fixed_dictionaries(
                {"name": TEXT | JSON_VALUES}, optional={"id": CALL_IDS, "args": JSON_VALUES}
            )
            | JSON_VALUES,
            "functionResponse": st.fixed_dictionaries(
                {"name": TEXT | JSON_VALUES},
                optional={"id": CALL_IDS, "response": JSON_VALUES, "parts": JSON_VALUES},
            )
            | JSON_VALUES,
            "inlineData": JSON_VALUES,
            "executableCode": JSON_VALUES,
        },
    ),
    max_size=3,
)
GEMINI_BODIES = (
    st.fixed_dictionaries(
        {
            "contents": st.lists(
                st.fixed_dictionaries(
                    {"parts": GEMINI_PARTS | JSON_VALUES}, optional={"role": ROLES | st.just("model")}
                ),
                max_size=4,
            )
        },
        optional={
            "systemInstruction": st.fixed_dictionaries({"parts": GEMINI_PARTS | JSON_VALUES}) | JSON_VALUES,
            "tools": st.lists(
                st.fixed_dictionaries(
                    {
                        "functionDeclarations": st.lists(
                            st.fixed_dictionaries(
                                {"name": TEXT},
                                optional={"parameters": JSON_VALUES, "parametersJsonSchema": JSON_VALUES},
                            ),
                            max_size=2,
                        )
                        | JSON_VALUES
                    }
                ),
                max_size=2,
            )
            | JSON_VALUES,
            "generationConfig": st.fixed_dictionaries(
                {},
                optional={
                    "maxOutputTokens": st.integers(-2, 40) | JSON_VALUES,
                    "temperature": st.floats(-1, 3) | JSON_VALUES,
                    "topP": JSON_VALUES,
                    "topK": JSON_VALUES,
                    "stopSequences": JSON_VALUES,
                    "candidateCount": JSON_VALUES,
                    "responseLogprobs": JSON_VALUES,
                },
            )
            | JSON_VALUES,
        },
    )
    | JSON_VALUES
)
GEMINI_ENDPOINTS = [
    "/v1beta/models/m:generateContent",
    "/v1beta/models/m:streamGenerateContent?alt=sse",
    "/v1beta/models/m:countTokens",
]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(endpoint=st.sampled_from(GEMINI_ENDPOINTS), body=GEMINI_BODIES)
def test_gemini_bodies_never_5xx(fuzz_target, endpoint, body):
    response = fuzz_target.post(
        endpoint, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code < 500, (endpoint, response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"] == response.status_code and error["message"] and error["status"]
