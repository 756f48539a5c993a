"""Paths of the SWE-bench-format fixtures that `make setup-test` builds (see the Makefile): the OCI test image
and the instances made from real PyPI bug-fix releases. Missing fixtures fail under CI and skip elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

from tests.required_tools import require_tool

ROOT = Path(__file__).resolve().parents[3]
IMAGE_LAYOUT = ROOT / ".images" / "rein-py-env"
IMAGE_ARCHIVE = ROOT / ".images" / "rein-py-env.tar"
ENV_IMAGE = f"oci:{IMAGE_LAYOUT}:latest"
INSTANCES = ROOT / ".swebench" / "instances.parquet"
SNAPSHOTS = ROOT / ".swebench" / "snapshots"
MANIFEST = ROOT / "tests" / "components" / "tasks" / "data" / "pypi_instances.json"


def require_fixtures(*paths: Path) -> None:
    """Fail (CI) or skip (elsewhere) unless the set-up built ``paths``."""
    for path in paths:
        require_tool(path, "the SWE-bench fixtures are built by `make setup-test`")


def env_image_store(directory: Path) -> Path:
    """An image store where every manifest instance maps to the shared environment image (one unpack)."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = [entry["instance_id"] for entry in json.loads(MANIFEST.read_text())]
    (directory / "images.json").write_text(json.dumps({instance_id: ENV_IMAGE for instance_id in ids}))
    return directory
