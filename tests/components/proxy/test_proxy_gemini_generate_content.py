"""Google's Gemini API through the proxy with Google's official ``google-genai`` SDK as the client."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from google import genai
from google.genai import errors, types

from components.engine.scripted import ScriptedEngine
from tests.components.proxy.proxy_helpers import (
    DelayedEngine,
    assert_one_segment_record,
    reply_ids,
    tool_call_text,
)

READ_FILE = types.FunctionDeclaration(
    name="read_file",
    description="Read a file.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={
            "path": types.Schema(type=types.Type.STRING),
            "limit": types.Schema(type=types.Type.INTEGER, nullable=True),
        },
        required=["path"],
    ),
)


def _client(proxy, session_id: str, api_key: str = "unused") -> genai.Client:
    return genai.Client(
        api_key=api_key,
        http_options=types.HttpOptions(base_url=proxy.session_url(session_id), api_version="v1beta"),
    )


def test_generate_content_non_streaming(start_proxy, tokenizer):
    replies = ["Hello, I am the policy."]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = _client(proxy, session_id)  # held: a dropped Client closes its HTTP connection pool
    response = client.models.generate_content(
        model="gemini-2.5-pro",
        contents="hi",
        config=types.GenerateContentConfig(
            system_instruction="You are Gemini CLI.",
            max_output_tokens=256,
            temperature=0.7,
            thinking_config=types.ThinkingConfig(thinking_budget=1024),
            safety_settings=[
                types.SafetySetting(
                    category=types.HarmCategory.HARM_CATEGORY_HARASSMENT,
                    threshold=types.HarmBlockThreshold.BLOCK_NONE,
                )
            ],
        ),
    )
    assert response.text == replies[0]
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    assert response.candidates[0].content.role == "model"
    assert response.usage_metadata.candidates_token_count == len(reply_ids(tokenizer, replies[0]))
    assert response.usage_metadata.prompt_token_count == len(proxy.engine.prompts[0])
    assert response.model_version == "gemini-2.5-pro"
    prompt = tokenizer.decode(proxy.engine.prompts[0])
    assert "You are Gemini CLI." in prompt and "hi" in prompt
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_function_calling_round_trips_streaming(start_proxy, tokenizer):
    """Two function calls and a final answer over ``streamGenerateContent?alt=sse``, the history sent back
    as the SDK's Content objects: one append-only segment."""
    replies = [
        tool_call_text("read_file", {"path": "a.py"}, prefix="I will read it."),
        tool_call_text("read_file", {"path": "b.py"}),
        "Both files are empty.",
    ]
    proxy = start_proxy(script=replies)
    session_id = proxy.open_session()
    client = _client(proxy, session_id)
    config = types.GenerateContentConfig(
        system_instruction="You are a coder.",
        tools=[types.Tool(function_declarations=[READ_FILE])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        tool_config=types.ToolConfig(
            function_calling_config=types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.AUTO)
        ),
    )
    contents = [types.Content(role="user", parts=[types.Part.from_text(text="Read a.py and b.py")])]
    results = [{"output": ""}, {"error": "no such file"}]
    for turn in range(3):
        chunks = list(
            client.models.generate_content_stream(model="gemini-2.5-flash", contents=contents, config=config)
        )
        assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
        parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts]
        calls = [part.function_call for part in parts if part.function_call]
        if turn < 2:
            assert len(calls) == 1 and calls[0].name == "read_file"
            assert calls[0].args == {"path": ["a.py", "b.py"][turn]} and calls[0].id
            contents.append(types.Content(role="model", parts=parts))
            contents.append(
                types.Content(
                    role="user",
                    parts=[types.Part.from_function_response(name="read_file", response=results[turn])],
                )
            )
        else:
            assert not calls and "".join(p.text for p in parts if p.text) == "Both files are empty."
    assert "I will read it." in "".join(p.text or "" for p in contents[1].parts)
    assert "Error: no such file" in tokenizer.decode(proxy.engine.prompts[2])
    # the schema reached the policy as JSON schema (lower-case types, nullable as a type union)
    assert '"type": ["integer", "null"]' in tokenizer.decode(proxy.engine.prompts[0])
    assert_one_segment_record(proxy.describe(session_id), proxy.engine, replies, tokenizer)


def test_raw_sse_chunks_and_json_array_stream(start_proxy):
    proxy = start_proxy(script=[tool_call_text("read_file", {"path": "x"}, prefix="ok")] * 2)
    session_id = proxy.open_session()
    base = f"{proxy.session_url(session_id)}/v1beta/models/gemini-2.5-pro"
    body = {
        "contents": [{"role": "user", "parts": [{"text": "go"}]}],
        "tools": [
            {"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}
        ],
    }
    raw = httpx.post(f"{base}:streamGenerateContent?alt=sse", json=body, headers={"x-goog-api-key": "k"})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    frames = [json.loads(f.removeprefix("data: ")) for f in raw.text.split("\r\n\r\n") if f]
    assert [list(f["candidates"][0]["content"]["parts"][0]) for f in frames] == [["text"], ["functionCall"]]
    assert (
        "finishReason" not in frames[0]["candidates"][0]
        and frames[1]["candidates"][0]["finishReason"] == "STOP"
    )
    assert "candidatesTokenCount" in frames[1]["usageMetadata"]
    array = httpx.post(f"{base}:streamGenerateContent", json=body)
    assert array.status_code == 200 and isinstance(array.json(), list)
    assert [list(c["candidates"][0]["content"]["parts"][0]) for c in array.json()] == [
        ["text"],
        ["functionCall"],
    ]


def test_count_tokens_and_models(start_proxy):
    proxy = start_proxy(served_model_name="policy-x")
    session_id = proxy.open_session()
    client = _client(proxy, session_id)
    counted = client.models.count_tokens(model="gemini-2.5-pro", contents="Count me")
    client.models.generate_content(model="gemini-2.5-pro", contents="Count me")
    assert counted.total_tokens == len(proxy.engine.prompts[0])
    # the whole request (system instruction, tools) as generateContentRequest, as the REST API takes it
    request = {
        "model": "models/gemini-2.5-pro",
        "contents": [{"role": "user", "parts": [{"text": "Count me"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
    }
    url = f"{proxy.session_url(session_id)}/v1beta/models/gemini-2.5-pro:countTokens"
    with_system = httpx.post(url, json={"generateContentRequest": request}).json()
    client.models.generate_content(
        model="gemini-2.5-pro",
        contents="Count me",
        config=types.GenerateContentConfig(system_instruction="Be brief."),
    )
    assert with_system["totalTokens"] == len(proxy.engine.prompts[1]) != counted.total_tokens
    assert client.models.get(model="gemini-2.5-pro").name == "models/gemini-2.5-pro"
    assert [m.name for m in client.models.list()] == ["models/policy-x"]


def test_logprobs(start_proxy, tokenizer):
    proxy = start_proxy(script=["two tokens"])
    session_id = proxy.open_session()
    client = _client(proxy, session_id)
    response = client.models.generate_content(
        model="m", contents="hi", config=types.GenerateContentConfig(response_logprobs=True, logprobs=1)
    )
    candidate = response.candidates[0]
    chosen = candidate.logprobs_result.chosen_candidates
    assert len(chosen) == len(reply_ids(tokenizer, "two tokens"))
    assert [c.log_probability for c in chosen] == [0.0] * len(chosen)  # the scripted engine's logprobs
    assert len(candidate.logprobs_result.top_candidates) == len(chosen)
    assert candidate.avg_logprobs == 0.0


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"contents": []}, "body.contents: must contain at least one content"),
        ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "unknown role 'assistant'"),
        ({"contents": [{"role": "user", "parts": []}]}, "contents[0].parts: must contain at least one part"),
        (
            {"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}]},
            "answers no earlier function call",
        ),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
            "functionCall.args: expected an object",
        ),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
            "candidateCount: only 1",
        ),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temperature": 3}},
            "generationConfig.temperature: must be in [0.0, 2.0]",
        ),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": "many"}},
            "generationConfig.maxOutputTokens",
        ),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "tools": [{"functionDeclarations": [{"description": "d"}]}],
            },
            "functionDeclarations[0].name: missing",
        ),
    ],
)
def test_bad_input_is_a_google_400(start_proxy, body, needle):
    proxy = start_proxy()
    session_id = proxy.open_session()
    response = httpx.post(
        f"{proxy.session_url(session_id)}/v1beta/models/gemini-2.5-pro:generateContent", json=body
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    assert needle in error["message"]
    assert error["details"][0]["reason"] == "INVALID_REQUEST_ERROR"


def test_sdk_errors_are_google_shaped(start_proxy, tokenizer):
    """Bad input, an unknown session, an unknown method, a missing key and a context overflow, each as the
    SDK's typed error with Google's code and status."""
    proxy = start_proxy(ScriptedEngine(tokenizer, ["ok"], context_window=200), api_key="sekret")
    session_id = httpx.post(f"{proxy.url}/sessions", headers={"x-goog-api-key": "sekret"}).json()[
        "session_id"
    ]
    client = _client(proxy, session_id, api_key="sekret")
    with pytest.raises(errors.ClientError) as bad:
        client.models.generate_content(
            model="m", contents="x", config=types.GenerateContentConfig(candidate_count=3)
        )
    assert (bad.value.code, bad.value.status) == (400, "INVALID_ARGUMENT")
    wrong_key = _client(proxy, session_id, api_key="wrong")
    with pytest.raises(errors.ClientError) as unauthenticated:
        wrong_key.models.generate_content(model="m", contents="x")
    assert (unauthenticated.value.code, unauthenticated.value.status) == (401, "UNAUTHENTICATED")
    no_session = _client(proxy, "missing", api_key="sekret")
    with pytest.raises(errors.ClientError) as missing:
        no_session.models.generate_content(model="m", contents="x")
    assert (missing.value.code, missing.value.status) == (404, "NOT_FOUND")
    assert "POST /sessions" in missing.value.message
    unknown = httpx.post(
        f"{proxy.session_url(session_id)}/v1beta/models/m:embedContent?key=sekret", json={"contents": []}
    )
    assert unknown.status_code == 404 and "generateContent" in unknown.json()["error"]["message"]
    with pytest.raises(errors.ClientError) as overflow:
        list(client.models.generate_content_stream(model="m", contents="word " * 300))
    assert (overflow.value.code, overflow.value.status) == (413, "INVALID_ARGUMENT")
    assert overflow.value.details["error"]["details"][0]["reason"] == "CONTEXT_OVERFLOW"
    assert proxy.describe(session_id).status == "context_overflow"


def test_keepalive_and_in_stream_error(start_proxy, tokenizer):
    """A slow engine: blank-line keep-alives that the SDK reads through; an engine failure after the stream
    started: an in-stream Google error the SDK raises."""
    proxy = start_proxy(
        DelayedEngine(ScriptedEngine(tokenizer, ["slow reply"]), delay_s=0.6), keepalive_interval_s=0.1
    )
    session_id = proxy.open_session()
    url = f"{proxy.session_url(session_id)}/v1beta/models/m:streamGenerateContent?alt=sse"
    raw = httpx.post(url, json={"contents": [{"parts": [{"text": "hi"}]}]}).text
    assert raw.startswith("\r\n\r\n\r\n") and raw.strip().startswith("data: ")
    client = _client(proxy, session_id)
    chunks = list(client.models.generate_content_stream(model="m", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "slow reply"

    class FailingEngine(DelayedEngine):
        async def generate(self, input_ids, params):
            await asyncio.sleep(self.delay_s)
            raise RuntimeError("GPU on fire")

    failing = start_proxy(
        FailingEngine(ScriptedEngine(tokenizer, ["x"]), delay_s=0.3), keepalive_interval_s=0.05
    )
    failing_session = failing.open_session()
    failing_client = _client(failing, failing_session)
    with pytest.raises(errors.ServerError, match="GPU on fire") as caught:
        list(failing_client.models.generate_content_stream(model="m", contents="hi"))
    assert caught.value.code == 500
