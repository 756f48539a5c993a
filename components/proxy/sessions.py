"""Proxy sessions: one TITO session per agent run, and the registry that owns them.

A session is opened explicitly (``open_session`` here, or ``POST /sessions`` over HTTP), receives turns from
any protocol layer as canonical messages (``TurnRequest``), and ends with ``finalize`` (→ a ``Trajectory``,
written to ``RUN_DIR/trajectories`` when the registry has a run dir) or ``discard``. Turns of one session are
serialized by a per-session lock, so a harness that fires side requests concurrently still yields one
well-ordered record.

``SessionRegistry`` is the interface the HTTP app and the rollout runner use. ``LocalSessionRegistry`` keeps
sessions in this process (standalone proxy, tests); ``components.proxy.ray_sessions.ShardedSessionRegistry``
keeps them in Ray actors so that any number of Serve replicas can serve any session.

Finish reasons: a completion cut by a budget the client did not ask for (``default_max_tokens`` when the
request sets none, or the ``max_completion_tokens`` cap below the request's own ``max_tokens``) is reported to
the client as a normal stop: agents such as Claude Code treat a ``max_tokens`` stop as their own failure and
retry, while the bound is the trainer's per-turn rule. A cut by the client's own budget or by the context
window is reported as ``length`` (``max_tokens`` / ``incomplete`` in the other protocols). The token record is
the same either way.

Sampling rule: every request is sampled with the run's distribution (``ProxyConfig.sampling``: temperature,
top-p, top-k) whatever the agent sends, so that the trainer's recomputed logprobs and the rollout's are under
one known distribution; ``ProxyConfig.agent_sampling`` samples with the agent's own settings instead. Either
way the distribution used is recorded per segment (``Segment.sampling``), and a request sampled differently
from the segment it extends starts a new segment. With ``record_routed_experts`` the engine is asked for the
MoE routes of every position, recorded per segment for routing replay (R3).

Policies (multi-LoRA): a registry may serve several named policies besides its default engine (``policies``:
name → that policy's ``InferenceEngine``, e.g. ``EmbeddedEngine.policy(name)``, one LoRA adapter on a shared
base). A session is bound to one policy when it is opened (``open_session(SessionOpen(policy=...))``, or
``"policy"`` in the ``POST /sessions`` body, both of which need the admin key in isolated mode) and every turn
of it is sampled by that policy, whatever the agent sends: the protocols' ``model`` field is ignored, so an
agent holding one session's token cannot reach another policy's adapter. Each token records its own policy's
adapter version. A registry with policies writes no trajectories itself (``run_dir`` must be unset): one store
would mix the policies' trajectories; each policy's runner keeps the trajectories ``finalize`` returns.

Finalize status rule: an explicit status other than ``ok`` wins; otherwise a session whose prompt outgrew the
context window finalizes as ``context_overflow`` (trainable) and the rest as ``ok``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from components.errors import ContextOverflowError, EngineError
from components.json_types import JsonObject
from components.protocols import (
    GenerationResult,
    InferenceEngine,
    SamplingParams,
    SessionControl,
    SessionDescription,
    SessionOpen,
    SessionOutcome,
    StreamingEngine,
)
from components.proxy.config import ProxyConfig
from components.proxy.errors import InvalidRequestError, SessionNotFoundError
from components.sampling import SamplingDistribution
from components.tito import AssistantReply, TitoSession
from components.tito.formats import ReplyDelta
from components.tito.messages import ChatMessage, ToolSpec
from components.tito.session import PreparedTurn
from components.trajectory import (
    MALFORMED_TOOL_CALLS_METRIC,
    Segment,
    Trajectory,
    TrajectoryStatus,
    with_turn_rewards,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MAX_REMEMBERED_CLOSED_SESSIONS = 100_000


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """One policy call, protocol-independent: the whole conversation so far plus sampling options."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None  # None: the proxy's default_max_tokens
    temperature: float = 1.0  # the agent's sampling settings: used only with ProxyConfig.agent_sampling
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k truncation
    stop: tuple[str, ...] = ()
    seed: int | None = None
    want_token_logprobs: bool = False  # return each sampled token's text and logprob (OpenAI ``logprobs``)
    want_deltas: bool = False  # return the reply as the deltas its tokens make (streaming responses)


@dataclass(frozen=True, kw_only=True)
class TokenLogprob:
    token: str
    logprob: float


@dataclass(frozen=True, kw_only=True)
class TurnOutcome:
    """What the policy answered, parsed by the TITO core."""

    reply: AssistantReply
    num_prompt_tokens: int
    num_completion_tokens: int
    token_logprobs: tuple[TokenLogprob, ...] | None = None
    deltas: tuple[ReplyDelta, ...] | None = None  # with ``want_deltas``: content/reasoning/tool-call deltas


@dataclass(frozen=True, kw_only=True)
class TurnStarted:
    """The first event of a turn streamed as the engine samples it: deltas (``ReplyDelta``) follow as its tokens
    settle them, then the ``TurnOutcome``."""

    num_prompt_tokens: int


# What ``SessionRegistry.stream_turn`` yields: ``TurnStarted``, deltas, then the outcome - or, for an engine that
# does not stream, only the outcome (whose ``deltas`` a protocol replays).
TurnEvent = TurnStarted | ReplyDelta | TurnOutcome


class SessionRegistry(SessionControl, Protocol):
    """Owns proxy sessions: ``SessionControl`` (what the rollout runner uses) plus the proxy's own turn calls.
    Contract: every method is async; an unknown, finalized or discarded session id raises
    ``SessionNotFoundError``; bad conversations raise ``InvalidRequestError``; a prompt over the window raises
    ``ContextOverflowError`` and marks the session (the record so far is kept and stays trainable)."""

    async def run_turn(self, session_id: str, request: TurnRequest) -> TurnOutcome: ...

    def stream_turn(self, session_id: str, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        """``run_turn`` as events: with ``want_deltas`` and a streaming engine, ``TurnStarted`` once the engine
        has sampled, each delta as its tokens arrive, then the ``TurnOutcome``; otherwise the outcome alone.
        Errors raise from the iteration (before ``TurnStarted`` for what ``run_turn`` refuses); closing the
        iterator early aborts the engine's request (the turn is then not recorded)."""
        ...

    async def count_tokens(
        self, session_id: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> int: ...


def with_session_id(request: SessionOpen) -> SessionOpen:
    """``request`` with its session id validated, or a fresh one when it names none."""
    session_id = request.session_id
    return dataclasses.replace(
        request,
        session_id=validate_session_id(session_id) if session_id is not None else new_session_id(),
    )


def new_session_id() -> str:
    """A fresh, URL-safe session id."""
    return uuid.uuid4().hex


def validate_session_id(session_id: str) -> str:
    """Session ids travel in URL paths: letters, digits, ``-`` and ``_`` only, 1-128 characters."""
    if not isinstance(session_id, str) or not 0 < len(session_id) <= 128:
        raise InvalidRequestError("session_id: must be a string of 1-128 characters")
    if not all(c.isascii() and (c.isalnum() or c in "-_") for c in session_id):
        raise InvalidRequestError(f"session_id: {session_id!r} may contain only letters, digits, '-' and '_'")
    return session_id


def validate_policy_name(policy: str) -> str:
    """Policy names follow the session-id rule (letters, digits, ``-`` and ``_``, 1-128 characters)."""
    if not isinstance(policy, str) or not 0 < len(policy) <= 128:
        raise InvalidRequestError("policy: must be a string of 1-128 characters")
    if not all(c.isascii() and (c.isalnum() or c in "-_") for c in policy):
        raise InvalidRequestError(f"policy: {policy!r} may contain only letters, digits, '-' and '_'")
    return policy


def message_to_json(message: ChatMessage) -> JsonObject:
    """A canonical message as plain JSON (OpenAI-like field names)."""
    out: JsonObject = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [dataclasses.asdict(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning:
        out["reasoning"] = message.reasoning
    return out


def segment_to_json(segment: Segment) -> JsonObject:
    """A segment as JSON lists."""
    return {
        "reason": segment.reason.value,
        "token_ids": segment.token_ids.tolist(),
        "loss_mask": segment.loss_mask.tolist(),
        "logprobs": segment.logprobs.tolist(),
        "weight_versions": segment.weight_versions.tolist(),
        "sampling": dataclasses.asdict(segment.sampling),
        "parent_segment": segment.parent_segment,
        "branch_position": segment.branch_position,
        "branch_kind": segment.branch_kind.value,
        # the routes themselves (large) stay in the stored trajectory; JSON readers get their shape
        "routed_experts_shape": None
        if segment.routed_experts is None
        else list(segment.routed_experts.shape),
        "turn_rewards": None if segment.turn_rewards is None else segment.turn_rewards.tolist(),
    }


def trajectory_to_json(trajectory: Trajectory) -> JsonObject:
    """A trajectory as JSON (the body of ``POST /s/{id}/finalize``)."""
    return {
        "trajectory_id": trajectory.trajectory_id,
        "group_id": trajectory.group_id,
        "task_id": trajectory.task_id,
        "harness": trajectory.harness,
        "status": trajectory.status.value,
        "failure_reason": trajectory.failure_reason,
        "reward": trajectory.reward,
        "step": trajectory.step,
        "metrics": dict(trajectory.metrics),
        "segments": [segment_to_json(s) for s in trajectory.segments],
        "messages": trajectory.messages,
        "log": trajectory.log,
    }


def validate_tool_results(messages: Sequence[ChatMessage]) -> None:
    """Every tool result must answer a tool call made by an earlier assistant turn."""
    known_call_ids: set[str] = set()
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            known_call_ids.add(call.id)
        if message.role == "tool" and message.tool_call_id not in known_call_ids:
            raise InvalidRequestError(
                f"messages[{index}]: tool result for unknown tool call id {message.tool_call_id!r}; "
                "it must answer a tool call of an earlier assistant message"
            )


@dataclass(kw_only=True, eq=False)
class _Session:
    info: SessionOpen  # as opened, with its session_id resolved
    engine: InferenceEngine  # the session's policy: fixed when it is opened
    tito: TitoSession
    lock: asyncio.Lock
    # Per segment index: the latest request's messages and the reply to it (the viewer's conversation).
    conversations: dict[int, tuple[tuple[ChatMessage, ...], AssistantReply]] = field(default_factory=dict)
    num_turns: int = 0
    overflowed: bool = False
    overflow_message: str = ""
    num_engine_errors: int = 0
    last_engine_error: str = ""  # the runner's evidence when an agent stopped because the engine failed
    refused_past_bound: bool = False  # a call past ``info.max_calls`` was refused: the session is turn_limit


class LocalSessionRegistry:
    """Sessions held in this process, each calling the engine of its policy (the default ``engine`` or one of
    ``policies``, see the module docstring)."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: PreTrainedTokenizerBase,
        config: ProxyConfig | None = None,
        *,
        policies: Mapping[str, InferenceEngine] | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config or ProxyConfig()
        self.policies = dict(policies or {})
        for name in self.policies:
            validate_policy_name(name)
        if self.policies and self.config.run_dir is not None:
            raise ValueError(
                "run_dir: a proxy serving several policies would write their trajectories into one store; "
                "leave run_dir unset and let each policy's runner keep what finalize returns"
            )
        self._sessions: dict[str, _Session] = {}
        self._closed: OrderedDict[str, str] = OrderedDict()  # session id -> "finalized" | "discarded"
        self._store = None
        if self.config.run_dir is not None:
            from components.trajectory_store import TrajectoryStore

            self._store = TrajectoryStore(self.config.run_dir)

    def _new_tito(self, session_id: str, engine: InferenceEngine) -> TitoSession:
        return TitoSession(
            self.tokenizer,
            context_window=engine.context_window,
            session_id=session_id,
            config=self.config.tito_config(),
        )

    def _engine_of(self, policy: str) -> InferenceEngine:
        if not policy:
            return self.engine
        engine = self.policies.get(validate_policy_name(policy))
        if engine is None:
            raise InvalidRequestError(
                f"policy: {policy!r} is not served by this proxy; it serves {sorted(self.policies)} "
                "(or omit it for the default engine)"
            )
        return engine

    def _get(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is not None:
            return session
        if session_id in self._closed:
            raise SessionNotFoundError(
                f"session {session_id!r} was already {self._closed[session_id]}; open a new one with POST /sessions"
            )
        raise SessionNotFoundError(
            f"unknown session {session_id!r}: create one with POST /sessions (or the registry's open_session) "
            "and use its base_url http://HOST:PORT/s/{session_id}"
        )

    @property
    def num_open_sessions(self) -> int:
        return len(self._sessions)

    async def open_session(self, request: SessionOpen = SessionOpen()) -> str:
        """Start recording a new session bound to ``request.policy`` ("" = the default engine); returns its id
        (a fresh one unless given)."""
        info = with_session_id(request)
        session_id = info.session_id
        assert session_id is not None
        engine = self._engine_of(info.policy)
        if session_id in self._sessions or session_id in self._closed:
            raise InvalidRequestError(
                f"session_id: {session_id!r} is already in use; pick another or omit it"
            )
        self._sessions[session_id] = _Session(
            info=info, engine=engine, tito=self._new_tito(session_id, engine), lock=asyncio.Lock()
        )
        return session_id

    async def run_turn(self, session_id: str, request: TurnRequest) -> TurnOutcome:
        """Prepare the prompt with TITO, call the engine, record and parse the reply."""
        session = self._get(session_id)
        validate_tool_results(request.messages)
        async with session.lock:
            turn, params, max_tokens = self._prepare(session, request)
            try:
                result = await session.engine.generate(turn.prompt_ids, params)
            except Exception as error:
                self._engine_failed(session, error)
                raise
            deltas = session.tito.reply_deltas(turn, result.output_ids) if request.want_deltas else None
            return self._complete(session, request, turn, result, max_tokens, deltas)

    async def stream_turn(self, session_id: str, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        """See ``SessionRegistry.stream_turn``: the reply's deltas as the engine samples its tokens."""
        session = self._get(session_id)
        engine = session.engine
        if not request.want_deltas or not isinstance(engine, StreamingEngine):
            yield await self.run_turn(session_id, request)  # the protocol replays the finished generation
            return
        validate_tool_results(request.messages)
        async with session.lock:
            turn, params, max_tokens = self._prepare(session, request)
            tokens = session.tito.reply_tokens(turn)
            deltas: list[ReplyDelta] = []
            fed: list[int] = []  # the ids streamed so far
            started = False
            stream = engine.generate_stream(turn.prompt_ids, params)
            try:
                while True:
                    try:
                        item = await anext(stream)
                    except StopAsyncIteration:
                        error = EngineError("the engine's stream ended without its GenerationResult")
                        self._engine_failed(session, error)
                        raise error from None
                    except Exception as error:
                        self._engine_failed(session, error)
                        raise
                    if isinstance(item, GenerationResult):
                        result = item
                        break
                    if not started:  # the engine took the request: from here on errors are in-stream
                        started = True
                        yield TurnStarted(num_prompt_tokens=len(turn.prompt_ids))
                    fed.extend(item.output_ids)
                    new = tokens.feed(item.output_ids)
                    deltas.extend(new)
                    for delta in new:
                        yield delta
            finally:
                await stream.aclose()
            if list(result.output_ids[: len(fed)]) != fed:
                error = EngineError("the engine's streamed tokens are not its GenerationResult's")
                self._engine_failed(session, error)
                raise error
            if rest := result.output_ids[len(fed) :]:  # tokens the engine did not stream as chunks
                if not started:
                    yield TurnStarted(num_prompt_tokens=len(turn.prompt_ids))
                for delta in tokens.feed(rest):
                    deltas.append(delta)
                    yield delta
            for delta in tokens.finish():
                deltas.append(delta)
                yield delta
            yield self._complete(session, request, turn, result, max_tokens, tuple(deltas))

    def _prepare(self, session: _Session, request: TurnRequest) -> tuple[PreparedTurn, SamplingParams, int]:
        """The turn's prompt (TITO) and sampling parameters, once the session may take one more call."""
        bound = session.info.max_calls
        if bound and session.num_turns >= bound:
            session.refused_past_bound = True
            raise InvalidRequestError(
                f"this session's bound of {bound} model calls is reached; no further call is answered "
                "(the run ends as turn_limit)"
            )
        max_tokens = request.max_tokens or self.config.default_max_tokens
        if self.config.max_completion_tokens is not None:
            max_tokens = min(max_tokens, self.config.max_completion_tokens)
        sampling = self._sampling_for(request)
        try:
            turn = session.tito.prepare(
                request.messages, request.tools, max_tokens=max_tokens, sampling=sampling
            )
        except ContextOverflowError as error:
            session.overflowed = True
            session.overflow_message = str(error)
            raise
        params = SamplingParams(
            max_tokens=turn.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop_token_ids=tuple(turn.stop_token_ids),
            stop_strings=request.stop,
            seed=request.seed,
            return_routed_experts=self.config.record_routed_experts,
        )
        return turn, params, max_tokens

    @staticmethod
    def _engine_failed(session: _Session, error: Exception) -> None:
        """Record an engine failure on the session (an overflow marks it; a refused request is the client's)."""
        if isinstance(error, ContextOverflowError):
            session.overflowed = True
            session.overflow_message = str(error)
        elif not isinstance(
            error, ValueError
        ):  # a request the engine refuses (e.g. sampling it cannot record)
            session.num_engine_errors += 1
            session.last_engine_error = f"{type(error).__name__}: {error}"

    def _complete(
        self,
        session: _Session,
        request: TurnRequest,
        turn: PreparedTurn,
        result: GenerationResult,
        max_tokens: int,
        deltas: tuple[ReplyDelta, ...] | None,
    ) -> TurnOutcome:
        """Record the engine's result in the session and parse the reply."""
        reply = session.tito.complete(turn, result)
        if reply.finish_reason == "length" and self._cut_by_proxy(request, max_tokens, turn.max_tokens):
            reply = dataclasses.replace(reply, finish_reason="tool_calls" if reply.tool_calls else "stop")
        session.conversations[reply.segment_index] = (tuple(request.messages), reply)
        session.num_turns += 1
        token_logprobs = None
        if request.want_token_logprobs:
            token_logprobs = tuple(
                TokenLogprob(token=self.tokenizer.decode([token_id]), logprob=float(logprob))
                for token_id, logprob in zip(result.output_ids, result.logprobs, strict=True)
            )
        return TurnOutcome(
            reply=reply,
            num_prompt_tokens=reply.num_prompt_tokens,
            num_completion_tokens=reply.num_completion_tokens,
            token_logprobs=token_logprobs,
            deltas=deltas,
        )

    def _sampling_for(self, request: TurnRequest) -> SamplingDistribution:
        """The distribution this turn is sampled with: the run's, unless the config lets the agent choose."""
        if not self.config.agent_sampling:
            return self.config.sampling
        try:
            return SamplingDistribution(
                temperature=request.temperature, top_p=request.top_p, top_k=request.top_k
            )
        except ValueError as error:
            raise InvalidRequestError(f"sampling: {error}") from error

    def _cut_by_proxy(self, request: TurnRequest, budget: int, clamped_budget: int) -> bool:
        """Whether a length-truncated completion was cut by a budget the client did not ask for (the proxy's
        default or cap), rather than by the client's own ``max_tokens`` or the context window."""
        if clamped_budget < budget:  # the context window cut it: a real length stop
            return False
        return request.max_tokens is None or budget < request.max_tokens

    async def count_tokens(
        self, session_id: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> int:
        """How many prompt tokens these messages would take (nothing is recorded)."""
        session = self._get(session_id)
        return int(session.tito.count_tokens(messages, tools))

    async def describe(self, session_id: str) -> SessionDescription:
        """The session's record so far: segments (token ids, mask, logprobs, versions) and counters."""
        session = self._get(session_id)
        return SessionDescription(
            session_id=session_id,
            policy=session.info.policy,
            status=self._status_so_far(session),
            num_turns=session.num_turns,
            num_engine_errors=session.num_engine_errors,
            num_malformed_tool_calls=session.tito.num_malformed_tool_calls,
            tool_format=session.tito.renderer.tool_format.name,
            reasoning_format=session.tito.reply_parser.reasoning_format.name,
            last_engine_error=session.last_engine_error,
            segments=tuple(segment_to_json(s) for s in session.tito.segments()),
        )

    @staticmethod
    def _ended_by_proxy(session: _Session) -> tuple[TrajectoryStatus, str] | None:
        """The status the proxy itself gave the session, with its reason: context overflow, or a call refused
        past its bound (turn limit); ``None`` while neither happened. ``describe`` and ``finalize`` both read
        it, so the two never disagree."""
        if session.overflowed:
            return TrajectoryStatus.CONTEXT_OVERFLOW, (
                session.overflow_message or "the prompt outgrew the context window"
            )
        if session.refused_past_bound:
            return (
                TrajectoryStatus.TURN_LIMIT,
                f"the proxy refused a call past {session.info.max_calls} calls",
            )
        return None

    @classmethod
    def _status_so_far(cls, session: _Session) -> str:
        ended = cls._ended_by_proxy(session)
        return ended[0].value if ended else "open"

    def _final_messages_json(self, session: _Session, segments: Sequence[Segment]) -> str:
        """The conversation of the main segment (the longest one; side requests such as title generation
        live in short segments of their own): its latest request plus the reply to it."""
        if not session.conversations:
            return "[]"
        main = max(session.conversations, key=lambda index: (len(segments[index].token_ids), index))
        messages, reply = session.conversations[main]
        return json.dumps([message_to_json(m) for m in (*messages, reply.to_message())], ensure_ascii=False)

    async def finalize(self, session_id: str, outcome: SessionOutcome = SessionOutcome()) -> Trajectory:
        """Close the session and turn its record into a ``Trajectory`` (written to the store if there is one).
        ``outcome.turn_rewards``: a process reward per model call of the session, in call order (turn-level
        credit)."""
        session = self._get(session_id)
        info, status, failure_reason = session.info, outcome.status, outcome.failure_reason
        if status is not None and status not in {s.value for s in TrajectoryStatus}:
            raise InvalidRequestError(
                f"status: must be one of {[s.value for s in TrajectoryStatus]}, got {status!r}"
            )
        resolved_status = TrajectoryStatus(status) if status is not None else TrajectoryStatus.OK
        ended = self._ended_by_proxy(session)
        if resolved_status == TrajectoryStatus.OK and ended:
            resolved_status, failure_reason = ended[0], failure_reason or ended[1]
        if resolved_status == TrajectoryStatus.OK:
            failure_reason = ""
        elif not failure_reason:
            failure_reason = f"finalized with status {resolved_status.value}"
        segments = session.tito.segments()
        try:
            if outcome.turn_rewards:
                segments = with_turn_rewards(segments, outcome.turn_rewards)
            trajectory = Trajectory(
                trajectory_id=session_id,
                group_id=outcome.group_id or info.group_id or session_id,
                task_id=outcome.task_id or info.task_id or session_id,
                harness=outcome.harness or info.harness or "unknown",
                status=resolved_status,
                failure_reason=failure_reason,
                reward=outcome.reward,
                step=info.step if outcome.step is None else outcome.step,
                # the proxy's own count: call-like text the tool format could not parse (served as content)
                metrics={
                    **outcome.metrics,
                    MALFORMED_TOOL_CALLS_METRIC: float(session.tito.num_malformed_tool_calls),
                },
                segments=tuple(segments),
                messages_json=self._final_messages_json(session, segments),
                log=outcome.log,
            )
        except (TypeError, ValueError) as error:
            raise InvalidRequestError(str(error)) from error
        if self._store is not None:
            await asyncio.to_thread(self._store.write, [trajectory])
        self._close(session_id, "finalized")
        return trajectory

    async def discard(self, session_id: str) -> None:
        """Drop the session and its record."""
        self._get(session_id)
        self._close(session_id, "discarded")

    def _close(self, session_id: str, how: str) -> None:
        self._sessions.pop(session_id, None)
        self._closed[session_id] = how
        while len(self._closed) > MAX_REMEMBERED_CLOSED_SESSIONS:
            self._closed.popitem(last=False)
