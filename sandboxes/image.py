"""Image sandboxes without a container daemon: an OCI image's root filesystem as ``/`` of a bubblewrap sandbox.

An image is named in skopeo's transport syntax: ``oci:DIR:TAG`` (an OCI image layout, as ``skopeo copy
docker://… oci:DIR:TAG`` writes it) or ``docker-archive:PATH`` (a ``docker save`` tarball). ``ImageCache``
unpacks each image once with the real tools (``skopeo copy`` turns an archive into an OCI layout, ``umoci
unpack`` applies the layers and their whiteouts) into ``CACHE/rootfs/<manifest digest>/``; concurrent first
uses, in threads or in processes, wait on one file lock, so an image is unpacked exactly once.

An image sandbox is a ``BwrapSandbox`` whose ``BwrapSandboxConfig.root_dir`` is that cached root filesystem:
its top-level directories are bound read-only at ``/usr``, ``/etc``, ``/opt``… in place of the host's, and the
private writable layer is the same size-capped tmpfs ``/workspace`` the host sandboxes have, holding a copy of
the task's repository and reachable at the image's repository path (``/testbed``: a symlink). Everything else
is the bubblewrap backend unchanged: no network (or the proxy-only path), a per-sandbox unprivileged uid, CPU,
memory and process limits, the supervisor as PID 1, reset on release, the warm pool (one ``SandboxPool`` per
image). The image's own ``/root``, ``/home``, ``/tmp``, ``/run``, ``/proc``, ``/dev`` and ``/sys`` are not
used (fresh tmpfs / kernel mounts instead), nor any top-level path listed in ``hidden_paths``.

An image is data, not trust: every path the host touches in it (the entries it binds, ``/opt``'s children, the
repository it copies, the files it masks) is resolved inside the root filesystem (``sandboxes/rootfs_paths.py``),
and an image whose symlinks would lead out of it is refused with ``ImageLayoutError``.

The supervisor is the host's Python, bound read-only at its own path, running on the image's C library: the
image needs a glibc at least as new as the one that Python was built against (2.35 for this project's
interpreter: Debian 12, Ubuntu 22.04 and the SWE-bench images qualify). ``prlimit`` comes from the image's
``util-linux``.

Why a copied working tree rather than fuse-overlayfs: a copy into tmpfs needs no FUSE daemon per sandbox and
no host mount to clean up after a crash, reuses the pool's reset unchanged, and keeps the cached root filesystem
read-only; ``benchmarks/image_sandbox.py`` measures both (the copy costs time proportional to the repository).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from components.config import require, require_non_negative
from components.errors import SandboxError
from components.protocols import Sandbox, SandboxSpec
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig
from sandboxes.pool import SandboxPool, SandboxPoolConfig
from sandboxes.rootfs_paths import resolve_in_root

DEFAULT_IMAGE_CACHE = Path.home() / ".cache" / "rein" / "images"
# Top-level entries of an image never bound into a sandbox: kernel file systems and per-sandbox tmpfs come
# from bubblewrap, and the supervisor's own paths must stay free.
_NOT_FROM_IMAGE = frozenset({"proc", "dev", "sys", "tmp", "run", "root", "home", "workspace", "lost+found"})


# Top-level image directories that rein also mounts into: their children are bound individually.
_SHARED_WITH_SUPERVISOR = frozenset({"opt"})


class ImageError(ValueError):
    """An image that cannot be used: unknown reference, missing tag, unpack failure (message says which)."""


@dataclass(frozen=True, kw_only=True)
class UnpackedImage:
    """An image unpacked in the cache: its root filesystem and its config's environment and working dir."""

    reference: str
    digest: str
    rootfs: Path
    env: dict[str, str]
    workdir: str

    def path(self, inside: str) -> Path:
        """The host path of ``inside`` (a path as the sandbox names it), resolved within the root filesystem:
        the image's symlinks never lead the host out of it (``ImageLayoutError`` where they would)."""
        return resolve_in_root(self.rootfs, inside)


def parse_reference(reference: str) -> tuple[str, Path, str]:
    """``oci:DIR:TAG`` -> ("oci", DIR, TAG); ``docker-archive:PATH`` -> ("docker-archive", PATH, "")."""
    transport, _, rest = reference.partition(":")
    if transport == "oci" and rest:
        directory, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
        return "oci", Path(directory), tag or "latest"
    if transport == "docker-archive" and rest:
        return "docker-archive", Path(rest.split(":", 1)[0]), ""
    raise ImageError(f"image {reference!r}: expected 'oci:DIR:TAG' or 'docker-archive:PATH'")


def _run_tool(argv: list[str], what: str, timeout_s: float) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as exc:
        raise ImageError(f"{what}: {argv[0]} is not installed (apt-get install umoci skopeo)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what}: {argv[0]} did not finish within {timeout_s:.0f} s") from exc
    if result.returncode != 0:
        raise ImageError(f"{what}: {' '.join(argv[:2])} failed: {result.stderr.strip()[-1000:]}")


class ImageCache:
    """Unpacks images once into ``cache_dir`` (safe under concurrent first use); see the module docstring."""

    def __init__(self, cache_dir: Path = DEFAULT_IMAGE_CACHE, *, unpack_timeout_s: float = 1800.0) -> None:
        self.cache_dir = Path(cache_dir)
        self.unpack_timeout_s = unpack_timeout_s
        self.num_unpacks = 0  # images this object unpacked (not found already in the cache)
        self._memo: dict[tuple[str, float], UnpackedImage] = {}
        self._memo_lock = threading.Lock()

    def unpack(self, reference: str) -> UnpackedImage:
        """The image's unpacked root filesystem, unpacking it first if no process did yet."""
        transport, path, tag = parse_reference(reference)
        if not path.exists():
            raise ImageError(f"image {reference!r}: {path} does not exist")
        memo_key = (reference, path.stat().st_mtime)
        with self._memo_lock:
            if memo_key in self._memo:
                return self._memo[memo_key]
        if transport == "docker-archive":
            layout, tag = self._archive_as_layout(reference, path), "image"
        else:
            layout = path
        digest = _manifest_digest(layout, tag, reference)
        unpacked = self._unpack_layout(reference, layout, tag, digest)
        with self._memo_lock:
            self._memo[memo_key] = unpacked
        return unpacked

    def _locked(self, name: str) -> contextlib.AbstractContextManager:
        (self.cache_dir / "locks").mkdir(parents=True, exist_ok=True)
        return _FileLock(self.cache_dir / "locks" / f"{name}.lock")

    def _archive_as_layout(self, reference: str, archive: Path) -> Path:
        stat = archive.stat()
        key = hashlib.sha256(f"{archive.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[
            :24
        ]
        layout = self.cache_dir / "layouts" / key
        with self._locked(f"layout-{key}"):
            if not (layout / "index.json").is_file():
                building = Path(tempfile.mkdtemp(prefix=".building-", dir=self.cache_dir))
                try:
                    _run_tool(
                        [
                            "skopeo",
                            "copy",
                            "--quiet",
                            f"docker-archive:{archive}",
                            f"oci:{building}/oci:image",
                        ],
                        f"image {reference!r}",
                        self.unpack_timeout_s,
                    )
                    layout.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(building / "oci", layout)
                finally:
                    shutil.rmtree(building, ignore_errors=True)
        return layout

    def _unpack_layout(self, reference: str, layout: Path, tag: str, digest: str) -> UnpackedImage:
        target = self.cache_dir / "rootfs" / digest.replace(":", "-")
        with self._locked(digest.replace(":", "-")):
            if not (target / "config.json").is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                building = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
                try:
                    _run_tool(
                        ["umoci", "unpack", "--image", f"{layout}:{tag}", str(building / "bundle")],
                        f"image {reference!r}",
                        self.unpack_timeout_s,
                    )
                    shutil.rmtree(target, ignore_errors=True)
                    os.replace(building / "bundle", target)
                    self.num_unpacks += 1
                finally:
                    shutil.rmtree(building, ignore_errors=True)
        config = json.loads((target / "config.json").read_text())
        process = config.get("process", {})
        env = dict(item.split("=", 1) for item in process.get("env", []) if "=" in item)
        return UnpackedImage(
            reference=reference,
            digest=digest,
            rootfs=target / "rootfs",
            env=env,
            workdir=process.get("cwd", "/"),
        )


class _FileLock:
    """An exclusive ``flock`` on a file: serialises threads (each opens its own descriptor) and processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def __enter__(self) -> _FileLock:
        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def _manifest_digest(layout: Path, tag: str, reference: str) -> str:
    try:
        index = json.loads((layout / "index.json").read_text())
    except (OSError, ValueError) as exc:
        raise ImageError(f"image {reference!r}: {layout} is not an OCI image layout ({exc})") from exc
    manifests = index.get("manifests", [])
    for manifest in manifests:
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return manifest["digest"]
    tags = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in manifests]
    raise ImageError(f"image {reference!r}: no tag {tag!r} in {layout} (tags: {tags})")


def image_bwrap_config(
    unpacked: UnpackedImage,
    *,
    repo_path: str = "/testbed",
    hidden_paths: tuple[str, ...] = (),
    base: BwrapSandboxConfig | None = None,
) -> BwrapSandboxConfig:
    """The bubblewrap config of sandboxes on this image (its top-level directories in place of the host's)."""
    require(
        repo_path.startswith("/") and repo_path.count("/") == 1 and len(repo_path) > 1,
        "repo_path",
        f"must be a top-level absolute path such as /testbed, got {repo_path!r}",
    )
    hidden = {path.strip("/") for path in hidden_paths}
    entries: list[str] = []
    for name in sorted(os.listdir(unpacked.rootfs)):
        if name in _NOT_FROM_IMAGE or name in hidden or f"/{name}" == repo_path:
            continue
        if name in _SHARED_WITH_SUPERVISOR:
            # /opt also holds the supervisor (/opt/rein): bind the image's entries one by one instead, listed
            # where /opt really is inside the image (it may be a link), never through the host's /opt. A link
            # to nothing inside the image leaves /opt the supervisor's alone.
            shared = unpacked.path(f"/{name}")
            if shared.is_dir():
                entries += [f"/{name}/{child}" for child in sorted(os.listdir(shared)) if child != "rein"]
        else:
            entries.append(f"/{name}")
    return replace(
        base or BwrapSandboxConfig(),
        host_paths=tuple(entries),
        root_dir=str(unpacked.rootfs),
        workspace_aliases=(repo_path,),
    )


def check_read_only_paths(config: BwrapSandboxConfig, paths: tuple[str, ...]) -> None:
    """ValueError for host paths that would land inside a directory the image provides (``/usr/bin/node``):
    bubblewrap cannot mount over the image's read-only tree, and the program would shadow the image's own
    files. Agent programs come from directories outside it (``.agents``, the venv)."""
    inside = [
        path
        for path in paths
        if any(path == top or path.startswith(top.rstrip("/") + "/") for top in config.host_paths)
    ]
    require(
        not inside,
        "read_only_paths",
        f"{inside} lie inside directories the image provides; bind programs from elsewhere (e.g. .agents)",
    )


@dataclass(frozen=True, kw_only=True)
class ImageSandboxConfig:
    """Image sandboxes: where images are unpacked, and the warm pool kept per image."""

    cache_dir: Path = DEFAULT_IMAGE_CACHE
    repo_path: str = "/testbed"  # where the task's repository appears inside (the data sets use /testbed)
    # Top-level image paths the agent must not see (R2E-Gym keeps its hidden tests in /r2e_tests).
    hidden_paths: tuple[str, ...] = ()
    num_warm_per_image: int = 1
    read_only_paths: tuple[str, ...] = ()  # host paths bound into every sandbox (agent install dirs, a venv)
    workspace_mb: int = 256
    bwrap: BwrapSandboxConfig = field(default_factory=BwrapSandboxConfig)

    def __post_init__(self) -> None:
        require_non_negative(self.num_warm_per_image, "num_warm_per_image")
        require(self.repo_path.startswith("/"), "repo_path", f"must be absolute, got {self.repo_path!r}")


class ImageSandboxProvider:
    """A ``SandboxProvider`` for specs with ``root_image``: one warm ``SandboxPool`` per image."""

    def __init__(self, config: ImageSandboxConfig | None = None, *, cache: ImageCache | None = None) -> None:
        self.config = config or ImageSandboxConfig()
        self.cache = cache or ImageCache(self.config.cache_dir)
        self._pools: dict[str, SandboxPool] = {}
        self._owner: dict[str, SandboxPool] = {}
        self._pool_lock = asyncio.Lock()

    async def pool_for(self, reference: str) -> SandboxPool:
        """The warm pool of sandboxes on ``reference`` (the image is unpacked on first use, off the loop)."""
        async with self._pool_lock:
            pool = self._pools.get(reference)
            if pool is None:
                unpacked = await asyncio.to_thread(self.cache.unpack, reference)
                bwrap = image_bwrap_config(
                    unpacked,
                    repo_path=self.config.repo_path,
                    hidden_paths=self.config.hidden_paths,
                    base=self.config.bwrap,
                )
                check_read_only_paths(bwrap, self.config.read_only_paths)
                pool = SandboxPool(
                    SandboxPoolConfig(
                        num_warm=self.config.num_warm_per_image,
                        read_only_paths=self.config.read_only_paths,
                        workspace_mb=self.config.workspace_mb,
                        bwrap=bwrap,
                    )
                )
                self._pools[reference] = pool
            return pool

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox:
        """A sandbox on ``spec.root_image`` (required) with ``spec``'s workspace copied in."""
        if spec is None or spec.root_image is None:
            raise ValueError("root_image: an image sandbox needs a spec naming its image")
        try:
            pool = await self.pool_for(spec.root_image)
        except ImageError as exc:
            raise SandboxError(str(exc)) from exc
        sandbox = await pool.acquire(spec)
        self._owner[sandbox.sandbox_id] = pool
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back to its image's pool (reset and reused, or closed)."""
        pool = self._owner.pop(sandbox.sandbox_id, None)
        if pool is None:
            raise ValueError(f"sandbox: {sandbox.sandbox_id} was not acquired from this provider")
        await pool.release(sandbox)

    async def close(self) -> None:
        """Close every pool and the sandboxes they hold."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()

    async def __aenter__(self) -> ImageSandboxProvider:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


async def create_image_sandbox(
    spec: SandboxSpec, config: ImageSandboxConfig | None = None, *, cache: ImageCache | None = None
) -> BwrapSandbox:
    """One cold image sandbox for ``spec`` (no pool); close it with ``await sandbox.close()``."""
    config = config or ImageSandboxConfig()
    if spec.root_image is None:
        raise ValueError("root_image: an image sandbox needs a spec naming its image")
    cache = cache or ImageCache(config.cache_dir)
    unpacked = await asyncio.to_thread(cache.unpack, spec.root_image)
    bwrap = image_bwrap_config(
        unpacked, repo_path=config.repo_path, hidden_paths=config.hidden_paths, base=config.bwrap
    )
    check_read_only_paths(bwrap, spec.read_only_paths)
    return await BwrapSandbox.create(spec, bwrap)
