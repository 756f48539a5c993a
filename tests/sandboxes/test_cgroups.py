"""The cgroup layer on its own: layout detection for v1 and v2, the control-file writes of both versions, and
a real cgroup v2 hierarchy (the host's, or one mounted for the test) for joining and killing."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from sandboxes.cgroups import (
    CgroupHierarchy,
    CgroupLimits,
    CgroupUnavailableError,
    SandboxCgroup,
    detect_hierarchy,
    prepare_parents,
)

V1_MOUNTINFO = """\
35 31 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
36 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:33 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:34 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_PROC_CGROUP = "8:pids:/\n6:freezer:/\n4:memory:/jobs/abc\n1:cpu:/\n0::/\n"
V2_MOUNTINFO = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
LIMITS = CgroupLimits(memory_bytes=64 << 20, max_tasks=40, cpu_cores=0.5)


def test_detects_v1_per_controller_under_the_own_cgroup():
    hierarchy = detect_hierarchy(mountinfo=V1_MOUNTINFO, proc_cgroup=V1_PROC_CGROUP)
    assert hierarchy.version == 1
    assert hierarchy.parents == {
        "memory": "/sys/fs/cgroup/memory/jobs/abc/rein",
        "pids": "/sys/fs/cgroup/pids/rein",
        "cpu": "/sys/fs/cgroup/cpu/rein",
        "freezer": "/sys/fs/cgroup/freezer/rein",
    }
    no_cpu = detect_hierarchy(mountinfo=V1_MOUNTINFO, proc_cgroup=V1_PROC_CGROUP, cpu=False)
    assert "cpu" not in no_cpu.parents and "cpu" not in no_cpu.controllers
    without_freezer = "\n".join(line for line in V1_MOUNTINFO.splitlines() if "freezer" not in line)
    with pytest.raises(CgroupUnavailableError, match="freezer"):
        detect_hierarchy(mountinfo=without_freezer, proc_cgroup=V1_PROC_CGROUP)


def test_detects_v2_next_to_the_own_cgroup():
    # A process in a non-root v2 cgroup cannot give that cgroup children with controllers: use a sibling.
    nested = detect_hierarchy(mountinfo=V2_MOUNTINFO, proc_cgroup="0::/user.slice/session-1.scope\n")
    assert nested.version == 2 and nested.parents == {"unified": "/sys/fs/cgroup/user.slice/rein"}
    at_root = detect_hierarchy(mountinfo=V2_MOUNTINFO, proc_cgroup="0::/\n", parent_name="pool")
    assert at_root.parents == {"unified": "/sys/fs/cgroup/pool"}


def fake_tree(root: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        (root / name).write_text(content)


def test_v2_control_file_writes(tmp_path):
    """The v2 writes, against a directory laid out like a v2 cgroup (no v2 memory controller here)."""
    hierarchy = CgroupHierarchy(version=2, parents={"unified": str(tmp_path)})
    cgroup_dir = tmp_path / "box"
    cgroup_dir.mkdir()
    fake_tree(
        cgroup_dir, {"memory.max": "max", "memory.swap.max": "max", "pids.max": "max", "cpu.max": "max"}
    )
    cgroup = SandboxCgroup(hierarchy, "box")
    cgroup.set_limits(LIMITS)
    assert (cgroup_dir / "memory.max").read_text() == str(64 << 20)
    assert (cgroup_dir / "memory.swap.max").read_text() == "0"
    assert (cgroup_dir / "pids.max").read_text() == "40"
    assert (cgroup_dir / "cpu.max").read_text() == "50000 100000"
    cgroup.set_limits(CgroupLimits(memory_bytes=1 << 30, max_tasks=10, cpu_cores=None))
    assert (cgroup_dir / "cpu.max").read_text() == "max 100000"
    assert cgroup.procs_files == (str(cgroup_dir / "cgroup.procs"),)
    # Parents: the controllers must be available, and get enabled for the children.
    fake_tree(tmp_path, {"cgroup.controllers": "cpuset cpu io memory pids", "cgroup.subtree_control": ""})
    prepare_parents(hierarchy)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    fake_tree(tmp_path, {"cgroup.controllers": "cpu io"})
    with pytest.raises(CgroupUnavailableError, match="memory"):
        prepare_parents(hierarchy)


def test_v1_control_file_writes(tmp_path):
    parents = {c: str(tmp_path / c) for c in ("memory", "pids", "cpu", "freezer")}
    hierarchy = CgroupHierarchy(version=1, parents=parents, controllers=tuple(parents))
    for parent in parents.values():
        Path(parent, "box").mkdir(parents=True)
    fake_tree(tmp_path / "memory" / "box", {"memory.limit_in_bytes": "", "memory.memsw.limit_in_bytes": ""})
    fake_tree(tmp_path / "pids" / "box", {"pids.max": ""})
    fake_tree(tmp_path / "cpu" / "box", {"cpu.cfs_period_us": "", "cpu.cfs_quota_us": ""})
    cgroup = SandboxCgroup(hierarchy, "box")
    cgroup.set_limits(LIMITS)
    assert (tmp_path / "memory/box/memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (tmp_path / "memory/box/memory.memsw.limit_in_bytes").read_text() == str(64 << 20)
    assert (tmp_path / "pids/box/pids.max").read_text() == "40"
    assert (tmp_path / "cpu/box/cpu.cfs_quota_us").read_text() == "50000"
    assert len(cgroup.procs_files) == 4


@pytest.fixture
def cgroup2_mount(tmp_path):
    """A real cgroup v2 mount: the host's (hybrid or unified), else one mounted for this test."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        if fields[1].split()[0] == "cgroup2":
            yield fields[0].split()[4]
            return
    mount_point = tmp_path / "cg2"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "cgroup2", "none", str(mount_point)], check=True)
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def spawn_in(cgroup: SandboxCgroup, script: str) -> subprocess.Popen:
    join = " && ".join(f"echo $$ > {path}" for path in cgroup.procs_files)
    return subprocess.Popen(["/bin/sh", "-c", f"{join} && exec /bin/sh -c '{script}'"])


@pytest.mark.parametrize("spare_the_leader", [False, True], ids=["cgroup.kill", "freeze-kill-thaw"])
def test_real_cgroup_v2_kill_leaves_nothing(cgroup2_mount, spare_the_leader):
    """On a real v2 hierarchy: processes that detach (setsid, double fork), stop themselves, or fork in a loop
    all die in one kill; the cgroup is then empty and removable."""
    parent = os.path.join(cgroup2_mount, f"rein-test-{os.getpid()}")
    os.makedirs(parent, exist_ok=True)
    hierarchy = CgroupHierarchy(version=2, parents={"unified": parent}, controllers=())
    cgroup = SandboxCgroup.create(hierarchy, "box", LIMITS)
    try:
        leader = spawn_in(
            cgroup,
            "setsid sleep 900 & (sleep 901 &); sleep 902 & kill -STOP $!; "
            '(while :; do sh -c "exit 0" & wait; done) & sleep 903',
        )
        deadline = time.monotonic() + 10
        while len(cgroup.members()) < 6:
            assert time.monotonic() < deadline, cgroup.members()
            time.sleep(0.01)
        assert leader.pid in cgroup.members()
        if spare_the_leader:
            cgroup.kill(spare=leader.pid)
            assert set(cgroup.members()) <= {leader.pid}  # (it may have exited by itself since)
            cgroup.kill()
        else:
            cgroup.kill()
        assert cgroup.members() == []
        leader.wait(timeout=5)
        cgroup.remove()
        assert not os.path.exists(cgroup.dirs["unified"])
    finally:
        with contextlib.suppress(OSError):
            cgroup.kill()
            cgroup.remove()
        with contextlib.suppress(OSError):
            os.rmdir(parent)


def test_cgroups_of_dead_owners_are_swept(monkeypatch):
    """A process that died without closing its sandboxes (SIGKILL: bwrap and all inside die with it) leaves
    empty cgroups; the next process to use the same parent removes them, and never a live owner's."""
    from sandboxes import bwrap as bwrap_module

    config = bwrap_module.BwrapSandboxConfig()
    hierarchy = bwrap_module.cgroup_hierarchy(config)
    finished = subprocess.Popen(["true"])
    finished.wait()
    stale = SandboxCgroup.create(hierarchy, f"bwrap-{finished.pid}-0-abcdef", LIMITS)
    live = SandboxCgroup.create(hierarchy, f"bwrap-{os.getpid()}-999-abcdef", LIMITS)
    try:
        monkeypatch.setattr(bwrap_module, "_hierarchies", {})  # as in a freshly started process
        bwrap_module.cgroup_hierarchy(config)
        assert not any(os.path.exists(path) for path in stale.dirs.values())
        assert all(os.path.exists(path) for path in live.dirs.values())
    finally:
        for cgroup in (stale, live):
            with contextlib.suppress(OSError):
                cgroup.remove()
