"""Point 1 of the faults issue, the proxy's two kinds of actors, on real Ray Serve and real session shards
(the policy is a scripted engine: the faults are in the proxy's actors, not in the model):

- a Serve replica killed (by its actor id) between two turns of every session: each agent's next request
  succeeds through the other replica, and every session's record stays one segment (replicas hold no state);
- a session shard killed: the sessions it held fail fast, as ``EngineError`` naming the dead shard (an
  ``engine_error`` rollout: replaced, never trained), nothing waits on it; the other shard's sessions go on,
  and Ray restarts the shard (``max_restarts``) so new sessions work on it, while a session of the dead
  incarnation is an ``engine_error`` there, never a 404 that would read as the agent's mistake."""

from __future__ import annotations

import asyncio
import random
import socket
import time

import openai
import pytest

from components.engine.scripted import ScriptedEngine
from components.errors import EngineError
from components.protocols import SessionOpen, SessionOutcome
from components.proxy.config import ProxyConfig
from components.rollout.failures import classify_exception
from components.trajectory import TrajectoryStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NUM_SESSIONS = 8
FAIL_FAST_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _script(prompt: str) -> str:
    return f"ack turn {prompt.count('<|im_start|>assistant') - 1}"


@pytest.fixture
def proxy(ray_session, tokenizer, default_model_dir, tmp_path):
    from ray import serve

    from components.proxy.ray_sessions import start_session_shards
    from components.proxy.serve import run_proxy_on_serve

    config = ProxyConfig(run_dir=tmp_path, keepalive_interval_s=1.0)
    serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
    registry = start_session_shards(
        ScriptedEngine(tokenizer, _script, context_window=2048), default_model_dir, config, num_shards=2
    )
    app_name = "rein-proxy-chaos"
    try:
        url = run_proxy_on_serve(
            registry, config, app_name=app_name, route_prefix="/proxy/chaos", num_replicas=2
        )
        yield registry, url, config.session_keys.session_token, app_name
    finally:
        serve.delete(app_name)
        registry.shutdown()


async def _turn(url: str, token: str, session_id: str, history: list[dict]) -> str:
    client = openai.AsyncOpenAI(base_url=f"{url}/s/{session_id}/v1", api_key=token, max_retries=0)
    try:
        response = await client.chat.completions.create(model="m", messages=history)
    finally:
        await client.close()
    return response.choices[0].message.content


def _replica_actors(app_name: str) -> list[str]:
    import ray

    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].startswith(f"SERVE_REPLICA::{app_name}#")
    ]


async def test_a_killed_serve_replica_leaves_every_agents_next_request_to_the_other(proxy):
    import ray

    registry, url, token, app_name = proxy
    sessions = [
        await registry.open_session(SessionOpen(task_id=f"t{i}", group_id="g")) for i in range(NUM_SESSIONS)
    ]
    histories = {sid: [{"role": "user", "content": f"hello {i}"}] for i, sid in enumerate(sessions)}
    kill_after = random.randrange(NUM_SESSIONS)  # a random point of the first turn's round
    replicas = _replica_actors(app_name)
    assert len(replicas) == 2, replicas
    for index, sid in enumerate(sessions):
        text = await _turn(url, token(sid), sid, histories[sid])
        histories[sid] += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        if index == kill_after:
            ray.kill(ray.get_actor(replicas[0], namespace="serve"), no_restart=True)
    started = time.monotonic()
    replies = await asyncio.gather(*(_turn(url, token(sid), sid, histories[sid]) for sid in sessions))
    assert replies == ["ack turn 1"] * NUM_SESSIONS
    assert time.monotonic() - started < 30
    trajectories = await asyncio.gather(
        *(registry.finalize(sid, SessionOutcome(reward=1.0)) for sid in sessions)
    )
    assert all(len(t.segments) == 1 and t.status == TrajectoryStatus.OK for t in trajectories)


async def _fails_fast(call) -> BaseException:
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        await call
    assert time.monotonic() - started < FAIL_FAST_S
    return raised.value


async def test_a_killed_session_shard_fails_its_sessions_by_name_and_comes_back_empty(proxy):
    import ray

    registry, url, token, _ = proxy
    sessions = [
        await registry.open_session(SessionOpen(task_id=f"t{i}", group_id="g")) for i in range(NUM_SESSIONS)
    ]
    on_dead = [sid for sid in sessions if registry.shard_index(sid) == 0]
    on_live = [sid for sid in sessions if registry.shard_index(sid) == 1]
    assert on_dead and on_live
    for sid in sessions:
        await _turn(url, token(sid), sid, [{"role": "user", "content": "hi"}])
    ray.kill(registry.shards[0], no_restart=False)  # the fault; Ray restarts the shard (max_restarts)

    error = await _fails_fast(registry.finalize(on_dead[0], SessionOutcome(reward=1.0)))
    assert "session shard" in str(error) and on_dead[0] in str(error)
    assert classify_exception(error)[0] is TrajectoryStatus.ENGINE_ERROR
    with pytest.raises(openai.APIStatusError) as through_proxy:  # the agent's view: a 502, not a 404
        await _turn(url, token(on_dead[-1]), on_dead[-1], [{"role": "user", "content": "hi"}])
    assert through_proxy.value.status_code == 502
    assert classify_exception(through_proxy.value)[0] is TrajectoryStatus.ENGINE_ERROR
    live = await asyncio.gather(*(registry.finalize(sid, SessionOutcome(reward=1.0)) for sid in on_live))
    assert all(t.status == TrajectoryStatus.OK for t in live)

    deadline = time.monotonic() + 60  # new sessions on the restarted shard (refused while it restarts)
    while True:
        assert time.monotonic() < deadline, "the dead shard did not come back"
        try:
            new = await registry.open_session(SessionOpen(task_id="after", group_id="g2"))
        except EngineError as restarting:
            assert "session shard 0" in str(restarting)
            await asyncio.sleep(0.5)
            continue
        if registry.shard_index(new) == 0:
            break
    await _turn(url, token(new), new, [{"role": "user", "content": "hi"}])
    assert (await registry.finalize(new, SessionOutcome(reward=1.0))).status == TrajectoryStatus.OK
