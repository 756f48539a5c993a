"""The Docker/Podman backend through the official ``docker`` client, against a local fake of the Engine API
(no daemon runs on these machines): the test image's ``docker save`` archive is loaded once, each sandbox is a
container without network and with cgroup limits, the repository lands at /testbed, exec/timeout/files work
and ``close`` removes the container."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.docker_backend import DockerSandboxConfig, DockerSandboxProvider
from tests.components.tasks.swebench_fixtures import IMAGE_ARCHIVE, require_fixtures
from tests.sandboxes.fake_docker_daemon import FakeDockerDaemon


async def test_docker_backend_against_the_fake_engine_api(tmp_path: Path) -> None:
    require_fixtures(IMAGE_ARCHIVE)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("VALUE = 41\n")
    image = f"docker-archive:{IMAGE_ARCHIVE}"
    limits = SandboxLimits(memory_mb=512, max_processes=64)
    with FakeDockerDaemon(tmp_path, Path.home() / ".cache" / "rein" / "images") as daemon:
        async with DockerSandboxProvider(DockerSandboxConfig(base_url=daemon.url)) as provider:
            sandbox = await provider.acquire(
                SandboxSpec(workspace_source=repo, root_image=image, limits=limits)
            )
            created = daemon.created[-1]
            assert created["NetworkDisabled"] is True and created["WorkingDir"] == "/testbed"
            assert (
                created["HostConfig"]["Memory"] == 512 * 1024 * 1024
                and created["HostConfig"]["PidsLimit"] == 64
            )
            probe = await sandbox.exec("python3 -c 'import mod; print(mod.VALUE + 1)'; echo oops >&2; exit 3")
            assert (probe.exit_code, probe.stdout, probe.stderr, probe.timed_out) == (
                3,
                "42\n",
                "oops\n",
                False,
            )
            slow = await sandbox.exec("sleep 30", timeout_s=1)
            assert slow.timed_out
            await sandbox.write_file("pkg/new.py", "X = 1\n")
            assert await sandbox.read_file("/testbed/pkg/new.py") == b"X = 1\n"
            with pytest.raises(FileNotFoundError):
                await sandbox.read_file("missing.py")
            await sandbox.download("pkg", tmp_path / "out")
            assert (tmp_path / "out" / "new.py").read_text() == "X = 1\n"
            second = await provider.acquire(SandboxSpec(root_image=image, limits=limits))
            assert len(daemon.images) == 1  # the archive was loaded once
            await provider.release(sandbox)
            assert len(daemon.removed) == 1
            with pytest.raises(ValueError, match="proxy_url"):
                await provider.acquire(SandboxSpec(root_image=image, proxy_url="http://127.0.0.1:9"))
            assert second.sandbox_id.startswith("docker-")
        assert len(daemon.removed) == 2  # close removed the one still handed out
