"""The task-source seam (``components.registry.TASK_SOURCES``): a kind is a config whose ``build()`` loads the
tasks and whose ``environment()`` gives the sandboxes the agents run in and the grader that scores them.

    --tasks builtin [--task-ids a,b]                          the 45 built-in SWE tasks (or some of them)
    --tasks swebench:rows.parquet --images DIR                a SWE-bench-format set (``--tasks swebench
    --tasks r2e:rows.parquet --images DIR                     --tasks-path rows.parquet`` says the same)

``KIND:PATH`` is the short form of ``--tasks KIND --tasks-path PATH`` (a kind's ``shorthand`` field).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from components.config import option, require
from components.protocols import Reward, SandboxProvider, Task
from components.registry import TASK_SOURCES

if TYPE_CHECKING:
    from components.tasks.swebench import RowConverter


class TaskSourceConfig(Protocol):
    """A registered task-source kind."""

    def build(self) -> list[Task]:
        """The tasks (an unknown id or an empty set: ``ValueError`` naming the field)."""
        ...

    async def environment(
        self,
        tasks: list[Task],
        sandboxes: SandboxProvider,
        agent_paths: tuple[str, ...],
        exits: AsyncExitStack,
    ) -> tuple[SandboxProvider, Reward]:
        """(the agents' sandboxes, the grader): ``sandboxes`` is the run's own provider; what it starts is
        closed by ``exits``."""
        ...


def _host_grader() -> Reward:
    from components.tasks import SweGrader
    from sandboxes import BwrapSandbox

    return SweGrader(BwrapSandbox.create)  # grading gets fresh sandboxes of its own, never the agent's


@TASK_SOURCES.register("builtin")
@dataclass(kw_only=True, frozen=True)
class BuiltinTaskSourceConfig:
    """The built-in SWE tasks (``components/tasks/builtin``), graded by their hidden tests in bubblewrap."""

    task_ids: tuple[str, ...] = option(
        (), "comma-separated built-in task ids to train on (default: all 45)", flag="task-ids"
    )

    def build(self) -> list[Task]:
        from components.tasks import load_builtin_tasks

        tasks = load_builtin_tasks()
        if not self.task_ids:
            return tasks
        by_id = {task.task_id: task for task in tasks}
        unknown = [task_id for task_id in self.task_ids if task_id not in by_id]
        require(not unknown, "task_ids", f"unknown task ids {unknown}; known: {sorted(by_id)}")
        return [by_id[task_id] for task_id in self.task_ids]

    async def environment(
        self,
        tasks: list[Task],
        sandboxes: SandboxProvider,
        agent_paths: tuple[str, ...],
        exits: AsyncExitStack,
    ) -> tuple[SandboxProvider, Reward]:
        return sandboxes, _host_grader()


@TASK_SOURCES.register("swebench")
@dataclass(kw_only=True, frozen=True)
class SweBenchTaskSourceConfig:
    """A SWE-bench-format set (Parquet / JSONL rows); bad rows are reported and skipped. Agents and grader run
    on the tasks' images (a pool per image), or on the host root when the set has no image store."""

    shorthand: ClassVar[str] = "path"
    path: str = option("", "the rows (Parquet / JSONL)")
    images: str = option("", "image store of the tasks (OCI layouts / docker archives)", flag="images")
    snapshots: str = option(
        "", "repository snapshots of the tasks (<instance_id>[.tar.gz])", flag="snapshots"
    )

    def __post_init__(self) -> None:
        require(bool(self.path), "path", "names the rows file (--tasks swebench:PATH)")

    def row_converter(self) -> RowConverter | None:  # None: the rows are SWE-bench's own
        return None

    def hidden_paths(self) -> tuple[str, ...]:
        """Paths inside the images the agents must not see."""
        return ()

    def build(self) -> list[Task]:
        from components.tasks.swebench import RepoSources, load_swebench

        sources = RepoSources(
            images_dir=Path(self.images) if self.images else None,
            snapshots_dir=Path(self.snapshots) if self.snapshots else None,
        )
        loaded = load_swebench(Path(self.path), sources, row_converter=self.row_converter())
        for row in loaded.rejected:
            print(f"skipped instance {row.instance_id}: {row.reason}")
        require(bool(loaded.tasks), "path", f"no usable instance in {self.path}")
        return list(loaded.tasks)

    async def environment(
        self,
        tasks: list[Task],
        sandboxes: SandboxProvider,
        agent_paths: tuple[str, ...],
        exits: AsyncExitStack,
    ) -> tuple[SandboxProvider, Reward]:
        from components.tasks.swebench import SnapshotPrefetcher
        from components.tasks.swebench_grading import SweBenchGrader
        from sandboxes import BwrapSandbox
        from sandboxes.image import ImageSandboxConfig, ImageSandboxProvider

        exits.callback(SnapshotPrefetcher(tasks).start().stop)  # first unpacks off the rollout event loop
        if not any(task.image for task in tasks):
            return sandboxes, SweBenchGrader(BwrapSandbox.create)
        agents = ImageSandboxProvider(
            ImageSandboxConfig(read_only_paths=agent_paths, hidden_paths=self.hidden_paths())
        )
        grading = ImageSandboxProvider(ImageSandboxConfig(num_warm_per_image=0))
        for provider in (agents, grading):
            await exits.enter_async_context(provider)
        return agents, SweBenchGrader(grading)


@TASK_SOURCES.register("r2e")
@dataclass(kw_only=True, frozen=True)
class R2ETaskSourceConfig(SweBenchTaskSourceConfig):
    """R2E-Gym rows, converted to SWE-bench's format (``components/tasks/swebench.py: r2e_row``); the images'
    hidden tests are hidden from the agents."""

    def row_converter(self) -> RowConverter | None:
        from components.tasks.swebench import r2e_row

        return r2e_row

    def hidden_paths(self) -> tuple[str, ...]:
        from components.tasks.swebench import R2E_TESTS_PATH

        return (R2E_TESTS_PATH,)
