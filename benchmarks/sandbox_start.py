"""Sandbox start-up cost, side by side in one run.

  * fork/exec: a plain ``true`` from asyncio (the floor).
  * cold: bubblewrap building a BwrapSandbox's full namespace + mount layout and running ``true`` once, in a
    cgroup of its own (memory, pids, cpu, freezer: created, joined, killed and removed: the default config).
    Also without the cpu controller (``cpu_cores=0``) and without any cgroup (``resource_control="rlimit"``),
    to show what the cgroup costs.
  * bwrap reference: ``bwrap --unshare-all --ro-bind / / true`` (the minimal fully-namespaced bwrap), to show
    how much of "cold" is bubblewrap + kernel namespaces themselves (and how loaded the machine is).
  * sandbox start: ``BwrapSandbox.start_generic`` (bwrap + the supervisor answering), what a pool refill costs.
  * exec: one ``exec("true")`` round trip in a started sandbox.
  * acquire: ``SandboxPool.acquire`` with a warm sandbox available.

Usage: ``python benchmarks/sandbox_start.py [--quick]``; the last line is the summary against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from components.protocols import SandboxLimits, SandboxSpec  # noqa: E402
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig, run_once_cold  # noqa: E402
from sandboxes.pool import SandboxPool, SandboxPoolConfig  # noqa: E402


async def fork_exec_true() -> float:
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec("/bin/true")
    await process.wait()
    return time.perf_counter() - start


async def bwrap_reference(config: BwrapSandboxConfig) -> float:
    argv = [
        config.bwrap_path,
        "--unshare-all",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "/bin/true",
    ]
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*argv)
    await process.wait()
    return time.perf_counter() - start


async def sandbox_start(config: BwrapSandboxConfig) -> float:
    start = time.perf_counter()
    sandbox = await BwrapSandbox.start_generic(config, workspace_mb=64)
    elapsed = time.perf_counter() - start
    await sandbox.close()
    return elapsed


async def main(quick: bool) -> None:
    num_runs = 30 if quick else 200
    num_starts = 10 if quick else 50
    config = BwrapSandboxConfig()
    rows: dict[str, list[float]] = {}
    for _ in range(3):  # warm the page cache
        await run_once_cold(config)
    rows["fork/exec true"] = [await fork_exec_true() for _ in range(num_runs)]
    rows["cold bwrap true"] = [await run_once_cold(config) for _ in range(num_runs)]
    no_cpu = BwrapSandboxConfig(cpu_cores=0)
    rows["cold, cgroup no cpu"] = [await run_once_cold(no_cpu) for _ in range(num_runs)]
    no_cgroup = BwrapSandboxConfig(resource_control="rlimit")
    rows["cold, no cgroup"] = [await run_once_cold(no_cgroup) for _ in range(num_runs)]
    rows["bwrap reference"] = [await bwrap_reference(config) for _ in range(num_runs)]
    rows["sandbox start"] = [await sandbox_start(config) for _ in range(num_starts)]
    async with await BwrapSandbox.create(SandboxSpec(limits=SandboxLimits(workspace_mb=64))) as sandbox:
        exec_times = []
        for _ in range(num_runs):
            start = time.perf_counter()
            await sandbox.exec("true")
            exec_times.append(time.perf_counter() - start)
        rows["exec round trip"] = exec_times
    spec = SandboxSpec(limits=SandboxLimits(workspace_mb=64))
    async with SandboxPool(SandboxPoolConfig(num_warm=4, workspace_mb=64, bwrap=config)) as pool:
        acquire_times = []
        for _ in range(num_runs):
            while pool.num_warm == 0:
                await asyncio.sleep(0.005)
            start = time.perf_counter()
            sandbox = await pool.acquire(spec)
            acquire_times.append(time.perf_counter() - start)
            await pool.release(sandbox)
        rows["pooled acquire"] = acquire_times
        assert pool.num_cold_starts == 0
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(f"{'what':<22} {'median ms':>10} {'p90 ms':>10} {'runs':>6}")
    for name, times in rows.items():
        times_ms = sorted(t * 1000 for t in times)
        p90 = times_ms[int(0.9 * (len(times_ms) - 1))]
        print(f"{name:<22} {statistics.median(times_ms):>10.3f} {p90:>10.3f} {len(times_ms):>6}")
    cold_ms = statistics.median(rows["cold bwrap true"]) * 1000
    acquire_ms = statistics.median(rows["pooled acquire"]) * 1000
    print(
        f"sandbox_start: cold {cold_ms:.2f} ms, acquire {acquire_ms:.3f} ms (target cold <= 15 ms, acquire <= 1 ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (< 1 minute)")
    asyncio.run(main(parser.parse_args().quick))
