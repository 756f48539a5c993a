"""A kernel cgroup per sandbox: memory, task and CPU limits for everything inside it, and a kill that nothing
escapes.

Why cgroups and not rlimits: an rlimit bounds one process. Eight processes with ``RLIMIT_AS`` each, or files
in a tmpfs (no process's address space at all), add up to many times the limit. The memory controller charges
every page the sandbox's processes use to their cgroup: anonymous memory, page cache, tmpfs and ``/dev/shm``
pages (charged to the cgroup of the process that wrote them), kernel memory such as inodes and socket buffers.
The pids controller counts every task (process or thread) of the sandbox together.

Both hierarchies are supported, detected at run time from ``/proc/self/mountinfo``:
  * cgroup v2 (one unified hierarchy mounted at ``root``): ``memory.max`` (+ ``memory.swap.max = 0``),
    ``pids.max``, ``cpu.max``; killing writes ``cgroup.kill`` (Linux >= 5.14; older kernels freeze with
    ``cgroup.freeze``, then SIGKILL every member).
  * cgroup v1 (one hierarchy per controller): ``memory.limit_in_bytes`` (+ ``memory.memsw.limit_in_bytes``
    where swap accounting exists), ``pids.max``, ``cpu.cfs_quota_us``; killing freezes the ``freezer``
    cgroup, SIGKILLs every member while none of them can run (so none can fork a replacement), then thaws it.

A sandbox's cgroup is ``<parent>/<sandbox id>`` where ``<parent>`` is ``rein`` under the starting process's own
cgroup (v1, per controller) or next to it (v2, where a cgroup with processes cannot also have controllers
enabled for children). Creating one needs write access to the hierarchy: root, or a delegated subtree.
``CgroupUnavailableError`` says exactly which controller is missing or not writable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from components.errors import SandboxError

V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


class CgroupUnavailableError(SandboxError):
    """This host (or this user) cannot give sandboxes the cgroup limits their configuration asks for."""


@dataclass(frozen=True, kw_only=True)
class CgroupHierarchy:
    """Where a sandbox's cgroup directories go: one parent per v1 controller, or one v2 parent."""

    version: int  # 1 or 2
    # v1: controller name -> the parent directory in that controller's hierarchy; v2: {"unified": parent}.
    parents: dict[str, str]
    # The controllers sandboxes get (v1: the freezer too, for killing).
    controllers: tuple[str, ...] = V2_CONTROLLERS

    def describe(self) -> str:
        return f"cgroup v{self.version} " + ", ".join(f"{k}={v}" for k, v in sorted(self.parents.items()))


@dataclass(frozen=True, kw_only=True)
class CgroupLimits:
    """What a sandbox's cgroup enforces for all its processes together."""

    memory_bytes: int
    max_tasks: int  # processes and threads
    cpu_cores: float | None  # None: no CPU quota


def _mounts(mountinfo: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, super options) of every cgroup mount in a mountinfo text."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rights = left.split(), right.split()
        if len(rights) >= 3 and rights[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], rights[0], set(rights[2].split(","))))
    return found


def _own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """controller -> this process's cgroup path (``""`` is the v2 entry)."""
    own = {}
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def detect_hierarchy(
    *,
    root: str = "/sys/fs/cgroup",
    parent_name: str = "rein",
    cpu: bool = True,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
) -> CgroupHierarchy:
    """The cgroup layout sandboxes use on this host; ``CgroupUnavailableError`` if a controller is missing.
    ``cpu=False`` leaves the cpu controller out (no CPU quota: see ``BwrapSandboxConfig.cpu_cores``)."""
    mountinfo = Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
    proc_cgroup = Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup
    mounts, own = _mounts(mountinfo), _own_cgroups(proc_cgroup)
    unified = [point for point, kind, _ in mounts if kind == "cgroup2" and point == root]
    if unified:
        own_path = own.get("", "/")
        base = own_path if own_path == "/" else os.path.dirname(own_path.rstrip("/"))
        controllers = tuple(c for c in V2_CONTROLLERS if cpu or c != "cpu")
        return CgroupHierarchy(
            version=2, parents={"unified": _join(root, base, parent_name)}, controllers=controllers
        )
    parents = {}
    controllers = tuple(c for c in V1_CONTROLLERS if cpu or c != "cpu")
    for controller in controllers:
        point = next((p for p, kind, opts in mounts if kind == "cgroup" and controller in opts), None)
        if point is None:
            raise CgroupUnavailableError(
                f"no cgroup v2 at {root} and no cgroup v1 '{controller}' hierarchy is mounted"
            )
        parents[controller] = _join(point, own.get(controller, "/"), parent_name)
    return CgroupHierarchy(version=1, parents=parents, controllers=controllers)


def _join(mount_point: str, cgroup_path: str, name: str) -> str:
    return os.path.join(mount_point, cgroup_path.lstrip("/"), name)


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # (cgroupfs ignores the truncation; a test tree needs it)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_pids(path: str) -> list[int]:
    try:
        return [int(line) for line in Path(path).read_text().split()]
    except FileNotFoundError:
        return []


def prepare_parents(hierarchy: CgroupHierarchy) -> None:
    """Create the parent cgroups (and enable the v2 controllers for their children); typed error if not allowed."""
    for controller, parent in hierarchy.parents.items():
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise CgroupUnavailableError(
                f"cannot create the sandbox parent cgroup {parent} ({controller}): {exc.strerror}; "
                "run as root or delegate a writable cgroup subtree"
            ) from exc
        if not os.access(parent, os.W_OK):
            raise CgroupUnavailableError(
                f"the sandbox parent cgroup {parent} ({controller}) is not writable by uid {os.geteuid()}; "
                "run as root or delegate a writable cgroup subtree"
            )
        if hierarchy.version == 1 and controller == "memory":
            with contextlib.suppress(OSError):  # pre-4.x kernels: charges must propagate to the parent
                _write(os.path.join(parent, "memory.use_hierarchy"), "1")
    if hierarchy.version == 2:
        parent = hierarchy.parents["unified"]
        available = set(Path(parent, "cgroup.controllers").read_text().split())
        missing = [c for c in hierarchy.controllers if c not in available]
        if missing:
            raise CgroupUnavailableError(
                f"cgroup v2 controllers {missing} are not available at {parent} "
                f"(available: {sorted(available)}); enable them in the parent's cgroup.subtree_control"
            )
        try:
            _write(
                os.path.join(parent, "cgroup.subtree_control"),
                " ".join(f"+{c}" for c in hierarchy.controllers),
            )
        except OSError as exc:
            raise CgroupUnavailableError(
                f"cannot enable {list(hierarchy.controllers)} in {parent}/cgroup.subtree_control: {exc.strerror}"
            ) from exc


class SandboxCgroup:
    """The cgroup(s) of one sandbox. Make with ``SandboxCgroup.create``; a process joins with ``join_self``
    (run in the child between fork and exec, so that it and all its descendants are members from the start)."""

    def __init__(self, hierarchy: CgroupHierarchy, name: str) -> None:
        self.hierarchy = hierarchy
        self.name = name
        self.dirs = {
            controller: os.path.join(parent, name) for controller, parent in hierarchy.parents.items()
        }
        # One cgroup.procs per hierarchy: v1 needs the process in each controller's hierarchy.
        self.procs_files = tuple(os.path.join(path, "cgroup.procs") for path in self.dirs.values())
        self.removed = False

    @classmethod
    def create(cls, hierarchy: CgroupHierarchy, name: str, limits: CgroupLimits) -> SandboxCgroup:
        cgroup = cls(hierarchy, name)
        try:
            for path in cgroup.dirs.values():
                os.mkdir(path)
            cgroup.set_limits(limits)
        except OSError as exc:
            cgroup.remove()
            raise CgroupUnavailableError(f"cannot create cgroup {name}: {exc}") from exc
        return cgroup

    def _file(self, controller: str, name: str) -> str:
        return os.path.join(self.dirs["unified" if self.hierarchy.version == 2 else controller], name)

    def join_self(self) -> None:
        """Move the calling process into this cgroup (every hierarchy)."""
        pid = str(os.getpid())
        for path in self.procs_files:
            _write(path, pid)

    def set_limits(self, limits: CgroupLimits) -> None:
        """Apply ``limits`` (may be called again, e.g. when a warm sandbox is handed a spec)."""
        if self.hierarchy.version == 2:
            if "memory" in self.hierarchy.controllers:
                _write(self._file("memory", "memory.max"), str(limits.memory_bytes))
                swap = self._file("memory", "memory.swap.max")
                if os.path.exists(swap):
                    _write(swap, "0")
            if "pids" in self.hierarchy.controllers:
                _write(self._file("pids", "pids.max"), str(limits.max_tasks))
            if "cpu" in self.hierarchy.controllers:
                quota = "max" if limits.cpu_cores is None else str(int(limits.cpu_cores * CPU_PERIOD_US))
                _write(self._file("cpu", "cpu.max"), f"{quota} {CPU_PERIOD_US}")
            return
        limit = self._file("memory", "memory.limit_in_bytes")
        memsw = self._file("memory", "memory.memsw.limit_in_bytes")
        # memsw (memory + swap) must stay >= the memory limit: raise it first when growing, after when shrinking.
        if os.path.exists(memsw):
            try:
                _write(memsw, str(limits.memory_bytes))
                _write(limit, str(limits.memory_bytes))
            except OSError:
                _write(limit, str(limits.memory_bytes))
                _write(memsw, str(limits.memory_bytes))
        else:
            _write(limit, str(limits.memory_bytes))
        _write(self._file("pids", "pids.max"), str(limits.max_tasks))
        if "cpu" in self.hierarchy.controllers:
            _write(self._file("cpu", "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            quota = -1 if limits.cpu_cores is None else int(limits.cpu_cores * CPU_PERIOD_US)
            _write(self._file("cpu", "cpu.cfs_quota_us"), str(quota))

    def members(self) -> list[int]:
        """Pids of every process in the sandbox's cgroup."""
        controller = "unified" if self.hierarchy.version == 2 else "freezer"
        return _read_pids(os.path.join(self.dirs[controller], "cgroup.procs"))

    def read(self, controller: str, name: str) -> str:
        """One control file's content (e.g. ``("memory", "memory.max_usage_in_bytes")``)."""
        return Path(self._file(controller, name)).read_text().strip()

    def kill(self, *, spare: int | None = None, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the cgroup, with no window for any of them to fork a survivor; wait until
        the cgroup is empty. ``SandboxError`` if it is not empty within ``timeout_s``.

        ``spare``: one member to leave alive (the host-side bwrap, whose child the sandbox's PID 1 is: killing
        both at once would leave that PID 1 a zombie for the host's init to reap, and not every init does).
        The spared process has no way to act for the sandbox: it only waits for its child and exits."""
        if self.removed:
            return
        if self.hierarchy.version == 2:
            kill_file = os.path.join(self.dirs["unified"], "cgroup.kill")
            if spare is None and os.path.exists(kill_file):
                _write(kill_file, "1")
            else:
                self._freeze_kill_thaw(os.path.join(self.dirs["unified"], "cgroup.freeze"), "1", "0", spare)
        else:
            state = os.path.join(self.dirs["freezer"], "freezer.state")
            self._freeze_kill_thaw(state, "FROZEN", "THAWED", spare)
        deadline = time.monotonic() + timeout_s
        while set(self.members()) - {spare}:
            if time.monotonic() > deadline:
                raise SandboxError(f"cgroup {self.name} still has processes {self.members()} after SIGKILL")
            time.sleep(0.001)

    def _freeze_kill_thaw(self, state_file: str, frozen: str, thawed: str, spare: int | None) -> None:
        _write(state_file, frozen)
        try:
            deadline = time.monotonic() + 2.0
            if self.hierarchy.version == 1:
                # FREEZING until every task stopped; a task in an uninterruptible sleep can delay it.
                while Path(state_file).read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                    time.sleep(0.0005)
            else:
                events = os.path.join(os.path.dirname(state_file), "cgroup.events")
                while "frozen 1" not in Path(events).read_text() and time.monotonic() < deadline:
                    time.sleep(0.0005)
            for pid in self.members():
                if pid == spare:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            _write(state_file, thawed)  # SIGKILL is delivered once the tasks can run again

    def remove(self) -> None:
        """Remove the cgroup directories (the cgroup must be empty: ``kill`` first). Idempotent."""
        for path in self.dirs.values():
            for attempt in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: the last members are still exiting
                    if attempt == 49:
                        raise
                    time.sleep(0.002)
        self.removed = True
