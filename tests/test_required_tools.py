"""A missing tool skips a test locally and fails it under ``CI=true``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.required_tools import require_tool


def test_missing_tool_fails_under_ci(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="run `make setup-test`"):
        require_tool(tmp_path / "no-such-agent", "run `make setup-test`")


def test_missing_tool_skips_outside_ci(monkeypatch, tmp_path):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-agent"):
        require_tool(tmp_path / "no-such-agent", "run `make setup-test`")


def test_present_tool_is_returned_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_tool(sys.executable, "unused") == Path(sys.executable)
