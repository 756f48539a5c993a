"""Contract suites: one per Protocol, run against the built-in bricks, or against yours with ``--brick``::

    pytest tests/contracts/test_algorithm_contract.py --brick examples.bricks.reinforce:Reinforce
    pytest tests/contracts/test_sandbox_contract.py --brick examples.bricks.tempdir_sandbox:TempDirSandbox.create
    pytest tests/contracts/test_reward_contract.py --brick examples.bricks.answer_file_reward:AnswerFileReward
    pytest tests/contracts/test_engine_contract.py --brick examples.bricks.hashing_engine:HashingEngine
    pytest tests/contracts/test_task_contract.py --brick examples.bricks.arithmetic_tasks:ArithmeticTasks
    pytest tests/contracts/test_harness_contract.py --brick examples.bricks.one_shot_harness:OneShotHarness

``MODULE:OBJECT`` is imported (``OBJECT`` may be dotted, e.g. a classmethod); a class is instantiated with no
arguments. The module must be importable from where pytest runs (installed, or in the working directory).
Tests marked ``built_in_only`` (checks that need a built-in brick's partner, e.g. a task set with its grader) are
deselected when ``--brick`` is given.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest


def load_brick(spec: str) -> Any:
    """The object ``MODULE:OBJECT`` names (a class is instantiated with no arguments)."""
    module_name, _, attribute_path = spec.partition(":")
    if not module_name or not attribute_path:
        raise pytest.UsageError(f"--brick: expected MODULE:OBJECT, got {spec!r}")
    found: Any = importlib.import_module(module_name)
    for attribute in attribute_path.split("."):
        found = getattr(found, attribute)
    return found() if isinstance(found, type) else found


def brick_params(config: pytest.Config, built_in: dict[str, Callable[[], Any]]) -> list[Any]:
    """``pytest.param``s of the bricks a suite runs against: ``--brick`` ones if given, else the built-ins."""
    user_specs = config.getoption("--brick")
    if user_specs:
        return [pytest.param(lambda spec=spec: load_brick(spec), id=spec) for spec in user_specs]
    return [pytest.param(factory, id=name) for name, factory in built_in.items()]


@dataclass(frozen=True)
class BuiltIn:
    """A built-in brick, opened with the test session's fixtures (models, Ray, pools, temporary directories)."""

    open: Callable[[pytest.FixtureRequest], contextlib.AbstractAsyncContextManager[Any]]


@contextlib.asynccontextmanager
async def opened_brick(make_brick: Callable[[], Any], request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The brick ``make_brick()`` gives: a ``BuiltIn`` opened (and closed afterwards), a user's one as it is."""
    brick = make_brick()
    if isinstance(brick, BuiltIn):
        async with brick.open(request) as opened:
            yield opened
    else:
        yield brick


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "built_in_only: checks of built-in bricks only (deselected with --brick)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--brick"):
        return
    kept = [item for item in items if item.get_closest_marker("built_in_only") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
