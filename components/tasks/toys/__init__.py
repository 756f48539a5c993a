"""ART-style toy environments: small, seeded, pure-Python games played through tool calls.

Interface (``ToyEnvironment``), meant for a white-box multi-turn agent that talks to the policy through the
OpenAI SDK:

    env = TicTacToeEnv(TicTacToeConfig(opponent="random"))
    observation = env.reset(seed=7)                 # first user message: rules + board
    tools = [spec.to_openai() for spec in env.tools()]
    while True:
        ...                                         # ask the policy, get one tool call
        observation, done = env.step(ToolCall(id=..., name=..., arguments=json_text))
        if done: break                              # else send `observation` back as the tool result
    reward = env.reward()                           # in [0, 1]
    env.turn_reward()                               # after a step: that move's process reward (turn credit)

A call that is not a legal move (unknown tool, unparsable arguments, occupied cell, unknown direction) ends
the episode; its observation says why. ``step`` after the end raises ``ValueError``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from components.tito.messages import ToolCall, ToolSpec


@runtime_checkable
class ToyEnvironment(Protocol):
    """A seeded game played through tool calls; ``reward()`` is in [0, 1] and final once ``done``;
    ``turn_reward()`` is the process reward of the last ``step`` (0 before any)."""

    name: str

    def tools(self) -> list[ToolSpec]: ...

    def reset(self, seed: int | None = None) -> str: ...

    def step(self, tool_call: ToolCall) -> tuple[str, bool]: ...

    def reward(self) -> float: ...

    def turn_reward(self) -> float: ...


from components.tasks.toys.game_2048 import Game2048Config, Game2048Env  # noqa: E402
from components.tasks.toys.tictactoe import TicTacToeConfig, TicTacToeEnv  # noqa: E402

__all__ = ["Game2048Config", "Game2048Env", "TicTacToeConfig", "TicTacToeEnv", "ToyEnvironment"]
