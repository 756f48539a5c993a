"""Shared fixtures for task tests: the built-in tasks (snapshots cached once per session) and bwrap sandboxes."""

from __future__ import annotations

import shutil

import pytest

from components.tasks.builtin import load_builtin_tasks


@pytest.fixture(scope="session")
def task_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("task-cache")


@pytest.fixture(scope="session")
def builtin_tasks(task_cache_dir):
    return {task.task_id: task for task in load_builtin_tasks(cache_dir=task_cache_dir)}


@pytest.fixture(scope="session")
def sandbox_factory():
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is missing: run `make setup`")
    from sandboxes.bwrap import BwrapSandbox

    return BwrapSandbox.create
