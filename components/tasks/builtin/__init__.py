"""The built-in SWE-style task set: bugs injected into ``minilib``, a small library shipped for this purpose.

Layout: ``minilib/`` is the pristine library (with its visible tests), stored once; ``hidden_tests/`` holds
the full test suite the grader uses; ``tasks.jsonl`` lists the tasks, each as a ``bug_patch`` against the
pristine library (made from ``catalog.py`` by ``python -m components.tasks.generate --curated``).
Snapshots are materialised on demand into a cache directory.
"""

from __future__ import annotations

from pathlib import Path

from components.tasks.swe import SweTask, load_tasks

BUILTIN_DIR = Path(__file__).resolve().parent
BUILTIN_TASKS_FILE = BUILTIN_DIR / "tasks.jsonl"
MINILIB_DIR = BUILTIN_DIR / "minilib"
HIDDEN_TESTS_DIR = BUILTIN_DIR / "hidden_tests"


def load_builtin_tasks(
    *, cache_dir: Path | None = None, tool_paths: tuple[str, ...] | None = None
) -> list[SweTask]:
    """The built-in task set (≥ 30 tasks), snapshots cached under ``cache_dir`` (default ~/.cache/rein/tasks)."""
    return load_tasks(BUILTIN_TASKS_FILE, cache_dir=cache_dir, tool_paths=tool_paths)
