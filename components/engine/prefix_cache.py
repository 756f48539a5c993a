"""The embedded engine's prefix cache: the KV of recently finished sequences, reused by the next request that
starts with the same token ids.

An agent turn re-sends the whole conversation, so without this every turn re-prefills the full history. Each
entry holds one finished sequence's ids (prompt + output, less the last sampled token, whose KV was never
computed) and its keys/values for every layer, stamped with the weight version that computed them. A lookup
returns the entry sharing the longest common prefix with a new prompt; the scheduler reuses that many positions
and prefills only the rest. Entries are evicted least-recently-used first when the memory they hold exceeds the
budget; an entry whose ids are a prefix of a newly stored one is dropped (the new one covers it: the next turn
of a session replaces the previous turn). A weight update empties the cache: KV computed by old weights is never
mixed into a sequence sampled by new ones.

No copy per turn (what made a turn's cost grow with the history): an entry keeps the KV buffers of the request
that computed it (by reference, when that request ran alone in its batch), and the next request that reuses
*all* of it, alone in its prefill group, writes its own positions into the spare room after them (the entry's
positions are never written again). Each buffer lends its tail once (``CachedSequence.lent``); any other reuse
(a partial match, a second borrower, a batch of several rows) copies the prefix. Several entries can so share
one buffer; the budget counts each buffer once, at its allocated size.

Design (measured in ``benchmarks/prefix_cache.py``): one entry per sequence rather than a radix tree of shared
blocks. Sessions that share a system prompt still reuse it (the common-prefix match works across entries); what
is lost is only de-duplication of the shared part in memory, which a per-session agent workload barely needs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(eq=False)
class CachedSequence:
    """One stored sequence: ids, per layer keys/values ``[kv_heads, capacity >= length, head_dim]`` (positions
    ``[0, length)`` are this sequence's), and who computed them."""

    token_ids: np.ndarray  # int64 [length]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    weight_version: int
    routed_experts: tuple[tuple[tuple[int, ...], ...], ...] | None = None  # per position (MoE), if recorded
    # True once a request appends after this entry's positions in its buffers: from then on it is only copied.
    lent: bool = False

    @property
    def length(self) -> int:
        return len(self.token_ids)

    def storages(self) -> dict[int, int]:
        """The buffers this entry keeps alive: storage address -> allocated bytes."""
        return {
            tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
            for tensor in (*self.keys, *self.values)
        }

    @property
    def num_bytes(self) -> int:
        return sum(self.storages().values())

    def spare_capacity(self) -> int:
        """Positions after ``length`` that the buffers hold (room a borrower can append into)."""
        return min(tensor.shape[1] for tensor in (*self.keys, *self.values)) - self.length


@dataclass(frozen=True)
class PrefixHit:
    """The longest cached prefix of a prompt: ``length`` positions of ``entry`` can be reused."""

    entry: CachedSequence
    length: int


class PrefixCache:
    """LRU store of finished sequences' KV under a byte budget (used only from the scheduler thread)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, CachedSequence] = OrderedDict()  # id(entry) -> entry, oldest first
        self._num_bytes = 0  # each buffer once, however many entries share it
        self._storage_users: dict[int, int] = {}  # storage address -> entries holding it
        self.num_hits = 0
        self.num_misses = 0
        self.num_reused_tokens = 0
        self.num_evictions = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, prompt: list[int], weight_version: int, *, need_routing: bool = False
    ) -> PrefixHit | None:
        """The entry sharing the longest prefix with ``prompt`` (at most ``len(prompt) - 1`` positions: the last
        prompt token must be forwarded to get the logits of the first output token). Changes nothing."""
        if not self._entries:
            return None
        ids = np.asarray(prompt, dtype=np.int64)
        best: PrefixHit | None = None
        for entry in self._entries.values():
            if entry.weight_version != weight_version or (need_routing and entry.routed_experts is None):
                continue
            length = _common_prefix_length(entry.token_ids, ids[: len(ids) - 1])
            if length > 0 and (best is None or length > best.length):
                best = PrefixHit(entry=entry, length=length)
        return best

    def record_use(self, hit: PrefixHit | None) -> None:
        """Count an admitted request's lookup and mark its entry most recently used."""
        if not self.enabled:
            return
        if hit is None:
            self.num_misses += 1
            return
        self.num_hits += 1
        self.num_reused_tokens += hit.length
        if id(hit.entry) in self._entries:
            self._entries.move_to_end(id(hit.entry))

    def store(self, entry: CachedSequence) -> None:
        """Add ``entry`` (dropping entries it extends), then evict least-recently-used ones over the budget."""
        if not self.enabled or entry.num_bytes > self.budget_bytes:
            return
        covered = [
            key
            for key, old in self._entries.items()
            if len(old.token_ids) <= len(entry.token_ids)
            and old.weight_version == entry.weight_version
            and (old.routed_experts is None or entry.routed_experts is not None)
            and _common_prefix_length(old.token_ids, entry.token_ids) == len(old.token_ids)
        ]
        for key in covered:
            self._remove(key)
        self._entries[id(entry)] = entry
        for address, num_bytes in entry.storages().items():
            users = self._storage_users.get(address, 0)
            if users == 0:
                self._num_bytes += num_bytes
            self._storage_users[address] = users + 1
        while self._num_bytes > self.budget_bytes:
            self._remove(next(iter(self._entries)))
            self.num_evictions += 1

    def clear(self) -> None:
        """Forget everything (the weights changed)."""
        self._entries.clear()
        self._storage_users.clear()
        self._num_bytes = 0

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        for address, num_bytes in entry.storages().items():
            users = self._storage_users.pop(address) - 1
            if users:
                self._storage_users[address] = users
            else:
                self._num_bytes -= num_bytes

    def stats(self) -> dict[str, int]:
        return {
            "prefix_cache_entries": len(self._entries),
            "prefix_cache_bytes": self._num_bytes,
            "prefix_cache_hits": self.num_hits,
            "prefix_cache_misses": self.num_misses,
            "prefix_cache_reused_tokens": self.num_reused_tokens,
            "prefix_cache_evictions": self.num_evictions,
        }


def _common_prefix_length(first: np.ndarray, second: np.ndarray) -> int:
    length = min(len(first), len(second))
    differs = np.flatnonzero(first[:length] != second[:length])
    return int(differs[0]) if len(differs) else length
