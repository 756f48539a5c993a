"""LoRA (peft) in the FSDP2 trainer: a two-worker LoRA step equals a single-process peft step, only the adapter
is trained, checkpoints are PEFT adapter folders that plain peft loads, resume continues exactly; after an
adapter-only sync the embedded engine's logprobs equal the trainer's."""

from __future__ import annotations

import pytest
import torch

from components.lora import LoraSettings
from components.training.checkpoint import latest_checkpoint
from components.training.data import build_micro_batches_locally, micro_batches_from_table
from components.training.grpo import GRPO
from components.training.step import build_optimizer, run_train_step
from components.training.trainer import Trainer, TrainerConfig, TrainerError
from tests.components.training.training_synthetic import random_batch
from tests.components.training.two_worker_trainer import BATCHING, OPTIMIZER, two_worker_trainer_config

LORA = LoraSettings(rank=16, alpha=32, target_modules="all-linear")
LORA_OVERRIDES = dict(lora=LORA, gradient_checkpointing=True)
SEQUENCE = [1, 504, 2231, 17, 9, 3000, 42, 77, 2, 11]


def lora_trainer_config(model_dir, run_dir, **overrides) -> TrainerConfig:
    return two_worker_trainer_config(model_dir, run_dir, **{**LORA_OVERRIDES, **overrides})


@pytest.fixture(scope="module")
def trainer_overrides() -> dict:
    """The shared ``trainer`` fixture (``conftest``), with LoRA."""
    return LORA_OVERRIDES


def plain_peft_model(model_dir):
    """The reference: plain peft on a plain transformers model, nothing of Rein's LoRA code."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)  # the trainer seeds lora_A's init with its seed (0) on every rank
    config = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    return get_peft_model(base, config)


def test_two_worker_lora_step_equals_a_single_process_peft_step(trainer, tiny_model_dir):
    from peft import get_peft_model_state_dict

    batch = random_batch(num_groups=3, group_size=4, seed=11)
    model = plain_peft_model(tiny_model_dir)
    optimizer = build_optimizer(model, OPTIMIZER)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    initial = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    local = build_micro_batches_locally(batch, GRPO(), BATCHING, current_version=0)
    expected_metrics = run_train_step(
        model, optimizer, micro_batches_from_table(local.micro_batches), GRPO(), optimizer_config=OPTIMIZER
    )
    expected = get_peft_model_state_dict(model)

    metrics = trainer.step(batch, current_version=0)
    assert metrics["trained"] == 1 and metrics["data/num_micro_batches"] > 2
    for key in ("loss", "grad_norm", "num_sampled_tokens"):
        assert metrics[f"train/{key}"] == pytest.approx(expected_metrics[key], rel=1e-4, abs=1e-7), key
    adapter = trainer.adapter()
    assert set(adapter.tensors) == set(expected)  # only the adapter travels, keyed as peft saves it
    assert max(float((expected[k] - initial[k]).abs().max()) for k in expected) > 1e-4  # the step moved it
    for name, tensor in expected.items():
        torch.testing.assert_close(adapter.tensors[name], tensor, rtol=0, atol=1e-5, msg=name)
    base_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if not p.requires_grad)
    assert adapter.num_bytes < 0.5 * base_bytes


def test_adapter_checkpoint_is_a_peft_folder_plain_peft_loads_and_resume_continues(
    trainer, tiny_model_dir, run_dir
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if trainer.state.step == 0:
        trainer.step(random_batch(seed=11), current_version=0)
    path = trainer.save_checkpoint()
    assert path == latest_checkpoint(run_dir / "checkpoints").path
    assert (path / "adapter_config.json").exists() and (path / "adapter_model.safetensors").exists()
    assert not (path / "model.safetensors").exists()  # the base is not copied into every checkpoint

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, path).eval()
    with torch.no_grad():
        logits = loaded(input_ids=torch.tensor([SEQUENCE])).logits[0, :-1]
    peft_logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(SEQUENCE[1:])[:, None])[:, 0]
    trainer_logprobs = torch.tensor(trainer.score([SEQUENCE])[0].copy())
    torch.testing.assert_close(peft_logprobs, trainer_logprobs.float(), rtol=0, atol=1e-5)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        plain_logits = plain(input_ids=torch.tensor([SEQUENCE])).logits[0, :-1]
    assert float((plain_logits - logits).abs().max()) > 1e-4  # the adapter changes the policy

    second_batch = random_batch(num_groups=2, group_size=4, seed=12)
    trainer.step(second_batch, current_version=1)
    expected = trainer.adapter().tensors
    resumed = Trainer(lora_trainer_config(tiny_model_dir, run_dir), algorithm=GRPO())
    try:
        assert resumed.resumed_from == path and resumed.state.step == trainer.state.step - 1
        resumed.step(second_batch, current_version=1)
        got = resumed.adapter().tensors
    finally:
        resumed.shutdown()
    # identical only if the adapter and the optimizer state (AdamW moments) were both restored
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_lora_settings_and_full_fine_tuning_errors(trainer, tmp_path):
    with pytest.raises(ValueError, match="lora.rank"):
        LoraSettings(rank=-1)
    with pytest.raises(ValueError, match="lora.dropout"):
        LoraSettings(rank=4, dropout=1.5)
    with pytest.raises(ValueError, match="lora.target_modules"):
        LoraSettings(rank=4, target_modules=())
    assert not LoraSettings().enabled and LoraSettings(rank=8).peft_config().lora_alpha == 16
    full = TrainerConfig(model_path=trainer.config.model_path, run_dir=tmp_path)
    assert not full.lora.enabled  # default: full fine-tuning, unchanged
    full_trainer = object.__new__(Trainer)
    full_trainer.config = full
    with pytest.raises(TrainerError, match="lora.rank 0"):
        full_trainer.adapter_ref()


async def test_after_an_adapter_sync_engine_logprobs_equal_the_trainers(trainer, tiny_model_dir):
    from dataclasses import replace

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.lora import LoraError
    from components.protocols import SamplingParams
    from components.training.weight_sync import WeightSync, WeightSyncConfig

    if trainer.state.step == 0:
        trainer.step(random_batch(seed=11), current_version=0)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    try:
        q_proj = engine.model.model.layers[0].self_attn.q_proj
        base_storage, base_weight = q_proj.weight.data_ptr(), q_proj.weight.detach().clone()
        prompt = SEQUENCE[:4]
        first = await engine.generate(prompt, SamplingParams(max_tokens=6, seed=1))  # fills the prefix cache
        before = await engine.logprobs_of(SEQUENCE)
        trainer_logprobs = list(trainer.score([SEQUENCE])[0])
        assert (
            max(abs(a - b) for a, b in zip(before, trainer_logprobs, strict=True)) > 1e-4
        )  # trained != base

        version = trainer.state.weight_version + 3
        timings = await WeightSync(WeightSyncConfig(mode="memory"), engine).push(trainer, version)
        adapter = trainer.adapter()
        base_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters()) - adapter.num_bytes
        assert timings["weight_sync/bytes"] == adapter.num_bytes < 0.5 * base_bytes
        after = await engine.logprobs_of(SEQUENCE)
        assert max(abs(a - b) for a, b in zip(after, trainer_logprobs, strict=True)) <= 1e-4

        # the base was not reloaded: same storage, same values, now wrapped by peft's LoRA layer
        base_layer = engine.model.model.layers[0].self_attn.q_proj.base_layer
        assert base_layer.weight.data_ptr() == base_storage
        assert torch.equal(base_layer.weight, base_weight)

        # a continuation of the cached sequence: every token is the new version, and its logprob is the
        # adapter's own (the base-version KV of the prefix cache was not reused)
        continued = prompt + list(first.output_ids)
        result = await engine.generate(continued, SamplingParams(max_tokens=6, seed=2))
        assert set(result.weight_versions) == {version}
        teacher = await engine.logprobs_of(continued + list(result.output_ids), start=len(continued))
        assert max(abs(a - b) for a, b in zip(result.logprobs, teacher, strict=True)) <= 1e-4

        wrong_rank = replace(adapter, config={**adapter.config, "r": 8})
        with pytest.raises(LoraError, match="structure changed"):
            await engine.update_adapter(wrong_rank, version + 1)
        assert engine.weight_version == version
    finally:
        await engine.aclose()


async def test_sglang_loads_each_adapter_version_under_a_new_name_and_unloads_the_old(
    trainer, tiny_model_dir, tmp_path
):
    """SGLang path, against the protocol-faithful fake SGLang server (real HTTP, SGLang's request shapes)."""
    import json

    import httpx

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.sglang import SGLangEngine, SGLangEngineConfig
    from components.errors import EngineError
    from components.protocols import SamplingParams
    from components.training.weight_sync import WeightSync, WeightSyncConfig
    from tests.components.engine.fake_sglang import FakeSGLangServer, engine_adapter_name

    if trainer.state.step == 0:
        trainer.step(random_batch(seed=11), current_version=0)
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=2048, eos_token_ids=())
    )
    try:
        with FakeSGLangServer(engine, tiny_model_dir, enable_lora=True) as server:
            client = await SGLangEngine.connect(SGLangEngineConfig.for_url(server.url))
            try:
                sync = WeightSync(WeightSyncConfig(mode="disk", weights_dir=tmp_path / "adapters"), client)
                first, second = trainer.state.weight_version + 20, trainer.state.weight_version + 21
                timings = await sync.push(trainer, first)
                assert timings["weight_sync/bytes"] == trainer.adapter().num_bytes
                name1 = f"{trainer.config.run_dir.name}-v{first}"
                folder1 = tmp_path / "adapters" / name1
                assert (folder1 / "adapter_config.json").exists()
                result = await client.generate(SEQUENCE[:3], SamplingParams(max_tokens=3, seed=0))
                assert set(result.weight_versions) == {first}
                assert await engine.logprobs_of(
                    SEQUENCE, adapter=engine_adapter_name(name1)
                ) == pytest.approx(list(trainer.score([SEQUENCE])[0]), abs=1e-4)

                await sync.push(trainer, second)
                name2 = f"{trainer.config.run_dir.name}-v{second}"
                result = await client.generate(SEQUENCE[:3], SamplingParams(max_tokens=3, seed=0))
                assert set(result.weight_versions) == {second}
                bodies = {
                    path: [json.loads(body) for p, body in server.state.requests if p == path]
                    for path in ("/load_lora_adapter", "/unload_lora_adapter", "/generate")
                }
                assert bodies["/load_lora_adapter"] == [
                    {"lora_name": name1, "lora_path": str(folder1)},
                    {"lora_name": name2, "lora_path": str(tmp_path / "adapters" / name2)},
                ]
                assert bodies["/unload_lora_adapter"] == [{"lora_name": name1}]
                assert [b["lora_path"] for b in bodies["/generate"]] == [name1, name2]
                assert list(server.state.loras) == [name2]
                async with httpx.AsyncClient(base_url=server.url) as raw:  # the old name is gone
                    stale = await raw.post("/generate", json={"input_ids": [1, 2], "lora_path": name1})
                assert stale.status_code == 400 and "not loaded" in stale.text
                with pytest.raises(EngineError, match="load_lora_adapter"):
                    await client.load_lora_adapter(str(tmp_path / "not-an-adapter"), second + 1)
                assert client.weight_version == second
            finally:
                await client.aclose()
        with FakeSGLangServer(engine, tiny_model_dir) as server:  # launched without --enable-lora
            client = await SGLangEngine.connect(SGLangEngineConfig.for_url(server.url))
            try:
                with pytest.raises(EngineError, match="enable-lora"):
                    await client.load_lora_adapter(str(folder1), first)
            finally:
                await client.aclose()
    finally:
        await engine.aclose()


def test_rein_export_merged_writes_a_full_hf_model_with_the_adapters_logits(
    trainer, tiny_model_dir, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.cli import main as rein

    checkpoint = trainer.save_checkpoint()
    out = tmp_path / "merged"
    assert rein(["export", str(trainer.config.run_dir), "--merged", str(out)]) == 0
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not any("lora" in name for name in merged.state_dict())
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, checkpoint).eval()
    ids = torch.tensor([SEQUENCE])
    with torch.no_grad():
        expected, got = adapted(input_ids=ids).logits, merged(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(out).eos_token_id == 2

    with pytest.raises(SystemExit) as exists:
        rein(["export", str(trainer.config.run_dir), "--merged", str(out)])
    assert exists.value.code == 2
    with pytest.raises(SystemExit) as empty:
        rein(["export", str(tmp_path / "no-run"), "--merged", str(tmp_path / "other")])
    assert empty.value.code == 2 and not (tmp_path / "other").exists()


def test_recipe_flags_build_the_trainers_lora_settings():
    from components.recipe_config import parse_config
    from components.run.config import RunConfig

    flags = ["--lora-rank", "16", "--lora-target", "all-linear", "--trainer-gradient-checkpointing", "true"]
    trainer = parse_config(RunConfig, flags).trainer
    assert trainer.lora == LoraSettings(rank=16, target_modules="all-linear")
    assert trainer.gradient_checkpointing
    named = parse_config(
        RunConfig, ["--lora-rank", "8", "--lora-target", "q_proj,v_proj", "--lora-alpha", "4"]
    )
    assert named.trainer.lora == LoraSettings(rank=8, alpha=4, target_modules=("q_proj", "v_proj"))
    # the README's "output head" flag builds exactly the adapter the LoRA learning test trains
    from tests.components.training.test_learning import LORA as LEARNING_TEST_LORA

    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head"
    with_head = parse_config(RunConfig, ["--lora-rank", "16", "--lora-target", targets])
    assert with_head.trainer.lora == LEARNING_TEST_LORA
    assert not parse_config(RunConfig, []).trainer.lora.enabled  # default: full fine-tuning
    with pytest.raises((ValueError, SystemExit)):
        parse_config(RunConfig, ["--lora-rank", "-1"])


@pytest.mark.slow
async def test_two_lora_policies_train_concurrently_on_one_engine(ray_session, tiny_model_dir, tmp_path):
    """Two trainers (two adapters on one shared base) step at the same time and push their own adapter versions
    into one embedded engine, then into one (fake) SGLang server; each policy's versions advance on their own and
    every sample is its own trainer's policy (sampled logprobs == the trainer's recomputed ones)."""
    import asyncio
    import json

    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.sglang import SGLangEngine, SGLangEngineConfig
    from components.protocols import SamplingParams
    from components.training.weight_sync import WeightSync, WeightSyncConfig
    from tests.components.engine.fake_sglang import FakeSGLangServer

    names = ("alice", "bob")
    trainers = {
        name: Trainer(
            lora_trainer_config(
                tiny_model_dir,
                tmp_path / name,
                num_workers=1,
                cpus_per_worker=0.5,
                gradient_checkpointing=False,
            ),
            algorithm=GRPO(),
        )
        for name in names
    }
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=2048, eos_token_ids=())
    )

    async def step_together(which: tuple[str, ...], seed: int) -> None:
        await asyncio.gather(
            *(
                asyncio.to_thread(
                    trainers[n].step, random_batch(seed=seed + i), trainers[n].state.weight_version
                )
                for i, n in enumerate(which)
            )
        )

    async def sample_and_check(policies: dict, seed: int) -> None:
        """Both policies sample at once; each token's logprob is its own trainer's, not the other's."""
        prompt = SEQUENCE[:4]
        results = await asyncio.gather(
            *(policies[n].generate(prompt, SamplingParams(max_tokens=6, seed=seed)) for n in names)
        )
        for name, other, result in zip(names, names[::-1], results, strict=True):
            assert set(result.weight_versions) == {trainers[name].state.weight_version}
            sequence = prompt + list(result.output_ids)
            own = trainers[name].score([sequence])[0][len(prompt) - 1 :]
            theirs = trainers[other].score([sequence])[0][len(prompt) - 1 :]
            assert max(abs(a - b) for a, b in zip(result.logprobs, own, strict=True)) <= 1e-4
            assert max(abs(a - b) for a, b in zip(result.logprobs, theirs, strict=True)) > 1e-3

    try:
        # embedded engine: adapters pushed in memory, one engine-side adapter per policy
        policies = {n: engine.policy(n) for n in names}
        syncs = {n: WeightSync(WeightSyncConfig(mode="memory"), policies[n]) for n in names}
        await step_together(names, seed=100)
        await asyncio.gather(*(syncs[n].push(trainers[n], trainers[n].state.weight_version) for n in names))
        await step_together(("alice",), seed=200)  # alice moves on alone; bob keeps serving version 1
        await syncs["alice"].push(trainers["alice"], trainers["alice"].state.weight_version)
        assert {n: policies[n].weight_version for n in names} == {"alice": 2, "bob": 1}
        assert engine.weight_version == 0  # the shared base never moved
        await sample_and_check(policies, seed=1)

        # SGLang: each policy's versions loaded under their own names; requests carry their policy's lora_path
        with FakeSGLangServer(engine, tiny_model_dir, enable_lora=True) as server:
            client = await SGLangEngine.connect(SGLangEngineConfig.for_url(server.url))
            try:
                policies = {n: client.policy(n) for n in names}
                syncs = {
                    n: WeightSync(
                        WeightSyncConfig(mode="disk", weights_dir=tmp_path / "adapters"), policies[n]
                    )
                    for n in names
                }
                await step_together(names, seed=300)
                await asyncio.gather(
                    *(syncs[n].push(trainers[n], trainers[n].state.weight_version) for n in names)
                )
                for seed in (400, 500):  # alice moves on alone
                    await step_together(("alice",), seed=seed)
                    await syncs["alice"].push(trainers["alice"], trainers["alice"].state.weight_version)
                assert {n: policies[n].weight_version for n in names} == {"alice": 5, "bob": 2}
                assert sorted(server.state.loras) == [
                    "alice-v5",
                    "bob-v2",
                ]  # each policy's old versions unloaded
                await sample_and_check(policies, seed=2)
                generated = [json.loads(b) for p, b in server.state.requests if p == "/generate"]
                assert sorted(b["lora_path"] for b in generated[-2:]) == ["alice-v5", "bob-v2"]
            finally:
                await client.aclose()
    finally:
        for trainer in trainers.values():
            trainer.shutdown()
        await engine.aclose()


@pytest.mark.parametrize("target_modules", ["all-linear", ("q_proj", "lm_head")])
def test_adapter_gatherer_equals_peft_saved_adapter_after_each_step(tiny_model_dir, target_modules):
    """The sync's gather (parameters found once) gives exactly peft's saved-adapter tensors, keys and config,
    after the adapter moved, and copies (a later step does not change a gathered version); the output head's
    adapter too (the tied embedding is base, never sent: ``save_embedding_layers=False`` as in every sync)."""
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from components.lora import AdapterGatherer, wrap_with_lora

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = wrap_with_lora(base, LoraSettings(rank=4, target_modules=target_modules))
    gatherer = AdapterGatherer(model)
    versions = []
    for step in range(2):
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.requires_grad:
                    parameter.add_(0.1 * (step + 1))
        versions.append(gatherer.gather())
        expected = get_peft_model_state_dict(model, save_embedding_layers=False)
        assert list(versions[-1].tensors) == list(expected)
        for key, tensor in expected.items():
            assert torch.equal(versions[-1].tensors[key], tensor), key
        assert versions[-1].peft_config().to_dict() == model.peft_config["default"].to_dict()
    assert not torch.equal(*(next(iter(v.tensors.values())) for v in versions))  # copies, not views
