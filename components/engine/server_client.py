"""What every HTTP inference-server client shares (``SGLangEngine``, ``VLLMEngine``): one lazily opened
``httpx`` client per process, the update lock, and pickling without either (a copy in another process opens its
own). The config needs ``base_url``, ``api_key``, ``request_timeout_s`` and ``connect_timeout_s``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx


class HttpServerClient:
    """Base of the server clients: ``self.config`` and ``self._client`` / ``self._update_lock`` set by the subclass."""

    config: Any
    _client: httpx.AsyncClient | None
    _update_lock: asyncio.Lock | None

    def __getstate__(self) -> dict[str, Any]:
        # An open HTTP client (sockets, its event loop) cannot travel to another process: the copy opens its own.
        state = dict(self.__dict__)
        state.update(_client=None, _update_lock=None)
        return state

    @property
    def url(self) -> str:
        return self.config.base_url.rstrip("/")

    @property
    def client(self) -> httpx.AsyncClient:
        """This process's HTTP client to the server (opened on first use)."""
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=headers,
                timeout=httpx.Timeout(self.config.request_timeout_s, connect=self.config.connect_timeout_s),
            )
        return self._client

    @property
    def update_lock(self) -> asyncio.Lock:
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        return self._update_lock
