"""Temporal Clue: seeded puzzles with exactly one solution (the exhaustive checker), hand-counted solution sets,
exact scoring, and the environment's tool and text answers."""

from __future__ import annotations

import json

import pytest

from components.tasks.toys import ToyEnvironment
from components.tasks.toys.temporal_clue import (
    HOUR,
    ROOM,
    WEAPON,
    Clue,
    Puzzle,
    TemporalClueConfig,
    TemporalClueEnv,
    generate_puzzle,
    score_answer,
    solutions,
)
from components.tito.messages import ToolCall


@pytest.mark.parametrize(("size", "seeds"), [(3, range(12)), (4, range(3))])
def test_every_generated_puzzle_has_exactly_its_solution(size, seeds):
    for seed in seeds:
        puzzle = generate_puzzle(seed, TemporalClueConfig(size=size))
        assert solutions(puzzle) == [puzzle.solution], seed
        assert all(clue.holds(puzzle.solution) for clue in puzzle.clues)
        assert puzzle.answer["weapon"] in puzzle.prompt()  # the murder weapon is given; the rest is deduced


def test_puzzles_are_seeded():
    assert generate_puzzle(7) == generate_puzzle(7)
    assert generate_puzzle(7).prompt() != generate_puzzle(8).prompt()


def test_the_checker_counts_solutions_by_hand():
    # 3 suspects: 3!^3 = 216 assignments. Scarlett has the Rope and Mustard the Knife: weapons fixed, 6 * 6 left.
    clues = (Clue("fact", (0, WEAPON, 0)), Clue("fact", (1, WEAPON, 1)))
    puzzle = Puzzle(size=3, clues=clues, murder_weapon=0, solution=((0, 0, 0), (1, 1, 1), (2, 2, 2)))
    assert len(solutions(puzzle)) == 36
    # ... and Peacock was not in the Kitchen: 4 of the 6 room orders remain
    negated = Puzzle(**{**puzzle.__dict__, "clues": (*clues, Clue("fact", (2, ROOM, 0), negated=True))})
    assert len(solutions(negated)) == 24
    # the person in the Kitchen came earlier than the person with the Knife (Mustard): Mustard is not in the
    # Kitchen (4 of 6 room orders) and its owner came first (3 of 6 hour orders)
    before = Puzzle(**{**puzzle.__dict__, "clues": (*clues, Clue("before", (0, 1)))})
    assert len(solutions(before)) == 4 * 3
    assert Clue("fact", (1, HOUR, 3)).text() == "Mustard came at midnight."


def test_scoring_is_exact_per_field():
    puzzle = generate_puzzle(0, TemporalClueConfig(size=3))
    assert score_answer(puzzle, puzzle.answer) == 1.0
    assert score_answer(puzzle, {k: f" {v.upper()} " for k, v in puzzle.answer.items()}) == 1.0
    assert score_answer(puzzle, {**puzzle.answer, "room": "Attic", "time": ""}) == 0.5
    assert score_answer(puzzle, {}) == 0.0


def test_the_environment_takes_one_accusation_by_tool_or_text():
    env = TemporalClueEnv(TemporalClueConfig(size=3))
    assert isinstance(env, ToyEnvironment)
    prompt = env.reset(seed=3)
    answer = env.puzzle.answer
    assert "Clues:" in prompt and env.tools()[0].name == "accuse"
    observation, done = env.step(ToolCall(id="1", name="accuse", arguments=json.dumps(answer)))
    assert done and env.reward() == 1.0 and "4 of 4" in observation
    assert env.turn_reward() == 1.0  # the accusation's process reward: its fraction of right fields
    with pytest.raises(ValueError, match="over"):
        env.step(ToolCall(id="2", name="accuse", arguments="{}"))
    env.reset(seed=3)
    assert env.step(ToolCall(id="1", name="guess", arguments="{}")) == (
        "Invalid call: expected accuse with JSON arguments ['suspect', 'weapon', 'room', 'time'].",
        True,
    )
    assert env.reward() == 0.0 and env.turn_reward() == 0.0
    move = env.text_move(f"It was {answer['suspect']} in the {answer['room']} at {answer['time']}.")
    assert json.loads(move.arguments) == {**answer, "weapon": ""}
    assert env.text_move("no idea") is None
    with pytest.raises(ValueError, match="size"):
        TemporalClueConfig(size=9)
