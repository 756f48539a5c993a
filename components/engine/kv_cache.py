"""The embedded engine's batch KV cache: one growable buffer per layer, rows left-padded to a common length."""

from __future__ import annotations

import functools
from typing import Protocol

import torch


class GrowableCacheLayer(Protocol):
    """What the engine reads and writes of one cache layer (an instance of ``growable_layer_class()``)."""

    key_buffer: torch.Tensor
    value_buffer: torch.Tensor
    keys: torch.Tensor  # the first ``length`` positions of ``key_buffer``
    values: torch.Tensor
    length: int

    def set_buffers(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None: ...


@functools.cache
def growable_layer_class() -> type:
    """The cache layer class (built lazily so that importing this module does not import transformers)."""
    from transformers.cache_utils import DynamicLayer

    class GrowableLayer(DynamicLayer):
        """A DynamicLayer that writes into a preallocated buffer (amortised growth) instead of concatenating.

        ``initial_capacity``: positions allocated on the first write (the request's known need, so a finished
        single-row buffer can be handed to the prefix cache as it is, without spare room or a copy)."""

        def __init__(self, initial_capacity: int = 0) -> None:
            super().__init__()
            self.initial_capacity = initial_capacity

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self.length = 0
            capacity = self.initial_capacity
            self.key_buffer = key_states.new_zeros((*key_states.shape[:2], capacity, key_states.shape[3]))
            self.value_buffer = value_states.new_zeros(
                (*value_states.shape[:2], capacity, value_states.shape[3])
            )
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            new_length = self.length + key_states.shape[-2]
            if new_length > self.key_buffer.shape[-2]:
                self.reserve(max(new_length, 2 * self.key_buffer.shape[-2], 64))
            self.key_buffer[:, :, self.length : new_length] = key_states
            self.value_buffer[:, :, self.length : new_length] = value_states
            self.length = new_length
            self.keys = self.key_buffer[:, :, :new_length]
            self.values = self.value_buffer[:, :, :new_length]
            return self.keys, self.values

        def reserve(self, capacity: int) -> None:
            """Grow the buffers to hold ``capacity`` positions."""
            old_k, old_v = self.key_buffer, self.value_buffer
            self.key_buffer = old_k.new_empty((*old_k.shape[:2], capacity, old_k.shape[3]))
            self.value_buffer = old_v.new_empty((*old_v.shape[:2], capacity, old_v.shape[3]))
            self.key_buffer[:, :, : self.length] = old_k[:, :, : self.length]
            self.value_buffer[:, :, : self.length] = old_v[:, :, : self.length]

        def set_buffers(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
            """Replace the contents (used when rows are merged, dropped or trimmed)."""
            if not self.is_initialized:
                self.device = keys.device
                self.is_initialized = True
            self.key_buffer, self.value_buffer, self.length = keys, values, length
            self.keys = keys[:, :, :length]
            self.values = values[:, :, :length]

        def get_seq_length(self) -> int:
            return self.length if self.is_initialized else 0

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.get_seq_length() + query_length, 0

    return GrowableLayer


class BatchKVCache:
    """The KV cache of a set of rows plus their key-validity mask ``valid`` ([rows, length], True on real tokens)."""

    def __init__(self, num_rows: int, device: torch.device, capacity: int = 0) -> None:
        from transformers.cache_utils import Cache

        # ``capacity``: positions each lazily created layer allocates up front (0: grow on demand)
        self.cache = Cache(layer_class_to_replicate=functools.partial(growable_layer_class(), capacity))
        self.valid = torch.zeros((num_rows, 0), dtype=torch.bool, device=device)

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def layers(self) -> list[GrowableCacheLayer]:
        return [layer for layer in self.cache.layers if layer.is_initialized]

    def keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in ``keep``, then the leading columns that are padding in every kept row."""
        index = torch.tensor(keep, dtype=torch.long, device=self.valid.device)
        valid = self.valid.index_select(0, index)
        any_valid = valid.any(dim=0)
        first = int(any_valid.nonzero()[0, 0]) if bool(any_valid.any()) else valid.shape[1]
        self.valid = valid[:, first:]
        for layer in self.layers():
            length = layer.length
            keys = layer.key_buffer.index_select(0, index)[:, :, first:]
            values = layer.value_buffer.index_select(0, index)[:, :, first:]
            layer.set_buffers(keys, values, length - first)

    @staticmethod
    def merge(first: BatchKVCache, second: BatchKVCache) -> BatchKVCache:
        """Rows of ``first`` then rows of ``second``, right-aligned (left-padded) to the longer length."""
        length = max(first.length, second.length)
        rows = first.valid.shape[0] + second.valid.shape[0]
        merged = BatchKVCache(rows, first.valid.device)
        merged.valid = torch.zeros((rows, length), dtype=torch.bool, device=first.valid.device)
        merged.valid[: first.valid.shape[0], length - first.length :] = first.valid
        merged.valid[first.valid.shape[0] :, length - second.length :] = second.valid
        first_layers, second_layers = first.layers(), second.layers()
        assert len(first_layers) == len(second_layers), "both caches must have run the same model"
        template = growable_layer_class()
        for layer_a, layer_b in zip(first_layers, second_layers, strict=True):
            shape_a = layer_a.key_buffer.shape
            capacity = length + 64
            keys = layer_a.key_buffer.new_zeros((rows, shape_a[1], capacity, shape_a[3]))
            values = layer_a.value_buffer.new_zeros(
                (rows, shape_a[1], capacity, layer_a.value_buffer.shape[3])
            )
            n_a = shape_a[0]
            keys[:n_a, :, length - layer_a.length : length] = layer_a.keys
            values[:n_a, :, length - layer_a.length : length] = layer_a.values
            keys[n_a:, :, length - layer_b.length : length] = layer_b.keys
            values[n_a:, :, length - layer_b.length : length] = layer_b.values
            layer = template()
            layer.set_buffers(keys, values, length)
            merged.cache.layers.append(layer)
        return merged
