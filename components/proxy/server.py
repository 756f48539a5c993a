"""The proxy served standalone by uvicorn: in the caller's event loop, or in a background thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import uvicorn

from components.proxy.app import build_app
from components.proxy.config import ProxyConfig
from components.proxy.limits import request_head_limit_bytes
from components.proxy.sessions import SessionRegistry

T = TypeVar("T")


class ProxyServer:
    """One uvicorn server for ``registry`` at ``config.host:config.port`` (port 0: any free port)."""

    def __init__(self, registry: SessionRegistry, config: ProxyConfig | None = None) -> None:
        self.config = config or ProxyConfig()
        self.registry = registry
        self.app = build_app(registry, self.config)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = self.config.port

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running server."""
        return f"http://{self.config.host}:{self.port}"

    def session_url(self, session_id: str) -> str:
        """The base URL a harness uses for ``session_id`` (OpenAI clients append ``/v1``)."""
        return f"{self.url}/s/{session_id}"

    def _uvicorn_config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.app,
            host=self.config.host,
            port=self.config.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=60,
            ws="none",
            # h11, not httptools: httptools holds a request's headers, however large, before any ASGI code runs;
            # h11 refuses a head past this many bytes while it arrives (400, connection closed).
            http="h11",
            h11_max_incomplete_event_size=request_head_limit_bytes(self.config.max_header_bytes),
        )

    async def start(self) -> str:
        """Serve in the running event loop; returns the URL once the socket is bound."""
        self._server = uvicorn.Server(self._uvicorn_config())
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the bind error
                raise RuntimeError("proxy server stopped during start-up")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.url

    async def wait_closed(self) -> None:
        """Until the server stops (Ctrl-C / SIGTERM, or ``stop``)."""
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        """Stop serving (in-flight requests get a moment to finish)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
            self._server = self._task = None

    def start_in_thread(self) -> str:
        """Serve from a background thread with its own event loop; returns the URL."""
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self.start())
            except BaseException as error:  # noqa: BLE001 - reported to the starting thread
                failure.append(error)
                started.set()
                return
            started.set()
            self._loop.run_until_complete(self._task)

        self._thread = threading.Thread(target=run, name="rein-proxy", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self.url

    def call(self, make_coroutine: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
        """Run a coroutine on the server thread's loop (e.g. the registry's Python API) and return its result."""
        assert self._loop is not None, "call() needs start_in_thread()"

        async def run() -> T:
            return await make_coroutine()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    def stop_thread(self) -> None:
        """Stop a server started with ``start_in_thread``."""
        if self._thread is None:
            return
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(timeout=10)
        self._thread = None
