"""Reasoning formats: ``<think>…</think>`` (Qwen3, DeepSeek R1, GLM-4.5, Kimi K2 Thinking), harmony's
``analysis`` channel (gpt-oss), and none."""

from __future__ import annotations

from typing import ClassVar

from components.tito.formats.harmony import CHANNEL, END, MESSAGE, START, harmony_messages

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ThinkReasoning:
    """Reasoning before ``</think>`` (opened by ``<think>`` in the reply or in the generation prompt)."""

    name: ClassVar[str] = "think"
    markers: ClassVar[tuple[str, ...]] = (THINK_OPEN, THINK_CLOSE)

    def matches_template(self, template: str) -> bool:
        return THINK_CLOSE in template

    def split(self, text: str, *, opened_by_prompt: bool = False) -> tuple[str | None, str]:
        if THINK_CLOSE not in text:
            return None, text
        before, _, rest = text.partition(THINK_CLOSE)
        return before.replace(THINK_OPEN, "", 1).strip(), rest

    def in_progress(self, text: str, *, opened_by_prompt: bool = False) -> bool:
        if THINK_CLOSE in text:
            return False
        head = text.lstrip()
        return opened_by_prompt or head.startswith(THINK_OPEN) or THINK_OPEN.startswith(head)

    def render(self, reasoning: str | None, rest: str) -> str:
        return f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{rest}" if reasoning else rest


class HarmonyReasoning:
    """gpt-oss: the ``analysis`` channel's messages are the reasoning."""

    name: ClassVar[str] = "harmony"
    markers: ClassVar[tuple[str, ...]] = (CHANNEL, MESSAGE, END, START)

    def matches_template(self, template: str) -> bool:
        return CHANNEL in template

    def split(self, text: str, *, opened_by_prompt: bool = False) -> tuple[str | None, str]:
        messages = harmony_messages(text)
        analysis = [m for m in messages if m[0] == "analysis" and m[1] is None]
        if not analysis:
            return None, text
        kept, position = [], 0
        for message in analysis:  # the text outside the analysis messages
            kept.append(text[position : message[3]])
            position = message[5]
        kept.append(text[position:])
        rest = "".join(kept)
        return "\n".join(m[2].strip() for m in analysis), rest

    def in_progress(self, text: str, *, opened_by_prompt: bool = False) -> bool:
        messages = harmony_messages(text)
        if not messages:
            return MESSAGE not in text and bool(text.strip())
        channel, recipient, _, _, closed, _ = messages[-1]
        return channel == "analysis" and not closed

    def render(self, reasoning: str | None, rest: str) -> str:
        if not reasoning:
            return rest
        return f"{CHANNEL}analysis{MESSAGE}{reasoning}{END}{START}assistant{rest}"


class NoReasoning:
    """The reply has no reasoning part (``</think>`` stays content)."""

    name: ClassVar[str] = "none"
    markers: ClassVar[tuple[str, ...]] = ()

    def matches_template(self, template: str) -> bool:
        return False

    def split(self, text: str, *, opened_by_prompt: bool = False) -> tuple[str | None, str]:
        return None, text

    def in_progress(self, text: str, *, opened_by_prompt: bool = False) -> bool:
        return False

    def render(self, reasoning: str | None, rest: str) -> str:
        return rest
