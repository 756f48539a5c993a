"""2048 on a 4x4 board through a ``move(direction)`` tool, with seeded tile spawns.

Each move slides every tile as far as it goes in the direction; two equal tiles that meet merge once per move
(their sum is added to the score). After a move that changed the board a new tile appears in a random empty
cell (2 with probability 0.9, else 4). The game ends when ``target_tile`` is reached, no move can change the
board, ``max_moves`` moves were made, or a call is not a valid move.

Reward: ``log2(max tile) / log2(target_tile)``, capped at 1.0 (so 1.0 exactly when the target was reached).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from components.config import require, require_positive
from components.tito.messages import ToolCall, ToolSpec

SIZE = 4
DIRECTIONS = ("up", "down", "left", "right")
MOVE = ToolSpec(
    name="move",
    description="Slide all tiles in one direction; equal tiles that collide merge.",
    parameters={
        "type": "object",
        "properties": {"direction": {"type": "string", "enum": list(DIRECTIONS)}},
        "required": ["direction"],
    },
)

Board = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, kw_only=True)
class Game2048Config:
    """How the game is set up."""

    target_tile: int = 2048  # a power of two >= 8; 64 or 128 make fast experiments
    max_moves: int = 1000

    def __post_init__(self) -> None:
        require(
            self.target_tile >= 8 and self.target_tile & (self.target_tile - 1) == 0,
            "target_tile",
            f"must be a power of two >= 8, got {self.target_tile}",
        )
        require_positive(self.max_moves, "max_moves")


def slide_row_left(row: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Slide and merge one row to the left; returns (new row, points scored)."""
    tiles = [value for value in row if value]
    merged: list[int] = []
    points = 0
    index = 0
    while index < len(tiles):
        if index + 1 < len(tiles) and tiles[index] == tiles[index + 1]:
            merged.append(tiles[index] * 2)
            points += tiles[index] * 2
            index += 2
        else:
            merged.append(tiles[index])
            index += 1
    return tuple(merged + [0] * (len(row) - len(merged))), points


def _transpose(board: Board) -> Board:
    return tuple(zip(*board, strict=True))


def slide(board: Board, direction: str) -> tuple[Board, int]:
    """The board after sliding in ``direction`` (no new tile), and the points scored."""
    if direction in ("up", "down"):
        moved, points = slide(_transpose(board), "left" if direction == "up" else "right")
        return _transpose(moved), points
    rows, points = [], 0
    for row in board:
        if direction == "right":
            new_row, gained = slide_row_left(row[::-1])
            new_row = new_row[::-1]
        else:
            new_row, gained = slide_row_left(row)
        rows.append(new_row)
        points += gained
    return tuple(rows), points


class Game2048Env:
    """One game of 2048 per ``reset``; see the module docstring for rules and reward."""

    name = "2048"

    def __init__(self, config: Game2048Config | None = None) -> None:
        self.config = config or Game2048Config()
        self.board: Board = tuple((0,) * SIZE for _ in range(SIZE))
        self.score = 0
        self.num_moves = 0
        self.done = True
        self.end_reason = ""
        self._rng = random.Random(0)
        self._reward_before_move = 0.0

    def tools(self) -> list[ToolSpec]:
        """The one tool: ``move(direction)``."""
        return [MOVE]

    def reset(self, seed: int | None = None) -> str:
        """Start a new game with two random tiles; returns the rules and the board."""
        self._rng = random.Random(seed)
        self.board = tuple((0,) * SIZE for _ in range(SIZE))
        self.score = 0
        self.num_moves = 0
        self.done = False
        self.end_reason = ""
        self._spawn_tile()
        self._spawn_tile()
        self._reward_before_move = self.reward()
        return (
            f"Let's play 2048. Use the move tool with direction up, down, left or right to slide the tiles; "
            f"equal tiles merge. Reach the {self.config.target_tile} tile to win. An invalid move ends the "
            f"game.\n{self.render()}"
        )

    def step(self, tool_call: ToolCall) -> tuple[str, bool]:
        """Apply one move (and spawn a tile if the board changed); returns (observation, done)."""
        if self.done:
            raise ValueError("the game is over; call reset() to start a new one")
        self._reward_before_move = self.reward()
        direction = self._requested_direction(tool_call)
        if direction not in DIRECTIONS:
            self._finish("invalid")
            return f"Invalid move: {direction} Game over.\n{self.render()}", True
        self.num_moves += 1
        moved, points = slide(self.board, direction)
        changed = moved != self.board
        if changed:
            self.board = moved
            self.score += points
            self._spawn_tile()
        note = "" if changed else "Nothing moved. "
        if self.max_tile() >= self.config.target_tile:
            self._finish("won")
            return f"{note}You reached {self.config.target_tile}! You win.\n{self.render()}", True
        if not any(slide(self.board, d)[0] != self.board for d in DIRECTIONS):
            self._finish("stuck")
            return f"{note}No moves left. Game over.\n{self.render()}", True
        if self.num_moves >= self.config.max_moves:
            self._finish("max_moves")
            return f"{note}Move limit reached. Game over.\n{self.render()}", True
        return f"{note}{self.render()}", False

    def turn_reward(self) -> float:
        """The last move's process reward: how much it raised ``reward()`` (0 for a move that merged nothing
        new, or an invalid one)."""
        return self.reward() - self._reward_before_move

    def reward(self) -> float:
        """``log2(max tile) / log2(target_tile)``, at most 1.0."""
        return min(1.0, math.log2(max(self.max_tile(), 1)) / math.log2(self.config.target_tile))

    def max_tile(self) -> int:
        """The largest tile on the board."""
        return max(max(row) for row in self.board)

    def render(self) -> str:
        """The board as text (``.`` for empty cells), with the score."""
        width = max(4, len(str(self.max_tile())))
        rows = [" ".join(str(v).rjust(width) if v else ".".rjust(width) for v in row) for row in self.board]
        return "\n".join(rows) + f"\nScore: {self.score}  Moves: {self.num_moves}/{self.config.max_moves}"

    def _requested_direction(self, tool_call: ToolCall) -> str:
        if tool_call.name != MOVE.name:
            return f"unknown tool {tool_call.name!r} (use move)."
        try:
            arguments = json.loads(tool_call.arguments or "{}")
        except json.JSONDecodeError:
            return f"arguments are not JSON: {tool_call.arguments[:100]!r}."
        raw = arguments.get("direction") if isinstance(arguments, dict) else None
        if isinstance(raw, str) and raw.strip().lower() in DIRECTIONS:
            return raw.strip().lower()
        return f"{raw!r} is not a direction (use up, down, left or right)."

    def _spawn_tile(self) -> None:
        empty = [(r, c) for r in range(SIZE) for c in range(SIZE) if not self.board[r][c]]
        if not empty:
            return
        row, col = self._rng.choice(empty)
        value = 2 if self._rng.random() < 0.9 else 4
        rows = [list(r) for r in self.board]
        rows[row][col] = value
        self.board = tuple(tuple(r) for r in rows)

    def _finish(self, reason: str) -> None:
        self.done = True
        self.end_reason = reason
