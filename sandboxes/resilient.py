"""Retries and a circuit breaker around any ``SandboxProvider``: a flaky backend (E2B's API, a Docker daemon, a
bubblewrap pool out of warm sandboxes) gets bounded retries with backoff; a backend that keeps failing opens
the breaker, and the step fails with one clear ``SandboxBackendDownError`` instead of burning every rollout on
a backend that is down (each would otherwise wait out its own retries and be recorded as ``sandbox_error``).

Only ``acquire`` is retried: it has no side effect the agent saw. A sandbox that dies in use is the rollout's
``sandbox_error``, as before. After ``breaker_cooldown_s`` the breaker lets one acquire through (half-open); a
success closes it, a failure opens it again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from components.config import option
from components.errors import SandboxBackendDownError, SandboxError
from components.protocols import Sandbox, SandboxProvider, SandboxSpec, StartsAhead

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class SandboxResilienceConfig:
    """How hard a run tries a failing sandbox backend before it stops the step."""

    max_attempts: int = option(3, "tries per sandbox acquire (1 = no retry)")
    backoff_initial_s: float = option(0.5, "first wait between acquire tries; doubles each try, with jitter")
    backoff_max_s: float = option(10.0, "longest wait between acquire tries")
    breaker_threshold: int = option(
        5, "acquires in a row that failed every try before the circuit breaker stops the step (0 = never)"
    )
    breaker_cooldown_s: float = option(
        60.0, "how long an open breaker refuses before it lets one acquire through"
    )

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"sandbox resilience max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff_initial_s < 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                "sandbox resilience needs 0 <= backoff_initial_s <= backoff_max_s, got "
                f"{self.backoff_initial_s} and {self.backoff_max_s}"
            )
        if self.breaker_threshold < 0:
            raise ValueError(
                f"sandbox resilience breaker_threshold must be >= 0, got {self.breaker_threshold}"
            )
        if self.breaker_cooldown_s < 0:
            raise ValueError(
                f"sandbox resilience breaker_cooldown_s must be >= 0, got {self.breaker_cooldown_s}"
            )


class ResilientSandboxProvider:
    """``inner`` with retried acquires and a circuit breaker (a ``SandboxProvider`` itself)."""

    def __init__(self, inner: SandboxProvider, config: SandboxResilienceConfig | None = None) -> None:
        self.inner = inner
        self.config = config or SandboxResilienceConfig()
        self.num_retries = 0  # acquire tries that failed and were tried again
        self.num_failed_acquires = 0  # acquires that failed every try
        self._failures_in_a_row = 0
        self._opened_at: float | None = None  # monotonic time the breaker opened; None while closed
        self._last_error = ""

    @property
    def breaker_open(self) -> bool:
        return self._opened_at is not None

    def _refuse_if_open(self) -> None:
        if self._opened_at is None:
            return
        waited_s = time.monotonic() - self._opened_at
        if waited_s < self.config.breaker_cooldown_s:
            raise SandboxBackendDownError(
                f"the sandbox backend failed {self._failures_in_a_row} acquires in a row "
                f"({self.config.max_attempts} tries each); last error: {self._last_error}. The step stops "
                f"here instead of failing every rollout; fix the backend (or raise "
                f"sandbox resilience breaker_threshold) and resume the run"
            )
        # half-open: this acquire is the trial; it closes the breaker or re-opens it below

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox:
        """A sandbox from ``inner``, retrying its ``SandboxError``s; raises ``SandboxBackendDownError`` while the
        breaker is open, ``SandboxError`` when every try failed."""
        self._refuse_if_open()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.max_attempts),
            wait=wait_exponential_jitter(
                initial=self.config.backoff_initial_s, max=self.config.backoff_max_s
            ),
            retry=retry_if_exception_type(SandboxError),
            before_sleep=self._count_retry,
            reraise=True,
        )
        try:
            sandbox = await retrying(self.inner.acquire, spec)
        except SandboxError as exc:
            self._record_failure(exc)
            raise
        self._failures_in_a_row = 0
        self._opened_at = None
        return sandbox

    def _count_retry(self, retry_state) -> None:
        self.num_retries += 1
        error = retry_state.outcome.exception() if retry_state.outcome else None
        logger.warning("sandbox acquire failed (try %d), retrying: %s", retry_state.attempt_number, error)

    def _record_failure(self, exc: SandboxError) -> None:
        self.num_failed_acquires += 1
        self._failures_in_a_row += 1
        self._last_error = f"{type(exc).__name__}: {exc}"
        threshold = self.config.breaker_threshold
        if threshold and self._failures_in_a_row >= threshold:
            if self._opened_at is None:
                logger.error("sandbox backend circuit breaker opened: %s", self._last_error)
            self._opened_at = time.monotonic()

    async def release(self, sandbox: Sandbox) -> None:
        await self.inner.release(sandbox)

    async def start(self, *, wait: bool = True) -> None:
        """Start ``inner`` ahead when it can (``StartsAhead``); nothing to do otherwise."""
        if isinstance(self.inner, StartsAhead):
            await self.inner.start(wait=wait)

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["ResilientSandboxProvider", "SandboxResilienceConfig"]
