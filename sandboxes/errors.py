"""Typed errors of the sandbox backends (all ``SandboxError``s, so a rollout records them as a failure reason)."""

from __future__ import annotations

from components.errors import SandboxError


class SandboxFileRefusedError(SandboxError):
    """A host-side read or download was refused: not a regular file (a FIFO, a device, a socket), or over the
    configured size or entry cap. The sandbox itself is fine; the file is the agent's doing."""


class SandboxLeaseEndedError(SandboxError):
    """A call on a sandbox handle after it was released to its pool: the handle reaches nothing any more."""
