"""No silent hang: every wait on a remote component (a Ray actor call, a ``ray.get``) goes through ``within`` /
``get_within``, which give it a deadline and record it while it is pending; ``StallReporter`` (run beside the
recipe loop) reports any wait pending longer than ``report_after_s``, naming the component and the request, in
the driver's log and in the run's ``stalls.jsonl``, again every ``report_after_s`` while it lasts. A wait past
its deadline raises ``RemoteStalledError`` (or the caller's subclass: ``EngineStalledError`` becomes an
``engine_error`` rollout), naming what it waited on, instead of waiting forever.

One ``PendingWaits`` per process (``PENDING_WAITS``), as ``logging`` has one registry of loggers: every client in
the process records into it, and the one reporter of the run reads it; it holds no configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, overload

from components.errors import EngineError, ReinError

if TYPE_CHECKING:
    from ray import ObjectRef

logger = logging.getLogger(__name__)

T = TypeVar("T")

STALLS_FILE_NAME = "stalls.jsonl"


class RemoteStalledError(ReinError):
    """A remote component did not answer within its deadline (the message names it and the request)."""


class EngineStalledError(RemoteStalledError, EngineError):
    """The inference engine did not answer in time: the rollout is an ``engine_error`` (replaced, never trained)."""


@dataclass(frozen=True, kw_only=True)
class Wait:
    """One pending wait: what on, since when (``time.monotonic``), and its deadline."""

    component: str  # e.g. "engine actor", "session shard 1", "trainer"
    request: str  # e.g. "generate", "run_turn(session 3f2a...)"
    started: float
    deadline_s: float

    def describe(self, now: float) -> str:
        return (
            f"{self.component}: {self.request} (waiting {now - self.started:.0f} s of a "
            f"{self.deadline_s:g} s deadline)"
        )


class PendingWaits:
    """The waits on remote components pending in this process (thread-safe: the trainer waits in a thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, Wait] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def waiting(self, component: str, request: str, deadline_s: float) -> Iterator[Wait]:
        """Record a wait for the time of the ``with`` block."""
        wait = Wait(component=component, request=request, started=time.monotonic(), deadline_s=deadline_s)
        with self._lock:
            key = next(self._ids)
            self._waits[key] = wait
        try:
            yield wait
        finally:
            with self._lock:
                del self._waits[key]

    def older_than(self, age_s: float) -> list[Wait]:
        """The waits pending for more than ``age_s``, oldest first."""
        now = time.monotonic()
        with self._lock:
            waits = [wait for wait in self._waits.values() if now - wait.started > age_s]
        return sorted(waits, key=lambda wait: wait.started)

    async def within(
        self,
        awaitable: Awaitable[T],
        *,
        deadline_s: float,
        component: str,
        request: str,
        error: type[RemoteStalledError] = RemoteStalledError,
    ) -> T:
        """Await ``awaitable`` for at most ``deadline_s`` (cancelled past it: ``error`` naming what stalled)."""
        with self.waiting(component, request, deadline_s):
            try:
                return await asyncio.wait_for(awaitable, deadline_s)
            except TimeoutError:
                raise error(f"{component} did not answer {request} within {deadline_s:g} s") from None

    @overload
    def get_within(
        self,
        references: ObjectRef[T],
        *,
        deadline_s: float,
        component: str,
        request: str,
        error: type[RemoteStalledError] = ...,
    ) -> T: ...

    @overload
    def get_within(
        self,
        references: Sequence[ObjectRef[T]],
        *,
        deadline_s: float,
        component: str,
        request: str,
        error: type[RemoteStalledError] = ...,
    ) -> list[T]: ...

    def get_within(
        self,
        references: ObjectRef[T] | Sequence[ObjectRef[T]],
        *,
        deadline_s: float,
        component: str,
        request: str,
        error: type[RemoteStalledError] = RemoteStalledError,
    ) -> T | list[T]:
        """``ray.get(references)`` for at most ``deadline_s`` (past it: ``error`` naming what stalled)."""
        import ray
        from ray.exceptions import GetTimeoutError

        with self.waiting(component, request, deadline_s):
            try:
                return ray.get(references, timeout=deadline_s)
            except GetTimeoutError:
                raise error(f"{component} did not answer {request} within {deadline_s:g} s") from None

    def ready_within(
        self,
        references: Sequence[ObjectRef[T]],
        *,
        deadline_s: float,
        component: str,
        request: str,
        error: type[RemoteStalledError] = RemoteStalledError,
    ) -> None:
        """Until every one of ``references`` is ready, for at most ``deadline_s`` (past it: ``error`` naming what
        stalled); nothing is fetched to this process."""
        import ray

        with self.waiting(component, request, deadline_s):
            _, pending = ray.wait(
                list(references), num_returns=len(references), timeout=deadline_s, fetch_local=False
            )
        if pending:
            raise error(f"{component} did not answer {request} within {deadline_s:g} s")


PENDING_WAITS = PendingWaits()


class StallReporter:
    """Reports waits pending longer than ``report_after_s`` (log and ``run_dir/stalls.jsonl``), each again every
    ``report_after_s`` while it lasts; ``longest_wait_s`` is the longest seen since the last ``take``."""

    def __init__(
        self,
        run_dir: Path,
        *,
        report_after_s: float,
        waits: PendingWaits = PENDING_WAITS,
        interval_s: float | None = None,
    ) -> None:
        self.path = Path(run_dir) / STALLS_FILE_NAME
        self.report_after_s = report_after_s
        self.waits = waits
        self.interval_s = interval_s if interval_s is not None else min(5.0, report_after_s / 2)
        self._reported: dict[int, float] = {}  # id(wait) -> when it was last reported
        self._longest_s = 0.0
        self._num_reports = 0

    def check(self) -> list[Wait]:
        """Report what is due now; returns the waits reported."""
        now = time.monotonic()
        due = []
        stalled = self.waits.older_than(self.report_after_s)
        live = {id(wait) for wait in stalled}
        self._reported = {key: at for key, at in self._reported.items() if key in live}
        for wait in stalled:
            self._longest_s = max(self._longest_s, now - wait.started)
            if now - self._reported.get(id(wait), -float("inf")) >= self.report_after_s:
                self._reported[id(wait)] = now
                due.append(wait)
        for wait in due:
            logger.warning("stalled: %s", wait.describe(now))
            record = {
                "time": time.time(),
                "component": wait.component,
                "request": wait.request,
                "waiting_s": round(now - wait.started, 1),
                "deadline_s": wait.deadline_s,
            }
            with self.path.open("a") as file:
                file.write(json.dumps(record) + "\n")
        self._num_reports += len(due)
        return due

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.check()

    def take(self) -> dict[str, float]:
        """The step's stall metrics (longest pending wait, reports written), reset for the next step."""
        metrics = {"stall/longest_wait_s": self._longest_s, "stall/reports": float(self._num_reports)}
        self._longest_s, self._num_reports = 0.0, 0
        return metrics
