"""Several SGLang servers behind Rein's routing (``SGLangFleet``): three fake SGLang servers, each its own process
on loopback. Affinity, least-loaded placement, weight updates (disk and gloo broadcast) reaching all three with
one version, then one server killed mid-run: its sessions fail over, nothing is lost. The tests of this module
share the three servers and run in order (the kill comes last)."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.sglang import SGLangEngineConfig
from components.engine.sglang_fleet import (
    SGLangFleet,
    SGLangFleetConfig,
    parse_server_urls,
    sglang_fleet_config,
)
from components.engine.sglang_weight_transfer import DistributedWeightSyncConfig
from components.errors import EngineError
from components.protocols import SamplingParams
from tests.components.engine.fake_sglang import FakeSGLangProcess, FakeSGLangRouter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SYSTEM_PROMPT = list(range(100, 180))  # shared by every session, longer than the affinity anchor (64 tokens)


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    processes = [FakeSGLangProcess(tiny_model_dir, no_eos=True, context_window=4096) for _ in range(3)]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.wait_listening()
        yield processes
    finally:
        for process in processes:
            process.__exit__(None, None, None)


async def connect(servers, **options) -> SGLangFleet:
    urls = parse_server_urls(",".join(server.url for server in servers))
    return await SGLangFleet.connect(SGLangFleetConfig(urls=urls, **options))


async def server_log(url: str) -> list[dict]:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{url}/_fake/requests")).json()


async def prompts_seen(url: str) -> list[tuple[int, ...]]:
    return [tuple(entry["input_ids"]) for entry in await server_log(url) if entry["path"] == "/generate"]


async def run_session(
    fleet: SGLangFleet, prompt: list[int], *, num_turns: int, max_tokens: int = 6
) -> tuple[list[tuple[int, ...]], list[int]]:
    """Turns of a TITO-like session: each prompt is the previous prompt + its output + a few new tokens.
    Returns the prompts sent and the next turn's prompt."""
    prompts = []
    for turn in range(num_turns):
        result = await fleet.generate(prompt, SamplingParams(max_tokens=max_tokens, seed=turn))
        prompts.append(tuple(prompt))
        prompt = [*prompt, *result.output_ids, 7, 8 + turn]
    return prompts, prompt


async def test_sessions_stick_to_one_server_and_new_sessions_spread(servers):
    fleet = await connect(servers)
    assert fleet.context_window == 4096
    firsts = [[*SYSTEM_PROMPT, 1000 + index] for index in range(6)]
    first_turns = [await run_session(fleet, first, num_turns=1) for first in firsts]  # placed one by one
    assert [server["sessions"] for server in fleet.status()["servers"]] == [2, 2, 2]
    # The remaining turns run concurrently; every session stays on the server of its first turn.
    later = await asyncio.gather(*(run_session(fleet, after, num_turns=3) for _, after in first_turns))
    seen = {server.url: set(await prompts_seen(server.url)) for server in servers}
    holders = []
    for (first_prompts, _), (later_prompts, _) in zip(first_turns, later, strict=True):
        session_prompts = {*first_prompts, *later_prompts}
        assert len(session_prompts) == 4
        holder = [url for url, prompts in seen.items() if session_prompts <= prompts]
        assert len(holder) == 1, "a session's turns went to more than one server"
        holders += holder
    assert sorted(holders.count(server.url) for server in servers) == [2, 2, 2]
    assert [server["sessions"] for server in fleet.status()["servers"]] == [2, 2, 2]  # no new placements
    await fleet.aclose()


async def test_new_session_goes_to_the_least_loaded_server(servers):
    fleet = await connect(servers)
    async with httpx.AsyncClient() as client:  # two servers hold their requests (busy)
        for server in servers[:2]:
            await client.post(f"{server.url}/pause_generation", json={"mode": "in_place"})
        busy = []
        for index in range(2):
            busy.append(
                asyncio.create_task(
                    fleet.generate([*SYSTEM_PROMPT, 2000 + index], SamplingParams(max_tokens=3))
                )
            )
            await asyncio.sleep(0.2)
        assert [server["in_flight"] for server in fleet.status()["servers"]] == [1, 1, 0]
        for index in range(3):  # the idle server takes every new session, although it has the most sessions
            await fleet.generate([*SYSTEM_PROMPT, 3000 + index], SamplingParams(max_tokens=3))
        assert [server["sessions"] for server in fleet.status()["servers"]] == [1, 1, 3]
        # Another process (a second proxy shard) knows nothing of those requests: the servers' own load
        # (/get_load) sends its new session to the idle server too.
        other_shard = await connect(servers)
        await other_shard.generate([*SYSTEM_PROMPT, 3500], SamplingParams(max_tokens=3))
        assert [server["sessions"] for server in other_shard.status()["servers"]] == [0, 0, 1]
        await other_shard.aclose()
        for server in servers[:2]:
            await client.post(f"{server.url}/continue_generation", json={})
    results = await asyncio.gather(*busy)
    assert all(len(result.output_ids) == 3 for result in results)
    await fleet.aclose()


async def test_disk_weight_update_reaches_every_server_with_one_version_while_paused(
    servers, tiny_model_v1_dir, tiny_model_dir, tmp_path
):
    fleet = await connect(
        servers,
        server=replace(
            SGLangEngineConfig.for_url(servers[0].url),
            weight_sync_dir=tmp_path,
            base_model_path=tiny_model_dir,
        ),
    )
    logs = [await server_log(server.url) for server in servers]
    started = max(entry["time"] for log in logs for entry in log)
    await fleet.update_weights(load_file(str(tiny_model_v1_dir / "model.safetensors")), version=5)
    events = {
        server.url: [entry for entry in await server_log(server.url) if entry["time"] > started]
        for server in servers
    }
    times = {
        path: [entry["time"] for log in events.values() for entry in log if entry["path"] == path]
        for path in ("/pause_generation", "/update_weights_from_disk", "/continue_generation")
    }
    assert all(len(found) == 3 for found in times.values()), times  # every server, once each
    # Generation is paused on all three before any loads, and continues only after all three loaded.
    assert max(times["/pause_generation"]) < min(times["/update_weights_from_disk"])
    assert max(times["/update_weights_from_disk"]) < min(times["/continue_generation"])
    async with httpx.AsyncClient() as client:
        versions = {
            (await client.get(f"{server.url}/model_info")).json()["weight_version"] for server in servers
        }
    assert versions == {"5"} and fleet.weight_version == 5
    for index in range(3):
        result = await fleet.generate([*SYSTEM_PROMPT, 4000 + index], SamplingParams(max_tokens=4))
        assert result.weight_versions == (5,) * 4
    await fleet.aclose()


async def test_gloo_weight_broadcast_delivers_exactly_the_trainers_weights_to_every_server(
    servers, tiny_model_dir, tiny_model_v1_dir
):
    """The NCCL code path with the gloo backend: each fake joins the group and receives the tensors."""
    fleet = await connect(
        servers, distributed=DistributedWeightSyncConfig(backend="gloo", bucket_bytes=2 * 1024 * 1024)
    )
    trainer_weights = load_file(str(tiny_model_dir / "model.safetensors"))  # back from v1 to the original
    trainer_weights = {
        name: tensor + 0.001 * (index % 3) for index, (name, tensor) in enumerate(trainer_weights.items())
    }
    await fleet.update_weights(trainer_weights, version=6)
    expected = {
        name: hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()
        for name, tensor in trainer_weights.items()
    }
    async with httpx.AsyncClient() as client:
        for server in servers:
            assert (await client.get(f"{server.url}/_fake/received")).json() == expected
            log = [entry["path"] for entry in await server_log(server.url)]
            assert log.count("/update_weights_from_distributed") >= 2, (
                "the state dict travelled in one bucket"
            )
            assert (await client.get(f"{server.url}/model_info")).json()["weight_version"] == "6"
    # What the servers now sample is what the trainer's weights give.
    reference = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    await reference.update_weights(trainer_weights, version=6)
    prompt = [*SYSTEM_PROMPT, 5000]
    result = await fleet.generate(prompt, SamplingParams(max_tokens=5, seed=3))
    scored = await reference.logprobs_of([*prompt, *result.output_ids], start=len(prompt))
    reference.close()
    np.testing.assert_allclose(result.logprobs, scored, atol=1e-4)
    assert result.weight_versions == (6,) * 5
    await fleet.aclose()  # destroys the group on every server


async def test_a_router_url_stands_for_the_workers_it_lists(servers):
    with FakeSGLangRouter([server.url for server in servers[:2]]) as router:
        fleet = await connect([router, servers[2]])  # a router and a plain server, mixed
    assert [server.url for server in fleet.servers] == [server.url for server in servers]
    for index in range(3):
        await fleet.generate([*SYSTEM_PROMPT, 8000 + index], SamplingParams(max_tokens=2))
    assert [server["sessions"] for server in fleet.status()["servers"]] == [1, 1, 1]
    await fleet.aclose()


async def test_the_fleet_serves_its_own_policy_under_adapter_none_and_refuses_a_named_one(servers):
    """``InferenceEngine.generate``'s ``adapter=``: None is the fleet's one policy (its adapter, if any, is
    engine-wide); a named policy is a ``ValueError`` naming ``adapter`` that reaches no server."""
    fleet = await connect(servers)
    own = await fleet.generate([*SYSTEM_PROMPT, 9000], SamplingParams(max_tokens=3, seed=1), adapter=None)
    assert len(own.output_ids) == 3
    with pytest.raises(ValueError, match="adapter"):
        await fleet.generate([*SYSTEM_PROMPT, 9001], SamplingParams(max_tokens=3), adapter="alice")
    for server in servers:
        assert (*SYSTEM_PROMPT, 9001) not in await prompts_seen(server.url)
    await fleet.aclose()


async def test_killed_server_sessions_fail_over_and_nothing_is_lost(servers, tiny_model_dir):
    fleet = await connect(servers)
    firsts = [[*SYSTEM_PROMPT, 6000 + index] for index in range(6)]
    placed = [await run_session(fleet, first, num_turns=1) for first in firsts]
    victim = servers[1]
    on_victim = {prompts[0] for prompts, _ in placed} & set(await prompts_seen(victim.url))
    assert len(on_victim) == 2

    async def kill_soon() -> None:
        await asyncio.sleep(0.3)
        victim.kill()

    sessions = [run_session(fleet, after, num_turns=4, max_tokens=40) for _, after in placed]
    *completed, _ = await asyncio.gather(*sessions, kill_soon())
    assert all(len(prompts) == 4 for prompts, _ in completed), "a session lost a turn"
    status = fleet.status()
    down = [server for server in status["servers"] if not server["live"]]
    assert [server["url"] for server in down] == [victim.url]
    assert "unreachable" in down[0]["down_reason"]
    assert status["num_failovers"] >= 1
    assert {event.from_url for event in fleet.failovers} == {victim.url}
    # The victim's sessions finished on the live servers.
    seen_live = set()
    for server in servers:
        if server is not victim:
            seen_live |= set(await prompts_seen(server.url))
    for (first_prompts, _), (prompts, _) in zip(placed, completed, strict=True):
        if first_prompts[0] in on_victim:
            assert prompts[-1] in seen_live
    # A weight update skips the server taken out; the live ones agree on the new version.
    await fleet.update_weights_from_disk(tiny_model_dir, version=7)
    async with httpx.AsyncClient() as client:
        for server in servers:
            if server is not victim:
                assert (await client.get(f"{server.url}/model_info")).json()["weight_version"] == "7"
    assert fleet.weight_version == 7
    # With every server gone the failure is a typed engine error (recorded as engine_error by the runner).
    for server in servers:
        server.kill()
    with pytest.raises(EngineError, match="every SGLang server is down"):
        await fleet.generate([*SYSTEM_PROMPT, 7000], SamplingParams(max_tokens=2))
    await fleet.aclose()


def test_the_brick_builds_the_fleets_weight_update_group():
    """``--sglang-weight-sync nccl``: the fleet's NCCL group is the one the SGLang brick builds, meeting at its
    ``--sglang-nccl-address``; ``disk``: no group (weights travel through RUN_DIR/weights)."""
    from components.engine.providers import SGLangBrickConfig

    nccl = SGLangBrickConfig(url="http://127.0.0.1:9", weight_sync="nccl", nccl_address="10.0.0.7")
    built = sglang_fleet_config(
        nccl, model_path=Path("unread"), record_routed_experts=False, initial_weight_version=0
    )
    assert built.distributed == DistributedWeightSyncConfig(master_address="10.0.0.7", backend="nccl")
    assert built.distributed == nccl.distributed_weight_sync
    disk = replace(nccl, weight_sync="disk")
    unread = Path("unread")
    assert (
        sglang_fleet_config(
            disk, model_path=unread, record_routed_experts=False, initial_weight_version=0
        ).distributed
        is None
    )
