"""Fixtures for the sandbox tests: sandboxes of every backend, host-side leak checks, a loopback TCP server."""

from __future__ import annotations

import asyncio

import pytest
from sandbox_test_support import SandboxFactory

from sandboxes.pool import SandboxPool, SandboxPoolConfig


@pytest.fixture(scope="module")
async def warm_pool():
    """A small warm pool shared by the tests of one module."""
    async with SandboxPool(SandboxPoolConfig(num_warm=2)) as pool:
        yield pool


@pytest.fixture(params=["bwrap", "bwrap-pool", "e2b-fake"])
async def make_sandbox(request, warm_pool):
    """A factory of sandboxes of each backend in turn (E2B against the in-process fake of its SDK)."""
    factory = SandboxFactory(request.param, warm_pool)
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
