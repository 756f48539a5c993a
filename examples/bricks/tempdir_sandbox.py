"""A third-party sandbox brick in one file: commands run in a fresh temporary directory on the host.
It shows the seam only — it isolates nothing (use ``sandboxes.bwrap`` for agents).

    pytest tests/contracts/test_sandbox_contract.py --brick examples.bricks.tempdir_sandbox:TempDirSandbox.create
"""

import asyncio
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

from components.errors import SandboxError
from components.protocols import ExecResult, SandboxSpec


class TempDirSandbox:
    """Implements ``components.protocols.Sandbox``."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.sandbox_id, self.spec = uuid.uuid4().hex[:8], spec
        self.root = Path(tempfile.mkdtemp(prefix="tempdir-sandbox-"))
        source = spec.workspace_source
        if source is not None and source.is_dir():
            shutil.copytree(source, self.root, dirs_exist_ok=True)
        elif source is not None:  # a .tar.gz
            shutil.unpack_archive(source, self.root, format="gztar")

    @classmethod
    async def create(cls, spec: SandboxSpec) -> "TempDirSandbox":
        return cls(spec)

    def _path(self, path: str) -> Path:
        if not self.root.exists():
            raise SandboxError("closed", sandbox_id=self.sandbox_id)
        return self.root / path

    async def exec(self, cmd, *, timeout_s=None, cwd=None, env=None) -> ExecResult:
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=self._path(cwd or "."), env={**os.environ, **self.spec.env, **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            timeout = timeout_s or self.spec.limits.command_timeout_s
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)  # the whole process group, not only bash
            stdout, stderr = await process.communicate()
            return ExecResult(exit_code=-9, stdout=stdout.decode(), stderr=stderr.decode(), timed_out=True)
        return ExecResult(exit_code=process.returncode, stdout=stdout.decode(), stderr=stderr.decode())

    async def read_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    async def write_file(self, path: str, data: bytes | str) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        shutil.copytree(local_dir, self._path(remote_dir), dirs_exist_ok=True)

    async def download(self, remote_path: str, local_path: Path) -> None:
        source = self._path(remote_path)
        (shutil.copytree if source.is_dir() else shutil.copy)(source, local_path)

    async def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    async def __aenter__(self) -> "TempDirSandbox":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
