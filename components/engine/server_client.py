"""What every HTTP inference-server client shares (``SGLangEngine``, ``VLLMEngine``): one lazily opened
``httpx`` client per process, the update lock, pickling without either (a copy in another process opens its
own), bounded retries of transient failures with typed errors, and the ``/health`` wait. The config needs
``base_url``, ``connect_timeout_s``, ``max_retries``, ``retry_backoff_s`` and the engine brick's ``settings``
(``api_key``, ``request_timeout_s``, ``startup_timeout_s``) (``ServerClientConfig``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import ClassVar, Generic, Protocol, TypeVar

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from components.engine.server_fleet import ServerUnreachableError
from components.errors import EngineError
from components.json_types import JsonObject, JsonValue

TRANSIENT_STATUS = (502, 503, 504)


class ServerSettings(Protocol):
    """What ``HttpServerClient`` reads of the engine brick's settings (``SGLangBrickConfig``, ``VLLMBrickConfig``)."""

    @property
    def api_key(self) -> str: ...  # '' = none
    @property
    def request_timeout_s(self) -> float: ...
    @property
    def startup_timeout_s(self) -> float: ...


class ServerClientConfig(Protocol):
    """What ``HttpServerClient`` reads of its server's config (``SGLangEngineConfig``, ``VLLMEngineConfig``)."""

    @property
    def base_url(self) -> str: ...
    @property
    def settings(self) -> ServerSettings: ...
    @property
    def connect_timeout_s(self) -> float: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def retry_backoff_s(self) -> float: ...


C = TypeVar("C", bound=ServerClientConfig)


def is_transient(error: BaseException) -> bool:
    """A failure worth another attempt: a connection error (not a read timeout: the request may be running)
    or a 502/503/504."""
    if isinstance(error, httpx.TransportError) and not isinstance(error, httpx.ReadTimeout):
        return True
    return isinstance(error, httpx.HTTPStatusError) and error.response.status_code in TRANSIENT_STATUS


def is_unsent(error: BaseException) -> bool:
    """A failure worth another attempt for a request that must not run twice (generation): the connection was
    never made, or a 502/503/504. A connection dropped mid-request means the server died with it: sent again,
    it could be answered by the restarted server (vLLM binds its port before loading the model) with its
    start-up weights, so it fails instead (the fleet takes the server out; the rollout is an engine error)."""
    if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
        return True
    return isinstance(error, httpx.HTTPStatusError) and error.response.status_code in TRANSIENT_STATUS


class HttpServerClient(Generic[C]):
    """Base of the server clients: ``self.config`` and ``self._client`` / ``self._update_lock`` set by the subclass.

    A subclass names its server (``server_name``), the error for a server that is gone (``unreachable_error``)
    and the command users start it with (``start_command``, ``startup_flag``) for the start-up message."""

    server_name: ClassVar[str] = "inference"
    unreachable_error: ClassVar[type[ServerUnreachableError]] = ServerUnreachableError
    start_command: ClassVar[str] = "the server"
    startup_flag: ClassVar[str] = "the start-up timeout"

    config: C
    _client: httpx.AsyncClient | None
    _update_lock: asyncio.Lock | None

    def __getstate__(self) -> dict[str, object]:
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
            settings = self.config.settings
            headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=headers,
                timeout=httpx.Timeout(settings.request_timeout_s, connect=self.config.connect_timeout_s),
            )
        return self._client

    @property
    def update_lock(self) -> asyncio.Lock:
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        return self._update_lock

    async def aclose(self) -> None:
        """Close the HTTP connections (a later call opens new ones)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def health(self) -> bool:
        """``GET /health``: True when the server answers 200."""
        try:
            response = await self.client.get("/health")
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def wait_until_healthy(self, timeout_s: float | None = None, *, poll_s: float = 1.0) -> None:
        """Poll ``GET /health`` until it answers 200; ``EngineError`` naming the URL after ``timeout_s``."""
        timeout_s = self.config.settings.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not await self.health():
            if time.monotonic() >= deadline:
                raise EngineError(
                    f"{self.server_name} server {self.url} did not answer GET /health with 200 within "
                    f"{timeout_s:g} s: check that `{self.start_command}` runs there and is reachable from this "
                    f"machine, or raise the start-up timeout ({self.startup_flag})"
                )
            await asyncio.sleep(poll_s)

    async def router_workers(self) -> list[str] | None:
        """The worker URLs when this URL is a router (sgl-model-gateway and vllm-router, a fork of it: ``GET
        /workers`` → ``{"workers": [{"url": …}]}``; the older sglang-router ``GET /list_workers`` → ``{"urls":
        […]}``); None for a plain server (which has neither)."""
        for path, key in (("/workers", "workers"), ("/list_workers", "urls")):
            try:
                reply = await self._request("GET", path)
            except self.unreachable_error:
                raise
            except EngineError:
                continue
            if isinstance(reply, Mapping) and isinstance(reply.get(key), list):
                entries = reply[key]
                return [str(e["url"] if isinstance(e, Mapping) else e).rstrip("/") for e in entries]
        return None

    def status_error(self, method: str, path: str, response: httpx.Response) -> EngineError:
        """The error of a refused request (a subclass may map some replies to a more precise type)."""
        return EngineError(
            f"{self.server_name} {method} {path} -> HTTP {response.status_code}: {response.text[:500]}"
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: JsonValue = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        accept_status: tuple[int, ...] = (),
        retry_when: Callable[[BaseException], bool] = is_transient,
    ) -> JsonValue:
        """One HTTP call with bounded retries on failures ``retry_when`` accepts; the JSON reply (``{"text": ...}``
        when not JSON, ``{}`` when empty); ``EngineError`` on any failure, ``unreachable_error`` when the server
        is gone."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.max_retries + 1),
            wait=wait_exponential(
                multiplier=self.config.retry_backoff_s, max=10 * max(self.config.retry_backoff_s, 0.1)
            ),
            retry=retry_if_exception(retry_when),
            reraise=True,
        )
        where = f"{self.server_name} {method} {self.url}{path}"
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self.client.request(
                        method, path, json=json, params=params, headers=headers
                    )
                    if response.status_code not in accept_status:
                        response.raise_for_status()
        except httpx.HTTPStatusError as error:
            raise self.status_error(method, path, error.response) from error
        except httpx.TransportError as error:
            if isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout):
                raise EngineError(f"{where} timed out: {error!r}") from error
            raise self.unreachable_error(f"{where} failed: {error!r}") from error
        except httpx.HTTPError as error:
            raise EngineError(f"{where} failed: {error!r}") from error
        if not response.content:
            return {}
        try:
            reply: JsonValue = response.json()
        except ValueError:
            return {"text": response.text}
        return reply

    async def _request_object(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None
    ) -> JsonObject:
        """``_request`` of an endpoint that answers a JSON object; ``EngineError`` when it answered anything else."""
        return json_object(
            await self._request(method, path, params=params), f"{self.server_name} {method} {path}"
        )


def json_object(value: JsonValue, where: str) -> JsonObject:
    """``value`` when it is a JSON object; an ``EngineError`` naming ``where`` (the reply's source) otherwise."""
    if not isinstance(value, dict):
        raise EngineError(f"{where} answered {type(value).__name__} {str(value)[:200]!r}, not a JSON object")
    return value
