"""Operating SGLang servers: the client travels into other processes, start-up waits for /health with a clear
timeout, the admin API key guards the control endpoints, colocated memory release/resume, and
``rein proxy --engine sglang`` serving a real agent request through the fake SGLang server."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import torch
from ray import cloudpickle

from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from components.engine.sglang import SGLangEngineConfig
from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
from components.errors import EngineError
from components.protocols import SamplingParams
from components.trajectory_store import TrajectoryStore
from tests.components.engine.fake_sglang import FakeSGLangProcess, FakeSGLangServer
from tests.components.proxy.proxy_helpers import one_reply_through_rein_proxy, read_rein_proxy_start

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir):
    """A fake SGLang server started with ``--api-key user-key --admin-api-key admin-key``."""
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=tiny_model_dir, eos_token_ids=()))
    with FakeSGLangServer(engine, tiny_model_dir, api_key="user-key", admin_api_key="admin-key") as server:
        yield server
    engine.close()


USER_KEY = {"api_key": "user-key"}  # --sglang-* settings
ADMIN_KEYS = {"api_key": "user-key", "admin_api_key": "admin-key"}


def fleet_config(url: str, settings: dict[str, str | float], **options) -> SGLangFleetConfig:
    server = replace(SGLangEngineConfig.for_url(url, **settings), **options)
    return SGLangFleetConfig(urls=(url,), server=server)


async def test_the_fleet_travels_into_another_process_and_opens_its_own_connections(keyed_server):
    fleet = await SGLangFleet.connect(fleet_config(keyed_server.url, settings=ADMIN_KEYS))
    await fleet.generate([1, 2, 3], SamplingParams(max_tokens=2))  # this process's HTTP client is open
    copy = cloudpickle.loads(cloudpickle.dumps(fleet))  # what Ray does to the session-shard actors' argument
    results = []
    # Another event loop in another thread, as in a session-shard actor.
    thread = threading.Thread(
        target=lambda: results.append(asyncio.run(copy.generate([4, 5, 6], SamplingParams(max_tokens=3))))
    )
    thread.start()
    thread.join(timeout=60)
    assert len(results[0].output_ids) == 3 and copy.context_window == fleet.context_window
    await fleet.aclose()


async def test_start_up_waits_for_health_then_times_out_naming_the_server(keyed_server):
    keyed_server.state.starting_until = time.monotonic() + 1.5  # SGLang answers 503 while it starts
    started = time.monotonic()
    fleet = await SGLangFleet.connect(fleet_config(keyed_server.url, settings=USER_KEY))
    assert time.monotonic() - started >= 1.0 and fleet.context_window > 0
    await fleet.aclose()
    keyed_server.state.starting_until = time.monotonic() + 60
    with pytest.raises(EngineError, match=rf"{keyed_server.url} did not answer GET /health .* within 2 s"):
        await SGLangFleet.connect(
            fleet_config(keyed_server.url, settings={**USER_KEY, "startup_timeout_s": 2})
        )
    keyed_server.state.starting_until = 0.0
    with pytest.raises(EngineError, match="did not answer GET /health"):  # nothing listens there
        await SGLangFleet.connect(
            fleet_config("http://127.0.0.1:9", settings={"startup_timeout_s": 1}, connect_timeout_s=0.5)
        )


async def test_admin_key_guards_control_endpoints(keyed_server, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(str(tiny_model_dir / "model.safetensors"))
    options = {"weight_sync_dir": tmp_path, "base_model_path": tiny_model_dir, "max_retries": 0}
    # A client with only the ordinary key can generate but cannot touch the weights.
    user_only = await SGLangFleet.connect(fleet_config(keyed_server.url, settings=USER_KEY, **options))
    await user_only.generate([1, 2], SamplingParams(max_tokens=2))
    with pytest.raises(EngineError, match="401"):
        await user_only.update_weights(weights, version=8)
    await user_only.aclose()
    assert keyed_server.state.weight_version != "8"
    # Weakened server (no --admin-api-key): the ordinary key then opens the control endpoints, so the same
    # client does change the weights - the admin key is what stops it.
    keyed_server.state.admin_api_key = None
    weakened = await SGLangFleet.connect(fleet_config(keyed_server.url, settings=USER_KEY, **options))
    await weakened.update_weights(weights, version=8)
    assert keyed_server.state.weight_version == "8"
    await weakened.aclose()
    keyed_server.state.admin_api_key = "admin-key"
    admin = await SGLangFleet.connect(fleet_config(keyed_server.url, settings=ADMIN_KEYS, **options))
    await admin.update_weights(weights, version=9)
    assert keyed_server.state.weight_version == "9" and admin.weight_version == 9
    await admin.aclose()
    # /health stays open without any key (liveness probes carry no secret).
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200
    assert httpx.get(f"{keyed_server.url}/v1/models").status_code == 401


async def test_colocated_memory_release_and_resume(keyed_server):
    fleet = await SGLangFleet.connect(fleet_config(keyed_server.url, settings=ADMIN_KEYS))
    await fleet.release_memory_occupation()
    assert keyed_server.state.released_tags == {"weights", "kv_cache"}
    with pytest.raises(EngineError, match="memory released"):
        await fleet.generate([1, 2], SamplingParams(max_tokens=2))
    await fleet.resume_memory_occupation(["weights"])
    assert keyed_server.state.released_tags == {"kv_cache"}
    await fleet.resume_memory_occupation(["kv_cache"])
    assert len((await fleet.generate([1, 2], SamplingParams(max_tokens=2))).output_ids) == 2
    await fleet.aclose()


@pytest.mark.slow
def test_rein_proxy_engine_sglang_serves_an_agent_request(tiny_model_dir, tmp_path):
    rein = Path(sys.executable).parent / "rein"
    with FakeSGLangProcess(
        tiny_model_dir, api_key="user-key", admin_api_key="admin-key", startup_delay_s=2
    ) as server:
        command = [
            str(rein), "proxy", "--engine", "sglang", "--sglang-url", server.url, "--sglang-api-key", "user-key",
            "--sglang-admin-api-key", "admin-key", "--model", str(tiny_model_dir), "--port", "0",
            "--run-dir", str(tmp_path / "run"),
        ]  # fmt: skip
        proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url, admin_key, banner = read_rein_proxy_start(proxy)
            match = re.search(r"\(context window (\d+)\)", banner)
            assert int(match.group(1)) > 0 and f"SGLang {server.url}" in banner
            # Closed by default: session control takes the admin key it printed once to stderr.
            assert httpx.post(f"{url}/sessions").status_code == 401
            one_reply_through_rein_proxy(url, admin_key)
            log = httpx.get(
                f"{server.url}/_fake/requests", headers={"Authorization": "Bearer user-key"}
            ).json()
            generated = [entry["input_ids"] for entry in log if entry["path"] == "/generate"]
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
    store = TrajectoryStore(tmp_path / "run")
    (trajectory,) = [t for path in store.shard_paths() for t in store.read_shard(path)]
    (segment,) = trajectory.segments
    # The trajectory's prompt is exactly what SGLang was asked to continue; its sampled tokens follow it.
    assert len(generated) == 1
    assert segment.token_ids[: len(generated[0])].tolist() == generated[0]
    assert int(segment.loss_mask.sum()) == 5


@pytest.mark.slow
def test_gpu_check_reports_each_check_and_what_it_could_not_run(tmp_path):
    """``bash benchmarks/gpu_check.sh`` on this machine: every GPU check is listed, none is faked."""
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.sh"
    completed = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    for check in ("fsdp2 bf16 step", "sglang server", "proxy session", "nccl weight sync"):
        (line,) = [line for line in lines if line.startswith(f"  {check}: ")]
        if not torch.cuda.is_available():
            assert "SKIPPED (" in line, line
    assert re.fullmatch(r"gpu_check: \d of 4 GPU checks ran \(target 4 of 4, < 480 s\)", lines[-1])
