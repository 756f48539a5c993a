"""The warm pool, fault handling, and 64 sandboxes used at once without errors or leaks."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from pathlib import Path

import pytest

from components.errors import SandboxError
from components.protocols import SandboxLimits, SandboxSpec
from components.registry import SANDBOXES
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxConfig
from sandboxes.e2b import E2BSandboxProvider
from sandboxes.errors import SandboxLeaseEndedError
from sandboxes.pool import SandboxPool, SandboxPoolConfig
from tests.sandboxes.sandbox_test_support import (
    SMALL_LIMITS,
    kill_from_outside,
    process_uids,
    processes_of_uid,
)


def child_bwraps() -> list[int]:
    """bwrap processes this test process started that are still alive."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm == "bwrap" and int(rest[1]) == os.getpid():
            found.append(int(name))
    return found


async def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_warm_acquire_is_fast_and_release_recycles():
    async with SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=32)) as pool:
        assert pool.num_warm == 2
        timings = []
        for _ in range(10):
            await wait_until(lambda: pool.num_warm >= 2)
            start = time.perf_counter()
            sandbox = await pool.acquire(SandboxSpec(limits=SandboxLimits(workspace_mb=32)))
            timings.append(time.perf_counter() - start)
            assert (await sandbox.exec("echo ok")).stdout == "ok\n"
            await pool.release(sandbox)
        assert statistics.median(timings) < 0.005, timings
        assert pool.num_cold_starts == 0


async def test_an_empty_pool_hands_out_the_refills_under_way_instead_of_cold_starts():
    """Under continuous use (and at a run's first step, before the pool has started) the warm sandboxes run out
    while refills are starting: an acquire then takes the next refill instead of starting a cold sandbox of its
    own, which would be ready later and slow every refill down (the old pool cold-started each of these)."""
    spec = SandboxSpec(limits=SandboxLimits(workspace_mb=32))
    pool = SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=32))
    try:
        # A first step: the pool starts on the first acquire, nothing is warm yet.
        first_step = await asyncio.gather(*(pool.acquire(spec) for _ in range(3)))
        assert pool.num_cold_starts == 0 and pool.num_waited == 3
        await wait_until(lambda: pool.num_warm == 2)
        burst = await asyncio.gather(*(pool.acquire(spec) for _ in range(4)))  # 2 warm, 2 refills under way
        assert pool.num_cold_starts == 0 and pool.num_waited == 5
        for sandbox in [*first_step, *burst]:
            assert (await sandbox.exec("echo ok")).stdout == "ok\n"
            await pool.release(sandbox)
        assert len({sandbox.sandbox_id for sandbox in [*first_step, *burst]}) == 7
    finally:
        await pool.close()


async def test_the_stack_starts_the_pool_ahead_of_the_first_acquire():
    """``RunStack`` starts a pool that can start ahead (while the trainer warms up) when the rollouts run in the
    driver: the first step's acquires then find warm sandboxes. Not with the producer in an actor, which gets
    the provider shipped and starts it on its own node."""
    from components.protocols import SandboxProvider, StartsAhead
    from components.run.stack import start_sandboxes_ahead

    spec = SandboxSpec(limits=SandboxLimits(workspace_mb=32))
    shipped = SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=32))
    await start_sandboxes_ahead(shipped, "actor")
    assert shipped.num_started == 0 and shipped.num_warm == 0
    pool = SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=32))
    assert isinstance(pool, SandboxProvider) and isinstance(pool, StartsAhead)
    try:
        started = time.monotonic()
        await start_sandboxes_ahead(pool, "driver")
        assert time.monotonic() - started < 1.0  # returns at once: the stack goes on starting meanwhile
        await wait_until(lambda: pool.num_warm == 2, timeout_s=60)
        first_step = await asyncio.gather(*(pool.acquire(spec) for _ in range(2)))
        assert pool.num_cold_starts == 0 and pool.num_waited == 0
        for sandbox in first_step:
            await pool.release(sandbox)
    finally:
        await pool.close()
        await shipped.close()


async def test_sandbox_starts_run_at_most_max_concurrent_starts_at_a_time(monkeypatch):
    """Concurrent starts share the cores and all finish late; the pool runs them a few at a time, so refills are
    ready one after another."""
    running, most_running = 0, 0
    real_start = BwrapSandbox.start_generic

    async def counted_start(config, **kwargs):
        nonlocal running, most_running
        running += 1
        most_running = max(most_running, running)
        try:
            return await real_start(config, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(BwrapSandbox, "start_generic", counted_start)
    async with SandboxPool(SandboxPoolConfig(num_warm=6, workspace_mb=32, max_concurrent_starts=2)) as pool:
        assert pool.num_warm == 6
    assert most_running == 2


async def test_a_waiting_acquire_raises_when_the_pool_closes():
    pool = SandboxPool(SandboxPoolConfig(num_warm=1, workspace_mb=32))
    spec = SandboxSpec(limits=SandboxLimits(workspace_mb=32))
    waiting = [asyncio.create_task(pool.acquire(spec)) for _ in range(3)]
    await asyncio.sleep(0)
    await pool.close()
    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert any(isinstance(result, SandboxError) and "closed" in str(result) for result in results), results


async def test_release_destroys_the_sandbox_and_ends_the_lease():
    async with SandboxPool(SandboxPoolConfig(num_warm=1, workspace_mb=32)) as pool:
        spec = SandboxSpec(limits=SandboxLimits(workspace_mb=32))
        first = await pool.acquire(spec)
        await first.exec(
            "echo dirty > left.txt; echo t > /tmp/t; setsid sleep 500 > /dev/null 2>&1 & sleep 0.3"
        )
        assert "sleep 500" in (await first.exec("ps -eo args")).stdout
        cgroup_dirs = list(first.cgroup.dirs.values())
        await pool.release(first)
        with pytest.raises(SandboxLeaseEndedError):  # at once, before the background close
            await first.exec("true")
        await wait_until(lambda: first.cgroup.removed and pool.num_warm == 1)
        assert not processes_of_uid(first.host_uid)
        assert not any(os.path.exists(path) for path in cgroup_dirs)
        second = await pool.acquire(spec)
        assert second is not first  # never reused
        check = await second.exec("ls -A /workspace /tmp; ps -eo args")
        assert "left.txt" not in check.stdout and "sleep 500" not in check.stdout
        await pool.release(second)


async def test_pool_prepares_workspace_and_proxy_lazily(tmp_path, tcp_banner_server):
    port = await tcp_banner_server(b"HELLO-FROM-PROXY")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "task.txt").write_text("the task\n")
    async with SandboxPool(SandboxPoolConfig(num_warm=1, workspace_mb=32)) as pool:
        spec = SandboxSpec(
            limits=SandboxLimits(workspace_mb=32),
            workspace_source=tmp_path / "repo",
            proxy_url=f"http://127.0.0.1:{port}",
        )
        sandbox = await pool.acquire(spec)
        assert pool.num_cold_starts == 0
        result = await sandbox.exec(
            'cat task.txt; python3 -c "import socket; '
            f"print(socket.create_connection(('127.0.0.1', {port})).recv(64).decode())\" 2>&1 || "
            f'{os.path.realpath(os.sys.executable)} -c "import socket; '
            f"print(socket.create_connection(('127.0.0.1', {port})).recv(64).decode())\""
        )
        assert "the task" in result.stdout and "HELLO-FROM-PROXY" in result.stdout
        await pool.release(sandbox)
        await wait_until(lambda: pool.num_warm == 1)
        again = await pool.acquire(SandboxSpec(limits=SandboxLimits(workspace_mb=32)))
        probe = await again.exec(
            f"{os.path.realpath(os.sys.executable)} -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\""
        )
        assert probe.exit_code != 0  # the proxy path closed with the spec that opened it
        await pool.release(again)


async def test_incompatible_spec_gets_a_cold_sandbox_with_its_mounts():
    venv = os.path.dirname(os.path.dirname(os.sys.executable))
    async with SandboxPool(SandboxPoolConfig(num_warm=1, workspace_mb=32)) as pool:
        sandbox = await pool.acquire(
            SandboxSpec(read_only_paths=(venv,), limits=SandboxLimits(workspace_mb=32))
        )
        assert pool.num_cold_starts == 1
        result = await sandbox.exec(f"{venv}/bin/python -c 'import tenacity; print(\"venv-ok\")'")
        assert result.stdout == "venv-ok\n"
        await pool.release(sandbox)
        with pytest.raises(ValueError, match="not acquired"):
            await pool.release(sandbox)


async def test_health_check_replaces_dead_sandboxes():
    async with SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=32)) as pool:
        victim = pool._warm[0]
        kill_from_outside(victim)
        await wait_until(lambda: not victim.alive)
        assert await pool.check_health() == 1
        await wait_until(lambda: pool.num_warm == 2 and victim not in pool._warm)
        assert victim not in pool._warm
        sandbox = await pool.acquire(SandboxSpec(limits=SandboxLimits(workspace_mb=32)))
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"


async def test_pool_close_closes_everything():
    pool = SandboxPool(SandboxPoolConfig(num_warm=2, workspace_mb=32))
    await pool.start()
    in_use = await pool.acquire(SandboxSpec(limits=SandboxLimits(workspace_mb=32)))
    uids = [sandbox.host_uid for sandbox in pool._warm] + [in_use.host_uid]
    await pool.close()
    await pool.close()
    assert not any(processes_of_uid(uid) for uid in uids)
    with pytest.raises(SandboxError):
        await in_use.exec("true")
    with pytest.raises(SandboxError):
        await pool.acquire()


def test_sandbox_kinds_build_their_providers():
    assert isinstance(SANDBOXES.get("bwrap")().build(), SandboxPool)
    assert isinstance(SANDBOXES.get("e2b")().build(), E2BSandboxProvider)
    pool = SANDBOXES.get("bwrap")(read_only_paths=("/opt",)).build(read_only_paths=("/usr", "/opt"))
    assert pool.config.read_only_paths == ("/opt", "/usr")
    with pytest.raises(ValueError, match=r"sandbox: must be one of \['bwrap', 'e2b'"):
        SANDBOXES.get("docker")
    with pytest.raises(ValueError, match="read_only_paths"):
        asyncio.run(BwrapSandbox.create(SandboxSpec(read_only_paths=("/no/such/dir",))))
    with pytest.raises(ValueError, match="proxy_url"):
        asyncio.run(BwrapSandbox.create(SandboxSpec(proxy_url="http://example.com:8000")))


# --------------------------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------------------------


async def test_sandbox_killed_mid_command_never_hangs_the_caller():
    sandbox = await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS))
    running = asyncio.create_task(sandbox.exec("sleep 60"))
    await asyncio.sleep(0.3)
    start = time.monotonic()
    kill_from_outside(sandbox)  # e.g. the OOM killer, or an operator
    with pytest.raises(SandboxError) as info:
        await running
    assert time.monotonic() - start < 3 and info.value.sandbox_id == sandbox.sandbox_id
    for call in (sandbox.exec("true"), sandbox.read_file("x"), sandbox.write_file("x", "y")):
        with pytest.raises(SandboxError):
            await asyncio.wait_for(call, 2)
    await sandbox.close()


async def test_agent_cannot_kill_its_supervisor():
    async with await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS)) as sandbox:
        # The supervisor is the sandbox's PID 1: signals from inside are ignored by the kernel.
        result = await asyncio.wait_for(sandbox.exec("kill -9 1; kill -INT 1; kill -TERM 1; echo sent"), 5)
        assert result.stdout == "sent\n"
        assert (await sandbox.exec("echo still-alive")).stdout == "still-alive\n"


async def test_detached_processes_are_reaped_not_left_as_zombies():
    async with await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS)) as sandbox:
        # Detached processes outlive the command, are re-parented to the supervisor, and exit later.
        await sandbox.exec("for i in 1 2 3 4 5; do setsid sleep 0.3 > /dev/null 2>&1 & done; sleep 0.1")
        await asyncio.sleep(0.9)  # the reaper runs every 0.2 s
        states = await sandbox.exec("ps -eo stat --no-headers")
        assert "Z" not in states.stdout, states.stdout


async def test_hung_supervisor_times_out_into_sandbox_error():
    config = BwrapSandboxConfig(op_timeout_s=1.0)
    async with await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS), config) as sandbox:
        supervisor = next(
            pid
            for pid in processes_of_uid(sandbox.host_uid)
            if b"supervisor" in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
        os.kill(supervisor, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(SandboxError, match="did not answer"):
            await sandbox.read_file("anything")
        assert time.monotonic() - start < 3
        assert not sandbox.alive


async def test_start_failures_are_retried_then_typed():
    config = BwrapSandboxConfig(bwrap_path="/nonexistent/bwrap", num_create_attempts=3)
    start = time.monotonic()
    with pytest.raises(SandboxError, match="could not start bwrap"):
        await BwrapSandbox.create(SandboxSpec(), config)
    assert time.monotonic() - start < 5


# --------------------------------------------------------------------------------------------------------------
# Scale
# --------------------------------------------------------------------------------------------------------------


async def test_64_sandboxes_used_concurrently_without_errors_or_leaks(tmp_path):
    num_sandboxes = 64
    limits = SandboxLimits(command_timeout_s=60, workspace_mb=16, memory_mb=256, max_processes=32)
    records: list[tuple[int, str]] = []

    async def rollout(index: int, sandbox) -> str:
        await sandbox.write_file("input.txt", f"task {index}\n")
        first = await sandbox.exec("cat input.txt | tr a-z A-Z > out.txt && wc -c < out.txt")
        assert first.exit_code == 0, first
        slow = await sandbox.exec("sleep 5", timeout_s=0.5)
        assert slow.timed_out
        for _ in range(3):
            step = await sandbox.exec(f"echo step-{index} >> log.txt; ls | wc -l")
            assert step.exit_code == 0, step
        return (await sandbox.read_file("out.txt")).decode()

    async def with_fresh_sandbox(index: int) -> str:
        async with await BwrapSandbox.create(SandboxSpec(limits=limits)) as sandbox:
            records.append((sandbox.host_uid, sandbox._host_dir))
            return await rollout(index, sandbox)

    start = time.monotonic()
    results = await asyncio.gather(*(with_fresh_sandbox(i) for i in range(num_sandboxes)))
    assert results == [f"TASK {i}\n" for i in range(num_sandboxes)]
    async with SandboxPool(SandboxPoolConfig(num_warm=16, workspace_mb=16)) as pool:

        async def pooled(index: int) -> str:
            sandbox = await pool.acquire(SandboxSpec(limits=limits))
            records.append((sandbox.host_uid, sandbox._host_dir))
            try:
                return await rollout(index, sandbox)
            finally:
                await pool.release(sandbox)

        pooled_results = await asyncio.gather(*(pooled(i) for i in range(num_sandboxes)))
        assert pooled_results == results
        # Refills are bounded: every acquire triggers at most one replacement start.
        assert pool.num_started + pool.num_cold_starts <= 16 + 2 * num_sandboxes
    assert time.monotonic() - start < 90
    await asyncio.sleep(0.2)
    assert len(records) == 2 * num_sandboxes
    live_uids = set(process_uids())
    # Zombies count too: the supervisor is bwrap's direct child (--as-pid-1), so one bwrap failed to reap would
    # stay listed under the sandbox's uid.
    assert not [uid for uid, _ in records if uid in live_uids], "sandbox processes left behind"
    assert not [path for _, path in records if os.path.exists(path)], "host temp dirs left behind"
    assert child_bwraps() == []


async def test_host_dirs_of_dead_owners_are_swept(tmp_path):
    finished = await asyncio.create_subprocess_exec("true")
    await finished.wait()
    stale = tmp_path / f"rein-bwrap-{finished.pid}-0-abcdef-xyz"
    live = tmp_path / f"rein-bwrap-{os.getpid()}-99-abcdef-xyz"
    stale.mkdir()
    live.mkdir()
    config = BwrapSandboxConfig(temp_root=str(tmp_path))
    async with await BwrapSandbox.create(SandboxSpec(limits=SMALL_LIMITS), config) as sandbox:
        assert Path(sandbox._host_dir).parent == tmp_path
    assert not stale.exists() and live.exists()


async def test_http_client_in_the_venv_reaches_the_proxy_with_large_bodies():
    import http.server
    import sys
    import threading

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            reply = f"got {len(body)} bytes at {self.path}".encode() * 1000
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    spec = SandboxSpec(read_only_paths=(sys.prefix,), proxy_url=base_url, limits=SMALL_LIMITS)
    try:
        async with await BwrapSandbox.create(spec) as sandbox:
            code = (
                "import httpx, os\n"
                "r = httpx.post(os.environ['BASE'] + '/s/abc/v1/messages', content=b'x' * 3_000_000, timeout=30)\n"
                "print(r.status_code, len(r.content), r.text[:40])\n"
            )
            result = await sandbox.exec([f"{sys.prefix}/bin/python", "-c", code], env={"BASE": base_url})
            assert result.stdout.split()[:2] == [
                "200",
                str(len("got 3000000 bytes at /s/abc/v1/messages") * 1000),
            ]
            assert "got 3000000 bytes at /s/abc/v1/messages" in result.stdout, result
    finally:
        server.shutdown()


async def test_release_during_the_background_workspace_copy(tmp_path):
    """Released before its workspace copy finished: calls on the handle fail typed, never with CancelledError."""
    (tmp_path / "repo").mkdir()
    for index in range(200):
        (tmp_path / "repo" / f"f{index}.txt").write_text("x" * 10_000)
    async with SandboxPool(SandboxPoolConfig(num_warm=1, workspace_mb=32)) as pool:
        spec = SandboxSpec(limits=SandboxLimits(workspace_mb=32), workspace_source=tmp_path / "repo")
        sandbox = await pool.acquire(spec)
        await pool.release(sandbox)
        with pytest.raises(SandboxLeaseEndedError):
            await sandbox.exec("ls")
        await asyncio.sleep(0.5)
        with pytest.raises(SandboxLeaseEndedError):
            await sandbox.read_file("f1.txt")
