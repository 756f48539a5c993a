"""Recipe configs: nested brick configs on one flat command line, ``--config FILE`` (YAML/JSON) under CLI
overrides, ``--help`` listing every field, and errors naming the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pytest

from components.config import require_positive
from components.recipe_config import config_to_json, option, parse_config


@dataclass(kw_only=True, frozen=True)
class TrainerBrick:
    workers: int = option(2, "FSDP workers")
    learning_rate: float = option(1e-5, "AdamW learning rate", flag="learning-rate")

    def __post_init__(self) -> None:
        require_positive(self.workers, "workers")


@dataclass(kw_only=True, frozen=True)
class EngineBrick:
    backend: Literal["embedded", "sglang"] = option("embedded", "which engine", flag="engine")
    urls: tuple[str, ...] = option((), "server URLs")


@dataclass(kw_only=True, frozen=True)
class ToyRecipeConfig:
    num_steps: int = option(2, "training steps")
    trainer: TrainerBrick = option(TrainerBrick(), "the trainer brick")
    engine: EngineBrick = option(EngineBrick(backend="sglang"), "the engine brick")


def test_flat_flags_reach_nested_fields():
    config = parse_config(
        ToyRecipeConfig,
        ["--trainer-workers", "4", "--learning-rate", "3e-4", "--engine-urls", "http://a,http://b"],
    )
    assert config.trainer == TrainerBrick(workers=4, learning_rate=3e-4)
    assert config.engine.urls == ("http://a", "http://b")
    assert config.engine.backend == "sglang"  # the recipe's default for the brick is kept
    assert parse_config(ToyRecipeConfig, ["--engine", "embedded"]).engine.backend == "embedded"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_then_command_line_overrides(tmp_path, suffix):
    fields = {
        "num_steps": 7,
        "trainer": {"workers": 3, "learning_rate": 1e-4},
        "engine": {"urls": ["http://x"]},
    }
    path = tmp_path / f"run{suffix}"
    if suffix == ".yaml":
        path.write_text(
            "num_steps: 7\ntrainer:\n  workers: 3\n  learning_rate: 1.0e-4\nengine:\n  urls: [http://x]\n"
        )
    else:
        path.write_text(json.dumps(fields))
    config = parse_config(ToyRecipeConfig, ["--config", str(path), "--trainer-workers", "5"])
    assert (
        config.num_steps == 7 and config.trainer.learning_rate == 1e-4 and config.engine.urls == ("http://x",)
    )
    assert config.trainer.workers == 5  # the command line wins over the file
    assert json.loads(config_to_json(config))["trainer"] == {"workers": 5, "learning_rate": 1e-4}


@pytest.mark.parametrize(
    ("argv", "file_text", "message"),
    [
        (["--trainer-workers", "0"], None, "trainer.workers: must be > 0"),
        ([], "trainer:\n  workers: -1\n", "trainer.workers: must be > 0"),
        ([], "trainer:\n  threads: 2\n", "trainer.threads: no such field"),
        ([], "engine:\n  backend: vllm\n", "engine.backend: must be one of"),
        ([], "num_steps: many\n", "num_steps: expected int"),
        (["--engine", "vllm"], None, "invalid choice"),
        ([], "engine:\n  urls: 5\n", "engine.urls: expected a list or comma-separated items"),
        (["--trainer-workers", "2"], "trainer: 5\n", "trainer: expected a mapping of its fields"),
    ],
)
def test_bad_values_name_the_field(tmp_path, capsys, argv, file_text, message):
    if file_text is not None:
        (tmp_path / "bad.yaml").write_text(file_text)
        argv = [*argv, "--config", str(tmp_path / "bad.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        parse_config(ToyRecipeConfig, argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_every_field_with_meaning_and_default(capsys):
    with pytest.raises(SystemExit):
        parse_config(ToyRecipeConfig, ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, meaning, default in [
        ("--num-steps", "training steps", "(default: 2)"),
        ("--trainer-workers", "FSDP workers", "(default: 2)"),
        ("--learning-rate", "AdamW learning rate", "(default: 1e-05)"),
        ("--engine ", "which engine", "(default: sglang)"),
        ("--engine-urls", "server URLs", "(default: )"),
        ("--config", "YAML or JSON", ""),
    ]:
        assert flag in text and f"{meaning}" in text and default in text, flag
    assert (
        "trainer brick: the trainer brick" in text and "engine brick: the engine brick" in text
    )  # + meaning


def test_run_config_bricks_keep_their_flags_and_nest_in_files(tmp_path, capsys):
    from components.engine.providers import SGLangBrickConfig
    from components.proxy.providers import LocalProxyConfig, ServeProxyConfig
    from components.run.config import RunConfig

    flags = [
        "--model",
        "tiny",
        "--engine",
        "sglang",
        "--sglang-url",
        "http://127.0.0.1:9",
        "--sglang-colocated",
    ]
    flags += ["true", "--proxy", "serve", "--proxy-replicas", "1"]
    flags += ["--max-concurrency", "6", "--max-staleness", "2", "--temperature", "0.7", "--max-tokens", "32"]
    flags += ["--wandb-mode", "disabled", "--trainer-workers", "1"]
    from_flags = parse_config(RunConfig, flags)
    assert type(from_flags.engine) is SGLangBrickConfig
    assert from_flags.engine.url == "http://127.0.0.1:9" and from_flags.engine.colocated
    assert (type(from_flags.proxy), from_flags.proxy.replicas) == (ServeProxyConfig, 1)
    assert type(parse_config(RunConfig, ["--model", "tiny", "--proxy", "local"]).proxy) is LocalProxyConfig
    assert (from_flags.rollout.max_concurrency, from_flags.rollout.max_staleness) == (6, 2)
    assert (from_flags.sampling.temperature, from_flags.sampling.max_tokens) == (0.7, 32)
    assert from_flags.monitoring.wandb_mode == "disabled" and from_flags.trainer.num_workers == 1
    (tmp_path / "run.yaml").write_text(
        "model: tiny\nengine: {kind: sglang, url: 'http://127.0.0.1:9', colocated: true}\n"
        "proxy: {kind: serve, replicas: 1}\nrollout: {max_concurrency: 6, max_staleness: 2}\n"
        "sampling: {temperature: 0.7, max_tokens: 32}\nmonitoring: {wandb_mode: disabled}\ntrainer: {num_workers: 1}\n"
    )
    assert parse_config(RunConfig, ["--config", str(tmp_path / "run.yaml")]) == from_flags
    for argv, message in [
        (["--model", "tiny", "--engine-threads", "0"], "engine.threads: must be > 0"),
        (
            ["--model", "tiny", "--rollout-mode", "partial", "--max-staleness", "0"],
            "rollout.max_staleness: must be",
        ),
        (["--model", "tiny", "--sglang-colocated", "true"], "unrecognized arguments: --sglang-colocated"),
        (
            [
                "--model",
                "tiny",
                "--engine",
                "sglang",
                "--sglang-url",
                "http://a:1",
                "--sglang-colocated",
                "true",
            ]
            + ["--rollout-mode", "async"],
            "engine.colocated: needs rollout mode sync",
        ),
        (["--model", "tiny", "--engine", "sglang"], "engine.url: needs at least one"),
        (
            ["--model", "tiny", "--engine", "vllm-nope"],
            "invalid choice: 'vllm-nope' (choose from 'embedded', 'sglang', 'vllm')",
        ),
        (["--model", "tiny", "--top-p", "0"], "sampling.top_p: must be in (0, 1]"),
    ]:
        with pytest.raises(SystemExit):
            parse_config(RunConfig, argv)
        assert message in capsys.readouterr().err, argv
