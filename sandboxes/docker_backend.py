"""Image tasks on a Docker or Podman daemon, through Docker's official Python client (``docker`` on PyPI), for
users who already run one. Daemonless image sandboxes (``sandboxes/image.py``) are the default; this backend
trades their pool and proxy path for the daemon's own isolation.

Each sandbox is one container of the spec's image (``docker://NAME:TAG`` as the daemon knows it, or a ``docker
save`` archive ``docker-archive:PATH``, loaded once), started with ``sleep infinity`` as its init'd main process,
no network (``network_disabled``), ``limits.memory_mb`` and ``limits.max_processes`` as cgroup limits, the
repository copied over the image's repository path (``/testbed``). ``exec`` is ``exec_run`` of ``timeout -s KILL
N sh -c CMD`` in that path (a command past its timeout is killed: ``timed_out``); files move as tar archives
(``put_archive`` / ``get_archive``); ``close`` removes the container. ``proxy_url`` is refused: a daemon has no
proxy-only path here (use image sandboxes or E2B for agents that call the policy from inside). Podman: point
``base_url`` at its socket (``unix:///run/podman/podman.sock``). Tested against a local fake daemon speaking
the Engine API over a Unix socket (``tests/sandboxes/fake_docker_daemon.py``); no daemon runs here.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import posixpath
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from components.config import require, require_positive
from components.errors import SandboxError
from components.protocols import ExecResult, SandboxSpec
from sandboxes.archive import directory_archive, extract_single_entry


@dataclass(frozen=True, kw_only=True)
class DockerSandboxConfig:
    """Where the daemon is and how containers are made."""

    base_url: str = ""  # "" = the environment's DOCKER_HOST or the default socket
    api_version: str = "1.41"
    repo_path: str = "/testbed"
    user: str = ""  # "" = the image's user (SWE-bench images: root inside the container)
    grace_s: float = 10.0  # host-side margin past an exec's own timeout

    def __post_init__(self) -> None:
        require(self.repo_path.startswith("/"), "repo_path", f"must be absolute, got {self.repo_path!r}")
        require_positive(self.grace_s, "grace_s")


class DockerSandbox:
    """One container; create with ``await DockerSandbox.create(spec, config)``."""

    _ids = itertools.count()

    def __init__(self, container, config: DockerSandboxConfig, spec: SandboxSpec) -> None:
        self.container = container
        self.config = config
        self.spec = spec
        self.sandbox_id = f"docker-{os.getpid()}-{next(self._ids)}-{container.id[:12]}"
        self._closed = False

    @classmethod
    async def create(cls, spec: SandboxSpec, config: DockerSandboxConfig, client=None) -> DockerSandbox:
        """Start a container of ``spec.root_image`` with the workspace at ``config.repo_path``."""
        require(spec.root_image is not None, "root_image", "a Docker sandbox needs a spec naming its image")
        require(spec.proxy_url is None, "proxy_url", "the Docker backend has no proxy-only path")
        client = client or _client(config)
        try:
            image = await asyncio.to_thread(_image_in_daemon, client, spec.root_image)
            container = await asyncio.to_thread(
                client.containers.run,
                image,
                ["sleep", "infinity"],
                detach=True,
                init=True,
                network_disabled=True,
                mem_limit=f"{spec.limits.memory_mb}m",
                pids_limit=spec.limits.max_processes,
                working_dir=config.repo_path,
                environment=dict(spec.env),
                labels={"rein.sandbox": "1"},
                **({"user": config.user} if config.user else {}),
            )
        except Exception as exc:  # the SDK's errors (APIError, ImageNotFound, connection errors)
            raise SandboxError(f"could not start a container of {spec.root_image}: {exc}") from exc
        sandbox = cls(container, config, spec)
        try:
            if spec.workspace_source is not None:
                await sandbox.exec(
                    [
                        "sh",
                        "-c",
                        f"mkdir -p {config.repo_path} && find -H {config.repo_path} -mindepth 1 -delete",
                    ]
                )
                archive = await asyncio.to_thread(directory_archive, Path(spec.workspace_source))
                await sandbox.upload_archive(archive, config.repo_path)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.config.repo_path, path)

    async def _call(self, function, *args, **kwargs):
        if self._closed:
            raise SandboxError("sandbox is closed", sandbox_id=self.sandbox_id)
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except Exception as exc:
            if exc.__class__.__name__ == "NotFound":
                raise FileNotFoundError(str(exc)) from exc
            raise SandboxError(f"docker: {exc}", sandbox_id=self.sandbox_id) from exc

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (shell string or argv) in the repository path (or ``cwd``), killed at ``timeout_s``."""
        timeout_s = self.spec.limits.command_timeout_s if timeout_s is None else timeout_s
        require_positive(timeout_s, "timeout_s")
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(part) for part in cmd]
        command = ["timeout", "-s", "KILL", f"{timeout_s:g}", *argv]
        try:
            result = await asyncio.wait_for(
                self._call(
                    self.container.exec_run,
                    command,
                    workdir=self._path(cwd) if cwd else self.config.repo_path,
                    environment={**self.spec.env, **(env or {})},
                    demux=True,
                ),
                timeout_s + self.config.grace_s,
            )
        except TimeoutError as exc:
            raise SandboxError(
                f"exec did not return within {timeout_s:g} s", sandbox_id=self.sandbox_id
            ) from exc
        stdout, stderr = result.output if result.output else (b"", b"")
        return ExecResult(
            exit_code=result.exit_code,
            stdout=(stdout or b"").decode(errors="replace"),
            stderr=(stderr or b"").decode(errors="replace"),
            timed_out=result.exit_code == 137,
        )

    async def upload_archive(self, archive: bytes, remote_dir: str) -> None:
        """Unpack a tar archive into ``remote_dir``."""
        ok = await self._call(self.container.put_archive, self._path(remote_dir), archive)
        if not ok:
            raise SandboxError(f"put_archive into {remote_dir} refused", sandbox_id=self.sandbox_id)

    async def download_archive(self, remote_path: str) -> bytes:
        """A tar archive holding the file or directory at ``remote_path``."""
        chunks, _ = await self._call(self.container.get_archive, self._path(remote_path))
        return await asyncio.to_thread(lambda: b"".join(chunks))

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file (FileNotFoundError if absent)."""
        archive = await self.download_archive(path)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise (
                    IsADirectoryError(path)
                    if member is not None and member.isdir()
                    else FileNotFoundError(path)
                )
            return tar.extractfile(member).read()

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file (parents created)."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        full = self._path(path)
        await self.exec(["mkdir", "-p", posixpath.dirname(full)])
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(posixpath.basename(full))
            info.size = len(payload)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(payload))
        await self.upload_archive(buffer.getvalue(), posixpath.dirname(full))

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        """Copy a host directory's contents into ``remote_dir``."""
        if not Path(local_dir).is_dir():
            raise NotADirectoryError(f"local_dir: {local_dir} is not a directory")
        await self.exec(["mkdir", "-p", self._path(remote_dir)])
        await self.upload_archive(await asyncio.to_thread(directory_archive, Path(local_dir)), remote_dir)

    async def download(self, remote_path: str, local_path: Path) -> None:
        """Copy a file or directory out to ``local_path`` on the host."""
        archive = await self.download_archive(remote_path)
        await asyncio.to_thread(extract_single_entry, archive, Path(local_path))

    async def close(self) -> None:
        """Remove the container (and everything in it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.to_thread(self.container.remove, force=True)
        except Exception:  # already gone: nothing left to remove
            pass

    async def __aenter__(self) -> DockerSandbox:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


class DockerSandboxProvider:
    """A ``SandboxProvider``: ``acquire`` starts a container, ``release`` removes it."""

    def __init__(self, config: DockerSandboxConfig | None = None) -> None:
        self.config = config or DockerSandboxConfig()
        self._client = None
        self._live: dict[str, DockerSandbox] = {}

    async def acquire(self, spec: SandboxSpec | None = None) -> DockerSandbox:
        """A new container for ``spec`` (``root_image`` required)."""
        if spec is None or spec.root_image is None:
            raise ValueError("root_image: a Docker sandbox needs a spec naming its image")
        self._client = self._client or _client(self.config)
        sandbox = await DockerSandbox.create(spec, self.config, self._client)
        self._live[sandbox.sandbox_id] = sandbox
        return sandbox

    async def release(self, sandbox: DockerSandbox) -> None:
        """Remove the container."""
        self._live.pop(sandbox.sandbox_id, None)
        await sandbox.close()

    async def close(self) -> None:
        """Remove every container still handed out."""
        live, self._live = list(self._live.values()), {}
        for sandbox in live:
            await sandbox.close()

    async def __aenter__(self) -> DockerSandboxProvider:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


def _client(config: DockerSandboxConfig):
    import docker

    if config.base_url:
        return docker.DockerClient(base_url=config.base_url, version=config.api_version)
    return docker.from_env(version=config.api_version)


_LOADED: dict[tuple[str, str], str] = {}


def _image_in_daemon(client, reference: str) -> str:
    """The daemon's name for ``reference``: ``docker://NAME`` as is; a ``docker-archive:`` loaded once."""
    if reference.startswith("docker://"):
        return reference.removeprefix("docker://")
    if reference.startswith("docker-archive:"):
        path = reference.removeprefix("docker-archive:")
        key = (client.api.base_url, path)
        if key not in _LOADED:
            with open(path, "rb") as archive:
                images = client.images.load(archive)
            if not images:
                raise SandboxError(f"the daemon loaded no image from {path}")
            _LOADED[key] = images[0].id
        return _LOADED[key]
    raise ValueError(
        f"root_image: the Docker backend takes docker://NAME or docker-archive:PATH, got {reference!r}"
    )
