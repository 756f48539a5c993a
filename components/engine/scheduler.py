"""The embedded engine's continuous-batching scheduler: one background thread that owns the model.

Each iteration it (1) runs queued control jobs (weight updates, teacher-forced scoring) between steps, (2) advances
one chunk of prefill for newly admitted requests, and (3) runs one decode step for every running request.
Requests join and leave the running batch between steps: rows are left-padded to a common length in a KV cache
that grows in place, and a boolean attention mask hides each row's padding. Prefill computes logits for the last
position only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from components.engine.kv_cache import BatchKVCache, growable_layer_class
from components.engine.lora_adapters import DEFAULT_ADAPTER, EngineAdapters
from components.engine.moe_routing import RouterCapture
from components.engine.prefix_cache import CachedSequence, PrefixCache, PrefixHit
from components.engine.sampler import sample_tokens
from components.errors import EngineError
from components.protocols import FinishReason, GenerationResult, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from components.engine.embedded import EmbeddedEngineConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Decode positions reserved up front per prefill group (beyond it a buffer grows geometrically): a request with
# a large max_tokens that stops early does not hold (nor hand to the prefix cache) room it never used.
_DECODE_ROOM_CAP = 512


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler tracks it."""

    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    generator: torch.Generator
    future: asyncio.Future
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    routed_experts: list[tuple[tuple[int, ...], ...]] | None = None
    finish_reason: FinishReason | None = None
    # The weight version that computed every KV entry of this request; None once they mix versions (a weight
    # update without recomputation): such KV is never stored in the prefix cache.
    kv_weight_version: int | None = None
    # Multi-LoRA: the named adapter (policy) that serves this request; None: the engine-wide weights (with the
    # "default" adapter when one was loaded by update_adapter)
    adapter: str | None = None
    # Streaming (``EmbeddedEngine.generate_stream``): called on the scheduler thread with each sampled token,
    # its logprob and weight version, before the request can finish
    on_token: Callable[[int, float, int], None] | None = None

    @property
    def num_forwarded(self) -> int:
        """Tokens whose KV is in the cache: the prompt and every output token but the last (pending) one."""
        return len(self.prompt) + max(len(self.output_ids) - 1, 0)

    def abandoned(self) -> bool:
        return self.future.done()

    def result(self) -> GenerationResult:
        return GenerationResult(
            output_ids=tuple(self.output_ids),
            logprobs=tuple(self.logprobs),
            weight_versions=tuple(self.weight_versions),
            finish_reason=self.finish_reason or FinishReason.ABORT,
            num_prompt_tokens=len(self.prompt),
            routed_experts=tuple(self.routed_experts) if self.routed_experts is not None else None,
        )


def resolve_future(future: asyncio.Future[T], value: T | BaseException) -> None:
    """Set a future's result or exception from the scheduler thread (no-op if it was cancelled meanwhile)."""

    def setter() -> None:
        if future.done():
            return
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    try:
        future.get_loop().call_soon_threadsafe(setter)
    except RuntimeError:  # the caller's event loop is closed: nobody is waiting any more
        pass


@dataclass(eq=False)
class _PrefillGroup:
    """Requests being prefilled together (left-padded), one chunk of positions per scheduler iteration."""

    requests: list[Request]
    sequences: list[list[int]]  # what to prefill per row (after its cached prefix)
    prefix_lengths: list[int]  # per row, positions whose KV came from the prefix cache
    cache: BatchKVCache  # starts with ``cached_length`` columns: the cached prefixes, left-padded
    cached_length: int
    padded_ids: torch.Tensor  # [rows, length]
    row_valid: torch.Tensor  # [rows, length]
    positions: torch.Tensor  # [rows, length]
    chunk_length: int
    offset: int = 0
    last_logits: torch.Tensor | None = None

    @property
    def done(self) -> bool:
        return self.offset >= self.padded_ids.shape[1]


@dataclass(eq=False)
class _Job:
    """A control job: ``run`` computes it on the scheduler thread and settles the caller's future with its
    result or error; ``fail`` settles that future with an error instead (the engine closed first)."""

    run: Callable[[], None]
    fail: Callable[[BaseException], None]


class BatchScheduler:
    """Owns the model on one background thread: admission, chunked prefill, batched decode, control jobs."""

    def __init__(
        self,
        *,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: EmbeddedEngineConfig,
        device: torch.device,
        pad_token_id: int,
        router_capture: RouterCapture,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.device = device
        self.pad_token_id = pad_token_id
        self.routing = router_capture
        self.weight_version = config.initial_weight_version
        self.prefix_cache = PrefixCache(int(config.settings.kv_cache_gb * 2**30))
        self.adapters: EngineAdapters | None = None  # set by the engine: LoRA adapters injected into model
        self._adapter_kv_keys: dict[tuple[str, int], int] = {}  # (adapter, version) → its prefix-cache key
        # transformers >= 5.20 names the KV cache argument ``cache``; older models call it ``past_key_values``.
        forward_parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in forward_parameters else "past_key_values"

        self._lock = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._jobs: deque[_Job] = deque()
        self._running: list[Request] = []
        self._running_cache: BatchKVCache | None = None
        self._prefill: _PrefillGroup | None = None
        self._closed = False
        self._num_decode_steps = 0
        self._peak_batch_size = 0
        self._num_multi_adapter_decode_steps = 0  # decode steps whose rows ran through two or more adapters
        self._thread = threading.Thread(target=self._scheduler_loop, name="rein-embedded-engine", daemon=True)
        self._thread.start()

    # --- called from the event loop ------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue a request (its future resolves with its ``GenerationResult``)."""
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._waiting.append(request)
            self._lock.notify()

    async def run_between_steps(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the scheduler thread between two steps and return its result."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def run() -> None:
            try:
                resolve_future(future, fn())
            except Exception as error:  # noqa: BLE001 - reported to the caller
                resolve_future(future, error)

        job = _Job(run=run, fail=lambda error: resolve_future(future, error))
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._jobs.append(job)
            self._lock.notify()
        return await future

    def close(self) -> None:
        """Stop the thread; requests still in flight finish with ``FinishReason.ABORT``."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=60)

    def stats(self) -> dict[str, int]:
        """Queue lengths and counters."""
        with self._lock:
            return {
                "num_waiting": len(self._waiting),
                "num_running": len(self._running),
                "num_prefilling": len(self._prefill.requests) if self._prefill else 0,
                "num_decode_steps": self._num_decode_steps,
                "peak_batch_size": self._peak_batch_size,
                "num_multi_adapter_decode_steps": self._num_multi_adapter_decode_steps,
                "weight_version": self.weight_version,
                **self.prefix_cache.stats(),
            }

    # --- the thread ----------------------------------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not (self._closed or self._jobs or self._waiting or self._running or self._prefill):
                        self._lock.wait()
                    if self._closed:
                        break
                    jobs = list(self._jobs)
                    self._jobs.clear()
                for job in jobs:
                    job.run()
                try:
                    self._admit()
                    if self._prefill is not None:
                        self._advance_prefill()
                    if self._running:
                        self._decode_step()
                except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the engine
                    logger.exception("embedded engine step failed")
                    self._fail_all(EngineError(f"embedded engine step failed: {error!r}"))
            self._abort_all()

    def _fail_all(self, error: Exception) -> None:
        requests = list(self._running) + (self._prefill.requests if self._prefill else [])
        self._running, self._running_cache, self._prefill = [], None, None
        self.routing.clear()
        for request in requests:
            resolve_future(request.future, error)

    def _abort_all(self) -> None:
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            jobs = list(self._jobs)
            self._jobs.clear()
        for request in [*self._running, *(self._prefill.requests if self._prefill else []), *waiting]:
            request.finish_reason = FinishReason.ABORT
            resolve_future(request.future, request.result())
        for job in jobs:
            job.fail(EngineError("the engine is closed"))
        self._running, self._running_cache, self._prefill = [], None, None

    # --- admission and prefill -----------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start prefilling waiting requests when there is room (one prefill group at a time)."""
        if self._prefill is not None:
            return
        free = self.config.settings.max_batch_size - len(self._running)
        group: list[Request] = []
        hits: list[PrefixHit | None] = []
        with self._lock:
            while self._waiting and len(group) < free:
                candidate = self._waiting[0]
                if candidate.abandoned():
                    self._waiting.popleft()
                    continue
                hit = self.prefix_cache.lookup(
                    candidate.prompt,
                    self._kv_key(candidate),
                    need_routing=candidate.routed_experts is not None,
                )
                if group and not self._worth_padding(group, hits, candidate, hit):
                    break
                group.append(self._waiting.popleft())
                hits.append(hit)
        if group:
            for hit in hits:
                self.prefix_cache.record_use(hit)
            self._prefill = self._new_prefill_group(group, [r.prompt for r in group], hits)

    def _worth_padding(
        self,
        group: list[Request],
        hits: list[PrefixHit | None],
        candidate: Request,
        candidate_hit: PrefixHit | None,
    ) -> bool:
        lengths = [
            len(r.prompt) - (hit.length if hit else 0)
            for r, hit in zip([*group, candidate], [*hits, candidate_hit], strict=True)
        ]
        padded = len(lengths) * max(lengths)
        return padded <= 2 * sum(lengths) or padded <= self.config.prefill_chunk_tokens

    def _new_prefill_group(
        self,
        requests: list[Request],
        sequences: list[list[int]],
        hits: list[PrefixHit | None] | None = None,
    ) -> _PrefillGroup:
        """A group that prefills ``sequences`` (one per request), reusing the cached prefix of each hit."""
        hits = hits if hits is not None else [None] * len(requests)
        prefix_lengths = [hit.length if hit else 0 for hit in hits]
        suffixes = [sequence[skip:] for sequence, skip in zip(sequences, prefix_lengths, strict=True)]
        length = max(len(s) for s in suffixes)
        rows = len(suffixes)
        padded = torch.full((rows, length), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros((rows, length), dtype=torch.bool)
        for row, suffix in enumerate(suffixes):
            padded[row, length - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            valid[row, length - len(suffix) :] = True
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0) + torch.tensor(prefix_lengths)[:, None]
        for request, hit in zip(requests, hits, strict=True):
            request.kv_weight_version = self._kv_key(request)
            if hit is not None and request.routed_experts is not None:
                assert hit.entry.routed_experts is not None
                request.routed_experts[:] = hit.entry.routed_experts[: hit.length]
        # Room for every position the group's rows can still forward (prefill, then decode up to max_new_tokens;
        # the decode part capped, growth beyond it is amortised), so that a single-row buffer never moves.
        decode_room = max(
            len(r.prompt) + r.max_new_tokens - 1 - (skip + len(suffix))
            for r, skip, suffix in zip(requests, prefix_lengths, suffixes, strict=True)
        )
        capacity = max(prefix_lengths) + length + min(max(decode_room, 0), _DECODE_ROOM_CAP)
        return _PrefillGroup(
            requests=requests,
            sequences=suffixes,
            prefix_lengths=prefix_lengths,
            cache=self._cache_from_prefixes(hits, capacity),
            cached_length=max(prefix_lengths),
            padded_ids=padded.to(self.device),
            row_valid=valid.to(self.device),
            positions=positions.to(self.device),
            chunk_length=max(16, self.config.prefill_chunk_tokens // rows),
        )

    def _cache_from_prefixes(self, hits: list[PrefixHit | None], capacity: int) -> BatchKVCache:
        """A batch cache of ``capacity`` columns holding each hit's cached positions, left-padded to the longest
        (empty if no hits). A lone row that reuses a whole entry appends into that entry's buffers (no copy)."""
        rows = len(hits)
        present = [hit for hit in hits if hit is not None]
        if not present:
            return BatchKVCache(rows, self.device, capacity=capacity)
        cache = BatchKVCache(rows, self.device)
        cached_length = max(hit.length for hit in present)
        cache.valid = torch.ones((rows, cached_length), dtype=torch.bool, device=self.device)
        layer_class = growable_layer_class()
        hit = hits[0]
        if rows == 1 and hit is not None and hit.length == hit.entry.length and not hit.entry.lent:
            entry = hit.entry
            entry.lent = True  # its positions stay as they are; the tail after them is this request's now
            too_small = entry.spare_capacity() < capacity - entry.length
            for keys, values in zip(entry.keys, entry.values, strict=True):
                layer = layer_class()
                layer.set_buffers(keys[None], values[None], entry.length)
                if too_small:  # one copy into a larger buffer; a next turn will want more: grow geometrically
                    layer.reserve(capacity + capacity // 2)
                cache.cache.layers.append(layer)
            return cache
        sample = present[0].entry
        for layer_index in range(len(sample.keys)):
            sample_keys, sample_values = sample.keys[layer_index], sample.values[layer_index]
            keys = sample_keys.new_zeros((rows, sample_keys.shape[0], capacity, sample_keys.shape[2]))
            values = sample_values.new_zeros((rows, sample_values.shape[0], capacity, sample_values.shape[2]))
            for row, row_hit in enumerate(hits):
                if row_hit is None:
                    continue
                first = cached_length - row_hit.length
                keys[row, :, first:cached_length] = row_hit.entry.keys[layer_index][:, : row_hit.length]
                values[row, :, first:cached_length] = row_hit.entry.values[layer_index][:, : row_hit.length]
            layer = layer_class()
            layer.set_buffers(keys, values, cached_length)
            cache.cache.layers.append(layer)
        for row, row_hit in enumerate(hits):
            cache.valid[row, : cached_length - (row_hit.length if row_hit else 0)] = False
        return cache

    def _remember(self, request: Request, cache: BatchKVCache, row: int) -> None:
        """Store a finished request's KV in the prefix cache (only if one weight version computed all of it):
        by reference when it is the cache's only row (nothing else will write there) and fills at least half
        of its buffers, else an exact-size copy."""
        if not self.prefix_cache.enabled or request.kv_weight_version != self._kv_key(request):
            return
        columns = cache.valid[row].nonzero()[:, 0]
        assert len(columns) == request.num_forwarded, "a row's valid KV columns are its forwarded tokens"
        layers = cache.layers()
        first = int(columns[0]) if len(columns) else 0
        contiguous = len(columns) == cache.length - first
        # A buffer mostly empty (a request that stopped long before max_tokens) is not worth its memory.
        compact = all(layer.key_buffer.shape[2] - first <= 2 * len(columns) for layer in layers)
        if cache.valid.shape[0] == 1 and contiguous and compact:
            # The batch is dropped after this (the request finished): its buffers become the entry's.
            keys = tuple(layer.key_buffer[0, :, first:] for layer in layers)
            values = tuple(layer.value_buffer[0, :, first:] for layer in layers)
        else:
            keys = tuple(layer.keys[row].index_select(1, columns) for layer in layers)
            values = tuple(layer.values[row].index_select(1, columns) for layer in layers)
        routing = request.routed_experts
        self.prefix_cache.store(
            CachedSequence(
                token_ids=np.asarray(request.prompt + request.output_ids[:-1], dtype=np.int64),
                keys=keys,
                values=values,
                weight_version=self._kv_key(request),
                routed_experts=tuple(routing[: request.num_forwarded]) if routing is not None else None,
            )
        )

    def _prefill_chunk(self, group: _PrefillGroup) -> None:
        """Forward the next chunk of the group's positions (logits of the last position only)."""
        start, end = group.offset, min(group.offset + group.chunk_length, group.padded_ids.shape[1])
        rows = group.padded_ids.shape[0]
        chunk_valid = group.row_valid[:, start:end]
        cache = group.cache
        cache.valid = torch.cat([cache.valid, chunk_valid], dim=1)
        shift = group.cached_length  # cache columns before the first prefilled one
        query = torch.arange(shift + start, shift + end, device=self.device)
        key = torch.arange(0, shift + end, device=self.device)
        causal = key[None, :] <= query[:, None]  # [chunk, keys]
        mask = causal[None] & cache.valid[:, None, :]
        mask |= key[None, None, :] == query[None, :, None]  # a padding query attends to itself: no NaN rows
        with self._adapter_rows([r.adapter for r in group.requests]):
            output = self._prefill_forward(group, start, end, mask, cache)
        routing = self.routing.take(rows, end - start)
        if routing is not None:
            self._record_prefill_routing(group, routing, start, end)
        group.offset = end
        assert output.logits is not None, "a causal LM's forward returns logits"
        group.last_logits = output.logits[:, -1, :]

    def _prefill_forward(
        self, group: _PrefillGroup, start: int, end: int, mask: torch.Tensor, cache: BatchKVCache
    ) -> CausalLMOutputWithPast:
        return self.model(
            input_ids=group.padded_ids[:, start:end],
            position_ids=group.positions[:, start:end],
            attention_mask=mask[:, None],
            **{self._cache_argument: cache.cache},
            use_cache=True,
            logits_to_keep=1,
        )

    def _record_prefill_routing(
        self, group: _PrefillGroup, routing: torch.Tensor, start: int, end: int
    ) -> None:
        length = group.padded_ids.shape[1]
        for row, request in enumerate(group.requests):
            if request.routed_experts is None:
                continue
            first_real = length - len(group.sequences[row])
            lo = max(start, first_real)
            for column, position_routing in zip(
                range(lo, end), routing[row, lo - start :].tolist(), strict=True
            ):
                position = group.prefix_lengths[row] + column - first_real
                entry = tuple(tuple(experts) for experts in position_routing)
                if position < len(request.routed_experts):
                    request.routed_experts[position] = entry  # recomputed after a weight update
                else:
                    request.routed_experts.append(entry)

    def _advance_prefill(self) -> None:
        group = self._prefill
        assert group is not None
        if all(r.abandoned() for r in group.requests):
            self._prefill = None
            return
        self._prefill_chunk(group)
        if not group.done:
            return
        self._prefill = None
        assert group.last_logits is not None
        self._sample_and_append(group.requests, group.last_logits)
        for row, request in enumerate(group.requests):
            if request.finish_reason is not None:
                self._remember(request, group.cache, row)
        keep = [row for row, r in enumerate(group.requests) if r.finish_reason is None and not r.abandoned()]
        self._finish([r for r in group.requests if r.finish_reason is not None])
        if not keep:
            return
        if len(keep) < len(group.requests):
            group.cache.keep_rows(keep)
        survivors = [group.requests[row] for row in keep]
        if self._running_cache is None or not self._running:
            self._running, self._running_cache = survivors, group.cache
        else:
            self._running_cache = BatchKVCache.merge(self._running_cache, group.cache)
            self._running = self._running + survivors

    # --- decode ------------------------------------------------------------------------------------------

    def _decode_step(self) -> None:
        live = [row for row, r in enumerate(self._running) if not r.abandoned()]
        if len(live) < len(self._running):
            self._drop_rows(live)
            if not self._running:
                return
        cache = self._running_cache
        assert cache is not None
        rows = len(self._running)
        self._num_decode_steps += 1
        self._peak_batch_size = max(self._peak_batch_size, rows)
        if len({self._named_adapter(r.adapter) for r in self._running}) > 1:
            self._num_multi_adapter_decode_steps += 1
        pending = torch.tensor(
            [r.output_ids[-1] for r in self._running], dtype=torch.long, device=self.device
        )
        positions = torch.tensor(
            [r.num_forwarded for r in self._running], dtype=torch.long, device=self.device
        )
        cache.valid = torch.cat(
            [cache.valid, torch.ones((rows, 1), dtype=torch.bool, device=self.device)], dim=1
        )
        with self._adapter_rows([r.adapter for r in self._running]):
            output = self.model(
                input_ids=pending[:, None],
                position_ids=positions[:, None],
                attention_mask=cache.valid[:, None, None, :],
                **{self._cache_argument: cache.cache},
                use_cache=True,
                logits_to_keep=1,
            )
        routing = self.routing.take(rows, 1)
        if routing is not None:
            for row, request in enumerate(self._running):
                if request.routed_experts is not None:
                    request.routed_experts.append(tuple(tuple(e) for e in routing[row, 0].tolist()))
        self._sample_and_append(self._running, output.logits[:, -1, :])
        finished = [r for r in self._running if r.finish_reason is not None]
        for row, request in enumerate(self._running):
            if request.finish_reason is not None:
                self._remember(request, cache, row)
        if finished:
            self._finish(finished)
            self._drop_rows([row for row, r in enumerate(self._running) if r.finish_reason is None])

    def _drop_rows(self, keep: list[int]) -> None:
        if not keep:
            self._running, self._running_cache = [], None
            return
        assert self._running_cache is not None
        self._running_cache.keep_rows(keep)
        self._running = [self._running[row] for row in keep]

    def _finish(self, requests: list[Request]) -> None:
        for request in requests:
            resolve_future(request.future, request.result())

    def _sample_and_append(self, requests: list[Request], logits: torch.Tensor) -> None:
        """Sample one token per row, record its logprob and version, and decide whether the row is finished."""
        tokens, logprobs = sample_tokens(
            logits, [r.params for r in requests], [r.generator for r in requests]
        )
        for request, token, logprob in zip(requests, tokens, logprobs, strict=True):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.weight_versions.append(self.version_of(request.adapter))
            if request.on_token is not None:
                request.on_token(token, logprob, request.weight_versions[-1])
            request.finish_reason = self._finish_reason(request, token)

    def _finish_reason(self, request: Request, token: int) -> FinishReason | None:
        if token in request.stop_ids:
            return FinishReason.STOP
        stop_strings = request.params.stop_strings
        if stop_strings:
            window = max(len(s) for s in stop_strings) + 4
            tail = self.tokenizer.decode(request.output_ids[-window:], skip_special_tokens=False)
            previous = self.tokenizer.decode(request.output_ids[-window:-1], skip_special_tokens=False)
            if any(s in tail and s not in previous for s in stop_strings):
                return FinishReason.STOP
        if len(request.output_ids) >= request.max_new_tokens:
            return FinishReason.LENGTH
        return None

    # --- control jobs (run between steps, on the scheduler thread) ------------------------------------------

    # --- multi-LoRA: per-request adapters ----------------------------------------------------------------

    def _named_adapter(self, adapter: str | None) -> str | None:
        """A request's own adapter, or None when it runs on the engine-wide weights."""
        return None if adapter in (None, DEFAULT_ADAPTER) else adapter

    def version_of(self, adapter: str | None) -> int:
        """The version that samples a request of ``adapter``: its own adapter's, or the engine-wide one."""
        named = self._named_adapter(adapter)
        if named is None or self.adapters is None:
            return self.weight_version
        return self.adapters.versions.get(named, self.config.initial_weight_version)

    def _kv_key(self, request: Request) -> int:
        """The prefix-cache key of the weights that compute this request's KV: the engine-wide version, or a
        negative key per (adapter, version), so KV is never reused across adapters or versions."""
        named = self._named_adapter(request.adapter)
        if named is None:
            return self.weight_version
        pair = (named, self.version_of(named))
        return self._adapter_kv_keys.setdefault(pair, -1 - len(self._adapter_kv_keys))

    def _adapter_rows(self, adapters: list[str | None]) -> AbstractContextManager[None]:
        """Route batch row i through ``adapters[i]`` (peft's mixed-batch forward) when any row names one;
        rows without one use the engine-wide weights."""
        import contextlib

        if self.adapters is None or all(self._named_adapter(name) is None for name in adapters):
            return contextlib.nullcontext()
        return self.adapters.routed([self.adapters.row_name(name) for name in adapters])

    def apply_adapter_update(self, *, engine_version: int | None = None) -> None:
        """After an adapter changed: forget cached KV and recompute in-flight KV (as for new weights);
        ``engine_version``: the engine-wide version too (its "default" adapter changed)."""
        if engine_version is not None:
            self.weight_version = int(engine_version)
        self.prefix_cache.clear()
        self._recompute_in_flight()

    def apply_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load new weights; with ``recompute_kv_on_update``, recompute the KV of every in-flight request."""
        own = self.model.state_dict()
        for name, tensor in state_dict.items():
            own[name].copy_(tensor.detach().to(own[name].device))
        self.weight_version = int(version)
        self.prefix_cache.clear()  # KV of the old weights is never reused for the new ones
        self._recompute_in_flight()

    def _recompute_in_flight(self) -> None:
        in_flight = [*self._running, *(self._prefill.requests if self._prefill else [])]
        if not self.config.recompute_kv_on_update:
            for request in in_flight:
                request.kv_weight_version = None  # old-version KV stays: this request's KV now mixes versions
            return
        if (
            self._prefill is not None
        ):  # restart from the whole prompt: its KV so far came from the old weights
            group = self._prefill
            self._prefill = self._new_prefill_group(group.requests, [r.prompt for r in group.requests])
        if self._running:
            sequences = [r.prompt + r.output_ids[:-1] for r in self._running]
            group = self._new_prefill_group(list(self._running), sequences)
            while not group.done:
                self._prefill_chunk(group)
            self._running_cache = group.cache

    def score(self, ids: list[int], start: int, adapter: str | None = None) -> tuple[float, ...]:
        """Teacher-forced logprobs of ``ids[start:]`` under the current weights (``adapter``'s when named;
        no KV cache)."""
        with self._adapter_rows([adapter]):
            output = self.model(
                input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
                use_cache=False,
                logits_to_keep=len(ids) - start + 1,
            )
        self.routing.clear()
        logprobs = torch.log_softmax(output.logits[0, :-1].float(), dim=-1)
        targets = torch.tensor(ids[start:], dtype=torch.long, device=self.device)
        return tuple(logprobs.gather(1, targets[:, None])[:, 0].tolist())
