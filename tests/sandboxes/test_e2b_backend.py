"""E2B-specific behaviour, against the in-process fake of the SDK (E2B's cloud is unreachable here)."""

from __future__ import annotations

import dataclasses

import pytest

from components.errors import SandboxError
from components.protocols import SandboxSpec
from sandboxes.e2b import E2BSandbox, E2BSandboxConfig
from sandboxes.errors import SandboxFileRefusedError
from tests.sandboxes.fake_e2b_sdk import FakeAsyncSandbox
from tests.sandboxes.sandbox_test_support import FAKE_E2B_CONFIG


async def test_create_passes_template_timeout_and_no_internet():
    config = E2BSandboxConfig(
        sdk_class=FakeAsyncSandbox,
        template="swe-base",
        sandbox_timeout_s=900,
        api_key="k",
        workspace_dir="/workspace",
    )
    async with await E2BSandbox.create(SandboxSpec(env={"A": "1"}), config) as sandbox:
        created = FakeAsyncSandbox.created[-1]
        assert created.create_kwargs["template"] == "swe-base"
        assert created.create_kwargs["timeout"] == 900
        assert created.create_kwargs["api_key"] == "k"
        assert created.create_kwargs["allow_internet_access"] is False
        assert created.create_kwargs["envs"] == {"A": "1"}
        assert (await sandbox.exec("echo $A")).stdout == "1\n"
    assert created.killed


async def test_proxy_url_must_be_reachable_from_e2b_and_is_the_only_egress():
    with pytest.raises(ValueError, match="proxy_url"):
        await E2BSandbox.create(SandboxSpec(proxy_url="http://127.0.0.1:8000"), FAKE_E2B_CONFIG)
    async with await E2BSandbox.create(
        SandboxSpec(proxy_url="https://proxy.example.org/s/1"), FAKE_E2B_CONFIG
    ):
        network = FakeAsyncSandbox.created[-1].create_kwargs["network"]
        assert network == {"allow_out": ["proxy.example.org"], "deny_out": ["0.0.0.0/0"]}


async def test_transient_create_failures_are_retried_then_typed():
    FakeAsyncSandbox.fail_next_creates = 2
    async with await E2BSandbox.create(SandboxSpec(), FAKE_E2B_CONFIG) as sandbox:
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"
    FakeAsyncSandbox.fail_next_creates = 5
    try:
        with pytest.raises(SandboxError, match="RateLimitException"):
            await E2BSandbox.create(
                SandboxSpec(), E2BSandboxConfig(sdk_class=FakeAsyncSandbox, num_attempts=2)
            )
    finally:
        FakeAsyncSandbox.fail_next_creates = 0


async def test_sandbox_gone_on_e2b_side_raises_sandbox_error():
    sandbox = await E2BSandbox.create(SandboxSpec(), FAKE_E2B_CONFIG)
    await FakeAsyncSandbox.created[-1].kill()  # E2B's own timeout, or someone else, killed it
    with pytest.raises(SandboxError, match="gone") as info:
        await sandbox.exec("true")
    assert info.value.sandbox_id == sandbox.sandbox_id
    with pytest.raises(SandboxError):
        await sandbox.read_file("x")
    await sandbox.close()


async def test_provider_acquire_release_kills():
    provider = FAKE_E2B_CONFIG.build()
    sandbox = await provider.acquire(SandboxSpec())
    created = FakeAsyncSandbox.created[-1]
    await sandbox.write_file("f.txt", "x")
    assert await sandbox.read_file("f.txt") == b"x"
    await provider.release(sandbox)
    assert created.killed
    leftover = await provider.acquire(SandboxSpec())
    await provider.close()
    assert FakeAsyncSandbox.created[-1].killed
    del leftover


@pytest.mark.parametrize(
    "cap", [pytest.param(1 << 20, id="hardened"), pytest.param(1 << 30, id="weakened-cap")]
)
async def test_host_side_reads_are_typed_and_capped(cap, tmp_path):
    """What the agent prepares for the host (a FIFO, a device behind a link, a huge sparse file, a tree over the
    download cap) is refused inside the sandbox, typed; only a raised cap lets the oversized ones through."""
    config = dataclasses.replace(FAKE_E2B_CONFIG, max_read_bytes=cap, max_download_bytes=cap)
    async with await E2BSandbox.create(SandboxSpec(), config) as sandbox:
        await sandbox.exec(
            "mkfifo pipe; ln -s /dev/zero zero; head -c 3M /dev/urandom > big.bin; "
            "mkdir tree && cp big.bin tree/ && mkfifo tree/pipe"
        )
        for name in ("pipe", "zero"):
            with pytest.raises(SandboxFileRefusedError, match="not a regular file"):
                await sandbox.read_file(name)
        if cap == 1 << 20:
            with pytest.raises(SandboxFileRefusedError, match="over the cap"):
                await sandbox.read_file("big.bin")
            with pytest.raises(SandboxFileRefusedError, match="over the cap"):
                await sandbox.download("tree", tmp_path / "tree")
        else:
            assert len(await sandbox.read_file("big.bin")) == 3 << 20
            await sandbox.download("tree", tmp_path / "tree")
            assert sorted(p.name for p in (tmp_path / "tree").iterdir()) == ["big.bin"]  # the FIFO left out
