"""A white-box multi-turn agent for the ART-style toy games (``components.tasks.toys``): the policy plays
through the game's tools via the OpenAI SDK; the game itself is the referee.

The game runs in the harness process, so the rollout's sandbox only satisfies the runner (an empty one, no
network). The reward is the game's own (``env.reward()``): the harness records it per sandbox, and
``ToyGameReward`` (the runner's grader) reads it back, so toy rollouts go through the same runner, proxy
sessions and trajectories as the SWE tasks::

    harness = ToyAgentHarness(ToyAgentConfig(max_turns=12))
    tasks = [ToyGameTask(task_id=f"tictactoe-{seed}", make_env=TicTacToeEnv, seed=seed) for seed in range(8)]
    runner = RolloutRunner(config, harness=harness, grader=harness.reward, ...)

``accept_text_moves`` (off by default): a reply with no tool call is read as a move written as text when the
game offers ``text_move(text) -> ToolCall | None`` (tic-tac-toe: ``<move>B2</move>`` or a bare cell name, as
in ART's own tic-tac-toe example); the observation then comes back as a user message, followed by
``text_move_instruction``. For models whose chat template has no tool support (SmolLM2), where
``offer_tools=False`` also leaves the tool schemas out of the prompt. A reply with neither a tool call nor a
readable move gets ``NO_MOVE_REMINDER`` (or, when text moves are read, the instruction again).
``example_turns`` are (user, assistant) demonstration pairs put after the system prompt (a few-shot
example of the reply format; prompt tokens, never trained on).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI

from components.config import require, require_non_negative, require_positive
from components.protocols import HarnessOutcome, RewardResult, Sandbox, SandboxSpec, Task
from components.rollout.failures import outcome_from_exception
from components.rollout.log_text import clip_text
from components.tasks.toys import ToyEnvironment
from components.tito.messages import ToolCall
from components.trajectory import TrajectoryStatus

NO_MOVE_REMINDER = "Your reply had no tool call. Make your move by calling one of the tools."


@dataclass(frozen=True, kw_only=True)
class ToyGameTask:
    """One seeded game as a ``Task``: ``make_env()`` builds the environment, ``seed`` fixes the game."""

    task_id: str
    make_env: Callable[[], ToyEnvironment]
    seed: int = 0
    problem_statement: str = ""  # filled with the game's opening text when empty

    def __post_init__(self) -> None:
        require(bool(self.task_id), "task_id", "must be non-empty")
        require(callable(self.make_env), "make_env", "must build a ToyEnvironment")
        if not self.problem_statement:
            object.__setattr__(self, "problem_statement", self.make_env().reset(self.seed))

    def sandbox_spec(self) -> SandboxSpec:
        """The game needs nothing from its sandbox: empty, no network."""
        return SandboxSpec()


@dataclass(kw_only=True, frozen=True)
class ToyAgentConfig:
    """Bounds and sampling of the toy-game agent."""

    max_turns: int = 30  # model calls; running out ends the game with status turn_limit (reward so far)
    wall_time_s: float = 300.0
    max_tokens: int = 256  # per reply
    temperature: float = 1.0
    model: str = "policy"
    system_prompt: str = "You are playing a game. Make each move by calling a tool."
    max_retries: int = 1
    max_log_chars: int = 50_000
    accept_text_moves: bool = False  # read a move written as text when a reply has no tool call
    text_move_instruction: str = "Reply with one empty cell, like <move>B2</move>."
    offer_tools: bool = True  # send the game's tool schemas (False: text moves only; needs accept_text_moves)
    example_turns: tuple[
        tuple[str, str], ...
    ] = ()  # (user, assistant) demonstrations after the system prompt

    def __post_init__(self) -> None:
        for name in ("max_turns", "wall_time_s", "max_tokens", "max_log_chars"):
            require_positive(getattr(self, name), name)
        require_non_negative(self.temperature, "temperature")
        require_non_negative(self.max_retries, "max_retries")
        require(bool(self.model), "model", "must be a non-empty model name")
        require(
            self.offer_tools or self.accept_text_moves, "offer_tools", "False needs accept_text_moves=True"
        )


class ToyGameReward:
    """The grader of toy games: the reward the game gave in the run that used this sandbox."""

    def __init__(self) -> None:
        self._rewards: dict[str, float] = {}

    def record(self, sandbox: Sandbox, reward: float) -> None:
        """Keep the game's reward for the run in ``sandbox`` (read once by ``score``)."""
        self._rewards[sandbox.sandbox_id] = reward

    async def score(self, task: Task, agent_sandbox: Sandbox) -> RewardResult:
        """The recorded reward; a run that recorded none cannot be graded."""
        reward = self._rewards.pop(agent_sandbox.sandbox_id, None)
        if reward is None:
            return RewardResult(
                reward=None, error=f"no game result recorded for sandbox {agent_sandbox.sandbox_id}"
            )
        return RewardResult(reward=reward, log=f"game reward {reward:g}")


class ToyAgentHarness:
    """Plays a ``ToyGameTask`` with the policy; ``reward`` is the grader to give the runner."""

    def __init__(self, config: ToyAgentConfig | None = None, *, name: str = "toy-agent") -> None:
        self.config = config or ToyAgentConfig()
        self.name = name
        self.reward = ToyGameReward()

    async def run(self, *, task: Task, sandbox: Sandbox, base_url: str, api_key: str) -> HarnessOutcome:
        """Play one game: model call → tool calls → game steps, until the game ends or a bound is hit."""
        if not isinstance(task, ToyGameTask):
            raise TypeError(f"ToyAgentHarness plays ToyGameTask, got {type(task).__name__}")
        config = self.config
        env = task.make_env()
        started = time.monotonic()
        counters = {
            "num_turns": 0,
            "num_moves": 0,
            "num_text_moves": 0,
            "num_text_only_replies": 0,
            "num_response_tokens": 0,
        }
        log_lines: list[str] = []
        turn_rewards: list[float] = []  # per model call: the process rewards of its moves (turn credit)

        def metrics() -> dict[str, float]:
            return {
                **{k: float(v) for k, v in counters.items()},
                "game_reward": env.reward(),
                "agent_wall_time_s": time.monotonic() - started,
            }

        client = AsyncOpenAI(
            base_url=f"{base_url.rstrip('/')}/v1", api_key=api_key, max_retries=config.max_retries
        )
        try:
            async with asyncio.timeout(config.wall_time_s) as deadline:
                done = await self._play(client, env, task.seed, counters, log_lines, turn_rewards)
        except TimeoutError as exc:
            if not deadline.expired():
                return outcome_from_exception(exc, metrics=metrics(), log="\n".join(log_lines))
            status, reason = TrajectoryStatus.TIMEOUT, f"game not over after {config.wall_time_s:g} s"
        except Exception as exc:
            return outcome_from_exception(exc, metrics=metrics(), log="\n".join(log_lines))
        else:
            status, reason = (
                (TrajectoryStatus.OK, "")
                if done
                else (TrajectoryStatus.TURN_LIMIT, f"game not over after {config.max_turns} turns")
            )
        finally:
            await client.close()
            self.reward.record(sandbox, env.reward())  # a game cut short still has its reward so far
        return HarnessOutcome(
            status=status.value,
            failure_reason=reason,
            metrics=metrics(),
            log=clip_text("\n".join(log_lines), config.max_log_chars),
            # a timed-out game may have lost the call it was waiting for: its count could be off
            turn_rewards=tuple(turn_rewards) if status != TrajectoryStatus.TIMEOUT else (),
        )

    def _with_instruction(self, observation: str, text_move: Callable[[str], ToolCall | None] | None) -> str:
        """The observation, plus the text-move instruction when text moves are read."""
        if text_move is None or not self.config.text_move_instruction:
            return observation
        return f"{observation}\n{self.config.text_move_instruction}"

    async def _play(
        self,
        client: AsyncOpenAI,
        env: ToyEnvironment,
        seed: int,
        counters: dict[str, int],
        log: list[str],
        turn_rewards: list[float],
    ) -> bool:
        config = self.config
        tools = [spec.to_openai() for spec in env.tools()] if config.offer_tools else []
        observation = env.reset(seed)
        text_move = getattr(env, "text_move", None) if config.accept_text_moves else None
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": config.system_prompt},
            *(
                {"role": role, "content": text}
                for user_text, reply in config.example_turns
                for role, text in (("user", user_text), ("assistant", reply))
            ),
            {"role": "user", "content": self._with_instruction(observation, text_move)},
        ]
        log.append(observation)
        while counters["num_turns"] < config.max_turns:
            counters["num_turns"] += 1
            response = await client.chat.completions.create(
                model=config.model,
                messages=messages,
                max_tokens=config.max_tokens,
                temperature=config.temperature,
                **({"tools": tools} if tools else {}),
            )
            turn_rewards.append(0.0)  # this call's moves add their process rewards below
            if response.usage is not None:
                counters["num_response_tokens"] += response.usage.completion_tokens
            message = response.choices[0].message
            calls = message.tool_calls or []
            assistant: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if calls:
                assistant["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ]
            messages.append(assistant)
            if not calls:
                move = text_move(message.content or "") if text_move is not None else None
                if move is None:
                    counters["num_text_only_replies"] += 1
                    reminder = config.text_move_instruction if text_move is not None else ""
                    messages.append({"role": "user", "content": reminder or NO_MOVE_REMINDER})
                    continue
                observation, done = env.step(move)
                turn_rewards[-1] += env.turn_reward()
                counters["num_moves"] += 1
                counters["num_text_moves"] += 1
                log.append(f"> (text) {move.name} {move.arguments}\n{observation}")
                if done:
                    return True
                messages.append({"role": "user", "content": self._with_instruction(observation, text_move)})
                continue
            for call in calls:
                observation, done = env.step(
                    ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
                )
                turn_rewards[-1] += env.turn_reward()
                counters["num_moves"] += 1
                log.append(f"> {call.function.name} {call.function.arguments}\n{observation}")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
                if done:
                    return True
        return False
