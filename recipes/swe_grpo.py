"""GRPO on the built-in SWE tasks: an agent fixes a bug in a bubblewrap sandbox, hidden tests grade it.

    python recipes/swe_grpo.py                             # SmolLM2-135M, 2 tasks × 2 samples, 2 steps (CPU)
    python recipes/swe_grpo.py --harness mini_swe_agent    # the same run with an unmodified black-box agent
    python recipes/swe_grpo.py --harness claude_code,codex,opencode   # one policy across agents (or claude_code:2,codex:1)
    python recipes/swe_grpo.py --engine sglang --sglang-url http://HOST:30000 --trainer-use-gpu true
    python recipes/swe_grpo.py --rollout-mode async --max-staleness 2   # rollouts overlap training
    python recipes/swe_grpo.py --tasks swebench:rows.parquet --images IMAGES_DIR   # a SWE-bench-format set
    python recipes/swe_grpo.py --help                      # every field, its meaning and default

Each step: roll out ``num_tasks`` tasks × ``group_size`` samples (agent in a warm sandbox → proxy session →
grade in a fresh sandbox) → write one trajectory shard → one GRPO step → push the new weights to the engine →
log (and checkpoint) — in ``--rollout-mode`` sync; async and partial overlap rollouts and training (the loop
all recipes share: ``components/run/loop.py``). Placement, run directory and resume: see ``components/run/__init__.py``.
"""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack
from dataclasses import dataclass

from components.config import require, require_positive
from components.protocols import Harness
from components.recipe_config import option, slot
from components.registry import HARNESSES, REWARDS, TASK_SOURCES
from components.rewards.config import HiddenTestsRewardConfig, RewardBrickConfig
from components.rollout import RolloutConfig, RolloutRunner
from components.rollout.mixture import HarnessMix
from components.run.config import RunConfig, SamplingBrickConfig
from components.run.directory import RunDirectory
from components.run.entry import main_entry
from components.run.loop import run_recipe_loop, tasks_for_step
from components.run.stack import RunStack
from components.tasks.sources import BuiltinTaskSourceConfig, TaskSourceConfig
from components.tasks.swe import python_tool_paths
from harnesses.blackbox import HarnessBrickConfig
from harnesses.claude_code import ClaudeCodeBrickConfig
from harnesses.swe_agent import SweAgentBrickConfig


def harness_weights(spec: str) -> dict[str, float]:
    """``claude_code,codex`` or ``claude_code:2,codex:1`` → harness name → weight (default 1)."""
    weights: dict[str, float] = {}
    for item in spec.split(","):
        name, _, weight = item.strip().partition(":")
        require(
            name in HARNESSES, "harness", f"{name!r} is not one of {list(HARNESSES.kinds())} (in {spec!r})"
        )
        require(name not in weights, "harness", f"{name!r} is named twice in {spec!r}")
        try:
            weights[name] = float(weight) if weight else 1.0
        except ValueError:
            weights[name] = -1.0
        require(weights[name] > 0, "harness", f"the weight of {name!r} must be a number > 0 (in {spec!r})")
    return weights


@dataclass(kw_only=True, frozen=True)
class SweGrpoConfig(RunConfig):
    """The SWE GRPO run (fields shared by all recipes: see ``RunConfig``)."""

    harness: str = option(
        "swe_agent",
        f"the agent: a registered harness kind ({', '.join(HARNESSES.kinds())}: swe_agent is the white-box "
        "one); several, comma-separated with optional weights (claude_code:2,codex:1), split the GRPO groups "
        "between them",
    )
    harness_mix_within_groups: bool = option(
        False, "with several harnesses: spread each group's samples over them (default: a group, one harness)"
    )
    # The settings of the harness kinds that have any (a kind the mix names is built from the field holding it,
    # else from its defaults).
    swe_agent: SweAgentBrickConfig = option(SweAgentBrickConfig(), "the swe_agent harness kind")
    claude_code: ClaudeCodeBrickConfig = option(ClaudeCodeBrickConfig(), "the claude_code harness kind")
    num_tasks: int = option(2, "tasks (GRPO groups) per step, taken in order from the task list")
    tasks: TaskSourceConfig = slot(
        TASK_SOURCES,
        BuiltinTaskSourceConfig(),
        "the tasks: the built-in SWE tasks, or a SWE-bench-format set (swebench:PATH, r2e:PATH: Parquet / JSONL)",
    )
    max_turns: int = option(3, "model calls per rollout")
    sampling: SamplingBrickConfig = option(SamplingBrickConfig(max_tokens=192), "the policy's sampling")
    wall_time_s: float = option(300.0, "wall-clock bound of one agent run")
    reward: RewardBrickConfig = slot(
        REWARDS,
        HiddenTestsRewardConfig(),
        "reward: the task's hidden tests, an LLM judge, or both (tests+judge)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self.num_tasks, "num_tasks")
        require_positive(self.max_turns, "max_turns")
        require_positive(self.wall_time_s, "wall_time_s")
        harness_weights(self.harness)  # raises naming the field


def harness_kinds(config: SweGrpoConfig) -> dict[str, HarnessBrickConfig]:
    """Each harness kind ``config.harness`` names → its config: the config's field holding that kind, else the
    kind's defaults."""
    values = (getattr(config, field.name) for field in dataclasses.fields(config))
    configured = {HARNESSES.name_of(value): value for value in values if HARNESSES.holds(value)}
    return {
        name: configured[name] if name in configured else HARNESSES.get(name)()
        for name in harness_weights(config.harness)
    }


def build_harness(config: SweGrpoConfig, kind: HarnessBrickConfig) -> tuple[Harness, tuple[str, ...]]:
    """The harness of ``kind`` under the run's bounds, and the host paths its sandboxes need read-only."""
    harness = kind.build(
        max_turns=config.max_turns,
        wall_time_s=config.wall_time_s,
        max_tokens=config.sampling.max_tokens,
        temperature=config.sampling.temperature,
    )
    return harness, (*python_tool_paths(), *kind.read_only_paths())


async def main(config: SweGrpoConfig, *, recipe: str = "swe_grpo") -> None:
    tasks = config.tasks.build()
    run = RunDirectory.create(config, recipe=recipe)
    harnesses = {name: build_harness(config, kind) for name, kind in harness_kinds(config).items()}
    sandbox_paths = tuple(dict.fromkeys(path for _, paths in harnesses.values() for path in paths))
    async with RunStack.start(config, run, sandbox_paths=sandbox_paths) as stack, AsyncExitStack() as exits:
        sandboxes, grader = await config.tasks.environment(tasks, stack.sandboxes, sandbox_paths, exits)
        grader, group_reward, reward_weights = config.reward.build(grader)
        runners = {
            RolloutRunner(
                RolloutConfig(group_size=config.group_size, max_concurrency=config.rollout.max_concurrency),
                harness=harness,
                sandboxes=sandboxes,
                sessions=stack.sessions,
                proxy_url=stack.proxy_url,
                session_keys=stack.session_keys,
                grader=grader,
                group_reward=group_reward,
                reward_weights=reward_weights,
            ): harness_weights(config.harness)[name]
            for name, (harness, _) in harnesses.items()
        }
        runner = (
            next(iter(runners))
            if len(runners) == 1
            else HarnessMix(runners, within_groups=config.harness_mix_within_groups)
        )
        await run_recipe_loop(
            config,
            run,
            stack,
            runner,
            lambda step: tasks_for_step(tasks, step=step, num_tasks=config.num_tasks),
        )
    print(f"run directory: {run.path}")


if __name__ == "__main__":
    main_entry(main, SweGrpoConfig, __doc__)
