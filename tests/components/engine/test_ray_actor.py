"""RayEngineClient through a real Ray actor: batching across calls, weight sync via the object store, errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngineConfig
from components.engine.providers import EmbeddedEngineBrickConfig
from components.engine.ray_actor import RayEngineClient, start_engine_actor
from components.errors import ContextOverflowError
from components.protocols import (
    FinishReason,
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    StreamingEngine,
    TokenChunk,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(scope="module")
def engine_actor(ray_session, tiny_model_dir):
    settings = EmbeddedEngineBrickConfig(num_cpus=0.5)
    config = EmbeddedEngineConfig(
        model_path=tiny_model_dir, settings=settings, context_window=4096, eos_token_ids=()
    )
    handle = start_engine_actor(config)
    yield handle
    ray_session.kill(handle)


async def test_client_is_an_inference_engine_and_batches_concurrent_calls(engine_actor):
    client = await RayEngineClient.connect(engine_actor)
    assert isinstance(client, InferenceEngine)
    assert client.context_window == 4096
    prompts = [[100 + i * 3 + j for j in range(4 + 2 * i)] for i in range(8)]
    results = await asyncio.gather(
        *(client.generate(p, SamplingParams(max_tokens=40, seed=i)) for i, p in enumerate(prompts))
    )
    info = await client.refresh()
    assert info["peak_batch_size"] >= 4, "concurrent calls through the actor were not batched"
    for result in results:
        assert len(result.output_ids) == 40 and result.finish_reason is FinishReason.LENGTH
        assert len(result.logprobs) == 40 and all(lp <= 0 for lp in result.logprobs)
    again = await client.generate(prompts[2], SamplingParams(max_tokens=40, seed=2))
    assert again.output_ids == results[2].output_ids


async def test_tokens_stream_through_the_actor_and_closing_aborts(engine_actor):
    """``generate_stream`` through a Ray streaming generator: chunks in sampling order, then the result that
    ``generate`` gives for the seed; refused requests raise their typed error; an early close cancels the
    actor's task, whose request stops decoding."""
    client = await RayEngineClient.connect(engine_actor)
    assert isinstance(client, StreamingEngine)
    params = SamplingParams(max_tokens=30, seed=4)
    items = [item async for item in client.generate_stream([3, 4, 5, 6], params)]
    *chunks, result = items
    assert chunks and all(isinstance(chunk, TokenChunk) for chunk in chunks)
    assert isinstance(result, GenerationResult)
    assert [t for chunk in chunks for t in chunk.output_ids] == list(result.output_ids)
    whole = await client.generate([3, 4, 5, 6], params)  # (its prefix may come from the prefix cache)
    assert whole.output_ids == result.output_ids and whole.weight_versions == result.weight_versions
    assert whole.logprobs == pytest.approx(result.logprobs, abs=1e-5)
    with pytest.raises(ContextOverflowError):
        await anext(client.generate_stream([5] * 4096, SamplingParams(max_tokens=4)))
    stream = client.generate_stream([3, 4, 5, 6], SamplingParams(max_tokens=3000, seed=1))
    await anext(stream)
    await stream.aclose()
    for _ in range(100):  # the cancelled request leaves the batch
        info = await client.refresh()
        if info["num_running"] == 0 and info["num_waiting"] == 0:
            break
        await asyncio.sleep(0.1)
    steps = (await client.refresh())["num_decode_steps"]
    await asyncio.sleep(0.5)
    assert (await client.refresh())["num_decode_steps"] == steps, "the aborted request is still decoded"


async def test_typed_errors_cross_the_actor_boundary(engine_actor):
    client = await RayEngineClient.connect(engine_actor)
    with pytest.raises(ContextOverflowError):
        await client.generate([5] * 4096, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="input_ids"):
        await client.generate([], SamplingParams())


async def test_weight_sync_through_the_object_store(engine_actor, tiny_model_v1_dir):
    trainer_side = await RayEngineClient.connect(engine_actor)
    proxy_side = await asyncio.to_thread(RayEngineClient, engine_actor)  # e.g. built inside a Serve replica
    assert proxy_side.context_window == 4096
    prompt = [7, 8, 9, 10, 11]
    new_state = load_file(str(tiny_model_v1_dir / "model.safetensors"))
    await trainer_side.update_weights(new_state, version=3)
    assert trainer_side.weight_version == 3
    result = await proxy_side.generate(prompt, SamplingParams(max_tokens=12, seed=0))
    assert result.weight_versions == (3,) * 12
    assert proxy_side.weight_version == 3
    scored = await proxy_side.logprobs_of(prompt + list(result.output_ids), start=len(prompt))
    np.testing.assert_allclose(scored, result.logprobs, atol=1e-4)
