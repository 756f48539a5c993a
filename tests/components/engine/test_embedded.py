"""EmbeddedEngine: batching, sampling, stopping, context limits, logprob fidelity, weight updates, MoE routing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.errors import ContextOverflowError, EngineError
from components.protocols import FinishReason, GenerationResult, InferenceEngine, SamplingParams

pytestmark = pytest.mark.timeout(180)


def prompts_of_lengths(lengths: list[int], offset: int = 100) -> list[list[int]]:
    return [[offset + (7 * i + 13 * j) % 5000 for j in range(n)] for i, n in enumerate(lengths)]


def reference_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.inference_mode()
def teacher_forced_logprobs(
    model, prompt: list[int], output: list[int], temperature: float = 1.0
) -> np.ndarray:
    """log p(output[i] | prompt + output[:i]) from one plain forward pass of ``model``."""
    ids = torch.tensor([prompt + output])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(output)[:, None])[:, 0].numpy()


def test_engine_satisfies_protocol(tiny_engine):
    assert isinstance(tiny_engine, InferenceEngine)
    assert tiny_engine.context_window == 32768
    assert tiny_engine.weight_version == 0


async def test_concurrent_requests_batch_and_match_sequential_runs(tiny_engine):
    prompts = prompts_of_lengths([3, 17, 5, 40, 9, 1, 23, 12, 30, 8])  # 10 > max_batch_size 8
    params = [SamplingParams(max_tokens=12 + i, seed=1000 + i) for i in range(len(prompts))]
    steps_before = tiny_engine.stats()["num_decode_steps"]
    batched = await asyncio.gather(
        *(tiny_engine.generate(p, s) for p, s in zip(prompts, params, strict=True))
    )
    steps_batched = tiny_engine.stats()["num_decode_steps"] - steps_before
    sequential = [await tiny_engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]

    assert tiny_engine.stats()["peak_batch_size"] == 8
    assert steps_batched < sum(len(r.output_ids) for r in batched) / 3, "requests were not decoded together"
    for together, alone, param in zip(batched, sequential, params, strict=True):
        assert len(together.output_ids) == param.max_tokens
        assert together.finish_reason is FinishReason.LENGTH
        assert together.output_ids == alone.output_ids
        np.testing.assert_allclose(together.logprobs, alone.logprobs, atol=1e-4)
        assert all(lp <= 0 for lp in together.logprobs)
        assert together.weight_versions == (0,) * len(together.output_ids)


async def test_same_seed_same_output_and_different_seed_differs(tiny_engine):
    prompt = prompts_of_lengths([20])[0]
    first = await tiny_engine.generate(prompt, SamplingParams(max_tokens=16, seed=7))
    again = await tiny_engine.generate(prompt, SamplingParams(max_tokens=16, seed=7))
    other = await tiny_engine.generate(prompt, SamplingParams(max_tokens=16, seed=8))
    # The second run reuses the first one's KV (prefix cache): same tokens, logprobs equal to float rounding.
    assert first.output_ids == again.output_ids and first.weight_versions == again.weight_versions
    np.testing.assert_allclose(first.logprobs, again.logprobs, atol=1e-5, rtol=0)
    assert first.output_ids != other.output_ids


async def test_logprobs_match_teacher_forced_forward_pass(tiny_engine, tiny_model_dir):
    model = reference_model(tiny_model_dir)
    prompts = prompts_of_lengths([5, 30, 12, 64, 3, 18])
    results = await asyncio.gather(
        *(tiny_engine.generate(p, SamplingParams(max_tokens=24, seed=i)) for i, p in enumerate(prompts))
    )
    engine_lp = np.concatenate([r.logprobs for r in results])
    reference_lp = np.concatenate(
        [teacher_forced_logprobs(model, p, list(r.output_ids)) for p, r in zip(prompts, results, strict=True)]
    )
    pearson = float(np.corrcoef(engine_lp, reference_lp)[0, 1])
    max_abs_diff = float(np.max(np.abs(engine_lp - reference_lp)))
    print(f"engine vs teacher-forced logprobs: pearson={pearson:.6f} max_abs_diff={max_abs_diff:.2e}")
    assert pearson >= 0.999
    assert max_abs_diff < 1e-3


async def test_logprobs_are_those_of_the_tempered_top_p_distribution(tiny_engine, tiny_model_dir):
    model = reference_model(tiny_model_dir)
    prompt = prompts_of_lengths([25])[0]
    temperature, top_p = 0.7, 0.9
    result = await tiny_engine.generate(
        prompt, SamplingParams(max_tokens=16, temperature=temperature, top_p=top_p, seed=3)
    )
    ids = torch.tensor([prompt + list(result.output_ids)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    for step, token in enumerate(result.output_ids):
        probs = torch.softmax(logits[step] / temperature, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = (sorted_probs.cumsum(0) - sorted_probs) < top_p
        kept_ids = set(order[keep].tolist())
        assert token in kept_ids, "sampled a token outside the top-p set"
        expected = torch.log(probs[token] / sorted_probs[keep].sum())
        assert abs(result.logprobs[step] - float(expected)) < 1e-4


async def test_greedy_reports_unscaled_logprob_of_the_argmax(tiny_engine, tiny_model_dir):
    model = reference_model(tiny_model_dir)
    prompt = prompts_of_lengths([10])[0]
    result = await tiny_engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0))
    again = await tiny_engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0.0, seed=99))
    assert result.output_ids == again.output_ids
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + list(result.output_ids)])).logits[
            0, len(prompt) - 1 : -1
        ]
    assert list(result.output_ids) == logits.argmax(-1).tolist()
    np.testing.assert_allclose(
        result.logprobs, teacher_forced_logprobs(model, prompt, list(result.output_ids)), atol=1e-4
    )


async def test_stop_token_ids_and_stop_strings(tiny_engine):
    prompt = prompts_of_lengths([15])[0]
    free = await tiny_engine.generate(prompt, SamplingParams(max_tokens=20, seed=5))
    stop_id = free.output_ids[5]
    first_index = free.output_ids.index(stop_id)
    stopped = await tiny_engine.generate(
        prompt, SamplingParams(max_tokens=20, seed=5, stop_token_ids=(stop_id,))
    )
    assert stopped.output_ids == free.output_ids[: first_index + 1]
    assert stopped.finish_reason is FinishReason.STOP

    text_upto = tiny_engine.tokenizer.decode(free.output_ids[:8])
    stop_string = text_upto[-3:] if len(text_upto.strip()) >= 3 else text_upto
    by_string = await tiny_engine.generate(
        prompt, SamplingParams(max_tokens=20, seed=5, stop_strings=(stop_string,))
    )
    assert by_string.finish_reason is FinishReason.STOP
    assert stop_string in tiny_engine.tokenizer.decode(by_string.output_ids)
    assert stop_string not in tiny_engine.tokenizer.decode(by_string.output_ids[:-1])
    assert by_string.output_ids == free.output_ids[: len(by_string.output_ids)]


async def test_eos_ends_the_completion(tiny_model_dir):
    probe = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    try:
        prompt = prompts_of_lengths([6])[0]
        free = await probe.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0))
    finally:
        probe.close()
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=(free.output_ids[3],))
    )
    try:
        result = await engine.generate(prompt, SamplingParams(max_tokens=10, temperature=0.0))
    finally:
        engine.close()
    assert result.finish_reason is FinishReason.STOP
    assert result.output_ids == free.output_ids[: free.output_ids.index(free.output_ids[3]) + 1]


async def test_context_overflow_refused_and_max_tokens_clamped(tiny_model_dir):
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=64, eos_token_ids=())
    )
    try:
        with pytest.raises(ContextOverflowError) as raised:
            await engine.generate(prompts_of_lengths([64])[0], SamplingParams(max_tokens=5))
        assert raised.value.num_prompt_tokens == 64 and raised.value.context_window == 64
        with pytest.raises(ContextOverflowError):
            await engine.generate(prompts_of_lengths([100])[0], SamplingParams(max_tokens=5))
        clamped = await engine.generate(prompts_of_lengths([60])[0], SamplingParams(max_tokens=100, seed=1))
        assert len(clamped.output_ids) == 4
        assert clamped.finish_reason is FinishReason.LENGTH
        assert clamped.num_prompt_tokens == 60
    finally:
        engine.close()


async def test_bad_input_is_a_clear_error(tiny_engine):
    with pytest.raises(ValueError, match="input_ids"):
        await tiny_engine.generate([], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await tiny_engine.generate([1, 10**7], SamplingParams())
    with pytest.raises(ValueError, match="return_routed_experts"):
        await tiny_engine.generate([1, 2], SamplingParams(return_routed_experts=True))
    with pytest.raises(ValueError, match="dtype"):
        EmbeddedEngineConfig(model_path="x", dtype="float16")


async def test_long_prompt_chunked_prefill_next_to_short_ones(tiny_engine, tiny_model_dir):
    model = reference_model(tiny_model_dir)
    prompts = prompts_of_lengths([1500, 7, 40])  # 1500 tokens: several prefill chunks of 512
    results = await asyncio.gather(
        *(tiny_engine.generate(p, SamplingParams(max_tokens=10, seed=i)) for i, p in enumerate(prompts))
    )
    for prompt, result in zip(prompts, results, strict=True):
        reference = teacher_forced_logprobs(model, prompt, list(result.output_ids))
        np.testing.assert_allclose(result.logprobs, reference, atol=2e-4)


async def test_cancelled_request_does_not_disturb_others(tiny_engine):
    prompts = prompts_of_lengths([10, 12])
    doomed = asyncio.create_task(tiny_engine.generate(prompts[0], SamplingParams(max_tokens=2000, seed=1)))
    survivor = asyncio.create_task(tiny_engine.generate(prompts[1], SamplingParams(max_tokens=30, seed=2)))
    await asyncio.sleep(0.05)
    doomed.cancel()
    result = await survivor
    assert len(result.output_ids) == 30
    with pytest.raises(asyncio.CancelledError):
        await doomed
    for _ in range(100):
        if tiny_engine.stats()["num_running"] == 0:
            break
        await asyncio.sleep(0.02)
    assert tiny_engine.stats()["num_running"] == 0


async def wait_for_decode_steps(engine: EmbeddedEngine, count: int) -> None:
    target = engine.stats()["num_decode_steps"] + count
    for _ in range(2000):
        if engine.stats()["num_decode_steps"] >= target:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the engine made no progress")


async def test_weight_update_mid_stream_switches_versions_once(tiny_model_dir, tiny_model_v1_dir):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    old_model, new_model = reference_model(tiny_model_dir), reference_model(tiny_model_v1_dir)
    new_state = load_file(str(tiny_model_v1_dir / "model.safetensors"))
    prompts = prompts_of_lengths([8, 20, 3, 35])
    try:
        tasks = [
            asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=300, seed=i)))
            for i, p in enumerate(prompts)
        ]
        await wait_for_decode_steps(engine, 10)
        await engine.update_weights(new_state, version=1)
        assert engine.weight_version == 1
        results: list[GenerationResult] = await asyncio.gather(*tasks)
        after = await engine.generate(prompts[0], SamplingParams(max_tokens=5, seed=0))
    finally:
        engine.close()

    assert after.weight_versions == (1,) * 5
    for prompt, result in zip(prompts, results, strict=True):
        versions = list(result.weight_versions)
        switch = versions.index(1)
        assert 0 < switch < len(versions), "the update did not land mid-stream"
        assert versions == [0] * switch + [1] * (len(versions) - switch), "versions must switch exactly once"
        output = list(result.output_ids)
        old_lp = teacher_forced_logprobs(old_model, prompt, output)
        new_lp = teacher_forced_logprobs(new_model, prompt, output)
        # Tokens before the switch came from the old weights; after it, from the new weights over the whole prefix.
        np.testing.assert_allclose(result.logprobs[:switch], old_lp[:switch], atol=2e-4)
        np.testing.assert_allclose(result.logprobs[switch:], new_lp[switch:], atol=2e-4)
        assert np.max(np.abs(old_lp[switch:] - new_lp[switch:])) > 0.1, (
            "the two versions must be distinguishable"
        )


async def test_bad_state_dict_is_refused_without_changing_anything(tiny_engine):
    state = {k: v.clone() for k, v in tiny_engine.model.state_dict().items()}
    with pytest.raises(ValueError, match="keys not in the model"):
        await tiny_engine.update_weights({**state, "nonsense.weight": torch.zeros(1)}, version=5)
    first_key = next(iter(state))
    with pytest.raises(ValueError, match="shape mismatch"):
        await tiny_engine.update_weights({**state, first_key: torch.zeros(3, 3)}, version=5)
    with pytest.raises(ValueError, match="missing keys"):
        await tiny_engine.update_weights({first_key: state[first_key]}, version=5)
    assert tiny_engine.weight_version == 0


async def test_teacher_forced_helper_agrees_with_generation(tiny_engine):
    prompt = prompts_of_lengths([12])[0]
    result = await tiny_engine.generate(prompt, SamplingParams(max_tokens=10, seed=11))
    scored = await tiny_engine.logprobs_of(prompt + list(result.output_ids), start=len(prompt))
    np.testing.assert_allclose(scored, result.logprobs, atol=1e-4)


async def test_routed_experts_recorded_for_moe(tiny_moe_model_dir):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_moe_model_dir, eos_token_ids=()))
    assert engine.num_moe_layers == 2
    prompts = prompts_of_lengths([9, 21])
    try:
        results = await asyncio.gather(
            *(
                engine.generate(p, SamplingParams(max_tokens=6, seed=i, return_routed_experts=True))
                for i, p in enumerate(prompts)
            )
        )
        plain = await engine.generate(prompts[0], SamplingParams(max_tokens=3, seed=0))
    finally:
        engine.close()
    assert plain.routed_experts is None

    model = reference_model(tiny_moe_model_dir)
    recorded: list[torch.Tensor] = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda module, inputs, output: recorded.append(output[-1]))
        for layer in model.model.layers
    ]
    for prompt, result in zip(prompts, results, strict=True):
        routed = result.routed_experts
        assert routed is not None
        assert len(routed) == len(prompt) + len(result.output_ids) - 1  # every forwarded position
        assert all(len(position) == 2 and all(len(set(e)) == 2 for e in position) for position in routed)
        assert all(0 <= expert < 4 for position in routed for layer in position for expert in layer)
        recorded.clear()
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt + list(result.output_ids[:-1])]))
        expected = torch.stack(recorded, dim=1).tolist()  # [positions, layers, top_k]
        matching = sum(
            sorted(map(sorted, got)) == sorted(map(sorted, want))
            for got, want in zip(routed, expected, strict=True)
        )
        assert matching >= 0.95 * len(routed)
    for hook in hooks:
        hook.remove()


async def test_close_aborts_in_flight_requests(tiny_model_dir):
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_tokens=5000, seed=0)))
    await wait_for_decode_steps(engine, 3)
    await engine.aclose()
    result = await task
    assert result.finish_reason is FinishReason.ABORT
    assert 0 < len(result.output_ids) < 5000
    with pytest.raises(EngineError):
        await engine.generate([1, 2], SamplingParams())
