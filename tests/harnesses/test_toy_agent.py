"""The toy-game agent: a scripted policy plays tic-tac-toe and 2048 through the real proxy (OpenAI SDK, tool
calls), the game referees, and the runner turns each game into a graded trajectory."""

from __future__ import annotations

import json

import pytest

from components.engine.scripted_policies import tool_call
from components.rollout import RolloutConfig, RolloutRunner
from components.tasks.toys import Game2048Env, TicTacToeEnv
from components.tito.messages import ToolCall
from components.trajectory import TrajectoryStatus
from harnesses.toy_agent import ToyAgentConfig, ToyAgentHarness, ToyGameTask

pytestmark = pytest.mark.timeout(300)


def last_board(text: str) -> list[str]:
    """The 9 cells of the last board rendered in ``text``."""
    rows = [line for line in text.splitlines() if line[:3] in ("A  ", "B  ", "C  ")][-3:]
    return [cell.strip() for row in rows for cell in row[3:].split("|")]


def first_free_cell(prompt: str) -> str:
    """The policy: play the first free cell of the current board (always legal)."""
    board = last_board(prompt)
    index = board.index("")
    return tool_call("make_move", cell=f"{'ABC'[index // 3]}{index % 3 + 1}")


def replay_first_free_cell(seed: int) -> float:
    """The reward the same strategy gets when played directly against the environment."""
    env = TicTacToeEnv()
    observation, done = env.reset(seed), False
    while not done:
        call = json.loads(first_free_cell(observation).split("\n")[1])
        observation, done = env.step(
            ToolCall(id="c", name=call["name"], arguments=json.dumps(call["arguments"]))
        )
    return env.reward()


def _runner(proxy, harness, pool, **config) -> RolloutRunner:
    return RolloutRunner(
        RolloutConfig(**{"group_size": 1, "max_concurrency": 4, **config}),
        harness=harness,
        sandboxes=pool,
        sessions=proxy.registry,
        proxy_url=proxy.url,
        grader=harness.reward,
    )


async def test_scripted_policy_plays_tictactoe_to_the_end(scripted_proxy, sandbox_pool):
    seeds = [0, 1, 2]
    tasks = [ToyGameTask(task_id=f"tictactoe-{seed}", make_env=TicTacToeEnv, seed=seed) for seed in seeds]
    harness = ToyAgentHarness(ToyAgentConfig(max_turns=10))
    async with scripted_proxy(first_free_cell) as proxy:
        trajectories = await _runner(proxy, harness, sandbox_pool, group_size=2).run(tasks, step=4)
    assert len(trajectories) == 6
    for trajectory in trajectories:
        seed = int(trajectory.task_id.rsplit("-", 1)[1])
        assert trajectory.status == TrajectoryStatus.OK, trajectory.failure_reason
        assert trajectory.reward == replay_first_free_cell(seed)
        assert trajectory.reward == trajectory.metrics["game_reward"]
        assert (
            3 <= trajectory.metrics["num_moves"] <= 5
            and trajectory.metrics["num_turns"] == trajectory.metrics["num_moves"]
        )
        assert trajectory.segments and trajectory.segments[0].num_sampled_tokens > 0
        # a process reward per model call, on the turn it was earned: 1 for each legal move
        turn_rewards = [r for s in trajectory.segments for r in s.turn_rewards.tolist()]
        assert turn_rewards == [1.0] * int(trajectory.metrics["num_turns"])
        final = trajectory.messages[-1]  # the winning / drawing / losing move, as the proxy parsed it
        assert final["role"] == "assistant" and final["tool_calls"][0]["name"] == "make_move"


async def test_illegal_move_ends_the_game_and_turn_limit_is_kept(scripted_proxy, sandbox_pool):
    harness = ToyAgentHarness(ToyAgentConfig(max_turns=3))
    illegal = ToyGameTask(task_id="tictactoe-illegal", make_env=TicTacToeEnv, seed=0)
    game_2048 = ToyGameTask(task_id="2048-0", make_env=Game2048Env, seed=0)

    def policy(prompt: str) -> str:
        if "tic-tac-toe" in prompt:
            return tool_call("make_move", cell="Z9")
        return tool_call("move", direction="left") if "no tool call" in prompt else "Let me think."

    async with scripted_proxy(policy) as proxy:
        first, second = await _runner(proxy, harness, sandbox_pool).run([illegal, game_2048], step=0)
    assert first.status == TrajectoryStatus.OK and first.reward == 0.0  # an illegal move loses: game over
    assert "Illegal move" in first.log
    assert first.segments[0].turn_rewards.tolist() == [0.0]  # the illegal move earns nothing
    assert second.status == TrajectoryStatus.TURN_LIMIT and second.trainable
    assert second.reward == second.metrics["game_reward"]
    assert second.metrics["num_text_only_replies"] >= 1
    # 2048: thinking aloud earns 0; each move earns what it raised the game's reward (they sum to it)
    rewards_2048 = [r for s in second.segments for r in s.turn_rewards.tolist()]
    assert len(rewards_2048) == 3 and rewards_2048[0] == 0.0
    assert sum(rewards_2048) == pytest.approx(second.reward - _start_reward_2048())


def _start_reward_2048() -> float:
    env = Game2048Env()
    env.reset(0)
    return env.reward()


def first_free_cell_as_text(prompt: str) -> str:
    """The same strategy, written as text (no tool call): ``<move>A1</move>``."""
    board = last_board(prompt)
    index = board.index("")
    return f"I play <move>{'ABC'[index // 3]}{index % 3 + 1}</move>."


async def test_text_moves_are_played_only_when_accepted(scripted_proxy, sandbox_pool):
    seeds = [0, 1]
    tasks = [ToyGameTask(task_id=f"tictactoe-{seed}", make_env=TicTacToeEnv, seed=seed) for seed in seeds]
    accepting = ToyAgentHarness(
        ToyAgentConfig(
            max_turns=10,
            accept_text_moves=True,
            offer_tools=False,
            example_turns=(("An example turn.", "<move>C3</move>"),),
        )
    )
    strict = ToyAgentHarness(ToyAgentConfig(max_turns=3))
    prompts_seen: list[str] = []

    def policy(prompt: str) -> str:
        prompts_seen.append(prompt)
        return first_free_cell_as_text(prompt)

    async with scripted_proxy(policy) as proxy:
        played = await _runner(proxy, accepting, sandbox_pool).run(tasks, step=0)
        ignored = await _runner(proxy, strict, sandbox_pool).run(tasks[:1], step=1)
    for trajectory in played:
        seed = int(trajectory.task_id.rsplit("-", 1)[1])
        assert trajectory.status == TrajectoryStatus.OK, trajectory.failure_reason
        assert trajectory.reward == replay_first_free_cell(seed)  # the same game as with tool calls
        assert trajectory.metrics["num_text_moves"] == trajectory.metrics["num_moves"] >= 3
        assert trajectory.metrics["num_text_only_replies"] == 0
        prompts = [m["content"] for m in trajectory.messages if m["role"] == "user"][1:]  # after the example
        assert prompts and all("Empty cells:" in p and "<move>B2</move>" in p for p in prompts)
    text_only_prompts = prompts_seen[: sum(int(t.metrics["num_turns"]) for t in played)]
    assert all("make_move" not in p and "An example turn." in p for p in text_only_prompts)  # no tool schemas
    assert "make_move" in prompts_seen[-1]  # the strict harness offers its tools
    (strict_game,) = ignored
    assert strict_game.status == TrajectoryStatus.TURN_LIMIT and strict_game.reward == 0.0
    assert strict_game.metrics["num_moves"] == 0 and strict_game.metrics["num_text_only_replies"] == 3


def test_text_only_play_needs_text_moves():
    with pytest.raises(ValueError, match="offer_tools"):
        ToyAgentConfig(offer_tools=False)


async def test_a_graders_turn_rewards_replace_the_harnesss(scripted_proxy, sandbox_pool):
    """``RewardResult.turn_rewards`` (a process-reward grader) take the place of the harness's per-call rewards."""
    from components.protocols import RewardResult

    harness = ToyAgentHarness(ToyAgentConfig(max_turns=3))

    class ProcessGrader:
        async def score(self, task, agent_sandbox):
            game = await harness.reward.score(task, agent_sandbox)
            return RewardResult(reward=game.reward, turn_rewards=(0.25,))  # one call: the illegal move

    illegal = ToyGameTask(task_id="tictactoe-illegal", make_env=TicTacToeEnv, seed=0)
    async with scripted_proxy(lambda prompt: tool_call("make_move", cell="Z9")) as proxy:
        runner = _runner(proxy, harness, sandbox_pool)
        runner.grader = ProcessGrader()
        (trajectory,) = await runner.run([illegal], step=0)
    assert trajectory.status == TrajectoryStatus.OK and trajectory.reward == 0.0
    assert [s.turn_rewards.tolist() for s in trajectory.segments] == [[0.25]]  # not the harness's [0.0]
