"""A server that dies and comes back (engine-neutral ``ServerFleet`` recovery, driven here through SGLang's
adapter against the fake SGLang server in its own process: SGLang cannot run on these machines; vLLM's path is
tested against the real server in ``tests/recipes/test_vllm_server_killed.py``).

The request in flight when the server is SIGKILLed fails with ``EngineError`` (an ``engine_error`` rollout); a
new request waits; the server restarts on its start-up weights (label ``default``); the fleet that pushes the
weights re-pushes the run's folder and version, then the waiting request is served by them. A copy of the fleet
in another process (a proxy shard) never takes the restarted server back before that re-push (weakened variant:
nobody re-pushes → it fails with ``ServerDownError`` instead of serving start-up weights). A server that does
not come back fails the wait within its bound, naming the server."""

from __future__ import annotations

import asyncio
import pickle
import time
from dataclasses import replace

import httpx
import pytest

from components.engine.server_fleet import FleetRecoveryConfig, ServerDownError
from components.engine.sglang import SGLangEngineConfig
from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
from components.errors import EngineError
from components.protocols import SamplingParams
from tests.components.engine.fake_sglang import FakeSGLangProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROMPT = list(range(100, 140))
LONG = SamplingParams(max_tokens=3000, seed=0)  # still decoding when the server is killed


@pytest.fixture
def server(tiny_model_dir):
    process = FakeSGLangProcess(tiny_model_dir, no_eos=True, context_window=4096)
    with process:
        yield process


async def connect(server, *, return_timeout_s: float) -> SGLangFleet:
    config = SGLangFleetConfig(
        urls=(server.url,),
        server=replace(
            SGLangEngineConfig.for_url(server.url, server_return_timeout_s=return_timeout_s),
            max_retries=1,
            retry_backoff_s=0.05,
        ),
        recovery=FleetRecoveryConfig(health_poll_s=0.2),
    )
    return await SGLangFleet.connect(config)


async def weights_label(url: str) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{url}/model_info")).json()["weight_version"]


async def kill_mid_request(fleet: SGLangFleet, server: FakeSGLangProcess) -> None:
    """A long request in flight, the server SIGKILLed under it: the request fails with an EngineError."""
    in_flight = asyncio.create_task(fleet.generate(PROMPT, LONG))
    await asyncio.sleep(1.0)
    assert not in_flight.done()
    server.kill()
    with pytest.raises(EngineError, match="every SGLang server is down") as failed:
        await in_flight
    assert not isinstance(failed.value, ServerDownError)


async def restart_later(server: FakeSGLangProcess, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    server.start()
    await asyncio.to_thread(server.wait_listening)


async def test_a_killed_server_comes_back_with_the_runs_weights_and_version(server, tiny_model_dir):
    fleet = await connect(server, return_timeout_s=120)
    try:
        await fleet.update_weights_from_disk(tiny_model_dir, version=3)
        fleet.remember_weights(tiny_model_dir, 3)
        await kill_mid_request(fleet, server)
        # a new request waits for the server, which comes back on its start-up weights, then is re-pushed
        waiting = asyncio.create_task(fleet.generate(PROMPT, SamplingParams(max_tokens=4, seed=1)))
        await restart_later(server, 1.0)
        result = await asyncio.wait_for(waiting, 60)
        assert set(result.weight_versions) == {3}
        assert await weights_label(server.url) == "3"
        assert fleet.returns == [f"{server.url} at version 3"]
        assert fleet.status()["servers"][0]["live"]
    finally:
        await fleet.aclose()


async def test_a_weight_update_whose_pause_finds_the_server_just_killed_waits_for_its_return(
    server, tiny_model_dir
):
    """The race the async vLLM kill hit: the server dies between a step's end and its push, before anything
    noticed. The pause fails as unreachable, so the update waits for the server (as requests do) and loads the
    new version on it once it is back, instead of stopping the run (the pre-fix fleet raised "pause failed on
    every SGLang server"). A pause the server refuses is no outage: ``test_sglang_operations``'s admin-key test
    (HTTP 401) fails at once."""
    fleet = await connect(server, return_timeout_s=120)
    try:
        await fleet.update_weights_from_disk(tiny_model_dir, version=3)
        fleet.remember_weights(tiny_model_dir, 3)
        server.kill()  # nothing has noticed: the fleet still counts it live
        assert fleet.status()["servers"][0]["live"]
        update = asyncio.create_task(fleet.update_weights_from_disk(tiny_model_dir, version=4))
        await restart_later(server, 1.0)
        await asyncio.wait_for(update, 60)
        assert fleet.weight_version == 4 and await weights_label(server.url) == "4"
        result = await fleet.generate(PROMPT, SamplingParams(max_tokens=4, seed=1))
        assert set(result.weight_versions) == {4}
    finally:
        await fleet.aclose()


async def test_a_shards_copy_takes_the_server_back_only_after_the_original_re_pushed(server, tiny_model_dir):
    original = await connect(server, return_timeout_s=120)
    try:
        await original.update_weights_from_disk(tiny_model_dir, version=2)
        shard = pickle.loads(pickle.dumps(original))  # as a proxy session shard holds it
        await shard.generate(PROMPT, SamplingParams(max_tokens=2, seed=0))  # the shard has seen version 2
        await kill_mid_request(shard, server)
        waiting = asyncio.create_task(shard.generate(PROMPT, SamplingParams(max_tokens=4, seed=1)))
        await restart_later(server, 0.5)
        await asyncio.sleep(1.5)  # healthy, but on its start-up weights ("default"): the copy keeps waiting
        assert await weights_label(server.url) == "default" and not waiting.done()
        original.start_watching()  # the driver's watch: notices the restart and re-pushes version 2
        result = await asyncio.wait_for(waiting, 60)
        assert set(result.weight_versions) == {2}
        assert original.returns and shard.returns == [f"{server.url} at version 2"]
    finally:
        await original.aclose()


async def test_weakened_nobody_re_pushes_so_the_copy_fails_instead_of_serving_start_up_weights(
    server, tiny_model_dir
):
    original = await connect(server, return_timeout_s=4)
    try:
        await original.update_weights_from_disk(tiny_model_dir, version=2)
        shard = pickle.loads(pickle.dumps(original))
        await shard.generate(PROMPT, SamplingParams(max_tokens=2, seed=0))
        await kill_mid_request(shard, server)
        waiting = asyncio.create_task(shard.generate(PROMPT, SamplingParams(max_tokens=4, seed=1)))
        await restart_later(server, 0.5)  # no original watching: the server stays on "default"
        with pytest.raises(ServerDownError, match=server.url):
            await asyncio.wait_for(waiting, 30)
    finally:
        await original.aclose()


async def test_a_server_that_does_not_come_back_fails_the_wait_naming_it(server):
    fleet = await connect(server, return_timeout_s=2)
    try:
        await kill_mid_request(fleet, server)
        started = time.monotonic()
        with pytest.raises(ServerDownError, match=rf"none came back within 2 s.*{server.url}"):
            await fleet.generate(PROMPT, SamplingParams(max_tokens=4))
        assert time.monotonic() - started < 10  # bounded: no hang
        with pytest.raises(ServerDownError, match="--sglang-server-return-timeout-s"):
            await fleet.update_weights_from_disk("/nonexistent", version=1)
    finally:
        await fleet.aclose()
