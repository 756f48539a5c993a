"""``rein proxy``'s flags are one config tree (``StandaloneProxyConfig``) parsed as the recipes' are: ``--config
FILE`` with flags over it, ``--help`` listing every field, the historical spellings, ``$REIN_PROXY_ADMIN_KEY``.
Every field reaching what it configures: ``tests/components/test_config_reach.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from components.proxy.cli import StandaloneProxyConfig, parse_proxy_config
from components.recipe_config import _leaves, command_line_flags
from components.sampling import SamplingDistribution
from components.trajectory_store import TrajectoryStore
from tests.components.proxy.proxy_helpers import read_rein_proxy_start

pytestmark = pytest.mark.timeout(300)

REIN = Path(sys.executable).parent / "rein"
DEAD_URL = "http://127.0.0.1:9"
ENGINE_KINDS = {"embedded": [], "sglang": ["--sglang-url", DEAD_URL], "vllm": ["--vllm-url", DEAD_URL]}
# The spellings the README, the module docstring and the scripts use (before the tree, a hand-written parser).
SPELLINGS = {
    "embedded": (
        "--model --host --port --run-dir --api-key --admin-key --admin-key-file --insecure-open-control-plane "
        "--keepalive-s --max-tokens --max-completion-tokens --engine --threads --temperature --top-p --top-k "
        "--agent-sampling --record-routed-experts --tool-format --reasoning-format"
    ).split(),
    "sglang": (
        "--sglang-url --sglang-api-key --sglang-admin-api-key --sglang-startup-timeout-s "
        "--sglang-request-timeout-s --context-window"
    ).split(),
    "vllm": "--vllm-url --vllm-api-key --vllm-startup-timeout-s --context-window".split(),
}


@pytest.mark.parametrize("kind", sorted(ENGINE_KINDS))
def test_help_lists_every_field_and_every_historical_spelling(kind, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_proxy_config(["--engine", kind, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    leaves = _leaves(StandaloneProxyConfig, kinds={("engine",): kind})
    assert len(leaves) > 25  # the proxy's fields, sampling, formats, the engine kind's
    missing = [f"--{flag}" for leaf in leaves for flag in leaf.flags if f"--{flag} " not in text]
    assert not missing, f"--help does not list: {missing}"
    known = command_line_flags(StandaloneProxyConfig, ["--engine", kind])
    spellings = {*SPELLINGS["embedded"], *SPELLINGS[kind]} - ({"--threads"} if kind != "embedded" else set())
    assert spellings <= known, spellings - known
    assert "$REIN_PROXY_ADMIN_KEY" in text and "INSECURE" in text  # the docstring and the fields' meanings


def test_a_config_file_sets_the_tree_and_flags_override_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("REIN_PROXY_ADMIN_KEY", raising=False)
    config_file = tmp_path / "proxy.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "port": 0,
                "max_tokens": 7,  # not a field: refused below, naming the known ones
            }
        )
    )
    with pytest.raises(SystemExit) as refused:
        parse_proxy_config(["--config", str(config_file)])
    assert refused.value.code == 2 and "max_tokens: no such field" in capsys.readouterr().err
    config_file.write_text(
        yaml.safe_dump(
            {
                "port": 0,
                "default_max_tokens": 7,
                "engine": {"kind": "sglang", "url": DEAD_URL, "context_window": 512},
                "sampling": {"temperature": 0.5},
                "formats": {"tool_format": "hermes"},
                "admin_key_file": str(tmp_path / "admin.key"),
            }
        )
    )
    config = parse_proxy_config(
        ["--config", str(config_file), "--temperature", "0.7", "--context-window", "256"]
    )
    assert (config.port, config.default_max_tokens, config.formats.tool_format) == (0, 7, "hermes")
    assert config.sampling == SamplingDistribution(temperature=0.7)  # the flag over the file's 0.5
    assert (config.engine.url, config.engine.context_window) == (DEAD_URL, 256)  # the kind from the file
    assert config.admin_key_file == tmp_path / "admin.key" and config.admin_key_generated
    # A cross-brick refusal names what to change whichever source set it: SGLang cannot record top-p logprobs.
    with pytest.raises(SystemExit) as refused:
        parse_proxy_config(["--config", str(config_file), "--top-p", "0.9"])
    assert refused.value.code == 2 and "--top-p 1 --top-k 0" in capsys.readouterr().err


def test_the_admin_key_defaults_to_the_environment_and_a_flag_overrides_it(monkeypatch):
    environment_key, flag_key = "e" * 40, "f" * 40
    monkeypatch.setenv("REIN_PROXY_ADMIN_KEY", environment_key)
    config = parse_proxy_config([])
    assert config.admin_key == environment_key and not config.admin_key_generated
    assert parse_proxy_config(["--admin-key", flag_key]).admin_key == flag_key
    monkeypatch.delenv("REIN_PROXY_ADMIN_KEY")
    generated = parse_proxy_config([])
    assert generated.admin_key_generated and generated.admin_key not in (environment_key, flag_key)


def test_rein_proxy_serves_from_a_config_file_with_a_flag_over_it(tiny_model_dir, tmp_path):
    """The real command: the file picks the model, the port, the run dir, the key file, the sampling and a
    completion budget; ``--max-tokens`` on the command line wins over the file's."""
    key_file = tmp_path / "admin.key"
    config_file = tmp_path / "proxy.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "port": 0,
                "run_dir": str(tmp_path / "run"),
                "admin_key_file": str(key_file),
                "default_max_tokens": 2,
                "sampling": {"temperature": 0.5},
                "engine": {"kind": "embedded", "threads": 1},
            }
        )
    )
    command = [str(REIN), "proxy", "--config", str(config_file), "--max-tokens", "3"]
    proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, printed_key, banner = read_rein_proxy_start(proxy)
        assert str(tiny_model_dir) in banner and not printed_key  # the key went to the file only
        admin = {"Authorization": f"Bearer {key_file.read_text().strip()}"}
        session = httpx.post(f"{url}/sessions", headers=admin).json()
        client = OpenAI(base_url=f"{session['base_url']}/v1", api_key=session["api_key"], max_retries=0)
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        assert reply.usage.completion_tokens == 3  # no max_tokens in the request: the flag's budget
        finalized = httpx.post(f"{url}/s/{session['session_id']}/finalize", headers=admin, json={})
        assert finalized.json()["status"] == "ok"
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    store = TrajectoryStore(tmp_path / "run")
    (trajectory,) = [t for path in store.shard_paths() for t in store.read_shard(path)]
    assert trajectory.segments[0].sampling == SamplingDistribution(temperature=0.5)  # the file's
