"""ART-style toy: the policy plays tic-tac-toe (as X, through a ``make_move`` tool) and learns with GRPO.

    python recipes/tictactoe_grpo.py                       # SmolLM2-135M, a short run on CPU
    python recipes/tictactoe_grpo.py --num-steps 30 --games-per-step 4 --group-size 4
    python recipes/tictactoe_grpo.py --help                # every field, its meaning and default

Each step: roll out ``games_per_step`` seeded games × ``group_size`` through the proxy → write one trajectory
shard → one GRPO step → push the new weights to the engine → log (and checkpoint); ``--rollout-mode async``
or ``partial`` overlaps rollouts and training (the loop all recipes share: ``components/run/loop.py``).
Reward: win 1, draw 0.5,
loss or illegal move 0. ``--accept-text-moves`` (on by default) plays by text (no tool schemas), since the
default model's chat template has no tool support (see ``harnesses/toy_agent.py``).
Placement, run directory and resume: see ``components/run/__init__.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from components.config import require_positive
from components.protocols import Harness, Reward
from components.proxy.providers import LocalProxyConfig, ProxyBrickConfig
from components.recipe_config import option, slot
from components.registry import PROXIES
from components.rollout import RolloutConfig, RolloutRunner
from components.run.config import RolloutBrickConfig, RunConfig, SamplingBrickConfig
from components.run.directory import RunDirectory
from components.run.entry import main_entry
from components.run.loop import run_recipe_loop
from components.run.stack import RunStack
from components.tasks.toys import TicTacToeConfig, TicTacToeEnv
from components.tasks.toys.tictactoe import cell_name
from components.tito.messages import ToolCall
from components.training.step import OptimizerConfig
from components.training.trainer_config import TrainerBrickConfig
from harnesses.toy_agent import ToyAgentConfig, ToyAgentHarness, ToyGameTask

TOOL_SYSTEM_PROMPT = "You are playing a game. Make each move by calling a tool."
TEXT_MOVE_SYSTEM_PROMPT = (
    "You are playing tic-tac-toe as X. Make each move by writing one empty cell as <move>B2</move>."
)


@dataclass(kw_only=True, frozen=True)
class TicTacToeGrpoConfig(RunConfig):
    """The tic-tac-toe GRPO run (fields shared by all recipes: see ``RunConfig``)."""

    num_steps: int = option(4, "training steps")
    group_size: int = option(4, "games per seed per step (one GRPO group)")
    rollout: RolloutBrickConfig = option(RolloutBrickConfig(max_concurrency=8), "rollout scheduling")
    sampling: SamplingBrickConfig = option(SamplingBrickConfig(max_tokens=48), "the policy's sampling")
    trainer: TrainerBrickConfig = option(
        TrainerBrickConfig(optimizer=OptimizerConfig(learning_rate=2e-5)), "the trainer"
    )
    proxy: ProxyBrickConfig = slot(
        PROXIES, LocalProxyConfig(), "the inference proxy (in the driver: no Serve start-up)"
    )
    games_per_step: int = option(2, "seeded games (GRPO groups) per step")
    opponent: Literal["random", "perfect"] = option("random", "the opponent: random legal moves or minimax")
    max_turns: int = option(6, "model calls per game (a game needs at most 5 moves)")
    accept_text_moves: bool = option(
        True,
        "play by text: moves written as <move>B2</move> or a bare cell, no tool schemas in the prompt",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self.games_per_step, "games_per_step")
        require_positive(self.max_turns, "max_turns")


def text_move_example() -> tuple[str, str]:
    """One demonstrated turn for the text-move prompt: a mid-game board (not a training seed) and a legal reply."""
    env = TicTacToeEnv()
    env.reset(seed=-1)
    observation, _ = env.step(ToolCall(id="example", name="make_move", arguments='{"cell": "B2"}'))
    cell = next(cell_name(i) for i in (0, 2, 6, 8, 1, 3, 5, 7) if env.board[i] == " ")
    return f"{observation}\n{ToyAgentConfig.text_move_instruction}", f"<move>{cell}</move>"


def games_for_step(config: TicTacToeGrpoConfig, step: int) -> list[ToyGameTask]:
    """This step's seeded games (new seeds every step, the same for every sample of a group)."""
    make_env = functools.partial(TicTacToeEnv, TicTacToeConfig(opponent=config.opponent))
    seeds = [config.seed * 100_000 + step * config.games_per_step + i for i in range(config.games_per_step)]
    return [ToyGameTask(task_id=f"tictactoe-{seed}", make_env=make_env, seed=seed) for seed in seeds]


def toy_harness(config: TicTacToeGrpoConfig) -> ToyAgentHarness:
    """The recipe's agent: plays each game through the proxy, by text moves or tool calls."""
    return ToyAgentHarness(
        ToyAgentConfig(
            max_turns=config.max_turns,
            max_tokens=config.sampling.max_tokens,
            temperature=config.sampling.temperature,
            accept_text_moves=config.accept_text_moves,
            offer_tools=not config.accept_text_moves,  # the tool schemas only confuse a model without tool support
            example_turns=(text_move_example(),) if config.accept_text_moves else (),
            system_prompt=TEXT_MOVE_SYSTEM_PROMPT if config.accept_text_moves else TOOL_SYSTEM_PROMPT,
        )
    )


async def train(
    config: TicTacToeGrpoConfig, *, harness: Harness | None = None, grader: Reward | None = None
) -> RunDirectory:
    """Train on ``games_for_step``'s games; returns the run directory. ``harness`` and ``grader`` default to
    ``toy_harness(config)`` and its reward; a caller passes its own to wrap the agent (latency, instrumentation:
    the wrapper's grader is then the wrapped toy harness's ``reward``)."""
    run = RunDirectory.create(config, recipe="tictactoe_grpo")
    if harness is None:
        toy = toy_harness(config)
        harness, grader = toy, grader or toy.reward
    if grader is None:
        raise ValueError("a harness passed to train() needs its grader (the toy harness's .reward)")
    async with RunStack.start(config, run) as stack:
        runner = RolloutRunner(
            RolloutConfig(group_size=config.group_size, max_concurrency=config.rollout.max_concurrency),
            harness=harness,
            sandboxes=stack.sandboxes,
            sessions=stack.sessions,
            proxy_url=stack.proxy_url,
            session_keys=stack.session_keys,
            grader=grader,
        )
        await run_recipe_loop(config, run, stack, runner, functools.partial(games_for_step, config))
    return run


async def main(config: TicTacToeGrpoConfig) -> None:
    run = await train(config)
    print(f"run directory: {run.path}")


if __name__ == "__main__":
    main_entry(main, TicTacToeGrpoConfig, __doc__)
