"""Fixtures for the proxy tests: a real proxy (uvicorn, real HTTP) over a scripted or tiny-model engine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from components.engine.scripted import ScriptedEngine
from components.protocols import SessionDescription, SessionOpen
from components.proxy.config import ProxyConfig
from components.proxy.server import ProxyServer
from components.proxy.sessions import LocalSessionRegistry


@dataclass
class RunningProxy:
    server: ProxyServer
    registry: LocalSessionRegistry
    engine: Any

    @property
    def url(self) -> str:
        return self.server.url

    def open_session(self, **fields: Any) -> str:
        return self.server.call(lambda: self.registry.open_session(SessionOpen(**fields)))

    def session_url(self, session_id: str) -> str:
        return self.server.session_url(session_id)

    def describe(self, session_id: str) -> SessionDescription:
        return self.server.call(lambda: self.registry.describe(session_id))


@pytest.fixture
def start_proxy(tokenizer) -> Iterator[Callable[..., RunningProxy]]:
    """Start a proxy (in a background thread, on a free port) over an engine; stopped after the test."""
    started: list[ProxyServer] = []

    def start(
        engine: Any = None, *, script: Any = ("Hello from the policy.",), **config_fields: Any
    ) -> RunningProxy:
        engine = engine if engine is not None else ScriptedEngine(tokenizer, script)
        if not {"api_key", "admin_key", "insecure_open_control_plane"} & config_fields.keys():
            # These tests exercise protocols and harnesses, not auth: they opt out of the closed default
            # explicitly (the control plane and session tokens are attacked in test_control_plane.py).
            config_fields["insecure_open_control_plane"] = True
        config = ProxyConfig(port=0, **config_fields)
        registry = LocalSessionRegistry(engine, tokenizer, config)
        server = ProxyServer(registry, config)
        server.start_in_thread()
        started.append(server)
        return RunningProxy(server=server, registry=registry, engine=engine)

    yield start
    for server in started:
        server.stop_thread()
