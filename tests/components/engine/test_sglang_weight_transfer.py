"""NCCL weight sync, on CPU with the gloo backend: after a real FSDP2 step, the trainer's rank 0 joins a
weight-update group with two fake SGLang server processes (``/init_weights_update_group``) and broadcasts its
weights bucket by bucket (``/update_weights_from_distributed``); every server receives exactly the trainer's
tensors and then samples under them, stamped with the new version. Same code path as NCCL on GPUs."""

from __future__ import annotations

import hashlib

import httpx
import numpy as np
import pytest
import torch

from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
from components.engine.sglang_weight_transfer import DistributedWeightSyncConfig, buckets_of
from components.protocols import SamplingParams
from components.training.data import SampleBatchConfig
from components.training.grpo import GRPO
from components.training.step import OptimizerConfig
from components.training.trainer import Trainer, TrainerConfig
from components.training.weight_sync import WeightSync, WeightSyncConfig
from tests.components.engine.fake_sglang import FakeSGLangProcess
from tests.components.training.training_synthetic import random_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()


async def server_paths(url: str) -> list[str]:
    async with httpx.AsyncClient() as client:
        return [entry["path"] for entry in (await client.get(f"{url}/_fake/requests")).json()]


def test_buckets_keep_order_and_respect_the_byte_budget():
    tensors = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 1])]
    buckets = buckets_of(tensors, bucket_bytes=80)  # 80 bytes = 20 floats
    assert [[name for name, _ in bucket] for bucket in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"]]


async def test_trainer_rank0_broadcasts_exactly_its_weights_to_every_server(
    ray_session, tiny_model_dir, tmp_path
):
    servers = [FakeSGLangProcess(tiny_model_dir, no_eos=True) for _ in range(2)]
    for server in servers:
        server.start()
    trainer = Trainer(
        TrainerConfig(
            model_path=tiny_model_dir,
            run_dir=tmp_path,
            num_workers=2,
            cpus_per_worker=0.5,
            optimizer=OptimizerConfig(learning_rate=1e-3, max_grad_norm=1.0),
            batching=SampleBatchConfig(max_tokens_per_micro_batch=40),
        ),
        algorithm=GRPO(),
    )
    try:
        for server in servers:
            server.wait_listening()
        trainer.step(random_batch(num_groups=2, group_size=2, seed=5), current_version=0)  # weights move
        fleet = await SGLangFleet.connect(
            SGLangFleetConfig(
                urls=tuple(server.url for server in servers),
                distributed=DistributedWeightSyncConfig(backend="gloo", bucket_bytes=1024 * 1024),
            )
        )
        sync = WeightSync(WeightSyncConfig(mode="distributed"), fleet)
        metrics = await sync.push(trainer, trainer.state.weight_version)
        assert metrics["weight_sync/buckets"] >= 2
        trained = trainer.full_state_dict()
        expected = {name: digest(tensor) for name, tensor in trained.items()}
        async with httpx.AsyncClient() as client:
            for server in servers:
                assert (await client.get(f"{server.url}/_fake/received")).json() == expected
                info = (await client.get(f"{server.url}/model_info")).json()
                assert info["weight_version"] == "1"
        # What they sample now is what the trained policy gives.
        prompt = [1, 504, 2231, 17]
        for index in range(2):  # two new sessions: one per server
            result = await fleet.generate([*prompt, index], SamplingParams(max_tokens=4, seed=index))
            assert result.weight_versions == (1,) * 4
            scored = trainer.score([[*prompt, index, *result.output_ids]])[0][len(prompt) :]
            np.testing.assert_allclose(result.logprobs, scored, atol=2e-5)
        # The next push reuses the group: one /init_weights_update_group per server for the whole run.
        await sync.push(trainer, 2)
        for server in servers:
            paths = await server_paths(server.url)
            assert paths.count("/init_weights_update_group") == 1
            assert paths.count("/pause_generation") == 2 and paths.count("/continue_generation") == 2
        await fleet.aclose()
    finally:
        trainer.shutdown()  # rank 0 leaves the group: /destroy_weights_update_group on every server
        try:
            for server in servers:
                assert "/destroy_weights_update_group" in await server_paths(server.url)
        finally:
            for server in servers:
                server.__exit__(None, None, None)
