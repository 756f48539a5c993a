"""Escape battery, tenancy: what one tenant of a pool leaves behind must never reach the next one.

Every attack runs against the real ``SandboxPool`` (release destroys the sandbox; the next tenant gets one that
nothing of the last ever ran in) and against ``ReusingPool``, the weakened variant: the previous design, which
reset a sandbox in place (one pass killing every process, then emptying the writable directories) and handed
the same sandbox, through the same handle object, to the next tenant. Each attack must succeed against it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from components.errors import SandboxError
from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.errors import SandboxLeaseEndedError
from sandboxes.pool import SandboxPool, SandboxPoolConfig
from tests.sandboxes.sandbox_test_support import HOST_PYTHON, processes_of_uid

# Room for a pid hopper's zombies (reaped every 0.2 s): the attack must not be stopped by the process cap.
LIMITS = SandboxLimits(command_timeout_s=20, memory_mb=256, max_processes=256, workspace_mb=32)
SPEC = SandboxSpec(limits=LIMITS)

# The old in-place reset, run as the sandbox user: what the supervisor's "reset" op did.
OLD_RESET = r"""
import os, shutil, signal
me, my_sid = os.getpid(), os.getsid(0)
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in (1, me):
        try:
            if os.getsid(int(name)) != my_sid:
                os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass
for d in ("/workspace", "/tmp", "/home/sandbox", "/dev/shm"):
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass
"""


class ReusingPool(SandboxPool):
    """The weakened variant: release resets the sandbox in place and reuses it (handle included)."""

    async def release(self, sandbox) -> None:
        self._in_use.pop(sandbox.sandbox_id)
        await sandbox.exec([HOST_PYTHON, "-c", OLD_RESET])
        sandbox.spec = SandboxSpec()
        self._warm.appendleft(sandbox)


@pytest.fixture(params=["hardened", "weakened-reusing-pool"])
async def pool(request):
    pool_class = SandboxPool if request.param == "hardened" else ReusingPool
    async with pool_class(SandboxPoolConfig(num_warm=1, workspace_mb=LIMITS.workspace_mb)) as pool:
        yield pool


def weakened(pool) -> bool:
    return isinstance(pool, ReusingPool)


async def next_tenant(pool, previous):
    """Release ``previous`` and acquire the next sandbox once one is warm (what the next rollout gets)."""
    await pool.release(previous)
    deadline = time.monotonic() + 20
    while pool.num_warm == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    return await pool.acquire(SPEC)


def non_supervisor_processes(uid: int) -> list[int]:
    found = []
    for pid in processes_of_uid(uid):
        try:
            if b"supervisor.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass
    return found


# Hops to a new pid continuously (fork, parent exits): a one-pass kill lists a pid that is gone by the time it
# kills it. Each incarnation copies the next tenant's secret where its author can read it later.
PID_HOPPER = r"""
import os
while True:
    try:
        if os.fork():
            os._exit(0)
    except OSError:  # at the process cap (hopped-from zombies count until the supervisor reaps them)
        continue
    try:
        data = open("/workspace/secret.txt").read()
        with open("/tmp/stolen.txt", "w") as f:
            f.write(data)
    except OSError:
        pass
"""


# A child held in ptrace-stop by its parent (PTRACE_ATTACH): it runs nothing until the tracer lets it.
PTRACE_STOPPED = r"""
import ctypes, os, time
child = os.fork()
if child == 0:
    time.sleep(903)
    os._exit(0)
ctypes.CDLL(None, use_errno=True).ptrace(16, child, None, None)  # PTRACE_ATTACH
time.sleep(903)
"""


async def test_processes_do_not_survive_into_the_next_tenant(pool):
    """A policy has many tries: a pid hopper may lose any one race against a one-pass kill, so the attack is
    repeated (up to 6 tenancies); it must never work against the real pool and must work against the old one."""
    tenant = await pool.acquire(SPEC)
    stolen_once = False
    for _ in range(6):
        uid = tenant.host_uid
        await tenant.write_file("hopper.py", PID_HOPPER)
        await tenant.write_file("tracer.py", PTRACE_STOPPED)
        await tenant.exec(
            # detached (setsid, double fork), stopped, ptrace-stopped, in a nested PID namespace, pid-hopping
            f"for i in 1 2 3; do setsid {HOST_PYTHON} hopper.py > /dev/null 2>&1 & done; "
            "(setsid sh -c 'sleep 900 & sleep 901' > /dev/null 2>&1 &); "
            "setsid sleep 902 > /dev/null 2>&1 & kill -STOP $!; "
            f"setsid {HOST_PYTHON} tracer.py > /dev/null 2>&1 & "
            "setsid unshare -Urpf --mount-proc sleep 904 > /dev/null 2>&1 & "
            "sleep 0.5"
        )
        assert len(non_supervisor_processes(uid)) >= 4
        next_one = await next_tenant(pool, tenant)
        await next_one.write_file("secret.txt", "SECOND-TENANT-SECRET")
        await asyncio.sleep(0.5)
        stolen = await next_one.exec(
            "cat /tmp/stolen.txt 2>/dev/null; ps -eo args --no-headers | grep -c '[h]opper'"
        )
        tenant = next_one
        if not weakened(pool):
            assert next_one.host_uid != uid and non_supervisor_processes(uid) == []
            assert "SECOND-TENANT-SECRET" not in stolen.stdout and stolen.stdout.split()[-1] == "0", stolen
        if "SECOND-TENANT-SECRET" in stolen.stdout:
            stolen_once = True
            break
    await pool.release(tenant)
    assert stolen_once == weakened(pool)


async def test_ipc_objects_do_not_survive_into_the_next_tenant(pool):
    first = await pool.acquire(SPEC)
    made = await first.exec(
        "ipcmk -M 4096 && ipcmk -Q && ipcmk -S 1 && "
        f"{HOST_PYTHON} -c \"import ctypes, os; rt = ctypes.CDLL('librt.so.1', use_errno=True); "
        "print('mq', rt.mq_open(b'/rein-leak', os.O_CREAT | os.O_RDWR, 0o600, None))\""
    )
    assert made.exit_code == 0 and "mq -1" not in made.stdout, made
    second = await next_tenant(pool, first)
    seen = await second.exec(
        "ipcs -m -q -s | grep -c '^0x' ; "
        f"{HOST_PYTHON} -c \"import ctypes, os; rt = ctypes.CDLL('librt.so.1', use_errno=True); "
        "print('mq', rt.mq_open(b'/rein-leak', os.O_RDWR, 0, None))\""
    )
    num_sysv = int(seen.stdout.split()[0])
    mq_found = "mq -1" not in seen.stdout
    if weakened(pool):
        assert num_sysv == 3 and mq_found, seen
    else:
        assert num_sysv == 0 and not mq_found, seen
    await pool.release(second)


async def test_changed_limits_do_not_survive_into_the_next_tenant(pool):
    """The supervisor runs as the sandbox's uid, so a command can lower *its* rlimits, which every later
    command inherits: here a 4 KB file size limit."""
    first = await pool.acquire(SPEC)
    changed = await first.exec("prlimit --pid 1 --fsize=4096:4096 && grep 'Max file size' /proc/1/limits")
    assert "4096" in changed.stdout, changed
    second = await next_tenant(pool, first)
    write = await second.exec("head -c 100000 /dev/zero > big.bin; echo rc=$?")
    if weakened(pool):
        assert "rc=0" not in write.stdout, write
    else:
        assert "rc=0" in write.stdout, write
    await pool.release(second)


async def test_files_do_not_survive_into_the_next_tenant(pool):
    first = await pool.acquire(SPEC)
    await first.exec(
        "mkdir -p /tmp/.keep/inner $HOME/.cache/x /dev/shm/.k && echo LEFTOVER > /tmp/.keep/inner/f && "
        "echo LEFTOVER > $HOME/.cache/x/f && echo LEFTOVER > /dev/shm/.k/f && "
        "chmod 000 /tmp/.keep $HOME/.cache /dev/shm/.k && echo LEFTOVER > /workspace/plain"
    )
    second = await next_tenant(pool, first)
    listing = await second.exec("ls -A /workspace /tmp $HOME /dev/shm")
    names = {line for line in listing.stdout.split() if not line.endswith(":")}
    if weakened(pool):
        assert {".keep", ".cache", ".k"} & names, listing  # unreadable directories the reset could not empty
    else:
        assert names == set(), listing
    await pool.release(second)


async def test_a_kept_handle_reaches_nothing_after_release(pool, tmp_path):
    first = await pool.acquire(SPEC)
    kept = first
    second = await next_tenant(pool, first)
    await second.write_file("secret.txt", "SECOND-TENANT-SECRET")
    if weakened(pool):
        assert (await kept.exec("cat secret.txt")).stdout == "SECOND-TENANT-SECRET"
        assert await kept.read_file("secret.txt") == b"SECOND-TENANT-SECRET"
    else:
        for call in (kept.exec("cat secret.txt"), kept.read_file("secret.txt"), kept.write_file("x", "y")):
            with pytest.raises(SandboxLeaseEndedError):
                await call
        with pytest.raises(SandboxLeaseEndedError):
            await kept.download("secret.txt", tmp_path / "never")
        assert not (tmp_path / "never").exists()
    await pool.release(second)


async def test_release_while_a_command_runs_ends_it():
    """A call in flight at release fails (typed), and its processes are gone with the sandbox."""
    async with SandboxPool(SandboxPoolConfig(num_warm=1, workspace_mb=LIMITS.workspace_mb)) as pool:
        first = await pool.acquire(SPEC)
        uid = first.host_uid
        running = asyncio.create_task(first.exec("sleep 600"))
        await asyncio.sleep(0.3)
        await pool.release(first)
        with pytest.raises(SandboxError):
            await asyncio.wait_for(running, 10)
        deadline = time.monotonic() + 10
        while processes_of_uid(uid):
            assert time.monotonic() < deadline, processes_of_uid(uid)
            await asyncio.sleep(0.05)
