"""Escape battery, host-side operations: files and jobs an agent prepares so that the host's next read,
download or exec hangs, allocates without bound, or fails untyped; connection floods through the proxy path.

Each attack runs against the real sandbox ("hardened") and against a weakened one: the same supervisor with
its file type checks and size caps removed and no bound on how long exec drains a detached job's output (a
patched copy bound in via ``BwrapSandbox.supervisor_source``), and caps raised out of reach in the config.
Each attack must succeed against the weakened variant."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from components.errors import SandboxError
from components.protocols import SandboxLimits, SandboxSpec
from sandboxes.bwrap import SUPERVISOR_SOURCE, BwrapSandbox, BwrapSandboxConfig
from sandboxes.errors import SandboxFileRefusedError
from tests.sandboxes.sandbox_test_support import HOST_PYTHON

LIMITS = SandboxLimits(command_timeout_s=20, memory_mb=256, max_processes=32, workspace_mb=32)
HARDENED = BwrapSandboxConfig(
    op_timeout_s=5.0,
    exec_grace_s=2.0,
    max_read_bytes=1 << 20,
    max_download_bytes=1 << 20,
    max_download_entries=100,
    max_output_bytes=1 << 20,
    max_proxy_connections=8,
)
WEAKENED = BwrapSandboxConfig(
    op_timeout_s=5.0,
    exec_grace_s=2.0,
    max_read_bytes=1 << 40,
    max_download_bytes=1 << 40,
    max_download_entries=1 << 40,
    max_output_bytes=1 << 40,
    max_proxy_connections=1 << 20,
)
# What the weakened supervisor loses: the type check (and the non-blocking open that makes it safe for FIFOs),
# the size checks, the bound on draining a finished command's output.
WEAKENINGS = {
    "flags = os.O_RDONLY | os.O_NONBLOCK | ": "flags = os.O_RDONLY | ",
    "    if not stat.S_ISREG(info.st_mode):\n": "    if False:\n",
    "    if info.st_size > max_bytes:\n": "    if False:\n",
    "            if total > max_bytes:\n": "            if False:\n",
    "OUTPUT_READ_GRACE_S = 0.25\n": "OUTPUT_READ_GRACE_S = 1e6\n",
}


@pytest.fixture(scope="module")
def weak_supervisor(tmp_path_factory) -> Path:
    source = SUPERVISOR_SOURCE.read_text()
    for old, new in WEAKENINGS.items():
        assert source.count(old) == 1, f"the supervisor changed; update the weakening of {old!r}"
        source = source.replace(old, new)
    path = tmp_path_factory.mktemp("weak") / "supervisor.py"
    path.write_text(source)
    path.chmod(0o644)
    path.parent.chmod(0o755)
    return path


@pytest.fixture(params=["hardened", "weakened"])
async def sandbox(request, weak_supervisor):
    if request.param == "hardened":
        made = await BwrapSandbox.create(SandboxSpec(limits=LIMITS), HARDENED)
    else:

        class WeakSandbox(BwrapSandbox):
            supervisor_source = weak_supervisor

        made = await WeakSandbox.create(SandboxSpec(limits=LIMITS), WEAKENED)
    made.weakened = request.param == "weakened"
    yield made
    await made.close()


async def attempt(call) -> tuple[str, float]:
    """How a host-side call ended ("ok" / "refused" / "sandbox_error"), and how long it took."""
    start = time.monotonic()
    try:
        await call
        outcome = "ok"
    except SandboxFileRefusedError:
        outcome = "refused"
    except SandboxError:
        outcome = "sandbox_error"
    return outcome, time.monotonic() - start


async def test_reading_a_fifo(sandbox):
    await sandbox.exec("mkfifo pipe")
    outcome, took = await attempt(sandbox.read_file("pipe"))
    if sandbox.weakened:
        assert outcome == "sandbox_error" and not sandbox.alive  # hung until the host killed the sandbox
    else:
        assert outcome == "refused" and took < 3 and sandbox.alive


@pytest.mark.parametrize(
    "prepare",
    [
        pytest.param("ln -s /dev/zero endless", id="device-behind-a-symlink"),
        pytest.param("truncate -s 100G endless", id="sparse-100G"),
    ],
)
async def test_reading_an_endless_or_huge_file(sandbox, prepare):
    await sandbox.exec(prepare)
    outcome, took = await attempt(sandbox.read_file("endless"))
    if sandbox.weakened:
        assert outcome == "sandbox_error" and not sandbox.alive  # out of memory or out of time
    else:
        assert outcome == "refused" and took < 3 and sandbox.alive


async def test_reading_a_file_over_the_cap(sandbox):
    await sandbox.exec("head -c 5M /dev/urandom > big.bin")
    outcome, _ = await attempt(sandbox.read_file("big.bin"))
    assert outcome == ("ok" if sandbox.weakened else "refused")


async def test_downloading_a_tree_with_a_sparse_file(sandbox, tmp_path):
    await sandbox.exec("mkdir -p out && echo hi > out/a.txt && truncate -s 50G out/sparse && mkfifo out/pipe")
    outcome, took = await attempt(sandbox.download("out", tmp_path / "out"))
    if sandbox.weakened:
        assert outcome == "sandbox_error"
    else:
        assert outcome == "refused" and took < 3 and sandbox.alive
        assert not (tmp_path / "out").exists()
        await sandbox.exec("rm out/sparse")
        await sandbox.download("out", tmp_path / "out")  # the FIFO is left out, never read
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.txt"]


async def test_downloading_a_tree_with_too_many_entries(sandbox, tmp_path):
    await sandbox.exec("mkdir -p many && cd many && seq 1 500 | xargs touch")
    outcome, _ = await attempt(sandbox.download("many", tmp_path / "many"))
    assert outcome == ("ok" if sandbox.weakened else "refused")


@pytest.mark.parametrize(
    "detach",
    [
        pytest.param("setsid sleep 1000 &", id="setsid"),
        pytest.param("setsid nohup sleep 1000 &", id="setsid-nohup"),
        pytest.param("setsid sh -c '(sleep 1000 &)' &", id="double-fork"),
    ],
)
async def test_detached_job_holding_the_output_pipes(sandbox, detach):
    # (A job still in the command's process group when the command exits dies with it: give it 1 s to detach.)
    command = f"{detach} sleep 1; echo started"
    start = time.monotonic()
    if sandbox.weakened:  # exec waits for the detached job's pipes until the host gives up on the sandbox
        with pytest.raises(SandboxError, match="did not answer"):
            await sandbox.exec(command, timeout_s=6)
    else:
        result = await sandbox.exec(command, timeout_s=6)
        took = time.monotonic() - start
        assert not result.timed_out and result.stdout == "started\n" and took < 4, (result, took)
        assert "sleep 1000" in (await sandbox.exec("ps -eo args")).stdout  # detached, not killed


async def test_exec_output_is_capped(sandbox):
    result = await sandbox.exec(
        "head -c 20M /dev/zero | tr '\\0' x; echo; head -c 20M /dev/zero | tr '\\0' y >&2"
    )
    if sandbox.weakened:
        assert len(result.stdout) > 10 << 20
    else:
        assert len(result.stdout) == 1 << 20 and len(result.stderr) == 1 << 20


class HoldingServer:
    """A loopback server that keeps every connection open and counts how many are open at once."""

    def __init__(self) -> None:
        self.open_now = 0
        self.most_open = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await reader.read()
        finally:
            self.open_now -= 1
            writer.close()


CONNECT = {
    "loopback-port": "s = socket.create_connection(('127.0.0.1', {port}))",
    "bridge-socket-directly": "s = socket.socket(socket.AF_UNIX); s.connect('/run/rein/proxy.sock')",
}


@pytest.mark.parametrize("path", sorted(CONNECT))
async def test_connection_flood_through_the_proxy_path(path):
    """40 connections held open, through the supervisor's loopback port or straight to the bridge's socket."""
    holder = HoldingServer()
    server = await asyncio.start_server(holder.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connect = CONNECT[path].format(port=port)
    flood = (
        "import socket, time\nheld = []\nfor _ in range(40):\n    try:\n"
        f"        {connect}\n        held.append(s)\n    except OSError:\n        pass\ntime.sleep(2)\n"
    )
    try:
        for config, cap in ((HARDENED, HARDENED.max_proxy_connections), (WEAKENED, None)):
            holder.most_open = 0
            spec = SandboxSpec(limits=LIMITS, proxy_url=f"http://127.0.0.1:{port}")
            async with await BwrapSandbox.create(spec, config) as sandbox:
                await sandbox.exec([HOST_PYTHON, "-c", flood])
            if cap is None:
                assert holder.most_open > 2 * HARDENED.max_proxy_connections  # the flood gets through
            else:
                assert 1 <= holder.most_open <= cap
            deadline = time.monotonic() + 5
            while holder.open_now:  # and closing the sandbox closed them all
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
    finally:
        server.close()
