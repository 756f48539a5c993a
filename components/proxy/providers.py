"""The ``proxy`` seam's built-in kinds: each a registered config class whose ``build()`` makes its
``ProxyProvider`` (``components.protocols``): ``serve`` (Ray Serve replicas over session-shard actors) or
``local`` (the proxy in the driver process: one fewer moving part, no Serve start-up)."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from components.config import option, require_positive
from components.protocols import InferenceEngine, SessionControl
from components.registry import PROXIES
from components.tito.session import TemplateFormats, TemplateFormatsConfig

if TYPE_CHECKING:
    from components.proxy.config import ProxyConfig
    from components.proxy.server import ProxyServer


@runtime_checkable
class ProxyProvider(Protocol):
    """Serves the inference proxy (OpenAI / Anthropic routes, recorded sessions) over a run's engine: in the
    driver process or as Ray Serve replicas.

    Contract: ``start`` returns the proxy's base URL and the ``SessionControl`` that opens and finalizes its
    sessions; ``close`` stops what ``start`` started, is idempotent, and is safe when ``start`` never ran.
    """

    async def start(
        self, engine: InferenceEngine, *, model_path: Path, config: ProxyConfig, run_name: str
    ) -> tuple[str, SessionControl]: ...

    async def close(self) -> None: ...


class ProxyBrickConfig(TemplateFormats, Protocol):
    """A registered kind of the ``proxy`` seam (its tool-call and reasoning formats go to each session's TITO
    core as they are: ``TitoConfig.formats``)."""

    @property
    def reachable_from_other_processes(self) -> bool:
        """Whether a Ray actor elsewhere (the rollout producer with ``placement actor``) can reach it."""
        ...

    def build(self) -> ProxyProvider: ...


@PROXIES.register("serve")
@dataclass(kw_only=True, frozen=True)
class ServeProxyConfig(TemplateFormatsConfig):
    """The proxy as Ray Serve replicas over session-shard actors, 0 CPUs each (they wait on I/O)."""

    replicas: int = option(2, "Ray Serve replicas of the proxy")
    num_session_shards: int = option(2, "session-shard actors holding the proxy's session records")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self.replicas, "replicas")
        require_positive(self.num_session_shards, "num_session_shards")

    @property
    def reachable_from_other_processes(self) -> bool:
        return True

    def build(self) -> ServeProxyProvider:
        """The provider of this config."""
        return ServeProxyProvider(num_replicas=self.replicas, num_session_shards=self.num_session_shards)


@PROXIES.register("local")
@dataclass(kw_only=True, frozen=True)
class LocalProxyConfig(TemplateFormatsConfig):
    """The proxy in the driver process."""

    @property
    def reachable_from_other_processes(self) -> bool:
        return False

    def build(self) -> LocalProxyProvider:
        """The provider of this config."""
        return LocalProxyProvider()


class LocalProxyProvider:
    """``ProxyProvider``: the proxy in the driver process (one fewer moving part, no Serve start-up)."""

    def __init__(self) -> None:
        self._server: ProxyServer | None = None

    async def start(
        self, engine: InferenceEngine, *, model_path: Path, config: ProxyConfig, run_name: str
    ) -> tuple[str, SessionControl]:
        from transformers import AutoTokenizer

        from components.proxy.server import ProxyServer
        from components.proxy.sessions import LocalSessionRegistry

        registry = LocalSessionRegistry(engine, AutoTokenizer.from_pretrained(model_path), config)
        self._server = ProxyServer(registry, config)
        return await self._server.start(), registry

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None


class ServeProxyProvider:
    """``ProxyProvider``: Ray Serve replicas (``num_replicas``) over session-shard actors, 0 CPUs each."""

    def __init__(self, *, num_replicas: int, num_session_shards: int = 2) -> None:
        self.num_replicas, self.num_session_shards = num_replicas, num_session_shards
        self._app_name = ""

    async def start(
        self, engine: InferenceEngine, *, model_path: Path, config: ProxyConfig, run_name: str
    ) -> tuple[str, SessionControl]:
        from ray import serve

        from components.proxy.ray_sessions import start_session_shards
        from components.proxy.serve import run_proxy_on_serve

        serve.start(http_options={"host": "127.0.0.1", "port": _free_port()})
        registry = start_session_shards(engine, model_path, config, num_shards=self.num_session_shards)
        self._app_name = f"rein-{run_name}"
        url = await asyncio.to_thread(
            run_proxy_on_serve,
            registry,
            config,
            app_name=self._app_name,
            route_prefix=f"/{run_name}",
            num_replicas=self.num_replicas,
        )
        return url, registry

    async def close(self) -> None:
        if self._app_name:  # Serve apps outlive a driver
            from ray import serve

            await asyncio.to_thread(serve.delete, self._app_name)
            self._app_name = ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
