"""The ``InferenceEngine`` contract (``components.protocols.InferenceEngine``), checked on any engine brick — what
the proxy, the rollout runner and the weight sync rely on:

- ``generate`` returns the sampled ids with one logprob (finite, ≤ 0) and one weight version each, at most
  ``max_tokens`` of them, ``finish_reason`` ``length`` exactly when the budget ran out; many calls may be in flight
  at once; the same prompt and seed give the same completion;
- bad input is a typed error and generates nothing: an empty prompt or an id outside any vocabulary is a
  ``ValueError`` (or the engine's ``ReinError``), a prompt at or over ``context_window`` a ``ContextOverflowError``;
  a prompt that leaves room for fewer than ``max_tokens`` tokens is clamped to the room left;
- ``update_weights(state_dict, version)`` advances ``weight_version``; every later token carries the new version
  and comes from the new weights (the suite passes the tiny model's next-version weights).

Built-in: the embedded engine, its Ray actor client, and the SGLang client against the local fake SGLang server.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from components.errors import ContextOverflowError, ReinError
from components.protocols import FinishReason, InferenceEngine, SamplingParams
from tests.contracts.conftest import BuiltIn, brick_params, opened_brick

pytestmark = pytest.mark.timeout(240)

BUILT_IN_WINDOW = 256
PROMPTS = [[11 + i, 12, 13 + i, 14] for i in range(4)]


def _embedded_config(request: pytest.FixtureRequest):
    from components.engine.embedded import EmbeddedEngineConfig

    return EmbeddedEngineConfig(
        model_path=request.getfixturevalue("tiny_model_dir"),
        context_window=BUILT_IN_WINDOW,
        eos_token_ids=(),  # no early stop: every completion runs to its budget
    )


@contextlib.asynccontextmanager
async def _embedded(request):
    from components.engine.embedded import EmbeddedEngine

    engine = EmbeddedEngine(_embedded_config(request))
    yield engine
    await engine.aclose()


@contextlib.asynccontextmanager
async def _ray_client(request):
    from components.engine.providers import EmbeddedEngineBrickConfig
    from components.engine.ray_actor import RayEngineClient, start_engine_actor

    ray = request.getfixturevalue("ray_session")
    config = replace(_embedded_config(request), settings=EmbeddedEngineBrickConfig(num_cpus=0.5))
    handle = start_engine_actor(config)
    yield await RayEngineClient.connect(handle)
    ray.kill(handle)


@contextlib.asynccontextmanager
async def _sglang_on_fake(request):
    from components.engine.embedded import EmbeddedEngine
    from components.engine.sglang import SGLangEngine, SGLangEngineConfig
    from tests.components.engine.fake_sglang import FakeSGLangServer

    model_dir = request.getfixturevalue("tiny_model_dir")
    sync_dir = request.getfixturevalue("tmp_path_factory").mktemp("sglang-sync")
    backend = EmbeddedEngine(_embedded_config(request))
    with FakeSGLangServer(backend, model_dir) as server:
        config = replace(
            SGLangEngineConfig.for_url(server.url), weight_sync_dir=sync_dir, base_model_path=model_dir
        )
        client = await SGLangEngine.connect(config)
        yield client
        await client.aclose()
    await backend.aclose()


BUILT_INS = {
    "embedded": lambda: BuiltIn(_embedded),
    "ray": lambda: BuiltIn(_ray_client),
    "sglang-fake": lambda: BuiltIn(_sglang_on_fake),
}


def pytest_generate_tests(metafunc):
    if "make_engine" in metafunc.fixturenames:
        metafunc.parametrize("make_engine", brick_params(metafunc.config, BUILT_INS), scope="module")


@pytest.fixture(scope="module")
async def engine(make_engine, request) -> AsyncIterator[InferenceEngine]:
    """One engine per brick, shared by the module's tests (each reads the version it starts from)."""
    async with opened_brick(make_engine, request) as engine:
        assert isinstance(engine, InferenceEngine), f"{engine!r} does not implement InferenceEngine"
        yield engine


@pytest.fixture(scope="module")
def next_weights(tmp_path_factory, default_model_dir):
    """A state dict for ``update_weights``: the tiny model's architecture, other random weights."""
    from components.models.tiny import build_tiny_model

    folder = build_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny-next", tokenizer_dir=default_model_dir, seed=1
    )
    return load_file(str(folder / "model.safetensors"))


def check_result(result, *, max_tokens: int, num_prompt_tokens: int, version: int) -> None:
    n = len(result.output_ids)
    assert 0 < n <= max_tokens
    assert len(result.logprobs) == len(result.weight_versions) == n
    assert all(math.isfinite(lp) and lp <= 0 for lp in result.logprobs), result.logprobs
    assert result.weight_versions == (version,) * n
    assert result.num_prompt_tokens == num_prompt_tokens
    assert result.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    if result.finish_reason is FinishReason.LENGTH:
        assert n == max_tokens, f"finish_reason length after {n} of {max_tokens} tokens"
    else:
        assert n <= max_tokens  # a stop token may also fall on the last one


async def test_context_window_and_version_are_ints(engine):
    assert isinstance(engine.context_window, int) and engine.context_window > len(PROMPTS[0]) + 10
    assert isinstance(engine.weight_version, int)


async def test_concurrent_generates_return_aligned_tokens_logprobs_versions(engine):
    version = engine.weight_version
    results = await asyncio.gather(
        *(engine.generate(p, SamplingParams(max_tokens=10, seed=i)) for i, p in enumerate(PROMPTS))
    )
    for result in results:
        check_result(result, max_tokens=10, num_prompt_tokens=4, version=version)


async def test_same_prompt_and_seed_give_the_same_completion(engine):
    first = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=10, seed=7))
    again = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=10, seed=7))
    assert again.output_ids == first.output_ids
    assert again.logprobs == pytest.approx(first.logprobs, abs=1e-4)


async def test_adapter_none_is_the_engines_own_policy(engine):
    """``generate(..., adapter=None)``: the keyword every engine takes, naming no LoRA policy."""
    first = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=10, seed=7))
    own = await engine.generate(PROMPTS[1], SamplingParams(max_tokens=10, seed=7), adapter=None)
    assert own.output_ids == first.output_ids


@pytest.mark.parametrize(
    "bad_prompt", [[], [10**9], [-1]], ids=["empty", "id-past-any-vocabulary", "negative-id"]
)
async def test_bad_prompt_is_a_typed_error(engine, bad_prompt):
    with pytest.raises((ValueError, ReinError)):
        await asyncio.wait_for(engine.generate(bad_prompt, SamplingParams(max_tokens=4)), 60)


async def test_prompt_at_the_window_overflows_and_a_long_one_is_clamped(engine):
    window = engine.context_window
    with pytest.raises(ContextOverflowError):
        await engine.generate([5] * window, SamplingParams(max_tokens=1))
    clamped = await engine.generate([5] * (window - 3), SamplingParams(max_tokens=50, seed=0))
    check_result(clamped, max_tokens=3, num_prompt_tokens=window - 3, version=engine.weight_version)


async def test_update_weights_advances_the_version_and_changes_the_policy(engine, next_weights):
    version = engine.weight_version
    params = SamplingParams(max_tokens=10, seed=1)
    before = await engine.generate(PROMPTS[2], params)
    await engine.update_weights(next_weights, version=version + 1)
    assert engine.weight_version == version + 1
    after = await engine.generate(PROMPTS[2], params)
    check_result(after, max_tokens=10, num_prompt_tokens=4, version=version + 1)
    assert after.logprobs != before.logprobs, "new weights must change the distribution"


async def test_the_contract_catches_an_engine_that_keeps_stamping_the_old_version(next_weights):
    """The suite can fail: an engine whose tokens still carry the old version after an update is caught."""
    from examples.bricks.hashing_engine import HashingEngine

    class StaleVersionEngine(HashingEngine):
        async def update_weights(self, state_dict, version):
            await super().update_weights(state_dict, version)
            self.version = version - 1  # forgets to stamp the new version

    with pytest.raises(AssertionError):
        await test_update_weights_advances_the_version_and_changes_the_policy(
            StaleVersionEngine(), next_weights
        )
