"""Tic-tac-toe: the agent plays X through a ``make_move`` tool against a seeded random or perfect opponent.

Cells are named by row letter and column number: ``A1`` (top left) ... ``C3`` (bottom right).
Reward: win 1.0, draw 0.5, loss 0.0; an illegal or malformed move ends the game with 0.0.
Every observation lists the empty cells. ``text_move`` reads a move written as text (``<move>B2</move>`` or
the first cell name in the reply) for agents that play without tool calls (ART's own tic-tac-toe does so).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import cache

from components.config import require_one_of
from components.tito.messages import ToolCall, ToolSpec

ROWS = "ABC"
LINES = (
    (0, 1, 2),
    (3, 4, 5),
    (6, 7, 8),
    (0, 3, 6),
    (1, 4, 7),
    (2, 5, 8),
    (0, 4, 8),
    (2, 4, 6),
)
MAKE_MOVE = ToolSpec(
    name="make_move",
    description="Place your X on an empty cell, named by row letter and column number (A1 top left, C3 bottom right).",
    parameters={
        "type": "object",
        "properties": {"cell": {"type": "string", "description": "The cell, e.g. 'B2'."}},
        "required": ["cell"],
    },
)


MOVE_TAG = re.compile(r"<move>\s*([A-Ca-c][1-3])\s*</move>")
CELL_WORD = re.compile(r"\b([A-Ca-c][1-3])\b")


@dataclass(frozen=True, kw_only=True)
class TicTacToeConfig:
    """How the game is set up."""

    # "random": a uniformly random legal move (seeded by reset); "perfect": minimax, never loses.
    opponent: str = "random"
    # Who opens: "agent" (X moves first) or "opponent".
    first_player: str = "agent"

    def __post_init__(self) -> None:
        require_one_of(self.opponent, "opponent", ("random", "perfect"))
        require_one_of(self.first_player, "first_player", ("agent", "opponent"))


def winner(board: tuple[str, ...]) -> str:
    """ "X" or "O" when a line is complete, "draw" when the board is full, "" while the game goes on."""
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if " " not in board else ""


@cache
def _minimax(board: tuple[str, ...], to_move: str) -> tuple[int, int]:
    """(score for O, best cell) with O maximising; cached over the few thousand positions."""
    result = winner(board)
    if result:
        return {"O": 1, "X": -1, "draw": 0}[result], -1
    best: tuple[int, int] | None = None
    for cell in range(9):
        if board[cell] != " ":
            continue
        child = board[:cell] + (to_move,) + board[cell + 1 :]
        score, _ = _minimax(child, "X" if to_move == "O" else "O")
        if best is None or (score > best[0] if to_move == "O" else score < best[0]):
            best = (score, cell)
    assert best is not None
    return best


def cell_name(index: int) -> str:
    """0 -> "A1", 8 -> "C3"."""
    return f"{ROWS[index // 3]}{index % 3 + 1}"


def parse_cell(text: str) -> int | None:
    """ "B2" (or "b2") -> 4; None when it is not a cell name."""
    text = text.strip().upper()
    if len(text) != 2 or text[0] not in ROWS or text[1] not in "123":
        return None
    return ROWS.index(text[0]) * 3 + int(text[1]) - 1


class TicTacToeEnv:
    """One game of tic-tac-toe per ``reset``; see the module docstring for rules and reward."""

    name = "tictactoe"

    def __init__(self, config: TicTacToeConfig | None = None) -> None:
        self.config = config or TicTacToeConfig()
        self.board: tuple[str, ...] = (" ",) * 9
        self.done = True
        self.outcome = ""  # "win" | "draw" | "loss" | "illegal"
        self.num_moves = 0
        self._rng = random.Random(0)

    def tools(self) -> list[ToolSpec]:
        """The one tool: ``make_move(cell)``."""
        return [MAKE_MOVE]

    def reset(self, seed: int | None = None) -> str:
        """Start a new game; returns the rules and the board."""
        self._rng = random.Random(seed)
        self.board = (" ",) * 9
        self.done = False
        self.outcome = ""
        self.num_moves = 0
        opening = ""
        if self.config.first_player == "opponent":
            opening = f"Your opponent (O) opened with {cell_name(self._opponent_move())}.\n"
        return (
            "Let's play tic-tac-toe. You are X, your opponent is O. Take turns placing your mark; three in a row "
            "(across, down or diagonal) wins. Cells are A1 (top left) to C3 "
            "(bottom right). An illegal move loses the game.\n" + opening + self.render_with_empty_cells()
        )

    def step(self, tool_call: ToolCall) -> tuple[str, bool]:
        """Play the agent's move and the opponent's reply; returns (observation, done)."""
        if self.done:
            raise ValueError("the game is over; call reset() to start a new one")
        cell = self._requested_cell(tool_call)
        if isinstance(cell, str):
            self.done, self.outcome = True, "illegal"
            return f"Illegal move: {cell} You lose.", True
        self.board = self.board[:cell] + ("X",) + self.board[cell + 1 :]
        self.num_moves += 1
        if self._finished():
            return self._final_message(), True
        reply = self._opponent_move()
        if self._finished():
            return f"Your opponent played {cell_name(reply)}.\n" + self._final_message(), True
        return (
            f"You played {cell_name(cell)}; your opponent played {cell_name(reply)}.\n"
            + self.render_with_empty_cells(),
            False,
        )

    def turn_reward(self) -> float:
        """The last move's process reward: 1.0 for a legal move, 0.0 for an illegal one."""
        return 0.0 if self.outcome == "illegal" or not self.num_moves else 1.0

    def reward(self) -> float:
        """1.0 win, 0.5 draw, 0.0 loss or illegal move (0.0 while the game is still going)."""
        return {"win": 1.0, "draw": 0.5}.get(self.outcome, 0.0)

    def render(self) -> str:
        """The board as text, with row letters and column numbers."""
        rows = ["   1   2   3"]
        for row in range(3):
            marks = " | ".join(self.board[row * 3 + col] for col in range(3))
            rows.append(f"{ROWS[row]}  {marks}")
            if row < 2:
                rows.append("  ---+---+---")
        return "\n".join(rows)

    def render_with_empty_cells(self) -> str:
        """The board and the list of empty (legal) cells."""
        empty = ", ".join(cell_name(cell) for cell in range(9) if self.board[cell] == " ")
        return f"{self.render()}\nEmpty cells: {empty}."

    def text_move(self, text: str) -> ToolCall | None:
        """A move written as text: the cell in ``<move>B2</move>``, else the first cell name; None if none."""
        match = MOVE_TAG.search(text) or CELL_WORD.search(text)
        if match is None:
            return None
        return ToolCall(id="text-move", name=MAKE_MOVE.name, arguments=json.dumps({"cell": match.group(1)}))

    def _requested_cell(self, tool_call: ToolCall) -> int | str:
        """The cell index, or a string explaining why the call is not a legal move."""
        if tool_call.name != MAKE_MOVE.name:
            return f"unknown tool {tool_call.name!r} (use make_move)."
        try:
            arguments = json.loads(tool_call.arguments or "{}")
        except json.JSONDecodeError:
            return f"arguments are not JSON: {tool_call.arguments[:100]!r}."
        raw = arguments.get("cell") if isinstance(arguments, dict) else None
        cell = parse_cell(raw) if isinstance(raw, str) else None
        if cell is None:
            return f"{raw!r} is not a cell (use A1 .. C3)."
        if self.board[cell] != " ":
            return f"{cell_name(cell)} is already taken."
        return cell

    def _opponent_move(self) -> int:
        empty = [cell for cell in range(9) if self.board[cell] == " "]
        if self.config.opponent == "perfect":
            _, cell = _minimax(self.board, "O")
        else:
            cell = self._rng.choice(empty)
        self.board = self.board[:cell] + ("O",) + self.board[cell + 1 :]
        return cell

    def _finished(self) -> bool:
        result = winner(self.board)
        if result:
            self.done = True
            self.outcome = {"X": "win", "O": "loss", "draw": "draw"}[result]
        return self.done

    def _final_message(self) -> str:
        verdict = {"win": "You win!", "loss": "You lose.", "draw": "It's a draw."}[self.outcome]
        return f"{self.render()}\n{verdict}"
