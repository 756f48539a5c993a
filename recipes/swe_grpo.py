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
all recipes share: ``components/loop.py``). Placement, run directory and resume: see ``components/launch.py``.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from components.config import require, require_positive
from components.launch import (
    RunConfig,
    RunDirectory,
    RunStack,
    SamplingBrickConfig,
    main_entry,
    tasks_for_step,
)
from components.loop import run_recipe_loop
from components.protocols import Harness
from components.recipe_config import option, slot
from components.registry import REWARDS
from components.rewards.config import HiddenTestsRewardConfig, RewardBrickConfig
from components.rollout import RolloutConfig, RolloutRunner
from components.rollout.mixture import HarnessMix
from components.tasks import SweGrader, load_builtin_tasks
from components.tasks.swe import python_tool_paths
from components.tasks.swebench import R2E_TESTS_PATH, SnapshotPrefetcher, load_task_set
from components.tasks.swebench_grading import SweBenchGrader
from sandboxes import BwrapSandbox
from sandboxes.image import ImageSandboxConfig, ImageSandboxProvider


def _black_box_agents():
    """The unmodified agents by the name a user types (each builds its ``AgentSpec``)."""
    from harnesses.claude_code import ClaudeCodeAgent
    from harnesses.codex import CodexAgent
    from harnesses.gemini_cli import GeminiCliAgent
    from harnesses.mini_swe_agent import MiniSweAgent
    from harnesses.openclaw import OpenClawAgent
    from harnesses.opencode import OpencodeAgent
    from harnesses.qwen_code import QwenCodeAgent

    return {
        "mini_swe_agent": lambda config: MiniSweAgent(),
        "claude_code": lambda config: ClaudeCodeAgent(bare=config.claude_code_bare),
        "codex": lambda config: CodexAgent(),
        "opencode": lambda config: OpencodeAgent(),
        "openclaw": lambda config: OpenClawAgent(),
        "qwen_code": lambda config: QwenCodeAgent(),
        "gemini_cli": lambda config: GeminiCliAgent(),
    }


HARNESSES = (
    *(
        "swe_agent",
        "mini_swe_agent",
        "claude_code",
        "codex",
        "opencode",
        "openclaw",
        "qwen_code",
        "gemini_cli",
    ),
)


def harness_weights(spec: str) -> dict[str, float]:
    """``claude_code,codex`` or ``claude_code:2,codex:1`` → harness name → weight (default 1)."""
    weights: dict[str, float] = {}
    for item in spec.split(","):
        name, _, weight = item.strip().partition(":")
        require(name in HARNESSES, "harness", f"{name!r} is not one of {HARNESSES} (in {spec!r})")
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
        "the agent: white-box swe_agent, or black-box mini_swe_agent / claude_code / codex / opencode / openclaw /"
        " qwen_code / gemini_cli; several, comma-separated with optional weights (claude_code:2,codex:1), split the GRPO"
        " groups between them",
    )
    harness_mix_within_groups: bool = option(
        False, "with several harnesses: spread each group's samples over them (default: a group, one harness)"
    )
    claude_code_bare: bool = option(True, "claude_code: --bare mode (~1k prompt tokens instead of ~20k)")
    num_tasks: int = option(2, "tasks (GRPO groups) per step, taken in order from the task list")
    task_ids: tuple[str, ...] = option((), "comma-separated built-in task ids to train on (default: all 45)")
    tasks: str = option("builtin", "builtin, swebench:PATH or r2e:PATH (Parquet / JSONL rows)")
    images: str = option("", "image store for swebench:/r2e: tasks (OCI layouts / docker archives)")
    snapshots: str = option("", "repository snapshots for swebench:/r2e: tasks (<instance_id>[.tar.gz])")
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


def build_harness(config: SweGrpoConfig, name: str) -> tuple[Harness, tuple[str, ...]]:
    """The harness ``name``, and the host paths its sandboxes need read-only (kept warm by the pool)."""
    if name == "swe_agent":
        from harnesses.swe_agent import SweAgentConfig, SweAgentHarness

        agent_config = SweAgentConfig(
            max_turns=config.max_turns,
            wall_time_s=config.wall_time_s,
            max_tokens=config.sampling.max_tokens,
            temperature=config.sampling.temperature,
        )
        return SweAgentHarness(agent_config), python_tool_paths()
    from harnesses.blackbox import BlackBoxConfig, BlackBoxHarness

    agent = _black_box_agents()[name](config)
    harness = BlackBoxHarness(
        agent,
        BlackBoxConfig(
            max_turns=config.max_turns,
            wall_time_s=config.wall_time_s,
            max_output_tokens=config.sampling.max_tokens,
        ),
    )
    return harness, (*python_tool_paths(), *agent.read_only_paths())


def load_tasks(config: SweGrpoConfig) -> list:
    """The built-in tasks, or those named by ``task_ids`` (an unknown id fails naming the field); or a
    SWE-bench-format set (``tasks``), whose bad rows are reported and skipped."""
    if config.tasks != "builtin":
        loaded = load_task_set(
            config.tasks,
            images=Path(config.images) if config.images else None,
            snapshots=Path(config.snapshots) if config.snapshots else None,
        )
        for row in loaded.rejected:
            print(f"skipped instance {row.instance_id}: {row.reason}")
        require(bool(loaded.tasks), "tasks", f"no usable instance in {config.tasks}")
        return loaded.tasks
    tasks = load_builtin_tasks()
    if not config.task_ids:
        return tasks
    by_id = {task.task_id: task for task in tasks}
    unknown = [task_id for task_id in config.task_ids if task_id not in by_id]
    require(not unknown, "task_ids", f"unknown task ids {unknown}; known: {sorted(by_id)}")
    return [by_id[task_id] for task_id in config.task_ids]


async def swebench_sandboxes(config: SweGrpoConfig, stack: RunStack, tasks: list, agent_paths, exits):
    """SWE-bench-format tasks: agents and grader on the tasks' images (a pool per image; R2E-Gym's hidden
    tests hidden from agents), or on the host root when the set has no image store."""
    exits.callback(SnapshotPrefetcher(tasks).start().stop)  # first unpacks off the rollout event loop
    if not any(task.image for task in tasks):
        return stack.sandboxes, SweBenchGrader(BwrapSandbox.create)
    hidden = (R2E_TESTS_PATH,) if config.tasks.startswith("r2e:") else ()
    agents = ImageSandboxProvider(ImageSandboxConfig(read_only_paths=tuple(agent_paths), hidden_paths=hidden))
    grading = ImageSandboxProvider(ImageSandboxConfig(num_warm_per_image=0))
    for provider in (agents, grading):
        await exits.enter_async_context(provider)
    return agents, SweBenchGrader(grading)


async def main(config: SweGrpoConfig, *, recipe: str = "swe_grpo") -> None:
    tasks = load_tasks(config)
    run = RunDirectory.create(config, recipe=recipe)
    harnesses = {name: build_harness(config, name) for name in harness_weights(config.harness)}
    sandbox_paths = tuple(dict.fromkeys(path for _, paths in harnesses.values() for path in paths))
    async with RunStack.start(config, run, sandbox_paths=sandbox_paths) as stack, AsyncExitStack() as images:
        # Grading gets fresh sandboxes of its own, never the agent's.
        sandboxes, grader = stack.sandboxes, SweGrader(BwrapSandbox.create)
        if config.tasks != "builtin":
            sandboxes, grader = await swebench_sandboxes(config, stack, tasks, sandbox_paths, images)
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
