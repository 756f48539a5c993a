"""Several harnesses in one run: one policy trained across a weighted mix of agents.

    rollouts = HarnessMix({claude_runner: 2, codex_runner: 1, opencode_runner: 1})
    trajectories = await rollouts.run(tasks, step)       # or the loop's run_group, as with one runner

Each ``RolloutRunner`` runs one harness (its own sandbox adaptation, its name on every session and trajectory);
they share the sandboxes, the proxy and the grader. A GRPO group stays within one harness: each new group goes to
the next harness of a smooth weighted round-robin (exact proportions, deterministic in the order groups start),
so advantages compare samples of the same agent. ``within_groups=True`` spreads the members of each group
over the harnesses instead (the group then compares agents with each other).
"""

from __future__ import annotations

from collections.abc import Mapping

from components.config import require
from components.protocols import Task
from components.rollout.runner import GroupRollouts, RolloutRunner
from components.trajectory import Trajectory


class HarnessMix(GroupRollouts):
    """Rollouts over a weighted mix of runners, one harness each (see the module docstring)."""

    def __init__(self, weights: Mapping[RolloutRunner, float], *, within_groups: bool = False) -> None:
        runners = list(weights)
        require(len(runners) >= 1, "weights", "needs at least one runner")
        require(all(weights[r] > 0 for r in runners), "weights", f"must be > 0, got {list(weights.values())}")
        names = [runner.harness.name for runner in runners]
        require(len(set(names)) == len(names), "weights", f"one runner per harness, got {names}")
        sizes = {runner.config.group_size for runner in runners}
        require(len(sizes) == 1, "weights", f"the runners' group sizes differ: {sorted(sizes)}")
        self.runners = runners
        self.weights = [float(weights[r]) for r in runners]
        self.within_groups = within_groups
        self.config = runners[0].config
        self._run_tag = runners[0]._run_tag
        self._credit = [0.0] * len(runners)
        self._by_group: dict[str, RolloutRunner] = {}
        self._by_name = dict(zip(names, runners, strict=True))

    def _next_runner(self) -> RolloutRunner:
        """Smooth weighted round-robin: every pick adds each weight to its credit, takes the largest."""
        for index, weight in enumerate(self.weights):
            self._credit[index] += weight
        chosen = max(range(len(self.runners)), key=lambda index: self._credit[index])
        self._credit[chosen] -= sum(self.weights)
        return self.runners[chosen]

    def runner_for(self, group_id: str) -> RolloutRunner:
        """The runner of a group (chosen once, when its first member starts)."""
        if group_id not in self._by_group:
            self._by_group[group_id] = self._next_runner()
        return self._by_group[group_id]

    async def run_one(self, task: Task, *, group_id: str, step: int) -> Trajectory:
        runner = self._next_runner() if self.within_groups else self.runner_for(group_id)
        return await runner.run_one(task, group_id=group_id, step=step)

    async def finish_group(self, task: Task, members: list[Trajectory]) -> list[Trajectory]:
        # The group reward is the run's one configuration, shared by the runners: any member's runner applies it.
        runner = self._by_name.get(members[0].harness, self.runners[0]) if members else self.runners[0]
        if not self.within_groups and members:
            self._by_group.pop(members[0].group_id, None)
        return await runner.finish_group(task, members)
