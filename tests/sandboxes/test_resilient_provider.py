"""Retries and the circuit breaker of ``sandboxes.resilient`` around a real bubblewrap pool whose backend fails
on demand (the failures are injected in front of the pool; the sandboxes handed out are real)."""

from __future__ import annotations

import time

import pytest

from components.errors import SandboxBackendDownError, SandboxError
from components.protocols import SandboxSpec
from sandboxes.pool import SandboxPool, SandboxPoolConfig
from sandboxes.resilient import ResilientSandboxProvider, SandboxResilienceConfig


class FlakyBackend:
    """A real pool behind a switch: while ``failing`` is set, every acquire fails as a dead daemon would."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self.failing = 0  # fail this many acquires from now on (-1: every one)
        self.num_acquires = 0

    async def acquire(self, spec: SandboxSpec | None = None):
        self.num_acquires += 1
        if self.failing:
            self.failing -= 1 if self.failing > 0 else 0
            raise SandboxError("connection refused")
        return await self.pool.acquire(spec)

    async def release(self, sandbox) -> None:
        await self.pool.release(sandbox)

    async def close(self) -> None:
        await self.pool.close()


QUICK = {"backoff_initial_s": 0.0, "backoff_max_s": 0.0}


async def test_a_flaky_backend_is_retried_and_the_sandbox_is_real():
    backend = FlakyBackend(SandboxPool(SandboxPoolConfig(num_warm=0, workspace_mb=32)))
    provider = ResilientSandboxProvider(backend, SandboxResilienceConfig(max_attempts=3, **QUICK))
    try:
        backend.failing = 2
        sandbox = await provider.acquire(SandboxSpec())
        assert (await sandbox.exec("echo up")).stdout.strip() == "up"
        assert backend.num_acquires == 3 and provider.num_retries == 2 and provider.num_failed_acquires == 0
        await provider.release(sandbox)
    finally:
        await provider.close()


async def test_the_breaker_opens_refuses_without_calling_the_backend_then_closes_after_a_trial():
    backend = FlakyBackend(SandboxPool(SandboxPoolConfig(num_warm=0, workspace_mb=32)))
    config = SandboxResilienceConfig(max_attempts=2, breaker_threshold=2, breaker_cooldown_s=0.5, **QUICK)
    provider = ResilientSandboxProvider(backend, config)
    try:
        backend.failing = -1
        for _ in range(2):
            with pytest.raises(SandboxError, match="connection refused"):
                await provider.acquire(SandboxSpec())
        assert provider.breaker_open and backend.num_acquires == 4
        started = time.monotonic()
        with pytest.raises(SandboxBackendDownError, match="2 acquires in a row.*connection refused"):
            await provider.acquire(SandboxSpec())
        assert backend.num_acquires == 4 and time.monotonic() - started < 0.1  # refused at once
        time.sleep(0.6)  # cooldown over: one trial goes through; the backend is back
        backend.failing = 0
        sandbox = await provider.acquire(SandboxSpec())
        assert not provider.breaker_open and (await sandbox.exec("true")).exit_code == 0
        await provider.release(sandbox)
    finally:
        await provider.close()


def test_config_names_the_field():
    with pytest.raises(ValueError, match="max_attempts"):
        SandboxResilienceConfig(max_attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        SandboxResilienceConfig(backoff_initial_s=2.0, backoff_max_s=1.0)
