"""ART's third toy: Temporal Clue, a Clue-style deduction puzzle with time and place clues
(``components/tasks/toys/temporal_clue.py``: seeded generator, exact checker). The policy reads the clues and
accuses one suspect (by text, or through the ``accuse`` tool); reward: the fraction of suspect, weapon, room and
time it got right. Every other option (algorithm, rollout mode, distillation, ...) is the shared ``RunConfig``'s.

    python recipes/temporal_clue_grpo.py --model tiny --num-steps 2 --puzzle-size 3
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from components.config import require_positive
from components.proxy.providers import LocalProxyConfig, ProxyBrickConfig
from components.recipe_config import option, slot
from components.registry import PROXIES
from components.rollout import RolloutConfig, RolloutRunner
from components.run.config import RunConfig, SamplingBrickConfig
from components.run.directory import RunDirectory
from components.run.entry import main_entry
from components.run.loop import run_recipe_loop
from components.run.stack import RunStack
from components.tasks.toys.temporal_clue import TemporalClueConfig, TemporalClueEnv
from components.training.step import OptimizerConfig
from components.training.trainer_config import TrainerBrickConfig
from harnesses.toy_agent import ToyAgentConfig, ToyAgentHarness, ToyGameTask

SYSTEM_PROMPT = "You solve deduction puzzles. Name the murderer, the weapon, the room and the time."
ANSWER_INSTRUCTION = "Answer in one line: suspect, weapon, room, time."


@dataclass(kw_only=True, frozen=True)
class TemporalClueGrpoConfig(RunConfig):
    """The Temporal Clue GRPO run (fields shared by all recipes: see ``RunConfig``)."""

    num_steps: int = option(4, "training steps")
    group_size: int = option(4, "answers per puzzle per step (one GRPO group)")
    sampling: SamplingBrickConfig = option(SamplingBrickConfig(max_tokens=64), "the policy's sampling")
    trainer: TrainerBrickConfig = option(
        TrainerBrickConfig(optimizer=OptimizerConfig(learning_rate=2e-5)), "the trainer"
    )
    proxy: ProxyBrickConfig = slot(
        PROXIES, LocalProxyConfig(), "the inference proxy (in the driver: no Serve start-up)"
    )
    puzzles_per_step: int = option(2, "seeded puzzles (GRPO groups) per step")
    puzzle_size: int = option(4, "suspects = weapons = rooms = times per puzzle (3 to 5)")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self.puzzles_per_step, "puzzles_per_step")
        TemporalClueConfig(size=self.puzzle_size)  # validates puzzle_size


def puzzles_for_step(config: TemporalClueGrpoConfig, step: int) -> list[ToyGameTask]:
    """This step's seeded puzzles (new seeds every step, the same for every sample of a group)."""
    make_env = functools.partial(TemporalClueEnv, TemporalClueConfig(size=config.puzzle_size))
    seeds = [
        config.seed * 100_000 + step * config.puzzles_per_step + i for i in range(config.puzzles_per_step)
    ]
    return [ToyGameTask(task_id=f"temporal-clue-{seed}", make_env=make_env, seed=seed) for seed in seeds]


async def train(config: TemporalClueGrpoConfig) -> RunDirectory:
    """Train on ``puzzles_for_step``'s puzzles; returns the run directory."""
    run = RunDirectory.create(config, recipe="temporal_clue_grpo")
    harness = ToyAgentHarness(
        ToyAgentConfig(
            max_turns=2,
            max_tokens=config.sampling.max_tokens,
            temperature=config.sampling.temperature,
            accept_text_moves=True,
            offer_tools=False,  # the default model's chat template has no tool support
            text_move_instruction=ANSWER_INSTRUCTION,
            system_prompt=SYSTEM_PROMPT,
        )
    )
    async with RunStack.start(config, run) as stack:
        runner = RolloutRunner(
            RolloutConfig(group_size=config.group_size, max_concurrency=config.rollout.max_concurrency),
            harness=harness,
            sandboxes=stack.sandboxes,
            sessions=stack.sessions,
            proxy_url=stack.proxy_url,
            session_keys=stack.session_keys,
            grader=harness.reward,
        )
        await run_recipe_loop(config, run, stack, runner, functools.partial(puzzles_for_step, config))
    return run


async def main(config: TemporalClueGrpoConfig) -> None:
    run = await train(config)
    print(f"run directory: {run.path}")


if __name__ == "__main__":
    main_entry(main, TemporalClueGrpoConfig, __doc__)
