"""``--vllm-weight-transfer nccl`` (GPU clusters; NCCL cannot run on these CPU machines): the flag builds the
NCCL path (the fleet's per-server NCCL links, the trainer's weights handed to ``VLLMFleet.update_weights``), and
without CUDA it is refused with a message naming the option, before any server is contacted. The broadcast itself
is untested here (README, "what runs where")."""

from __future__ import annotations

import asyncio

import pytest
import torch

from components.engine.providers import VLLMBrickConfig
from components.engine.vllm_fleet import VLLMFleet, vllm_fleet_config
from components.engine.vllm_weight_transfer import VLLMNcclConfig, VLLMNcclWeightSender
from components.launch import RunConfig
from components.recipe_config import parse_config

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: contacting it would wait out the start-up timeout
REFUSED = r"weight_transfer: 'nccl' \(--vllm-weight-transfer nccl\).*or use --vllm-weight-transfer disk"


def nccl_flags(*extra: str) -> list[str]:
    # a known context window: an unconnected fleet answers InferenceEngine's properties
    return [
        "--model",
        "tiny",
        "--engine",
        "vllm",
        "--vllm-url",
        DEAD_URL,
        "--vllm-context-window",
        "1024",
        *extra,
    ]


def test_the_flag_builds_the_nccl_path(tmp_path):
    brick = parse_config(
        RunConfig,
        nccl_flags(
            "--vllm-weight-transfer", "nccl", "--vllm-nccl-address", "10.0.0.7",
            "--vllm-nccl-server-world-size", "2",
        ),
    ).engine  # fmt: skip
    assert type(brick) is VLLMBrickConfig and brick.weight_transfer == "nccl"
    config = vllm_fleet_config(brick, initial_weight_version=0)
    assert config.nccl == VLLMNcclConfig(master_address="10.0.0.7", server_world_size=2)
    fleet = VLLMFleet(config)  # not connected: nothing is contacted
    sender = fleet.nccl_sender(fleet.servers[0])
    assert isinstance(sender, VLLMNcclWeightSender) and sender is fleet.nccl_sender(fleet.servers[0])
    assert (sender.server.url, sender.master_address, sender.world_size) == (DEAD_URL, "10.0.0.7", 3)
    sync = brick.build().weight_sync(fleet, run_dir=tmp_path)  # the gathered state dict → update_weights
    assert (sync.config.mode, sync.engine) == ("memory", fleet)
    # the default stays the folder every server reloads
    disk = parse_config(RunConfig, nccl_flags()).engine
    assert disk.weight_transfer == "disk" and vllm_fleet_config(disk, initial_weight_version=0).nccl is None
    disk_fleet = VLLMFleet(vllm_fleet_config(disk, initial_weight_version=0))
    assert disk.build().weight_sync(disk_fleet, run_dir=tmp_path).config.mode == "disk"
    with pytest.raises(SystemExit):
        parse_config(RunConfig, nccl_flags("--vllm-weight-transfer", "gloo"))


@pytest.mark.timeout(60)
async def test_nccl_is_refused_clearly_without_cuda(tmp_path, tiny_model_dir):
    assert not torch.cuda.is_available(), "this test proves the refusal on a machine without CUDA"
    brick = VLLMBrickConfig(url=DEAD_URL, weight_transfer="nccl", context_window=1024)
    provider = brick.build()
    with pytest.raises(ValueError, match=REFUSED + ".*") as refused:
        # refused before the (dead) server is contacted: that would wait 600 s for /health
        await asyncio.wait_for(
            provider.start(model_path=tiny_model_dir, weight_version=0, run_dir=tmp_path, resumed=False), 20
        )
    assert "CUDA is not available" in str(refused.value)
    fleet = VLLMFleet(vllm_fleet_config(brick, initial_weight_version=0))
    with pytest.raises(ValueError, match=REFUSED):
        await fleet.update_weights({"w": torch.zeros(2)}, 1)
    await provider.close()
