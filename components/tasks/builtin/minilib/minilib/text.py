"""Text helpers."""

from __future__ import annotations

import re

_NON_SLUG = re.compile(r"[^a-z0-9]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def slugify(text: str, separator: str = "-") -> str:
    """Lower-case ``text`` and join its alphanumeric runs with ``separator``."""
    slug = _NON_SLUG.sub(separator, text.lower())
    return slug.strip(separator)


def truncate(text: str, max_length: int, ellipsis: str = "...") -> str:
    """Shorten ``text`` to at most ``max_length`` characters, ending with ``ellipsis`` when cut."""
    if max_length < 0:
        raise ValueError("max_length must be >= 0")
    if len(text) <= max_length:
        return text
    if max_length <= len(ellipsis):
        return ellipsis[:max_length]
    return text[: max_length - len(ellipsis)] + ellipsis


def wrap(text: str, width: int) -> list[str]:
    """Greedily wrap the words of ``text`` into lines of at most ``width`` characters."""
    if width < 1:
        raise ValueError("width must be >= 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = current + " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def word_count(text: str) -> dict[str, int]:
    """Count case-insensitive word occurrences (apostrophes stay inside words)."""
    counts: dict[str, int] = {}
    for word in re.findall(r"[a-z0-9']+", text.lower()):
        word = word.strip("'")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts


def camel_to_snake(name: str) -> str:
    """``parseHTTPResponse`` -> ``parse_http_response``."""
    name = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return _CAMEL_BOUNDARY.sub("_", name).lower()


def snake_to_camel(name: str, upper_first: bool = False) -> str:
    """``parse_http_response`` -> ``parseHttpResponse`` (``ParseHttpResponse`` with ``upper_first``)."""
    parts = [part for part in name.split("_") if part]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0].lower()
    return head + "".join(part.capitalize() for part in parts[1:])


def is_palindrome(text: str) -> bool:
    """True when ``text`` reads the same backwards, ignoring case and non-alphanumerics."""
    cleaned = [char.lower() for char in text if char.isalnum()]
    return cleaned == cleaned[::-1]


def common_prefix(words: list[str]) -> str:
    """The longest prefix shared by every word ("" for an empty list)."""
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        index = 0
        while index < min(len(prefix), len(word)) and prefix[index] == word[index]:
            index += 1
        prefix = prefix[:index]
    return prefix
