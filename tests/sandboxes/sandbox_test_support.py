"""Helpers shared by the sandbox tests (imported by name: conftest modules are not importable reliably)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from components.protocols import SandboxLimits
from sandboxes.bwrap import BwrapSandbox
from sandboxes.e2b import E2BSandboxConfig
from sandboxes.pool import SandboxPoolConfig
from sandboxes.ray_pool import RaySandboxPoolConfig
from tests.sandboxes.fake_e2b_sdk import FakeAsyncSandbox

HOST_PYTHON = os.path.realpath(sys.executable)
RAY_POOL_CONFIG = RaySandboxPoolConfig(pool=SandboxPoolConfig(num_warm=2), name_prefix="test-contract-pool")
FAKE_E2B_CONFIG = E2BSandboxConfig(sdk_class=FakeAsyncSandbox, workspace_dir="/workspace", num_attempts=3)


def processes_of_uid(uid: int) -> list[int]:
    """Host pids whose real uid is ``uid`` (a bwrap sandbox's processes all run as its own host uid)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                pids.append(int(name))
    return pids


def process_uids() -> list[int]:
    """The real uid of every host process (one pass over /proc)."""
    uids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                uids.append(os.stat(f"/proc/{name}").st_uid)
    return uids


SMALL_LIMITS = SandboxLimits(command_timeout_s=20, memory_mb=256, max_processes=32, workspace_mb=32)


def kill_from_outside(sandbox: BwrapSandbox) -> None:
    """SIGKILL every process of a sandbox from the host (what the OOM killer or an operator would do)."""
    for pid in processes_of_uid(sandbox.host_uid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
