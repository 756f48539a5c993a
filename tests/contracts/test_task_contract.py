"""The task-source contract (``components.protocols.TaskSource`` and ``Task``), checked on any task-source brick
— a callable ``step -> tasks`` such as a recipe's ``tasks_for_step`` — for what the loop and the rollout runner
rely on:

- every step gets the same non-empty number of tasks (the loop sizes its groups from step 0), and asking again
  for a step gives the same tasks: ids, statements, starting workspaces (the overlapped loop asks per group, a
  resumed run replays steps);
- every task implements ``Task``: a non-empty id that fits in a file name (snapshot caches and group ids are
  named after it), a non-empty problem statement (the agent's prompt), a ``SandboxSpec`` whose workspace
  source exists;
- its sandbox opens, and a task with set-up commands (``TaskWithSetup``) sets up in it.

Built-in: the minilib SWE tasks, the tic-tac-toe games, SWE-bench-format instances loaded from the fixtures.
The built-in SWE sources also pass a grading check with their grader: the untouched start earns a verdict of 0.
"""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from components.protocols import Reward, SandboxSpec, Task, TaskSource, TaskWithSetup
from tests.contracts.conftest import brick_params
from tests.required_tools import require_tool

pytestmark = pytest.mark.timeout(300)

STEPS = (0, 1, 2, 5)
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@=-]*")


@dataclass(frozen=True)
class BuiltInTasks:
    """A built-in task source, made with the test's fixtures, and the grader it is trained with (if any)."""

    make: Callable[[pytest.FixtureRequest], TaskSource]
    make_grader: Callable[[], Reward] | None = None


def _minilib(request) -> TaskSource:
    from components.run.loop import tasks_for_step
    from components.tasks.builtin import load_builtin_tasks

    tasks = load_builtin_tasks(cache_dir=request.getfixturevalue("tmp_path") / "task-cache")
    return functools.partial(lambda step, tasks: tasks_for_step(tasks, step=step, num_tasks=2), tasks=tasks)


def _tictactoe(request) -> TaskSource:
    from recipes.tictactoe_grpo import TicTacToeGrpoConfig, games_for_step

    return functools.partial(games_for_step, TicTacToeGrpoConfig())


def _swebench(request) -> TaskSource:
    from components.run.loop import tasks_for_step
    from components.tasks.swebench import load_task_set
    from tests.components.tasks.swebench_fixtures import INSTANCES, SNAPSHOTS, require_fixtures

    require_fixtures(INSTANCES, SNAPSHOTS)
    loaded = load_task_set(f"swebench:{INSTANCES}", snapshots=SNAPSHOTS)
    cache = request.getfixturevalue("tmp_path") / "task-cache"
    tasks = [replace(task, cache_dir=cache) for task in loaded.tasks]
    return functools.partial(lambda step, tasks: tasks_for_step(tasks, step=step, num_tasks=3), tasks=tasks)


def _swe_grader() -> Reward:
    from components.tasks import SweGrader
    from sandboxes.bwrap import BwrapSandbox

    return SweGrader(BwrapSandbox.create)


def _swebench_grader() -> Reward:
    from components.tasks.swebench_grading import SweBenchGrader
    from sandboxes.bwrap import BwrapSandbox

    return SweBenchGrader(BwrapSandbox.create)


BUILT_INS = {
    "minilib": lambda: BuiltInTasks(_minilib, _swe_grader),
    "tictactoe": lambda: BuiltInTasks(_tictactoe),
    "swebench-fixtures": lambda: BuiltInTasks(_swebench, _swebench_grader),
}
GRADED_BUILT_INS = {name: factory for name, factory in BUILT_INS.items() if factory().make_grader}


def pytest_generate_tests(metafunc):
    if "make_source" in metafunc.fixturenames:
        metafunc.parametrize("make_source", brick_params(metafunc.config, BUILT_INS))
    if "graded_built_in" in metafunc.fixturenames:
        metafunc.parametrize(
            "graded_built_in",
            [factory() for factory in GRADED_BUILT_INS.values()],
            ids=list(GRADED_BUILT_INS),
        )


@pytest.fixture
def source(make_source, request) -> TaskSource:
    brick = make_source()
    made = brick.make(request) if isinstance(brick, BuiltInTasks) else brick
    assert isinstance(made, TaskSource), f"{made!r} is not a TaskSource (a callable step -> tasks)"
    return made


def _identity(task: Task) -> tuple:
    spec = task.sandbox_spec()
    return (task.task_id, task.problem_statement, spec.workspace_source, spec.root_image)


async def _open(spec: SandboxSpec):
    require_tool(shutil.which("bwrap"), "run `make setup` (apt-get install bubblewrap)")
    if spec.root_image is not None:
        from sandboxes.image import create_image_sandbox

        return await create_image_sandbox(spec)
    from sandboxes.bwrap import BwrapSandbox

    return await BwrapSandbox.create(spec)


def test_every_step_gets_the_same_number_of_tasks_and_asking_again_gives_the_same(source):
    counts = {step: len(source(step)) for step in STEPS}
    assert counts[0] > 0 and len(set(counts.values())) == 1, counts
    for step in STEPS:
        assert [_identity(task) for task in source(step)] == [_identity(task) for task in source(step)]


def test_tasks_have_ids_statements_and_workspaces(source):
    for step in STEPS:
        for task in source(step):
            assert isinstance(task, Task), f"{task!r} does not implement components.protocols.Task"
            assert isinstance(task.task_id, str) and SAFE_ID.fullmatch(task.task_id), task.task_id
            assert isinstance(task.problem_statement, str) and task.problem_statement.strip()
            spec = task.sandbox_spec()
            assert isinstance(spec, SandboxSpec)
            assert spec.workspace_source is None or spec.workspace_source.exists(), spec.workspace_source


async def test_the_sandbox_opens_and_the_task_sets_up(source):
    for task in source(0):
        sandbox = await _open(task.sandbox_spec())
        try:
            if isinstance(task, TaskWithSetup):
                await task.run_setup(sandbox)
            assert (await sandbox.exec(["true"])).exit_code == 0
        finally:
            await sandbox.close()


@pytest.mark.built_in_only
async def test_the_untouched_start_is_graded_zero(graded_built_in, request):
    """Built-in sources with their grader: a task's start is gradable and not already solved."""
    task = graded_built_in.make(request)(0)[0]
    sandbox = await _open(task.sandbox_spec())
    try:
        if isinstance(task, TaskWithSetup):
            await task.run_setup(sandbox)
        result = await graded_built_in.make_grader().score(task, sandbox)
    finally:
        await sandbox.close()
    assert result.reward == 0.0, result.error or result.log[-2000:]


def test_the_contract_catches_a_source_whose_step_changes_when_asked_again():
    from examples.bricks.arithmetic_tasks import ArithmeticTasks

    class Reshuffling(ArithmeticTasks):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def __call__(self, step):
            self.calls += 1
            return super().__call__(step + self.calls)  # a fresh draw on every call

    with pytest.raises(AssertionError):
        test_every_step_gets_the_same_number_of_tasks_and_asking_again_gives_the_same(Reshuffling())
