"""Helpers for the frozen, keyword-only config dataclasses every component carries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def require(condition: bool, field: str, message: str) -> None:
    """Raise ``ValueError`` naming ``field`` unless ``condition`` holds."""
    if not condition:
        raise ValueError(f"{field}: {message}")


def require_positive(value: float, field: str) -> None:
    """``value`` must be > 0."""
    require(value > 0, field, f"must be > 0, got {value!r}")


def require_non_negative(value: float, field: str) -> None:
    """``value`` must be >= 0."""
    require(value >= 0, field, f"must be >= 0, got {value!r}")


def require_one_of(value: Any, field: str, allowed: Iterable[Any]) -> None:
    """``value`` must be one of ``allowed``."""
    allowed = tuple(allowed)
    require(value in allowed, field, f"must be one of {list(allowed)}, got {value!r}")
