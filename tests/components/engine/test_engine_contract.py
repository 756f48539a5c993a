"""The InferenceEngine contract, checked on every implementation: embedded, Ray actor client, SGLang client."""

from __future__ import annotations

import asyncio
import math

import pytest
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.ray_actor import RayEngineClient, start_engine_actor
from components.engine.sglang import SGLangEngine, SGLangEngineConfig
from components.errors import ContextOverflowError
from components.protocols import FinishReason, InferenceEngine, SamplingParams
from tests.components.engine.fake_sglang import FakeSGLangServer

pytestmark = pytest.mark.timeout(240)

WINDOW = 256


def contract_config(model_dir) -> EmbeddedEngineConfig:
    return EmbeddedEngineConfig(model_path=model_dir, num_threads=1, context_window=WINDOW, eos_token_ids=())


@pytest.fixture(params=["embedded", "ray", "sglang"])
async def engine(request, tiny_model_dir, tmp_path):
    kind = request.param
    if kind == "embedded":
        embedded = EmbeddedEngine(contract_config(tiny_model_dir))
        yield embedded
        await embedded.aclose()
    elif kind == "ray":
        ray = request.getfixturevalue("ray_session")
        handle = start_engine_actor(contract_config(tiny_model_dir), num_cpus=0.5)
        yield await RayEngineClient.connect(handle)
        ray.kill(handle)
    else:
        backend = EmbeddedEngine(contract_config(tiny_model_dir))
        with FakeSGLangServer(backend, tiny_model_dir) as server:
            config = SGLangEngineConfig(
                base_url=server.url, weight_sync_dir=tmp_path / "sync", base_model_path=tiny_model_dir
            )
            client = await SGLangEngine.connect(config)
            yield client
            await client.aclose()
        await backend.aclose()


async def test_contract(engine, tiny_model_v1_dir):
    assert isinstance(engine, InferenceEngine)
    assert engine.context_window == WINDOW
    version = engine.weight_version

    prompts = [[11 + i, 12, 13 + i, 14] for i in range(4)]
    results = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_tokens=10, seed=i)) for i, p in enumerate(prompts))
    )
    for result in results:
        assert len(result.output_ids) == len(result.logprobs) == len(result.weight_versions) == 10
        assert result.finish_reason is FinishReason.LENGTH
        assert all(math.isfinite(lp) and lp <= 0 for lp in result.logprobs)
        assert result.weight_versions == (version,) * 10
        assert result.num_prompt_tokens == 4
    again = await engine.generate(prompts[1], SamplingParams(max_tokens=10, seed=1))
    assert again.output_ids == results[1].output_ids, "same seed and prompt must give the same completion"

    with pytest.raises(ContextOverflowError):
        await engine.generate([5] * WINDOW, SamplingParams(max_tokens=1))
    clamped = await engine.generate([5] * (WINDOW - 3), SamplingParams(max_tokens=50, seed=0))
    assert len(clamped.output_ids) == 3 and clamped.finish_reason is FinishReason.LENGTH

    await engine.update_weights(load_file(str(tiny_model_v1_dir / "model.safetensors")), version=version + 1)
    assert engine.weight_version == version + 1
    after = await engine.generate(prompts[1], SamplingParams(max_tokens=10, seed=1))
    assert after.weight_versions == (version + 1,) * 10
    assert after.logprobs != again.logprobs, "new weights must change the distribution"
