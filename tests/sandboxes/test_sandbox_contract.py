"""The Sandbox protocol's contract, run against every backend: bwrap (real), the bwrap pool, E2B (fake SDK)."""

from __future__ import annotations

import tarfile
import time

import pytest

from components.errors import SandboxError
from components.protocols import Sandbox, SandboxLimits, SandboxSpec


async def test_exec_reports_exit_code_stdout_and_stderr(make_sandbox):
    sandbox = await make_sandbox()
    assert isinstance(sandbox, Sandbox)
    ok = await sandbox.exec("echo hello; echo oops >&2")
    assert (ok.exit_code, ok.stdout, ok.stderr, ok.timed_out) == (0, "hello\n", "oops\n", False)
    failed = await sandbox.exec("echo partial; exit 3")
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
    listed = await sandbox.exec("cat notes/a.txt")
    assert listed.stdout == "text é"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("does/not/exist")


async def test_upload_dir_and_download(make_sandbox, tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("X = 1\n")
    (source / "top.txt").write_text("top\n")
    sandbox = await make_sandbox()
    await sandbox.upload_dir(source, "uploaded")
    found = await sandbox.exec("cat uploaded/top.txt uploaded/pkg/mod.py")
    assert found.stdout == "top\nX = 1\n"
    await sandbox.exec("mkdir -p out/deep && echo result > out/deep/r.txt && echo single > one.txt")
    await sandbox.download("out", tmp_path / "got")
    assert (tmp_path / "got" / "deep" / "r.txt").read_text() == "result\n"
    await sandbox.download("one.txt", tmp_path / "one-copy.txt")
    assert (tmp_path / "one-copy.txt").read_text() == "single\n"


@pytest.mark.parametrize("kind", ["dir", "tar.gz"])
async def test_workspace_source_is_copied_in(make_sandbox, tmp_path, kind):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "main.py").write_text("print('repo')\n")
    source = repo
    if kind == "tar.gz":
        source = tmp_path / "repo.tar.gz"
        with tarfile.open(source, "w:gz") as tar:
            tar.add(repo / "src", arcname="src")
    sandbox = await make_sandbox(SandboxSpec(workspace_source=source))
    result = await sandbox.exec("cat src/main.py")
    assert result.stdout == "print('repo')\n"


async def test_timeout_kills_and_reports(make_sandbox):
    sandbox = await make_sandbox(SandboxSpec(limits=SandboxLimits(command_timeout_s=1.0)))
    start = time.monotonic()
    result = await sandbox.exec("sleep 30; echo never")
    assert result.timed_out and "never" not in result.stdout
    assert time.monotonic() - start < 8
    after = await sandbox.exec("echo alive")
    assert after.stdout == "alive\n"


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
