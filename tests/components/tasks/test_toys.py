"""Toy environments: tic-tac-toe and 2048 rules, rewards, seeding and the tool-call interface."""

from __future__ import annotations

import json
import random

import pytest

from components.tasks.toys import Game2048Config, Game2048Env, TicTacToeConfig, TicTacToeEnv, ToyEnvironment
from components.tasks.toys.game_2048 import slide, slide_row_left
from components.tasks.toys.tictactoe import cell_name, parse_cell, winner
from components.tito.messages import ToolCall


def move(cell: str) -> ToolCall:
    return ToolCall(id="call-1", name="make_move", arguments=json.dumps({"cell": cell}))


def direction(name: str) -> ToolCall:
    return ToolCall(id="call-1", name="move", arguments=json.dumps({"direction": name}))


# ---- tic-tac-toe ------------------------------------------------------------------------------------------


def test_tictactoe_interface():
    env = TicTacToeEnv()
    assert isinstance(env, ToyEnvironment)
    [tool] = env.tools()
    assert tool.to_openai()["function"]["name"] == "make_move"
    observation = env.reset(seed=1)
    assert "You are X" in observation and "A  " in observation
    assert env.board == (" ",) * 9


def test_cells_and_winner():
    assert [parse_cell(name) for name in ("A1", "b2", "C3", "D1", "A4", "")] == [0, 4, 8, None, None, None]
    assert cell_name(5) == "B3"
    assert winner(tuple("XXXOO    ")) == "X"
    assert winner(tuple("O  O  O  ")) == "O"
    assert winner(tuple("XOXXOOOXX")) == "draw"
    assert winner(tuple("XO       ")) == ""


def test_illegal_moves_end_the_game_with_zero():
    for call in (
        move("Z9"),
        ToolCall(id="c", name="make_move", arguments="{not json"),
        ToolCall(id="c", name="bash", arguments="{}"),
        ToolCall(id="c", name="make_move", arguments='{"cell": 5}'),
    ):
        env = TicTacToeEnv()
        env.reset(seed=0)
        observation, done = env.step(call)
        assert done and env.outcome == "illegal" and env.reward() == 0.0
        assert "Illegal move" in observation
        with pytest.raises(ValueError, match="game is over"):
            env.step(move("A1"))


def test_occupied_cell_is_illegal():
    env = TicTacToeEnv(TicTacToeConfig(opponent="perfect"))
    env.reset(seed=0)
    env.step(move("A1"))
    taken = next(cell_name(i) for i in range(9) if env.board[i] == "O")
    observation, done = env.step(move(taken))
    assert done and "already taken" in observation and env.reward() == 0.0


def test_win_draw_loss_rewards():
    env = TicTacToeEnv()
    env.reset(seed=0)
    env.board = tuple("XX OO    ")
    observation, done = env.step(move("A3"))
    assert done and env.outcome == "win" and env.reward() == 1.0 and "You win" in observation

    env.reset(seed=0)
    env.board = tuple("XOXXOOOX ")  # X plays the last free cell C3: nobody has three in a row
    _, done = env.step(move("C3"))
    assert done and env.outcome == "draw" and env.reward() == 0.5

    env = TicTacToeEnv(TicTacToeConfig(opponent="perfect"))
    env.reset(seed=0)
    env.board = tuple("OO XX    ")  # X blunders; O completes the top row
    observation, done = env.step(move("C3"))
    assert done and env.outcome == "loss" and env.reward() == 0.0 and "You lose" in observation


def _play_randomly(env: TicTacToeEnv, rng: random.Random) -> None:
    done = False
    while not done:
        free = [cell_name(i) for i in range(9) if env.board[i] == " "]
        _, done = env.step(move(rng.choice(free)))


def test_perfect_opponent_never_loses():
    rng = random.Random(0)
    for first_player in ("agent", "opponent"):
        env = TicTacToeEnv(TicTacToeConfig(opponent="perfect", first_player=first_player))
        for seed in range(25):
            env.reset(seed=seed)
            _play_randomly(env, rng)
            assert env.outcome in ("draw", "loss")


def test_random_opponent_is_seeded():
    def game(seed: int) -> tuple[str, ...]:
        env = TicTacToeEnv(TicTacToeConfig(first_player="opponent"))
        env.reset(seed=seed)
        _play_randomly(env, random.Random(1))
        return env.board

    assert game(3) == game(3)
    assert len({game(seed) for seed in range(10)}) > 1


def test_text_move_reads_a_tagged_or_bare_cell():
    env = TicTacToeEnv()
    observation = env.reset(seed=0)
    assert "Empty cells: A1, A2, A3, B1, B2, B3, C1, C2, C3." in observation

    def cell(text: str) -> str | None:
        move = env.text_move(text)
        return None if move is None else json.loads(move.arguments)["cell"]

    assert cell("I think <move> b2 </move> is best, not A1") == "b2"  # the tag wins over an earlier bare cell
    assert cell("A1, a very short answer!") == "A1"
    assert cell("make_move(C3)") == "C3"
    assert cell("no cell here, D6 or AB12") is None
    observation, done = env.step(env.text_move("<move>B2</move>"))
    assert (
        not done and env.board[4] == "X" and "Empty cells:" in observation and "B2" not in observation[-40:]
    )


def test_tictactoe_config_validation():
    with pytest.raises(ValueError, match="opponent"):
        TicTacToeConfig(opponent="genius")
    with pytest.raises(ValueError, match="first_player"):
        TicTacToeConfig(first_player="nobody")


# ---- 2048 -------------------------------------------------------------------------------------------------


def test_slide_row_merges_each_tile_once():
    assert slide_row_left((2, 2, 2, 2)) == ((4, 4, 0, 0), 8)
    assert slide_row_left((2, 2, 4, 0)) == ((4, 4, 0, 0), 4)
    assert slide_row_left((4, 0, 4, 8)) == ((8, 8, 0, 0), 8)
    assert slide_row_left((0, 0, 0, 2)) == ((2, 0, 0, 0), 0)
    assert slide_row_left((2, 4, 8, 16)) == ((2, 4, 8, 16), 0)


def test_slide_directions():
    board = ((2, 0, 0, 2), (0, 0, 0, 0), (2, 0, 0, 0), (4, 0, 0, 0))
    assert slide(board, "left")[0][0] == (4, 0, 0, 0)
    assert slide(board, "right")[0][0] == (0, 0, 0, 4)
    up, points = slide(board, "up")
    assert [row[0] for row in up] == [4, 4, 0, 0] and points == 4
    down, _ = slide(board, "down")
    assert [row[0] for row in down] == [0, 0, 4, 4]


def test_2048_interface_and_seeding():
    env = Game2048Env()
    assert isinstance(env, ToyEnvironment)
    assert env.tools()[0].to_openai()["function"]["parameters"]["properties"]["direction"]["enum"] == [
        "up",
        "down",
        "left",
        "right",
    ]
    observation = env.reset(seed=5)
    assert "2048" in observation and "Score: 0" in observation
    assert sum(v != 0 for row in env.board for v in row) == 2
    first = env.board
    env.reset(seed=5)
    assert env.board == first
    boards = set()
    for seed in range(8):
        env.reset(seed=seed)
        boards.add(env.board)
    assert len(boards) > 1


def test_move_spawns_a_tile_only_when_the_board_changed():
    env = Game2048Env()
    env.reset(seed=0)
    env.board = ((2, 2, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    observation, done = env.step(direction("left"))
    assert not done and env.score == 4 and env.board[0][0] == 4
    assert sum(v != 0 for row in env.board for v in row) == 2  # merged tile + one new tile
    env.board = ((4, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    before = env.board
    observation, done = env.step(direction("left"))
    assert env.board == before and "Nothing moved" in observation and env.num_moves == 2


def test_reward_is_normalised_max_tile():
    env = Game2048Env(Game2048Config(target_tile=64))
    env.reset(seed=0)
    env.board = ((8, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    assert env.reward() == pytest.approx(0.5)
    env.board = ((32, 32, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    observation, done = env.step(direction("left"))
    assert done and env.end_reason == "won" and env.reward() == 1.0 and "You win" in observation


def test_stuck_board_and_move_limit_end_the_game():
    env = Game2048Env()
    env.reset(seed=0)
    env.board = ((2, 4, 2, 4), (4, 2, 4, 2), (2, 4, 2, 4), (4, 2, 8, 16))  # full, no equal neighbours
    observation, done = env.step(direction("left"))
    assert done and env.end_reason == "stuck" and "No moves left" in observation

    env = Game2048Env(Game2048Config(max_moves=3))
    env.reset(seed=1)
    done = False
    for name in ("left", "right", "left"):
        assert not done
        _, done = env.step(direction(name))
    assert done and env.end_reason in ("max_moves", "stuck")


def test_invalid_calls_end_the_game():
    for call in (
        direction("diagonal"),
        ToolCall(id="c", name="make_move", arguments="{}"),
        ToolCall(id="c", name="move", arguments="nope"),
    ):
        env = Game2048Env()
        env.reset(seed=0)
        observation, done = env.step(call)
        assert done and env.end_reason == "invalid" and "Invalid move" in observation
        assert 0.0 < env.reward() < 1.0  # the board's value is kept
        with pytest.raises(ValueError):
            env.step(direction("up"))


def test_random_play_is_reproducible_and_bounded():
    def play(seed: int) -> tuple[int, float]:
        env = Game2048Env(Game2048Config(target_tile=2048, max_moves=400))
        env.reset(seed=seed)
        rng = random.Random(seed)
        done = False
        while not done:
            _, done = env.step(direction(rng.choice(["up", "down", "left", "right"])))
        assert 0.0 <= env.reward() <= 1.0
        return env.score, env.reward()

    assert play(11) == play(11)


def test_2048_config_validation():
    with pytest.raises(ValueError, match="target_tile"):
        Game2048Config(target_tile=100)
    with pytest.raises(ValueError, match="max_moves"):
        Game2048Config(max_moves=0)
