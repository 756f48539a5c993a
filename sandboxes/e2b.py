"""Remote sandboxes on E2B through the official ``e2b`` SDK (``e2b.AsyncSandbox``).

One E2B sandbox per ``acquire`` (E2B keeps its own warm capacity): ``AsyncSandbox.create(template=...,
timeout=..., api_key=..., allow_internet_access=...)``, commands through ``sandbox.commands.run(cmd, cwd=,
envs=, timeout=)`` (a non-zero exit raises ``CommandExitException``, which carries the result), files through
``sandbox.files.read/write``, and ``sandbox.kill()`` on release. The workspace lives at
``E2BSandboxConfig.workspace_dir``. Limits other than the command timeout are the template's.

Network: without ``proxy_url`` the sandbox gets no internet (``allow_internet_access=False``). With one, the
proxy must be reachable from E2B's cloud (a loopback URL cannot be, and is refused with ValueError); egress is
then allowed to that host only (``network={"allow_out": [host], "deny_out": ["0.0.0.0/0"]}``).

E2B's cloud cannot be reached from the machines this project is built on: the tests run this backend against
an in-process fake of the SDK surface above (``tests/sandboxes/fake_e2b_sdk.py``), injected via ``sdk_class``.
"""

from __future__ import annotations

import base64
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from components.config import require, require_positive
from components.errors import SandboxError
from components.protocols import ExecResult, Sandbox, SandboxSpec
from components.registry import SANDBOXES
from sandboxes.archive import directory_archive, extract_single_entry
from sandboxes.errors import SandboxFileRefusedError

# read_file, checked inside the sandbox: a regular file (after links) of at most MAX bytes, read with a cap
# even if it grows meanwhile; a FIFO swapped in after the check blocks only until the command's timeout.
# Exit codes: 3 absent, 4 not a regular file, 5 over the cap.
_READ_SCRIPT = (
    'f={path}; [ -e "$f" ] || exit 3; [ -f "$f" ] || exit 4; '
    '[ "$(stat -L -c %s "$f")" -le {max_bytes} ] || exit 5; head -c {read_bytes} "$f" | base64 -w0'
)


@SANDBOXES.register("e2b")
@dataclass(kw_only=True, frozen=True)
class E2BSandboxConfig:
    """Where and how E2B sandboxes are made."""

    template: str = "base"
    sandbox_timeout_s: int = 3600  # E2B kills a sandbox this long after creation
    api_key: str = ""  # empty: the SDK reads E2B_API_KEY
    domain: str = ""  # empty: the SDK's default (E2B_DOMAIN)
    workspace_dir: str = "/home/user/workspace"
    num_attempts: int = 3  # for creation and for idempotent calls (file writes)
    max_read_bytes: int = 64 * 1024 * 1024  # read_file: a larger file raises SandboxFileRefusedError
    max_download_bytes: int = 64 * 1024 * 1024  # download: bytes of the tar archive per call
    # The class whose ``create`` classmethod makes sandboxes; None means ``e2b.AsyncSandbox``. Tests pass a fake.
    sdk_class: Any = None

    def __post_init__(self) -> None:
        require_positive(self.sandbox_timeout_s, "sandbox_timeout_s")
        require_positive(self.max_read_bytes, "max_read_bytes")
        require_positive(self.max_download_bytes, "max_download_bytes")
        require(self.num_attempts >= 1, "num_attempts", f"must be >= 1, got {self.num_attempts}")
        require(
            self.workspace_dir.startswith("/"),
            "workspace_dir",
            f"must be absolute, got {self.workspace_dir!r}",
        )

    def build(self, *, read_only_paths: Sequence[str] = ()) -> E2BSandboxProvider:
        """The provider of this config (``sandbox`` kind ``e2b``; host paths do not reach E2B's cloud)."""
        return E2BSandboxProvider(self)


def _sdk() -> Any:
    import e2b

    return e2b


def _is_transient(exc: BaseException) -> bool:
    """Errors worth another try: rate limits, a busy service, a momentarily unreachable sandbox."""
    e2b = _sdk()
    return isinstance(
        exc, e2b.RateLimitException | e2b.ServiceBusyException | e2b.SandboxUnreachableException
    )


def _is_gone(exc: BaseException) -> bool:
    e2b = _sdk()
    return isinstance(exc, e2b.SandboxNotFoundException | e2b.SandboxNotRunningException)


class E2BSandbox:
    """One E2B sandbox behind Rein's ``Sandbox`` protocol."""

    def __init__(self, sdk_sandbox: Any, *, config: E2BSandboxConfig, spec: SandboxSpec) -> None:
        self._sdk_sandbox = sdk_sandbox
        self.config = config
        self.spec = spec
        self.sandbox_id = f"e2b-{sdk_sandbox.sandbox_id}"
        self._closed = False
        self._dead_reason = ""

    @classmethod
    async def create(
        cls, spec: SandboxSpec | None = None, config: E2BSandboxConfig | None = None
    ) -> E2BSandbox:
        """Create an E2B sandbox for ``spec`` and copy its workspace in (creation retried on transient errors)."""
        spec = spec or SandboxSpec()
        config = config or E2BSandboxConfig()
        sdk_class = config.sdk_class or _sdk().AsyncSandbox
        kwargs: dict[str, Any] = {"template": config.template, "timeout": config.sandbox_timeout_s}
        if config.api_key:
            kwargs["api_key"] = config.api_key
        if config.domain:
            kwargs["domain"] = config.domain
        if spec.env:
            kwargs["envs"] = dict(spec.env)
        if spec.proxy_url is None:
            kwargs["allow_internet_access"] = False
        else:
            parts = urlsplit(spec.proxy_url)
            if parts.hostname in (None, "127.0.0.1", "localhost", "::1"):
                raise ValueError(
                    f"proxy_url: an E2B sandbox cannot reach {spec.proxy_url!r}; give a URL reachable from E2B"
                )
            kwargs["network"] = {"allow_out": [parts.hostname], "deny_out": ["0.0.0.0/0"]}
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(config.num_attempts),
                wait=wait_exponential(multiplier=0.2, max=5.0),
                retry=retry_if_exception(_is_transient),
                reraise=True,
            ):
                with attempt:
                    sdk_sandbox = await sdk_class.create(**kwargs)
        except Exception as exc:
            raise SandboxError(f"could not create an E2B sandbox: {type(exc).__name__}: {exc}") from exc
        sandbox = cls(sdk_sandbox, config=config, spec=spec)
        try:
            await sandbox._run_checked(f"mkdir -p {shlex.quote(config.workspace_dir)}")
            if spec.workspace_source is not None:
                await sandbox.upload_dir(Path(spec.workspace_source), config.workspace_dir)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else os.path.join(self.config.workspace_dir, path)

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed", sandbox_id=self.sandbox_id)
        if self._dead_reason:
            raise SandboxError(self._dead_reason, sandbox_id=self.sandbox_id)

    def _wrap(self, exc: Exception, what: str) -> SandboxError:
        if _is_gone(exc):
            self._dead_reason = f"sandbox is gone ({type(exc).__name__}: {exc})"
            return SandboxError(self._dead_reason, sandbox_id=self.sandbox_id)
        return SandboxError(f"{what} failed: {type(exc).__name__}: {exc}", sandbox_id=self.sandbox_id)

    async def _idempotent(self, what: str, call):
        """Run an idempotent SDK call, retried on transient errors; typed errors out."""
        self._check_usable()
        e2b = _sdk()
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.config.num_attempts),
                wait=wait_exponential(multiplier=0.2, max=5.0),
                retry=retry_if_exception(_is_transient),
                reraise=True,
            ):
                with attempt:
                    return await call()
        except e2b.FileNotFoundException as exc:
            raise FileNotFoundError(str(exc)) from exc
        except (FileNotFoundError, IsADirectoryError):
            raise
        except Exception as exc:
            raise self._wrap(exc, what) from exc

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` with ``commands.run`` (never retried: a command may not be idempotent)."""
        self._check_usable()
        e2b = _sdk()
        timeout_s = self.spec.limits.command_timeout_s if timeout_s is None else timeout_s
        require_positive(timeout_s, "timeout_s")
        command = cmd if isinstance(cmd, str) else shlex.join(str(part) for part in cmd)
        try:
            result = await self._sdk_sandbox.commands.run(
                command,
                cwd=self._path(cwd or self.config.workspace_dir),
                envs={**self.spec.env, **(env or {})},
                timeout=timeout_s,
            )
        except e2b.CommandExitException as exc:
            return ExecResult(exit_code=exc.exit_code, stdout=exc.stdout or "", stderr=exc.stderr or "")
        except e2b.TimeoutException as exc:
            if _is_gone(exc) or isinstance(exc, e2b.SandboxUnreachableException):
                raise self._wrap(exc, "exec") from exc
            return ExecResult(exit_code=-9, stdout="", stderr=str(exc), timed_out=True)
        except Exception as exc:
            raise self._wrap(exc, "exec") from exc
        return ExecResult(exit_code=result.exit_code, stdout=result.stdout or "", stderr=result.stderr or "")

    async def _run_checked(self, command: str) -> str:
        result = await self.exec(command, timeout_s=120)
        if result.exit_code != 0:
            raise SandboxError(f"{command!r} failed: {result.stderr.strip()}", sandbox_id=self.sandbox_id)
        return result.stdout

    async def read_file(self, path: str) -> bytes:
        """The bytes of a regular file in the sandbox (FileNotFoundError if absent; SandboxFileRefusedError for
        anything else, or a file over ``max_read_bytes``): checked and capped inside the sandbox, so the host
        never receives more than the cap."""
        remote = self._path(path)
        max_bytes = self.config.max_read_bytes
        script = _READ_SCRIPT.format(path=shlex.quote(remote), max_bytes=max_bytes, read_bytes=max_bytes + 1)
        result = await self.exec(script, timeout_s=120)
        if result.exit_code == 3:
            raise FileNotFoundError(f"No such file or directory: {remote}")
        if result.exit_code in (4, 5):
            what = (
                "is not a regular file" if result.exit_code == 4 else f"is over the cap of {max_bytes} bytes"
            )
            raise SandboxFileRefusedError(f"read_file refused: {remote} {what}", sandbox_id=self.sandbox_id)
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(
                f"read_file {remote} failed: {result.stderr.strip()}", sandbox_id=self.sandbox_id
            )
        data = base64.b64decode(result.stdout)
        if len(data) > max_bytes:  # grew after the size check
            raise SandboxFileRefusedError(
                f"read_file refused: {remote} is over the cap of {max_bytes} bytes",
                sandbox_id=self.sandbox_id,
            )
        return data

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file in the sandbox (the SDK creates parent directories)."""
        await self._idempotent("write_file", lambda: self._sdk_sandbox.files.write(self._path(path), data))

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        """Copy a host directory (or a .tar/.tar.gz archive) into ``remote_dir`` as one archive + ``tar -x``."""
        local_dir = Path(local_dir)
        if not local_dir.exists():
            raise NotADirectoryError(f"local_dir: {local_dir} does not exist")
        archive = directory_archive(local_dir)
        staging = f"/tmp/rein-upload-{os.urandom(4).hex()}.tar"
        await self.write_file(staging, archive)
        target = shlex.quote(self._path(remote_dir))
        await self._run_checked(f"mkdir -p {target} && tar -xf {staging} -C {target} && rm -f {staging}")

    async def download(self, remote_path: str, local_path: Path) -> None:
        """Copy a file or directory out of the sandbox to ``local_path``."""
        remote = self._path(remote_path)
        parent, name = os.path.split(remote.rstrip("/"))
        cap = self.config.max_download_bytes
        encoded = await self._run_checked(
            f"tar -C {shlex.quote(parent or '/')} -cf - {shlex.quote(name)} | head -c {cap + 1} | base64 -w0"
        )  # binary output is not text-safe through commands.run; head bounds it (and stops tar) at the cap
        archive = base64.b64decode(encoded)
        if len(archive) > cap:
            raise SandboxFileRefusedError(
                f"download refused: {remote} is over the cap of {cap} bytes", sandbox_id=self.sandbox_id
            )
        extract_single_entry(archive, Path(local_path))

    async def close(self) -> None:
        """Kill the E2B sandbox. Idempotent; a sandbox already gone counts as closed."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._sdk_sandbox.kill()
        except Exception:  # already gone, or the API is down: E2B's own timeout reaps it
            pass

    async def __aenter__(self) -> E2BSandbox:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


class E2BSandboxProvider:
    """``acquire`` creates an E2B sandbox, ``release`` kills it (E2B pools capacity on its side)."""

    def __init__(self, config: E2BSandboxConfig | None = None) -> None:
        self.config = config or E2BSandboxConfig()
        self._live: dict[str, E2BSandbox] = {}

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox:
        """A new E2B sandbox for ``spec``."""
        sandbox = await E2BSandbox.create(spec, self.config)
        self._live[sandbox.sandbox_id] = sandbox
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Kill the sandbox."""
        self._live.pop(sandbox.sandbox_id, None)
        await sandbox.close()

    async def close(self) -> None:
        """Kill every sandbox still handed out."""
        live = list(self._live.values())
        self._live.clear()
        for sandbox in live:
            await sandbox.close()

    async def __aenter__(self) -> E2BSandboxProvider:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
