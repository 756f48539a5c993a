"""A local sandbox made with bubblewrap: one long-lived, fully namespaced supervisor per sandbox.

Layout inside a sandbox:
  * a fresh root (tmpfs) with the host's ``/usr``, ``/bin``, ``/sbin``, ``/lib*`` and ``/etc`` bound read-only
    (``/etc/shadow``, ``/etc/gshadow`` and ``/etc/ssh`` masked); nothing else of the host: not ``/work``, not
    ``/root``, not ``/home``. The host's Python (``sys.base_prefix``) is bound read-only at its own path, and
    every ``SandboxSpec.read_only_paths`` entry too (e.g. the project venv ``/work/main/.venv``, the npm agents
    ``/work/main/.agents``; node comes from ``/usr``). So ``/work/main/.venv/bin/python`` and
    ``/work/main/.agents/node_modules/.bin/claude`` run inside as on the host when those paths are listed.
  * ``/workspace`` (the default cwd), ``/tmp`` and ``$HOME=/home/sandbox``: private tmpfs mounts, each capped at
    ``limits.workspace_mb`` (``ENOSPC`` past it); ``/dev/shm`` is capped at 16 MB. Fresh ``/proc`` and ``/dev``.
  * own PID, IPC, UTS, network, cgroup and mount namespaces (``bwrap`` as root); the supervisor then drops to
    a per-sandbox random unprivileged *host* uid and enters a user namespace of its own (uid 1000 inside).
    Where unprivileged user namespaces are disabled it stays that plain unprivileged uid (``mode == "uid"``).

Why a per-sandbox host uid: ``RLIMIT_NPROC`` is not enforced for host root (bwrap as root with
``--unshare-user`` maps the sandbox user to root), so a fork bomb would be bounded only by the timeout. As an
unprivileged uid in its own user namespace, ``--nproc`` counts exactly this sandbox's tasks, so a fork bomb
fails with ``EAGAIN`` at ``limits.max_processes`` and other sandboxes never notice.

Resources: a cgroup per sandbox (``sandboxes/cgroups.py``; ``resource_control="cgroup"``, the default) caps
the memory of everything in it together (processes, tmpfs files, the supervisor) at ``limits.memory_mb``, its
tasks at ``limits.max_processes + supervisor_tasks`` and its CPU at ``cpu_cores``; bwrap is started inside it
(a tiny shell joins it, then execs bwrap), so nothing the sandbox ever runs is outside it, and closing kills the
whole cgroup. Each writable tmpfs is capped at ``max_inodes`` files too (as root only: unprivileged bwrap
leaves the supervisor no capability to remount them). Without the privileges to create
cgroups, creating a sandbox raises ``CgroupUnavailableError`` (``resource_control="rlimit"``: rlimits only).

Commands run through the supervisor (``sandboxes/supervisor.py``, the host's Python started with ``-I -S``),
which is the sandbox's PID 1 (``--as-pid-1``): signals from inside cannot kill it, and it reaps what commands
detach. Each exec is ``prlimit --cpu --as --nproc -- sh -c CMD`` in its own session. At the wall-clock timeout
the command's process group and every process it detached are SIGKILLed (``timed_out=True``); when a command
exits, its leftover background jobs are killed too. Closing a sandbox closes the supervisor's stdin: it exits,
the kernel tears the PID namespace down with everything in it, and bwrap reaps it; with a cgroup, the whole
cgroup is killed first (freeze-kill-thaw on v1, ``cgroup.kill`` on v2). File operations go through the
supervisor as well, with the sandbox user's rights, so a symlink planted by an agent can never make the host
read or write outside the sandbox; reads take regular files only, up to ``max_read_bytes``, downloads regular
files and directories only, up to ``max_download_bytes`` / ``max_download_entries``
(``SandboxFileRefusedError``).

Network: none by default (only the sandbox's own loopback). With ``spec.proxy_url = http://127.0.0.1:PORT``
the supervisor listens on ``127.0.0.1:PORT`` inside the sandbox's loopback and forwards each connection over a
Unix socket (``/run/rein/proxy.sock``, bound in from the host) to a ``ProxyBridge`` on the host, which
connects it to the proxy's real ``127.0.0.1:PORT``. Code inside uses the same URL as the host and can reach
nothing else: no DNS, no other host port, no outside address.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from components.config import require, require_positive
from components.errors import SandboxError
from components.protocols import ExecResult, SandboxLimits, SandboxSpec
from sandboxes.archive import directory_archive, extract_single_entry
from sandboxes.cgroups import (
    CgroupHierarchy,
    CgroupLimits,
    SandboxCgroup,
    detect_hierarchy,
    prepare_parents,
)
from sandboxes.errors import SandboxFileRefusedError, SandboxLeaseEndedError
from sandboxes.proxy_bridge import ProxyBridge, parse_loopback_proxy_url
from sandboxes.rootfs_paths import ImageLayoutError, in_root_path, resolve_in_root

logger = logging.getLogger(__name__)
SUPERVISOR_SOURCE = Path(__file__).with_name("supervisor.py")
SUPERVISOR_INSIDE = "/opt/rein/supervisor.py"
PROXY_DIR_INSIDE = "/run/rein"
WORKSPACE = "/workspace"
HOME = "/home/sandbox"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": HOME,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "USER": "sandbox",
}
MASKED_ETC_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
MASKED_ETC_DIRS = ("/etc/ssh", "/etc/sudoers.d")
# Random host uids for sandboxes: far above any real account, below the 32-bit overflow ids.
SANDBOX_UID_RANGE = (1_000_000, 2_000_000_000)


@dataclass(kw_only=True, frozen=True)
class BwrapSandboxConfig:
    """How bubblewrap sandboxes are built on this host."""

    bwrap_path: str = "/usr/bin/bwrap"
    # Host directories bound read-only at the same path (a symlink such as /bin -> usr/bin is recreated).
    host_paths: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
    # The interpreter that runs the supervisor; its prefix is bound read-only. Default: this process's Python.
    python_executable: str = ""
    start_timeout_s: float = 15.0  # bwrap + supervisor up and answering
    op_timeout_s: float = 120.0  # any non-exec request (file transfer, reset)
    exec_grace_s: float = (
        10.0  # host-side margin past an exec's own timeout before the sandbox counts as hung
    )
    max_output_bytes: int = 8 * 1024 * 1024  # per stream of one exec; the rest is dropped
    shm_mb: int = 16
    temp_root: str = ""  # where per-sandbox host directories go (default: the system temp dir)
    num_create_attempts: int = 3
    close_grace_s: float = 2.0  # after stdin closes, how long the supervisor gets to exit before SIGKILL
    # Kernel resource control. "cgroup": a cgroup per sandbox enforces SandboxLimits.memory_mb for everything
    # the sandbox uses together (its processes, its tmpfs files, the supervisor), max_processes (plus
    # supervisor_tasks for the supervisor's threads) and cpu_cores; creating a sandbox raises
    # CgroupUnavailableError where the host cannot (no root, no delegated subtree). "rlimit": per-command
    # rlimits only (RLIMIT_AS per process, RLIMIT_NPROC per sandbox uid): several processes or tmpfs files
    # together can exceed memory_mb. Choose it knowingly.
    resource_control: str = "cgroup"
    cgroup_root: str = "/sys/fs/cgroup"
    cgroup_parent: str = "rein"  # the parent cgroup's name (see sandboxes/cgroups.py for where it goes)
    # CPU time per sandbox, in cores (cgroup quota). 0: no quota, and the sandbox is left out of the cpu
    # controller altogether (on a host loaded many times over, a cpu cgroup of its own slows a start up by
    # ~0.1 s: benchmarks/RESULTS.md).
    cpu_cores: float = 1.0
    # Tasks (threads) the supervisor may use on top of max_processes: 2 per proxy connection, 1 per request.
    supervisor_tasks: int = 96
    max_inodes: int = 131_072  # files + directories per writable tmpfs (/workspace, /tmp, $HOME, /dev/shm)
    max_read_bytes: int = 64 * 1024 * 1024  # read_file: a larger file raises SandboxFileRefusedError
    max_download_bytes: int = 64 * 1024 * 1024  # download: file bytes per call
    max_download_entries: int = 100_000  # download: files + directories per call
    max_proxy_connections: int = 32  # concurrent connections through the proxy path, per sandbox
    # Image sandboxes (sandboxes/image.py) set these two; host sandboxes leave them empty.
    # root_dir: an unpacked image root filesystem; ``host_paths`` are then taken from it (``root_dir + path``)
    # instead of from the host's ``/``. The supervisor still runs the host's Python (bound at its own path).
    root_dir: str = ""
    # Absolute top-level paths made symlinks to the workspace (an image's repository path, e.g. /testbed).
    workspace_aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "start_timeout_s",
            "op_timeout_s",
            "exec_grace_s",
            "max_output_bytes",
            "shm_mb",
            "close_grace_s",
            "supervisor_tasks",
            "max_inodes",
            "max_read_bytes",
            "max_download_bytes",
            "max_download_entries",
            "max_proxy_connections",
        ):
            require_positive(getattr(self, name), name)
        require(
            self.resource_control in ("cgroup", "rlimit"),
            "resource_control",
            f"must be 'cgroup' or 'rlimit', got {self.resource_control!r}",
        )
        require(self.cpu_cores >= 0, "cpu_cores", f"must be >= 0, got {self.cpu_cores}")
        require(bool(self.cgroup_parent), "cgroup_parent", "must not be empty")
        require(
            self.num_create_attempts >= 1,
            "num_create_attempts",
            f"must be >= 1, got {self.num_create_attempts}",
        )
        require(os.path.isabs(self.bwrap_path), "bwrap_path", f"must be absolute, got {self.bwrap_path!r}")

    @property
    def python(self) -> str:
        return self.python_executable or os.path.realpath(sys.executable)


def validate_spec(spec: SandboxSpec) -> None:
    """Raise ValueError for a spec no sandbox could honour (missing paths, bad proxy URL)."""
    for path in spec.read_only_paths:
        require(os.path.isabs(path), "read_only_paths", f"must be absolute paths, got {path!r}")
        require(os.path.exists(path), "read_only_paths", f"{path!r} does not exist on this host")
    if spec.workspace_source is not None:
        source = Path(spec.workspace_source)
        ok = source.is_dir() or (source.is_file() and source.name.endswith((".tar.gz", ".tgz", ".tar")))
        require(
            ok, "workspace_source", f"must be a directory or a .tar.gz/.tgz/.tar file, got {str(source)!r}"
        )
    if spec.proxy_url is not None:
        parse_loopback_proxy_url(spec.proxy_url)


def mounts_serve(
    spec: SandboxSpec, *, workspace_mb: int, read_only_paths: Sequence[str], config: BwrapSandboxConfig
) -> bool:
    """Whether a sandbox started with these mounts can serve ``spec`` (same workspace size, a superset of its
    paths, an image root exactly when the spec names an image)."""
    return (
        spec.limits.workspace_mb == workspace_mb
        and set(spec.read_only_paths) <= set(read_only_paths)
        and (spec.root_image is None) == (not config.root_dir)
    )


def _remove_stale_host_dirs(temp_root: str) -> None:
    """Remove the host directories of sandboxes whose owning process died without closing them (its bwrap
    died with it: ``--die-with-parent``)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(temp_root):
            parts = name.split("-")
            if len(parts) < 3 or parts[:2] != ["rein", "bwrap"] or not parts[2].isdigit():
                continue
            if not os.path.exists(f"/proc/{parts[2]}"):
                shutil.rmtree(os.path.join(temp_root, name), ignore_errors=True)


_hierarchies: dict[tuple[str, str], CgroupHierarchy] = {}


def cgroup_hierarchy(config: BwrapSandboxConfig) -> CgroupHierarchy | None:
    """The cgroup layout ``config``'s sandboxes use (None for ``resource_control="rlimit"``), checked once per
    process: ``CgroupUnavailableError`` says which controller is missing or not writable."""
    if config.resource_control != "cgroup":
        return None
    key = (config.cgroup_root, config.cgroup_parent, config.cpu_cores > 0)
    if key not in _hierarchies:
        hierarchy = detect_hierarchy(
            root=config.cgroup_root, parent_name=config.cgroup_parent, cpu=config.cpu_cores > 0
        )
        prepare_parents(hierarchy)
        _remove_stale_cgroups(hierarchy)
        _hierarchies[key] = hierarchy
    return _hierarchies[key]


def _remove_stale_cgroups(hierarchy: CgroupHierarchy) -> None:
    """Kill and remove the cgroups of sandboxes whose owning process died without closing them."""
    for parent in hierarchy.parents.values():
        with contextlib.suppress(OSError):
            for name in os.listdir(parent):
                parts = name.split("-")
                if len(parts) >= 3 and parts[0] == "bwrap" and parts[1].isdigit():
                    if not os.path.exists(f"/proc/{parts[1]}"):
                        with contextlib.suppress(OSError, SandboxError):
                            stale = SandboxCgroup(hierarchy, name)
                            stale.kill()
                            stale.remove()


def _cgroup_limits(config: BwrapSandboxConfig, limits: SandboxLimits) -> CgroupLimits:
    return CgroupLimits(
        memory_bytes=limits.memory_mb * 1024 * 1024,
        max_tasks=limits.max_processes + config.supervisor_tasks,
        cpu_cores=config.cpu_cores or None,
    )


def _child_pids(pid: int) -> list[int]:
    """The direct children of a host process."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _refuse_binds_into_image(host_binds: Sequence[str], image_paths: Sequence[str]) -> None:
    """``ImageLayoutError`` for a host bind whose destination lies in a directory the image provides."""
    inside = [
        p for p in host_binds if any(p == top or p.startswith(top.rstrip("/") + "/") for top in image_paths)
    ]
    if inside:
        raise ImageLayoutError(
            f"host paths {inside} would be mounted inside the image's own entries "
            f"({sorted({top for top in image_paths if any(p.startswith(top) for p in inside)})}); "
            "the image's layout collides with the host's Python or read_only_paths"
        )


def _python_prefix(python: str) -> str:
    """The installation prefix of a Python executable (``.../bin/python3.11`` -> ``...``)."""
    return str(Path(python).resolve().parent.parent)


class BwrapSandbox:
    """One bubblewrap sandbox with a supervisor inside. Create with ``await BwrapSandbox.create(spec)``."""

    _ids = itertools.count()
    # The supervisor program bound into the sandbox (a subclass may bind another, e.g. a test's weakened copy).
    supervisor_source: Path = SUPERVISOR_SOURCE
    _swept_temp_roots: set[str] = set()

    def __init__(
        self, *, config: BwrapSandboxConfig, workspace_mb: int, read_only_paths: tuple[str, ...]
    ) -> None:
        self.config = config
        self.sandbox_id = f"bwrap-{os.getpid()}-{next(self._ids)}-{secrets.token_hex(3)}"
        self.host_uid = SANDBOX_UID_RANGE[0] + secrets.randbelow(SANDBOX_UID_RANGE[1] - SANDBOX_UID_RANGE[0])
        self.workspace_mb = workspace_mb
        self.read_only_paths = read_only_paths
        self.mode = ""  # "userns" | "uid" | "unprivileged", as reported by the supervisor
        self.spec = SandboxSpec()
        temp_root = config.temp_root or tempfile.gettempdir()
        if temp_root not in self._swept_temp_roots:
            self._swept_temp_roots.add(temp_root)
            _remove_stale_host_dirs(temp_root)
        self._host_dir = tempfile.mkdtemp(prefix=f"rein-{self.sandbox_id}-", dir=temp_root)
        os.chmod(self._host_dir, 0o755)
        self._process: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._request_ids = itertools.count(1)
        self._reader_task: asyncio.Task | None = None
        self._stderr_task: asyncio.Task | None = None
        self._stderr_tail = b""
        self._ready: asyncio.Future | None = None
        self._setup_task: asyncio.Task | None = None
        self._bridge: ProxyBridge | None = None
        self._dead_reason = ""
        self._closed = False
        self._lease_ended = False  # set by revoke(): every later call raises SandboxLeaseEndedError
        self.cgroup: SandboxCgroup | None = None  # None with resource_control="rlimit"

    # ------------------------------------------------------------------------------------------------------
    # Creation
    # ------------------------------------------------------------------------------------------------------

    @classmethod
    async def create(
        cls, spec: SandboxSpec | None = None, config: BwrapSandboxConfig | None = None
    ) -> BwrapSandbox:
        """Start a sandbox for ``spec`` (workspace copied in, proxy path set up); retried on start failures."""
        spec = spec or SandboxSpec()
        validate_spec(spec)
        config = config or BwrapSandboxConfig()
        # An image spec on a host-root config would silently run on the wrong root: refuse it.
        require(
            (spec.root_image is None) == (not config.root_dir),
            "root_image",
            "needs an image sandbox (sandboxes/image.py) and a host sandbox needs none",
        )
        sandbox = await cls.start_generic(
            config,
            workspace_mb=spec.limits.workspace_mb,
            read_only_paths=spec.read_only_paths,
        )
        try:
            await sandbox.prepare(spec)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    @classmethod
    async def start_generic(
        cls, config: BwrapSandboxConfig, *, workspace_mb: int, read_only_paths: tuple[str, ...] = ()
    ) -> BwrapSandbox:
        """Start an empty sandbox with these mounts; ``prepare``/``prepare_in_background`` give it a spec."""
        cgroup_hierarchy(config)  # CgroupUnavailableError here, not retried: no attempt could do better
        last_error: SandboxError | None = None
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(config.num_create_attempts),
            wait=wait_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception_type(SandboxError),
            reraise=True,
        ):
            with attempt:
                sandbox = cls(
                    config=config, workspace_mb=workspace_mb, read_only_paths=tuple(read_only_paths)
                )
                try:
                    await sandbox._start()
                except BaseException as exc:
                    await sandbox.close()
                    if isinstance(exc, SandboxError):
                        last_error = exc
                    raise
                return sandbox
        raise SandboxError(f"could not start a sandbox: {last_error}")

    def bwrap_argv(self) -> list[str]:
        """The full bubblewrap command line of this sandbox."""
        config = self.config
        argv = [config.bwrap_path]
        if os.geteuid() != 0:
            argv += ["--unshare-user", "--uid", "1000", "--gid", "1000"]
        argv += [
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
            "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv", "--as-pid-1",
        ]  # fmt: skip
        root = config.root_dir.rstrip("/")  # "" = the host's own root
        for path in config.host_paths:
            # An image's paths are resolved inside its root filesystem, never through the host (rootfs_paths).
            source = str(self._source(path))
            if path.count("/") > 1:  # a nested image path (/opt/conda): its parent readable, not 0700
                argv += ["--perms", "0755", "--dir", os.path.dirname(path)]
            if os.path.islink(source):  # recreated inside, where it resolves in the sandbox's own root
                argv += ["--symlink", os.readlink(source), path]
            elif os.path.isdir(source):
                argv += ["--ro-bind", source, path]
        for path in MASKED_ETC_FILES:
            if os.path.isfile(self._source(path, follow_last=True)):
                argv += ["--ro-bind", "/dev/null", self._inside(path)]
        for path in MASKED_ETC_DIRS:
            if os.path.isdir(self._source(path, follow_last=True)):
                argv += ["--tmpfs", self._inside(path)]
        size = str(self.workspace_mb * 1024 * 1024)
        argv += [
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(config.shm_mb * 1024 * 1024), "--tmpfs", "/dev/shm",
            "--size", size, "--tmpfs", WORKSPACE,
            "--size", size, "--tmpfs", "/tmp",
            "--size", size, "--tmpfs", HOME,
            "--perms", "0755", "--dir", os.path.dirname(SUPERVISOR_INSIDE),
            "--ro-bind", str(self.supervisor_source), SUPERVISOR_INSIDE,
            "--perms", "0755", "--dir", os.path.dirname(PROXY_DIR_INSIDE),
            "--ro-bind", self._host_dir, PROXY_DIR_INSIDE,
        ]  # fmt: skip
        # After the tmpfs mounts, so that a read-only path under /tmp (say) is not hidden by them.
        existing = {*config.host_paths, WORKSPACE, "/tmp", HOME, "/home", "/run", "/opt", "/dev", "/proc"}
        made_dirs: set[str] = set()
        host_binds = tuple(dict.fromkeys((_python_prefix(config.python), *self.read_only_paths)))
        if root:
            # bubblewrap creates these under the new root while the host's is still reachable: none may pass
            # through an image-provided entry (a symlink there would lead the mount onto the host).
            _refuse_binds_into_image(host_binds, config.host_paths)
        for path in host_binds:
            # bwrap creates missing parents 0700 (unreadable for the sandbox user): make them 0755 first.
            for parent in reversed(Path(path).parents[:-1]):
                name = str(parent)
                inside_existing = any(name == top or name.startswith(top + "/") for top in config.host_paths)
                if name not in made_dirs and name not in existing and not inside_existing:
                    made_dirs.add(name)
                    argv += ["--perms", "0755", "--dir", name]
            argv += ["--ro-bind", path, path]
        for alias in config.workspace_aliases:
            argv += ["--symlink", WORKSPACE, alias]
        argv += ["--chdir", WORKSPACE]
        for key, value in BASE_ENV.items():
            argv += ["--setenv", key, value]
        argv += [
            "--",
            config.python,
            "-I",
            "-S",
            SUPERVISOR_INSIDE,
            str(self.host_uid),
            str(config.max_inodes),
        ]
        return argv

    def _source(self, path: str, *, follow_last: bool = False) -> Path:
        """The host path of ``path``: the host's own, or the image's resolved inside its root filesystem."""
        if not self.config.root_dir:
            return Path(path)
        return resolve_in_root(self.config.root_dir, path, follow_last=follow_last)

    def _inside(self, path: str) -> str:
        """Where ``path`` really is in the sandbox (an image's ``/etc`` may be a link to ``/private/etc``)."""
        return in_root_path(self.config.root_dir, path) if self.config.root_dir else path

    def _launch_argv(self) -> list[str]:
        """``bwrap_argv``, started inside this sandbox's cgroup: a tiny shell writes its own pid into every
        hierarchy's ``cgroup.procs`` and execs bwrap, so bwrap and everything it ever starts are members from
        their first instruction (cheaper than a Python ``preexec_fn``, which forbids vfork)."""
        argv = self.bwrap_argv()
        if self.cgroup is None:
            return argv
        join = " && ".join(f"echo $$ > {shlex.quote(path)}" for path in self.cgroup.procs_files)
        return ["/bin/sh", "-c", f'{join} && exec "$@"', "rein-cgroup-join", *argv]

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        if not os.access(self.config.bwrap_path, os.X_OK):  # the cgroup-joining shell would only say "127"
            raise SandboxError(
                f"could not start bwrap: {self.config.bwrap_path} is not an executable",
                sandbox_id=self.sandbox_id,
            )
        hierarchy = cgroup_hierarchy(self.config)
        if hierarchy is not None:
            self.cgroup = SandboxCgroup.create(
                hierarchy, self.sandbox_id, _cgroup_limits(self.config, SandboxLimits())
            )
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self._launch_argv(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=1 << 30,
            )
        except OSError as exc:
            raise SandboxError(f"could not start bwrap: {exc}", sandbox_id=self.sandbox_id) from exc
        self._reader_task = asyncio.create_task(self._read_replies())
        self._stderr_task = asyncio.create_task(self._read_stderr())
        try:
            hello = await asyncio.wait_for(asyncio.shield(self._ready), self.config.start_timeout_s)
        except TimeoutError as exc:
            raise SandboxError(
                f"supervisor did not start within {self.config.start_timeout_s} s", sandbox_id=self.sandbox_id
            ) from exc
        self.mode = hello["mode"]

    async def _read_replies(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        try:
            while line := await self._process.stdout.readline():
                reply = json.loads(line)
                if reply.get("ready"):
                    if not self._ready.done():
                        self._ready.set_result(reply)
                    continue
                future = self._pending.pop(reply["id"], None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (ValueError, asyncio.LimitOverrunError, ConnectionError) as exc:
            self._dead_reason = f"supervisor sent garbage: {exc}"
        code = await self._process.wait()
        await asyncio.sleep(0)  # let the stderr reader collect the last words
        detail = self._stderr_tail.decode(errors="replace").strip()[-500:]
        self._dead_reason = self._dead_reason or (
            f"sandbox process exited with code {code}" + (f": {detail}" if detail else "")
        )
        self._fail_pending()

    async def _read_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        while chunk := await self._process.stderr.read(4096):
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def _fail_pending(self) -> None:
        error = SandboxError(self._dead_reason or "sandbox closed", sandbox_id=self.sandbox_id)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # mark retrieved
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    # ------------------------------------------------------------------------------------------------------
    # Giving a generic sandbox its spec
    # ------------------------------------------------------------------------------------------------------

    def compatible_with(self, spec: SandboxSpec) -> bool:
        """Whether this sandbox's mounts can serve ``spec`` (same workspace size, a superset of its paths)."""
        return mounts_serve(
            spec, workspace_mb=self.workspace_mb, read_only_paths=self.read_only_paths, config=self.config
        )

    async def prepare(self, spec: SandboxSpec) -> None:
        """Adopt ``spec``: apply its limits, copy its workspace in and open its proxy path."""
        self.spec = spec
        self._apply_limits(spec.limits)
        if spec.proxy_url is not None:
            host, port = parse_loopback_proxy_url(spec.proxy_url)
            self._bridge = ProxyBridge(
                os.path.join(self._host_dir, "proxy.sock"),
                host,
                port,
                max_connections=self.config.max_proxy_connections,
            )
            await self._bridge.start()
            await self._request(
                {"op": "proxy_listen", "port": port, "max_connections": self.config.max_proxy_connections}
            )
        if spec.workspace_source is not None:
            archive = await asyncio.to_thread(directory_archive, Path(spec.workspace_source))
            await self._request(
                {"op": "put_tar", "dir": WORKSPACE, "data": base64.b64encode(archive).decode()}
            )

    def prepare_in_background(self, spec: SandboxSpec) -> None:
        """Adopt ``spec`` without waiting; the next call on the sandbox waits for it (and raises its error).
        Its limits apply at once (a few cgroup file writes)."""
        self.spec = spec
        self._apply_limits(spec.limits)
        if spec.proxy_url is None and spec.workspace_source is None:
            return
        self._setup_task = asyncio.create_task(self.prepare(spec))

    def _apply_limits(self, limits: SandboxLimits) -> None:
        if self.cgroup is not None:
            try:
                self.cgroup.set_limits(_cgroup_limits(self.config, limits))
            except OSError as exc:  # e.g. a memory limit below what the sandbox already uses
                raise SandboxError(
                    f"cannot apply limits {limits}: {exc}", sandbox_id=self.sandbox_id
                ) from exc

    def revoke(self) -> None:
        """End this handle's lease now (its pool is about to destroy the sandbox): every later call raises
        ``SandboxLeaseEndedError`` before reaching the sandbox. A sandbox is never handed to a second tenant,
        so an old handle can never reach anyone else's."""
        self._lease_ended = True

    async def ping(self) -> None:
        """Raise SandboxError unless the supervisor answers."""
        await self._request({"op": "ping"}, timeout_s=min(self.config.op_timeout_s, 10.0))

    @property
    def alive(self) -> bool:
        """False once the sandbox died or was closed."""
        return not (self._closed or self._dead_reason)

    async def _wait_setup(self, *, allow_failed: bool = False) -> None:
        if self._lease_ended:
            raise SandboxLeaseEndedError(
                "the lease on this sandbox ended (released)", sandbox_id=self.sandbox_id
            )
        task = self._setup_task
        if task is None:
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # our caller was cancelled
            raise SandboxError(
                "sandbox closed while its workspace was being prepared", sandbox_id=self.sandbox_id
            ) from None
        except SandboxError:
            if not allow_failed:
                raise
        except Exception as exc:
            if not allow_failed:
                raise SandboxError(
                    f"preparing the workspace failed: {exc}", sandbox_id=self.sandbox_id
                ) from exc
        else:
            self._setup_task = None

    # ------------------------------------------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------------------------------------------

    async def _request(self, message: dict, *, timeout_s: float | None = None) -> dict:
        if self._lease_ended:
            raise SandboxLeaseEndedError(
                "the lease on this sandbox ended (released)", sandbox_id=self.sandbox_id
            )
        if self._closed:
            raise SandboxError("sandbox is closed", sandbox_id=self.sandbox_id)
        if self._dead_reason:
            raise SandboxError(self._dead_reason, sandbox_id=self.sandbox_id)
        assert self._process is not None and self._process.stdin is not None
        request_id = next(self._request_ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._process.stdin.write((json.dumps({**message, "id": request_id}) + "\n").encode())
            await self._process.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._pending.pop(request_id, None)
            raise SandboxError(f"sandbox is gone: {exc}", sandbox_id=self.sandbox_id) from exc
        timeout_s = self.config.op_timeout_s if timeout_s is None else timeout_s
        try:
            reply = await asyncio.wait_for(future, timeout_s)
        except TimeoutError as exc:
            self._pending.pop(request_id, None)
            self._dead_reason = (
                f"supervisor did not answer {message['op']!r} within {timeout_s:.1f} s; killed"
            )
            self._kill()
            raise SandboxError(self._dead_reason, sandbox_id=self.sandbox_id) from exc
        if "error" in reply:
            kind, text = reply.get("kind"), reply["error"]
            if kind == "not_found":
                raise FileNotFoundError(text)
            if kind == "is_a_directory":
                raise IsADirectoryError(text)
            if kind == "permission":
                raise PermissionError(text)
            if kind == "refused":
                raise SandboxFileRefusedError(f"{message['op']} refused: {text}", sandbox_id=self.sandbox_id)
            raise SandboxError(f"{message['op']} failed: {text}", sandbox_id=self.sandbox_id)
        return reply

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a shell string, or an argv list) in the workspace; see the module docstring."""
        await self._wait_setup()
        limits = self.spec.limits
        timeout_s = limits.command_timeout_s if timeout_s is None else timeout_s
        require_positive(timeout_s, "timeout_s")
        message: dict = {
            "op": "exec",
            "cwd": cwd,
            "env": {**BASE_ENV, **self.spec.env, **(env or {})},
            "timeout_s": timeout_s,
            "max_output_bytes": self.config.max_output_bytes,
            "limits": _limits_message(limits),
        }
        if isinstance(cmd, str):
            message["shell"] = cmd
        else:
            message["argv"] = [str(part) for part in cmd]
            require(len(message["argv"]) > 0, "cmd", "must not be an empty argv")
        reply = await self._request(message, timeout_s=timeout_s + self.config.exec_grace_s)
        return ExecResult(
            exit_code=reply["exit_code"],
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            timed_out=reply["timed_out"],
        )

    async def read_file(self, path: str) -> bytes:
        """The bytes of a regular file in the sandbox (FileNotFoundError if absent; SandboxFileRefusedError for
        a FIFO, device, socket, or a file over ``config.max_read_bytes``)."""
        await self._wait_setup()
        reply = await self._request(
            {"op": "read_file", "path": path, "max_bytes": self.config.max_read_bytes}
        )
        return base64.b64decode(reply["data"])

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Create or replace a file in the sandbox (parents created)."""
        await self._wait_setup()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._request({"op": "write_file", "path": path, "data": base64.b64encode(payload).decode()})

    async def upload_dir(self, local_dir: Path, remote_dir: str) -> None:
        """Copy a host directory's contents into ``remote_dir`` in the sandbox."""
        await self._wait_setup()
        local_dir = Path(local_dir)
        if not local_dir.is_dir():
            raise NotADirectoryError(f"local_dir: {local_dir} is not a directory")
        archive = await asyncio.to_thread(directory_archive, local_dir)
        await self.upload_archive(archive, remote_dir)

    async def upload_archive(self, archive: bytes, remote_dir: str) -> None:
        """Unpack a tar archive (any compression) into ``remote_dir`` in the sandbox."""
        await self._wait_setup()
        await self._request({"op": "put_tar", "dir": remote_dir, "data": base64.b64encode(archive).decode()})

    async def download_archive(self, remote_path: str) -> bytes:
        """A tar archive holding one entry: the file or directory at ``remote_path`` (regular files and
        directories only; SandboxFileRefusedError past ``max_download_bytes`` / ``max_download_entries``)."""
        await self._wait_setup()
        reply = await self._request(
            {
                "op": "get_tar",
                "path": remote_path,
                "max_bytes": self.config.max_download_bytes,
                "max_entries": self.config.max_download_entries,
            }
        )
        return base64.b64decode(reply["data"])

    async def download(self, remote_path: str, local_path: Path) -> None:
        """Copy a file or directory out of the sandbox to ``local_path`` on the host."""
        archive = await self.download_archive(remote_path)
        await asyncio.to_thread(extract_single_entry, archive, Path(local_path))

    # ------------------------------------------------------------------------------------------------------
    # Teardown
    # ------------------------------------------------------------------------------------------------------

    def _kill(self) -> None:
        """Kill everything in the sandbox. With a cgroup: every member at once (bwrap included), frozen first on
        v1, so no process can fork or detach its way out. Without: SIGKILL the supervisor, the sandbox's PID 1:
        the kernel kills everything inside, and bwrap (our child) reaps it and exits."""
        if self.cgroup is not None:
            alive = self._process is not None and self._process.returncode is None
            self.cgroup.kill(spare=self._process.pid if alive else None)  # bwrap reaps PID 1, then exits
            return
        if self._process is None or self._process.returncode is not None:
            return
        inner = _child_pids(self._process.pid)
        for pid in inner:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not inner:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)

    async def close(self) -> None:
        """Kill the sandbox and everything in it; remove its host directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._setup_task is not None and not self._setup_task.done():
            self._setup_task.cancel()
            with contextlib.suppress(BaseException):
                await self._setup_task
        if self._bridge is not None:
            await self._bridge.close()
        if self.cgroup is not None:
            try:  # the whole cgroup at once: nothing in the sandbox outlives its close
                await asyncio.to_thread(self._kill)
            except (OSError, SandboxError) as exc:
                logger.error("could not kill the cgroup of sandbox %s: %s", self.sandbox_id, exc)
        if self._process is not None and self._process.returncode is None:
            # Closing its stdin ends the supervisor, and with it the sandbox's PID namespace; kill if it lingers.
            with contextlib.suppress(Exception):
                self._process.stdin.close()
            try:
                await asyncio.wait_for(self._process.wait(), self.config.close_grace_s)
            except TimeoutError:
                self._kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._process.wait(), 5.0)
                if self._process.returncode is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self._process.pid, signal.SIGKILL)
                    await self._process.wait()
        for task in (self._reader_task, self._stderr_task):
            if task is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 5.0)
        self._dead_reason = self._dead_reason or "sandbox closed"
        self._fail_pending()
        shutil.rmtree(self._host_dir, ignore_errors=True)
        if self.cgroup is not None:
            with contextlib.suppress(OSError, SandboxError):
                self.cgroup.kill()  # normally a no-op: empty since the kill above
                self.cgroup.remove()

    async def __aenter__(self) -> BwrapSandbox:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"BwrapSandbox({self.sandbox_id}, uid={self.host_uid}, mode={self.mode or '?'})"


def _limits_message(limits: SandboxLimits) -> dict:
    return {
        "cpu_time_s": limits.cpu_time_s,
        "memory_mb": limits.memory_mb,
        "max_processes": limits.max_processes,
    }


async def run_once_cold(
    config: BwrapSandboxConfig | None = None, argv: Sequence[str] = ("/bin/true",)
) -> float:
    """Seconds for bubblewrap to build this module's full namespace + mount set and run ``argv`` once.

    The same sandbox layout as ``BwrapSandbox`` minus the supervisor: what a one-shot sandboxed command costs.
    """
    config = config or BwrapSandboxConfig()
    sandbox = BwrapSandbox(config=config, workspace_mb=64, read_only_paths=())
    hierarchy = cgroup_hierarchy(config)
    try:
        start = time.perf_counter()
        if hierarchy is not None:  # a cgroup per sandbox is part of the cold-start cost
            sandbox.cgroup = SandboxCgroup.create(
                hierarchy, sandbox.sandbox_id, _cgroup_limits(config, SandboxLimits())
            )
        full = sandbox._launch_argv()
        full = full[: full.index("--") + 1] + list(argv)
        process = await asyncio.create_subprocess_exec(*full)
        code = await process.wait()
        if sandbox.cgroup is not None:
            sandbox.cgroup.kill()
            sandbox.cgroup.remove()
        elapsed = time.perf_counter() - start
        if code != 0:
            raise SandboxError(f"one-shot bwrap exited with {code}", sandbox_id=sandbox.sandbox_id)
        return elapsed
    finally:
        shutil.rmtree(sandbox._host_dir, ignore_errors=True)
        if sandbox.cgroup is not None and not sandbox.cgroup.removed:
            with contextlib.suppress(OSError, SandboxError):
                sandbox.cgroup.kill()
                sandbox.cgroup.remove()
