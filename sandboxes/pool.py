"""A pool of pre-started bubblewrap sandboxes: ``acquire`` hands one out in microseconds.

Warm sandboxes are *generic*: started with the pool's mounts (``read_only_paths``, ``workspace_mb``) and no
spec. ``acquire(spec)`` takes a warm one whose mounts can serve the spec and returns it at once; copying the
spec's workspace in and opening its proxy path run in the background, and the sandbox's first call waits for
them (``BwrapSandbox.prepare_in_background``). A spec the warm sandboxes cannot serve (another workspace size,
a path the pool does not mount) gets a cold sandbox. A health loop pings idle sandboxes and replaces dead ones.

Refill under continuous use: starts are CPU work (bwrap, then the supervisor's Python), so ``num_warm`` of them
at once on a loaded machine share the cores and all finish together, late (8 at load ~15 on 2 cores: every one
after ~3 s, where one alone takes ~0.3 s). The pool runs at most ``max_concurrent_starts`` at a time (one per
core by default), so refills become ready one after another. An ``acquire`` that finds no warm sandbox for a spec
the warm ones can serve waits for the next refill (it is already under way, so it is ready sooner than a cold
start begun now, which would also slow every refill down); a cold start is for specs the warm sandboxes cannot
serve, or when no refill is under way.

``release`` ends the handle's lease at once (every later call on it raises ``SandboxLeaseEndedError``), then
destroys the sandbox in the background (its cgroup killed, everything in it gone) and starts a fresh one. A
sandbox is never reused: the next tenant always gets one that nothing of the last tenant ever ran in, so no
process, IPC object (each sandbox has its own IPC namespace), changed limit, file or connection can carry
over. Why not reset in place: every reset must find and undo all state a tenant can create (processes that
hop pids, IPC objects, rlimits of the supervisor, unreadable directories: tests/sandboxes/
test_bwrap_escape_reset.py shows each surviving the old reset), while a fresh sandbox has none by construction.
The price is one sandbox start per rollout, in the background ("sandbox start" in benchmarks/RESULTS.md); acquire
stays a deque pop plus the new tenant's cgroup limits (a few file writes, well under 1 ms).

``start`` (and the first ``acquire``) raise ``CgroupUnavailableError`` when the pool's config asks for cgroup
limits (``bwrap.resource_control="cgroup"``, the default) and this host cannot give them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from components.config import option, require, require_non_negative, require_positive
from components.errors import SandboxError
from components.protocols import Sandbox, SandboxSpec
from components.registry import SANDBOXES
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig, cgroup_hierarchy, mounts_serve, validate_spec

logger = logging.getLogger(__name__)


@SANDBOXES.register("bwrap")
@dataclass(kw_only=True, frozen=True)
class SandboxPoolConfig:
    """A local pool of warm bubblewrap sandboxes."""

    num_warm: int = option(4, "idle, started bubblewrap sandboxes kept ready", flag="num-warm-sandboxes")
    # Mounts of the warm sandboxes; a spec asking for a subset of these paths (and this workspace size) is served
    # warm. Typically the venv and the npm agents: ("/work/main/.venv", "/work/main/.agents").
    read_only_paths: tuple[str, ...] = ()
    workspace_mb: int = 256
    health_check_interval_s: float = 10.0
    # Sandbox starts run at most this many at a time (see the module docstring: concurrent starts all finish late).
    max_concurrent_starts: int = field(default_factory=lambda: os.cpu_count() or 1)
    bwrap: BwrapSandboxConfig = field(default_factory=BwrapSandboxConfig)

    def __post_init__(self) -> None:
        require_non_negative(self.num_warm, "num_warm")
        require_positive(self.max_concurrent_starts, "max_concurrent_starts")
        require_positive(self.workspace_mb, "workspace_mb")
        require_positive(self.health_check_interval_s, "health_check_interval_s")
        for path in self.read_only_paths:
            require(path.startswith("/"), "read_only_paths", f"must be absolute paths, got {path!r}")

    def build(self, *, read_only_paths: Sequence[str] = ()) -> SandboxPool:
        """The pool of this config (``sandbox`` kind ``bwrap``); ``read_only_paths`` join its own mounts."""
        paths = tuple(dict.fromkeys((*self.read_only_paths, *read_only_paths)))
        return SandboxPool(dataclasses.replace(self, read_only_paths=paths))


class SandboxPool:
    """Keeps ``num_warm`` bubblewrap sandboxes started; use as ``async with SandboxPool(config) as pool``."""

    def __init__(self, config: SandboxPoolConfig | None = None) -> None:
        self.config = config or SandboxPoolConfig()
        self._warm: deque[BwrapSandbox] = deque()
        self._in_use: dict[str, BwrapSandbox] = {}
        self._num_starting = 0
        self._start_slots = asyncio.Semaphore(self.config.max_concurrent_starts)
        self._warm_changed = asyncio.Condition()  # notified when a refill is ready or failed, and on close
        self._background: set[asyncio.Task] = set()
        self._health_task: asyncio.Task | None = None
        self._started = False
        self._closed = False
        self.num_cold_starts = 0  # acquires no warm sandbox could serve
        self.num_waited = 0  # acquires that found no warm sandbox and waited for a refill under way
        self.num_started = 0  # warm sandboxes started (initial fill and refills)
        self.num_replaced = 0  # idle sandboxes found dead by the health check

    @property
    def num_warm(self) -> int:
        """Idle sandboxes ready to hand out now."""
        return len(self._warm)

    @property
    def num_in_use(self) -> int:
        """Sandboxes handed out and not yet released."""
        return len(self._in_use)

    async def start(self, *, wait: bool = True) -> None:
        """Start the warm sandboxes (waiting for them unless ``wait=False``) and the health loop. Idempotent."""
        if self._started:
            return
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        cgroup_hierarchy(self.config.bwrap)  # CgroupUnavailableError: refuse limits this host cannot enforce
        self._started = True
        self._health_task = asyncio.create_task(self._health_loop())
        self._refill()
        if wait:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox:
        """A sandbox for ``spec``: a warm one when its mounts fit (no waiting), else a freshly started one."""
        spec = spec or SandboxSpec()
        validate_spec(spec)
        if not self._started:
            await self.start(wait=False)
        waited = False
        while True:
            if self._closed:
                raise SandboxError("sandbox pool is closed")
            sandbox = self._take_warm(spec)
            if sandbox is not None:
                self.num_waited += waited
                return sandbox
            if not (self._num_starting and self._warm_can_serve(spec)):
                break
            waited = True
            async with self._warm_changed:
                await self._warm_changed.wait()
        self.num_cold_starts += 1
        self._refill()
        sandbox = await BwrapSandbox.create(spec, self.config.bwrap)
        self._in_use[sandbox.sandbox_id] = sandbox
        return sandbox

    def _take_warm(self, spec: SandboxSpec) -> BwrapSandbox | None:
        """A warm sandbox for ``spec``, adopted in the background, or None when none is idle or fits."""
        while self._warm:
            sandbox = self._warm.popleft()
            if not sandbox.alive:
                self._spawn(sandbox.close())
                continue
            if not sandbox.compatible_with(spec):
                self._warm.appendleft(sandbox)
                return None
            sandbox.prepare_in_background(spec)
            self._in_use[sandbox.sandbox_id] = sandbox
            self._refill()
            return sandbox
        return None

    def _warm_can_serve(self, spec: SandboxSpec) -> bool:
        """Whether the warm sandboxes' mounts can serve ``spec`` (as ``BwrapSandbox.compatible_with`` says)."""
        return mounts_serve(
            spec,
            workspace_mb=self.config.workspace_mb,
            read_only_paths=self.config.read_only_paths,
            config=self.config.bwrap,
        )

    async def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back: its lease ends now; it is destroyed and replaced by a fresh one in the
        background."""
        owned = self._in_use.pop(sandbox.sandbox_id, None)
        if owned is None:
            raise ValueError(
                f"sandbox: {sandbox.sandbox_id} was not acquired from this pool (or released twice)"
            )
        owned.revoke()
        self._spawn(owned.close())
        self._refill()

    def _refill(self) -> None:
        if self._closed:
            return
        missing = self.config.num_warm - len(self._warm) - self._num_starting
        for _ in range(max(0, missing)):
            self._num_starting += 1  # counted now, not when the task first runs, or every caller would spawn
            self._spawn(self._start_one())

    async def _start_one(self) -> None:
        sandbox: BwrapSandbox | None = None
        try:
            async with self._start_slots:
                sandbox = await BwrapSandbox.start_generic(
                    self.config.bwrap,
                    workspace_mb=self.config.workspace_mb,
                    read_only_paths=self.config.read_only_paths,
                )
        except SandboxError as exc:
            logger.warning("could not start a warm sandbox: %s", exc)
        finally:
            self._num_starting -= 1
        if sandbox is not None:
            self.num_started += 1
            if self._closed:
                await sandbox.close()
                return
            self._warm.append(sandbox)
        # A waiting acquire takes it, or (after a failed start) re-checks whether a refill is still under way.
        await self._notify_warm_changed()

    async def _notify_warm_changed(self) -> None:
        async with self._warm_changed:
            self._warm_changed.notify_all()

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.config.health_check_interval_s)
            await self.check_health()

    async def check_health(self) -> int:
        """Ping every idle sandbox, replace the dead ones; returns how many were replaced."""
        idle = list(self._warm)
        results = await asyncio.gather(*(sandbox.ping() for sandbox in idle), return_exceptions=True)
        num_dead = 0
        for sandbox, result in zip(idle, results, strict=True):
            if isinstance(result, BaseException):
                num_dead += 1
                with contextlib.suppress(ValueError):
                    self._warm.remove(sandbox)
                self._spawn(sandbox.close())
        self.num_replaced += num_dead
        self._refill()
        return num_dead

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def close(self) -> None:
        """Close every sandbox of the pool, handed out or not. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._notify_warm_changed()  # waiting acquires raise "closed"
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        sandboxes = list(self._warm) + list(self._in_use.values())
        self._warm.clear()
        self._in_use.clear()
        await asyncio.gather(*(sandbox.close() for sandbox in sandboxes), return_exceptions=True)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
