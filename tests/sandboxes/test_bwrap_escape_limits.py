"""Escape battery, resource limits: attacks that try to use more than a sandbox's share by spreading across
processes, threads, files and memory no rlimit counts. Each attack runs against the real configuration
("hardened": a cgroup per sandbox) and against a deliberately weakened one (per-process rlimits only, or a
larger inode cap), and must succeed against the weakened one: proof that the test can fail and that the
defence it credits is the one holding."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from components.protocols import SandboxLimits, SandboxSpec
from sandboxes import bwrap as bwrap_module
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig
from tests.sandboxes.sandbox_test_support import HOST_PYTHON, processes_of_uid

HARDENED = BwrapSandboxConfig()
RLIMIT_ONLY = BwrapSandboxConfig(resource_control="rlimit")  # the weakened variant: no cgroup
VARIANTS = [pytest.param(HARDENED, id="hardened"), pytest.param(RLIMIT_ONLY, id="weakened-rlimit-only")]
# RLIMIT_NPROC "lifted": to the hard limit this process has (a command cannot go above it).
NPROC_HARD = resource.getrlimit(resource.RLIMIT_NPROC)[1]
LIMITS = SandboxLimits(command_timeout_s=30, memory_mb=160, max_processes=32, workspace_mb=48)


def weakened(config: BwrapSandboxConfig) -> bool:
    return config.resource_control == "rlimit"


async def python_in(sandbox, code: str, **kwargs):
    return await sandbox.exec([HOST_PYTHON, "-c", code], **kwargs)


@pytest.mark.parametrize("config", VARIANTS)
async def test_memory_spread_over_many_processes(config):
    """Four processes each under the per-process address-space limit, together 1.5x the sandbox's memory."""
    chunk_mb, num_children = 60, 4
    code = f"""
import os, time
pids = []
for _ in range({num_children}):
    pid = os.fork()
    if pid == 0:
        held = b"x" * ({chunk_mb} << 20)  # touched: resident, not just reserved
        time.sleep(3)  # all hold their memory at the same time
        os._exit(0)
    pids.append(pid)
held = sum(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in (os.waitpid(p, 0)[1] for p in pids))
print("held_mb", held * {chunk_mb})
"""
    async with await BwrapSandbox.create(SandboxSpec(limits=LIMITS), config) as sandbox:
        result = await python_in(sandbox, code)
        held_mb = int(result.stdout.split()[1])
        if weakened(config):
            assert held_mb > LIMITS.memory_mb  # the attack works without a cgroup
        else:
            assert held_mb <= LIMITS.memory_mb, result
            peak = int(sandbox.cgroup.read("memory", "memory.max_usage_in_bytes"))
            assert peak >= 0.9 * LIMITS.memory_mb * 1024 * 1024  # the cgroup's limit is what stopped it
            assert (await sandbox.exec("echo alive")).stdout == "alive\n"


def stored_mb(sandbox: BwrapSandbox) -> float:
    """MB of files in the sandbox's writable tmpfs mounts, seen from the host through its supervisor's root
    (no memory needed inside the sandbox, which may have none left)."""
    supervisor = next(
        pid
        for pid in processes_of_uid(sandbox.host_uid)
        if b"supervisor.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    total = 0
    for mount in ("workspace", "tmp", "home/sandbox", "dev/shm"):
        for entry in os.scandir(f"/proc/{supervisor}/root/{mount}"):
            total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total / (1 << 20)


@pytest.mark.parametrize("config", VARIANTS)
async def test_memory_in_tmpfs_files_no_process_owns(config):
    """Files in /workspace, /tmp, $HOME and /dev/shm: memory, but in no process's address space."""
    spec = SandboxSpec(limits=SandboxLimits(memory_mb=96, workspace_mb=32, command_timeout_s=30))
    async with await BwrapSandbox.create(spec, config) as sandbox:
        await sandbox.exec(
            "for d in /workspace /tmp $HOME /dev/shm; do head -c 32M /dev/zero > $d/fill 2>/dev/null; done"
        )
        if weakened(config):
            assert stored_mb(sandbox) > spec.limits.memory_mb
        else:
            assert stored_mb(sandbox) <= spec.limits.memory_mb
            await sandbox.ping()  # the writer was the OOM killer's victim, not the supervisor


SYSV_SHM_FILLER = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = {chunk_mb} << 20
segment = libc.shmget(0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
address = libc.shmat(segment, None, 0)
ctypes.memset(address, 1, size)  # resident now, and stays so after we detach and exit
libc.shmdt(ctypes.c_void_p(address))
print("kept", segment)
"""


@pytest.mark.parametrize("config", VARIANTS)
async def test_memory_in_sysv_shm_segments_outliving_their_processes(config):
    """SysV shared memory stays allocated with no process attached: each filler is under its own rlimit and
    gone before the next starts, but the segments add up."""
    chunk_mb = 60
    filler = SYSV_SHM_FILLER.format(chunk_mb=chunk_mb)
    async with await BwrapSandbox.create(SandboxSpec(limits=LIMITS), config) as sandbox:
        kept = 0
        for _ in range(4):
            result = await python_in(sandbox, filler)
            kept += result.stdout.startswith("kept")
        listed = await sandbox.exec("ipcs -m | grep -c '^0x'")
        if weakened(config):
            assert kept * chunk_mb > LIMITS.memory_mb and int(listed.stdout) == 4
        else:
            assert kept * chunk_mb <= LIMITS.memory_mb, (kept, listed)
            assert (await sandbox.exec("echo alive")).stdout == "alive\n"


@pytest.mark.parametrize("config", VARIANTS)
async def test_fork_bomb_without_the_process_rlimit(config, monkeypatch):
    """RLIMIT_NPROC is the second line; with it lifted, only the cgroup's pids cap bounds the tasks."""
    monkeypatch.setattr(
        bwrap_module,
        "_limits_message",
        lambda limits: {
            "cpu_time_s": limits.cpu_time_s,
            "memory_mb": limits.memory_mb,
            "max_processes": NPROC_HARD,
        },
    )
    code = (
        "import os, time\nn = 0\ntry:\n    while n < 400:\n        if os.fork() == 0:\n"
        "            time.sleep(4); os._exit(0)\n        n += 1\nexcept OSError as e:\n    pass\nprint('forked', n)\n"
    )
    async with await BwrapSandbox.create(SandboxSpec(limits=LIMITS), config) as sandbox:
        result = await python_in(sandbox, code, timeout_s=20)
        forked = int(result.stdout.split()[1])
        if weakened(config):
            assert forked == 400
        else:
            assert forked <= LIMITS.max_processes + config.supervisor_tasks, result
            assert (
                int(sandbox.cgroup.read("pids", "pids.max")) == LIMITS.max_processes + config.supervisor_tasks
            )


@pytest.mark.parametrize("config", VARIANTS)
async def test_thread_bomb_across_two_concurrent_commands(config, monkeypatch):
    """Threads are tasks too; two commands at once share one bound."""
    monkeypatch.setattr(
        bwrap_module,
        "_limits_message",
        lambda limits: {"cpu_time_s": limits.cpu_time_s, "memory_mb": 4096, "max_processes": NPROC_HARD},
    )
    code = (
        "import threading, time\nn = 0\ntry:\n    while n < 300:\n"
        "        threading.Thread(target=time.sleep, args=(4,), daemon=True).start(); n += 1\n"
        "except RuntimeError:\n    pass\nprint('threads', n)\ntime.sleep(3)\n"
    )
    async with await BwrapSandbox.create(SandboxSpec(limits=LIMITS), config) as sandbox:
        results = await asyncio.gather(python_in(sandbox, code), python_in(sandbox, code))
        total = sum(int(r.stdout.split()[1]) for r in results)
        if weakened(config):
            assert total == 600
        else:
            assert total <= LIMITS.max_processes + config.supervisor_tasks, results


@pytest.mark.parametrize("config", VARIANTS)
async def test_cpu_spread_over_processes(config):
    """Two busy processes for 3 s of wall time: bounded by the sandbox's CPU quota, not by the host's cores.
    (A tiny quota, so that even a host loaded many times over gives the unbounded variant more than it.)"""
    quota, wall_s, bound_s = 0.02, 3.0, 0.15
    config = BwrapSandboxConfig(resource_control=config.resource_control, cpu_cores=quota)
    code = (
        f"import os, time\nfor _ in range(2):\n    if os.fork() == 0:\n        end = time.time() + {wall_s}\n"
        "        while time.time() < end: pass\n        os._exit(0)\n"
        "os.wait(); os.wait(); t = os.times(); print('cpu', t.children_user + t.children_system)\n"
    )
    async with await BwrapSandbox.create(SandboxSpec(limits=LIMITS), config) as sandbox:
        result = await python_in(sandbox, code)
        cpu_s = float(result.stdout.split()[1])
        if weakened(config):
            assert cpu_s > bound_s, result
        else:
            assert cpu_s <= bound_s, result
            stats = dict(line.split() for line in sandbox.cgroup.read("cpu", "cpu.stat").splitlines())
            assert int(stats["nr_throttled"]) > 0


@pytest.mark.parametrize(
    "max_inodes", [pytest.param(2000, id="hardened"), pytest.param(10**7, id="weakened")]
)
async def test_inode_exhaustion(max_inodes):
    """Empty files cost no bytes of the size cap; the inode cap bounds them."""
    config = BwrapSandboxConfig(max_inodes=max_inodes)
    async with await BwrapSandbox.create(SandboxSpec(limits=LIMITS), config) as sandbox:
        result = await python_in(
            sandbox,
            "import os\nn = 0\ntry:\n    while n < 5000:\n        open(f'/workspace/f{n}', 'w').close(); n += 1\n"
            "except OSError as e:\n    print('stopped', e.strerror)\nprint('files', n)\n",
        )
        created = int(result.stdout.split()[-1])
        if max_inodes > 5000:
            assert created == 5000
        else:
            assert created < max_inodes and "No space left" in result.stdout, result
            assert (await sandbox.exec("rm -f /workspace/f*; echo ok > again && cat again")).stdout == "ok\n"


REFUSAL_PROBE = """
import asyncio
from sandboxes.bwrap import BwrapSandboxConfig
from sandboxes.cgroups import CgroupUnavailableError
from sandboxes.pool import SandboxPool, SandboxPoolConfig

async def main():
    try:
        await SandboxPool(SandboxPoolConfig(num_warm=1)).start()
        print("STARTED")
    except CgroupUnavailableError as exc:
        print("REFUSED", exc)
    pool = SandboxPool(SandboxPoolConfig(num_warm=0, bwrap=BwrapSandboxConfig(resource_control="rlimit")))
    await pool.start()  # asking for no cgroup limits is allowed: nothing is claimed
    print("RLIMIT-POOL-STARTED")
    await pool.close()

asyncio.run(main())
"""


def test_pool_refuses_limits_an_unprivileged_user_cannot_enforce(tmp_path):
    """A user without root (and no delegated cgroup subtree) cannot create cgroups: the pool refuses to start
    with a typed error instead of pretending its memory/pids/CPU limits hold."""
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", REFUSAL_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert "REFUSED" in result.stdout and "not writable by uid 65534" in result.stdout, result
    assert "STARTED\n" not in result.stdout.replace("RLIMIT-POOL-STARTED", "")
    assert "RLIMIT-POOL-STARTED" in result.stdout
