"""Descriptive statistics over plain lists of numbers."""

from __future__ import annotations

import math
from collections import Counter


def _require_data(values: list[float], minimum: int = 1) -> None:
    if len(values) < minimum:
        raise ValueError(f"need at least {minimum} value(s), got {len(values)}")


def mean(values: list[float]) -> float:
    """Arithmetic mean."""
    _require_data(values)
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    """Middle value; the mean of the two middle values for even counts."""
    _require_data(values)
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def mode(values: list[float]) -> float:
    """Most common value; ties go to the value seen first."""
    _require_data(values)
    counts = Counter(values)
    best = max(counts.values())
    for value in values:
        if counts[value] == best:
            return value
    raise AssertionError("unreachable")


def variance(values: list[float], sample: bool = True) -> float:
    """Sample variance (n - 1 denominator) or, with ``sample=False``, population variance."""
    _require_data(values, 2 if sample else 1)
    center = mean(values)
    squares = sum((value - center) ** 2 for value in values)
    return squares / (len(values) - 1 if sample else len(values))


def stdev(values: list[float], sample: bool = True) -> float:
    """Square root of :func:`variance`."""
    return math.sqrt(variance(values, sample))


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    _require_data(values)
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = rank - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * fraction


def clamp(value: float, low: float, high: float) -> float:
    """``value`` limited to ``[low, high]``."""
    if low > high:
        raise ValueError("low must be <= high")
    return max(low, min(value, high))


def normalize(values: list[float]) -> list[float]:
    """Rescale to [0, 1]; a constant list maps to all zeros."""
    _require_data(values)
    low, high = min(values), max(values)
    if high == low:
        return [0.0 for _ in values]
    return [(value - low) / (high - low) for value in values]


def moving_average(values: list[float], window: int) -> list[float]:
    """Means of every run of ``window`` consecutive values."""
    if window < 1:
        raise ValueError("window must be >= 1")
    if window > len(values):
        return []
    total = sum(values[:window])
    averages = [total / window]
    for index in range(window, len(values)):
        total += values[index] - values[index - window]
        averages.append(total / window)
    return averages
