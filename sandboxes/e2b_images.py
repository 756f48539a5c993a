"""Image tasks on E2B: one E2B template per image (built by the user from that image, e.g. ``e2b template build``
with ``FROM swebench/sweb.eval.x86_64.<id>``), chosen from ``SandboxSpec.root_image`` through a mapping.

The mapping's keys are image references as the loader writes them (``oci:DIR:TAG``, ``docker-archive:PATH``) or
just the image's name (the reference's last path component without the tag, e.g.
``sweb.eval.x86_64.django_1776_django-11099``), so one JSON file serves every machine. Each template gets its own
``E2BSandboxProvider`` (E2B's SDK, no network but the proxy, created and killed per sandbox); a spec naming an
image without a template is refused with ``SandboxError`` naming it. Tested against the in-process fake of the
SDK (``tests/sandboxes/fake_e2b_sdk.py``): E2B's cloud is not reachable from the test machines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from components.errors import SandboxError
from components.protocols import Sandbox, SandboxSpec
from sandboxes.e2b import E2BSandboxConfig, E2BSandboxProvider
from sandboxes.image import ImageError, parse_reference


def image_name_of(reference: str) -> str:
    """``oci:/store/sweb.eval.x86_64.x:latest`` -> ``sweb.eval.x86_64.x`` (the key a mapping file may use)."""
    _, path, _ = parse_reference(reference)
    return path.name.removesuffix(".tar")


@dataclass(frozen=True, kw_only=True)
class E2BImageConfig:
    """Which E2B template stands for which image, and how the sandboxes are made."""

    templates: Mapping[str, str] = field(default_factory=dict)  # image reference or image name -> template
    # The repository's path in the templates (SWE-bench images: /testbed); the workspace is copied there.
    e2b: E2BSandboxConfig = field(default_factory=lambda: E2BSandboxConfig(workspace_dir="/testbed"))

    @classmethod
    def from_file(cls, path: Path, e2b: E2BSandboxConfig | None = None) -> E2BImageConfig:
        """A JSON object ``{image reference or name: template}``."""
        templates = json.loads(Path(path).read_text())
        if not isinstance(templates, dict) or not all(isinstance(v, str) for v in templates.values()):
            raise ValueError(f"templates: {path} must be a JSON object of image -> template name")
        return cls(templates=templates, **({"e2b": e2b} if e2b else {}))


class E2BImageSandboxProvider:
    """A ``SandboxProvider`` for specs with ``root_image``, on the image's E2B template."""

    def __init__(self, config: E2BImageConfig) -> None:
        self.config = config
        self._providers: dict[str, E2BSandboxProvider] = {}
        self._owner: dict[str, E2BSandboxProvider] = {}

    def template_for(self, reference: str) -> str:
        """The template of ``reference`` (by full reference, then by image name); SandboxError if none."""
        templates = self.config.templates
        if reference in templates:
            return templates[reference]
        try:
            name = image_name_of(reference)
        except ImageError as exc:
            raise SandboxError(str(exc)) from exc
        if name in templates:
            return templates[name]
        raise SandboxError(
            f"no E2B template for image {reference!r} (name {name!r}): add it to the templates"
        )

    async def acquire(self, spec: SandboxSpec | None = None) -> Sandbox:
        """A new E2B sandbox from the template of ``spec.root_image`` (required)."""
        if spec is None or spec.root_image is None:
            raise ValueError("root_image: an image sandbox needs a spec naming its image")
        template = self.template_for(spec.root_image)
        provider = self._providers.get(template)
        if provider is None:
            provider = self._providers[template] = E2BSandboxProvider(
                replace(self.config.e2b, template=template)
            )
        sandbox = await provider.acquire(spec)
        self._owner[sandbox.sandbox_id] = provider
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Kill the sandbox."""
        provider = self._owner.pop(sandbox.sandbox_id, None)
        if provider is None:
            raise ValueError(f"sandbox: {sandbox.sandbox_id} was not acquired from this provider")
        await provider.release(sandbox)

    async def close(self) -> None:
        """Kill every sandbox still handed out."""
        for provider in self._providers.values():
            await provider.close()
        self._owner.clear()

    async def __aenter__(self) -> E2BImageSandboxProvider:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
