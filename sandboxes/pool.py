"""A pool of pre-started bubblewrap sandboxes: ``acquire`` hands one out in microseconds.

Warm sandboxes are *generic*: started with the pool's mounts (``read_only_paths``, ``workspace_mb``) and no
spec. ``acquire(spec)`` takes a warm one whose mounts can serve the spec and returns it at once; copying the
spec's workspace in and opening its proxy path run in the background, and the sandbox's first call waits for
them (``BwrapSandbox.prepare_in_background``). A spec the warm sandboxes cannot serve (another workspace size,
a path the pool does not mount) gets a cold sandbox. A health loop pings idle sandboxes and replaces dead ones.

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
import logging
from collections import deque
from dataclasses import dataclass, field

from components.config import require, require_non_negative, require_positive
from components.errors import SandboxError
from components.protocols import Sandbox, SandboxSpec
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig, cgroup_hierarchy, validate_spec

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class SandboxPoolConfig:
    """A local pool of warm bubblewrap sandboxes."""

    num_warm: int = 4  # idle, started sandboxes kept ready
    # Mounts of the warm sandboxes; a spec asking for a subset of these paths (and this workspace size) is served
    # warm. Typically the venv and the npm agents: ("/work/main/.venv", "/work/main/.agents").
    read_only_paths: tuple[str, ...] = ()
    workspace_mb: int = 256
    health_check_interval_s: float = 10.0
    bwrap: BwrapSandboxConfig = field(default_factory=BwrapSandboxConfig)

    def __post_init__(self) -> None:
        require_non_negative(self.num_warm, "num_warm")
        require_positive(self.workspace_mb, "workspace_mb")
        require_positive(self.health_check_interval_s, "health_check_interval_s")
        for path in self.read_only_paths:
            require(path.startswith("/"), "read_only_paths", f"must be absolute paths, got {path!r}")


class SandboxPool:
    """Keeps ``num_warm`` bubblewrap sandboxes started; use as ``async with SandboxPool(config) as pool``."""

    def __init__(self, config: SandboxPoolConfig | None = None) -> None:
        self.config = config or SandboxPoolConfig()
        self._warm: deque[BwrapSandbox] = deque()
        self._in_use: dict[str, BwrapSandbox] = {}
        self._num_starting = 0
        self._background: set[asyncio.Task] = set()
        self._health_task: asyncio.Task | None = None
        self._started = False
        self._closed = False
        self.num_cold_starts = 0  # acquires no warm sandbox could serve
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
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        while self._warm:
            sandbox = self._warm.popleft()
            if not sandbox.alive:
                self._spawn(sandbox.close())
                continue
            if not sandbox.compatible_with(spec):
                self._warm.appendleft(sandbox)
                break
            sandbox.prepare_in_background(spec)
            self._in_use[sandbox.sandbox_id] = sandbox
            self._refill()
            return sandbox
        self.num_cold_starts += 1
        self._refill()
        sandbox = await BwrapSandbox.create(spec, self.config.bwrap)
        self._in_use[sandbox.sandbox_id] = sandbox
        return sandbox

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
        try:
            sandbox = await BwrapSandbox.start_generic(
                self.config.bwrap,
                workspace_mb=self.config.workspace_mb,
                read_only_paths=self.config.read_only_paths,
            )
        except SandboxError as exc:
            logger.warning("could not start a warm sandbox: %s", exc)
            return
        finally:
            self._num_starting -= 1
        self.num_started += 1
        if self._closed:
            await sandbox.close()
        else:
            self._warm.append(sandbox)

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
