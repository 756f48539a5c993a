"""The sandbox pool across a Ray cluster: one ``SandboxPoolActor`` per node, used from rollout code anywhere.

Each node runs one pool actor (pinned to it, named ``{name_prefix}-{node_id}``) owning that node's bubblewrap
sandboxes. Capacity is a Ray custom resource: start each node with ``--resources '{"sandbox_slots": N}'``
(``ray.init(resources=...)`` locally) and give rollout tasks/actors ``resources=sandbox_slot_request(config)``;
the scheduler then never places more rollouts on a node than it has sandbox slots, and each rollout uses its own
node's pool actor (``RaySandboxPool.acquire``), so workspace paths in a ``SandboxSpec`` are local paths.

Sandboxes cannot leave the process that started them (they are pipes to a supervisor), so the client side is a
``RaySandbox`` handle that forwards each call to the owning actor by sandbox id. Errors come back typed:
``SandboxError`` / ``FileNotFoundError`` / ``ValueError`` are re-raised as such on the caller's side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from components.config import require
from components.errors import SandboxError
from components.protocols import ExecResult, Sandbox, SandboxSpec
from sandboxes.archive import directory_archive, extract_single_entry
from sandboxes.cgroups import CgroupUnavailableError
from sandboxes.errors import SandboxFileRefusedError, SandboxLeaseEndedError
from sandboxes.pool import SandboxPool, SandboxPoolConfig

_ERRORS = {
    "SandboxError": SandboxError,
    "SandboxFileRefusedError": SandboxFileRefusedError,
    "SandboxLeaseEndedError": SandboxLeaseEndedError,
    "CgroupUnavailableError": CgroupUnavailableError,
    "FileNotFoundError": FileNotFoundError,
    "ValueError": ValueError,
}


@dataclass(kw_only=True, frozen=True)
class RaySandboxPoolConfig:
    """Per-node sandbox pools on a Ray cluster."""

    pool: SandboxPoolConfig = field(default_factory=SandboxPoolConfig)
    name_prefix: str = "rein-sandbox-pool"
    resource_name: str = "sandbox_slots"  # the custom resource a node's sandbox capacity is advertised as
    max_concurrency: int = 1000  # concurrent calls one pool actor serves

    def __post_init__(self) -> None:
        require(bool(self.name_prefix), "name_prefix", "must not be empty")
        require(bool(self.resource_name), "resource_name", "must not be empty")
        require(self.max_concurrency >= 1, "max_concurrency", f"must be >= 1, got {self.max_concurrency}")


def sandbox_slot_request(config: RaySandboxPoolConfig, num_slots: float = 1.0) -> dict[str, float]:
    """The ``resources=`` a rollout task needs so the scheduler places it on a node with a free sandbox."""
    return {config.resource_name: num_slots}


def _outcome(coroutine_result=None, error: BaseException | None = None) -> tuple:
    if error is None:
        return ("ok", coroutine_result)
    kind = type(error).__name__ if type(error).__name__ in _ERRORS else "SandboxError"
    return ("error", kind, str(error), getattr(error, "sandbox_id", ""))


def _unwrap(outcome: tuple):
    if outcome[0] == "ok":
        return outcome[1]
    _, kind, message, sandbox_id = outcome
    error = _ERRORS[kind](message)  # the message already names the sandbox
    if isinstance(error, SandboxError):
        error.sandbox_id = sandbox_id
    raise error


@ray.remote(num_cpus=0)
class SandboxPoolActor:
    """Owns one node's ``SandboxPool``; every method answers ``("ok", value)`` or ``("error", kind, text)``."""

    def __init__(self, config: SandboxPoolConfig) -> None:
        self._pool = SandboxPool(config)
        self._sandboxes: dict[str, Sandbox] = {}

    async def _call(self, coroutine_factory) -> tuple:
        try:
            return _outcome(await coroutine_factory())
        except (SandboxError, FileNotFoundError, ValueError, OSError) as exc:
            return _outcome(error=exc)

    def _get(self, sandbox_id: str) -> Sandbox:
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxError(
                "no such sandbox on this node (released, or its pool restarted)", sandbox_id=sandbox_id
            )
        return sandbox

    async def start(self) -> str:
        """Start the warm sandboxes; returns this node's id."""
        await self._pool.start()
        return ray.get_runtime_context().get_node_id()

    async def acquire(self, spec: SandboxSpec) -> tuple:
        """A sandbox id from this node's pool."""

        async def acquire():
            sandbox = await self._pool.acquire(spec)
            self._sandboxes[sandbox.sandbox_id] = sandbox
            return sandbox.sandbox_id

        return await self._call(acquire)

    async def release(self, sandbox_id: str) -> tuple:
        """Give a sandbox back to the pool."""

        async def release():
            sandbox = self._sandboxes.pop(sandbox_id, None)
            if sandbox is not None:
                await self._pool.release(sandbox)

        return await self._call(release)

    async def exec(self, sandbox_id: str, cmd, timeout_s, cwd, env) -> tuple:
        """``Sandbox.exec`` on one of our sandboxes."""
        return await self._call(
            lambda: self._get(sandbox_id).exec(cmd, timeout_s=timeout_s, cwd=cwd, env=env)
        )

    async def read_file(self, sandbox_id: str, path: str) -> tuple:
        """``Sandbox.read_file`` on one of our sandboxes."""
        return await self._call(lambda: self._get(sandbox_id).read_file(path))

    async def write_file(self, sandbox_id: str, path: str, data) -> tuple:
        """``Sandbox.write_file`` on one of our sandboxes."""
        return await self._call(lambda: self._get(sandbox_id).write_file(path, data))

    async def put_archive(self, sandbox_id: str, archive: bytes, remote_dir: str) -> tuple:
        """Unpack a tar archive into one of our sandboxes."""
        return await self._call(lambda: self._get(sandbox_id).upload_archive(archive, remote_dir))

    async def get_archive(self, sandbox_id: str, remote_path: str) -> tuple:
        """A one-entry tar archive of a path in one of our sandboxes."""
        return await self._call(lambda: self._get(sandbox_id).download_archive(remote_path))

    async def close_sandbox(self, sandbox_id: str) -> tuple:
        """Destroy one of our sandboxes."""

        async def close():
            sandbox = self._sandboxes.pop(sandbox_id, None)
            if sandbox is not None:
                await sandbox.close()
                with contextlib.suppress(ValueError):
                    await self._pool.release(sandbox)

        return await self._call(close)

    def stats(self) -> dict[str, int]:
        """Pool counters: warm, in use, cold starts."""
        return {
            "num_warm": self._pool.num_warm,
            "num_in_use": self._pool.num_in_use,
            "num_cold_starts": self._pool.num_cold_starts,
        }

    async def shutdown(self) -> None:
        """Close every sandbox of this node's pool."""
        self._sandboxes.clear()
        await self._pool.close()


def start_node_pools(config: RaySandboxPoolConfig) -> dict[str, ray.actor.ActorHandle]:
    """Start (or find) one pool actor on every alive node; returns them by node id, warm pools started.

    Keep the returned handles (e.g. on the driver) for as long as rollouts run: like every non-detached Ray
    actor, a pool actor ends when the last handle to it goes away, closing its sandboxes."""
    handles = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        node_id = node["NodeID"]
        handles[node_id] = SandboxPoolActor.options(
            name=f"{config.name_prefix}-{node_id}",
            get_if_exists=True,
            max_concurrency=config.max_concurrency,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(config.pool)
    ray.get([handle.start.remote() for handle in handles.values()])
    return handles


def shutdown_node_pools(config: RaySandboxPoolConfig) -> None:
    """Close every node's pool (all its sandboxes) and end the actors."""
    for node in ray.nodes():
        with contextlib.suppress(ValueError):
            handle = ray.get_actor(f"{config.name_prefix}-{node['NodeID']}")
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(handle.shutdown.remote())
            ray.kill(handle)


class RaySandbox:
    """A sandbox living in a node's pool actor; the ``Sandbox`` protocol forwarded call by call."""

    def __init__(self, actor: ray.actor.ActorHandle, sandbox_id: str) -> None:
        self._actor = actor
        self.sandbox_id = sandbox_id
        self._closed = False

    async def _forward(self, method: str, *args):
        if self._closed:
            raise SandboxError("sandbox is closed", sandbox_id=self.sandbox_id)
        try:
            outcome = await getattr(self._actor, method).remote(self.sandbox_id, *args)
        except ray.exceptions.RayError as exc:
            raise SandboxError(f"sandbox pool actor failed: {exc}", sandbox_id=self.sandbox_id) from exc
        return _unwrap(outcome)

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` in the sandbox (see ``BwrapSandbox.exec``)."""
        return await self._forward("exec", cmd if isinstance(cmd, str) else list(cmd), timeout_s, cwd, env)

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file in the sandbox."""
        return await self._forward("read_file", path)

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file in the sandbox."""
        await self._forward("write_file", path, data)

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        """Copy a local directory into the sandbox (shipped to the actor as an archive)."""
        await self._forward("put_archive", directory_archive(Path(local_dir)), remote_dir)

    async def download(self, remote_path: str, local_path: Path) -> None:
        """Copy a file or directory out of the sandbox to this process's node."""
        archive = await self._forward("get_archive", remote_path)
        extract_single_entry(archive, Path(local_path))

    async def close(self) -> None:
        """Destroy the sandbox (prefer ``RaySandboxPool.release`` to reuse it). Idempotent."""
        if not self._closed:
            with contextlib.suppress(SandboxError):
                await self._forward("close_sandbox")
            self._closed = True

    async def __aenter__(self) -> RaySandbox:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


class RaySandboxPool:
    """Client of the per-node pools: ``acquire`` uses the pool actor of the node this code runs on."""

    def __init__(self, config: RaySandboxPoolConfig | None = None) -> None:
        self.config = config or RaySandboxPoolConfig()

    def _local_actor(self) -> ray.actor.ActorHandle:
        node_id = ray.get_runtime_context().get_node_id()
        try:
            return ray.get_actor(f"{self.config.name_prefix}-{node_id}")
        except ValueError as exc:
            raise SandboxError(
                f"no sandbox pool actor on node {node_id}: call start_node_pools(config) first"
            ) from exc

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox:
        """A sandbox from this node's pool."""
        actor = self._local_actor()
        try:
            outcome = await actor.acquire.remote(spec or SandboxSpec())
        except ray.exceptions.RayError as exc:
            raise SandboxError(f"sandbox pool actor failed: {exc}") from exc
        return RaySandbox(actor, _unwrap(outcome))

    async def release(self, sandbox: Sandbox) -> None:
        """Give the sandbox back to its node's pool (destroyed there in the background; this handle is dead)."""
        if not isinstance(sandbox, RaySandbox):
            raise ValueError(f"sandbox: {sandbox.sandbox_id} did not come from a RaySandboxPool")
        sandbox._closed = True
        try:
            _unwrap(await sandbox._actor.release.remote(sandbox.sandbox_id))
        except ray.exceptions.RayError as exc:
            raise SandboxError(f"sandbox pool actor failed: {exc}", sandbox_id=sandbox.sandbox_id) from exc

    async def close(self) -> None:
        """Nothing to do on the client side: the node pools belong to whoever started them."""
