"""``InferenceEngine`` over one or several inference servers (SGLang, vLLM): session affinity, least-loaded
placement, failover, and weight updates that reach every server with one version.

The fleet is engine-neutral: it drives each server through a small adapter (``InferenceServer``: SGLang's is
``components/engine/sglang.py``, vLLM's ``components/engine/vllm.py``). Routing is done here, in the process that
calls ``generate`` (each proxy session shard holds a copy):

- *Affinity by token prefix.* Every turn of a TITO session sends the previous turn's prompt + output ids
  followed by the new tokens, so a prompt that extends a sequence this fleet generated before belongs to that
  session: it goes to the server that generated it, whose prefix cache still holds its KV. The lookup keys are
  digests of whole sequences (no token lists kept), found through the lengths recorded under the prompt's first
  ``anchor_tokens`` tokens; the table keeps the newest ``affinity_entries``.
- *Least-loaded placement.* A prompt that extends nothing known is a new session: it goes to the live server
  with the fewest requests (as the servers report them, so every proxy shard's requests count; then the fewest
  sessions placed from here, then order).
- *Routers.* A URL that is a router (sgl-model-gateway / sglang-router for SGLang, vllm-router for vLLM:
  ``GET /workers``) stands for the workers it lists (``expand_router_urls``); Rein routes to them itself.
- *Failover.* A server that cannot be reached (``ServerUnreachableError``, after the adapter's retries) is taken
  out with the reason recorded (``status()``, ``failovers``); the request, and later every turn of its
  sessions, goes to another live server (same prompt, so nothing is lost but cached KV). With no live server
  left the request fails with ``EngineError``, which the rollout runner records as an ``engine_error`` rollout
  (excluded from training).
- *Return of a server* (``FleetRecoveryConfig``). A server taken out comes back only with the run's weights:
  the fleet that pushes the weights (the original; ``watch()`` polls ``/health`` in its process) re-pushes the
  folder and version it last loaded, then puts the server back. A copy in another process (a proxy shard) puts
  it back once it is healthy and labels at least the version this copy last saw. Meanwhile new requests and
  weight updates wait for a live server, at most ``server_return_timeout_s`` from the moment it went down;
  then they fail with ``ServerDownError`` naming the servers.
- *Weight updates.* Generation is paused on every live server, the new weights are loaded on all of them (from
  one folder every server reads), each with the same version, and generation continues on all. A server that
  fails the update is taken out, so live servers never disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, Self, TypedDict, TypeVar, Unpack, runtime_checkable

import numpy as np

from components.config import require, require_positive
from components.errors import EngineError
from components.json_types import JsonObject
from components.protocols import GenerationResult, SamplingParams, TokenChunk

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class ServerUnreachableError(EngineError):
    """A server could not be reached (refused, reset, gone) even after the retries: it is down."""


@runtime_checkable
class InferenceServer(Protocol):
    """One inference server as the fleet drives it (an adapter over the server's own HTTP API).

    Contract: ``generate`` raises ``ServerUnreachableError`` when the server is gone (any other ``EngineError``
    is the request's own failure); ``num_requests`` is the server's own count of running + waiting requests
    (every client's); ``load_weights_from_disk`` loads an HF folder as ``version`` without pausing (the fleet
    pauses around it); after ``load_lora_adapter`` returns, the server's new requests use that adapter."""

    @property
    def url(self) -> str: ...

    @property
    def context_window(self) -> int: ...

    @property
    def weight_version(self) -> int: ...

    async def wait_until_healthy(self) -> None: ...

    async def health(self) -> bool: ...

    async def refresh(self) -> None: ...

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult: ...

    async def num_requests(self) -> int: ...

    async def pause_generation(self) -> None: ...

    async def continue_generation(self) -> None: ...

    async def load_weights_from_disk(self, model_path: str | Path, version: int) -> object: ...

    async def load_lora_adapter(self, lora_path: str | Path, version: int) -> object: ...

    async def labelled(self) -> bool: ...

    async def aclose(self) -> None: ...


def parse_server_urls(text: str, *, field: str = "url") -> tuple[str, ...]:
    """``"http://a:30000,http://b:30000"`` → both URLs (spaces and a trailing slash ignored); a bad list fails
    naming ``field``."""
    urls = tuple(part.strip().rstrip("/") for part in text.split(",") if part.strip())
    require(len(urls) > 0, field, "needs at least one http(s) URL")
    for url in urls:
        require(url.startswith(("http://", "https://")), field, f"{url!r} is not an http(s) URL")
    require(len(set(urls)) == len(urls), field, f"lists a server twice: {text!r}")
    return urls


class RouterProbe(Protocol):
    """A client of one URL that may be a router (``HttpServerClient``): what expanding it needs."""

    async def wait_until_healthy(self) -> None: ...

    async def router_workers(self) -> list[str] | None: ...

    async def aclose(self) -> None: ...


async def expand_router_urls(
    urls: Sequence[str], probe: Callable[[str], RouterProbe], *, server_kind: str, field: str
) -> tuple[str, ...]:
    """``urls`` with every router URL (sgl-model-gateway, sglang-router, vllm-router: ``GET /workers`` or
    ``/list_workers``) replaced by the workers it lists, each once. The fleet then talks to the workers itself:
    session affinity, failover, and weight updates, which must reach every worker anyway (a router forwards
    generation only). ``probe(url)``: a client of that URL; ``field`` names the option in errors."""
    expanded: list[str] = []
    for url in urls:
        client = probe(url)
        try:
            await client.wait_until_healthy()
            workers = await client.router_workers()
        finally:
            await client.aclose()
        if workers is not None:
            require(len(workers) > 0, field, f"the {server_kind} router {url} lists no workers")
            logger.info("%s router %s: workers %s", server_kind, url, workers)
        expanded += [worker for worker in (workers or [url]) if worker not in expanded]
    return tuple(expanded)


@dataclass(kw_only=True, frozen=True)
class FleetRoutingConfig:
    """How the fleet places sessions on its servers."""

    affinity_entries: int = 65536  # remembered sequences (one digest + length each)
    anchor_tokens: int = 64  # prompt prefix under which candidate sequence lengths are filed
    # New sessions go where the servers report the fewest requests (one call per server and new session; it
    # counts every proxy shard's requests). False: this process's own requests in flight only.
    placement_by_server_load: bool = True

    def __post_init__(self) -> None:
        require_positive(self.affinity_entries, "affinity_entries")
        require_positive(self.anchor_tokens, "anchor_tokens")


@dataclass(kw_only=True, frozen=True)
class FleetRecoveryConfig:
    """How often a run asks after a server that went down (how long it waits: the engine brick's
    ``server_return_timeout_s``, passed to the fleet)."""

    health_poll_s: float = 2.0  # GET /health of down servers (and, in watch(), of live ones) this often

    def __post_init__(self) -> None:
        require_positive(self.health_poll_s, "health_poll_s")


S = TypeVar("S", bound=InferenceServer)


@runtime_checkable
class StreamingServer(InferenceServer, Protocol):
    """An ``InferenceServer`` that streams (``StreamingEngine.generate_stream``; unreachable: as ``generate``)."""

    def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]: ...


SS = TypeVar("SS", bound=StreamingServer)


class FleetOptions(TypedDict, total=False):
    """``ServerFleet``'s keyword arguments besides its servers (``connect`` passes them on)."""

    routing: FleetRoutingConfig | None
    initial_weight_version: int
    context_window: int | None
    server_return_timeout_s: float
    recovery: FleetRecoveryConfig | None


class ServerDownError(EngineError):
    """Every server is down and none came back within ``server_return_timeout_s``."""


@dataclass(frozen=True)
class FailoverEvent:
    """A request (and its session) moved off a server that was taken out."""

    from_url: str
    to_url: str
    reason: str


class ServerFleet(Generic[S]):
    """``InferenceEngine`` (and ``DiskReloadingEngine``, ``LoraServingEngine``) over ``servers``. Create with
    ``await ServerFleet.connect(servers)`` (or a subclass's ``connect``), which waits for every server."""

    server_kind = "inference"  # how messages name the servers ("SGLang", "vLLM")
    return_timeout_flag = "the fleet's server_return_timeout_s"  # the flag that sets it, for messages

    def __init__(
        self,
        servers: Sequence[S],
        *,
        routing: FleetRoutingConfig | None = None,
        initial_weight_version: int = 0,
        context_window: int | None = None,
        server_return_timeout_s: float,
        recovery: FleetRecoveryConfig | None = None,
    ) -> None:
        """``server_return_timeout_s``: how long requests wait for a server that went down (the servers'
        settings: ``--sglang-server-return-timeout-s`` / ``--vllm-server-return-timeout-s``); 0: fail at once."""
        require(len(servers) > 0, "servers", "needs at least one server")
        self.routing = routing or FleetRoutingConfig()
        self.server_return_timeout_s = server_return_timeout_s
        self.recovery = recovery or FleetRecoveryConfig()
        self.servers = list(servers)
        self._context_window = context_window
        self._weight_version = initial_weight_version
        self._down: dict[int, str] = {}  # server index → why it was taken out
        self._down_since: dict[int, float] = {}  # server index → time.monotonic() it was taken out
        # The folder and version the live servers last loaded (what a server that comes back is given again);
        # set by the weight updates and ``remember_weights``. Only the original fleet pushes it (``_pushes``).
        self._weights: tuple[str, int] | None = None
        self._adapter: tuple[str, int] | None = None
        self._pushes = True
        # Until this fleet has labelled the servers' weights, an unlabelled server serves what it was started
        # with: the run's weights at its start (a resumed run labels them first), not a restarted server.
        self._labelled_here = False
        self._return_lock: asyncio.Lock | None = None
        self._watcher: asyncio.Task | None = None
        self.returns: list[str] = []  # "URL at version N" per server put back
        self._in_flight = [0] * len(self.servers)
        self._sessions = [0] * len(self.servers)
        # digest of a generated sequence → (server index, anchor, length); newest last
        self._affinity: OrderedDict[bytes, tuple[int, bytes, int]] = OrderedDict()
        self._lengths: dict[bytes, Counter[int]] = {}  # anchor → lengths of remembered sequences
        self.failovers: list[FailoverEvent] = []
        self._update_lock: asyncio.Lock | None = None

    def __getstate__(self) -> dict[str, object]:
        # A copy in another process (a proxy session shard) routes its own sessions; the lock belongs here.
        # It never pushes weights: the original does (and re-pushes them to a server that comes back).
        state = dict(self.__dict__)
        state.update(_update_lock=None, _return_lock=None, _watcher=None, _pushes=False)
        return state

    @classmethod
    async def connect(cls, servers: Sequence[S], **options: Unpack[FleetOptions]) -> Self:
        """Wait for ``/health`` on every server, then read the context window and the weight version."""
        fleet = cls(servers, **options)
        await fleet.start()
        return fleet

    async def start(self) -> None:
        """Wait for every server, then read their state (closing the clients if that fails)."""
        try:
            await asyncio.gather(*(server.wait_until_healthy() for server in self.servers))
            await self.read_server_state()
        except BaseException:
            await self.aclose()
            raise

    async def read_server_state(self) -> None:
        """Read every live server's context window and weight version; they must agree."""
        live = self.live_servers()
        await asyncio.gather(*(server.refresh() for server in live))
        self._context_window = min(server.context_window for server in live)
        versions = {server.url: server.weight_version for server in live}
        if len(set(versions.values())) > 1:
            raise EngineError(
                f"the {self.server_kind} servers hold different weight versions {versions}: start them from the "
                "same checkpoint (or let Rein push one version to all of them)"
            )
        self._weight_version = next(iter(versions.values()))

    async def refresh(self) -> dict[str, int]:
        """The live servers' requests (summed) as ``num_running``; a server that does not answer counts as idle
        here (generation, not this probe, takes it out)."""
        loads = await asyncio.gather(
            *(server.num_requests() for server in self.live_servers()), return_exceptions=True
        )
        running = sum(load for load in loads if not isinstance(load, BaseException))
        return {"num_running": running, "num_waiting": 0, "num_prefilling": 0}

    async def aclose(self) -> None:
        """Stop watching and close every server's HTTP client."""
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await asyncio.gather(*(server.aclose() for server in self.servers))

    # --- InferenceEngine ---------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        if self._context_window is None:
            raise EngineError("the context window is unknown: create the fleet with `await ...connect()`")
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """Generate on the session's server (or the least-loaded live one), failing over when it is down. The
        fleet serves one policy (its LoRA adapter, if any, is engine-wide): ``adapter`` must be None."""
        self._check_one_policy(adapter)
        prompt = np.asarray(input_ids, dtype=np.int64)
        index = await self._route(prompt)
        tried: set[int] = set()
        while True:
            attempt = index
            self._in_flight[attempt] += 1
            try:
                result = await self.servers[attempt].generate(prompt.tolist(), params)
            except ServerUnreachableError as error:
                # this request fails when no other server is live (an engine_error rollout); new ones wait
                tried.add(attempt)
                index = self._fail_over(attempt, f"unreachable: {error}", exclude=tried)
                continue
            finally:
                self._in_flight[attempt] -= 1
            self._generated(prompt, result, index)
            return result

    def _check_one_policy(self, adapter: str | None) -> None:
        require(
            adapter is None,
            "adapter",
            f"the {self.server_kind} fleet serves one policy (load_lora_adapter is engine-wide), got {adapter!r}",
        )

    async def _route(self, prompt: np.ndarray) -> int:
        """The server of the session ``prompt`` extends, else (a new session) the least-loaded live one."""
        index = self._session_server(prompt)
        if index is None:
            if not self._live():
                await self.await_live_server()
            index = await self._place_new_session()
        return index

    def _generated(self, prompt: np.ndarray, result: GenerationResult, index: int) -> None:
        """Account a finished generation: its session's affinity and the newest version seen."""
        self._remember(prompt, result.output_ids, index)
        if result.weight_versions:
            self._weight_version = max(self._weight_version, result.weight_versions[-1])

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``state_dict`` where every server reads it and load it as ``version`` on all of them."""
        folder = await asyncio.to_thread(self.write_weights, state_dict, int(version))
        await self.update_weights_from_disk(folder, version)

    def write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Path:
        """An HF folder of ``state_dict`` that every server can read (a subclass says where)."""
        raise ValueError(
            f"{type(self).__name__}.update_weights: no weight folder the servers can read is configured "
            "(use a disk WeightSync, which writes RUN_DIR/weights)"
        )

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """Load the HF folder ``model_path`` as ``version`` on every live server, generation paused on all."""

        async def load(live: list[int]) -> None:
            await self._on_each(
                live,
                lambda server: server.load_weights_from_disk(model_path, version),
                f"weight update to version {version}",
            )

        await self._paused_on_all(version, load)
        self._weights = (str(model_path), int(version))
        self._labelled_here = True

    def remember_weights(self, model_path: str | Path, version: int) -> None:
        """The folder and version the servers serve now (at start: what they were started with)."""
        self._weights = (str(model_path), int(version))

    async def load_lora_adapter(self, lora_path: str | Path, version: int) -> None:
        """``LoraServingEngine``: every live server loads the PEFT folder ``lora_path`` under its own new name and
        unloads the previous version. No pause: each request names its adapter, so one request never mixes
        versions; a server that fails is taken out."""
        async with self.update_lock:
            await self._on_each(
                self._live(),
                lambda server: server.load_lora_adapter(lora_path, version),
                f"LoRA adapter version {version}",
            )
            self._weight_version = int(version)
            self._adapter = (str(lora_path), int(version))
            self._labelled_here = True

    # --- operations --------------------------------------------------------------------------------------

    def live_servers(self) -> list[S]:
        """Servers still in the fleet."""
        return [self.servers[index] for index in self._live()]

    def status(self) -> JsonObject:
        """Per server: live or why it was taken out, requests in flight, sessions placed; failovers so far."""
        return {
            "servers": [
                {
                    "url": server.url,
                    "live": index not in self._down,
                    "down_reason": self._down.get(index, ""),
                    "in_flight": self._in_flight[index],
                    "sessions": self._sessions[index],
                    "weight_version": server.weight_version,
                }
                for index, server in enumerate(self.servers)
            ],
            "num_failovers": len(self.failovers),
            "weight_version": self._weight_version,
        }

    # --- routing -----------------------------------------------------------------------------------------

    def _live(self) -> list[int]:
        return [index for index in range(len(self.servers)) if index not in self._down]

    def _digest(self, tokens: np.ndarray) -> bytes:
        return hashlib.blake2b(tokens.tobytes(), digest_size=16).digest()

    def _anchor(self, tokens: np.ndarray) -> bytes:
        return self._digest(tokens[: self.routing.anchor_tokens])

    def _session_server(self, prompt: np.ndarray) -> int | None:
        """The server of the session ``prompt`` continues (another live one if it was taken out); None when
        ``prompt`` extends no sequence generated here: a new session."""
        lengths = self._lengths.get(self._anchor(prompt))
        if lengths:
            for length in sorted((n for n in lengths if n <= len(prompt)), reverse=True):
                entry = self._affinity.get(self._digest(prompt[:length]))
                if entry is None:
                    continue
                index = entry[0]
                if index not in self._down:
                    return index
                return self._fail_over(index, self._down[index], exclude={index})
        return None

    async def _place_new_session(self) -> int:
        """The least-loaded live server. Load = the requests the server reports (every proxy shard's, not only
        this process's) beyond this process's own at the time of asking, plus this process's own now - so
        sessions placed concurrently here still spread."""
        live = self._live()
        if not live:
            raise EngineError(f"every {self.server_kind} server is down: {self._down_summary()}")
        others = dict.fromkeys(live, 0)
        if self.routing.placement_by_server_load and len(live) > 1:
            mine = {index: self._in_flight[index] for index in live}
            loads = await asyncio.gather(
                *(self.servers[index].num_requests() for index in live), return_exceptions=True
            )
            for index, load in zip(live, loads, strict=True):
                if not isinstance(load, BaseException):
                    others[index] = max(int(load) - mine[index], 0)
        candidates = [index for index in self._live() if index in others]
        if not candidates:
            raise EngineError(f"every {self.server_kind} server is down: {self._down_summary()}")
        index = min(candidates, key=lambda i: (others[i] + self._in_flight[i], self._sessions[i], i))
        self._sessions[index] += 1
        return index

    def _least_loaded(self, *, exclude: set[int]) -> int | None:
        candidates = [index for index in self._live() if index not in exclude]
        if not candidates:
            return None
        return min(candidates, key=lambda index: (self._in_flight[index], self._sessions[index], index))

    def _fail_over(self, index: int, reason: str, *, exclude: set[int]) -> int:
        """Take server ``index`` out (if not yet) and pick another live one for the request."""
        self._take_out(index, reason)
        target = self._least_loaded(exclude=exclude)
        if target is None:
            raise EngineError(f"every {self.server_kind} server is down: {self._down_summary()}")
        self._sessions[target] += 1
        self.failovers.append(
            FailoverEvent(from_url=self.servers[index].url, to_url=self.servers[target].url, reason=reason)
        )
        return target

    def _take_out(self, index: int, reason: str) -> None:
        if index not in self._down:
            self._down[index] = reason
            self._down_since[index] = time.monotonic()
            logger.warning("%s server %s taken out: %s", self.server_kind, self.servers[index].url, reason)

    def _remember(self, prompt: np.ndarray, output_ids: Sequence[int], index: int) -> None:
        sequence = np.concatenate([prompt, np.asarray(output_ids, dtype=np.int64)])
        anchor = self._anchor(sequence)
        key = self._digest(sequence)
        if key not in self._affinity:
            self._lengths.setdefault(anchor, Counter())[len(sequence)] += 1
        self._affinity[key] = (index, anchor, len(sequence))
        self._affinity.move_to_end(key)
        while len(self._affinity) > self.routing.affinity_entries:
            _, (_, old_anchor, old_length) = self._affinity.popitem(last=False)
            counter = self._lengths[old_anchor]
            counter[old_length] -= 1
            if counter[old_length] <= 0:
                del counter[old_length]
            if not counter:
                del self._lengths[old_anchor]

    def _down_summary(self) -> str:
        return "; ".join(f"{self.servers[index].url}: {reason}" for index, reason in self._down.items())

    # --- weight updates ----------------------------------------------------------------------------------

    @property
    def update_lock(self) -> asyncio.Lock:
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        return self._update_lock

    async def _paused_on_all(self, version: int, load: Callable[[list[int]], Awaitable[None]]) -> None:
        """Pause every live server, ``await load(live)``, continue them all; the fleet's version is ``version``
        only when at least one server holds it (servers that failed were taken out). With no live server (or
        every server gone as it was paused: killed just before this update) it waits for one to come back, as
        requests do, outside the lock (a server that returns is given the run's weights meanwhile). A pause the
        servers refuse (e.g. HTTP 401 without the admin key) is no outage: it fails at once."""
        while True:
            if not self._live():  # bounded: ServerDownError after server_return_timeout_s
                await self.await_live_server()
            async with self.update_lock:
                if not self._live():
                    continue
                try:
                    await self._on_each(self._live(), lambda server: server.pause_generation(), "pause")
                except ServerUnreachableError:  # every server gone as it was paused: wait for one
                    continue  # (_on_each raises only once no server is live)
                try:
                    await load(self._live())
                finally:
                    await self._on_each(self._live(), lambda server: server.continue_generation(), "continue")
                if not self._live():
                    raise EngineError(
                        f"no {self.server_kind} server took version {version}: {self._down_summary()}"
                    )
                self._weight_version = int(version)
                self._weights = None  # a disk update names its folder after this; a broadcast leaves none
                return

    async def _on_each(self, indices: list[int], call: Callable[[S], Awaitable[object]], what: str) -> None:
        """``call(server)`` on every listed server at once; a server that fails is taken out (reason kept)."""
        results = await asyncio.gather(
            *(call(self.servers[index]) for index in indices), return_exceptions=True
        )
        refused = False  # a failure other than an unreachable server (a refusal, a bad reply)
        for index, result in zip(indices, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                if not isinstance(result, EngineError | OSError):
                    raise result
                refused = refused or not isinstance(result, ServerUnreachableError | OSError)
                self._take_out(index, f"{what} failed: {result}")
        if not self._live():
            # every server gone (none refused): the error of an outage, which callers may wait out
            error = EngineError if refused else ServerUnreachableError
            raise error(f"{what} failed on every {self.server_kind} server: {self._down_summary()}")

    # --- servers that come back --------------------------------------------------------------------------

    def start_watching(self) -> None:
        """Poll every server's ``/health`` in the background (this process's event loop): a server that stops
        answering is taken out, one that comes back gets the run's weights again (``watch``)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self.watch())

    async def watch(self) -> None:
        """Until cancelled: take out live servers that fail ``/health``; bring back down ones that answer."""
        while True:
            await asyncio.sleep(self.recovery.health_poll_s)
            await self.check_live_servers()
            for index in list(self._down):
                try:
                    await self._bring_back(index)
                except Exception as error:  # a server half up: asked again at the next poll
                    logger.warning(
                        "%s server %s not back yet: %s", self.server_kind, self.url_of(index), error
                    )

    async def check_live_servers(self) -> None:
        """Take out the live servers that do not answer, or whose weights carry no version this run set."""
        for index in self._live():
            try:
                labelled = await self.servers[index].labelled()
            except EngineError as error:
                self._take_out(index, f"unreachable: {error}")
                continue
            # restarted since the last push: give it the run's weights
            if not labelled and self._labelled_here:
                self._take_out(
                    index, "its weights carry no version this run set (new to the run, or restarted)"
                )

    def url_of(self, index: int) -> str:
        return self.servers[index].url

    async def await_live_server(self) -> None:
        """Wait until a server is live again (bringing back those that answer), at most
        ``server_return_timeout_s`` from when the last one went down; ``ServerDownError`` naming them."""
        if self._return_lock is None:
            self._return_lock = asyncio.Lock()
        started = time.monotonic()
        if self._pushes:  # the original may not have polled since a server died
            await self.check_live_servers()
        async with self._return_lock:
            while not self._live():
                for index in list(self._down):
                    try:
                        await self._bring_back(index)
                    except Exception as error:
                        logger.info(
                            "%s server %s not back yet: %s", self.server_kind, self.url_of(index), error
                        )
                if self._live():
                    return
                since = max(self._down_since.values(), default=started)
                if time.monotonic() - min(since, time.monotonic()) >= self.server_return_timeout_s:
                    raise ServerDownError(
                        f"every {self.server_kind} server is down and none came back within "
                        f"{self.server_return_timeout_s:g} s ({self._down_summary()}): restart "
                        f"{', '.join(self.url_of(index) for index in self._down)} or raise the wait "
                        f"({self.return_timeout_flag})"
                    )
                await asyncio.sleep(self.recovery.health_poll_s)

    async def _bring_back(self, index: int) -> bool:
        """Put server ``index`` back when it answers ``/health``: the original fleet first loads the run's
        weights and version on it; a copy waits for the original to have done so."""
        server = self.servers[index]
        if index not in self._down or not await server.health():
            return False
        if self._pushes:
            async with self.update_lock:
                if self._weights is not None:
                    path, version = self._weights
                    await server.pause_generation()
                    try:
                        await server.load_weights_from_disk(path, version)
                    finally:
                        await server.continue_generation()
                if self._adapter is not None:
                    await server.load_lora_adapter(*self._adapter)
                await server.refresh()
            if server.weight_version != self._weight_version:  # no folder of the run's weights to give it
                raise EngineError(
                    f"{server.url} came back at version {server.weight_version}, the run is at "
                    f"{self._weight_version} and no folder of those weights is known (a broadcast sync)"
                )
        else:
            await server.refresh()
            if not await server.labelled() or server.weight_version < self._weight_version:
                return False  # still on its start-up weights: the original re-pushes the run's
        del self._down[index]
        self._down_since.pop(index, None)
        self.returns.append(f"{server.url} at version {server.weight_version}")
        logger.warning(
            "%s server %s is back at version %d", self.server_kind, server.url, server.weight_version
        )
        return True


class StreamingServerFleet(ServerFleet[SS]):
    """A fleet of servers that stream (vLLM's, SGLang's): also a ``StreamingEngine``."""

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """``generate`` as one server samples it: the request goes where ``generate`` would send it. A server
        that cannot be reached before its first chunk fails over as in ``generate``; after it (tokens already
        handed out) the server is taken out and the stream fails with ``EngineError`` (no other server can go on
        with the same tokens). Closing the stream closes the server's, which aborts its request."""
        self._check_one_policy(adapter)
        prompt = np.asarray(input_ids, dtype=np.int64)
        index = await self._route(prompt)
        tried: set[int] = set()
        while True:
            attempt = index
            self._in_flight[attempt] += 1
            stream = self.servers[attempt].generate_stream(prompt.tolist(), params)
            started = False
            try:
                async for item in stream:
                    if isinstance(item, GenerationResult):
                        self._generated(prompt, item, index)
                        yield item
                        return
                    started = True
                    yield item
            except ServerUnreachableError as error:
                if started:
                    self._take_out(attempt, f"unreachable mid-stream: {error}")
                    raise EngineError(
                        f"{self.server_kind} server {self.servers[attempt].url} went away mid-stream: {error}"
                    ) from error
                tried.add(attempt)
                index = self._fail_over(attempt, f"unreachable: {error}", exclude=tried)
                continue
            finally:
                self._in_flight[attempt] -= 1
                await stream.aclose()
            raise EngineError(
                f"{self.server_kind} server {self.servers[attempt].url}: stream ended without a result"
            )
