"""The per-node pool actor serves rollouts running in Ray tasks (kept small: one node, three rollouts)."""

from __future__ import annotations

import asyncio

import ray

from components.errors import SandboxError
from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.errors import SandboxFileRefusedError
from sandboxes.pool import SandboxPoolConfig
from sandboxes.ray_pool import (
    RaySandboxPool,
    RaySandboxPoolConfig,
    sandbox_slot_request,
    shutdown_node_pools,
    start_node_pools,
)

CONFIG = RaySandboxPoolConfig(
    pool=SandboxPoolConfig(num_warm=3, workspace_mb=16), name_prefix="test-sandbox-pool"
)
SPEC = SandboxSpec(limits=SandboxLimits(workspace_mb=16))


@ray.remote(num_cpus=0)
def rollout(index: int) -> dict:
    """What rollout code on any node does: acquire from its node's pool, work, release."""

    async def run() -> dict:
        pool = RaySandboxPool(CONFIG)
        sandbox = await pool.acquire(SPEC)
        try:
            await sandbox.write_file("input.txt", f"rollout {index}")
            result = await sandbox.exec("cat input.txt; echo; id -u")
            try:
                await sandbox.read_file("missing.txt")
                missing = "no error"
            except FileNotFoundError:
                missing = "FileNotFoundError"
            await sandbox.exec("mkfifo pipe")
            try:
                await sandbox.read_file("pipe")
                fifo = "no error"
            except SandboxFileRefusedError:  # typed across the actor boundary too
                fifo = "SandboxFileRefusedError"
        finally:
            await pool.release(sandbox)
        try:
            await sandbox.exec("true")
            after_release = "no error"
        except SandboxError as exc:
            after_release = type(exc).__name__
        return {
            "stdout": result.stdout,
            "missing": missing,
            "fifo": fifo,
            "after_release": after_release,
            "sandbox_id": sandbox.sandbox_id,
        }

    return asyncio.run(run())


def test_rollouts_in_ray_tasks_use_the_node_pool(ray_session):
    handles = start_node_pools(CONFIG)
    try:
        assert len(handles) >= 1
        outcomes = ray.get([rollout.remote(index) for index in range(3)], timeout=120)
        for index, outcome in enumerate(outcomes):
            assert outcome["stdout"] == f"rollout {index}\n1000\n"
            assert outcome["missing"] == "FileNotFoundError"
            assert outcome["fifo"] == "SandboxFileRefusedError"
            assert outcome["after_release"] == "SandboxError"  # the handle's lease ended
        (handle,) = handles.values()
        stats = ray.get(handle.stats.remote())
        assert stats["num_in_use"] == 0 and stats["num_cold_starts"] == 0
        assert sandbox_slot_request(CONFIG) == {"sandbox_slots": 1.0}
    finally:
        shutdown_node_pools(CONFIG)
