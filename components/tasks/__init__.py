"""Tasks and rewards: SWE-style tasks with tamper-proof grading and ART-style toy environments.

    from components.tasks import load_builtin_tasks, SweGrader
    from sandboxes.bwrap import BwrapSandbox

    tasks = load_builtin_tasks()                      # 45 minilib bug-fix tasks, snapshots cached on demand
    grader = SweGrader(BwrapSandbox.create)           # Reward: fresh sandbox + hidden tests per verdict
    result = await grader.score(task, agent_sandbox)  # RewardResult(reward=1.0 | 0.0 | None, log, error)

See ``README.md`` next to this file for the task format, the grading policy and the toy environments.
"""

from components.tasks.swe import SweTask, TaskSnapshot, load_tasks  # noqa: I001  (swe first: others use it)
from components.tasks.grading import SweGrader, SweGraderConfig
from components.tasks.builtin import load_builtin_tasks

__all__ = ["SweGrader", "SweGraderConfig", "SweTask", "TaskSnapshot", "load_builtin_tasks", "load_tasks"]
