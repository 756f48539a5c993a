"""Choosing a sandbox backend by config: ``make_sandbox_provider(SandboxBackendConfig(backend=...))``, wrapped in
retries and a circuit breaker (``sandboxes.resilient``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.config import require_one_of
from components.protocols import SandboxProvider
from sandboxes.e2b import E2BSandboxConfig, E2BSandboxProvider
from sandboxes.pool import SandboxPool, SandboxPoolConfig
from sandboxes.resilient import ResilientSandboxProvider, SandboxResilienceConfig

BACKENDS = ("bwrap", "e2b")


__all__ = ["BACKENDS", "SandboxBackendConfig", "SandboxProvider", "make_sandbox_provider"]


@dataclass(kw_only=True, frozen=True)
class SandboxBackendConfig:
    """Which sandboxes a run uses: the local bubblewrap pool or E2B."""

    backend: str = "bwrap"  # "bwrap" | "e2b"
    pool: SandboxPoolConfig = field(default_factory=SandboxPoolConfig)  # used when backend == "bwrap"
    e2b: E2BSandboxConfig = field(default_factory=E2BSandboxConfig)  # used when backend == "e2b"
    resilience: SandboxResilienceConfig = field(default_factory=SandboxResilienceConfig)  # retries, breaker

    def __post_init__(self) -> None:
        require_one_of(self.backend, "backend", BACKENDS)


def make_sandbox_provider(config: SandboxBackendConfig) -> ResilientSandboxProvider:
    """The provider ``config`` names (a ``SandboxPool`` starts its warm sandboxes on first use), with retried
    acquires and a circuit breaker around it (its ``inner`` is the backend's own provider)."""
    inner: SandboxProvider = (
        SandboxPool(config.pool) if config.backend == "bwrap" else E2BSandboxProvider(config.e2b)
    )
    return ResilientSandboxProvider(inner, config.resilience)
