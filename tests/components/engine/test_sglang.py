"""SGLangEngine over real HTTP against a protocol-faithful fake SGLang server (SGLang itself needs a GPU)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import numpy as np
import pytest
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.sglang import SGLangEngine, SGLangEngineConfig, serialize_named_tensors
from components.errors import ContextOverflowError, EngineError, MissingLogprobsError
from components.protocols import (
    FinishReason,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    StreamingEngine,
    TokenChunk,
)
from tests.components.engine.fake_sglang import FakeSGLangServer, ScriptedSGLangEngine

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def fake_server(tiny_model_dir):
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=2048, eos_token_ids=())
    )
    with FakeSGLangServer(engine, tiny_model_dir) as server:
        yield server
    engine.close()


@pytest.fixture
async def client(fake_server, tmp_path):
    state = fake_server.state
    state.requests.clear()
    state.drop_logprobs, state.null_logprob_at, state.fail_next, state.send_version_spans = (
        False,
        None,
        0,
        True,
    )
    config = replace(
        SGLangEngineConfig.for_url(fake_server.url),
        weight_sync_dir=tmp_path / "weights",
        base_model_path=fake_server.state.model_path,
        retry_backoff_s=0.01,
    )
    engine = await SGLangEngine.connect(config)
    yield engine
    await engine.aclose()


def generate_bodies(fake_server) -> list[dict]:
    return [json.loads(body) for path, body in fake_server.state.requests if path == "/generate"]


async def test_connect_reads_context_window_and_version(client):
    assert isinstance(client, InferenceEngine)
    assert client.context_window == 2048
    assert client.weight_version in (0, 3)  # 3 once the weight-sync test has run
    assert await client.health()


async def test_generate_request_shape_and_parsed_reply(client, fake_server):
    params = SamplingParams(
        max_tokens=12, temperature=0.8, seed=4, stop_token_ids=(17,), stop_strings=("\n\n",)
    )
    result = await client.generate([5, 6, 7, 8], params)
    (body,) = generate_bodies(fake_server)
    assert body["input_ids"] == [5, 6, 7, 8]
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1 and body["stream"] is False
    assert (
        body["sampling_params"]
        == {
            "max_new_tokens": 12,
            "temperature": 0.8,
            "top_p": 1.0,  # SGLang's logprobs ignore truncation: the client refuses top_p < 1 (test_sglang_sampling)
            "top_k": -1,
            "stop": ["\n\n"],
            "stop_token_ids": [17],
            "sampling_seed": 4,
        }
    )
    assert isinstance(body["rid"], str) and len(body["rid"]) >= 16
    assert "return_routed_experts" not in body
    assert 1 <= len(result.output_ids) <= 12
    assert len(result.logprobs) == len(result.output_ids) and all(lp <= 0 for lp in result.logprobs)
    assert result.num_prompt_tokens == 4
    # The fake samples with the embedded engine: the same seed there gives the same tokens and logprobs.
    direct = await fake_server.state.engine.generate([5, 6, 7, 8], params)
    assert result.output_ids == direct.output_ids
    np.testing.assert_allclose(result.logprobs, direct.logprobs, atol=1e-6)
    assert result.finish_reason is direct.finish_reason


async def test_max_new_tokens_clamped_and_overflow_refused_client_side(client, fake_server):
    result = await client.generate(list(range(10, 2050)), SamplingParams(max_tokens=100, seed=1))
    assert generate_bodies(fake_server)[-1]["sampling_params"]["max_new_tokens"] == 8
    assert len(result.output_ids) == 8 and result.finish_reason is FinishReason.LENGTH
    fake_server.state.requests.clear()
    with pytest.raises(ContextOverflowError):
        await client.generate([3] * 2048, SamplingParams(max_tokens=4))
    assert generate_bodies(fake_server) == [], "an overflowing prompt must not reach the server"


async def test_server_side_length_refusal_is_a_context_overflow(fake_server):
    # A client configured with a larger window than the server's: the server's 400 becomes the typed error.
    engine = SGLangEngine(SGLangEngineConfig.for_url(fake_server.url, context_window=10_000))
    with pytest.raises(ContextOverflowError):
        await engine.generate([3] * 3000, SamplingParams(max_tokens=4))
    await engine.aclose()


async def test_missing_logprobs_is_an_error_naming_the_cause(client, fake_server):
    fake_server.state.drop_logprobs = True
    with pytest.raises(MissingLogprobsError, match="output_token_logprobs"):
        await client.generate([1, 2, 3], SamplingParams(max_tokens=5, seed=0))
    fake_server.state.drop_logprobs = False
    fake_server.state.null_logprob_at = 2
    with pytest.raises(MissingLogprobsError, match="null logprob for output token 2"):
        await client.generate([1, 2, 3], SamplingParams(max_tokens=5, seed=0))


async def test_transient_503_is_retried_then_gives_up(client, fake_server):
    fake_server.state.fail_next = 2
    result = await client.generate([1, 2, 3], SamplingParams(max_tokens=3, seed=0))
    assert len(result.output_ids) == 3
    assert len(generate_bodies(fake_server)) == 3  # two refused attempts + the one that worked
    fake_server.state.fail_next = 10
    with pytest.raises(EngineError, match="503"):
        await client.generate([1, 2, 3], SamplingParams(max_tokens=3, seed=0))
    fake_server.state.fail_next = 0


async def test_unreachable_server_is_an_engine_error():
    engine = SGLangEngine(
        replace(
            SGLangEngineConfig.for_url("http://127.0.0.1:9", context_window=100),
            max_retries=1,
            retry_backoff_s=0.01,
        )
    )
    with pytest.raises(EngineError, match="failed"):
        await engine.generate([1, 2], SamplingParams(max_tokens=2))
    assert not await engine.health()
    await engine.aclose()


async def test_weight_sync_from_disk_pauses_updates_and_continues(client, fake_server, tiny_model_v1_dir):
    new_state = load_file(str(tiny_model_v1_dir / "model.safetensors"))
    await client.update_weights(new_state, version=3)
    paths = [path for path, _ in fake_server.state.requests]
    assert paths[-3:] == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    pause_body = json.loads(fake_server.state.requests[-3][1])
    update_body = json.loads(fake_server.state.requests[-2][1])
    assert pause_body == {"mode": "retract"}
    assert update_body["weight_version"] == "3" and update_body["flush_cache"] is True
    assert update_body["abort_all_requests"] is False
    assert (client.config.weight_sync_dir / "v3" / "model.safetensors").exists()
    assert (client.config.weight_sync_dir / "v3" / "config.json").exists()
    assert client.weight_version == 3

    result = await client.generate([9, 10, 11], SamplingParams(max_tokens=6, seed=2))
    assert result.weight_versions == (3,) * 6
    scored = await fake_server.state.engine.logprobs_of([9, 10, 11, *result.output_ids], start=3)
    np.testing.assert_allclose(result.logprobs, scored, atol=1e-4)


async def test_refused_update_is_an_error_and_generation_continues(client, fake_server, tmp_path):
    with pytest.raises(EngineError, match="refused the update"):
        await client.update_weights_from_disk(tmp_path / "nowhere", version=9)
    assert [p for p, _ in fake_server.state.requests][-1] == "/continue_generation"
    assert client.weight_version != 9
    result = await client.generate([1, 2], SamplingParams(max_tokens=2, seed=0))
    assert len(result.output_ids) == 2


async def test_update_weights_without_a_sync_dir_is_refused(fake_server):
    engine = await SGLangEngine.connect(SGLangEngineConfig.for_url(fake_server.url))
    with pytest.raises(ValueError, match="weight_sync_dir"):
        await engine.update_weights({}, version=1)
    await engine.aclose()


async def test_update_weights_from_tensor_payload(client, fake_server):
    current = {k: v.clone() for k, v in fake_server.state.engine.model.state_dict().items()}
    payload = serialize_named_tensors(list(current.items()))
    await client.update_weights_from_tensor([payload], version=4)
    body = json.loads(fake_server.state.requests[-2][1])
    assert body["weight_version"] == "4" and body["serialized_named_tensors"] == [payload]
    assert client.weight_version == 4
    result = await client.generate([1, 2, 3], SamplingParams(max_tokens=3, seed=0))
    assert result.weight_versions == (4,) * 3
    await client.update_weight_version(3)  # restore the version other tests expect


async def test_versions_without_spans_stamp_every_token(client, fake_server):
    fake_server.state.send_version_spans = False
    result = await client.generate([4, 5], SamplingParams(max_tokens=4, seed=0))
    assert len(set(result.weight_versions)) == 1 and len(result.weight_versions) == 4


def test_reply_parsing_of_version_spans_finish_reasons_and_routed_experts():
    engine = SGLangEngine(
        replace(SGLangEngineConfig.for_url("http://unused:1", context_window=64), routed_experts_top_k=2)
    )
    routing = np.arange(4 * 3 * 2, dtype="<i4")  # 4 positions (3 prompt + 2 output - 1), 3 layers, top-2
    import base64

    reply = {
        "output_ids": [11, 12],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 12},
            "prompt_tokens": 3,
            "weight_version": "8",
            "weight_versions": [
                {"version": "7", "start": 0, "end": 1},
                {"version": "8", "start": 1, "end": 2},
            ],
            "output_token_logprobs": [[-0.5, 11, None], [-1.25, 12, "x"]],
            "routed_experts": base64.b64encode(routing.tobytes()).decode(),
        },
    }
    result = engine.parse_generate_reply(reply, [1, 2, 3], SamplingParams(return_routed_experts=True))
    assert result.weight_versions == (7, 8)
    assert result.logprobs == (-0.5, -1.25)
    assert result.finish_reason is FinishReason.STOP
    assert result.routed_experts is not None and len(result.routed_experts) == 4
    assert result.routed_experts[1] == ((6, 7), (8, 9), (10, 11))
    for kind, expected in [("length", FinishReason.LENGTH), ("abort", FinishReason.ABORT)]:
        reply["meta_info"]["finish_reason"] = {"type": kind}
        assert engine.parse_generate_reply(reply, [1, 2, 3], SamplingParams()).finish_reason is expected
    reply["meta_info"]["output_token_logprobs"][1][1] = 99
    with pytest.raises(EngineError, match="is for id 99"):
        engine.parse_generate_reply(reply, [1, 2, 3], SamplingParams())


async def test_routed_experts_requested_and_decoded(tiny_moe_model_dir):
    moe_engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_moe_model_dir, eos_token_ids=()))
    with FakeSGLangServer(moe_engine, tiny_moe_model_dir) as server:
        config = replace(SGLangEngineConfig.for_url(server.url), routed_experts_top_k=2)
        client = await SGLangEngine.connect(config)
        params = SamplingParams(max_tokens=5, seed=1, return_routed_experts=True)
        result = await client.generate([3, 4, 5, 6], params)
        body = json.loads(server.state.requests[-1][1])
        assert body["return_routed_experts"] is True
        direct = await moe_engine.generate([3, 4, 5, 6], params)
        await client.aclose()
    moe_engine.close()
    assert result.routed_experts == direct.routed_experts
    assert len(result.routed_experts) == 4 + 5 - 1


async def test_cancelled_generate_aborts_on_the_server(client, fake_server):
    task = asyncio.create_task(client.generate([1, 2, 3], SamplingParams(max_tokens=1500, seed=0)))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if "/abort_request" in [p for p, _ in fake_server.state.requests]:
            break
        await asyncio.sleep(0.02)
    abort_body = json.loads(next(b for p, b in fake_server.state.requests if p == "/abort_request"))
    assert abort_body["rid"] == generate_bodies(fake_server)[-1]["rid"]
    result = await client.generate([1, 2], SamplingParams(max_tokens=2, seed=0))
    assert len(result.output_ids) == 2


async def test_sglang_server_is_a_distillation_teacher(client, fake_server):
    """Teacher-forced scoring over SGLang's prefill-only request (``max_new_tokens`` 0, input logprobs from
    position 0): the logprobs are the served model's own, and ``score_trajectory`` records them per token."""
    from components.training.distillation import TeacherScorer, score_trajectory
    from tests.components.training.training_synthetic import make_segment, make_trajectory

    assert isinstance(client, TeacherScorer)
    ids = [5, 17, 230, 9, 44, 1001]
    expected = await fake_server.state.engine.logprobs_of(ids, 2)
    assert await client.logprobs_of(ids, 2) == pytest.approx(expected, abs=1e-6)
    (body,) = [b for b in generate_bodies(fake_server) if b.get("logprob_start_len") == 0]
    assert body["sampling_params"]["max_new_tokens"] == 0 and body["return_logprob"] is True
    trajectory = make_trajectory("t", "g", 1.0, (make_segment(3, 4, seed=1, vocab=1000),))
    (segment,) = (await score_trajectory(client, trajectory)).segments
    own = await fake_server.state.engine.logprobs_of(segment.token_ids.tolist(), 1)
    np.testing.assert_allclose(
        segment.teacher_logprobs[1:], np.where(segment.loss_mask[1:] == 1, own, 0.0), atol=1e-6
    )
    fake_server.state.drop_logprobs = True  # a server that leaves the scores out is an error, never zeros
    with pytest.raises(MissingLogprobsError, match="input logprob"):
        await client.logprobs_of(ids, 1)


async def test_sglang_teacher_connects_only_with_the_policys_tokenizer(fake_server, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from components.training.server_teachers import connect_server_teacher, server_kind

    fake_server.state.drop_logprobs = False
    assert server_kind(f"sglang:{fake_server.url}") == "sglang" and server_kind(str(tiny_model_dir)) is None
    assert server_kind("vllm:not-a-url") is None  # a folder name that happens to contain a colon
    teacher = await connect_server_teacher(f"sglang:{fake_server.url}", policy_model=tiny_model_dir)
    assert len(await teacher.logprobs_of([5, 6, 7], 1)) == 2
    await teacher.aclose()
    other = AutoTokenizer.from_pretrained(tiny_model_dir)
    other.add_tokens(["The quick"])
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="distillation.teachers: .* tokenizes differently"):
        await connect_server_teacher(f"sglang:{fake_server.url}", policy_model=tmp_path / "other")
    fake_server.state.model_path = "/nowhere/model"  # a server whose tokenizer this machine cannot read
    try:
        with pytest.raises(ValueError, match="cannot check the tokenizer of the SGLang teacher"):
            await connect_server_teacher(f"sglang:{fake_server.url}", policy_model=tiny_model_dir)
    finally:
        fake_server.state.model_path = str(tiny_model_dir)


async def raw_stream_events(url: str, body: dict) -> list[dict]:
    """The SSE events of one streamed /generate, as a plain HTTP client reads them."""
    events = []
    async with (
        httpx.AsyncClient(base_url=url) as http,
        http.stream("POST", "/generate", json=body) as response,
    ):
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


@pytest.mark.parametrize("incremental", [False, True])
async def test_stream_chunks_as_sampled_then_the_result_generate_returns(client, fake_server, incremental):
    """SGLang's stream, cumulative (default) or with --incremental-streaming-output: the client yields each
    step's new tokens once, then the same GenerationResult as generate."""
    fake_server.state.incremental_streaming_output = incremental
    try:
        params = SamplingParams(max_tokens=10, temperature=0.9, seed=7)
        body = {"input_ids": [4, 5, 6], "return_logprob": True, "stream": True, "sampling_params": {
            "max_new_tokens": 10, "temperature": 0.9, "sampling_seed": 7}}  # fmt: skip
        events = await raw_stream_events(fake_server.url, body)
        sizes = [len(event["output_ids"]) for event in events]
        totals = [event["meta_info"]["completion_tokens"] for event in events]
        assert len(events) > 1 and totals[-1] == 10
        assert [e["meta_info"]["finish_reason"] is None for e in events] == [True] * (len(events) - 1) + [
            False
        ]
        assert (sum(sizes) if incremental else sizes[-1]) == 10
        assert sizes == (
            [b - a for a, b in zip([0, *totals], totals, strict=False)] if incremental else totals
        )

        assert isinstance(client, StreamingEngine)
        fake_server.state.requests.clear()
        items = [item async for item in client.generate_stream([4, 5, 6], params)]
        chunks, streamed = items[:-1], items[-1]
        assert generate_bodies(fake_server)[-1]["stream"] is True
        assert len(chunks) > 1 and all(isinstance(chunk, TokenChunk) for chunk in chunks)
        assert isinstance(streamed, GenerationResult) and len(streamed.output_ids) == 10
        assert [t for c in chunks for t in c.output_ids] == list(streamed.output_ids)
        assert [lp for c in chunks for lp in c.logprobs] == list(streamed.logprobs)
        assert [v for c in chunks for v in c.weight_versions] == list(streamed.weight_versions)
        whole = await client.generate([4, 5, 6], params)
        assert streamed.output_ids == whole.output_ids and streamed.weight_versions == whole.weight_versions
        assert streamed.finish_reason is whole.finish_reason is FinishReason.LENGTH
        np.testing.assert_allclose(streamed.logprobs, whole.logprobs, atol=1e-4)
    finally:
        fake_server.state.incremental_streaming_output = False


async def test_stream_refusals_are_generates_errors(client, fake_server):
    fake_server.state.requests.clear()
    with pytest.raises(ContextOverflowError):  # before any request
        await anext(client.generate_stream([3] * 2048, SamplingParams(max_tokens=4)))
    assert generate_bodies(fake_server) == []
    # the server's own limit: SGLang's stream reports it as an error event (HTTP 200)
    events = await raw_stream_events(fake_server.url, {"input_ids": [3] * 3000, "stream": True})
    assert "context length" in events[0]["error"]["message"]
    wide = SGLangEngine(SGLangEngineConfig.for_url(fake_server.url, context_window=10_000))
    with pytest.raises(ContextOverflowError):
        await anext(wide.generate_stream([3] * 3000, SamplingParams(max_tokens=4)))
    await wide.aclose()
    fake_server.state.null_logprob_at = 1
    with pytest.raises(MissingLogprobsError, match="null logprob"):
        _ = [item async for item in client.generate_stream([1, 2, 3], SamplingParams(max_tokens=5, seed=0))]
    fake_server.state.null_logprob_at = None
    fake_server.state.fail_next = 1
    with pytest.raises(EngineError, match="503"):
        await anext(client.generate_stream([1, 2, 3], SamplingParams(max_tokens=3, seed=0)))


async def test_closing_a_stream_aborts_the_request_on_the_server(client, fake_server):
    state = fake_server.state
    state.aborted.clear()
    # SGLang itself aborts a stream's rid once the client is gone (create_abort_task), no /abort_request needed
    state.stream_abort_delay_s = 0.1
    try:
        body = {"rid": "left-early", "input_ids": [1, 2, 3], "stream": True, "sampling_params": {
            "max_new_tokens": 1500, "temperature": 1.0}}  # fmt: skip
        async with httpx.AsyncClient(base_url=fake_server.url) as http:
            async with http.stream("POST", "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        break
        for _ in range(200):
            if "left-early" in state.aborted:
                break
            await asyncio.sleep(0.02)
        assert state.aborted == ["left-early"] and "left-early" not in state.tasks
    finally:
        state.stream_abort_delay_s = 2.0
    # the client's own close: the connection goes and /abort_request frees the slot at once
    stream = client.generate_stream([1, 2, 3], SamplingParams(max_tokens=1500, seed=0))
    assert isinstance(await anext(stream), TokenChunk)
    await stream.aclose()
    rid = generate_bodies(fake_server)[-1]["rid"]
    for _ in range(100):
        if rid in state.aborted:
            break
        await asyncio.sleep(0.02)
    assert rid in state.aborted and not state.tasks
    result = await client.generate([1, 2], SamplingParams(max_tokens=2, seed=0))
    assert len(result.output_ids) == 2


async def test_tokens_of_the_last_event_are_a_chunk_too(tokenizer, tiny_model_dir):
    """SGLang's last event (the one with the ``finish_reason``) carries the finishing step's tokens; here all of
    them (a reply decoded in one step): they are yielded as a chunk before the result, so a live stream shows
    every token (they were left out, and the proxy's client never saw the reply's last tokens)."""
    engine = ScriptedSGLangEngine(tokenizer, lambda prompt: "hello there, a reply", context_window=4096)
    with FakeSGLangServer(engine, tiny_model_dir) as server:
        client = await SGLangEngine.connect(SGLangEngineConfig.for_url(server.url))
        try:
            items = [item async for item in client.generate_stream([1, 2, 3], SamplingParams(max_tokens=50))]
        finally:
            await client.aclose()
    chunks, result = items[:-1], items[-1]
    assert isinstance(result, GenerationResult) and result.output_ids
    assert chunks and all(isinstance(chunk, TokenChunk) for chunk in chunks)
    assert [t for c in chunks for t in c.output_ids] == list(result.output_ids)
