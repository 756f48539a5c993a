"""``PendingWaits.ready_within``: a bounded wait on Ray tasks that fetches nothing, recorded while it lasts."""

from __future__ import annotations

import threading
import time

import pytest

from components.remote_waits import PendingWaits, RemoteStalledError


def test_ready_within_returns_once_ready_and_fails_by_name_past_its_deadline(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    def sleep_then_answer(seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    waits = PendingWaits()
    quick = [sleep_then_answer.remote(0.0) for _ in range(3)]
    waits.ready_within(quick, deadline_s=30, component="batching tasks", request="packing of 3 blocks")
    assert ray_session.get(quick) == ["done"] * 3
    assert waits.older_than(0) == []  # the wait is no longer recorded

    seen_pending: list[str] = []

    def watch() -> None:
        time.sleep(0.5)
        seen_pending.extend(f"{w.component}: {w.request}" for w in waits.older_than(0.2))

    watcher = threading.Thread(target=watch)
    watcher.start()
    slow = [sleep_then_answer.remote(0.0), sleep_then_answer.remote(60.0)]
    started = time.monotonic()
    with pytest.raises(RemoteStalledError, match=r"batching tasks did not answer packing of 2 blocks within 1 s"):
        waits.ready_within(slow, deadline_s=1, component="batching tasks", request="packing of 2 blocks")
    assert time.monotonic() - started < 10
    watcher.join()
    assert seen_pending == ["batching tasks: packing of 2 blocks"]
    ray_session.cancel(slow[1], force=True)
