"""Image tasks on E2B: the template of each image, against the in-process fake of the E2B SDK."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.errors import SandboxError
from components.protocols import SandboxSpec
from sandboxes.e2b_images import E2BImageConfig, E2BImageSandboxProvider, image_name_of
from tests.sandboxes.fake_e2b_sdk import FakeAsyncSandbox
from tests.sandboxes.sandbox_test_support import FAKE_E2B_CONFIG

DJANGO = "oci:/store/sweb.eval.x86_64.django_1776_django-11099:latest"
MOTO = "docker-archive:/store/sweb.eval.x86_64.getmoto_s_moto-5752.tar"


async def test_each_image_gets_its_template_and_unknown_images_are_refused(tmp_path: Path) -> None:
    mapping = tmp_path / "templates.json"
    mapping.write_text(
        json.dumps({"sweb.eval.x86_64.django_1776_django-11099": "swe-django-11099", MOTO: "swe-moto"})
    )
    config = E2BImageConfig.from_file(mapping, e2b=FAKE_E2B_CONFIG)
    assert image_name_of(DJANGO) == "sweb.eval.x86_64.django_1776_django-11099"
    async with E2BImageSandboxProvider(config) as provider:
        django = await provider.acquire(SandboxSpec(root_image=DJANGO, env={"K": "v"}))
        assert FakeAsyncSandbox.created[-1].create_kwargs["template"] == "swe-django-11099"
        assert FakeAsyncSandbox.created[-1].create_kwargs["allow_internet_access"] is False
        assert (await django.exec("echo $K")).stdout == "v\n"
        moto = await provider.acquire(SandboxSpec(root_image=MOTO))
        assert FakeAsyncSandbox.created[-1].create_kwargs["template"] == "swe-moto"
        assert (await moto.exec("echo ok")).stdout == "ok\n"
        await provider.release(django)
        assert FakeAsyncSandbox.created[-2].killed
        with pytest.raises(SandboxError, match="no E2B template for image"):
            await provider.acquire(SandboxSpec(root_image="oci:/store/other:latest"))
        with pytest.raises(ValueError, match="root_image"):
            await provider.acquire(SandboxSpec())
    assert FakeAsyncSandbox.created[-1].killed  # close kills what is still handed out (moto)
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    with pytest.raises(ValueError, match="templates"):
        E2BImageConfig.from_file(bad)
