"""Roman numerals (1-3999)."""

from __future__ import annotations

_NUMERALS = (
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
)
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number: int) -> str:
    """``1994`` -> ``"MCMXCIV"``."""
    if not isinstance(number, int) or isinstance(number, bool):
        raise TypeError("number must be an int")
    if not 1 <= number <= 3999:
        raise ValueError(f"number must be in 1..3999, got {number}")
    parts = []
    for value, symbol in _NUMERALS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(numeral: str) -> int:
    """``"MCMXCIV"`` -> ``1994``; rejects non-canonical numerals such as ``"IIII"`` or ``"IC"``."""
    numeral = numeral.strip().upper()
    if not numeral or any(char not in _VALUES for char in numeral):
        raise ValueError(f"not a roman numeral: {numeral!r}")
    total = 0
    for index, char in enumerate(numeral):
        value = _VALUES[char]
        if index + 1 < len(numeral) and value < _VALUES[numeral[index + 1]]:
            total -= value
        else:
            total += value
    if not 1 <= total <= 3999 or to_roman(total) != numeral:
        raise ValueError(f"not a canonical roman numeral: {numeral!r}")
    return total
