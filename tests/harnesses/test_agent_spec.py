"""A black-box agent declared as data (``harnesses.agent_spec``): templates filled per run, unset values drop
what names them, config files written from data, exits mapped by declared rules. The declared agents' real runs
are in ``test_blackbox.py`` and ``test_node_agents.py``."""

from __future__ import annotations

import json
import tomllib

import pytest

from components.trajectory import TrajectoryStatus
from harnesses.agent_spec import AgentSpec, ExitRules, JsonFile, OutputRule, TomlFile
from harnesses.blackbox import AgentExit, BlackBoxAgent, BlackBoxConfig

SPEC = AgentSpec(
    name="demo",
    paths=("/nonexistent/demo-agent", "/usr"),
    argv=("demo", "--turns", "{max_turns}", ("--max-tokens", "{max_output_tokens}"), "{prompt}"),
    env={"DEMO_URL": "{base_url}/v1", "DEMO_CAP": "{max_output_tokens}", "DEMO_WALL": "{wall_time_s}"},
    home_files={
        ".demo/config.json": JsonFile(
            {
                "model": "{model}",
                "turns": "{max_turns}",
                "cap": "{max_output_tokens}",
                "next": lambda values: values.max_turns + 1,
                "providers": {"{model}": {"key": "{api_key}"}},
            }
        ),
        ".demo/config.toml": TomlFile(
            {"model": "{model}", "retry": False, "provider": {"url": "{base_url}"}}
        ),
        ".demo/plain.txt": "home is {home}\n",
    },
    exit=ExitRules(
        exit_codes={53: TrajectoryStatus.TURN_LIMIT},
        rules=(OutputRule(r"connection refused", TrajectoryStatus.ENGINE_ERROR, "demo: {match}"),),
    ),
)


def _launch(max_output_tokens):
    config = BlackBoxConfig(max_turns=3, max_output_tokens=max_output_tokens, model="m1", wall_time_s=90)
    return SPEC.launch(
        prompt="fix {it}",
        base_url="http://h:1/s/abc",
        api_key="tok",
        home="/home/u/.rein-agent",
        config=config,
    )


def test_templates_are_filled_and_unset_values_drop_what_names_them():
    assert isinstance(SPEC, BlackBoxAgent)
    bounded, unbounded = _launch(64), _launch(None)
    # The prompt is a value, not a template: its braces stay.
    assert bounded.argv == ("demo", "--turns", "3", "--max-tokens", "64", "fix {it}")
    assert unbounded.argv == ("demo", "--turns", "3", "fix {it}")
    assert bounded.env == {"DEMO_URL": "http://h:1/s/abc/v1", "DEMO_CAP": "64", "DEMO_WALL": "90"}
    assert "DEMO_CAP" not in unbounded.env
    config = json.loads(bounded.home_files[".demo/config.json"])
    assert config == {"model": "m1", "turns": 3, "cap": 64, "next": 4, "providers": {"m1": {"key": "tok"}}}
    assert "cap" not in json.loads(unbounded.home_files[".demo/config.json"])
    toml = tomllib.loads(bounded.home_files[".demo/config.toml"])
    assert toml == {"model": "m1", "retry": False, "provider": {"url": "http://h:1/s/abc"}}
    assert bounded.home_files[".demo/plain.txt"] == "home is /home/u/.rein-agent\n"
    assert SPEC.read_only_paths() == ("/usr",)  # a missing install path is not bound


def test_exit_rules_map_timeout_codes_and_output():
    config = BlackBoxConfig()

    def ended(code, *, out="", timed_out=False):
        return SPEC.read_exit(AgentExit(exit_code=code, timed_out=timed_out, stdout=out, stderr=""), config)

    assert ended(0, out="connection refused")[0] == TrajectoryStatus.OK  # a clean exit is never re-read
    assert ended(124, timed_out=True)[0] == TrajectoryStatus.TIMEOUT
    assert ended(53)[0] == TrajectoryStatus.TURN_LIMIT
    status, reason, _ = ended(1, out="error: Connection refused by host")
    assert status == TrajectoryStatus.ENGINE_ERROR and reason == "demo: Connection refused"
    status, reason, _ = ended(3, out="boom")
    assert status == TrajectoryStatus.AGENT_ERROR and "status 3" in reason


def test_a_template_naming_an_unknown_value_fails():
    spec = AgentSpec(name="bad", paths=(), argv=("x", "{no_such_value}"))
    with pytest.raises(AttributeError, match="no_such_value"):
        spec.launch(prompt="p", base_url="u", api_key="k", home="/h/a/b", config=BlackBoxConfig())
