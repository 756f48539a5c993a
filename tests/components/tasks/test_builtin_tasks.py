"""Every built-in task, through the real grader in bubblewrap sandboxes: the reference fix earns 1, the buggy
snapshot earns 0 and fails every FAIL_TO_PASS test (what `generate --check` verifies)."""

from __future__ import annotations

import time

import pytest

from components.tasks.generate import check_tasks


@pytest.mark.slow
async def test_every_builtin_task_reference_passes_and_bug_fails(builtin_tasks, sandbox_factory):
    started = time.monotonic()
    checks = await check_tasks(list(builtin_tasks.values()), sandbox_factory, concurrency=3)
    failures = [f"{check.task_id}: {check.problems}" for check in checks if not check.ok]
    assert not failures, "\n".join(failures)
    assert len(checks) >= 30
    assert all(check.reference_reward == 1.0 and check.buggy_reward == 0.0 for check in checks)
    print(f"checked {len(checks)} tasks in {time.monotonic() - started:.0f}s")
