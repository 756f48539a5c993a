"""Half-open numeric intervals ``[start, end)``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open interval ``[start, end)``; empty when ``start == end``."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")

    @property
    def length(self) -> float:
        return self.end - self.start

    def is_empty(self) -> bool:
        return self.start == self.end

    def contains(self, point: float) -> bool:
        """True when ``point`` lies in ``[start, end)``."""
        return self.start <= point < self.end

    def overlaps(self, other: Interval) -> bool:
        """True when the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The shared part, or None when they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def shift(self, offset: float) -> Interval:
        """The same interval moved by ``offset``."""
        return Interval(self.start + offset, self.end + offset)


def merge(intervals: list[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals; returns them sorted, empty ones dropped."""
    result: list[Interval] = []
    for interval in sorted(i for i in intervals if not i.is_empty()):
        if result and interval.start <= result[-1].end:
            last = result[-1]
            result[-1] = Interval(last.start, max(last.end, interval.end))
        else:
            result.append(interval)
    return result


def total_length(intervals: list[Interval]) -> float:
    """The length of the union of ``intervals``."""
    return sum(interval.length for interval in merge(intervals))


def gaps(intervals: list[Interval], within: Interval) -> list[Interval]:
    """The parts of ``within`` that no interval covers, in order."""
    result: list[Interval] = []
    cursor = within.start
    for interval in merge(intervals):
        if interval.end <= within.start or interval.start >= within.end:
            continue
        if interval.start > cursor:
            result.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if cursor < within.end:
        result.append(Interval(cursor, within.end))
    return result
