"""The ``Reward`` contract (``components.protocols.Reward``), checked on any reward brick:

``score(task, agent_sandbox)`` returns a ``RewardResult`` (a finite reward, or ``None`` with the error), the
same verdict for the same sandbox state, and a sandbox that died is a grading failure (``reward=None`` with
the error) — never an exception and never a silent 0. Built-in: the SWE grader on a built-in task. A user's
reward is scored on a small task whose workspace holds ``answer.txt``. (That nothing but a correct solution
changes the grade is proven per grader by the reward-hack battery in ``tests/components/tasks``.)
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.protocols import Reward, RewardResult, Sandbox, SandboxSpec, Task
from tests.contracts.conftest import brick_params
from tests.failing_bricks import DeadSandbox
from tests.required_tools import require_tool


@dataclass(frozen=True)
class AnswerTask:
    """A small task for user rewards: the workspace holds ``answer.txt``."""

    workspace: Path
    task_id: str = "answer-task"
    problem_statement: str = "Write the answer into answer.txt."

    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec(workspace_source=self.workspace)


def _swe_grader():
    from components.tasks import SweGrader
    from sandboxes.bwrap import BwrapSandbox

    return SweGrader(BwrapSandbox.create)


def pytest_generate_tests(metafunc):
    if "make_reward" in metafunc.fixturenames:
        metafunc.parametrize("make_reward", brick_params(metafunc.config, {"swe-grader": _swe_grader}))


@pytest.fixture
def reward(make_reward) -> Reward:
    brick = make_reward()
    assert isinstance(brick, Reward), f"{brick!r} does not implement components.protocols.Reward"
    return brick


@pytest.fixture
def task(reward, tmp_path) -> Task:
    from components.tasks import SweGrader

    if isinstance(reward, SweGrader):
        from components.tasks.builtin import load_builtin_tasks

        return load_builtin_tasks(cache_dir=tmp_path / "tasks")[0]
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "answer.txt").write_text("42\n")
    return AnswerTask(tmp_path / "workspace")


@pytest.fixture
async def agent_sandbox(task):
    require_tool(shutil.which("bwrap"), "run `make setup` (apt-get install bubblewrap)")
    from components.tasks.swe import python_tool_paths
    from sandboxes.bwrap import BwrapSandbox

    spec = task.sandbox_spec()
    sandbox = await BwrapSandbox.create(
        SandboxSpec(workspace_source=spec.workspace_source, read_only_paths=python_tool_paths())
    )
    yield sandbox
    await sandbox.close()


def _check_result(result: RewardResult) -> None:
    assert isinstance(result, RewardResult)
    assert (result.reward is None) == bool(result.error)
    assert result.reward is None or math.isfinite(result.reward)


async def test_same_state_same_verdict(reward, task, agent_sandbox):
    first = await reward.score(task, agent_sandbox)
    second = await reward.score(task, agent_sandbox)
    _check_result(first)
    assert first.reward is not None, first.error  # an intact sandbox is gradable
    assert second.reward == first.reward


async def test_a_dead_sandbox_is_a_grading_failure_not_a_zero(reward, task):
    dead: Sandbox = DeadSandbox()
    result = await reward.score(task, dead)
    _check_result(result)
    assert result.reward is None and result.error


async def test_the_contract_catches_a_reward_that_scores_a_dead_sandbox_zero(tmp_path):
    class ZeroOnAnyError:
        async def score(self, task, agent_sandbox):
            try:
                await agent_sandbox.read_file("answer.txt")
            except Exception:
                return RewardResult(reward=0.0, log="could not read")  # the silent 0 the contract forbids
            return RewardResult(reward=1.0)

    with pytest.raises(AssertionError):
        await test_a_dead_sandbox_is_a_grading_failure_not_a_zero(ZeroOnAnyError(), AnswerTask(tmp_path))
