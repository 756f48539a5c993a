"""Keeping logs that go into trajectories to a bounded size."""

from __future__ import annotations


def clip_text(text: str, max_chars: int) -> str:
    """``text`` cut to at most about ``max_chars``, keeping its head and tail (where errors usually are)."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n… [{len(text) - 2 * half} characters elided] …\n{text[-half:]}"
