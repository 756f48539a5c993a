"""Unmodified real agents (Claude Code, Codex CLI, mini-swe-agent) against the proxy with the tiny random
model. The model writes nonsense; what is checked is that each agent got well-formed protocol responses (it
exits cleanly or is stopped by its own turn bound, with no protocol/API error) and that the proxy recorded a
trajectory for the session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.protocols import SessionDescription, SessionOpen, SessionOutcome
from components.proxy.config import ProxyConfig
from components.proxy.server import ProxyServer
from components.proxy.sessions import LocalSessionRegistry
from tests.required_tools import require_tool

AGENTS_BIN = Path(__file__).resolve().parents[3] / ".agents" / "node_modules" / ".bin"
AGENT_TIMEOUT_S = 420

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_proxy(tiny_model_dir):
    from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
    from components.engine.providers import EmbeddedEngineBrickConfig

    engine = EmbeddedEngine(
        EmbeddedEngineConfig(model_path=tiny_model_dir, settings=EmbeddedEngineBrickConfig(threads=2))
    )
    # Agents ask for up to 32k output tokens; 48 keeps a random model's turns short.
    config = ProxyConfig(port=0, max_completion_tokens=48, keepalive_interval_s=2.0)
    registry = LocalSessionRegistry(engine, engine.tokenizer, config)
    server = ProxyServer(registry, config)
    server.start_in_thread()
    yield server
    server.stop_thread()
    engine.close()


def _token(server: ProxyServer, session_id: str) -> str:
    """The session's capability token: the one key an agent gets from the (closed by default) proxy."""
    return server.config.session_keys.session_token(session_id)


def _binary(name: str) -> Path:
    return require_tool(AGENTS_BIN / name, "run `make .agents/.installed` (npm install of the agents)")


def _env(home: Path, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "NO_COLOR": "1", **extra}


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=AGENT_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _recorded(server: ProxyServer, session_id: str) -> SessionDescription:
    record = server.call(lambda: server.registry.describe(session_id))
    assert record.num_turns >= 1, record
    assert any(sum(segment["loss_mask"]) > 0 for segment in record.segments)
    trajectory = server.call(
        lambda: server.registry.finalize(
            session_id, SessionOutcome(reward=0.0, status="turn_limit", failure_reason="test bound")
        )
    )
    assert trajectory.trainable and trajectory.segments
    return record


def test_claude_code(tiny_proxy, tmp_path):
    claude = _binary("claude")
    session_id = tiny_proxy.call(lambda: tiny_proxy.registry.open_session(SessionOpen(harness="claude-code")))
    home = tmp_path / "home"
    home.mkdir()
    (home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    env = _env(
        home,
        ANTHROPIC_BASE_URL=tiny_proxy.session_url(session_id),
        ANTHROPIC_API_KEY=_token(tiny_proxy, session_id),  # the closed default: its own token only
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    run = _run(
        [str(claude), "-p", "Say hello.", "--max-turns", "2", "--output-format", "json"],
        env,
        tmp_path / "work",
    )
    output = run.stdout + run.stderr
    assert "API Error" not in output, output[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result.get("subtype") in ("success", "error_max_turns"), output[-3000:]
    record = _recorded(tiny_proxy, session_id)
    assert max(len(s["token_ids"]) for s in record.segments) > 5000  # Claude Code's long system prompt
    print("claude-code segments:", [(s["reason"], len(s["token_ids"])) for s in record.segments])


def test_codex(tiny_proxy, tmp_path):
    codex = _binary("codex")
    session_id = tiny_proxy.call(lambda: tiny_proxy.registry.open_session(SessionOpen(harness="codex")))
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(
        "\n".join(
            [
                'model = "gpt-5-codex"',
                'model_provider = "rein"',
                'approval_policy = "never"',
                'sandbox_mode = "read-only"',
                "check_for_update_on_startup = false",
                "[model_providers.rein]",
                'name = "rein"',
                f'base_url = "{tiny_proxy.session_url(session_id)}/v1"',
                'wire_api = "responses"',
                'env_key = "OPENAI_API_KEY"',
                "request_max_retries = 0",
                "stream_max_retries = 0",
                "[analytics]",
                "enabled = false",
            ]
        )
    )
    env = _env(home, OPENAI_API_KEY=_token(tiny_proxy, session_id), CODEX_HOME=str(home / ".codex"))
    run = _run([str(codex), "exec", "--skip-git-repo-check", "--json", "Say hello."], env, tmp_path / "work")
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert any(e.get("type") == "turn.completed" for e in events), output[-3000:]
    assert not any(e.get("type") in ("error", "turn.failed") for e in events), output[-3000:]
    _recorded(tiny_proxy, session_id)


def test_mini_swe_agent(tiny_proxy, tmp_path):
    mini = require_tool(Path(sys.prefix) / "bin" / "mini", "pip install mini-swe-agent (the test extra)")
    session_id = tiny_proxy.call(
        lambda: tiny_proxy.registry.open_session(SessionOpen(harness="mini-swe-agent"))
    )
    home = tmp_path / "home"
    trajectory_file = tmp_path / "mini.traj.json"
    env = _env(
        home,
        MSWEA_CONFIGURED="true",
        MSWEA_GLOBAL_CONFIG_DIR=str(home / ".mini"),
        MSWEA_COST_TRACKING="ignore_errors",
        MSWEA_SILENT_STARTUP="1",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    argv = [
        str(mini), "-y", "--exit-immediately", "-m", "openai/rein-policy", "-t", "Say hello.", "-o", str(trajectory_file),
        "-c", "mini.yaml",
        "-c", f"model.model_kwargs.api_base={tiny_proxy.session_url(session_id)}/v1",
        "-c", f"model.model_kwargs.api_key={_token(tiny_proxy, session_id)}",
        "-c", "environment.environment_class=local",
        "-c", "agent.step_limit=2",
        "-c", "agent.cost_limit=0",
    ]  # fmt: skip
    run = _run(argv, env, tmp_path / "work")
    output = run.stdout + run.stderr
    info = json.loads(trajectory_file.read_text())["info"]
    assert info["exit_status"] in ("LimitsExceeded", "Submitted", "FormatError"), (
        info["exit_status"],
        output[-3000:],
    )
    assert info["model_stats"]["api_calls"] >= 1
    _recorded(tiny_proxy, session_id)
