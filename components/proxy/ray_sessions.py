"""Session state in Ray actors, so that any number of proxy replicas can serve any session.

Design: the Serve replicas only translate protocols. Sessions (TITO records) live in a few async Ray actors,
*session shards*; a session id is hashed (CRC-32, stable across processes) to one shard, which owns the
session's ``TitoSession``, calls the engine and writes the finalized trajectory. Every replica holds the same
``ShardedSessionRegistry`` (just the shard handles), so a session's turns reach its state whichever replica
receives them - no sticky routing needed - and a replica can die without losing a session.

``ShardedSessionRegistry`` implements ``SessionRegistry``: the rollout runner can call ``open_session`` /
``finalize`` / ``discard`` on it directly from the driver. Errors cross the actor boundary as
``RemoteCallError`` and are turned back into the typed exceptions (``SessionNotFoundError``,
``ContextOverflowError`` ...) on the caller's side.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from components.config import require_positive
from components.errors import EngineError
from components.protocols import InferenceEngine, SessionDescription, SessionOpen, SessionOutcome
from components.proxy.config import ProxyConfig
from components.proxy.errors import RemoteCallError, SessionNotFoundError, from_remote, to_remote
from components.proxy.sessions import (
    LocalSessionRegistry,
    TurnEvent,
    TurnOutcome,
    TurnRequest,
    with_session_id,
)
from components.remote_waits import PENDING_WAITS, EngineStalledError
from components.tito.messages import ChatMessage, ToolSpec
from components.trajectory import Trajectory

if TYPE_CHECKING:
    from ray.actor import ActorHandle

T = TypeVar("T")

# A shard call includes the engine's generation of a turn (see ``ENGINE_CALL_DEADLINE_S``), and a little more.
SHARD_CALL_DEADLINE_S = 960.0
SHARD_START_DEADLINE_S = 300.0  # a shard actor loads its tokenizer; Ray may first start a worker for it


class SessionShard:
    """A Ray actor holding some of the sessions (a ``LocalSessionRegistry``) and calling the shared engine.

    Each method is the ``LocalSessionRegistry`` method of the same name; any failure comes back as a
    ``RemoteCallError`` (turned back into the typed exception by ``ShardedSessionRegistry``).

    A shard that dies is restarted by Ray (``max_restarts``) with no sessions: the calls in flight fail as
    ``EngineError`` ("session shard N died"), and a later call for a session of the dead incarnation is an
    ``EngineError`` saying the session was lost with the shard (an ``engine_error`` rollout, replaced), never a
    404 that would read as the agent's mistake; new sessions work on the restarted shard."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer_path: str,
        config: ProxyConfig,
        policies: Mapping[str, InferenceEngine] | None = None,
    ) -> None:
        import ray
        from transformers import AutoTokenizer

        self.registry = LocalSessionRegistry(
            engine, AutoTokenizer.from_pretrained(tokenizer_path), config, policies=policies
        )
        self._restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._opened_here: set[str] = set()  # after a restart: the sessions of this incarnation

    @contextlib.contextmanager
    def _remote_errors(self, session_id: str) -> Iterator[None]:
        """Send a failure across the actor boundary as a picklable ``RemoteCallError``."""
        try:
            yield
        except SessionNotFoundError as missing:
            lost = self._restarted and session_id not in self._opened_here
            lost_error = EngineError(
                f"session {session_id} was lost when its session shard died and restarted"
            )
            raise to_remote(lost_error if lost else missing) from None
        except Exception as error:
            raise to_remote(error) from None

    async def open_session(self, request: SessionOpen) -> str:
        session_id = str(request.session_id)  # the sharded registry names it: it picked this shard by it
        if self._restarted:
            self._opened_here.add(session_id)
        with self._remote_errors(session_id):
            return await self.registry.open_session(request)

    async def run_turn(self, session_id: str, request: TurnRequest) -> TurnOutcome:
        with self._remote_errors(session_id):
            return await self.registry.run_turn(session_id, request)

    async def stream_turn(self, session_id: str, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        """``LocalSessionRegistry.stream_turn`` as a Ray streaming generator: each event goes to the replica as
        the engine samples it; cancelling the Ray task closes the registry's stream, which aborts the engine's
        request."""
        with self._remote_errors(session_id):
            stream = self.registry.stream_turn(session_id, request)
            try:
                async for event in stream:
                    yield event
            finally:
                await stream.aclose()

    async def count_tokens(
        self, session_id: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> int:
        with self._remote_errors(session_id):
            return await self.registry.count_tokens(session_id, messages, tools)

    async def describe(self, session_id: str) -> SessionDescription:
        with self._remote_errors(session_id):
            return await self.registry.describe(session_id)

    async def finalize(self, session_id: str, outcome: SessionOutcome) -> Trajectory:
        with self._remote_errors(session_id):
            return await self.registry.finalize(session_id, outcome)

    async def discard(self, session_id: str) -> None:
        with self._remote_errors(session_id):
            await self.registry.discard(session_id)

    def num_open_sessions(self) -> int:
        return self.registry.num_open_sessions


class ShardedSessionRegistry:
    """The ``SessionRegistry`` over session shards; cheap to pickle into every Serve replica."""

    def __init__(
        self, shards: Sequence[ActorHandle[SessionShard]], *, shard_arguments: Sequence[object] = ()
    ) -> None:
        """``shard_arguments``: the object refs the shards were built from, held while the registry lives so
        that Ray can restart a dead shard from them."""
        if not shards:
            raise ValueError("shards: need at least one session shard actor")
        self.shards = tuple(shards)
        self.shard_arguments = tuple(shard_arguments)

    def shard_index(self, session_id: str) -> int:
        """Which shard owns ``session_id`` (stable across processes)."""
        return zlib.crc32(session_id.encode()) % len(self.shards)

    def _shard(self, session_id: str) -> ActorHandle[SessionShard]:
        """The shard actor owning ``session_id``."""
        return self.shards[self.shard_index(session_id)]

    async def _result(self, session_id: str, request: str, reply: Awaitable[T]) -> T:
        """Await one call on ``session_id``'s shard for at most ``SHARD_CALL_DEADLINE_S``; remote errors come back
        typed; a dead or stalled shard is an ``EngineError`` naming it (the rollout is an ``engine_error``:
        replaced, never trained; its session is gone with the shard)."""
        from ray.exceptions import RayActorError, RayTaskError

        shard = f"session shard {self.shard_index(session_id)}"
        try:
            return await PENDING_WAITS.within(
                reply,
                deadline_s=SHARD_CALL_DEADLINE_S,
                component=shard,
                request=f"{request}(session {session_id})",
                error=EngineStalledError,
            )
        except RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, RemoteCallError):
                raise from_remote(cause) from None
            raise
        except RayActorError as error:
            raise EngineError(f"{shard} died; session {session_id} was discarded with it: {error}") from None

    async def open_session(self, request: SessionOpen = SessionOpen()) -> str:
        """Start recording a new session bound to ``request.policy`` on its shard; returns its id."""
        request = with_session_id(request)
        session_id = str(request.session_id)
        return await self._result(
            session_id, "open_session", self._shard(session_id).open_session.remote(request)
        )

    async def run_turn(self, session_id: str, request: TurnRequest) -> TurnOutcome:
        """See ``LocalSessionRegistry.run_turn``."""
        return await self._result(
            session_id, "run_turn", self._shard(session_id).run_turn.remote(session_id, request)
        )

    async def stream_turn(self, session_id: str, request: TurnRequest) -> AsyncIterator[TurnEvent]:
        """See ``SessionRegistry.stream_turn``: the shard's events through a Ray streaming generator, each as the
        engine samples it; closing this iterator early (a client that left) cancels the shard's task, which
        aborts the engine's request."""
        import ray

        shard = self._shard(session_id).stream_turn.options(num_returns="streaming")
        stream = shard.remote(session_id, request)
        finished = False
        try:
            while True:
                try:
                    reference = await self._result(session_id, "stream_turn", anext(stream))
                except StopAsyncIteration:
                    break
                event: TurnEvent = await self._result(session_id, "stream_turn", reference)
                finished = isinstance(event, TurnOutcome)
                yield event
        finally:
            if not finished:
                ray.cancel(stream)

    async def count_tokens(
        self, session_id: str, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> int:
        """See ``LocalSessionRegistry.count_tokens``."""
        shard = self._shard(session_id)
        return await self._result(
            session_id,
            "count_tokens",
            shard.count_tokens.remote(session_id, tuple(messages), tuple(tools)),
        )

    async def describe(self, session_id: str) -> SessionDescription:
        """See ``LocalSessionRegistry.describe``."""
        return await self._result(session_id, "describe", self._shard(session_id).describe.remote(session_id))

    async def finalize(self, session_id: str, outcome: SessionOutcome = SessionOutcome()) -> Trajectory:
        """See ``LocalSessionRegistry.finalize`` (the shard writes the trajectory to its store)."""
        reply = self._shard(session_id).finalize.remote(session_id, outcome)
        return await self._result(session_id, "finalize", reply)

    async def discard(self, session_id: str) -> None:
        """See ``LocalSessionRegistry.discard``."""
        await self._result(session_id, "discard", self._shard(session_id).discard.remote(session_id))

    async def num_open_sessions(self) -> int:
        """Open sessions over all shards."""
        import asyncio

        replies = asyncio.gather(*(shard.num_open_sessions.remote() for shard in self.shards))
        return sum(
            await PENDING_WAITS.within(
                replies,
                deadline_s=SHARD_CALL_DEADLINE_S,
                component="session shards",
                request="num_open_sessions",
            )
        )

    def shutdown(self) -> None:
        """Kill the shard actors (open sessions are lost)."""
        import ray

        for shard in self.shards:
            ray.kill(shard)


def start_session_shards(
    engine: InferenceEngine,
    tokenizer_path: str | Path,
    config: ProxyConfig | None = None,
    *,
    num_shards: int = 2,
    name_prefix: str | None = None,
    policies: Mapping[str, InferenceEngine] | None = None,
) -> ShardedSessionRegistry:
    """Start ``num_shards`` session-shard actors sharing ``engine`` (e.g. a ``RayEngineClient``) and the named
    ``policies`` (see ``components.proxy.sessions``)."""
    import ray

    require_positive(num_shards, "num_shards")
    # restarted when it dies (its sessions are lost, see ``SessionShard``); calls in flight are not retried
    actor_class = ray.remote(num_cpus=0, max_concurrency=1000, max_restarts=-1)(SessionShard)
    # in the object store, owned here: a restarted shard is built again from the same objects
    arguments = [
        ray.put(engine),
        str(tokenizer_path),
        ray.put(config or ProxyConfig()),
        ray.put(dict(policies or {})),
    ]
    shards = []
    for index in range(num_shards):
        options: dict[str, str] = {}
        if name_prefix:
            options["name"] = f"{name_prefix}-{index}"
        shards.append(actor_class.options(**options).remote(*arguments))
    PENDING_WAITS.get_within(  # wait until every shard is up
        [shard.num_open_sessions.remote() for shard in shards],
        deadline_s=SHARD_START_DEADLINE_S,
        component="session shards",
        request="start",
    )
    return ShardedSessionRegistry(shards, shard_arguments=arguments)
