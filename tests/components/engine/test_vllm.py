"""The vLLM engine brick against the session's real vLLM server (``tests/vllm_fixture.py``): logprobs that the
trainer reproduces, weight sync from a saved folder (outputs, logprobs and versions change; requests in
flight finish on the old version and say so), LoRA adapters per version, the fleet over vLLM, settings whose
logprobs would be wrong refused, a vllm-router URL standing for its workers, and a server killed mid-request
(run last)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from components.engine.server_fleet import FleetRecoveryConfig, ServerDownError, expand_router_urls
from components.engine.vllm import (
    VLLMEngine,
    VLLMEngineConfig,
    VLLMSamplingError,
    require_matching_logprobs,
)
from components.engine.vllm_fleet import VLLMFleet, VLLMFleetConfig
from components.errors import EngineError
from components.protocols import GenerationResult, SamplingParams, StreamingEngine, TokenChunk
from components.sampling import SamplingDistribution

pytestmark = pytest.mark.timeout(600)

PROMPTS = [[1, 100 + i, 200, 300 + i, 400] for i in range(4)]
# fp32 on both sides; the two differ in kernels and summation order only. Measured here: ≤ 3.4e-5 on SmolLM2
# (FACTS.md); an order of magnitude of margin, far below any effect a wrong distribution has (≥ 1e-2).
LOGPROB_TOLERANCE = 5e-4


def trainer_logprobs(model_dir, prompt, output_ids, *, temperature: float = 1.0) -> list[float]:
    """The trainer's view: a transformers fp32 forward over prompt + sampled ids, log_softmax(logits / T)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([list(prompt) + list(output_ids)])
    with torch.no_grad():
        logprobs = (model(ids).logits[0].float() / temperature).log_softmax(-1)
    start = len(prompt) - 1
    return [logprobs[start + i, token].item() for i, token in enumerate(output_ids)]


@pytest.fixture(scope="module")
async def engine(vllm_server, tmp_path_factory):
    client = await VLLMEngine.connect(
        replace(
            VLLMEngineConfig.for_url(vllm_server.url),
            weight_sync_dir=tmp_path_factory.mktemp("vllm-sync"),
            base_model_path=vllm_server.model_dir,
        )
    )
    # Other modules may have pushed other weights to the shared server: start from its own folder.
    await client.update_weights_from_disk(vllm_server.model_dir, client.weight_version + 1)
    yield client
    await client.aclose()


async def test_the_server_reports_its_window_mode_and_version(engine, vllm_server):
    assert engine.context_window == vllm_server.context_window
    assert engine.logprobs_mode == "processed_logprobs"
    assert engine._served_model == vllm_server.served_model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_trainer_logprobs_agree_with_vllms(engine, vllm_server, temperature):
    results = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(max_tokens=24, temperature=temperature, seed=i))
            for i, p in enumerate(PROMPTS)
        )
    )
    diffs = []
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert set(result.weight_versions) == {engine.weight_version}
        reference = trainer_logprobs(
            vllm_server.model_dir, prompt, result.output_ids, temperature=temperature
        )
        diffs += [abs(a - b) for a, b in zip(reference, result.logprobs, strict=True)]
    print(
        f"vLLM vs trainer logprobs at T={temperature}: max abs diff {max(diffs):.2e} over {len(diffs)} tokens"
    )
    assert max(diffs) < LOGPROB_TOLERANCE


async def test_top_p_logprobs_are_the_truncated_distributions(engine):
    """processed_logprobs: the logprobs of top-k sampled tokens are renormalised over the kept tokens."""
    result = await engine.generate(PROMPTS[0], SamplingParams(max_tokens=16, top_k=2, seed=3))
    # two candidates: each logprob is log(p / (p1 + p2)) ≥ log(1/2) for the likelier, and the pair sums to 1
    assert all(lp > -20 for lp in result.logprobs)
    full = await engine.generate(PROMPTS[0], SamplingParams(max_tokens=16, seed=3))
    assert max(full.logprobs) <= 0 and result.logprobs != full.logprobs


def test_logprob_modes_that_would_mislead_the_trainer_are_refused():
    require_matching_logprobs(SamplingDistribution(temperature=0.7, top_p=0.9), "processed_logprobs")
    require_matching_logprobs(SamplingDistribution(temperature=1.0), "raw_logprobs")
    with pytest.raises(VLLMSamplingError, match="--logprobs-mode processed_logprobs"):
        require_matching_logprobs(SamplingDistribution(temperature=0.7), "raw_logprobs")
    with pytest.raises(VLLMSamplingError, match="top_p=0.9"):
        require_matching_logprobs(SamplingDistribution(top_p=0.9), "raw_logprobs")
    with pytest.raises(VLLMSamplingError, match="logits, not logprobs"):
        require_matching_logprobs(SamplingDistribution(), "processed_logits")


async def test_weight_sync_changes_outputs_and_in_flight_requests_finish_on_the_old_version(
    engine, vllm_server
):
    old = engine.weight_version
    params = SamplingParams(max_tokens=12, seed=5)
    before = await engine.generate(PROMPTS[1], params)
    long_request = asyncio.create_task(engine.generate(PROMPTS[2], SamplingParams(max_tokens=400, seed=1)))
    await asyncio.sleep(0.5)  # running on the server when the update starts
    await engine.update_weights(load_file(str(vllm_server.next_model_dir / "model.safetensors")), old + 1)
    in_flight = await long_request
    assert in_flight.weight_versions == (old,) * len(in_flight.output_ids), "pause mode wait: finished on old"
    after = await engine.generate(PROMPTS[1], params)
    assert engine.weight_version == old + 1
    assert after.weight_versions == (old + 1,) * len(after.output_ids)
    assert after.logprobs != before.logprobs
    reference = trainer_logprobs(vllm_server.next_model_dir, PROMPTS[1], after.output_ids)
    assert max(abs(a - b) for a, b in zip(reference, after.logprobs, strict=True)) < LOGPROB_TOLERANCE
    await engine.update_weights_from_disk(vllm_server.model_dir, old + 2)  # back to the server's own weights
    again = await engine.generate(PROMPTS[1], params)
    assert again.output_ids == before.output_ids


async def test_lora_adapters_load_and_swap_per_version(engine, vllm_server, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    params = SamplingParams(max_tokens=10, seed=2)
    base = await engine.generate(PROMPTS[3], params)
    folders, results = [], []
    for version, seed in ((11, 0), (12, 1)):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.5)  # a visible change
        folder = tmp_path / f"adapter-{tmp_path.name}-v{version}"  # a name new to the shared server
        peft_model.save_pretrained(folder)
        folders.append(folder)
        await engine.load_lora_adapter(folder, version)
        result = await engine.generate(PROMPTS[3], params)
        results.append(result)
        assert result.weight_versions == (version,) * len(result.output_ids)
        assert result.logprobs != base.logprobs
    models = await engine._request("GET", "/v1/models")
    names = {card["id"] for card in models["data"]}
    assert folders[1].name in names and folders[0].name not in names, json.dumps(models)[:500]
    # a second policy on the same server: its own adapter (v11's weights, another name) and versions
    other_folder = shutil.copytree(folders[0], folders[0].with_name(folders[0].name + "-other"))
    other = engine.policy("other")
    await other.load_lora_adapter(other_folder, 21)
    mine, theirs = await asyncio.gather(
        engine.generate(PROMPTS[3], params), other.generate(PROMPTS[3], params)
    )
    assert mine.weight_versions == (12,) * len(mine.output_ids) and other.weight_version == 21
    assert theirs.weight_versions == (21,) * len(theirs.output_ids)
    assert theirs.logprobs == pytest.approx(results[0].logprobs, abs=1e-5)
    await engine.unload_lora_adapter(policy="other")
    await engine.unload_lora_adapter()  # back to the base model for later tests
    assert (await engine.generate(PROMPTS[3], params)).logprobs == pytest.approx(base.logprobs, abs=1e-5)


async def test_fleet_over_vllm_pauses_reloads_and_stamps_one_version(vllm_server):
    fleet = await VLLMFleet.connect(
        VLLMFleetConfig(urls=(vllm_server.url,), server=VLLMEngineConfig.for_url(vllm_server.url))
    )
    try:
        version = fleet.weight_version + 1
        await fleet.update_weights_from_disk(vllm_server.model_dir, version)
        result = await fleet.generate(PROMPTS[0], SamplingParams(max_tokens=6, seed=0))
        assert result.weight_versions == (version,) * len(result.output_ids)
        assert fleet.status()["servers"][0]["live"]
        # the server's own load count: a request an earlier test abandoned may still be draining on this shared
        # server, so wait (bounded) for it to reach 0
        for _ in range(120):
            if (num_running := (await fleet.refresh())["num_running"]) == 0:
                break
            await asyncio.sleep(0.5)
        assert num_running == 0
    finally:
        await fleet.aclose()


class TcpForwarder:
    """A second address of the real server: a byte-level forwarder (every HTTP call passes through it), which
    ``close`` takes down with its open connections, as a worker that dies."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, upstream_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def close(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


async def start_router(workers: list[str]) -> tuple[str, object, asyncio.Task]:
    """A router as vllm-router answers Rein (``GET /health``, ``GET /workers`` → ``{"workers": [{"url"}]}``)."""
    import uvicorn
    from fastapi import FastAPI

    from components.engine.vllm_server import free_port

    app = FastAPI()
    app.get("/health")(lambda: {})
    app.get("/workers")(
        lambda: {"workers": [{"url": url, "is_healthy": True} for url in workers], "total": 2}
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, task


async def test_a_router_url_stands_for_its_vllm_workers_with_affinity_and_failover(vllm_server):
    """``--vllm-url ROUTER``: the fleet asks the router for its workers (the real server, and the same server
    behind a forwarder: two workers) and routes to them itself: new sessions spread, a session's next turn
    returns to its worker, and when a worker dies its session fails over to the other. A plain server's URL
    stays itself."""
    assert await expand_router_urls(
        [vllm_server.url],
        lambda url: VLLMEngine(VLLMEngineConfig.for_url(url)),
        server_kind="vLLM",
        field="url",
    ) == (vllm_server.url,)
    forwarder = TcpForwarder(int(vllm_server.url.rsplit(":", 1)[1]))
    second = await forwarder.start()
    router_url, router, router_task = await start_router([vllm_server.url, second])
    config = replace(VLLMEngineConfig.for_url(router_url, server_return_timeout_s=0), max_retries=0)
    fleet = await VLLMFleet.connect(VLLMFleetConfig(urls=(router_url,), server=config))
    try:
        assert [server.url for server in fleet.servers] == [vllm_server.url, second]
        params = SamplingParams(max_tokens=4, seed=0)
        # prompts longer than the fleet's affinity anchor (64 tokens), as chat prompts are
        long_prompts = [[1, *range(100 + 7 * i, 180 + 7 * i)] for i in (0, 1)]
        await fleet.generate(
            long_prompts[0], params
        )  # a new session: the first of two equally loaded workers
        other = await fleet.generate(long_prompts[1], params)  # the next: the worker with fewer sessions
        assert [server["sessions"] for server in fleet.status()["servers"]] == [1, 1]
        # the second session's next turn goes back to its worker (the forwarder) ...
        turn_2 = long_prompts[1] + list(other.output_ids) + [500, 501]
        await fleet.generate(turn_2, params)
        assert fleet.failovers == [] and [s["sessions"] for s in fleet.status()["servers"]] == [1, 1]
        # ... and, once that worker is gone, its next turn fails over to the live one
        await forwarder.close()
        turn_3 = turn_2 + [502]
        result = await fleet.generate(turn_3, params)
        assert len(result.output_ids) > 0
        assert [(event.from_url, event.to_url) for event in fleet.failovers] == [(second, vllm_server.url)]
        assert [server["live"] for server in fleet.status()["servers"]] == [True, False]
    finally:
        await fleet.aclose()
        router.should_exit = True
        await router_task


async def test_the_fleet_streams_from_the_sessions_server_and_fails_over_before_the_first_chunk(vllm_server):
    """A vLLM fleet is a ``StreamingEngine``: a turn streams from its session's server (chunks, then the result,
    whose ids are the chunks'); when that server is gone before the first chunk, the turn fails over to a live
    one as ``generate`` does (and the affinity / session counts follow)."""
    forwarder = TcpForwarder(int(vllm_server.url.rsplit(":", 1)[1]))
    second = await forwarder.start()
    config = replace(VLLMEngineConfig.for_url(vllm_server.url, server_return_timeout_s=0), max_retries=0)
    fleet = await VLLMFleet.connect(VLLMFleetConfig(urls=(vllm_server.url, second), server=config))
    try:
        assert isinstance(fleet, StreamingEngine)
        params = SamplingParams(max_tokens=6, seed=0)
        long_prompts = [[1, *range(100 + 7 * i, 180 + 7 * i)] for i in (0, 1)]
        await fleet.generate(long_prompts[0], params)  # the first session: the first server
        items = [
            item async for item in fleet.generate_stream(long_prompts[1], params)
        ]  # the second: the other
        chunks, result = items[:-1], items[-1]
        assert isinstance(result, GenerationResult) and all(isinstance(c, TokenChunk) for c in chunks)
        assert chunks and [t for c in chunks for t in c.output_ids] == list(result.output_ids)
        assert [server["sessions"] for server in fleet.status()["servers"]] == [1, 1]
        await forwarder.close()  # the second session's server goes away before its next turn
        turn_2 = long_prompts[1] + list(result.output_ids) + [500, 501]
        items = [item async for item in fleet.generate_stream(turn_2, params)]
        assert len(items) > 1 and isinstance(items[-1], GenerationResult)
        assert [(event.from_url, event.to_url) for event in fleet.failovers] == [(second, vllm_server.url)]
        assert [server["live"] for server in fleet.status()["servers"]] == [True, False]
        assert all(server["in_flight"] == 0 for server in fleet.status()["servers"])
    finally:
        await fleet.aclose()
        await forwarder.close()


@pytest.mark.vllm_kills_server
async def test_a_killed_server_fails_requests_in_flight_with_a_clear_engine_error(vllm_server):
    settings = {"server_return_timeout_s": 3}
    config = replace(
        VLLMEngineConfig.for_url(vllm_server.url, **settings), max_retries=1, retry_backoff_s=0.1
    )
    recovery = FleetRecoveryConfig(health_poll_s=0.5)
    fleet = await VLLMFleet.connect(
        VLLMFleetConfig(urls=(vllm_server.url,), server=config, recovery=recovery)
    )
    try:
        in_flight = asyncio.create_task(fleet.generate(PROMPTS[0], SamplingParams(max_tokens=800, seed=0)))
        await asyncio.sleep(1.0)
        vllm_server.process.kill()
        with pytest.raises(EngineError, match=f"every vLLM server is down: {vllm_server.url}"):
            await asyncio.wait_for(in_flight, 60)
        # a new request waits for the server's return, bounded (here 3 s), then fails naming it
        with pytest.raises(
            ServerDownError,
            match=f"none came back within 3 s.*{vllm_server.url}.*--vllm-server-return-timeout-s",
        ):
            await asyncio.wait_for(fleet.generate(PROMPTS[1], SamplingParams(max_tokens=4)), 60)
    finally:
        await fleet.aclose()


async def test_vllm_server_is_a_distillation_teacher(engine, vllm_server, tmp_path):
    """Teacher-forced scoring through ``/v1/completions`` with ``prompt_logprobs``: the logprobs of a
    transformers forward pass of the served weights; ``vllm:URL`` connects as a teacher after the tokenizer
    check, which refuses a policy that tokenizes differently (folder and ``/tokenize`` probe alike)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.training.distillation import TeacherScorer, score_trajectory
    from components.training.server_teachers import _require_same_tokenization, connect_server_teacher
    from tests.components.training.training_synthetic import make_segment, make_trajectory

    ids = [1, 100, 200, 300, 400, 500, 42, 7]
    scored = await engine.logprobs_of(ids, 2)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    expected = [reference[i - 1, ids[i]].item() for i in range(2, len(ids))]
    assert len(scored) == len(expected)
    assert max(abs(a - b) for a, b in zip(scored, expected, strict=True)) < LOGPROB_TOLERANCE
    teacher = await connect_server_teacher(f"vllm:{vllm_server.url}", policy_model=vllm_server.model_dir)
    try:
        assert isinstance(teacher, TeacherScorer)
        trajectory = make_trajectory("t", "g", 1.0, (make_segment(3, 5, seed=2, vocab=1000),))
        (segment,) = (await score_trajectory(teacher, trajectory)).segments
        sampled = segment.loss_mask == 1
        assert (segment.teacher_logprobs[sampled] < 0).all() and (
            segment.teacher_logprobs[~sampled] == 0
        ).all()
        await _require_same_tokenization(teacher, vllm_server.model_dir, "distillation.teachers", "x")
        other = AutoTokenizer.from_pretrained(vllm_server.model_dir)
        other.add_tokens(["The quick"])  # another tokenizer: the probe text splits differently
        other.save_pretrained(tmp_path / "other")
        with pytest.raises(ValueError, match="distillation.teachers: the vLLM teacher x tokenizes"):
            await _require_same_tokenization(teacher, tmp_path / "other", "distillation.teachers", "x")
        with pytest.raises(ValueError, match="distillation.teachers: .* tokenizes differently"):
            await connect_server_teacher(f"vllm:{vllm_server.url}", policy_model=tmp_path / "other")
    finally:
        await teacher.aclose()
