"""Tests that need an installed tool (a real agent, Chromium, bubblewrap …) ask for it here.

Locally a missing tool skips the test with the set-up step that installs it; under ``CI=true`` it fails the test,
so a broken install step cannot turn CI green.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def running_in_ci() -> bool:
    """Whether ``CI`` is set to true (GitHub Actions, GitLab and most CI services set ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(path: str | Path | None, install_hint: str) -> Path:
    """The tool's path if it exists; otherwise skip (locally) or fail (under ``CI=true``) naming ``install_hint``."""
    if path is not None and Path(path).exists():
        return Path(path)
    message = f"{path or 'a required tool'} is not installed: {install_hint}"
    if running_in_ci():
        pytest.fail(f"{message} (CI=true: a missing tool fails the test instead of skipping it)")
    pytest.skip(message)
