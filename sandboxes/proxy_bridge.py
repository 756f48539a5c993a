"""Host half of the proxy-only network path: a Unix socket that forwards every connection to one TCP address.

The sandbox has no network interface but its own loopback. Its supervisor listens on ``127.0.0.1:PORT`` inside
that loopback and forwards each connection to ``/run/rein/proxy.sock``, which is this bridge's socket bound
into the sandbox; the bridge connects it to the proxy's real ``127.0.0.1:PORT`` on the host. No other address
is reachable: the socket leads to exactly one host port. At most ``max_connections`` connections are open at
once (per sandbox: each sandbox has its own bridge); past that a new connection is closed at once, so a
sandbox cannot exhaust the proxy's (or the host's) sockets. The supervisor applies the same cap inside, but
this one holds even for code that connects to the socket directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from urllib.parse import urlsplit


def parse_loopback_proxy_url(proxy_url: str) -> tuple[str, int]:
    """``http://127.0.0.1:PORT[/path]`` -> (host, port); ValueError for anything a sandbox could not reach."""
    parts = urlsplit(proxy_url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        raise ValueError(
            f"proxy_url: must look like http://127.0.0.1:PORT (a loopback proxy on this node), got {proxy_url!r}"
        )
    if parts.port < 1024:
        raise ValueError(
            f"proxy_url: port must be >= 1024 (unprivileged inside the sandbox), got {parts.port}"
        )
    return "127.0.0.1", parts.port


class ProxyBridge:
    """Accepts connections on a Unix socket and pipes each one to ``target_host:target_port``."""

    def __init__(
        self, socket_path: str, target_host: str, target_port: int, *, max_connections: int = 32
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
        self.socket_path = socket_path
        self.target_host = target_host
        self.target_port = target_port
        self.max_connections = max_connections
        self.num_refused = 0  # connections closed at once because max_connections were open
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Listen on the socket (readable and connectable by the sandbox's unprivileged user)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._server = await asyncio.start_unix_server(self._handle, path=self.socket_path)
        os.chmod(self.socket_path, 0o777)

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._connections) >= self.max_connections:
            self.num_refused += 1
            client_writer.close()
            return
        self._connections.add(task)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            client_writer.close()
            self._connections.discard(task)
            return
        try:
            await asyncio.gather(
                _pipe(client_reader, upstream_writer),
                _pipe(upstream_reader, client_writer),
                return_exceptions=True,
            )
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()
            self._connections.discard(task)

    async def close(self) -> None:
        """Stop listening, drop open connections and remove the socket."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
