"""The ``sandbox`` seam: a kind is a registered config class (``components.registry.SANDBOXES``) that builds its
provider: ``bwrap`` (``SandboxPoolConfig``: the local bubblewrap pool) or ``e2b`` (``E2BSandboxConfig``); a run
wraps it in retries and a circuit breaker (``sandboxes.resilient``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from components.config import require_one_of
from components.protocols import SandboxProvider
from components.registry import SANDBOXES
from sandboxes.e2b import E2BSandboxConfig
from sandboxes.pool import SandboxPoolConfig
from sandboxes.resilient import ResilientSandboxProvider, SandboxResilienceConfig

__all__ = [
    "E2BSandboxConfig",
    "SandboxBackendConfig",
    "SandboxConfig",
    "SandboxPoolConfig",
    "SandboxProvider",
    "make_sandbox_provider",
]


class SandboxConfig(Protocol):
    """A registered kind of the ``sandbox`` seam: builds the provider of the agents' sandboxes."""

    def build(self, *, read_only_paths: Sequence[str] = ()) -> SandboxProvider: ...


@dataclass(kw_only=True, frozen=True)
class SandboxBackendConfig:
    """A kind by name with the configs of both built-in kinds and the resilience around it (for code that picks
    the backend at run time; a run config holds one ``SandboxConfig`` instead)."""

    backend: str = "bwrap"
    pool: SandboxPoolConfig = field(default_factory=SandboxPoolConfig)  # used when backend == "bwrap"
    e2b: E2BSandboxConfig = field(default_factory=E2BSandboxConfig)  # used when backend == "e2b"
    resilience: SandboxResilienceConfig = field(default_factory=SandboxResilienceConfig)  # retries, breaker

    def __post_init__(self) -> None:
        require_one_of(self.backend, "backend", SANDBOXES.kinds())


def make_sandbox_provider(config: SandboxBackendConfig) -> ResilientSandboxProvider:
    """The provider ``config`` names, with retried acquires and a circuit breaker around it (its ``inner`` is
    the backend's own provider)."""
    chosen = {"bwrap": config.pool, "e2b": config.e2b}.get(config.backend) or SANDBOXES.get(config.backend)()
    return ResilientSandboxProvider(chosen.build(), config.resilience)
