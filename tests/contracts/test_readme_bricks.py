"""The README's "Add your own brick" commands, run exactly as shown: each example brick passes its suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMANDS = re.findall(
    r"^\s*(pytest tests/contracts/\S+ --brick \S+)$",
    (REPO_ROOT / "README.md").read_text().split("## Add your own brick", 1)[1].split("\n## ", 1)[0],
    flags=re.MULTILINE,
)


def test_the_readme_shows_one_command_per_example():
    assert len(COMMANDS) == 7  # one per contract suite


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_brick_command_passes(command):
    argv = [sys.executable, "-m", *command.split(), "-q", "-p", "no:cacheprovider"]
    run = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"\d+ passed", run.stdout) and "skipped" not in run.stdout, run.stdout[-2000:]
