"""Sandboxes: a pre-warmed local bubblewrap pool and E2B behind one small interface (``components.protocols``)."""

from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig
from sandboxes.cgroups import CgroupUnavailableError
from sandboxes.e2b import E2BSandbox, E2BSandboxConfig, E2BSandboxProvider
from sandboxes.errors import SandboxFileRefusedError, SandboxLeaseEndedError
from sandboxes.pool import SandboxPool, SandboxPoolConfig
from sandboxes.provider import SandboxConfig, SandboxProvider

__all__ = [
    "BwrapSandbox",
    "BwrapSandboxConfig",
    "CgroupUnavailableError",
    "E2BSandbox",
    "E2BSandboxConfig",
    "E2BSandboxProvider",
    "SandboxConfig",
    "SandboxFileRefusedError",
    "SandboxLeaseEndedError",
    "SandboxPool",
    "SandboxPoolConfig",
    "SandboxProvider",
]
