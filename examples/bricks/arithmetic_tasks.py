"""A third-party task-source brick in one file: each step, seeded sums to write into ``answer.txt`` (what
``examples.bricks.answer_file_reward`` grades, given the sum as its expected answer).

    pytest tests/contracts/test_task_contract.py --brick examples.bricks.arithmetic_tasks:ArithmeticTasks
"""

import random
from dataclasses import dataclass

from components.protocols import SandboxSpec


@dataclass(frozen=True)
class SumTask:
    """Implements ``components.protocols.Task``: an empty workspace, the question in the statement."""

    task_id: str
    problem_statement: str
    answer: str

    def sandbox_spec(self) -> SandboxSpec:
        return SandboxSpec()


class ArithmeticTasks:
    """Implements ``components.protocols.TaskSource``: ``tasks_per_step`` sums a step, fixed by the step."""

    def __init__(self, tasks_per_step: int = 3) -> None:
        self.tasks_per_step = tasks_per_step

    def __call__(self, step: int) -> list[SumTask]:
        draw = random.Random(step)  # the same step always gets the same sums
        tasks = []
        for index in range(self.tasks_per_step):
            a, b = draw.randint(10, 99), draw.randint(10, 99)
            statement = f"Write the value of {a} + {b} (digits only) into answer.txt."
            tasks.append(SumTask(f"sum-{step}-{index}", statement, str(a + b)))
        return tasks
