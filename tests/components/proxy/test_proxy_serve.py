"""The proxy on Ray Serve: 2 stateless replicas over session shards, 32 sessions at once, three protocols."""

from __future__ import annotations

import asyncio
import socket
import time

import anthropic
import numpy as np
import openai
import pytest

from components.engine.scripted import ScriptedEngine
from components.protocols import SessionOpen, SessionOutcome, StreamingEngine, TokenChunk
from components.proxy.config import ProxyConfig
from components.proxy.errors import SessionNotFoundError
from components.trajectory import TrajectoryStatus
from components.trajectory_store import TrajectoryStore
from tests.components.proxy.proxy_helpers import reply_ids

NUM_SESSIONS = 32
NUM_TURNS = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _expected_reply(marker: str, turn: int) -> str:
    return f"ack {marker} turn {turn}"


async def _run_session(base_url: str, api_key: str, index: int) -> list[str]:
    """Three turns of one conversation, in one of the three protocols; returns the replies' texts."""
    marker = f"S{index:02d}"
    texts: list[str] = []
    protocol = index % 3
    if protocol == 0:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)
        messages = [{"role": "user", "content": f"I am {marker}."}]
        for turn in range(NUM_TURNS):
            response = await client.chat.completions.create(model="m", messages=messages, stream=turn == 1)
            if turn == 1:
                text = "".join([c.choices[0].delta.content or "" async for c in response if c.choices])
            else:
                text = response.choices[0].message.content
            texts.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {turn}"}]
        await client.close()
    elif protocol == 1:
        client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
        messages = [{"role": "user", "content": f"I am {marker}."}]
        for turn in range(NUM_TURNS):
            async with client.messages.stream(model="m", max_tokens=64, messages=messages) as stream:
                text = (await stream.get_final_message()).content[0].text
            texts.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {turn}"}]
        await client.close()
    else:
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)
        items: list[dict] = [{"type": "message", "role": "user", "content": f"I am {marker}."}]
        for turn in range(NUM_TURNS):
            async with client.responses.stream(model="m", input=items) as stream:
                response = await stream.get_final_response()
            texts.append(response.output_text)
            items += [item.model_dump(exclude_none=True) for item in response.output]
            items.append({"type": "message", "role": "user", "content": f"next {turn}"})
        await client.close()
    return texts


@pytest.mark.slow
async def test_32_sessions_through_two_serve_replicas(ray_session, tokenizer, default_model_dir, tmp_path):
    from ray import serve

    from components.proxy.ray_sessions import start_session_shards
    from components.proxy.serve import run_proxy_on_serve

    def script(prompt: str) -> str:
        marker = prompt.split("I am ", 1)[1][:3]
        return f"ack {marker} turn {prompt.count('<|im_start|>assistant') - 1}"

    engine = ScriptedEngine(tokenizer, script, context_window=2048)
    config = ProxyConfig(run_dir=tmp_path, keepalive_interval_s=1.0)
    token = config.session_keys.session_token  # closed by default: every replica checks the session's token
    serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
    registry = start_session_shards(engine, default_model_dir, config, num_shards=2)
    app_name = "rein-proxy-test"
    try:
        url = run_proxy_on_serve(
            registry, config, app_name=app_name, route_prefix="/proxy/test", num_replicas=2
        )
        status = serve.status().applications[app_name].deployments
        assert sum(d.replica_states.get("RUNNING", 0) for d in status.values()) == 2

        session_ids = [
            await registry.open_session(SessionOpen(task_id=f"task-{i}", group_id="g"))
            for i in range(NUM_SESSIONS)
        ]
        assert {registry.shard_index(s) for s in session_ids} == {0, 1}
        results = await asyncio.gather(
            *(_run_session(f"{url}/s/{sid}", token(sid), i) for i, sid in enumerate(session_ids))
        )
        for index, texts in enumerate(results):
            assert texts == [_expected_reply(f"S{index:02d}", turn) for turn in range(NUM_TURNS)]

        trajectories = await asyncio.gather(
            *(registry.finalize(sid, SessionOutcome(reward=float(i))) for i, sid in enumerate(session_ids))
        )
        for index, trajectory in enumerate(trajectories):
            assert trajectory.task_id == f"task-{index}" and trajectory.reward == float(index)
            assert len(trajectory.segments) == 1, (index, [s.reason for s in trajectory.segments])
            segment = trajectory.segments[0]
            expected = [
                t
                for turn in range(NUM_TURNS)
                for t in reply_ids(tokenizer, _expected_reply(f"S{index:02d}", turn))
            ]
            assert segment.token_ids[segment.loss_mask == 1].tolist() == expected
            assert f"I am S{index:02d}." in tokenizer.decode(segment.token_ids)
            assert np.all(segment.weight_versions[segment.loss_mask == 1] == 0)
        with pytest.raises(SessionNotFoundError):
            await registry.describe(session_ids[0])
        stored = TrajectoryStore(tmp_path).read_all().trajectories  # written by the shard actors
        assert sorted(t.trajectory_id for t in stored) == sorted(session_ids)

        # Context overflow through a replica: a 413 in the protocol's shape, the session marked, the record kept.
        overflow_id = await registry.open_session()
        client = anthropic.AsyncAnthropic(
            base_url=f"{url}/s/{overflow_id}", api_key=token(overflow_id), max_retries=0
        )
        messages = [{"role": "user", "content": "I am S99."}]
        first = await client.messages.create(model="m", max_tokens=32, messages=messages)
        messages += [
            {"role": "assistant", "content": first.content[0].text},
            {"role": "user", "content": "word " * 3000},
        ]
        with pytest.raises(anthropic.APIStatusError) as caught:
            await client.messages.create(model="m", max_tokens=32, messages=messages)
        assert caught.value.status_code == 413 and caught.value.body["error"]["type"] == "context_overflow"
        overflowed = await registry.finalize(overflow_id, SessionOutcome(reward=0.0))
        assert overflowed.status == TrajectoryStatus.CONTEXT_OVERFLOW and overflowed.trainable
        assert overflowed.segments[0].num_sampled_tokens == len(
            reply_ids(tokenizer, _expected_reply("S99", 0))
        )
    finally:
        serve.delete(app_name)
        registry.shutdown()


class TalliedPacedEngine:
    """A scripted engine that streams one token per ``delay_s`` from inside a session shard; it reports the
    tokens it hands out and the streams closed before their end to a ``Tally`` actor (the shard is another
    process)."""

    def __init__(self, inner: ScriptedEngine, delay_s: float, tally) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.tally = tally
        self.context_window = inner.context_window
        self.weight_version = inner.weight_version

    async def generate(self, input_ids, params, *, adapter=None):
        return await self.inner.generate(input_ids, params)

    async def generate_stream(self, input_ids, params, *, adapter=None):
        result = await self.inner.generate(input_ids, params)
        finished = False
        try:
            for token, logprob, version in zip(
                result.output_ids, result.logprobs, result.weight_versions, strict=True
            ):
                await asyncio.sleep(self.delay_s)
                self.tally.add.remote(1)
                yield TokenChunk(output_ids=(token,), logprobs=(logprob,), weight_versions=(version,))
            finished = True
            yield result
        finally:
            if not finished:
                self.tally.closed_early.remote()

    async def update_weights(self, state_dict, version: int) -> None:
        raise NotImplementedError


class Tally:
    def __init__(self) -> None:
        self.num_sampled = 0
        self.num_closed_early = 0

    def add(self, count: int) -> None:
        self.num_sampled += count

    def closed_early(self) -> None:
        self.num_closed_early += 1

    def read(self) -> tuple[int, int]:
        return self.num_sampled, self.num_closed_early


async def test_a_serve_replica_streams_the_shards_deltas_live_and_a_disconnect_aborts(
    ray_session, tokenizer, default_model_dir, tmp_path
):
    """``--proxy serve``: the turn runs in its session shard, whose events cross to the replica as the engine
    samples them (the first delta reaches the SDK while most of the reply is unsampled; the pieces join to the
    reply); a client that leaves mid-stream cancels the turn through the shard to the engine (no more tokens,
    nothing recorded)."""
    from ray import serve

    from components.proxy.ray_sessions import start_session_shards
    from components.proxy.serve import run_proxy_on_serve

    tally = ray_session.remote(num_cpus=0)(Tally).remote()
    reply = "word " * 80
    long_reply = "word " * 1000  # 20 s at this pace: a client that leaves early leaves long before its end
    engine = TalliedPacedEngine(ScriptedEngine(tokenizer, [reply, long_reply]), delay_s=0.02, tally=tally)
    assert isinstance(engine, StreamingEngine)
    config = ProxyConfig(run_dir=tmp_path, keepalive_interval_s=1.0)
    token = config.session_keys.session_token
    serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
    registry = start_session_shards(engine, default_model_dir, config, num_shards=2)
    app_name = "rein-proxy-stream-test"
    num_tokens = len(reply_ids(tokenizer, reply.strip()))
    try:
        url = run_proxy_on_serve(
            registry, config, app_name=app_name, route_prefix="/proxy/stream", num_replicas=1
        )
        session_id = await registry.open_session()
        client = openai.AsyncOpenAI(
            base_url=f"{url}/s/{session_id}/v1", api_key=token(session_id), max_retries=0
        )
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Talk"}], stream=True
        )
        content, first_seen = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first_seen is None:
                    first_seen = (await tally.read.remote())[0]
                content += chunk.choices[0].delta.content
        assert first_seen is not None and first_seen < num_tokens // 2, (first_seen, num_tokens)
        assert content.split() == ["word"] * 80
        assert (await registry.describe(session_id)).num_turns == 1
        num_before = (await tally.read.remote())[0]

        left_id = await registry.open_session()
        client = openai.AsyncOpenAI(base_url=f"{url}/s/{left_id}/v1", api_key=token(left_id), max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Talk"}], stream=True, max_tokens=1000
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        await stream.close()  # the client leaves
        deadline = time.monotonic() + 10
        while (await tally.read.remote())[1] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sampled, closed_early = await tally.read.remote()
        assert closed_early == 1, sampled - num_before
        await asyncio.sleep(0.3)
        assert (
            (await tally.read.remote())[0] == sampled < 2 * num_tokens
        )  # nothing more for a client that left
        assert (await registry.describe(left_id)).num_turns == 0  # an abandoned turn is not recorded
    finally:
        serve.delete(app_name)
        registry.shutdown()
        ray_session.kill(tally)
