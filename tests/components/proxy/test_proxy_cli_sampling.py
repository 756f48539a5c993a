"""``rein proxy``'s run-sampling and routing-replay options, through the real command (a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from components.sampling import SamplingDistribution
from components.trajectory_store import TrajectoryStore
from tests.components.proxy.proxy_helpers import read_rein_proxy_start

pytestmark = pytest.mark.timeout(300)

REIN = Path(sys.executable).parent / "rein"


def serve_one_turn(model_dir: Path, run_dir: Path, flags: list[str]):
    """Start ``rein proxy`` with ``flags``, run one turn of an agent that sends its own sampling settings,
    finalize, and return the recorded segment."""
    command = [
        str(REIN),
        "proxy",
        "--model",
        str(model_dir),
        "--port",
        "0",
        "--run-dir",
        str(run_dir),
        *flags,
    ]
    proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, admin_key, _ = read_rein_proxy_start(proxy)
        admin = {"Authorization": f"Bearer {admin_key}"}  # closed by default: the key it printed to stderr
        session = httpx.post(f"{url}/sessions", headers=admin).json()
        client = OpenAI(base_url=f"{session['base_url']}/v1", api_key=session["api_key"], max_retries=0)
        reply = client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            temperature=0.3,
            top_p=0.5,
        )
        assert reply.usage.completion_tokens == 4
        finalized = httpx.post(f"{url}/s/{session['session_id']}/finalize", headers=admin, json={})
        assert finalized.json()["status"] == "ok"
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    store = TrajectoryStore(run_dir)
    (trajectory,) = [t for path in store.shard_paths() for t in store.read_shard(path)]
    (segment,) = trajectory.segments
    return segment


@pytest.mark.slow
def test_rein_proxy_samples_with_the_run_distribution_and_records_routes(tiny_moe_model_dir, tmp_path):
    flags = ["--temperature", "0.6", "--top-p", "0.9", "--top-k", "20", "--record-routed-experts"]
    segment = serve_one_turn(tiny_moe_model_dir, tmp_path / "run", flags)
    # The agent's temperature 0.3 / top_p 0.5 are ignored: the run's distribution is used and recorded.
    assert segment.sampling == SamplingDistribution(temperature=0.6, top_p=0.9, top_k=20)
    assert segment.routed_experts is not None
    num_positions = len(segment.token_ids) - 1  # the last sampled token is never fed back
    assert segment.routed_experts.shape[0] == num_positions and (segment.routed_experts >= 0).all()


@pytest.mark.slow
def test_rein_proxy_agent_sampling(tiny_model_dir, tmp_path):
    segment = serve_one_turn(tiny_model_dir, tmp_path / "run", ["--top-k", "20", "--agent-sampling"])
    assert segment.sampling == SamplingDistribution(temperature=0.3, top_p=0.5)  # the agent's own
    assert segment.routed_experts is None  # not asked for


def test_rein_proxy_refuses_truncated_sampling_with_sglang():
    """Before any server is contacted (the URL is dead): SGLang's logprobs ignore top-p / top-k."""
    for flags in (["--top-p", "0.9"], ["--top-k", "5"]):
        command = [str(REIN), "proxy", "--engine", "sglang", "--sglang-url", "http://127.0.0.1:9", *flags]
        completed = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert completed.returncode == 2, completed.stderr[-2000:]
        assert "--top-p 1 --top-k 0" in completed.stderr
    bad = subprocess.run([str(REIN), "proxy", "--top-p", "1.5"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "top_p" in bad.stderr
