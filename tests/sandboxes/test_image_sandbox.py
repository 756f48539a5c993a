"""Image sandboxes: an OCI image (built at set-up with mmdebstrap + umoci) unpacked once, run under bubblewrap
with every promise of the host-root backend. The escape battery re-runs on this backend in
``test_image_escape.py``."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from sandboxes.image import (
    ImageCache,
    ImageError,
    ImageSandboxConfig,
    ImageSandboxProvider,
    create_image_sandbox,
)
from tests.components.tasks.swebench_fixtures import ENV_IMAGE, IMAGE_ARCHIVE, IMAGE_LAYOUT, require_fixtures

SHARED_CACHE = Path.home() / ".cache" / "rein" / "images"
LIMITS = SandboxLimits(workspace_mb=64, memory_mb=512, max_processes=64)


@pytest.fixture(scope="module")
def image() -> str:
    require_fixtures(IMAGE_LAYOUT, IMAGE_ARCHIVE)
    return ENV_IMAGE


def test_concurrent_first_use_unpacks_once(image: str, tmp_path: Path) -> None:
    caches = [
        ImageCache(tmp_path / "cache") for _ in range(3)
    ]  # separate objects: only the file lock is shared
    results: list = [None] * len(caches)
    barrier = threading.Barrier(len(caches))

    def use(index: int) -> None:
        barrier.wait()
        results[index] = caches[index].unpack(image)

    threads = [threading.Thread(target=use, args=(index,)) for index in range(len(caches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert sum(cache.num_unpacks for cache in caches) == 1
    assert len({result.rootfs for result in results}) == 1
    rootfs = results[0].rootfs
    assert (rootfs / "usr" / "bin" / "python3").exists() and (rootfs / "testbed").is_dir()
    assert not list((tmp_path / "cache" / "rootfs").glob(".building-*"))  # no half-built leftovers


def test_bad_references_are_typed_errors(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")
    with pytest.raises(ImageError, match="expected 'oci:DIR:TAG'"):
        cache.unpack("docker://python:3.11")
    with pytest.raises(ImageError, match="does not exist"):
        cache.unpack(f"oci:{tmp_path}/nothing:latest")
    require_fixtures(IMAGE_LAYOUT)
    with pytest.raises(ImageError, match="no tag 'nope'"):
        cache.unpack(f"oci:{IMAGE_LAYOUT}:nope")


async def test_image_sandbox_runs_the_images_userland_confined(image: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("VALUE = 41\n")
    spec = SandboxSpec(workspace_source=repo, root_image=image, limits=LIMITS)
    config = ImageSandboxConfig(cache_dir=SHARED_CACHE)
    async with await create_image_sandbox(spec, config) as sandbox:
        probe = await sandbox.exec(
            "cd /testbed && python3 -c 'import mod, pytest, sys; print(mod.VALUE + 1, pytest.__version__, sys.prefix)'"
            " && id -u && grep -c bookworm /etc/os-release"
        )
        assert probe.exit_code == 0, probe.stderr
        answer, pytest_version, prefix, uid, debian = probe.stdout.split()
        assert answer == "42" and prefix == "/usr" and uid == "1000" and int(debian) >= 1
        await sandbox.exec("cd /testbed && echo changed > mod.py")
        assert await sandbox.read_file("mod.py") == b"changed\n"  # /testbed is the writable workspace
        # The image itself is read-only, the network absent.
        write = await sandbox.exec("touch /usr/lib/planted 2>&1; touch /etc/planted 2>&1; echo done")
        assert "Read-only file system" in write.stdout
        net = await sandbox.exec(
            "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\" 2>&1"
        )
        assert net.exit_code != 0 and "unreachable" in net.stdout.lower()
    unpacked = ImageCache(SHARED_CACHE).unpack(image)
    assert not (unpacked.rootfs / "usr" / "lib" / "planted").exists()
    assert (unpacked.rootfs / "testbed").is_dir() and not any((unpacked.rootfs / "testbed").iterdir())


async def test_pool_per_image_replaces_released_sandboxes_and_hides_paths(image: str) -> None:
    config = ImageSandboxConfig(
        cache_dir=SHARED_CACHE, num_warm_per_image=1, workspace_mb=64, hidden_paths=("/srv",)
    )
    spec = SandboxSpec(root_image=image, limits=LIMITS)
    async with ImageSandboxProvider(config) as provider:
        pool = await provider.pool_for(image)
        await pool.start()
        first = await provider.acquire(spec)
        hidden = await first.exec("ls -d /srv 2>&1; ls -d /var")
        assert "No such file" in hidden.stdout and "/var" in hidden.stdout
        await first.exec("echo secret > /testbed/left-behind; sleep 300 &")
        await provider.release(first)
        for _ in range(400):  # released sandboxes are destroyed (their lease ends) and replaced by fresh ones
            if pool.num_warm and not first.alive:
                break
            await asyncio.sleep(0.05)
        assert not first.alive
        second = await provider.acquire(spec)
        assert second.sandbox_id != first.sandbox_id
        leftover = await second.exec(
            "ls /testbed; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^sleep 300'"
        )
        assert "left-behind" not in leftover.stdout and leftover.stdout.split()[-1] == "0"
        await provider.release(second)
        with pytest.raises(ValueError, match="root_image"):
            await provider.acquire(SandboxSpec())
    # A host-root sandbox never silently runs an image spec.
    with pytest.raises(ValueError, match="root_image"):
        await BwrapSandbox.create(spec)


async def test_agent_programs_come_from_a_read_only_bind_not_the_image(image: str) -> None:
    """The npm agents' native programs (Claude Code's binary, Codex's static one) run inside the image from a
    read-only bind of the install directory; host paths inside the image's own trees are refused up front."""
    from tests.required_tools import require_tool

    agents = Path(__file__).resolve().parents[2] / ".agents"
    claude = agents / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
    codex = (
        agents
        / "node_modules"
        / "@openai"
        / "codex-linux-x64"
        / "vendor"
        / "x86_64-unknown-linux-musl"
        / "bin"
        / "codex"
    )
    require_tool(claude, "run `make setup-test` (npm install of the agents)")
    config = ImageSandboxConfig(cache_dir=SHARED_CACHE)
    spec = SandboxSpec(root_image=image, read_only_paths=(str(agents),))  # default limits: Bun maps a lot
    async with await create_image_sandbox(spec, config) as sandbox:
        versions = await sandbox.exec(f"HOME=/tmp {claude} --version && {codex} --version", timeout_s=120)
    assert versions.exit_code == 0, versions.stderr
    assert "Claude Code" in versions.stdout and "codex-cli" in versions.stdout
    with pytest.raises(ValueError, match="read_only_paths"):
        await create_image_sandbox(SandboxSpec(root_image=image, read_only_paths=("/usr/bin",)), config)
