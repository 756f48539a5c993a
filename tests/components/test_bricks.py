"""``Bricks.from_config``: the one place a config name picks a class; each brick satisfies its Protocol."""

from __future__ import annotations

import pytest

from components.engine.providers import (
    EmbeddedEngineProvider,
    EngineProvider,
    SGLangBrickConfig,
    SGLangEngineProvider,
)
from components.protocols import Algorithm, SandboxProvider
from components.proxy.providers import LocalProxyProvider, ProxyProvider, ServeProxyProvider
from components.recipe_config import parse_config
from components.run.config import RunConfig
from components.run.stack import Bricks
from components.training.algorithms import RLOO
from sandboxes import SandboxPool
from sandboxes.e2b import E2BSandboxProvider


def test_default_bricks_satisfy_their_protocols():
    bricks = Bricks.from_config(RunConfig(model="tiny"), sandbox_paths=("/opt", "/opt"))
    assert isinstance(bricks.engine, EngineProvider) and isinstance(bricks.engine, EmbeddedEngineProvider)
    assert isinstance(bricks.proxy, ProxyProvider) and isinstance(bricks.proxy, ServeProxyProvider)
    assert isinstance(bricks.algorithm, Algorithm)
    assert isinstance(bricks.sandboxes, SandboxProvider) and isinstance(bricks.sandboxes.inner, SandboxPool)
    assert bricks.sandboxes.inner.config.read_only_paths == ("/opt",)


def test_config_names_pick_the_bricks():
    config = parse_config(
        RunConfig,
        ["--model", "tiny", "--engine", "sglang", "--sglang-url", "http://127.0.0.1:1", "--proxy", "local"]
        + ["--algorithm", "rloo", "--sandbox-backend", "e2b", "--sandbox-template", "py"],
    )
    bricks = Bricks.from_config(config)
    assert isinstance(bricks.engine, SGLangEngineProvider)
    assert isinstance(bricks.proxy, LocalProxyProvider)
    assert isinstance(bricks.algorithm, RLOO)
    assert (
        isinstance(bricks.sandboxes.inner, E2BSandboxProvider)
        and bricks.sandboxes.inner.config.template == "py"
    )


async def test_providers_close_safely_when_never_started():
    bricks = Bricks.from_config(RunConfig(model="tiny"))
    for provider in (
        bricks.engine,
        bricks.proxy,
        LocalProxyProvider(),
        SGLangEngineProvider(SGLangBrickConfig(url="http://127.0.0.1:1")),
    ):
        await provider.close()
        await provider.close()


def test_brick_config_errors_name_the_field():
    from components.training.trainer_config import TrainerBrickConfig

    with pytest.raises(ValueError, match="num_workers: must be > 0"):
        TrainerBrickConfig(num_workers=0)
    with pytest.raises(SystemExit):  # the registered kinds are the flag's choices
        parse_config(RunConfig, ["--model", "tiny", "--sandbox-backend", "docker"])
