"""TITO (token-in, token-out) sessions: the exact token record of one agent conversation.

A ``TitoSession`` turns each request of a conversation (canonical messages + tools) into prompt token ids for
the engine, and records the engine's answer (``GenerationResult``) token for token into *segments*.

How a request is turned into ids:

* The first request of a conversation is rendered by the model's chat template and tokenized once.
* A request that *extends* a held conversation (the held messages, the assistant reply the engine produced,
  then new tool/user messages) reuses the held ids exactly - prompt ids and the engine's sampled ids, which
  are never decoded and re-encoded - and tokenizes only the appended messages. Their text is what the
  template puts after the finished assistant turn (``ChatTemplateRenderer.new_messages_text``), preceded by
  what the template writes after the sampled end-of-turn token (``\\n`` for ChatML). The cost of a turn grows
  with its new tokens, not with the history: held messages are compared one by one (cheap string
  equality, with a cached answer for re-serialised replies) and nothing old is rendered again.
* The assistant reply a harness sends back is matched to the completion the engine produced even when the
  harness re-serialised it: whitespace, JSON key order of tool arguments, tool call ids, and reasoning text
  (dropped, moved into ``reasoning`` or inlined as ``<think>``) do not matter.
* Anything else starts a new segment whose ``reason`` says why: ``history_rewritten`` (compaction, edits,
  a retried or forked request), ``tools_changed``, ``system_changed``, ``prefix_mismatch`` (the template
  renders the held turns differently now), ``render_failed`` (incremental rendering failed),
  ``sampling_changed`` (the request is sampled from another distribution than the segment it extends: every
  segment has one sampling distribution, which the trainer recomputes logprobs under).

Several segments stay open: a request extends whichever held conversation it extends (the longest held
prefix wins), so a harness's side requests (titles, summaries with another system prompt) start their own
segment without fragmenting the main conversation. A request that agrees with a held conversation up to an
earlier reply (a retry, a fork) starts a new segment that still reuses the exact held ids up to that reply,
with loss mask 0 on them (they are trained where they were first sampled).

Segments hold: loss mask 1 exactly on sampled tokens, the engine's logprobs there (0 elsewhere), the
weight version per sampled token (-1 elsewhere), the sampling distribution, and (when the engine returned
them) the experts routed at each position: a turn's routes cover its whole prompt and output but the last
token; positions the segment already holds keep the routes they were first recorded with. A turn is committed only by ``complete``: a prepared turn
whose generation failed leaves no trace. A session is not thread-safe; use it from one event loop.

API (what the proxy calls)::

    session = TitoSession(tokenizer, context_window=8192, session_id="s1")   # config=TitoConfig(...) optional
    turn = session.prepare(messages, tools, max_tokens=512,   # -> PreparedTurn (prompt_ids, clamped max_tokens,
                           sampling=SamplingDistribution())   #    stop_token_ids, segment_index, new_segment_reason)
    reply = session.complete(turn, generation_result)         # -> AssistantReply (content, reasoning, tool_calls,
                                                              #    finish_reason, token counts, segment_index)
    session.reply_deltas(turn, output_ids)                    # the reply as streamed deltas (content, reasoning,
                                                              #    each tool call once complete), same call ids
    session.reply_tokens(turn)                                # the same deltas fed id by id as the engine samples
    session.count_tokens(messages, tools)                     # prompt length prepare would produce, no recording
    session.segments()                                        # list[Segment], in order of creation
    session.overflowed                                        # True once a prompt reached the context window

Errors: ``prepare`` raises ``ContextOverflowError`` (prompt >= context window; sets ``overflowed``),
``TemplateRenderError`` (a ``ValueError``: the template cannot render the conversation) and ``ValueError`` for
malformed requests (no messages, a trailing assistant message, max_tokens < 1). ``complete`` raises
``MissingLogprobsError`` when a sampled token has no finite logprob, ``EngineError`` when the record breaks
the engine contract (no weight version, a positive logprob), ``ValueError`` for a turn completed twice; it
records nothing when it raises.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from components.config import option, require, require_positive
from components.errors import ContextOverflowError, EngineError, MissingLogprobsError
from components.protocols import FinishReason, GenerationResult
from components.sampling import SamplingDistribution
from components.tito.formats import (
    REASONING_FORMATS,
    TOOL_FORMATS,
    ReplyDelta,
    ReplyParser,
    ReplyStream,
    detect_reasoning_format,
    reasoning_format_named,
    tool_format_named,
)
from components.tito.messages import ChatMessage, ToolCall, ToolSpec
from components.tito.rendering import ChatTemplateRenderer, TemplatePrefixError, TemplateRenderError
from components.tito.tool_calls import canonical_arguments, squash_whitespace, strip_think
from components.trajectory import BranchKind, Segment, SegmentReason

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Engines compute logprobs in float32; a sampled token's logprob may round to a hair above 0.
_LOGPROB_ROUNDING_SLACK = 1e-3
# A tool-call argument or a reply shorter than this is too common ("ls", "ok") to identify a branch's origin.
_MIN_LINEAGE_TEXT_CHARS = 24


class TemplateFormats(Protocol):
    """The model family's tool-call and reasoning formats a session renders and parses with, by name (None:
    detected from the chat template). Whatever has the two properties serves: ``TemplateFormatsConfig``, or a
    run's proxy brick itself (``ServeProxyConfig`` is one)."""

    @property
    def tool_format(self) -> str | None: ...
    @property
    def reasoning_format(self) -> str | None: ...


def check_template_formats(formats: TemplateFormats) -> None:
    """``ValueError`` naming the field and listing the registered formats for a name no format has."""
    require(
        formats.tool_format is None or formats.tool_format in TOOL_FORMATS,
        "tool_format",
        f"unknown format {formats.tool_format!r}; choose one of {sorted(TOOL_FORMATS)} (or None: detect)",
    )
    require(
        formats.reasoning_format is None or formats.reasoning_format in REASONING_FORMATS,
        "reasoning_format",
        f"unknown format {formats.reasoning_format!r}; choose one of {sorted(REASONING_FORMATS)} "
        "(or None: detect)",
    )


@dataclass(kw_only=True, frozen=True)
class TemplateFormatsConfig:
    """The policy's tool-call and reasoning formats by name (every proxy kind's config is one)."""

    tool_format: str | None = option(
        None,
        "the policy's tool-call format (hermes, qwen3_coder, llama3_json, mistral, deepseek_v3, glm45, kimi_k2, "
        "harmony); default: detected from the chat template",
        flag="tool-format",
    )
    reasoning_format: str | None = option(
        None,
        "how the policy writes reasoning (think, harmony, none); default: detected from the chat template",
        flag="reasoning-format",
    )

    def __post_init__(self) -> None:
        check_template_formats(self)


@dataclass(frozen=True, kw_only=True)
class TitoConfig:
    """How a TITO session renders and matches conversations."""

    # True: pass tools to the chat template; False: Hermes-style text in the system message;
    # None: decide from the template (templates that read ``tools`` support them).
    native_tools: bool | None = None
    # How many of the most recently used segments a request may extend or fork from.
    max_open_segments: int = 16
    # How the model writes tool calls (``components/tito/formats``: hermes, qwen3_coder, llama3_json, mistral,
    # deepseek_v3, glm45, kimi_k2, harmony) and reasoning (think, harmony, none); None: detected from the chat
    # template. The proxy passes its own formats config as it is (a run's: its proxy brick).
    formats: TemplateFormats = TemplateFormatsConfig()

    def __post_init__(self) -> None:
        require(self.native_tools in (None, True, False), "native_tools", "must be None, True or False")
        require_positive(self.max_open_segments, "max_open_segments")
        check_template_formats(self.formats)


@dataclass(frozen=True, kw_only=True)
class PreparedTurn:
    """The prompt for one request and how ``complete`` will record it.

    ``segment_index`` is the segment this turn extends, or (when ``new_segment_reason`` is set) the index the
    new segment would get if no other segment were created before ``complete``.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    segment_index: int
    new_segment_reason: SegmentReason | None
    turn_id: int
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...]
    num_reused_tokens: int  # leading prompt ids taken from a held segment, not tokenized again
    num_reused_messages: int  # leading request messages matched to that segment's held conversation
    source_segment_index: int | None  # the held segment the reused ids come from
    sampling: SamplingDistribution = SamplingDistribution()  # what the engine samples this turn with


@dataclass(frozen=True, kw_only=True)
class AssistantReply:
    """The engine's completion as a chat message, for the proxy to serve."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: Literal["stop", "length", "tool_calls"]
    num_prompt_tokens: int
    num_completion_tokens: int
    segment_index: int  # the segment this turn was recorded in
    raw_text: str  # the sampled text, special tokens included
    num_malformed_tool_calls: int = 0  # call-like blocks the format could not parse (they stay content)

    def to_message(self) -> ChatMessage:
        """The reply as the canonical assistant message a harness sends back next turn."""
        return ChatMessage(
            role="assistant", content=self.content, tool_calls=self.tool_calls, reasoning=self.reasoning
        )


def _tool_calls_key(calls: Sequence[ToolCall]) -> tuple[tuple[str, str], ...]:
    return tuple((call.name, call.arguments) for call in calls)


def _canonical_tool_calls(calls: Sequence[ToolCall]) -> tuple[tuple[str, str], ...]:
    return tuple((call.name, canonical_arguments(call.arguments)) for call in calls)


class _HeldMessage:
    """A request message in a held conversation; later requests must repeat it (ids and reasoning aside)."""

    def __init__(self, message: ChatMessage) -> None:
        self.message = message

    def matches(self, other: ChatMessage) -> bool:
        held = self.message
        if held.role != other.role or held.content != other.content:
            return False
        if held.tool_calls or other.tool_calls:
            return _tool_calls_key(held.tool_calls) == _tool_calls_key(
                other.tool_calls
            ) or _canonical_tool_calls(held.tool_calls) == _canonical_tool_calls(other.tool_calls)
        return True


class _HeldReply:
    """A completion the engine produced; a harness may send it back re-serialised."""

    def __init__(self, reply: AssistantReply, text: str) -> None:
        self.message = reply.to_message()
        self._squashed_content = squash_whitespace(reply.content)
        self._squashed_raw = squash_whitespace(strip_think(text))  # the sampled text without its stop token
        self._tool_calls = _canonical_tool_calls(reply.tool_calls)
        self._accepted = {(reply.content, _tool_calls_key(reply.tool_calls))}

    def matches(self, other: ChatMessage) -> bool:
        if other.role != "assistant":
            return False
        key = (other.content, _tool_calls_key(other.tool_calls))
        if key in self._accepted:
            return True
        content = squash_whitespace(strip_think(other.content))
        if other.tool_calls:
            same = _canonical_tool_calls(other.tool_calls) == self._tool_calls and content in (
                self._squashed_content,
                "",  # some harnesses keep only the tool calls of a turn
            )
        else:
            # No structured calls: either a plain reply, or a harness that reads tool calls from the text.
            same = (
                not self._tool_calls and content == self._squashed_content
            ) or content == self._squashed_raw
        if same:
            self._accepted.add(key)
        return same


@dataclass(kw_only=True)
class _Checkpoint:
    """The end of one recorded reply: where a later request may continue."""

    num_messages: int
    num_tokens: int
    closing_text: str  # what the template writes after the sampled ids to close the turn
    reply_tool_calls: tuple[ToolCall, ...]


@dataclass(kw_only=True)
class _OpenSegment:
    reason: SegmentReason
    tools_key: tuple[str, ...]
    tools: tuple[ToolSpec, ...]
    held: list[_HeldMessage | _HeldReply]
    checkpoints: list[_Checkpoint]
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    sampling: SamplingDistribution = SamplingDistribution()
    routes: list[np.ndarray] = field(default_factory=list)  # chunks of [positions, layers, top_k] expert ids
    num_routed_positions: int = 0
    last_used: int = 0
    parent: _OpenSegment | None = None  # lineage: the segment this one branched from,
    branch_position: int = 0  # after how many of its tokens,
    branch_kind: BranchKind = BranchKind.ROOT  # and why

    def append(self, ids: Sequence[int]) -> None:
        self.token_ids.extend(_interned(ids))
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.weight_versions.extend([-1] * len(ids))

    def append_sampled(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        self.token_ids.extend(_interned(ids))
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.weight_versions.extend(versions)

    def matched_messages(self, messages: Sequence[ChatMessage]) -> int:
        count = 0
        for held, message in zip(self.held, messages, strict=False):
            if not held.matches(message):
                break
            count += 1
        return count


_INTERNED_IDS: list[int] = list(range(1 << 16))


def _interned(ids: Sequence[int]) -> list[int]:
    """Token ids as shared int objects: copying a long held sequence then touches far less memory."""
    table = _INTERNED_IDS
    return [table[t] if 0 <= t < len(table) else int(t) for t in ids]


def _joined(held: list[int], appended: Sequence[int]) -> tuple[int, ...]:
    """``held + appended`` as a tuple with one copy of the (long) held ids."""
    num_held = len(held)
    held.extend(appended)
    try:
        return tuple(held)
    finally:
        del held[num_held:]


def _tools_key(tools: Sequence[ToolSpec]) -> tuple[str, ...]:
    return tuple(json.dumps(tool.to_openai(), sort_keys=True, ensure_ascii=False) for tool in tools)


def _system_of(messages: Sequence[ChatMessage]) -> ChatMessage | None:
    return messages[0] if messages and messages[0].role == "system" else None


class TitoSession:
    """The token record of one conversation (one agent run): prepare a request, complete it, read segments."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        context_window: int,
        session_id: str = "",
        config: TitoConfig | None = None,
    ) -> None:
        require_positive(context_window, "context_window")
        self.config = config or TitoConfig()
        formats = self.config.formats
        self.tokenizer = tokenizer
        self.context_window = context_window
        self.session_id = session_id
        self.renderer = ChatTemplateRenderer(
            tokenizer,
            native_tools=self.config.native_tools,
            tool_format=tool_format_named(formats.tool_format) if formats.tool_format else None,
        )
        reasoning = (
            reasoning_format_named(formats.reasoning_format)
            if formats.reasoning_format
            else detect_reasoning_format(self.renderer.template)
        )
        self.reply_parser = ReplyParser(
            self.renderer.tool_format,
            reasoning,
            reasoning_opened_by_prompt=self.renderer.generation_prompt_opens_reasoning(
                reasoning.markers[0] if reasoning.markers else ""
            ),
        )
        self.num_malformed_tool_calls = 0  # over all turns: call-like text the tool format could not parse
        self.stop_token_ids = self._find_stop_token_ids()
        self._stop_texts = {t: tokenizer.decode([t], skip_special_tokens=False) for t in self.stop_token_ids}
        self.overflowed = False
        self._segments: list[_OpenSegment] = []
        self._num_turns = 0
        self._completed_turns: set[int] = set()
        self._clock = 0
        self._last_segment: _OpenSegment | None = None

    # -- public API ---------------------------------------------------------------------------------------

    def prepare(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        max_tokens: int,
        sampling: SamplingDistribution = SamplingDistribution(),
    ) -> PreparedTurn:
        """Prompt ids for a request sampled with ``sampling``; raises ``ContextOverflowError`` (and sets
        ``overflowed``) when they fill the context window, else clamps ``max_tokens`` to the room left."""
        require_positive(max_tokens, "max_tokens")
        require(isinstance(sampling, SamplingDistribution), "sampling", "expected a SamplingDistribution")
        turn = dataclasses.replace(self._plan(messages, tools), sampling=sampling)
        if (
            turn.new_segment_reason is None
            and turn.source_segment_index is not None
            and self._segments[turn.source_segment_index].sampling != sampling
        ):
            turn = dataclasses.replace(
                turn, new_segment_reason=SegmentReason.SAMPLING_CHANGED, segment_index=len(self._segments)
            )
        num_prompt_tokens = len(turn.prompt_ids)
        if num_prompt_tokens >= self.context_window:
            self.overflowed = True
            raise ContextOverflowError(
                num_prompt_tokens=num_prompt_tokens, context_window=self.context_window
            )
        room = self.context_window - num_prompt_tokens
        return dataclasses.replace(turn, max_tokens=min(max_tokens, room))

    def complete(self, turn: PreparedTurn, result: GenerationResult) -> AssistantReply:
        """Record the engine's sampled ids, logprobs and weight versions for ``turn``; parse the reply."""
        if turn.turn_id in self._completed_turns:
            raise ValueError(f"turn: turn {turn.turn_id} was already completed")
        output_ids = [int(token) for token in result.output_ids]
        logprobs = self._checked_logprobs(output_ids, result)
        versions = self._checked_versions(output_ids, result)
        routes = self._checked_routes(turn, output_ids, result)
        ends_with_stop = bool(output_ids) and output_ids[-1] in self.stop_token_ids
        text = self.tokenizer.decode(
            output_ids[:-1] if ends_with_stop else output_ids, skip_special_tokens=False
        )
        raw_text = text + self._stop_texts[output_ids[-1]] if ends_with_stop else text
        parsed = self.reply_parser.parse(text, turn.tools, id_seed=self._id_seed(turn))
        segment = self._segment_for(turn)
        index = self._segments.index(segment)
        finish: Literal["stop", "length", "tool_calls"]
        if result.finish_reason in (FinishReason.LENGTH, FinishReason.ABORT):
            finish = "length"  # an aborted completion was cut short too; its tokens are still real samples
        else:
            finish = "tool_calls" if parsed.tool_calls else "stop"
        reply = AssistantReply(
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=parsed.tool_calls,
            finish_reason=finish,
            num_prompt_tokens=len(turn.prompt_ids),
            num_completion_tokens=len(output_ids),
            segment_index=index,
            raw_text=raw_text,
            num_malformed_tool_calls=parsed.num_malformed_tool_calls,
        )
        self.num_malformed_tool_calls += parsed.num_malformed_tool_calls
        segment.append_sampled(output_ids, logprobs, versions)
        if routes is not None:
            # positions the segment already routed keep their first record (its tokens were sampled then)
            segment.routes.append(routes[segment.num_routed_positions :])
            segment.num_routed_positions = max(segment.num_routed_positions, len(routes))
        segment.held.append(_HeldReply(reply, text))
        segment.checkpoints.append(
            _Checkpoint(
                num_messages=len(segment.held),
                num_tokens=len(segment.token_ids),
                closing_text=self._closing_after(output_ids),
                reply_tool_calls=parsed.tool_calls,
            )
        )
        self._touch(segment)
        self._completed_turns.add(turn.turn_id)
        return reply

    def reply_deltas(self, turn: PreparedTurn, output_ids: Sequence[int]) -> tuple[ReplyDelta, ...]:
        """The reply to ``turn`` as the stream of deltas its sampled ids make, token by token (the same
        content, reasoning and tool calls, with the same call ids, as ``complete`` parses)."""
        tokens = self.reply_tokens(turn)
        return (*tokens.feed(output_ids), *tokens.finish())

    def reply_tokens(self, turn: PreparedTurn) -> ReplyTokens:
        """A parser of the reply to ``turn`` fed its sampled ids as they arrive (a streaming engine): what
        ``reply_deltas`` gives for the whole reply, delta by delta, as soon as the ids settle each."""
        stream = self.reply_parser.stream(turn.tools, id_seed=self._id_seed(turn))
        return ReplyTokens(self.tokenizer, frozenset(self.stop_token_ids), stream)

    def _id_seed(self, turn: PreparedTurn) -> str:
        return f"{self.session_id}/{turn.turn_id}"

    def count_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> int:
        """How many prompt tokens this request would take (what ``prepare`` would send), without recording."""
        return len(self._plan(messages, tools).prompt_ids)

    def segments(self) -> list[Segment]:
        """The recorded segments, in order of creation."""
        index_of = {id(s): index for index, s in enumerate(self._segments)}
        return [
            Segment(
                token_ids=np.asarray(s.token_ids, dtype=np.int32),
                loss_mask=np.asarray(s.loss_mask, dtype=np.int8),
                logprobs=np.asarray(s.logprobs, dtype=np.float32),
                weight_versions=np.asarray(s.weight_versions, dtype=np.int32),
                reason=s.reason,
                sampling=s.sampling,
                routed_experts=np.concatenate(s.routes) if s.routes else None,
                parent_segment=-1 if s.parent is None else index_of[id(s.parent)],
                branch_position=s.branch_position,
                branch_kind=s.branch_kind,
            )
            for s in self._segments
        ]

    def segment_messages(self, index: int) -> tuple[ChatMessage, ...]:
        """The canonical conversation segment ``index`` records (replies as the engine produced them)."""
        return tuple(held.message for held in self._segments[index].held)

    def segment_tools(self, index: int) -> tuple[ToolSpec, ...]:
        """The tools offered throughout segment ``index``."""
        return self._segments[index].tools

    # -- planning -----------------------------------------------------------------------------------------

    def _plan(self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> PreparedTurn:
        messages = tuple(messages)
        tools = tuple(tools)
        require(len(messages) > 0, "messages", "a request needs at least one message")
        require(isinstance(messages[-1], ChatMessage), "messages", "expected ChatMessage records")
        require(
            messages[-1].role != "assistant",
            "messages",
            "the last message is an assistant message; continuing a prefilled reply is not supported",
        )
        tools_key = _tools_key(tools)
        turn_id = self._num_turns
        self._num_turns += 1
        common = dict(
            turn_id=turn_id, messages=messages, tools=tools, stop_token_ids=self.stop_token_ids, max_tokens=1
        )

        source, checkpoint = self._best_continuation(messages, tools_key)
        reason: SegmentReason | None
        if source is not None and checkpoint is not None:
            extends = checkpoint is source.checkpoints[-1]
            held_ids = source.token_ids if extends else source.token_ids[: checkpoint.num_tokens]
            reason = None if extends else SegmentReason.HISTORY_REWRITTEN
            try:
                text = checkpoint.closing_text + self.renderer.new_messages_text(
                    _system_of(messages),
                    checkpoint.reply_tool_calls,
                    messages[checkpoint.num_messages :],
                    tools,
                )
                appended = self.renderer.encode(text)
            except TemplateRenderError as error:
                # Incremental rendering failed: render the whole conversation and keep the held ids only if
                # the template still produces them.
                full = self.renderer.render_ids(messages, tools, add_generation_prompt=True)
                if full[: len(held_ids)] == held_ids:
                    appended = full[len(held_ids) :]
                else:
                    mismatch = isinstance(error, TemplatePrefixError)
                    return PreparedTurn(
                        **common,
                        prompt_ids=tuple(full),
                        segment_index=len(self._segments),
                        new_segment_reason=(
                            SegmentReason.PREFIX_MISMATCH if mismatch else SegmentReason.RENDER_FAILED
                        ),
                        num_reused_tokens=0,
                        num_reused_messages=0,
                        source_segment_index=None,
                    )
            index = self._segments.index(source)
            return PreparedTurn(
                **common,
                prompt_ids=_joined(held_ids, appended),
                segment_index=index if extends else len(self._segments),
                new_segment_reason=reason,
                num_reused_tokens=len(held_ids),
                num_reused_messages=checkpoint.num_messages,
                source_segment_index=index,
            )

        prompt_ids = self.renderer.render_ids(messages, tools, add_generation_prompt=True)
        return PreparedTurn(
            **common,
            prompt_ids=tuple(prompt_ids),
            segment_index=len(self._segments),
            new_segment_reason=self._new_segment_reason(messages, tools_key),
            num_reused_tokens=0,
            num_reused_messages=0,
            source_segment_index=None,
        )

    def _best_continuation(
        self, messages: Sequence[ChatMessage], tools_key: tuple[str, ...]
    ) -> tuple[_OpenSegment | None, _Checkpoint | None]:
        """The held segment and reply after which ``messages`` continue, preferring an extension of a whole
        segment, then the longest reused prefix."""
        best: tuple[bool, int, int] | None = None
        best_choice: tuple[_OpenSegment | None, _Checkpoint | None] = (None, None)
        recent = sorted(self._segments, key=lambda s: s.last_used, reverse=True)[
            : self.config.max_open_segments
        ]
        for segment in recent:
            if segment.tools_key != tools_key:
                continue
            matched = segment.matched_messages(messages)
            for checkpoint in reversed(segment.checkpoints):
                if checkpoint.num_messages <= matched and checkpoint.num_messages < len(messages):
                    score = (checkpoint is segment.checkpoints[-1], checkpoint.num_tokens, segment.last_used)
                    if best is None or score > best:
                        best, best_choice = score, (segment, checkpoint)
                    break
        return best_choice

    def _new_segment_reason(
        self, messages: Sequence[ChatMessage], tools_key: tuple[str, ...]
    ) -> SegmentReason:
        last = self._last_segment
        if last is None:
            return SegmentReason.START
        held_system = last.held[0].message if last.held and last.held[0].message.role == "system" else None
        system = _system_of(messages)
        if (held_system is None) != (system is None) or (
            held_system is not None and system is not None and held_system.content != system.content
        ):
            return SegmentReason.SYSTEM_CHANGED  # also when the tools changed with it: another conversation
        if last.tools_key != tools_key:
            return SegmentReason.TOOLS_CHANGED
        return SegmentReason.HISTORY_REWRITTEN

    # -- recording ----------------------------------------------------------------------------------------

    def _segment_for(self, turn: PreparedTurn) -> _OpenSegment:
        """The segment ``turn``'s tokens go into: the extended one, or a new one holding the whole prompt."""
        source = None if turn.source_segment_index is None else self._segments[turn.source_segment_index]
        if (
            turn.new_segment_reason is None
            and source is not None
            and len(source.token_ids) == turn.num_reused_tokens
            and len(source.held) == turn.num_reused_messages
        ):
            source.append(turn.prompt_ids[turn.num_reused_tokens :])
            source.held.extend(_HeldMessage(m) for m in turn.messages[turn.num_reused_messages :])
            return source
        # A new segment; also when the extended segment moved on since prepare (concurrent requests fork).
        held: list[_HeldMessage | _HeldReply] = (
            list(source.held[: turn.num_reused_messages]) if source else []
        )
        held.extend(_HeldMessage(m) for m in turn.messages[len(held) :])
        checkpoints = (
            [c for c in source.checkpoints if c.num_tokens <= turn.num_reused_tokens] if source else []
        )
        parent, position, kind = self._lineage(turn, source)
        segment = _OpenSegment(
            reason=turn.new_segment_reason or SegmentReason.HISTORY_REWRITTEN,
            tools_key=_tools_key(turn.tools),
            tools=turn.tools,
            held=held,
            checkpoints=checkpoints,
            sampling=turn.sampling,
            parent=parent,
            branch_position=position,
            branch_kind=kind,
        )
        segment.append(turn.prompt_ids)  # reused ids included: loss mask 0, trained where first sampled
        self._segments.append(segment)
        return segment

    def _lineage(
        self, turn: PreparedTurn, source: _OpenSegment | None
    ) -> tuple[_OpenSegment | None, int, BranchKind]:
        """Which segment a new one branches from, after how many of its tokens, and why.

        With held ids reused, the source is the parent: the whole of it continued is a ``continuation``, the
        same request as an earlier turn of it a ``retry``, anything else a ``fork``. A conversation rendered
        anew is a ``subagent`` when it offers tools and its first prompt is the text of a tool call one of the
        held replies made (the parent is that reply's segment, branched right after it), a ``compaction`` when it carries a reply
        the policy wrote (a summary) in a held segment, a ``subagent`` still when a later prompt is such a call's
        text (Codex's sub-agent: its environment context comes first), and otherwise a ``side_call`` beside the segment used
        last; the session's first segment is the ``root``."""
        if source is not None:
            position = turn.num_reused_tokens
            if position == len(source.token_ids) and turn.num_reused_messages == len(source.held):
                return source, position, BranchKind.CONTINUATION
            held_after = source.held[turn.num_reused_messages :]
            new_messages = turn.messages[turn.num_reused_messages :]
            same_request = len(held_after) > len(new_messages) and all(
                held.matches(message) for held, message in zip(held_after, new_messages, strict=False)
            )
            if same_request and isinstance(held_after[len(new_messages)], _HeldReply):
                return source, position, BranchKind.RETRY
            return source, position, BranchKind.FORK
        if not self._segments:
            return None, 0, BranchKind.ROOT
        prompts = [m.content for m in turn.messages if m.role == "user" and m.content]
        recent = sorted(self._segments, key=lambda s: s.last_used, reverse=True)

        def started_by_call(candidates: Sequence[str]):
            # a sub-agent acts (it has tools); a side call quoting a command (a safety check) does not
            if not turn.tools:
                return None
            return next(
                (found for p in candidates if (found := self._reply_whose_call_started(p, recent))), None
            )

        # The task as the first prompt (Claude Code's Task sub-agents), or after context prompts of the agent's own
        # (Codex's sub-agents: environment context first), checked after a resumed summary so that a summary
        # quoting a spawn call stays a compaction.
        for kind, find in (
            (BranchKind.SUBAGENT, lambda: started_by_call(prompts[:1])),
            (BranchKind.COMPACTION, lambda: self._reply_quoted_in(prompts, recent)),
            (BranchKind.SUBAGENT, lambda: started_by_call(prompts[1:])),
        ):
            found = find()
            if found is not None:
                return found[0], found[1], kind
        parent = self._last_segment or recent[0]
        return parent, len(parent.token_ids), BranchKind.SIDE_CALL

    @staticmethod
    def _reply_whose_call_started(prompt: str, segments: Sequence[_OpenSegment]):
        """(segment, tokens up to the reply) of a held reply with a tool call whose longest text argument is
        ``prompt`` (or is contained in it): the call that started this conversation."""
        if len(prompt) < _MIN_LINEAGE_TEXT_CHARS:
            return None
        for segment in segments:
            replies = [h for h in segment.held if isinstance(h, _HeldReply)]
            for reply, checkpoint in zip(reversed(replies), reversed(segment.checkpoints), strict=False):
                for call in reply.message.tool_calls:
                    arguments = call.parsed_arguments()
                    texts = (
                        [v for v in arguments.values() if isinstance(v, str)]
                        if isinstance(arguments, dict)
                        else []
                    )
                    text = max(texts, key=len, default="").strip()
                    if len(text) >= _MIN_LINEAGE_TEXT_CHARS and text in prompt:
                        return segment, checkpoint.num_tokens
        return None

    @staticmethod
    def _reply_quoted_in(prompts: Sequence[str], segments: Sequence[_OpenSegment]):
        """(segment, tokens up to the reply) of a held reply whose text one of ``prompts`` carries (a summary
        the new conversation resumes from)."""
        for segment in segments:
            replies = [h for h in segment.held if isinstance(h, _HeldReply)]
            for reply, checkpoint in zip(reversed(replies), reversed(segment.checkpoints), strict=False):
                text = reply.message.content.strip()
                if len(text) >= _MIN_LINEAGE_TEXT_CHARS and any(text in prompt for prompt in prompts):
                    return segment, checkpoint.num_tokens
        return None

    def _touch(self, segment: _OpenSegment) -> None:
        self._clock += 1
        segment.last_used = self._clock
        self._last_segment = segment

    @staticmethod
    def _checked_routes(
        turn: PreparedTurn, output_ids: list[int], result: GenerationResult
    ) -> np.ndarray | None:
        """The turn's routed experts as [positions, layers, top_k] (None when the engine returned none)."""
        if result.routed_experts is None:
            return None
        expected = len(turn.prompt_ids) + len(output_ids) - 1
        routes = np.asarray(result.routed_experts, dtype=np.int16)
        if routes.ndim != 3 or routes.shape[0] != expected:
            raise EngineError(
                f"routed_experts: the engine returned routes of shape {routes.shape} for {expected} forwarded "
                "positions (prompt + output - 1); expected [positions, moe_layers, top_k]"
            )
        return routes

    def _checked_logprobs(self, output_ids: list[int], result: GenerationResult) -> list[float]:
        logprobs = getattr(result, "logprobs", None)
        if logprobs is None or len(logprobs) != len(output_ids):
            count = "no" if logprobs is None else str(len(logprobs))
            raise MissingLogprobsError(
                f"the engine returned {len(output_ids)} sampled token ids but {count} logprobs; TITO needs the "
                "sampling logprob of every sampled token (ask the engine for logprobs, e.g. SGLang "
                "return_logprob=True) - recording a zero instead would silently corrupt training"
            )
        out = []
        for position, value in enumerate(logprobs):
            if value is None or not math.isfinite(value):
                raise MissingLogprobsError(
                    f"sampled token {position} (id {output_ids[position]}) has no usable logprob ({value!r}); "
                    "the engine must return a finite sampling logprob for every sampled token"
                )
            if value > _LOGPROB_ROUNDING_SLACK:
                raise EngineError(f"sampled token {position} has logprob {value} > 0: not a log-probability")
            out.append(min(float(value), 0.0))
        return out

    @staticmethod
    def _checked_versions(output_ids: list[int], result: GenerationResult) -> list[int]:
        versions = getattr(result, "weight_versions", None)
        if versions is None or len(versions) != len(output_ids):
            raise EngineError(
                f"the engine returned {len(output_ids)} sampled ids without a weight version each"
            )
        if any(int(v) < 0 for v in versions):
            raise EngineError(
                "the engine returned a sampled token without its weight version (negative version)"
            )
        return [int(v) for v in versions]

    # -- template facts -----------------------------------------------------------------------------------

    def _find_stop_token_ids(self) -> tuple[int, ...]:
        """EOS, plus the token that ends an assistant turn in this template when it is a single added token."""
        ids: list[int] = []
        eos = self.tokenizer.eos_token_id
        for token in eos if isinstance(eos, list) else [eos]:
            if token is not None and token not in ids:
                ids.append(int(token))
        added = self.tokenizer.get_added_vocab() if hasattr(self.tokenizer, "get_added_vocab") else {}
        closing = self.renderer.end_of_turn_text
        if closing:
            first = self.renderer.encode(closing)[:1]
            if first and first[0] not in ids and self.tokenizer.convert_ids_to_tokens(first[0]) in added:
                ids.append(first[0])
        for text in self.renderer.tool_format.stop_texts:  # e.g. Llama's <|eom_id|>, harmony's <|call|>
            token = added.get(text)
            if token is not None and token not in ids:
                ids.append(int(token))
        return tuple(ids)

    def _closing_after(self, output_ids: Sequence[int]) -> str:
        """What the template writes after these sampled ids to close the assistant turn."""
        closing = self.renderer.end_of_turn_text
        if output_ids and output_ids[-1] in self.stop_token_ids:
            stop_text = self._stop_texts[output_ids[-1]]
            if stop_text and closing.startswith(stop_text):
                return closing[len(stop_text) :]
        # Cut short (length, a stop string) or ended by another stop token: the template's closing follows.
        return closing


class ReplyTokens:
    """Sampled ids → reply deltas, incrementally (``TitoSession.reply_tokens``). Detokenization is incremental as
    inference servers do it (decode from one settled chunk back; send only text that ends on a whole
    character); a stop id is held back until an id follows it, since the reply's final stop id is no text."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, stop_token_ids: frozenset[int], stream: ReplyStream
    ) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.stream = stream
        self.ids: list[int] = []
        self._held_stop: int | None = None
        self._prefix_offset = 0
        self._read_offset = 0

    def feed(self, output_ids: Sequence[int]) -> list[ReplyDelta]:
        """The deltas these next sampled ids settle."""
        deltas: list[ReplyDelta] = []
        for token in output_ids:
            if self._held_stop is not None:
                self._append(self._held_stop, deltas)
                self._held_stop = None
            if int(token) in self.stop_token_ids:
                self._held_stop = int(token)
            else:
                self._append(int(token), deltas)
        return deltas

    def finish(self) -> list[ReplyDelta]:
        """The rest, once the last id was fed (a final stop id is dropped)."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        deltas: list[ReplyDelta] = []
        if full.startswith(self.stream.text):
            deltas.extend(self.stream.feed(full[len(self.stream.text) :]))
        deltas.extend(self.stream.finish())
        return deltas

    def _append(self, token: int, deltas: list[ReplyDelta]) -> None:
        self.ids.append(token)
        ids, prefix, read = self.ids, self._prefix_offset, self._read_offset
        settled = self.tokenizer.decode(ids[prefix:read], skip_special_tokens=False)
        window = self.tokenizer.decode(ids[prefix:], skip_special_tokens=False)
        if len(window) > len(settled) and not window.endswith("\ufffd"):
            deltas.extend(self.stream.feed(window[len(settled) :]))
            self._prefix_offset, self._read_offset = read, len(ids)
