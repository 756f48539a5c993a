"""Fixtures for the sandbox tests: a loopback TCP server. (The Sandbox contract suite, run on every backend, is
``tests/contracts/test_sandbox_contract.py``.)"""

from __future__ import annotations

import asyncio

import pytest


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
