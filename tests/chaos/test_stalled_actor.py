"""Point 3 of the faults issue: a stalled remote component is reported, named, within a bounded time, and the
wait on it ends at its deadline. The real engine actor (tiny model) is frozen with SIGSTOP mid-run; a generate
through ``RayEngineClient`` is reported in ``stalls.jsonl`` and the log ("engine actor: generate") within
``report_after_s`` plus one check, and fails at its deadline with an ``EngineStalledError`` that the rollout
records as ``engine_error``. The weakened variant (the actor call awaited bare, as before) stays silent."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time

import pytest

from components.engine import ray_actor
from components.engine.embedded import EmbeddedEngineConfig
from components.engine.providers import EmbeddedEngineBrickConfig
from components.engine.ray_actor import RayEngineClient, start_engine_actor
from components.protocols import SamplingParams
from components.remote_waits import STALLS_FILE_NAME, EngineStalledError, StallReporter
from components.rollout.failures import classify_exception
from components.trajectory import TrajectoryStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPORT_AFTER_S, DEADLINE_S = 1.0, 4.0


@pytest.fixture
def frozen_engine(ray_session, tiny_model_dir):
    settings = EmbeddedEngineBrickConfig(num_cpus=0.5)
    config = EmbeddedEngineConfig(
        model_path=tiny_model_dir, settings=settings, context_window=512, eos_token_ids=()
    )
    actor = start_engine_actor(config)
    client = asyncio.run(RayEngineClient.connect(actor))
    pid = ray_session.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    os.kill(pid, signal.SIGSTOP)  # the fault: the actor's process stops answering, its socket stays open
    try:
        yield actor, client
    finally:
        os.kill(pid, signal.SIGCONT)
        ray_session.kill(actor)


def _stalls(run_dir):
    path = run_dir / STALLS_FILE_NAME
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _with_reporter(run_dir, work):
    reporter = StallReporter(run_dir, report_after_s=REPORT_AFTER_S, interval_s=0.2)
    task = asyncio.create_task(reporter.run())
    try:
        return await work(), reporter
    finally:
        task.cancel()


def test_a_frozen_engine_actor_is_reported_by_name_then_fails_at_its_deadline(
    frozen_engine, tmp_path, monkeypatch, caplog
):
    _, client = frozen_engine
    monkeypatch.setattr(ray_actor, "ENGINE_CALL_DEADLINE_S", DEADLINE_S)
    started = time.monotonic()

    async def generate():
        with pytest.raises(EngineStalledError) as raised:
            await client.generate([5, 6, 7], SamplingParams(max_tokens=4))
        return raised.value

    with caplog.at_level(logging.WARNING, logger="components.remote_waits"):
        error, reporter = asyncio.run(_with_reporter(tmp_path, generate))
    waited_s = time.monotonic() - started
    assert DEADLINE_S <= waited_s < DEADLINE_S + 5, waited_s
    assert "engine actor did not answer generate within 4 s" in str(error)
    assert classify_exception(error)[0] is TrajectoryStatus.ENGINE_ERROR  # replaced, never trained
    stalls = _stalls(tmp_path)
    assert stalls and stalls[0]["component"] == "engine actor" and stalls[0]["request"] == "generate"
    assert REPORT_AFTER_S <= stalls[0]["waiting_s"] < REPORT_AFTER_S + 1.0  # reported within a bound
    assert len(stalls) >= 2  # reported again while it lasts
    assert "stalled: engine actor: generate" in caplog.text
    assert reporter.take()["stall/longest_wait_s"] >= REPORT_AFTER_S


def test_weakened_bare_actor_call_on_a_frozen_actor_is_silent(frozen_engine, tmp_path):
    actor, _ = frozen_engine

    async def bare_call():
        with pytest.raises(TimeoutError):  # only this test's own bound ends it: nothing else would
            await asyncio.wait_for(actor.info.remote(), DEADLINE_S)

    asyncio.run(_with_reporter(tmp_path, bare_call))
    assert _stalls(tmp_path) == []
