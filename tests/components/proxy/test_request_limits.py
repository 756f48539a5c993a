"""The proxy bounds what a session can send (issue #28.5), attacked from inside a real bubblewrap sandbox.

An agent holding its own session's token sends, over real HTTP through the sandbox's proxy path: a body far
over the limit with a ``Content-Length`` and the same body chunked (no length), oversized headers, too many
messages (OpenAI Chat, Gemini), too many tools (Anthropic Messages; Gemini function declarations in one
``Tool``), one huge tool (OpenAI Responses, Gemini), a Gemini ``countTokens`` nesting too many contents, and a
stream the engine would hold open for long. Against the default proxy each is refused in its protocol's own
error shape and the host's peak memory grows by far less than the body sent; against the weakened variant
``limits-off`` (every limit out of reach) the same requests land: served, or read whole into the host's memory.
A second phase floods one request's head with 64 MiB of headers: the default proxy's HTTP parser refuses it
while it arrives (400 or a closed connection, the host's peak memory flat), ``limits-off`` holds all of it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from components.protocols import SandboxSpec
from components.tasks.swe import python_tool_paths

pytestmark = pytest.mark.timeout(600)

BODY_BYTES = 32 * 1024 * 1024  # what the attacker sends; the host may keep at most a few MB of it
HEADER_FLOOD_BYTES = 64 * 1024 * 1024  # one request's head: 64 header lines of 1 MiB
HELD_WHOLE = 0.75  # the share of a body the weakened proxy's peak must show: read whole, not refused
LIMITS = dict(
    max_request_body_bytes=1024 * 1024,
    max_header_bytes=8 * 1024,
    max_messages=32,
    max_tools=8,
    max_tool_bytes=2048,
    max_stream_duration_s=2.0,
    keepalive_interval_s=0.5,
    insecure_open_control_plane=False,  # the default: the agent holds its session token only
)
LIMITS_OFF = {**LIMITS, **dict.fromkeys(("max_request_body_bytes", "max_header_bytes"), 2**40)}
LIMITS_OFF |= {
    "max_messages": 2**30,
    "max_tools": 2**30,
    "max_tool_bytes": 2**40,
    "max_stream_duration_s": 1e6,
}
ENGINE_DELAY_S = 6.0  # the "slow" turn waits this long: the stream bound (2 s) must cut it short

ATTACK_SCRIPT = r"""
import json, os, sys, time
import anthropic, httpx, openai

base, token, body_bytes = os.environ["BASE"], os.environ["TOKEN"], int(os.environ["BODY_BYTES"])
auth = {"Authorization": f"Bearer {token}"}
results = {}

if os.environ["PHASE"] == "header_flood":  # one request whose head never ends within any sane limit
    import socket
    from urllib.parse import urlsplit

    url, reply = urlsplit(base), b""
    sock = socket.create_connection((url.hostname, url.port), timeout=120)
    try:
        sock.sendall(f"POST {url.path}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n".encode())
        for i in range(int(os.environ["HEADER_FLOOD_BYTES"]) >> 20):
            sock.sendall(b"X-Flood-%d: " % i + b"f" * (1 << 20) + b"\r\n")
        sock.sendall(b"\r\n")
        while chunk := sock.recv(65536):
            reply += chunk
    except OSError as error:  # the server closed the connection while the head was still arriving
        reply += repr(error).encode()
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None
    print(json.dumps({"header_flood": {"status": status, "body": reply[-500:].decode(errors="replace")}}))
    sys.exit(0)

def chunks():
    for _ in range(body_bytes // (1 << 20)):
        yield b"x" * (1 << 20)

def raw(name, headers, content):
    started = time.monotonic()
    try:
        response = httpx.post(f"{base}/v1/chat/completions", headers={**auth, **headers}, content=content,
                              timeout=120)
        json_body = response.headers.get("content-type", "").startswith("application/json")
        results[name] = {"status": response.status_code, "body": response.json() if json_body else response.text}
    except httpx.HTTPError as error:
        results[name] = {"status": None, "body": repr(error)}
    results[name]["elapsed_s"] = time.monotonic() - started

raw("body_with_length", {"Content-Length": str(body_bytes)}, chunks())
raw("body_chunked", {}, chunks())
chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
raw("headers", {"X-Padding": "p" * 12288}, json.dumps(chat).encode())  # over 8 KiB, under the parser's bound

def sdk(name, call):
    started = time.monotonic()
    try:
        call()
        results[name] = {"status": 200}
    except (openai.APIStatusError, anthropic.APIStatusError) as error:
        results[name] = {"status": error.status_code, "body": error.response.json()}  # the wire's shape
    except (openai.APIError, anthropic.APIError) as error:  # an error event inside a stream
        results[name] = {"status": "stream_error", "body": {"message": str(error)}}
    results[name]["elapsed_s"] = time.monotonic() - started

oa = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=base, api_key=token, max_retries=0, timeout=120)
sdk("messages", lambda: oa.chat.completions.create(
    model="m", max_tokens=4, messages=[{"role": "user", "content": f"m{i}"} for i in range(100)]))
tool = lambda i, size: {"name": f"t{i}", "description": "d" * size, "input_schema": {"type": "object"}}
sdk("tools", lambda: an.messages.create(
    model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}], tools=[tool(i, 8) for i in range(20)]))
big = {"type": "function", "name": "big", "description": "d" * 8192, "parameters": {"type": "object"}}
sdk("tool_bytes", lambda: oa.responses.create(model="m", input="hi", tools=[big], max_output_tokens=4))
def stream():
    for _ in oa.chat.completions.create(model="m", max_tokens=4, stream=True,
                                        messages=[{"role": "user", "content": "slow"}]):
        pass
sdk("stream", stream)

from google import genai
from google.genai import errors as genai_errors, types as genai_types

def gemini(name, call):
    try:
        call()
        results[name] = {"status": 200}
    except genai_errors.APIError as error:
        results[name] = {"status": error.code, "body": error.details}

gm = genai.Client(api_key=token, http_options=genai_types.HttpOptions(base_url=base, api_version="v1beta"))
contents = [genai_types.Content(role="user", parts=[genai_types.Part(text=f"m{i}")]) for i in range(100)]
gemini("gemini_messages", lambda: gm.models.generate_content(model="g", contents=contents))
declarations = [genai_types.FunctionDeclaration(name=f"t{i}", description="d") for i in range(20)]
one_tool = genai_types.GenerateContentConfig(tools=[genai_types.Tool(function_declarations=declarations)])
gemini("gemini_tools", lambda: gm.models.generate_content(model="g", contents="hi", config=one_tool))
big_tool = genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(name="big", description="d" * 8192)])
gemini("gemini_tool_bytes", lambda: gm.models.generate_content(
    model="g", contents="hi", config=genai_types.GenerateContentConfig(tools=[big_tool])))
nested = {"generateContentRequest": {"model": "models/g", "contents": [{"role": "user", "parts": [{"text": "m"}]}] * 100}}
response = httpx.post(f"{base}/v1beta/models/g:countTokens", headers={"x-goog-api-key": token}, json=nested, timeout=120)
results["gemini_count_tokens"] = {"status": response.status_code, "body": response.json()}
print(json.dumps(results))
"""


class SlowWhenAsked:
    """A real engine whose generations for a prompt saying "slow" first wait ``ENGINE_DELAY_S``."""

    def __init__(self, inner, tokenizer) -> None:
        self.inner, self.tokenizer = inner, tokenizer

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, input_ids, params):
        if "slow" in self.tokenizer.decode(list(input_ids)):
            await asyncio.sleep(ENGINE_DELAY_S)
        return await self.inner.generate(input_ids, params)


def _peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (the peak resident set) to the current RSS


def _status_kb(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1])


async def _attack(start_proxy, tokenizer, limits: dict) -> tuple[dict, dict[str, int]]:
    """Each phase's results and the host's peak memory growth during it."""
    from components.engine.scripted import ScriptedEngine
    from sandboxes.bwrap import BwrapSandbox

    engine = SlowWhenAsked(ScriptedEngine(tokenizer, ["ok"]), tokenizer)
    proxy = start_proxy(engine, **limits)
    session_id = proxy.open_session()
    token = proxy.server.config.session_keys.session_token(session_id)
    sandbox = await BwrapSandbox.create(SandboxSpec(proxy_url=proxy.url, read_only_paths=python_tool_paths()))
    try:
        await sandbox.write_file("attack.py", ATTACK_SCRIPT)
        results, peak_growth = {}, {}
        for phase in ("requests", "header_flood"):
            rss_before_kb = _status_kb("VmRSS:")
            _peak_rss_reset()
            result = await sandbox.exec(
                [sys.executable, "attack.py"],
                env={
                    "BASE": proxy.session_url(session_id),
                    "TOKEN": token,
                    "BODY_BYTES": str(BODY_BYTES),
                    "HEADER_FLOOD_BYTES": str(HEADER_FLOOD_BYTES),
                    "PHASE": phase,
                },
                timeout_s=300,
            )
            peak_growth[phase] = (_status_kb("VmHWM:") - rss_before_kb) * 1024
            assert result.exit_code == 0, result.stdout + result.stderr
            results |= json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        await sandbox.close()
    return results, peak_growth


def _error_type(result: dict, shape: str) -> str:
    body = result["body"]
    if shape == "anthropic":
        assert body["type"] == "error", body
    if shape == "gemini":  # google.rpc.Status, the proxy's error type as its ErrorInfo reason
        assert body["error"]["code"] == result["status"], body
        return body["error"]["details"][0]["reason"].lower()
    return body["error"]["type"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["default", "limits-off"])
async def test_oversized_requests_are_refused_before_the_host_holds_them(start_proxy, tokenizer, variant):
    results, peak_growth = await _attack(
        start_proxy, tokenizer, LIMITS if variant == "default" else LIMITS_OFF
    )
    print(json.dumps(results)[:3000])
    print(
        f"{variant}: host peak memory +{peak_growth['requests'] / 2**20:.1f} MiB for 2 x "
        f"{BODY_BYTES / 2**20:.0f} MiB of bodies, +{peak_growth['header_flood'] / 2**20:.1f} MiB for "
        f"{HEADER_FLOOD_BYTES / 2**20:.0f} MiB of headers"
    )
    gemini_cases = ("gemini_messages", "gemini_tools", "gemini_tool_bytes", "gemini_count_tokens")
    if variant == "limits-off":  # the weakened proxy reads the bodies and the head whole, serves the rest
        # Holding a whole body raises the peak by about its size, less what the allocator reuses of memory the
        # process already held (CI once measured 31.9 MiB for a 32 MiB body): far over the default's bound.
        assert peak_growth["requests"] >= HELD_WHOLE * BODY_BYTES, peak_growth
        assert peak_growth["header_flood"] >= HELD_WHOLE * HEADER_FLOOD_BYTES, peak_growth
        assert results["body_with_length"]["status"] == results["body_chunked"]["status"] == 400  # bad JSON
        assert results["header_flood"]["status"] == 400  # parsed whole, then its empty body is no JSON
        assert "invalid_request_error" in results["header_flood"]["body"]
        for name in ("headers", "messages", "tools", "tool_bytes", "stream", *gemini_cases):
            assert results[name]["status"] == 200, (name, results[name])
        assert results["stream"]["elapsed_s"] >= ENGINE_DELAY_S
        return
    assert peak_growth["requests"] < 16 * 2**20, f"host peak memory grew {peak_growth} bytes"
    assert peak_growth["header_flood"] < 8 * 2**20, f"host peak memory grew {peak_growth} bytes"
    # refused by the HTTP parser while the head arrives: its plain 400, or the connection closed under the sender
    assert results["header_flood"]["status"] in (400, None), results["header_flood"]
    assert "invalid_request_error" not in results["header_flood"]["body"]
    for name in ("body_with_length", "body_chunked"):
        assert results[name]["status"] == 413, (name, results[name])
        assert _error_type(results[name], "openai") == "request_too_large"
        assert "max_request_body_bytes" in results[name]["body"]["error"]["message"]
    assert results["headers"]["status"] == 400 and "max_header_bytes" in str(results["headers"]["body"])
    expected = {"messages": ("openai", "max_messages"), "tools": ("anthropic", "max_tools")}
    expected["tool_bytes"] = ("openai", "max_tool_bytes")
    expected |= {"gemini_messages": ("gemini", "max_messages"), "gemini_tools": ("gemini", "max_tools")}
    expected |= {"gemini_tool_bytes": ("gemini", "max_tool_bytes")}
    expected["gemini_count_tokens"] = ("gemini", "max_messages")
    for name, (shape, field) in expected.items():
        assert results[name]["status"] == 400, (name, results[name])
        assert _error_type(results[name], shape) == "invalid_request_error"
        assert field in json.dumps(results[name]["body"]), results[name]
    assert results["stream"]["status"] == "stream_error", results["stream"]
    assert "max_stream_duration_s" in results["stream"]["body"]["message"]
    assert results["stream"]["elapsed_s"] < ENGINE_DELAY_S - 2.0
