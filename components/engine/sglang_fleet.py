"""``InferenceEngine`` over one or several SGLang servers: session affinity, least-loaded placement, failover,
and weight updates that reach every server with one version.

Routing is done here, in the process that calls ``generate`` (each proxy session shard holds a copy):

- *Routers.* A URL that is an SGLang router (sgl-model-gateway / sglang-router: ``GET /workers``) stands for
  the workers it lists; Rein routes to them itself.
- *Affinity by token prefix.* Every turn of a TITO session sends the previous turn's prompt + output ids
  followed by the new tokens, so a prompt that extends a sequence this fleet generated before belongs to that
  session: it goes to the server that generated it, where SGLang's radix cache still holds its KV. The
  lookup keys are digests of whole sequences (no token lists kept), found through the lengths recorded
  under the prompt's first ``anchor_tokens`` tokens; the table keeps the newest ``affinity_entries``.
- *Least-loaded placement.* A prompt that extends nothing known is a new session: it goes to the live
  server with the fewest requests (as the servers report them with ``/get_load``, so every proxy shard's
  requests count; then the fewest sessions placed from here, then order).
- *Failover.* A server that cannot be reached (refused, reset - after the client's retries) is taken out for
  the rest of the run with the reason recorded (``status()``, ``failovers``); the request, and later every
  turn of its sessions, goes to another live server (same prompt, so nothing is lost but cached KV). A
  server taken out is never put back: it may hold stale weights. With no live server left ``generate``
  raises ``EngineError``, which the rollout runner records as an engine failure.
- *Weight updates.* Generation is paused on every live server (``/pause_generation``), the new weights are
  loaded on all of them (``/update_weights_from_disk`` from one folder, or one broadcast over the
  ``/init_weights_update_group`` group - ``sglang_weight_transfer.py``), each with the same version, and
  generation continues on all. A server that fails the update is taken out, so live servers never disagree.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.config import require, require_positive
from components.engine.sglang import (
    SGLangEngine,
    SGLangEngineConfig,
    SGLangUnreachableError,
    experts_per_token,
)
from components.engine.sglang_weight_transfer import DistributedWeightSender, DistributedWeightSyncConfig
from components.errors import EngineError
from components.protocols import GenerationResult, SamplingParams

if TYPE_CHECKING:
    import torch

    from components.launch import RunConfig

logger = logging.getLogger(__name__)


def parse_server_urls(text: str, *, field: str = "sglang_url") -> tuple[str, ...]:
    """``"http://a:30000,http://b:30000"`` → both URLs (spaces and a trailing slash ignored); a bad list fails
    naming ``field``."""
    urls = tuple(part.strip().rstrip("/") for part in text.split(",") if part.strip())
    require(len(urls) > 0, field, "needs at least one http(s) URL")
    for url in urls:
        require(url.startswith(("http://", "https://")), field, f"{url!r} is not an http(s) URL")
    require(len(set(urls)) == len(urls), field, f"lists a server twice: {text!r}")
    return urls


@dataclass(kw_only=True, frozen=True)
class SGLangFleetConfig:
    """Several SGLang servers serving one policy."""

    urls: tuple[str, ...]
    # Options shared by every server (API keys, timeouts, weight_sync_dir ...); each server's base_url
    # replaces this one's. None: defaults.
    server: SGLangEngineConfig | None = None
    # NCCL (gloo on CPU) weight sync through /update_weights_from_distributed; None: through disk
    # (server.weight_sync_dir, which every server must be able to read).
    distributed: DistributedWeightSyncConfig | None = None
    affinity_entries: int = 65536  # remembered sequences (one digest + length each)
    anchor_tokens: int = 64  # prompt prefix under which candidate sequence lengths are filed
    # New sessions go where the servers report the fewest requests (/get_load, one call per server and new
    # session; it counts every proxy shard's requests). False: this process's own requests in flight only.
    placement_by_server_load: bool = True

    def __post_init__(self) -> None:
        require(len(self.urls) > 0, "urls", "needs at least one SGLang server URL")
        require(len(set(self.urls)) == len(self.urls), "urls", f"lists a server twice: {self.urls}")
        require_positive(self.affinity_entries, "affinity_entries")
        require_positive(self.anchor_tokens, "anchor_tokens")

    def server_config(self, url: str) -> SGLangEngineConfig:
        """The client config of the server at ``url``."""
        return replace(self.server, base_url=url) if self.server else SGLangEngineConfig(base_url=url)


def sglang_fleet_config(config: RunConfig, *, initial_weight_version: int) -> SGLangFleetConfig:
    """The fleet a run's ``sglang`` brick (``--sglang-*`` options) describes (``--sglang-url`` may list several
    servers)."""
    from components.models.registry import resolve_model

    sglang = config.sglang
    urls = parse_server_urls(sglang.url, field="sglang.url")
    distributed = None
    experts = (
        experts_per_token(resolve_model(config.model)) if config.sampling.record_routed_experts else None
    )
    if sglang.weight_sync == "nccl":  # '' : the node IP of the trainer's rank 0, found there
        distributed = DistributedWeightSyncConfig(master_address=sglang.nccl_address, backend="nccl")
    server = SGLangEngineConfig(
        base_url=urls[0],
        api_key=sglang.api_key or None,
        admin_api_key=sglang.admin_api_key or None,
        startup_timeout_s=sglang.startup_timeout_s,
        request_timeout_s=sglang.request_timeout_s,
        context_window=sglang.context_window or None,
        initial_weight_version=initial_weight_version,
        routed_experts_top_k=experts,  # R3: SGLang's routed experts are a flat id array, decoded with it
    )
    return SGLangFleetConfig(urls=urls, server=server, distributed=distributed)


async def expand_router_urls(config: SGLangFleetConfig) -> SGLangFleetConfig:
    """``config`` with every SGLang router URL replaced by the workers it lists. Rein then talks to the
    workers itself: session affinity, failover, and weight updates, which must reach every worker anyway."""
    urls: list[str] = []
    for url in config.urls:
        probe = SGLangEngine(config.server_config(url))
        try:
            await probe.wait_until_healthy()
            workers = await probe.router_workers()
        finally:
            await probe.aclose()
        if workers is not None:
            require(len(workers) > 0, "sglang_url", f"the SGLang router {url} lists no workers")
            logger.info("SGLang router %s: workers %s", url, workers)
        urls += [worker for worker in (workers or [url]) if worker not in urls]
    return replace(config, urls=tuple(urls))


@dataclass(frozen=True)
class FailoverEvent:
    """A request (and its session) moved off a server that was taken out."""

    from_url: str
    to_url: str
    reason: str


class SGLangFleet:
    """``InferenceEngine`` over ``config.urls``. Create with ``await SGLangFleet.connect(config)``."""

    def __init__(self, config: SGLangFleetConfig) -> None:
        self.config = config
        self.servers = [SGLangEngine(config.server_config(url)) for url in config.urls]
        template = config.server or SGLangEngineConfig(base_url=config.urls[0])
        self._context_window = template.context_window
        self._weight_version = template.initial_weight_version
        self._down: dict[int, str] = {}  # server index → why it was taken out
        self._in_flight = [0] * len(self.servers)
        self._sessions = [0] * len(self.servers)
        # digest of a generated sequence → (server index, anchor, length); newest last
        self._affinity: OrderedDict[bytes, tuple[int, bytes, int]] = OrderedDict()
        self._lengths: dict[bytes, Counter[int]] = {}  # anchor → lengths of remembered sequences
        self.failovers: list[FailoverEvent] = []
        self._sender: DistributedWeightSender | None = None
        self._sender_members: tuple[int, ...] = ()
        self._update_lock: asyncio.Lock | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a proxy session shard) routes its own sessions; the weight-update group
        # and the lock belong to the process that made them.
        state = dict(self.__dict__)
        state.update(_sender=None, _sender_members=(), _update_lock=None)
        return state

    @classmethod
    async def connect(cls, config: SGLangFleetConfig) -> SGLangFleet:
        """Expand router URLs to their workers, wait for ``/health`` on every server, then read the context
        window and the weight version."""
        config = await expand_router_urls(config)
        fleet = cls(config)
        try:
            await asyncio.gather(*(server.wait_until_healthy() for server in fleet.servers))
            await fleet.read_server_state()
        except BaseException:
            await fleet.aclose()
            raise
        return fleet

    async def refresh(self) -> dict[str, Any]:
        """The live servers' queues (``/get_load``, summed): ``num_running``, ``num_waiting``; a server that
        does not answer counts as idle here (generation, not this probe, takes it out)."""
        loads = await asyncio.gather(
            *(server.get_load() for server in self.live_servers()), return_exceptions=True
        )
        running = waiting = 0
        for load in loads:
            if isinstance(load, BaseException):
                continue
            for rank in load:
                waiting += int(rank.get("num_waiting_reqs", 0))
                running += max(int(rank.get("num_reqs", 0)) - int(rank.get("num_waiting_reqs", 0)), 0)
        return {"num_running": running, "num_waiting": waiting, "num_prefilling": 0}

    async def read_server_state(self) -> None:
        """Read every live server's context window and weight version; they must agree."""
        live = self.live_servers()
        await asyncio.gather(*(server.refresh() for server in live))
        windows = {server.context_window for server in live}
        self._context_window = min(windows)
        versions = {server.url: server.weight_version for server in live}
        if len(set(versions.values())) > 1:
            raise EngineError(
                f"the SGLang servers hold different weight versions {versions}: start them from the same "
                "checkpoint (or let Rein push one version to all of them)"
            )
        self._weight_version = next(iter(versions.values()))

    async def aclose(self) -> None:
        """Leave the weight-update group and close every HTTP client."""
        if self._sender is not None:
            sender, self._sender = self._sender, None
            await sender.close()
        await asyncio.gather(*(server.aclose() for server in self.servers))

    # --- InferenceEngine ---------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        if self._context_window is None:
            raise EngineError(
                "the context window is unknown: create the fleet with `await SGLangFleet.connect()`"
            )
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """Generate on the session's server (or the least-loaded live one), failing over when it is down."""
        prompt = np.asarray(input_ids, dtype=np.int64)
        index = self._session_server(prompt)
        if index is None:  # a new session
            index = await self._place_new_session()
        tried: set[int] = set()
        while True:
            attempt = index
            self._in_flight[attempt] += 1
            try:
                result = await self.servers[attempt].generate(prompt.tolist(), params)
            except SGLangUnreachableError as error:
                tried.add(attempt)
                index = self._fail_over(attempt, f"unreachable: {error}", exclude=tried)
                continue
            finally:
                self._in_flight[attempt] -= 1
            self._remember(prompt, result.output_ids, index)
            if result.weight_versions:
                self._weight_version = max(self._weight_version, result.weight_versions[-1])
            return result

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` as ``version`` on every live server: broadcast over the weight-update group
        (``config.distributed``), or one folder under ``weight_sync_dir`` read by all."""
        if self.config.distributed is not None:
            await self._paused_on_all(version, lambda live: self._push_distributed(live, state_dict, version))
            return
        template = self.servers[0].config
        if template.weight_sync_dir is None:
            raise ValueError(
                "weight_sync_dir: SGLang weight updates need a directory every server can read "
                "(or a distributed weight-sync config)"
            )
        folder = await asyncio.to_thread(self.servers[0]._write_weights, state_dict, int(version))
        await self.update_weights_from_disk(folder, version)

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """``/update_weights_from_disk`` of one HF folder on every live server, generation paused on all."""
        body = {
            "model_path": str(model_path),
            "weight_version": str(int(version)),
            "flush_cache": True,
            "abort_all_requests": False,
        }

        async def load(live: list[int]) -> None:
            await self._on_each(
                live,
                lambda server: server.post_update("/update_weights_from_disk", body, version),
                f"weight update to version {version}",
            )

        await self._paused_on_all(version, load)

    async def load_lora_adapter(self, lora_path: str | Path, version: int) -> None:
        """``LoraServingEngine``: every live server loads the PEFT folder ``lora_path`` under its own new name
        and unloads the previous version (``SGLangEngine.load_lora_adapter``). No pause: each request names
        its adapter, so one request never mixes versions; a server that fails is taken out."""
        async with self.update_lock:
            await self._on_each(
                self._live(),
                lambda server: server.load_lora_adapter(lora_path, version),
                f"LoRA adapter version {version}",
            )
            self._weight_version = int(version)

    async def update_weights_from_trainer(self, trainer: Any, version: int) -> dict[str, float]:
        """Generation paused on every live server, the trainer's rank 0 broadcasts its current policy to them
        over the weight-update group (``config.distributed``; ``Trainer.broadcast_weights``), generation
        continues. The weights never pass through this process."""
        require(self.config.distributed is not None, "distributed", "set a DistributedWeightSyncConfig")
        metrics: dict[str, float] = {}

        async def load(live: list[int]) -> None:
            servers = [self.servers[index] for index in live]
            try:
                metrics.update(
                    await asyncio.to_thread(
                        trainer.broadcast_weights, servers, self.config.distributed, version
                    )
                )
            except Exception as error:  # a half-done broadcast: none of these servers can be trusted
                for index in live:
                    self._down.setdefault(index, f"weight broadcast of version {version} failed: {error}")
                raise EngineError(f"weight broadcast of version {version} failed: {error}") from error
            for server in servers:
                server._weight_version = int(version)

        await self._paused_on_all(version, load)
        return metrics

    # --- operations --------------------------------------------------------------------------------------

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Free the GPU memory of every live server (colocated trainer); resume before generating again."""
        await self._on_each(
            self._live(), lambda server: server.release_memory_occupation(tags), "memory release"
        )

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Take the GPU memory back on every live server."""
        await self._on_each(
            self._live(), lambda server: server.resume_memory_occupation(tags), "memory resume"
        )

    def live_servers(self) -> list[SGLangEngine]:
        """Servers still in the fleet."""
        return [self.servers[index] for index in self._live()]

    def status(self) -> dict[str, Any]:
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
        return self._digest(tokens[: self.config.anchor_tokens])

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
        """The least-loaded live server. Load = the requests the server reports (``/get_load``: every proxy
        shard's, not only this process's) beyond this process's own at the time of asking, plus this process's
        own now - so sessions placed concurrently here still spread."""
        live = self._live()
        if not live:
            raise EngineError(f"every SGLang server is down: {self._down_summary()}")
        others = dict.fromkeys(live, 0)
        if self.config.placement_by_server_load and len(live) > 1:
            mine = {index: self._in_flight[index] for index in live}
            loads = await asyncio.gather(
                *(self.servers[index].get_load() for index in live), return_exceptions=True
            )
            for index, load in zip(live, loads, strict=True):
                if not isinstance(load, BaseException):
                    reported = sum(int(rank.get("num_reqs", 0)) for rank in load)
                    others[index] = max(reported - mine[index], 0)
        candidates = [index for index in self._live() if index in others]
        if not candidates:
            raise EngineError(f"every SGLang server is down: {self._down_summary()}")
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
        if index not in self._down:
            self._down[index] = reason
            logger.warning("SGLang server %s taken out: %s", self.servers[index].url, reason)
        target = self._least_loaded(exclude=exclude)
        if target is None:
            raise EngineError(f"every SGLang server is down: {self._down_summary()}")
        self._sessions[target] += 1
        self.failovers.append(
            FailoverEvent(from_url=self.servers[index].url, to_url=self.servers[target].url, reason=reason)
        )
        return target

    def _remember(self, prompt: np.ndarray, output_ids: Sequence[int], index: int) -> None:
        sequence = np.concatenate([prompt, np.asarray(output_ids, dtype=np.int64)])
        anchor = self._anchor(sequence)
        key = self._digest(sequence)
        if key not in self._affinity:
            self._lengths.setdefault(anchor, Counter())[len(sequence)] += 1
        self._affinity[key] = (index, anchor, len(sequence))
        self._affinity.move_to_end(key)
        while len(self._affinity) > self.config.affinity_entries:
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

    async def _paused_on_all(self, version: int, load: Any) -> None:
        """Pause every live server, ``await load(live)``, continue them all; the fleet's version is
        ``version`` only when at least one server holds it (servers that failed were taken out)."""
        async with self.update_lock:
            live = self._live()
            if not live:
                raise EngineError(f"every SGLang server is down: {self._down_summary()}")
            await self._on_each(live, lambda server: server.pause_generation(), "pause")
            try:
                await load(self._live())
            finally:
                await self._on_each(self._live(), lambda server: server.continue_generation(), "continue")
            if not self._live():
                raise EngineError(f"no SGLang server took version {version}: {self._down_summary()}")
            self._weight_version = int(version)

    async def _on_each(self, indices: list[int], call: Any, what: str) -> None:
        """``call(server)`` on every listed server at once; a server that fails is taken out (reason kept)."""
        results = await asyncio.gather(
            *(call(self.servers[index]) for index in indices), return_exceptions=True
        )
        for index, result in zip(indices, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                if not isinstance(result, EngineError | OSError):
                    raise result
                reason = f"{what} failed: {result}"
                if index not in self._down:
                    self._down[index] = reason
                    logger.warning("SGLang server %s taken out: %s", self.servers[index].url, reason)
        if not self._live():
            raise EngineError(f"{what} failed on every SGLang server: {self._down_summary()}")

    async def _push_distributed(
        self, live: list[int], state_dict: Mapping[str, torch.Tensor], version: int
    ) -> None:
        members = tuple(live)
        if self._sender is not None and self._sender_members != members:  # a server left: regroup
            sender, self._sender = self._sender, None
            await sender.close()
        if self._sender is None:
            sender = DistributedWeightSender(self.config.distributed)  # type: ignore[arg-type]
            servers = [self.servers[index] for index in members]
            ranks = [await server.tensor_parallel_size() for server in servers]
            await sender.connect(servers, ranks)
            self._sender, self._sender_members = sender, members
        try:
            await self._sender.push(list(state_dict.items()), version)
        except BaseException as error:
            # A failed broadcast leaves the servers partially updated: none of them can be trusted.
            for index in members:
                self._down.setdefault(
                    index, f"distributed weight update to version {version} failed: {error}"
                )
            sender, self._sender = self._sender, None
            await sender.close()
            raise EngineError(f"distributed weight update to version {version} failed: {error}") from error
