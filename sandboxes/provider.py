"""The ``sandbox`` seam: a kind is a registered config class (``components.registry.SANDBOXES``) that builds its
provider: ``bwrap`` (``SandboxPoolConfig``: the local bubblewrap pool) or ``e2b`` (``E2BSandboxConfig``); a run
wraps it in retries and a circuit breaker (``sandboxes.resilient``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from components.protocols import SandboxProvider
from sandboxes.e2b import E2BSandboxConfig
from sandboxes.pool import SandboxPoolConfig

__all__ = [
    "E2BSandboxConfig",
    "SandboxConfig",
    "SandboxPoolConfig",
    "SandboxProvider",
]


class SandboxConfig(Protocol):
    """A registered kind of the ``sandbox`` seam: builds the provider of the agents' sandboxes."""

    def build(self, *, read_only_paths: Sequence[str] = ()) -> SandboxProvider: ...
