"""The ``InferenceEngine`` contract suite (``test_engine_contract.py``) against the session's real vLLM server.

Its own module because the vLLM server serves a model of its own architecture (vLLM's CPU attention needs a
head size the suite's tiny model does not have), so ``engine`` and ``next_weights`` are this server's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from components.engine.vllm import VLLMEngine, VLLMEngineConfig
from tests.contracts.test_engine_contract import (  # noqa: F401 (collected here, on this module's fixtures)
    test_bad_prompt_is_a_typed_error,
    test_concurrent_generates_return_aligned_tokens_logprobs_versions,
    test_context_window_and_version_are_ints,
    test_prompt_at_the_window_overflows_and_a_long_one_is_clamped,
    test_same_prompt_and_seed_give_the_same_completion,
    test_update_weights_advances_the_version_and_changes_the_policy,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
async def engine(vllm_server, tmp_path_factory) -> AsyncIterator[VLLMEngine]:
    config = replace(
        VLLMEngineConfig.for_url(vllm_server.url),
        weight_sync_dir=tmp_path_factory.mktemp("vllm-sync"),
        base_model_path=vllm_server.model_dir,
    )
    client = await VLLMEngine.connect(config)
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def next_weights(vllm_server):
    return load_file(str(vllm_server.next_model_dir / "model.safetensors"))
