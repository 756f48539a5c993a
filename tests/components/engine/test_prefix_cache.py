"""Prefix cache of the embedded engine: reused KV gives the logprobs of a cold run, eviction keeps the budget,
a weight update never lets old KV into new-version tokens, and sessions sharing a system prompt reuse it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.providers import EmbeddedEngineBrickConfig
from components.protocols import GenerationResult, SamplingParams

pytestmark = pytest.mark.timeout(240)

ATOL = 1e-5  # the bound: logprobs identical to a cold run


def ids(length: int, offset: int) -> list[int]:
    return [100 + (offset * 31 + 17 * j) % 4000 for j in range(length)]


NO_PREFIX_CACHE = EmbeddedEngineBrickConfig(kv_cache_gb=0)


def engine_for(model_dir, **overrides) -> EmbeddedEngine:
    # Small prefill chunks so that a suffix after a cached prefix is itself prefilled in several chunks.
    options = {"eos_token_ids": (), "prefill_chunk_tokens": 16, **overrides}
    return EmbeddedEngine(EmbeddedEngineConfig(model_path=model_dir, **options))


def assert_same_generation(cached: GenerationResult, cold: GenerationResult) -> None:
    assert cached.output_ids == cold.output_ids
    assert cached.weight_versions == cold.weight_versions
    assert cached.num_prompt_tokens == cold.num_prompt_tokens
    np.testing.assert_allclose(cached.logprobs, cold.logprobs, atol=ATOL, rtol=0)


def bytes_per_token(engine: EmbeddedEngine) -> int:
    config = engine.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4  # keys + values, float32


async def test_multi_turn_session_reuses_kv_with_cold_logprobs(tiny_model_dir):
    cached, cold = engine_for(tiny_model_dir), engine_for(tiny_model_dir, settings=NO_PREFIX_CACHE)
    try:
        for params in (SamplingParams(max_tokens=12, temperature=0.0), SamplingParams(max_tokens=12, seed=3)):
            history = ids(40, offset=1 + int(params.temperature))
            for turn in range(3):
                warm_result = await cached.generate(history, params)
                cold_result = await cold.generate(history, params)
                assert_same_generation(warm_result, cold_result)
                # The next turn re-sends everything: prompt, the reply, and a tool result.
                history = history + list(warm_result.output_ids) + ids(23, offset=10 + turn)
        stats = cached.stats()
        assert stats["prefix_cache_hits"] == 4  # turns 2 and 3 of both sessions
        assert stats["prefix_cache_reused_tokens"] >= 2 * (40 + 11) + 2 * (40 + 12 + 23 + 11)
        assert cold.stats()["prefix_cache_hits"] == 0 and cold.stats()["prefix_cache_entries"] == 0
    finally:
        cached.close()
        cold.close()


def entry_storages(engine: EmbeddedEngine) -> list[set[int]]:
    """Per cached entry (oldest first), the addresses of the buffers holding its KV."""
    entries = engine._scheduler.prefix_cache._entries.values()
    return [set(entry.storages()) for entry in entries]


async def test_turns_append_into_the_cached_buffers_and_branches_do_not_corrupt_them(tiny_model_dir):
    """A lone next turn writes after the cached positions in the same buffers (no copy per turn); a second
    request reusing the same entry while the first still runs, or a partial match, copies it; every result
    equals a cold run."""
    cached, cold = engine_for(tiny_model_dir), engine_for(tiny_model_dir, settings=NO_PREFIX_CACHE)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    try:
        history = ids(30, offset=70)
        shared_turns = 0
        for turn in range(5):  # small turns: after one geometric growth, several fit in the spare room
            before = entry_storages(cached)
            reply = await cached.generate(history, params)
            assert_same_generation(reply, await cold.generate(history, params))
            after = entry_storages(cached)
            assert len(after) == 1  # the new turn covers (replaces) the previous one
            shared_turns += bool(before and before[0] == after[0])
            history = history + list(reply.output_ids) + ids(4, offset=71 + turn)
        assert shared_turns >= 2, "later turns must append into the previous turn's buffers, not copy them"
        # Two branches of the session at once: the first appends after the entry in its buffers; the second,
        # admitted while the first is still decoding, must copy the entry (one writer per buffer tail).
        long = SamplingParams(max_tokens=16, temperature=0.0)  # the first branch fits in the spare room
        first_branch, second_branch = history + ids(3, offset=80), history + ids(4, offset=81)
        steps = cached.stats()["num_decode_steps"]
        first = asyncio.create_task(cached.generate(first_branch, long))
        while cached.stats()["num_decode_steps"] < steps + 2:
            await asyncio.sleep(0.001)
        second = await cached.generate(second_branch, long)
        assert cached.stats()["peak_batch_size"] == 2, "the branches must have decoded together"
        assert_same_generation(await first, await cold.generate(first_branch, long))
        assert_same_generation(second, await cold.generate(second_branch, long))
        partial = history[:-5] + ids(7, offset=90)  # a partial match of a cached entry is copied too
        assert_same_generation(await cached.generate(partial, params), await cold.generate(partial, params))
        assert cached.stats()["prefix_cache_hits"] == 4 + 3
    finally:
        cached.close()
        cold.close()


async def test_a_request_that_stops_early_is_cached_without_its_unused_room(tiny_model_dir):
    engine, cold = engine_for(tiny_model_dir), engine_for(tiny_model_dir, settings=NO_PREFIX_CACHE)
    prompt = ids(40, offset=95)
    try:
        probe = await cold.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0))
        first_token = probe.output_ids[0]
        stopping = SamplingParams(max_tokens=400, temperature=0.0, stop_token_ids=(first_token,))
        result = await engine.generate(prompt, stopping)
        assert result.output_ids == (first_token,)
        # Room for 399 more tokens was reserved; the entry holds only the 40 forwarded positions.
        assert engine.stats()["prefix_cache_bytes"] == bytes_per_token(engine) * len(prompt)
    finally:
        engine.close()
        cold.close()


async def test_eviction_keeps_the_budget_and_drops_the_least_recently_used(tiny_model_dir):
    probe = engine_for(tiny_model_dir, settings=NO_PREFIX_CACHE)
    per_token = bytes_per_token(probe)
    probe.close()
    prompt_length, max_tokens = 60, 5
    entry_bytes = per_token * (prompt_length + max_tokens - 1)
    budget = int(2.5 * entry_bytes)  # room for two entries, not three
    engine = engine_for(tiny_model_dir, settings=EmbeddedEngineBrickConfig(kv_cache_gb=budget / 2**30))
    cold = engine_for(tiny_model_dir, settings=NO_PREFIX_CACHE)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompts = [ids(prompt_length, offset=50 + i) for i in range(3)]
    try:
        for prompt in prompts:
            await engine.generate(prompt, params)
        stats = engine.stats()
        assert stats["prefix_cache_entries"] == 2 and stats["prefix_cache_evictions"] == 1
        assert stats["prefix_cache_bytes"] == 2 * entry_bytes <= budget
        hits_before = stats["prefix_cache_hits"]
        # The first prompt was evicted (least recently used): asking again is a miss ...
        again_first = await engine.generate(prompts[0], params)
        assert engine.stats()["prefix_cache_hits"] == hits_before
        # ... which evicted the second; the third is still there and is reused.
        again_third = await engine.generate(prompts[2], params)
        assert engine.stats()["prefix_cache_hits"] == hits_before + 1
        assert engine.stats()["prefix_cache_bytes"] <= budget
        assert_same_generation(again_first, await cold.generate(prompts[0], params))
        assert_same_generation(again_third, await cold.generate(prompts[2], params))
    finally:
        engine.close()
        cold.close()


async def test_weight_update_empties_the_cache_and_new_tokens_use_new_kv(tiny_model_dir, tiny_model_v1_dir):
    new_state = load_file(str(tiny_model_v1_dir / "model.safetensors"))
    engine = engine_for(tiny_model_dir)
    cold_v1 = engine_for(tiny_model_v1_dir, settings=NO_PREFIX_CACHE, initial_weight_version=1)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    first_turn = ids(50, offset=7)
    try:
        reply = await engine.generate(first_turn, params)
        assert engine.stats()["prefix_cache_entries"] == 1
        await engine.update_weights(new_state, version=1)
        assert engine.stats()["prefix_cache_entries"] == 0
        second_turn = first_turn + list(reply.output_ids) + ids(20, offset=8)
        hits = engine.stats()["prefix_cache_hits"]
        after = await engine.generate(second_turn, params)
        assert engine.stats()["prefix_cache_hits"] == hits  # the old-version KV was not reused
        assert after.weight_versions == (1,) * 8
        assert_same_generation(after, await cold_v1.generate(second_turn, params))
        # The version-1 KV is now cached and reused, still giving the cold version-1 logprobs.
        third_turn = second_turn + list(after.output_ids) + ids(9, offset=9)
        reused = await engine.generate(third_turn, params)
        assert engine.stats()["prefix_cache_hits"] == hits + 1
        assert_same_generation(reused, await cold_v1.generate(third_turn, params))
    finally:
        engine.close()
        cold_v1.close()


async def test_kv_that_mixes_versions_is_never_cached(tiny_model_dir, tiny_model_v1_dir):
    """Without recomputation an in-flight request keeps old-version KV: it must not be stored."""
    new_state = load_file(str(tiny_model_v1_dir / "model.safetensors"))
    engine = engine_for(tiny_model_dir, recompute_kv_on_update=False)
    try:
        task = asyncio.create_task(engine.generate(ids(30, offset=3), SamplingParams(max_tokens=200, seed=1)))
        while engine.stats()["num_decode_steps"] < 5:
            await asyncio.sleep(0.01)
        await engine.update_weights(new_state, version=1)
        result = await task
        assert 0 in result.weight_versions and 1 in result.weight_versions
        assert engine.stats()["prefix_cache_entries"] == 0
    finally:
        engine.close()


async def test_concurrent_sessions_share_a_system_prompt(tiny_model_dir):
    engine, cold = (
        engine_for(tiny_model_dir, settings=EmbeddedEngineBrickConfig(max_batch_size=8)),
        engine_for(tiny_model_dir, settings=NO_PREFIX_CACHE),
    )
    system = ids(70, offset=20)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    try:
        await engine.generate(system + ids(12, offset=21), params)  # one session's first turn
        prompts = [system + ids(5 + 9 * i, offset=30 + i) for i in range(4)]
        prompts.append(ids(33, offset=40))  # a session with another system prompt, in the same batch
        hits = engine.stats()["prefix_cache_hits"]
        reused = engine.stats()["prefix_cache_reused_tokens"]
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        stats = engine.stats()
        assert stats["prefix_cache_hits"] == hits + 4
        assert stats["prefix_cache_reused_tokens"] - reused >= 4 * len(system)
        assert stats["peak_batch_size"] >= 2, "the sessions must have run batched together"
        for prompt, result in zip(prompts, results, strict=True):
            assert_same_generation(result, await cold.generate(prompt, params))
    finally:
        engine.close()
        cold.close()


async def test_moe_routing_of_cached_positions_matches_a_cold_run(tiny_moe_model_dir):
    engine, cold = engine_for(tiny_moe_model_dir), engine_for(tiny_moe_model_dir, settings=NO_PREFIX_CACHE)
    params = SamplingParams(max_tokens=5, temperature=0.0, return_routed_experts=True)
    try:
        first = await engine.generate(ids(30, offset=60), params)
        second_turn = ids(30, offset=60) + list(first.output_ids) + ids(11, offset=61)
        hits = engine.stats()["prefix_cache_hits"]
        warm, cold_result = (
            await engine.generate(second_turn, params),
            await cold.generate(second_turn, params),
        )
        assert engine.stats()["prefix_cache_hits"] == hits + 1
        assert_same_generation(warm, cold_result)
        assert warm.routed_experts == cold_result.routed_experts
    finally:
        engine.close()
        cold.close()


def test_kv_cache_budget_is_validated(tiny_model_dir):
    with pytest.raises(ValueError, match="kv_cache_gb"):
        EmbeddedEngineBrickConfig(kv_cache_gb=-1)


def test_recipe_flag_sets_the_budget(capsys):
    from components.recipe_config import parse_config
    from components.run.config import RunConfig

    assert parse_config(RunConfig, ["--engine-kv-cache-gb", "0.25"]).engine.kv_cache_gb == 0.25
    assert parse_config(RunConfig, []).engine.kv_cache_gb == 1.0
    with pytest.raises(SystemExit):
        parse_config(RunConfig, ["--engine-kv-cache-gb", "-1"])
    assert "engine.kv_cache_gb: must be >= 0" in capsys.readouterr().err
