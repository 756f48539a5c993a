"""Temporal Clue (ART's third toy example beside tic-tac-toe and 2048): a Clue-style deduction puzzle with time
and place clues, seeded, with an exact checker, played through one ``accuse`` tool call.

A puzzle has ``size`` suspects, weapons, rooms and hours. The hidden solution gives each suspect one weapon,
one room and one hour (all different: a one-to-one assignment). Clues are true statements about it: a suspect
was (not) in a room, a weapon was (not) somewhere, the person in one room came earlier than the person with a
weapon, two facts belong to the same person. The generator draws clues until exactly one assignment satisfies
them all (checked by enumerating every assignment), then asks who the murderer was - the one person a last clue
singles out - and with what, where and when. Reward: the fraction of the four answers that are right.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

from components.config import require
from components.tito.messages import ToolCall, ToolSpec

SUSPECTS = ("Scarlett", "Mustard", "Peacock", "Plum", "Green")
WEAPONS = ("Rope", "Knife", "Candlestick", "Wrench", "Revolver")
ROOMS = ("Kitchen", "Library", "Study", "Hall", "Ballroom")
HOURS = ("9pm", "10pm", "11pm", "midnight", "1am")
FIELDS = ("suspect", "weapon", "room", "time")
ACCUSE = ToolSpec(
    name="accuse",
    description="Name the murderer, the weapon, the room and the time.",
    parameters={
        "type": "object",
        "properties": {field: {"type": "string"} for field in FIELDS},
        "required": list(FIELDS),
    },
)

# An assignment: for suspect i, (weapon index, room index, hour index).
Assignment = tuple[tuple[int, int, int], ...]
SLOT_NAMES = (WEAPONS, ROOMS, HOURS)
WEAPON, ROOM, HOUR = range(3)


@dataclass(frozen=True, kw_only=True)
class TemporalClueConfig:
    """How big the puzzles are."""

    size: int = 4  # suspects = weapons = rooms = hours; 3 is quick, 5 hard (5!³ assignments to check)
    max_clues: int = 40

    def __post_init__(self) -> None:
        require(3 <= self.size <= len(SUSPECTS), "size", f"must be in [3, {len(SUSPECTS)}], got {self.size}")
        require(self.max_clues >= 1, "max_clues", f"must be >= 1, got {self.max_clues}")


@dataclass(frozen=True)
class Clue:
    """One statement: ``fact`` (suspect a has value b in slot c, or not: ``negated``), ``link`` (whoever has
    value a in slot b has value c in slot d), ``before`` (the person in room a came earlier than the person
    with weapon b)."""

    kind: str
    args: tuple[int, ...]
    negated: bool = False

    def holds(self, assignment: Assignment) -> bool:
        """Whether the statement is true of ``assignment``."""
        if self.kind == "fact":
            suspect, slot, value = self.args
            return (assignment[suspect][slot] == value) != self.negated
        if self.kind == "link":
            slot_a, value_a, slot_b, value_b = self.args
            return assignment[_owner(assignment, slot_a, value_a)][slot_b] == value_b
        room, weapon = self.args
        return (
            assignment[_owner(assignment, ROOM, room)][HOUR]
            < assignment[_owner(assignment, WEAPON, weapon)][HOUR]
        )

    def text(self) -> str:
        if self.kind == "fact":
            suspect, slot, value = self.args
            verb = (("did not have", "had"), ("was not in", "was in"), ("did not come at", "came at"))[slot]
            article = "" if slot == HOUR else "the "
            return f"{SUSPECTS[suspect]} {verb[not self.negated]} {article}{SLOT_NAMES[slot][value]}."
        if self.kind == "link":
            slot_a, value_a, slot_b, value_b = self.args
            text = f"{_describe(slot_a, value_a)} was {_describe(slot_b, value_b)}."
            return text[0].upper() + text[1:]
        room, weapon = self.args
        return f"The person in the {ROOMS[room]} came earlier than the person with the {WEAPONS[weapon]}."


def _describe(slot: int, value: int) -> str:
    return ("the person with the {}", "the person in the {}", "the person who came at {}")[slot].format(
        SLOT_NAMES[slot][value]
    )


def _owner(assignment: Assignment, slot: int, value: int) -> int:
    return next(s for s, facts in enumerate(assignment) if facts[slot] == value)


@dataclass(frozen=True, kw_only=True)
class Puzzle:
    """One generated puzzle: its clues, the murderer's four facts (the answer), and its solution."""

    size: int
    clues: tuple[Clue, ...]
    murder_weapon: int
    solution: Assignment

    @property
    def answer(self) -> dict[str, str]:
        murderer = _owner(self.solution, WEAPON, self.murder_weapon)
        weapon, room, hour = self.solution[murderer]
        return {
            "suspect": SUSPECTS[murderer],
            "weapon": WEAPONS[weapon],
            "room": ROOMS[room],
            "time": HOURS[hour],
        }

    def prompt(self) -> str:
        lines = "\n".join(f"{i + 1}. {clue.text()}" for i, clue in enumerate(self.clues))
        return (
            f"Suspects: {', '.join(SUSPECTS[: self.size])}. Weapons: {', '.join(WEAPONS[: self.size])}. Rooms: "
            f"{', '.join(ROOMS[: self.size])}. Times: {', '.join(HOURS[: self.size])}.\n"
            "Each suspect had a different weapon and was alone in a different room, arriving at a different time.\n"
            f"Clues:\n{lines}\n"
            f"The murder was committed with the {WEAPONS[self.murder_weapon]}. Who is the murderer, in which room, "
            "at what time? Call accuse(suspect, weapon, room, time)."
        )


def all_assignments(size: int) -> list[Assignment]:
    """Every one-to-one assignment of weapons, rooms and times to ``size`` suspects."""
    permutations = list(itertools.permutations(range(size)))
    return [
        tuple(zip(weapons, rooms, hours, strict=True))
        for weapons in permutations
        for rooms in permutations
        for hours in permutations
    ]


def solutions(puzzle: Puzzle) -> list[Assignment]:
    """The exact checker: every assignment all of the puzzle's clues allow (enumerated)."""
    return [a for a in all_assignments(puzzle.size) if all(clue.holds(a) for clue in puzzle.clues)]


def _true_clues(solution: Assignment, size: int, rng: random.Random) -> list[Clue]:
    """Every kind of true statement about ``solution``, shuffled."""
    clues = []
    for suspect, slot in itertools.product(range(size), range(3)):
        value = solution[suspect][slot]
        clues.append(Clue("fact", (suspect, slot, value)))
        other = rng.choice([v for v in range(size) if v != value])
        clues.append(Clue("fact", (suspect, slot, other), negated=True))
    for (slot_a, slot_b), value in itertools.product(itertools.permutations(range(3), 2), range(size)):
        clues.append(Clue("link", (slot_a, value, slot_b, solution[_owner(solution, slot_a, value)][slot_b])))
    for room, weapon in itertools.product(range(size), range(size)):
        clue = Clue("before", (room, weapon))
        if clue.holds(solution):
            clues.append(clue)
    rng.shuffle(clues)
    return [clue for clue in clues if clue.kind != "fact" or clue.negated or rng.random() < 0.4]


def generate_puzzle(seed: int, config: TemporalClueConfig | None = None) -> Puzzle:
    """The puzzle of ``seed``: true clues drawn (each one ruling something out) until one assignment fits."""
    config = config or TemporalClueConfig()
    rng = random.Random(seed)
    candidates = all_assignments(config.size)
    solution = rng.choice(candidates)
    chosen: list[Clue] = []
    for clue in _true_clues(solution, config.size, rng):
        remaining = [a for a in candidates if clue.holds(a)]
        if len(remaining) < len(candidates):
            candidates, chosen = remaining, [*chosen, clue]
        if len(candidates) == 1 or len(chosen) >= config.max_clues:
            break
    return Puzzle(
        size=config.size, clues=tuple(chosen), murder_weapon=rng.randrange(config.size), solution=solution
    )


def score_answer(puzzle: Puzzle, answer: dict[str, object]) -> float:
    """The fraction of the four fields answered exactly (case and surrounding spaces ignored)."""
    expected = puzzle.answer
    right = sum(str(answer.get(field, "")).strip().lower() == expected[field].lower() for field in FIELDS)
    return right / len(FIELDS)


class TemporalClueEnv:
    """``ToyEnvironment``: one puzzle per seed, answered by one ``accuse`` call."""

    name = "temporal_clue"

    def __init__(self, config: TemporalClueConfig | None = None) -> None:
        self.config = config or TemporalClueConfig()
        self.puzzle: Puzzle | None = None
        self._reward: float | None = None

    def tools(self) -> list[ToolSpec]:
        return [ACCUSE]

    def reset(self, seed: int | None = None) -> str:
        self.puzzle = generate_puzzle(seed if seed is not None else random.randrange(1 << 30), self.config)
        self._reward = None
        return self.puzzle.prompt()

    def step(self, tool_call: ToolCall) -> tuple[str, bool]:
        if self.puzzle is None or self._reward is not None:
            raise ValueError("step: the episode is over (or was never reset)")
        try:
            arguments = json.loads(tool_call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = None
        if tool_call.name != ACCUSE.name or not isinstance(arguments, dict):
            self._reward = 0.0
            return f"Invalid call: expected accuse with JSON arguments {list(FIELDS)}.", True
        self._reward = score_answer(self.puzzle, arguments)
        return f"{int(self._reward * len(FIELDS))} of {len(FIELDS)} right.", True

    def reward(self) -> float:
        return self._reward or 0.0

    def turn_reward(self) -> float:
        """The accusation's process reward: the fraction of its fields that are right (its only move)."""
        return self.reward()

    def text_move(self, text: str) -> ToolCall | None:
        """An accusation written as text: the first suspect, weapon, room and time the reply names (None when
        it names none of them)."""
        lowered = text.lower()
        found = {}
        for field, names in zip(FIELDS, (SUSPECTS, WEAPONS, ROOMS, HOURS), strict=True):
            positions = [(lowered.find(name.lower()), name) for name in names if name.lower() in lowered]
            if positions:
                found[field] = min(positions)[1]
        if not found:
            return None
        return ToolCall(
            id="text", name=ACCUSE.name, arguments=json.dumps({f: found.get(f, "") for f in FIELDS})
        )
