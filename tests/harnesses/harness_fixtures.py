"""Shared fixtures of the harness and rollout-runner tests: a real proxy over real HTTP (in the test's event
loop), a real bubblewrap sandbox pool, the real SWE grader, built-in tasks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from components.engine.scripted import ScriptedEngine
from components.proxy.config import ProxyConfig
from components.proxy.server import ProxyServer
from components.proxy.sessions import LocalSessionRegistry
from components.tasks.builtin import load_builtin_tasks
from components.tasks.grading import SweGrader
from components.tasks.swe import SweTask, python_tool_paths
from sandboxes.bwrap import BwrapSandbox
from sandboxes.pool import SandboxPool, SandboxPoolConfig

SLUGIFY_TASK_ID = "minilib-text-slugify-edges"


@dataclass
class RunningProxy:
    server: ProxyServer
    registry: LocalSessionRegistry
    engine: Any

    @property
    def url(self) -> str:
        return self.server.url


@contextlib.asynccontextmanager
async def running_proxy(engine: Any, tokenizer: Any, **config_fields: Any) -> AsyncIterator[RunningProxy]:
    """A proxy on a free loopback port, serving ``engine``, in the running event loop."""
    if not {"api_key", "admin_key", "insecure_open_control_plane"} & config_fields.keys():
        # These tests exercise protocols and harnesses, not auth: they opt out of the closed default
        # explicitly (the control plane and session tokens are attacked in test_control_plane.py).
        config_fields["insecure_open_control_plane"] = True
    config = ProxyConfig(port=0, **config_fields)
    registry = LocalSessionRegistry(engine, tokenizer, config)
    server = ProxyServer(registry, config)
    await server.start()
    try:
        yield RunningProxy(server=server, registry=registry, engine=engine)
    finally:
        await server.stop()


async def run_rollout(proxy: RunningProxy, harness: Any, sandboxes: Any, grader: Any, task: Any) -> Any:
    """One rollout of ``task`` by ``harness`` through ``proxy``, graded by ``grader`` (the runner's own path)."""
    from components.rollout import RolloutConfig, RolloutRunner

    runner = RolloutRunner(
        RolloutConfig(group_size=1, max_concurrency=1, harness_timeout_s=400),
        harness=harness,
        sandboxes=sandboxes,
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=grader,
    )
    [trajectory] = await runner.run([task], step=0)
    return trajectory


@pytest.fixture
def scripted_proxy(tokenizer) -> Callable[..., contextlib.AbstractAsyncContextManager[RunningProxy]]:
    """``async with scripted_proxy(script) as proxy``: a real proxy in front of a ``ScriptedEngine``."""

    def make(script: Any, *, context_window: int = 32768, **config_fields: Any):
        engine = ScriptedEngine(tokenizer, script, context_window=context_window)
        return running_proxy(engine, tokenizer, **config_fields)

    return make


@pytest.fixture(scope="session")
def builtin_tasks(tmp_path_factory) -> dict[str, SweTask]:
    """The built-in SWE tasks by id (snapshots cached in a per-session directory)."""
    tasks = load_builtin_tasks(cache_dir=tmp_path_factory.mktemp("task-cache"))
    return {task.task_id: task for task in tasks}


@pytest.fixture
def slugify_task(builtin_tasks) -> SweTask:
    return builtin_tasks[SLUGIFY_TASK_ID]


@pytest.fixture
async def sandbox_pool() -> AsyncIterator[SandboxPool]:
    """A small warm bubblewrap pool whose sandboxes can run the project's Python (pytest, mini)."""
    pool = SandboxPool(SandboxPoolConfig(num_warm=2, read_only_paths=python_tool_paths()))
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def swe_grader() -> SweGrader:
    """The real grader: fresh cold bubblewrap sandboxes, hidden tests, no network."""
    return SweGrader(BwrapSandbox.create)
