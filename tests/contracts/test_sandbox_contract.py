"""The ``Sandbox`` contract (``components.protocols.Sandbox``), checked on any sandbox brick — an async factory
``spec -> Sandbox`` such as ``BwrapSandbox.create``:

exit code, stdout and stderr come back apart; an argv is not re-split or expanded; ``cwd`` and the spec's and
the call's ``env`` apply; files round-trip (a missing one is ``FileNotFoundError``); ``upload_dir`` and
``download`` copy trees and single files; the spec's workspace source (a directory or a ``.tar.gz``) is copied
in; a command past its timeout is killed and reported ``timed_out`` and the sandbox stays usable; ``close`` is
idempotent and every later call raises ``SandboxError`` naming the sandbox; as every built-in sandbox, it is an
async context manager that closes it. (Isolation itself is proven per backend by the escape batteries in
``tests/sandboxes``.)

Built-in: bubblewrap (cold, a warm pool, per-node pools over Ray), E2B against the local fake of its SDK, and
the image sandbox (bubblewrap on the test image's root filesystem).
"""

from __future__ import annotations

import contextlib
import shutil
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from components.errors import SandboxError
from components.protocols import Sandbox, SandboxLimits, SandboxSpec
from tests.contracts.conftest import BuiltIn, brick_params, opened_brick
from tests.required_tools import require_tool

SandboxMaker = Callable[[SandboxSpec], Awaitable[Sandbox]]
IMAGE_CACHE = Path.home() / ".cache" / "rein" / "images"  # shared with tests/sandboxes (one unpack)


def _require_bwrap() -> None:
    require_tool(shutil.which("bwrap"), "run `make setup` (apt-get install bubblewrap)")


@contextlib.asynccontextmanager
async def _bwrap(request) -> AsyncIterator[SandboxMaker]:
    _require_bwrap()
    from sandboxes.bwrap import BwrapSandbox

    yield BwrapSandbox.create


@contextlib.asynccontextmanager
async def _bwrap_pool(request) -> AsyncIterator[SandboxMaker]:
    _require_bwrap()
    from sandboxes.pool import SandboxPool, SandboxPoolConfig

    async with SandboxPool(SandboxPoolConfig(num_warm=2)) as pool:
        yield pool.acquire


@contextlib.asynccontextmanager
async def _ray_pool(request) -> AsyncIterator[SandboxMaker]:
    _require_bwrap()
    from sandboxes.ray_pool import RaySandboxPool, shutdown_node_pools, start_node_pools
    from tests.sandboxes.sandbox_test_support import RAY_POOL_CONFIG as config

    request.getfixturevalue("ray_session")
    handles = start_node_pools(config)  # the actors live as long as these handles
    try:
        yield RaySandboxPool(config).acquire
    finally:
        shutdown_node_pools(config)
        del handles


@contextlib.asynccontextmanager
async def _e2b_on_fake(request) -> AsyncIterator[SandboxMaker]:
    from sandboxes.e2b import E2BSandbox
    from tests.sandboxes.sandbox_test_support import FAKE_E2B_CONFIG

    yield lambda spec: E2BSandbox.create(spec, FAKE_E2B_CONFIG)


@contextlib.asynccontextmanager
async def _image(request) -> AsyncIterator[SandboxMaker]:
    _require_bwrap()
    from sandboxes.image import ImageSandboxConfig, create_image_sandbox
    from tests.components.tasks.swebench_fixtures import ENV_IMAGE, IMAGE_LAYOUT, require_fixtures

    require_fixtures(IMAGE_LAYOUT)
    config = ImageSandboxConfig(cache_dir=IMAGE_CACHE)
    yield lambda spec: create_image_sandbox(replace(spec, root_image=ENV_IMAGE), config)


BUILT_INS = {
    "bwrap": lambda: BuiltIn(_bwrap),
    "bwrap-pool": lambda: BuiltIn(_bwrap_pool),
    "ray-pool": lambda: BuiltIn(_ray_pool),
    "e2b-fake": lambda: BuiltIn(_e2b_on_fake),
    "image": lambda: BuiltIn(_image),
}


def pytest_generate_tests(metafunc):
    if "make_factory" in metafunc.fixturenames:
        metafunc.parametrize("make_factory", brick_params(metafunc.config, BUILT_INS), scope="module")


@pytest.fixture(scope="module")
async def sandbox_factory(make_factory, request) -> AsyncIterator[SandboxMaker]:
    """One factory per brick, opened once per module (pools warm up once)."""
    async with opened_brick(make_factory, request) as factory:
        yield factory


@pytest.fixture
async def make_sandbox(sandbox_factory):
    opened: list = []

    async def make(spec: SandboxSpec | None = None):
        sandbox = await sandbox_factory(spec or SandboxSpec())
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


async def test_argv_cwd_and_env(make_sandbox):
    sandbox = await make_sandbox(SandboxSpec(env={"FROM_SPEC": "spec-value"}))
    argv = await sandbox.exec(["printf", "%s|", "two words", "$HOME"])
    assert argv.stdout == "two words|$HOME|"  # an argv is not re-split or expanded
    await sandbox.exec("mkdir -p sub/dir")
    where = await sandbox.exec("pwd", cwd="sub/dir")
    assert where.stdout.strip().endswith("/sub/dir")
    env = await sandbox.exec("echo $FROM_SPEC $FROM_CALL", env={"FROM_CALL": "call-value"})
    assert env.stdout == "spec-value call-value\n"


async def test_files_round_trip_and_missing_file(make_sandbox):
    sandbox = await make_sandbox()
    await sandbox.write_file("notes/a.txt", "text é")
    await sandbox.write_file("bin.dat", bytes(range(256)))
    assert await sandbox.read_file("notes/a.txt") == "text é".encode()
    assert await sandbox.read_file("bin.dat") == bytes(range(256))
    assert (await sandbox.exec("cat notes/a.txt")).stdout == "text é"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("does/not/exist")


async def test_upload_dir_and_download(make_sandbox, tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    (source / "top.txt").write_text("top\n")
    sandbox = await make_sandbox()
    await sandbox.upload_dir(source, "uploaded")
    assert (await sandbox.exec("cat uploaded/top.txt uploaded/pkg/mod.py")).stdout == "top\nX = 1\n"
    await sandbox.exec("mkdir -p out/deep && echo result > out/deep/r.txt && echo single > one.txt")
    await sandbox.download("out", tmp_path / "got")
    assert (tmp_path / "got" / "deep" / "r.txt").read_text() == "result\n"
    await sandbox.download("one.txt", tmp_path / "one-copy.txt")
    assert (tmp_path / "one-copy.txt").read_text() == "single\n"


@pytest.mark.parametrize("kind", ["dir", "tar.gz"])
async def test_workspace_source_is_copied_in(make_sandbox, tmp_path, kind):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    source = repo
    if kind == "tar.gz":
        source = tmp_path / "repo.tar.gz"
        with tarfile.open(source, "w:gz") as tar:
            tar.add(repo / "pkg", arcname="pkg")
    sandbox = await make_sandbox(SandboxSpec(workspace_source=source))
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


async def test_async_context_manager_closes(make_sandbox):
    sandbox = await make_sandbox()
    async with sandbox as entered:
        assert (await entered.exec("echo in")).stdout == "in\n"
    with pytest.raises(SandboxError):
        await sandbox.exec("true")
