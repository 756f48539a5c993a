"""Multi-LoRA on the embedded engine: two policies (two adapters) share one base model and one batch; every
sampled token's logprob is its own adapter's (teacher-forced with plain peft), versions are per adapter, and a
prefix cached under one adapter is never reused for another."""

from __future__ import annotations

import asyncio

import pytest
import torch

from components.lora import LoraAdapter, LoraError

PROMPTS = ([1, 504, 2231, 17], [1, 9, 3000, 42, 77], [1, 11, 12], [1, 504, 2231, 17, 5])


def random_adapter(model_dir, seed: int):
    """A plain-peft model with a random (non-identity) adapter, and that adapter as a ``LoraAdapter``."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    config = {
        k: sorted(v) if isinstance(v, set) else v for k, v in model.peft_config["default"].to_dict().items()
    }
    tensors = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    return model, LoraAdapter(config=config, tensors=tensors)


def teacher_forced(model, ids: list[int], start: int) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    logprobs = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return logprobs[start - 1 :].tolist()


@pytest.fixture(scope="module")
def adapters(tiny_model_dir):
    return random_adapter(tiny_model_dir, seed=1), random_adapter(tiny_model_dir, seed=2)


async def test_two_policies_sampled_together_each_token_from_its_own_adapter(tiny_model_dir, adapters):
    from transformers import AutoModelForCausalLM

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.protocols import AdapterEngine, InferenceEngine, SamplingParams

    (alice_model, alice_adapter), (bob_model, bob_adapter) = adapters
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, num_threads=1, eos_token_ids=()))
    try:
        alice, bob = engine.policy("alice"), engine.policy("bob")
        assert isinstance(alice, InferenceEngine) and isinstance(alice, AdapterEngine)
        await alice.update_adapter(alice_adapter, 5)
        await bob.update_adapter(bob_adapter, 9)
        assert (alice.weight_version, bob.weight_version, engine.weight_version) == (5, 9, 0)

        params = [SamplingParams(max_tokens=8, seed=seed) for seed in range(4)]
        policies = (alice, bob, alice, bob)
        results = await asyncio.gather(
            *(policy.generate(prompt, p) for policy, prompt, p in zip(policies, PROMPTS, params, strict=True))
        )
        assert engine.stats()["peak_batch_size"] >= 2  # the two policies' requests shared decode steps
        own_models = (alice_model, bob_model, alice_model, bob_model)
        other_models = (bob_model, alice_model, bob_model, alice_model)
        for policy, prompt, result, own, other in zip(
            policies, PROMPTS, results, own_models, other_models, strict=True
        ):
            assert set(result.weight_versions) == {policy.weight_version}
            sequence = prompt + list(result.output_ids)
            expected = teacher_forced(own, sequence, len(prompt))
            assert max(abs(a - b) for a, b in zip(result.logprobs, expected, strict=True)) <= 1e-4
            wrong = teacher_forced(other, sequence, len(prompt))
            assert max(abs(a - b) for a, b in zip(result.logprobs, wrong, strict=True)) > 1e-3

        # bob continues alice's finished sequence: alice's cached KV must not serve bob's prefix
        continued = PROMPTS[0] + list(results[0].output_ids)
        result = await bob.generate(continued, SamplingParams(max_tokens=4, seed=7))
        expected = teacher_forced(bob_model, continued + list(result.output_ids), len(continued))
        assert max(abs(a - b) for a, b in zip(result.logprobs, expected, strict=True)) <= 1e-4

        # requests of no policy still run on the base weights
        plain = await engine.generate(PROMPTS[2], SamplingParams(max_tokens=4, seed=3))
        expected = teacher_forced(base, PROMPTS[2] + list(plain.output_ids), len(PROMPTS[2]))
        assert max(abs(a - b) for a, b in zip(plain.logprobs, expected, strict=True)) <= 1e-4
        assert await alice.logprobs_of(continued) == pytest.approx(
            teacher_forced(alice_model, continued, 1), abs=1e-4
        )

        # a new version of alice's adapter moves only alice's version
        await alice.update_adapter(bob_adapter, 6)
        assert (alice.weight_version, bob.weight_version) == (6, 9)
        with pytest.raises(LoraError, match="reserved"):
            engine.policy("default")
    finally:
        await engine.aclose()


async def test_sglang_fleet_loads_each_adapter_version_on_every_server(tiny_model_dir, adapters, tmp_path):
    """Against two protocol-faithful fake SGLang servers (real HTTP)."""
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
    from components.lora import write_adapter_version
    from components.protocols import LoraServingEngine, SamplingParams
    from tests.components.engine.fake_sglang import FakeSGLangServer

    (alice_model, alice_adapter), (bob_model, bob_adapter) = adapters
    config = EmbeddedEngineConfig(
        model_path=tiny_model_dir, num_threads=1, context_window=2048, eos_token_ids=()
    )
    engines = [EmbeddedEngine(config), EmbeddedEngine(config)]
    try:
        with (
            FakeSGLangServer(engines[0], tiny_model_dir, enable_lora=True) as one,
            FakeSGLangServer(engines[1], tiny_model_dir, enable_lora=True) as two,
        ):
            fleet = await SGLangFleet.connect(SGLangFleetConfig(urls=(one.url, two.url)))
            try:
                assert isinstance(fleet, LoraServingEngine)
                for version, adapter in ((3, alice_adapter), (4, bob_adapter)):
                    path = write_adapter_version(tmp_path, adapter, f"run-v{version}", keep_last=2)
                    await fleet.load_lora_adapter(str(path), version)
                assert fleet.weight_version == 4
                assert [list(s.state.loras) for s in (one, two)] == [["run-v4"], ["run-v4"]]
                result = await fleet.generate(PROMPTS[0], SamplingParams(max_tokens=4, seed=0))
                assert set(result.weight_versions) == {4}
                expected = teacher_forced(bob_model, PROMPTS[0] + list(result.output_ids), len(PROMPTS[0]))
                assert max(abs(a - b) for a, b in zip(result.logprobs, expected, strict=True)) <= 1e-4
            finally:
                await fleet.aclose()
    finally:
        for engine in engines:
            await engine.aclose()
