"""Helpers for the frozen, keyword-only config dataclasses every component carries."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from components.registry import Registry

T = TypeVar("T")


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


def require_one_of(value: object, field: str, allowed: Iterable[object]) -> None:
    """``value`` must be one of ``allowed``."""
    allowed = tuple(allowed)
    require(value in allowed, field, f"must be one of {list(allowed)}, got {value!r}")


def option(
    default: T,
    help: str,
    *,
    flag: str | tuple[str, ...] | None = None,
    set_by: str | None = None,
    **kwargs: Any,
) -> T:
    """A config field with its documentation (``--help`` shows it). ``default`` may be a brick config (a
    dataclass instance); ``flag`` is a historical flag (or several) besides the derived ``--prefix-name`` one;
    ``set_by`` names who sets a field a person never types (no flag, no config-file key: it has one source)."""
    metadata = {"help": help, **({"flag": flag} if flag else {}), **({"set_by": set_by} if set_by else {})}
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=lambda: default, metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def slot(registry: Registry, default: T, help: str, *, flag: str | None = None) -> T:
    """A config field holding one brick of a seam: any kind ``registry`` has registered (``default`` is an
    instance of one). On the command line ``--<name> KIND`` (or ``flag``) picks the kind and the kind's fields
    follow as ``--<name>-<field>``; in a file it is ``<name>: {kind: KIND, <field>: ...}`` (or just ``KIND``)."""
    metadata = {"help": help, "registry": registry, **({"flag": flag} if flag else {})}
    return dataclasses.field(default_factory=lambda: default, metadata=metadata)
