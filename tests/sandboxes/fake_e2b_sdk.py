"""An in-process fake of the slice of ``e2b.AsyncSandbox`` that ``sandboxes.e2b`` uses (E2B's cloud is out of
reach here). It is faithful to the SDK's surface and error types - ``create(**kwargs)`` as a classmethod,
``commands.run`` raising ``e2b.CommandExitException`` on a non-zero exit and ``e2b.TimeoutException`` past its
timeout, ``files.read(format="bytes")`` returning a bytearray and raising ``e2b.FileNotFoundException``,
``kill()``, then ``e2b.SandboxNotFoundException`` from every later call - and runs the commands for real in a
local bubblewrap sandbox standing in for the remote VM (its workspace is ``/workspace``).
"""

from __future__ import annotations

import itertools

import e2b

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.bwrap import BwrapSandbox


class _Commands:
    def __init__(self, owner: FakeAsyncSandbox) -> None:
        self._owner = owner

    async def run(self, cmd: str, background=None, envs=None, user=None, cwd=None, timeout=60, **_):
        self._owner._check_alive()
        result = await self._owner._vm.exec(cmd, cwd=cwd, env=envs or {}, timeout_s=timeout)
        if result.timed_out:
            raise e2b.TimeoutException("context deadline exceeded: the command timed out")
        if result.exit_code != 0:
            raise e2b.CommandExitException(
                stderr=result.stderr, stdout=result.stdout, exit_code=result.exit_code, error=None
            )
        return e2b.CommandResult(stderr=result.stderr, stdout=result.stdout, exit_code=0, error=None)


class _Files:
    def __init__(self, owner: FakeAsyncSandbox) -> None:
        self._owner = owner

    async def read(self, path: str, format: str = "text", **_):
        self._owner._check_alive()
        try:
            data = await self._owner._vm.read_file(path)
        except FileNotFoundError as exc:
            raise e2b.FileNotFoundException(f"file not found: {path}") from exc
        return bytearray(data) if format == "bytes" else data.decode()

    async def write(self, path: str, data, **_):
        self._owner._check_alive()
        await self._owner._vm.write_file(path, data)


class FakeAsyncSandbox:
    """Stands in for ``e2b.AsyncSandbox``; every instance is recorded in ``created``."""

    created: list[FakeAsyncSandbox] = []
    _ids = itertools.count()
    # Fault injection: this many next ``create`` calls raise ``e2b.RateLimitException`` first.
    fail_next_creates = 0

    def __init__(self, vm: BwrapSandbox, create_kwargs: dict) -> None:
        self._vm = vm
        self.create_kwargs = create_kwargs
        self.sandbox_id = f"fake{next(self._ids)}"
        self.commands = _Commands(self)
        self.files = _Files(self)
        self.killed = False

    @classmethod
    async def create(cls, template=None, timeout=None, **kwargs) -> FakeAsyncSandbox:
        if cls.fail_next_creates > 0:
            cls.fail_next_creates -= 1
            raise e2b.RateLimitException("429: rate limit exceeded")
        vm = await BwrapSandbox.create(SandboxSpec(limits=SandboxLimits(command_timeout_s=timeout or 300)))
        sandbox = cls(vm, {"template": template, "timeout": timeout, **kwargs})
        cls.created.append(sandbox)
        return sandbox

    def _check_alive(self) -> None:
        if self.killed or not self._vm.alive:
            raise e2b.SandboxNotFoundException(f"sandbox {self.sandbox_id} not found")

    async def kill(self, **_) -> bool:
        was_alive = not self.killed
        self.killed = True
        await self._vm.close()
        return was_alive
