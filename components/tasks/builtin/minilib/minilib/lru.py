"""A small least-recently-used cache."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

_MISSING = object()


class LRUCache:
    """Keeps at most ``capacity`` items, evicting the least recently used one first."""

    def __init__(self, capacity: int = 128) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._items: OrderedDict[Hashable, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        """Membership test; does not count as a use."""
        return key in self._items

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The cached value (marking it recently used), or ``default``."""
        value = self._items.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        self._items.move_to_end(key)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        """Insert or update ``key``, evicting the least recently used item when full."""
        if key in self._items:
            self._items.move_to_end(key)
        self._items[key] = value
        self._evict_to(self.capacity)

    def pop(self, key: Hashable, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value (or ``default``; KeyError without one)."""
        if key in self._items:
            return self._items.pop(key)
        if default is _MISSING:
            raise KeyError(key)
        return default

    def resize(self, capacity: int) -> None:
        """Change the capacity, evicting least recently used items if it shrinks."""
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._evict_to(capacity)

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        return list(self._items)

    def _evict_to(self, size: int) -> None:
        while len(self._items) > size:
            self._items.popitem(last=False)
            self.evictions += 1
