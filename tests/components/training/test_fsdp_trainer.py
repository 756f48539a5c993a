"""The Ray Train FSDP2 trainer: a two-worker step (after the warm-up) equals a single-process step on the same
batch; checkpoints are HF folders and resuming continues exactly; after a weight sync the engine's logprobs equal
the trainer's."""

from __future__ import annotations

import pytest
import torch

from components.training.checkpoint import latest_checkpoint
from components.training.data import build_micro_batches_locally, micro_batches_from_table
from components.training.grpo import GRPO
from components.training.step import build_optimizer, run_train_step
from components.training.trainer import Trainer, TrainerConfig
from components.training.weight_sync import WeightSync, WeightSyncConfig
from tests.components.training.training_synthetic import random_batch
from tests.components.training.two_worker_trainer import BATCHING, OPTIMIZER, two_worker_trainer_config


def single_process_step(model_dir, trajectories, *, current_version=0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = build_optimizer(model, OPTIMIZER)
    local = build_micro_batches_locally(trajectories, GRPO(), BATCHING, current_version=current_version)
    metrics = run_train_step(
        model, optimizer, micro_batches_from_table(local.micro_batches), GRPO(), optimizer_config=OPTIMIZER
    )
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_two_worker_fsdp_step_equals_single_process_step(trainer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    batch = random_batch(num_groups=3, group_size=4, seed=11)
    expected_metrics, expected = single_process_step(tiny_model_dir, batch)
    # the warm-up runs the step's path on both ranks and changes nothing: the step below still equals a fresh
    # single-process step (an update in the warm-up would move the weights and AdamW's state)
    assert trainer.warm_up() > 0 and trainer.state.step == 0 and trainer.state.weight_version == 0
    metrics = trainer.step(batch, current_version=0)
    assert metrics["trained"] == 1 and trainer.state.step == 1 and trainer.state.weight_version == 1
    assert metrics["data/num_micro_batches"] > 2  # several micro-batches, spread over both ranks
    for key in (
        "loss",
        "grad_norm",
        "num_sampled_tokens",
        "logprob_abs_diff_mean",
        "is_ess",
        "pg_clip_fraction",
    ):
        assert metrics[f"train/{key}"] == pytest.approx(expected_metrics[key], rel=1e-4, abs=1e-7), key
    got = trainer.full_state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    moved = max(float((expected[k] - initial[k]).abs().max()) for k in expected)
    assert moved > 1e-4  # the step changed the weights, so equality below is meaningful
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=2e-6, msg=name)


def test_checkpoint_is_an_hf_folder_and_resume_continues_exactly(trainer, tiny_model_dir, run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if trainer.state.step == 0:
        trainer.step(random_batch(seed=11), current_version=0)
    path = trainer.save_checkpoint()
    assert path == latest_checkpoint(run_dir / "checkpoints").path
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    current = trainer.full_state_dict()
    for name, tensor in current.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(path).eos_token_id == 2
    assert (path / "optimizer.pt").exists()

    second_batch = random_batch(num_groups=2, group_size=4, seed=12)
    trainer.step(second_batch, current_version=1)
    expected = trainer.full_state_dict()
    # a crash while writing a later checkpoint leaves a torn folder and a temp folder: both ignored
    torn = run_dir / "checkpoints" / "step-00000099"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"partial")
    (run_dir / "checkpoints" / ".tmp-step-00000100-abc").mkdir()
    resumed = Trainer(two_worker_trainer_config(tiny_model_dir, run_dir), algorithm=GRPO())
    try:
        assert resumed.resumed_from == path and resumed.state.step == 1 and resumed.state.weight_version == 1
        assert not (run_dir / "checkpoints" / ".tmp-step-00000100-abc").exists()
        resumed.step(second_batch, current_version=1)
        got = resumed.full_state_dict()
    finally:
        resumed.shutdown()
    # identical only if the optimizer state (AdamW moments, step count) was restored too
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-6, msg=name)


async def test_after_weight_sync_engine_logprobs_equal_the_trainers(trainer, tiny_model_dir):
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.protocols import SamplingParams

    if trainer.state.step == 0:  # run alone: train once so that the engine's initial weights differ
        trainer.step(random_batch(seed=11), current_version=0)
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir))
    try:
        sequence = [1, 504, 2231, 17, 9, 3000, 42, 77, 2, 11]
        before = await engine.logprobs_of(sequence)
        trainer_logprobs = trainer.score([sequence])[0]
        assert (
            max(abs(a - b) for a, b in zip(before, trainer_logprobs, strict=True)) > 1e-4
        )  # trained != initial
        version = trainer.state.weight_version
        timings = await WeightSync(WeightSyncConfig(mode="memory"), engine).push(trainer, version)
        assert timings["weight_sync/total_s"] > 0
        after = await engine.logprobs_of(sequence)
        assert after == pytest.approx(list(trainer_logprobs), abs=2e-5)
        result = await engine.generate([1, 504, 2231], SamplingParams(max_tokens=4, seed=0))
        assert set(result.weight_versions) == {version}
    finally:
        await engine.aclose()


async def test_disk_weight_sync_reloads_sglang_from_an_hf_folder(trainer, tiny_model_dir, tmp_path):
    """SGLang path, against the engine team's protocol-faithful fake SGLang server (real HTTP)."""
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.sglang import SGLangEngine, SGLangEngineConfig
    from components.protocols import SamplingParams
    from tests.components.engine.fake_sglang import FakeSGLangServer

    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, context_window=2048, eos_token_ids=())
    )
    try:
        with FakeSGLangServer(engine, tiny_model_dir) as server:
            client = await SGLangEngine.connect(SGLangEngineConfig.for_url(server.url))
            try:
                version = trainer.state.weight_version + 10
                sync = WeightSync(WeightSyncConfig(mode="disk", weights_dir=tmp_path / "weights"), client)
                await sync.push(trainer, version)
                assert [p.name for p in (tmp_path / "weights").iterdir()] == [f"version-{version:08d}"]
                sequence = [1, 504, 2231, 17, 9, 3000, 42, 77, 2, 11]
                assert await engine.logprobs_of(sequence) == pytest.approx(
                    list(trainer.score([sequence])[0]), abs=2e-5
                )
                result = await client.generate([1, 504, 2231], SamplingParams(max_tokens=3, seed=0))
                assert set(result.weight_versions) == {version}
            finally:
                await client.aclose()
    finally:
        await engine.aclose()


def test_bad_input_gets_a_clear_error(trainer, tmp_path):
    with pytest.raises(ValueError, match="trajectories"):
        trainer.step([], current_version=0)
    with pytest.raises(ValueError, match="current_version"):
        trainer.step(random_batch(seed=1), current_version=-1)
    with pytest.raises(ValueError, match="model_path"):
        TrainerConfig(model_path=tmp_path / "missing", run_dir=tmp_path)
    with pytest.raises(ValueError, match="num_workers"):
        TrainerConfig(model_path=trainer.config.model_path, run_dir=tmp_path, num_workers=0)
