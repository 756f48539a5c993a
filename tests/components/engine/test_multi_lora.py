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
    from components.protocols import (
        AdapterEngine,
        InferenceEngine,
        SamplingParams,
        StreamingEngine,
        TokenChunk,
    )

    (alice_model, alice_adapter), (bob_model, bob_adapter) = adapters
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
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

        # a policy's stream samples with its adapter: the chunks' logprobs are alice's, the result is generate's
        assert isinstance(alice, StreamingEngine)
        stream_params = SamplingParams(max_tokens=8, seed=11)
        items = [item async for item in alice.generate_stream(PROMPTS[1], stream_params)]
        chunks, streamed = items[:-1], items[-1]
        assert len(chunks) > 1 and all(isinstance(chunk, TokenChunk) for chunk in chunks)
        whole = await alice.generate(PROMPTS[1], stream_params)  # (its prefix is cached now: logprobs round)
        assert streamed.output_ids == whole.output_ids and streamed.weight_versions == whole.weight_versions
        assert streamed.logprobs == pytest.approx(whole.logprobs, abs=1e-4)
        assert [t for chunk in chunks for t in chunk.output_ids] == list(streamed.output_ids)
        assert {v for chunk in chunks for v in chunk.weight_versions} == {5}
        expected = teacher_forced(alice_model, PROMPTS[1] + list(streamed.output_ids), len(PROMPTS[1]))
        logprobs = [lp for chunk in chunks for lp in chunk.logprobs]
        assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) <= 1e-4
        with pytest.raises(ValueError, match="adapter"):
            await anext(alice.generate_stream(PROMPTS[1], stream_params, adapter="bob"))

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
    from components.engine.sglang import SGLangEngine, SGLangEngineConfig
    from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
    from components.lora import write_adapter_version
    from components.protocols import LoraServingEngine, SamplingParams, StreamingEngine
    from tests.components.engine.fake_sglang import FakeSGLangServer

    (alice_model, alice_adapter), (bob_model, bob_adapter) = adapters
    config = EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=2048, eos_token_ids=())
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
                # the fleet streams live (SGLang's /generate stream) with the adapter it serves
                items = [
                    item
                    async for item in fleet.generate_stream(PROMPTS[0], SamplingParams(max_tokens=4, seed=0))
                ]
                assert [t for chunk in items[:-1] for t in chunk.output_ids] == list(items[-1].output_ids)
                assert items[-1].output_ids == result.output_ids and set(items[-1].weight_versions) == {4}
                assert {v for chunk in items[:-1] for v in chunk.weight_versions} == {4}
                # so does one policy's view of a server, with its own adapter
                server = await SGLangEngine.connect(SGLangEngineConfig.for_url(one.url))
                alice = server.policy("alice")
                await alice.load_lora_adapter(
                    write_adapter_version(tmp_path / "alice", alice_adapter, "alice-v7", keep_last=2), 7
                )
                items = [
                    item
                    async for item in alice.generate_stream(PROMPTS[1], SamplingParams(max_tokens=4, seed=1))
                ]
                assert isinstance(alice, StreamingEngine) and set(items[-1].weight_versions) == {7}
                assert {v for chunk in items[:-1] for v in chunk.weight_versions} == {7}
                expected = teacher_forced(
                    alice_model, PROMPTS[1] + list(items[-1].output_ids), len(PROMPTS[1])
                )
                assert max(abs(a - b) for a, b in zip(items[-1].logprobs, expected, strict=True)) <= 1e-4
                await server.aclose()
            finally:
                await fleet.aclose()
    finally:
        for engine in engines:
            await engine.aclose()


async def test_proxy_sessions_bound_to_two_policies_batched_on_one_engine(tiny_model_dir, adapters):
    """Two agents (the real openai SDK, each with only its session's token) on one proxy and one embedded engine:
    each session is bound to its policy when the host opens it, the agent's ``model`` field cannot switch it
    (each agent names the *other* policy), the two sessions' requests share decode steps, and every sampled
    token is its own adapter's (teacher-forced) with its own adapter's version."""
    import threading

    import httpx
    import numpy as np
    from openai import AsyncOpenAI
    from transformers import AutoTokenizer

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.proxy.auth import generate_admin_key
    from components.proxy.config import ProxyConfig
    from components.proxy.server import ProxyServer
    from components.proxy.sessions import LocalSessionRegistry

    (alice_model, alice_adapter), (bob_model, bob_adapter) = adapters
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    alice, bob = engine.policy("alice"), engine.policy("bob")
    await alice.update_adapter(alice_adapter, 5)
    await bob.update_adapter(bob_adapter, 9)
    admin_key = generate_admin_key()
    config = ProxyConfig(port=0, admin_key=admin_key, default_max_tokens=12)
    registry = LocalSessionRegistry(
        engine, AutoTokenizer.from_pretrained(tiny_model_dir), config, policies={"alice": alice, "bob": bob}
    )
    server = ProxyServer(registry, config)
    server.start_in_thread()
    admin = httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {admin_key}"})
    gate = threading.Event()
    try:
        opened = {}
        for policy in ("alice", "bob"):
            reply = await admin.post("/sessions", json={"policy": policy, "task_id": f"task-{policy}"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["policy"] == policy
            opened[policy] = reply.json()
        unknown = await admin.post("/sessions", json={"policy": "mallory"})
        assert unknown.status_code == 400 and "alice" in unknown.text

        # Hold the scheduler between two steps until both agents' requests wait, so the engine must batch them.
        held = asyncio.ensure_future(engine._scheduler.run_between_steps(lambda: gate.wait(30)))

        async def agent_turn(own: str, named: str):
            session = opened[own]
            client = AsyncOpenAI(
                base_url=session["base_url"] + "/v1", api_key=session["api_key"], max_retries=0
            )
            async with client:
                return await client.chat.completions.create(
                    model=named, messages=[{"role": "user", "content": f"hello, I am {own}"}], seed=3
                )

        turns = asyncio.gather(agent_turn("alice", named="bob"), agent_turn("bob", named="alice"))
        for _ in range(3000):
            if engine.stats()["num_waiting"] == 2:
                break
            await asyncio.sleep(0.01)
        assert engine.stats()["num_waiting"] == 2
        gate.set()
        await held
        await turns
        stats = engine.stats()
        assert stats["num_multi_adapter_decode_steps"] >= config.default_max_tokens - 1, stats

        for policy, own, other in (("alice", alice_model, bob_model), ("bob", bob_model, alice_model)):
            record = (await admin.get(f"/s/{opened[policy]['session_id']}/trajectory")).json()
            assert record["policy"] == policy and record["num_segments"] == 1
            segment = record["segments"][0]
            ids, mask = segment["token_ids"], np.asarray(segment["loss_mask"], dtype=bool)
            assert mask.sum() == config.default_max_tokens
            sampled = np.asarray(segment["logprobs"])[mask]
            expected = np.asarray(teacher_forced(own, ids, 1))[mask[1:]]
            wrong = np.asarray(teacher_forced(other, ids, 1))[mask[1:]]
            assert np.abs(sampled - expected).max() <= 1e-4
            assert np.abs(sampled - wrong).max() > 1e-3  # the check tells the two adapters apart
            versions = set(np.asarray(segment["weight_versions"])[mask].tolist())
            assert versions == {registry.policies[policy].weight_version}
        assert (alice.weight_version, bob.weight_version) == (5, 9)
    finally:
        gate.set()
        await admin.aclose()
        server.stop_thread()
        await engine.aclose()
