"""The ``Sandbox`` contract (``components.protocols.Sandbox``), checked on any sandbox brick — an async factory
``spec -> Sandbox`` such as ``BwrapSandbox.create``:

exit code, stdout and stderr come back apart; files round-trip (a missing one is ``FileNotFoundError``); the
spec's workspace source is copied in; a command past its timeout is killed and reported ``timed_out`` and the
sandbox stays usable; ``close`` is idempotent and every later call raises ``SandboxError`` naming the sandbox.
(Isolation itself is proven per backend by the escape batteries in ``tests/sandboxes``.)
"""

from __future__ import annotations

import time

import pytest

from components.errors import SandboxError
from components.protocols import Sandbox, SandboxLimits, SandboxSpec
from tests.contracts.conftest import brick_params
from tests.required_tools import require_tool


def _bwrap():
    import shutil

    require_tool(shutil.which("bwrap"), "run `make setup` (apt-get install bubblewrap)")
    from sandboxes.bwrap import BwrapSandbox

    return BwrapSandbox.create


def pytest_generate_tests(metafunc):
    if "make_factory" in metafunc.fixturenames:
        metafunc.parametrize("make_factory", brick_params(metafunc.config, {"bwrap": _bwrap}))


@pytest.fixture
async def make_sandbox(make_factory):
    factory = make_factory()
    opened: list = []

    async def make(spec: SandboxSpec | None = None):
        sandbox = await factory(spec or SandboxSpec())
        assert isinstance(sandbox, Sandbox), f"{sandbox!r} does not implement components.protocols.Sandbox"
        opened.append(sandbox)
        return sandbox

    yield make
    for sandbox in opened:
        await sandbox.close()


async def test_exec_reports_exit_code_stdout_and_stderr(make_sandbox):
    sandbox = await make_sandbox()
    ok = await sandbox.exec("echo hello; echo oops >&2")
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.timed_out) == (0, "hello\n", "oops\n", False)
    failed = await sandbox.exec(["bash", "-c", "echo partial; exit 3"])
    assert failed.exit_code == 3 and failed.stdout == "partial\n" and not failed.timed_out


async def test_files_round_trip_and_missing_file(make_sandbox):
    sandbox = await make_sandbox()
    await sandbox.write_file("notes/a.txt", "text é")
    await sandbox.write_file("bin.dat", bytes(range(256)))
    assert await sandbox.read_file("notes/a.txt") == "text é".encode()
    assert await sandbox.read_file("bin.dat") == bytes(range(256))
    assert (await sandbox.exec("cat notes/a.txt")).stdout == "text é"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("does/not/exist")


async def test_workspace_source_is_copied_in(make_sandbox, tmp_path):
    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "mod.py").write_text("X = 1\n")
    sandbox = await make_sandbox(SandboxSpec(workspace_source=tmp_path / "repo"))
    assert (await sandbox.exec("cat pkg/mod.py")).stdout == "X = 1\n"


async def test_timeout_kills_and_reports(make_sandbox):
    sandbox = await make_sandbox(SandboxSpec(limits=SandboxLimits(command_timeout_s=1.0)))
    started = time.monotonic()
    result = await sandbox.exec("sleep 30; echo never")
    assert result.timed_out and "never" not in result.stdout
    assert time.monotonic() - started < 8
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_close_is_idempotent_and_later_calls_raise(make_sandbox):
    sandbox = await make_sandbox()
    await sandbox.close()
    await sandbox.close()
    with pytest.raises(SandboxError) as info:
        await sandbox.exec("true")
    assert info.value.sandbox_id == sandbox.sandbox_id
    with pytest.raises(SandboxError):
        await sandbox.read_file("x")
