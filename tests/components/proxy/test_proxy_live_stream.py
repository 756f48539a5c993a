"""Live streaming: with an engine that streams (``StreamingEngine``), every protocol writes its deltas as the
tokens are sampled - before the generation ends - through the official SDKs; the pieces join to the non-streamed
answer, the record holds exactly the sampled ids, and a client that leaves mid-stream aborts the engine's
request. The embedded engine (real model, real scheduler) and a paced scripted engine (a slow decode step, so
that "before the end" is measured, not raced)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence

import anthropic
import httpx
import numpy as np
import openai
import pytest
from google import genai
from google.genai import types

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.providers import EmbeddedEngineBrickConfig
from components.engine.scripted import ScriptedEngine
from components.protocols import GenerationResult, SamplingParams, StreamingEngine, TokenChunk
from tests.components.proxy.proxy_helpers import BASH_TOOL_OPENAI, tool_call_text

pytestmark = pytest.mark.timeout(180)

REPLY = tool_call_text(
    "bash", {"cmd": "ls -la /workspace && cat README.md"}, prefix="Let me look at the files."
)


class PacedEngine:
    """A scripted engine that streams its reply one token per ``delay_s`` (a slow decode step); it counts the
    tokens it has handed out and the streams closed before their end."""

    def __init__(self, inner: ScriptedEngine, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.num_sampled = 0
        self.num_closed_early = 0
        self.results: list[GenerationResult] = []

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    async def generate(self, input_ids: Sequence[int], params: SamplingParams, *, adapter=None):
        result = await self.inner.generate(input_ids, params)
        await asyncio.sleep(self.delay_s * len(result.output_ids))
        self.num_sampled += len(result.output_ids)
        self.results.append(result)
        return result

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter=None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        result = await self.inner.generate(input_ids, params)
        finished = False
        try:
            for token, logprob, version in zip(
                result.output_ids, result.logprobs, result.weight_versions, strict=True
            ):
                await asyncio.sleep(self.delay_s)
                self.num_sampled += 1
                yield TokenChunk(output_ids=(token,), logprobs=(logprob,), weight_versions=(version,))
            finished = True
            self.results.append(result)
            yield result
        finally:
            if not finished:
                self.num_closed_early += 1

    async def update_weights(self, state_dict, version: int) -> None:
        await self.inner.update_weights(state_dict, version)


def _sampled_ids(record) -> list[int]:
    return np.concatenate(
        [np.asarray(s["token_ids"])[np.asarray(s["loss_mask"]) == 1] for s in record.segments]
    ).tolist()


def _chat(proxy, session_id: str):
    """Content and tool calls as an OpenAI client assembles them, and the tokens sampled at the first delta."""
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Look"}], tools=[BASH_TOOL_OPENAI], stream=True
    )
    content, arguments, first_seen, names = "", [], None, []
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None or not (delta.content or delta.tool_calls):
            continue
        first_seen = proxy.engine.num_sampled if first_seen is None else first_seen
        content += delta.content or ""
        for call in delta.tool_calls or ():
            names += [call.function.name] if call.function.name else []
            arguments += [call.function.arguments] if call.function.arguments else []
    return content, names, arguments, first_seen


def _responses(proxy, session_id: str):
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    tools = [{"type": "function", **BASH_TOOL_OPENAI["function"]}]
    content, arguments, first_seen, names = "", [], None, []
    with client.responses.stream(model="m", input="Look", tools=tools) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                content += event.delta
            elif event.type == "response.function_call_arguments.delta":
                arguments.append(event.delta)
            elif event.type == "response.output_item.added" and event.item.type == "function_call":
                names.append(event.item.name)
            else:
                continue
            first_seen = proxy.engine.num_sampled if first_seen is None else first_seen
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call"]
    return content, names, arguments, first_seen


def _messages(proxy, session_id: str):
    client = anthropic.Anthropic(base_url=proxy.session_url(session_id), api_key="unused")
    tool = {"name": "bash", "description": "Run.", "input_schema": BASH_TOOL_OPENAI["function"]["parameters"]}
    content, arguments, first_seen, names = "", [], None, []
    with client.messages.stream(
        model="claude-sonnet-4-5",
        max_tokens=256,
        messages=[{"role": "user", "content": "Look"}],
        tools=[tool],
    ) as stream:
        for event in stream:
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                names.append(event.content_block.name)
            elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                content += event.delta.text
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                arguments.append(event.delta.partial_json)
            else:
                continue
            first_seen = proxy.engine.num_sampled if first_seen is None else first_seen
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[1].input == {
        "cmd": "ls -la /workspace && cat README.md"
    }
    return content, names, arguments, first_seen


def _gemini(proxy, session_id: str):
    client = genai.Client(
        api_key="unused",
        http_options=types.HttpOptions(base_url=proxy.session_url(session_id), api_version="v1beta"),
    )
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(
                name="bash",
                description="Run.",
                parameters=types.Schema(
                    type="OBJECT", properties={"cmd": types.Schema(type="STRING")}, required=["cmd"]
                ),
            )
        ]
    )
    content, arguments, first_seen, names = "", [], None, []
    config = types.GenerateContentConfig(tools=[tool])
    for chunk in client.models.generate_content_stream(model="m", contents="Look", config=config):
        for part in chunk.candidates[0].content.parts or ():
            if part.function_call is not None:
                names.append(part.function_call.name)
                arguments.append(str(part.function_call.args))
            elif part.text:
                content += part.text
            else:
                continue
            first_seen = proxy.engine.num_sampled if first_seen is None else first_seen
    return content, names, arguments, first_seen


@pytest.mark.parametrize("protocol", [_chat, _responses, _messages, _gemini], ids=lambda f: f.__name__[1:])
def test_deltas_arrive_as_tokens_are_sampled(start_proxy, tokenizer, protocol):
    """The first delta reaches the SDK while most of the reply is still unsampled; the streamed text and call
    equal the non-streamed reply's; the record's sampled ids are the engine's."""
    engine = PacedEngine(ScriptedEngine(tokenizer, [REPLY, REPLY]), delay_s=0.01)
    assert isinstance(engine, StreamingEngine)
    proxy = start_proxy(engine)
    whole_session = proxy.open_session()
    whole = openai.OpenAI(base_url=proxy.session_url(whole_session) + "/v1", api_key="unused")
    answer = (
        whole.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Look"}], tools=[BASH_TOOL_OPENAI]
        )
        .choices[0]
        .message
    )
    session_id = proxy.open_session()
    engine.num_sampled = 0
    content, names, arguments, first_seen = protocol(proxy, session_id)
    num_tokens = len(engine.results[-1].output_ids)
    assert first_seen is not None and first_seen < num_tokens // 2, (first_seen, num_tokens)
    assert content == answer.content
    assert names == ["bash"]
    if protocol is _gemini:  # calls come whole (the Gemini API has no partial arguments)
        assert arguments == [str({"cmd": "ls -la /workspace && cat README.md"})]
    else:  # in pieces, as the tokens wrote them
        assert len(arguments) > 3 and "".join(arguments) == answer.tool_calls[0].function.arguments
    assert _sampled_ids(proxy.describe(session_id)) == list(engine.results[-1].output_ids)


def test_a_client_that_leaves_mid_stream_aborts_the_engine(start_proxy, tokenizer):
    engine = PacedEngine(ScriptedEngine(tokenizer, ["word " * 200]), delay_s=0.02)
    proxy = start_proxy(engine)
    session_id = proxy.open_session()
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Talk"}],
        "stream": True,
        "max_tokens": 200,
    }
    url = proxy.session_url(session_id) + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        for line in response.iter_lines():
            if '"content": "word' in line or '"content":"word' in line:
                break
    deadline = time.monotonic() + 10
    while engine.num_closed_early == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_closed_early == 1
    sampled = engine.num_sampled
    time.sleep(0.3)
    assert engine.num_sampled == sampled < 100  # nothing more is sampled for a client that is gone
    assert proxy.describe(session_id).num_turns == 0  # an abandoned turn is not recorded


@pytest.fixture(scope="module")
def embedded_engine(tiny_model_dir):
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(
            model_path=tiny_model_dir, settings=EmbeddedEngineBrickConfig(max_batch_size=4, kv_cache_gb=0)
        )
    )
    yield engine
    engine.close()


def test_embedded_engine_streams_each_decode_step(embedded_engine):
    """``generate_stream`` yields the tokens as the scheduler samples them, ending with what ``generate``
    returns for the same seed; closing it early abandons the request."""
    params = SamplingParams(max_tokens=24, seed=7)

    async def run():
        chunks, result = [], None
        async for item in embedded_engine.generate_stream([1, 2, 3, 4], params):
            if isinstance(item, GenerationResult):
                result = item
            else:
                chunks.append(item)
        whole = await embedded_engine.generate([1, 2, 3, 4], params)
        stream = embedded_engine.generate_stream([1, 2, 3, 4], SamplingParams(max_tokens=2000, seed=1))
        await anext(stream)
        await stream.aclose()
        steps = embedded_engine.stats()["num_decode_steps"]
        await asyncio.sleep(0.3)
        return chunks, result, whole, embedded_engine.stats(), steps

    chunks, result, whole, stats, steps = asyncio.run(run())
    assert len(chunks) > 1
    assert [t for c in chunks for t in c.output_ids] == list(result.output_ids)
    assert [lp for c in chunks for lp in c.logprobs] == list(result.logprobs)
    assert result == whole
    assert stats["num_running"] == 0 and stats["num_decode_steps"] <= steps + 1


def test_embedded_engine_through_the_proxy(start_proxy, embedded_engine, tokenizer):
    """A real model behind the proxy: content deltas arrive before the generation ends (counted by the tokens
    sampled so far), join to the reply recorded, and the record's ids are what the engine sampled."""
    seen: list[int] = []

    class Counting:
        """The embedded engine, counting the tokens its stream has handed out."""

        def __init__(self) -> None:
            self.num_sampled = 0
            self.result: GenerationResult | None = None

        context_window = embedded_engine.context_window
        weight_version = embedded_engine.weight_version

        async def generate(self, input_ids, params, *, adapter=None):
            return await embedded_engine.generate(input_ids, params)

        async def generate_stream(self, input_ids, params, *, adapter=None):
            async for item in embedded_engine.generate_stream(input_ids, params):
                if isinstance(item, TokenChunk):
                    self.num_sampled += len(item.output_ids)
                    await asyncio.sleep(0.005)  # a slower decode step than the tiny model's
                else:
                    self.result = item
                yield item

        async def update_weights(self, state_dict, version):
            raise NotImplementedError

    engine = Counting()
    proxy = start_proxy(engine)
    session_id = proxy.open_session()
    client = openai.OpenAI(base_url=proxy.session_url(session_id) + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hi"}], stream=True, max_tokens=48, seed=3
    )
    content = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen.append(engine.num_sampled)
            content += chunk.choices[0].delta.content
    assert engine.result is not None
    num_tokens = len(engine.result.output_ids)
    assert seen and seen[0] < num_tokens, (seen[:3], num_tokens)
    record = proxy.describe(session_id)
    assert _sampled_ids(record) == list(engine.result.output_ids)
    ids = list(engine.result.output_ids)
    text = tokenizer.decode(ids[:-1] if ids[-1] == tokenizer.eos_token_id else ids, skip_special_tokens=False)
    assert content == text.strip()


class TailHeldEngine(PacedEngine):
    """Streams only the first ``streamed`` tokens as chunks and leaves the rest to its ``GenerationResult`` (as a
    server whose last event carries the last tokens)."""

    streamed = 3

    async def generate_stream(self, input_ids, params, *, adapter=None):
        result = await self.inner.generate(input_ids, params)
        head = slice(0, self.streamed)
        yield TokenChunk(
            output_ids=result.output_ids[head],
            logprobs=result.logprobs[head],
            weight_versions=result.weight_versions[head],
        )
        self.results.append(result)
        yield result


@pytest.mark.parametrize("streamed", [0, 3])
def test_tokens_left_to_the_result_still_reach_the_client(start_proxy, tokenizer, streamed):
    """Tokens an engine hands over only with its ``GenerationResult`` are streamed too: the client gets the same
    text and call as from a non-streamed turn (without them it got no tool call and echoed a history the
    session never sampled)."""
    engine = TailHeldEngine(ScriptedEngine(tokenizer, [REPLY, REPLY]), delay_s=0.0)
    engine.streamed = streamed
    proxy = start_proxy(engine)
    content, names, arguments, _ = _chat(proxy, proxy.open_session())
    assert content == "Let me look at the files."
    assert names == ["bash"] and json.loads("".join(arguments)) == {
        "cmd": "ls -la /workspace && cat README.md"
    }
