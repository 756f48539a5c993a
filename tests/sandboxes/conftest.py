"""Fixtures for the sandbox tests: sandboxes of every backend, host-side leak checks, a loopback TCP server."""

from __future__ import annotations

import asyncio

import pytest

from sandboxes.pool import SandboxPool, SandboxPoolConfig
from tests.sandboxes.sandbox_test_support import RAY_POOL_CONFIG, SandboxFactory


@pytest.fixture(scope="module")
async def warm_pool():
    """A small warm pool shared by the tests of one module."""
    async with SandboxPool(SandboxPoolConfig(num_warm=2)) as pool:
        yield pool


@pytest.fixture(scope="module")
def ray_node_pools(ray_session):
    """Per-node pool actors on the session's Ray cluster (started only for the tests that ask)."""
    from sandboxes.ray_pool import RaySandboxPool, shutdown_node_pools, start_node_pools

    handles = start_node_pools(RAY_POOL_CONFIG)  # the actors live as long as these handles
    yield RaySandboxPool(RAY_POOL_CONFIG)
    shutdown_node_pools(RAY_POOL_CONFIG)
    del handles


@pytest.fixture(params=["bwrap", "bwrap-pool", "ray-pool", "e2b-fake"])
async def make_sandbox(request, warm_pool):
    """A factory of sandboxes of each backend in turn (E2B against the in-process fake of its SDK)."""
    pool = request.getfixturevalue("ray_node_pools") if request.param == "ray-pool" else warm_pool
    factory = SandboxFactory(request.param, pool)
    yield factory
    await factory.close_all()


@pytest.fixture
async def tcp_banner_server():
    """Start host loopback TCP servers that greet each connection with a banner; yields a starter."""
    servers = []

    async def start(banner: bytes) -> int:
        async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(banner)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(greet, "127.0.0.1", 0)
        servers.append(server)
        return server.sockets[0].getsockname()[1]

    yield start
    for server in servers:
        server.close()
