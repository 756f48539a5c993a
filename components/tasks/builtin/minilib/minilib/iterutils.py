"""Iteration helpers."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items; the last one may be shorter."""
    if size < 1:
        raise ValueError("size must be >= 1")
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def sliding_window(items: list[T], size: int, step: int = 1) -> list[tuple[T, ...]]:
    """Every window of ``size`` consecutive items, starting every ``step`` items."""
    if size < 1 or step < 1:
        raise ValueError("size and step must be >= 1")
    return [tuple(items[start : start + size]) for start in range(0, len(items) - size + 1, step)]


def flatten(nested: Iterable[Any]) -> list[Any]:
    """Flatten nested lists and tuples (strings stay whole)."""
    flat: list[Any] = []
    for item in nested:
        if isinstance(item, (list, tuple)):
            flat.extend(flatten(item))
        else:
            flat.append(item)
    return flat


def unique(items: Iterable[T], key: Callable[[T], Hashable] | None = None) -> list[T]:
    """Items in first-seen order, dropping later duplicates (by ``key`` when given)."""
    seen: set[Hashable] = set()
    result: list[T] = []
    for item in items:
        marker = key(item) if key else item
        if marker not in seen:
            seen.add(marker)
            result.append(item)
    return result


def group_by(items: Iterable[T], key: Callable[[T], Hashable]) -> dict[Hashable, list[T]]:
    """Items grouped by ``key``, groups in first-seen order."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups
