"""Durations ("1h30m", "01:30:00") and calendar dates ("2024-02-29")."""

from __future__ import annotations

import re

UNIT_SECONDS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([wdhms])")
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def parse_duration(text: str) -> float:
    """Seconds in ``"2d 4h"``, ``"1h30m"``, ``"90s"``, ``"1.5h"``, ``"MM:SS"`` or ``"HH:MM:SS"``."""
    text = text.strip().lower()
    if not text:
        raise ValueError("empty duration")
    if ":" in text:
        return _parse_clock(text)
    position = 0
    total = 0.0
    for match in _PART.finditer(text):
        if text[position : match.start()].strip():
            raise ValueError(f"cannot parse duration {text!r}")
        total += float(match.group(1)) * UNIT_SECONDS[match.group(2)]
        position = match.end()
    if position == 0 or text[position:].strip():
        raise ValueError(f"cannot parse duration {text!r}")
    return total


def _parse_clock(text: str) -> float:
    fields = text.split(":")
    if len(fields) not in (2, 3) or not all(field.isdigit() for field in fields):
        raise ValueError(f"cannot parse duration {text!r}")
    numbers = [int(field) for field in fields]
    if any(number >= 60 for number in numbers[1:]):
        raise ValueError(f"minutes and seconds must be < 60 in {text!r}")
    seconds = 0
    for number in numbers:
        seconds = seconds * 60 + number
    return float(seconds)


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1h 30m"``; ``0`` -> ``"0s"``; sub-second parts are dropped."""
    if seconds < 0:
        raise ValueError("seconds must be >= 0")
    remaining = int(seconds)
    parts = []
    for unit in ("d", "h", "m", "s"):
        amount, remaining = divmod(remaining, UNIT_SECONDS[unit])
        if amount:
            parts.append(f"{amount}{unit}")
    return " ".join(parts) if parts else "0s"


def is_leap_year(year: int) -> bool:
    """Gregorian leap years: divisible by 4, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year: int, month: int) -> int:
    """Number of days in ``month`` (1-12) of ``year``."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS_IN_MONTH[month - 1]


def parse_date(text: str) -> tuple[int, int, int]:
    """``"2024-02-29"`` -> ``(2024, 2, 29)``, validating the day against the month."""
    match = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", text.strip())
    if not match:
        raise ValueError(f"expected YYYY-MM-DD, got {text!r}")
    year, month, day = (int(group) for group in match.groups())
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"day out of range in {text!r}")
    return year, month, day


def day_of_year(year: int, month: int, day: int) -> int:
    """1 for January 1st, 365 (or 366) for December 31st."""
    return sum(days_in_month(year, m) for m in range(1, month)) + day


def add_days(date: tuple[int, int, int], days: int) -> tuple[int, int, int]:
    """The date ``days`` (possibly negative) after ``date``."""
    year, month, day = date
    day += days
    while day > days_in_month(year, month):
        day -= days_in_month(year, month)
        month += 1
        if month > 12:
            month, year = 1, year + 1
    while day < 1:
        month -= 1
        if month < 1:
            month, year = 12, year - 1
        day += days_in_month(year, month)
    return year, month, day
