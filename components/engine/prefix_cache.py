"""The embedded engine's prefix cache: the KV of recently finished sequences, reused by the next request that
starts with the same token ids.

An agent turn re-sends the whole conversation, so without this every turn re-prefills the full history. Each
entry holds one finished sequence's ids (prompt + output, less the last sampled token, whose KV was never
computed) and its keys/values for every layer, stamped with the weight version that computed them. A lookup
returns the entry sharing the longest common prefix with a new prompt; the scheduler copies that many positions
into the new request's cache and prefills only the rest. Entries are evicted least-recently-used first when their
total size exceeds the budget; an entry whose ids are a prefix of a newly stored one is dropped (the new one
covers it: the next turn of a session replaces the previous turn). A weight update empties the cache: KV computed
by old weights is never mixed into a sequence sampled by new ones.

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
    """One stored sequence: ids, keys/values ``[layers, kv_heads, length, head_dim]``, and who computed them."""

    token_ids: np.ndarray  # int64 [length]
    keys: torch.Tensor
    values: torch.Tensor
    weight_version: int
    routed_experts: tuple[tuple[tuple[int, ...], ...], ...] | None = None  # per position (MoE), if recorded

    @property
    def num_bytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


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
        self._num_bytes = 0
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
        self._num_bytes += entry.num_bytes
        while self._num_bytes > self.budget_bytes:
            self._remove(next(iter(self._entries)))
            self.num_evictions += 1

    def clear(self) -> None:
        """Forget everything (the weights changed)."""
        self._entries.clear()
        self._num_bytes = 0

    def _remove(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._num_bytes -= entry.num_bytes

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
