"""Drift audit: how far a recorded segment's token ids are from what the chat template makes of its text.

TITO ids are the truth (they are what the engine saw and sampled). Re-rendering the conversation with the
template and re-tokenizing it is what a framework without TITO would train on; the number of tokens that
differ is a monitoring metric for how much such a framework would have been wrong (re-encoding merges,
templates that strip ``<think>`` from past turns, re-serialised tool calls).

The two sequences are aligned turn by turn (split at special tokens, then token by token inside the turns
that differ), so one early difference does not count every later token as drifted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import TYPE_CHECKING

from components.tito.formats import ToolFormat
from components.tito.messages import ChatMessage, ToolSpec
from components.tito.rendering import ChatTemplateRenderer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from components.tito.session import TitoSession


@dataclass(frozen=True, kw_only=True)
class DriftReport:
    """How a segment's TITO ids compare with a fresh render of its conversation."""

    num_tokens: int  # TITO ids in the segment
    num_mismatched: int  # tokens that differ once TITO ids and the re-render are aligned
    first_mismatch_index: int | None  # first position where the two differ; None when they agree
    num_rerendered_tokens: int
    segment_reason: str = ""  # why the audited segment started (``audit_session``), e.g. history_rewritten

    @property
    def mismatch_rate(self) -> float:
        return self.num_mismatched / self.num_tokens if self.num_tokens else 0.0


def _chunks(ids: Sequence[int], boundaries: frozenset[int]) -> list[tuple[int, ...]]:
    chunks: list[tuple[int, ...]] = []
    start = 0
    for position, token in enumerate(ids):
        if token in boundaries and position > start:
            chunks.append(tuple(ids[start:position]))
            start = position
    if start < len(ids):
        chunks.append(tuple(ids[start:]))
    return chunks


def count_mismatched(
    truth: Sequence[int], other: Sequence[int], boundaries: frozenset[int] = frozenset()
) -> int:
    """Tokens that differ between ``truth`` and ``other`` after aligning them: a replaced run counts its longer
    side; tokens ``other`` has after the end of ``truth`` (a re-render's trailing newline) do not count."""
    truth_chunks, other_chunks = _chunks(truth, boundaries), _chunks(other, boundaries)
    num_mismatched = 0
    truth_offset = 0
    chunk_offsets = [0]
    for chunk in truth_chunks:
        chunk_offsets.append(chunk_offsets[-1] + len(chunk))
    for tag, i1, i2, j1, j2 in SequenceMatcher(
        None, truth_chunks, other_chunks, autojunk=False
    ).get_opcodes():
        if tag == "equal":
            continue
        truth_part = [t for chunk in truth_chunks[i1:i2] for t in chunk]
        other_part = [t for chunk in other_chunks[j1:j2] for t in chunk]
        truth_offset = chunk_offsets[i1]
        inner = SequenceMatcher(None, truth_part, other_part, autojunk=False)
        for inner_tag, a1, a2, b1, b2 in inner.get_opcodes():
            if inner_tag == "replace":
                num_mismatched += max(a2 - a1, b2 - b1)
            elif inner_tag == "delete":
                num_mismatched += a2 - a1
            elif inner_tag == "insert" and truth_offset + a1 < len(truth):
                num_mismatched += b2 - b1
    return num_mismatched


def _first_mismatch(truth: Sequence[int], other: Sequence[int]) -> int | None:
    for position, (a, b) in enumerate(zip(truth, other, strict=False)):
        if a != b:
            return position
    return None if len(truth) <= len(other) else len(other)


def drift_audit(
    tokenizer: PreTrainedTokenizerBase,
    segment_token_ids: Sequence[int],
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec] = (),
    *,
    native_tools: bool | None = None,
    tool_format: ToolFormat | None = None,
) -> DriftReport:
    """Re-render ``messages`` (+ ``tools``) with the template and count how many of the segment's ids differ."""
    renderer = ChatTemplateRenderer(tokenizer, native_tools=native_tools, tool_format=tool_format)
    ends_with_reply = bool(messages) and messages[-1].role == "assistant"
    rerendered = renderer.render_ids(messages, tools, add_generation_prompt=not ends_with_reply)
    truth = [int(t) for t in segment_token_ids]
    boundaries = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()))
    return DriftReport(
        num_tokens=len(truth),
        num_mismatched=count_mismatched(truth, rerendered, boundaries),
        first_mismatch_index=_first_mismatch(truth, rerendered),
        num_rerendered_tokens=len(rerendered),
    )


def audit_session(session: TitoSession) -> list[DriftReport]:
    """A drift report for every segment of a session, in order."""
    return [
        dataclasses.replace(
            drift_audit(
                session.tokenizer,
                segment.token_ids,
                session.segment_messages(index),
                session.segment_tools(index),
                native_tools=session.renderer.native_tools,
                tool_format=session.renderer.tool_format,
            ),
            segment_reason=segment.reason.value,
        )
        for index, segment in enumerate(session.segments())
    ]
