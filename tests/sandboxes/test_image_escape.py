"""The escape battery (``test_bwrap_escape.py``), re-run on image sandboxes: every attack there that works on
an ``attacker`` sandbox runs here against a sandbox whose root is the test OCI image, with an image-sandbox
bystander. The attacks are imported, not copied, so the battery stays one list."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from components.protocols import SandboxSpec
from sandboxes.image import ImageSandboxConfig, create_image_sandbox
from tests.components.tasks.swebench_fixtures import ENV_IMAGE, IMAGE_LAYOUT, require_fixtures
from tests.sandboxes import test_bwrap_escape as battery
from tests.sandboxes.sandbox_test_support import SMALL_LIMITS

CONFIG = ImageSandboxConfig(cache_dir=Path.home() / ".cache" / "rein" / "images")


async def _image_sandbox():
    require_fixtures(IMAGE_LAYOUT)
    return await create_image_sandbox(SandboxSpec(limits=SMALL_LIMITS, root_image=ENV_IMAGE), CONFIG)


@pytest.fixture(scope="module")
async def bystander():
    """An image sandbox that must stay healthy whatever the attacker does."""
    async with await _image_sandbox() as sandbox:
        await sandbox.write_file("bystander-secret.txt", "BYSTANDER-SECRET-7731")
        yield sandbox


@pytest.fixture
async def attacker(bystander):
    async with await _image_sandbox() as sandbox:
        yield sandbox
    check = await bystander.exec("cat bystander-secret.txt")
    assert check.stdout == "BYSTANDER-SECRET-7731"


# Every attack of the battery that takes the ``attacker`` fixture, collected here under the same name.
for _name, _test in inspect.getmembers(battery, inspect.iscoroutinefunction):
    if _name.startswith("test_") and "attacker" in inspect.signature(_test).parameters:
        globals()[_name] = _test
