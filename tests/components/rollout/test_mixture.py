"""Several harnesses in one run (``components/rollout/mixture.py``): groups go to harnesses in proportion to
their weights, a group stays within one harness (unless ``within_groups``), every trajectory records the harness
that ran it, and the loop's primitives (``run`` / ``run_group``) work as with one runner. Real proxy, real
bubblewrap pool; two small real harnesses and a reward that reads what each wrote."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from components.protocols import RewardResult, Sandbox, Task
from components.rollout import RolloutConfig, RolloutRunner
from components.rollout.mixture import HarnessMix
from harnesses.wrap import AgentContext, agent_harness

pytestmark = pytest.mark.timeout(300)


def _writer(name: str):
    @agent_harness(name=name)
    async def agent(ctx: AgentContext) -> None:
        await ctx.openai.chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        await ctx.sandbox.write_file("who.txt", name)

    return agent


class RewardsAlpha:
    """1 when the agent that ran wrote ``alpha``."""

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        result = await agent_sandbox.exec(["cat", "who.txt"])
        return RewardResult(reward=float(result.stdout.strip() == "alpha"))


async def test_groups_follow_the_weights_and_stay_within_one_harness(
    scripted_proxy, builtin_tasks, sandbox_pool
):
    tasks = list(builtin_tasks.values())[:3]
    async with scripted_proxy(lambda _: "ok") as proxy:

        def runner(name: str) -> RolloutRunner:
            return RolloutRunner(
                RolloutConfig(group_size=2, max_concurrency=4),
                harness=_writer(name),
                sandboxes=sandbox_pool,
                sessions=proxy.registry,
                proxy_url=proxy.url,
                grader=RewardsAlpha(),
            )

        mix = HarnessMix({runner("alpha"): 2, runner("beta"): 1})
        trajectories = await mix.run(tasks, step=0)
        spread = HarnessMix({runner("alpha"): 1, runner("beta"): 1}, within_groups=True)
        [*spread_members] = await spread.run_group(tasks[0], group_id="g-spread", step=1)

    assert [t.task_id for t in trajectories] == [task.task_id for task in tasks for _ in range(2)]
    harnesses_of_group: dict[str, set[str]] = defaultdict(set)
    for trajectory in trajectories:
        harnesses_of_group[trajectory.group_id].add(trajectory.harness)
        # The harness recorded is the one that ran: only alpha's sandboxes say alpha.
        assert trajectory.reward == (1.0 if trajectory.harness == "alpha" else 0.0), trajectory.log[-1000:]
    assert all(len(names) == 1 for names in harnesses_of_group.values()), harnesses_of_group
    assert Counter(next(iter(names)) for names in harnesses_of_group.values()) == {"alpha": 2, "beta": 1}
    assert {t.harness for t in spread_members} == {"alpha", "beta"}


def test_a_mix_needs_distinct_harnesses_and_positive_weights():
    def bare_runner(name: str, group_size: int = 2) -> RolloutRunner:
        return RolloutRunner(
            RolloutConfig(group_size=group_size),
            harness=_writer(name),
            sandboxes=None,
            sessions=None,
            proxy_url="http://127.0.0.1:1",
            grader=RewardsAlpha(),
        )

    with pytest.raises(ValueError, match="weights"):
        HarnessMix({bare_runner("a"): 0})
    with pytest.raises(ValueError, match="one runner per harness"):
        HarnessMix({bare_runner("a"): 1, bare_runner("a"): 1})
    with pytest.raises(ValueError, match="group sizes"):
        HarnessMix({bare_runner("a"): 1, bare_runner("b", group_size=3): 1})
