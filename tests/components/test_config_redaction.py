"""Credentials never reach RUN_DIR/config.json (or the tracker's run config): redacted, their field names kept."""

from __future__ import annotations

import dataclasses
import json
import logging

from components.engine.providers import SGLangBrickConfig
from components.recipe_config import REDACTED, config_to_json
from components.run.config import RunConfig
from components.run.directory import RunDirectory


def test_run_directory_config_json_holds_no_secret(tmp_path):
    config = RunConfig(
        model="tiny",
        engine=SGLangBrickConfig(
            url="http://127.0.0.1:9", api_key="user-secret-1234", admin_api_key="admin-secret-5678"
        ),
        run_dir=str(tmp_path / "run"),
    )
    before = set(logging.getLogger().handlers)
    try:
        run = RunDirectory.create(config, recipe="test")
    finally:
        for handler in set(logging.getLogger().handlers) - before:
            logging.getLogger().removeHandler(handler)
            handler.close()
    text = (run.path / "config.json").read_text()
    assert "user-secret-1234" not in text and "admin-secret-5678" not in text
    recorded = json.loads(text)
    assert recorded["engine"]["api_key"] == REDACTED and recorded["engine"]["admin_api_key"] == REDACTED
    assert recorded["engine"]["url"] == "http://127.0.0.1:9" and recorded["engine"]["kind"] == "sglang"
    assert recorded["sampling"]["max_tokens"] == config.sampling.max_tokens


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Judge:
    judge_api_key: str | None = None
    admin_key: str | None = None
    hf_token: str = ""
    max_tokens: int = 64
    num_prompt_tokens: int = 3
    env: dict | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Run:
    api_key: str = "top-level-secret"
    judge: _Judge = dataclasses.field(default_factory=_Judge)


def test_config_to_json_redacts_every_credential_field_and_keeps_the_rest():
    judge = _Judge(
        judge_api_key="sk-judge",
        admin_key="adm",
        env={"OPENAI_API_KEY": "sk-env", "GITHUB_TOKEN": "ghp", "PATH": "/usr/bin"},
    )
    recorded = json.loads(config_to_json(_Run(judge=judge)))
    assert recorded["api_key"] == REDACTED
    assert recorded["judge"] == {
        "judge_api_key": REDACTED,
        "admin_key": REDACTED,
        "hf_token": "",  # unset: nothing to hide, and the record shows no token was given
        "max_tokens": 64,
        "num_prompt_tokens": 3,
        "env": {"OPENAI_API_KEY": REDACTED, "GITHUB_TOKEN": REDACTED, "PATH": "/usr/bin"},
    }
    assert json.loads(config_to_json(_Run(api_key="")))["api_key"] == ""
