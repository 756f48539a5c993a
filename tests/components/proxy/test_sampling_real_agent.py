"""#13.1 end to end with a real black-box agent: mini-swe-agent sends its own ``temperature`` / ``top_p``; the
proxy samples with the run's distribution by default (or the agent's with ``agent_sampling``), records it per
segment into the store, and the trainer's logprobs of the stored trajectory agree with the rollout's token
for token (max abs difference, not a mean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.protocols import SessionOpen, SessionOutcome
from components.proxy.config import ProxyConfig
from components.proxy.server import ProxyServer
from components.proxy.sessions import LocalSessionRegistry
from components.sampling import SamplingDistribution
from components.trajectory_store import TrajectoryStore
from tests.components.training.signal_helpers import load_model, max_abs_gap
from tests.required_tools import require_tool

pytestmark = pytest.mark.slow

RUN = SamplingDistribution(temperature=0.7, top_p=0.9, top_k=40)
AGENT = SamplingDistribution(temperature=0.3, top_p=0.6)  # what the agent asks for (OpenAI has no top_k)
AGREEMENT = 1e-4


def _mini() -> Path:
    return require_tool(Path(sys.prefix) / "bin" / "mini", "pip install mini-swe-agent (the test extra)")


def _run_mini(mini: Path, base_url: str, api_key: str, tmp_path: Path) -> dict:
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "MSWEA_CONFIGURED": "true",
        "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".mini"),
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_SILENT_STARTUP": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    trajectory_file = tmp_path / "mini.traj.json"
    argv = [
        str(mini), "-y", "--exit-immediately", "-m", "openai/rein-policy", "-t", "Say hello.",
        "-o", str(trajectory_file),
        "-c", "mini.yaml",
        "-c", f"model.model_kwargs.api_base={base_url}/v1",
        "-c", f"model.model_kwargs.api_key={api_key}",
        "-c", f"model.model_kwargs.temperature={AGENT.temperature}",
        "-c", f"model.model_kwargs.top_p={AGENT.top_p}",
        "-c", "environment.environment_class=local",
        "-c", "agent.step_limit=2",
        "-c", "agent.cost_limit=0",
    ]  # fmt: skip
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        argv, env=env, cwd=work, capture_output=True, text=True, timeout=420, stdin=subprocess.DEVNULL
    )
    info = json.loads(trajectory_file.read_text())["info"]
    assert info["model_stats"]["api_calls"] >= 1, (run.stdout + run.stderr)[-3000:]
    return info


@pytest.mark.parametrize("agent_sampling", [False, True], ids=["run-sampling", "agent-sampling"])
def test_mini_swe_agent_sampling_settings_train_rollout_agreement(tiny_model_dir, tmp_path, agent_sampling):
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.providers import EmbeddedEngineBrickConfig

    mini = _mini()
    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, settings=EmbeddedEngineBrickConfig(threads=2))
    )
    config = ProxyConfig(
        port=0,
        max_completion_tokens=48,
        run_dir=tmp_path / "run",
        sampling=RUN,
        agent_sampling=agent_sampling,
    )
    server = ProxyServer(LocalSessionRegistry(engine, engine.tokenizer, config), config)
    server.start_in_thread()
    try:
        session_id = server.call(lambda: server.registry.open_session(SessionOpen(harness="mini-swe-agent")))
        _run_mini(
            mini, server.session_url(session_id), config.session_keys.session_token(session_id), tmp_path
        )
        server.call(
            lambda: server.registry.finalize(
                session_id, SessionOutcome(reward=1.0, status="turn_limit", failure_reason="bound")
            )
        )
    finally:
        server.stop_thread()
        engine.close()

    (trajectory,) = TrajectoryStore(tmp_path / "run").read_all().trajectories
    expected = AGENT if agent_sampling else RUN
    assert trajectory.segments and all(s.sampling == expected for s in trajectory.segments)
    assert sum(s.num_sampled_tokens for s in trajectory.segments) > 0
    gap = max_abs_gap(load_model(tiny_model_dir), [trajectory])
    print(
        f"mini-swe-agent ({'agent' if agent_sampling else 'run'} sampling {expected}): "
        f"{sum(s.num_sampled_tokens for s in trajectory.segments)} sampled tokens, "
        f"max |train - rollout| logprob {gap:.2e}"
    )
    assert gap <= AGREEMENT
