"""The embedded inference engine: an in-process PyTorch / transformers model served with continuous batching.

One background scheduler thread owns the model. Each iteration it (1) runs queued control jobs (weight updates,
teacher-forced scoring) between steps, (2) advances one chunk of prefill for newly admitted requests, and
(3) runs one decode step for every running request. Requests join and leave the running batch between steps
(continuous batching): rows are left-padded to a common length in a KV cache that grows in place, and a boolean
attention mask hides each row's padding. Prefill computes logits for the last position only.

What each output field means:
- ``output_ids``: the sampled ids, including the token that ended the completion (EOS, a stop token id, or
  the token that completed a stop string).
- ``logprobs``: the log-probability of each sampled token under the distribution it was sampled from, i.e.
  after temperature scaling and top-p truncation (renormalised over the kept tokens). For greedy decoding
  (``temperature == 0``) it is the log-probability under the unscaled model distribution.
- ``weight_versions``: the version of the weights that ran the forward pass whose logits the token was sampled
  from. ``update_weights`` runs between two decode steps: no step ever mixes versions, tokens sampled after it
  returns carry the new version, and (with ``recompute_kv_on_update``, the default) the KV cache of every
  in-flight request is recomputed with the new weights first, so a token of version v is exactly what the
  version-v policy gives for the whole prefix. Without recomputation, old-version KV entries are kept (as
  SGLang does when it keeps requests in flight).
- ``routed_experts`` (MoE models, ``return_routed_experts=True``): for every forwarded position, i.e. the
  prompt tokens followed by the output tokens except the last sampled one, one tuple per MoE layer (in layer
  order) of the top-k expert ids the router chose for that position, in router order. Same layout as
  SGLang's ``meta_info.routed_experts`` (``[num_positions, num_moe_layers, top_k]``). After a weight update with
  recomputation, positions carry the routing of the weights that computed their current KV entries.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from components.config import require, require_one_of, require_positive
from components.errors import ContextOverflowError, EngineError
from components.protocols import FinishReason, GenerationResult, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(kw_only=True, frozen=True)
class EmbeddedEngineConfig:
    """Configuration of the in-process engine."""

    model_path: str | Path  # an HF causal-LM folder (config.json + weights + tokenizer)
    context_window: int | None = None  # None: the model's max_position_embeddings
    max_batch_size: int = 8  # requests decoded together (running + prefilling)
    dtype: str = "float32"  # "float32" | "bfloat16"
    device: str = "cpu"  # "cpu" | "cuda"
    num_threads: int | None = None  # torch intra-op threads (CPU); None leaves torch's default
    prefill_chunk_tokens: int = 512  # prompt tokens (summed over rows) prefilled per scheduler iteration
    recompute_kv_on_update: bool = True  # re-prefill in-flight requests with new weights on update_weights
    initial_weight_version: int = 0
    # Ids that always end a completion. None: the model's EOS ids (generation config / config); () disables.
    eos_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        require(bool(str(self.model_path)), "model_path", "must name an HF model folder")
        if self.context_window is not None:
            require_positive(self.context_window, "context_window")
        require_positive(self.max_batch_size, "max_batch_size")
        require_one_of(self.dtype, "dtype", _DTYPES)
        require(
            self.device == "cpu" or self.device.startswith("cuda"),
            "device",
            f"must be 'cpu' or 'cuda[:N]', got {self.device!r}",
        )
        if self.num_threads is not None:
            require_positive(self.num_threads, "num_threads")
        require(
            self.prefill_chunk_tokens >= 16,
            "prefill_chunk_tokens",
            f"must be >= 16, got {self.prefill_chunk_tokens}",
        )


# ----------------------------------------------------------------------------------------------------------
# KV cache: one growable buffer per layer, rows left-padded to a common length
# ----------------------------------------------------------------------------------------------------------


def _kv_layer_class():
    """The cache layer class (built lazily so that importing this module does not import transformers)."""
    from transformers.cache_utils import DynamicLayer

    class GrowableLayer(DynamicLayer):
        """A DynamicLayer that writes into a preallocated buffer (amortised growth) instead of concatenating."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self.length = 0
            self.key_buffer = key_states.new_zeros((*key_states.shape[:2], 0, key_states.shape[3]))
            self.value_buffer = value_states.new_zeros((*value_states.shape[:2], 0, value_states.shape[3]))
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


class _BatchKVCache:
    """The KV cache of a set of rows plus their key-validity mask ``valid`` ([rows, length], True on real tokens)."""

    def __init__(self, num_rows: int, device: torch.device) -> None:
        from transformers.cache_utils import Cache

        self.cache = Cache(layer_class_to_replicate=_kv_layer_class())
        self.valid = torch.zeros((num_rows, 0), dtype=torch.bool, device=device)

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def layers(self) -> list[Any]:
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
    def merge(first: _BatchKVCache, second: _BatchKVCache) -> _BatchKVCache:
        """Rows of ``first`` then rows of ``second``, right-aligned (left-padded) to the longer length."""
        length = max(first.length, second.length)
        rows = first.valid.shape[0] + second.valid.shape[0]
        merged = _BatchKVCache(rows, first.valid.device)
        merged.valid = torch.zeros((rows, length), dtype=torch.bool, device=first.valid.device)
        merged.valid[: first.valid.shape[0], length - first.length :] = first.valid
        merged.valid[first.valid.shape[0] :, length - second.length :] = second.valid
        first_layers, second_layers = first.layers(), second.layers()
        assert len(first_layers) == len(second_layers), "both caches must have run the same model"
        template = _kv_layer_class()
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


# ----------------------------------------------------------------------------------------------------------
# Requests
# ----------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Request:
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


def _resolve(future: asyncio.Future, value: Any) -> None:
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

    requests: list[_Request]
    sequences: list[list[int]]  # what to prefill per row
    cache: _BatchKVCache
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
    run: Callable[[], Any]
    future: asyncio.Future


# ----------------------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------------------


class EmbeddedEngine:
    """In-process continuous-batching engine implementing ``components.protocols.InferenceEngine``."""

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        path = Path(config.model_path)
        if not (path / "config.json").exists():
            raise ValueError(f"model_path: {path} is not an HF model folder (no config.json)")
        self.device = torch.device(config.device)
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            path, dtype=_DTYPES[config.dtype], attn_implementation="sdpa"
        ).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        # transformers >= 5.20 names the KV cache argument ``cache``; older models call it ``past_key_values``.
        forward_parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in forward_parameters else "past_key_values"
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
        text_config = self.model.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        max_positions = getattr(text_config, "max_position_embeddings", None)
        window = config.context_window or max_positions
        if window is None:
            raise ValueError(
                "context_window: the model config has no max_position_embeddings; set it explicitly"
            )
        if max_positions is not None and window > max_positions:
            raise ValueError(
                f"context_window: {window} exceeds the model's max_position_embeddings {max_positions}"
            )
        self._context_window = int(window)
        eos_ids = config.eos_token_ids
        self.eos_token_ids = frozenset(
            eos_ids if eos_ids is not None else self._default_eos_ids(path, GenerationConfig)
        )
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else next(iter(self.eos_token_ids), 0))
        self._weight_version = config.initial_weight_version
        self._routing: list[torch.Tensor] = []
        self._hooks = self._install_router_hooks()
        self.num_moe_layers = len(self._hooks)

        self._lock = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._jobs: deque[_Job] = deque()
        self._running: list[_Request] = []
        self._running_cache: _BatchKVCache | None = None
        self._prefill: _PrefillGroup | None = None
        self._closed = False
        self._num_decode_steps = 0
        self._peak_batch_size = 0
        self._thread = threading.Thread(target=self._scheduler_loop, name="rein-embedded-engine", daemon=True)
        self._thread.start()

    # --- InferenceEngine ---------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(self, input_ids: Sequence[int], params: SamplingParams) -> GenerationResult:
        """Sample one completion for ``input_ids`` (see the module docstring for what each field means)."""
        prompt = self._validated_prompt(input_ids)
        if params.return_routed_experts and not self._hooks:
            raise ValueError("return_routed_experts: the model has no MoE router layers")
        loop = asyncio.get_running_loop()
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        request = _Request(
            prompt=prompt,
            params=params,
            max_new_tokens=min(params.max_tokens, self._context_window - len(prompt)),
            generator=torch.Generator(device=self.device).manual_seed(seed),
            future=loop.create_future(),
            stop_ids=self.eos_token_ids | frozenset(params.stop_token_ids),
            routed_experts=[] if params.return_routed_experts else None,
        )
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._waiting.append(request)
            self._lock.notify()
        return await request.future

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` between two decode steps and stamp later tokens with ``version``."""
        self._check_state_dict(state_dict)
        await self._run_between_steps(lambda: self._apply_weights(state_dict, version))

    # --- extras ------------------------------------------------------------------------------------------

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> tuple[float, ...]:
        """Teacher-forced log p(input_ids[i] | input_ids[:i]) for i in [start, len), under the current weights."""
        ids = [int(token) for token in input_ids]
        require(1 <= start <= len(ids), "start", f"must be in [1, {len(ids)}], got {start}")
        require(len(ids) <= self._context_window, "input_ids", f"{len(ids)} tokens exceed the context window")
        return await self._run_between_steps(lambda: self._score(ids, start))

    def close(self) -> None:
        """Stop the scheduler; requests still in flight finish with ``FinishReason.ABORT``."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=60)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    async def aclose(self) -> None:
        """``close`` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def stats(self) -> dict[str, int]:
        """Queue lengths and counters (for monitoring and tests)."""
        with self._lock:
            return {
                "num_waiting": len(self._waiting),
                "num_running": len(self._running),
                "num_prefilling": len(self._prefill.requests) if self._prefill else 0,
                "num_decode_steps": self._num_decode_steps,
                "peak_batch_size": self._peak_batch_size,
                "weight_version": self._weight_version,
            }

    # --- validation ----------------------------------------------------------------------------------------

    def _validated_prompt(self, input_ids: Sequence[int]) -> list[int]:
        prompt = [int(token) for token in input_ids]
        require(len(prompt) > 0, "input_ids", "must not be empty")
        bad = [token for token in prompt if not 0 <= token < self.vocab_size]
        require(not bad, "input_ids", f"ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) >= self._context_window:
            raise ContextOverflowError(num_prompt_tokens=len(prompt), context_window=self._context_window)
        return prompt

    def _check_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Refuse a state dict that would load partially: unknown keys, shape mismatches, missing untied keys."""
        own = self.model.state_dict()
        unexpected = sorted(set(state_dict) - set(own))
        if unexpected:
            raise ValueError(f"state_dict: keys not in the model: {unexpected[:5]}")
        shapes = [k for k, v in state_dict.items() if tuple(v.shape) != tuple(own[k].shape)]
        if shapes:
            raise ValueError(f"state_dict: shape mismatch for {shapes[:5]}")
        given_storage = {own[k].data_ptr() for k in state_dict}
        missing = [k for k in own if k not in state_dict and own[k].data_ptr() not in given_storage]
        missing = [k for k in missing if "rotary" not in k]  # buffers recomputed from the config
        if missing:
            raise ValueError(f"state_dict: missing keys {missing[:5]}")

    @staticmethod
    def _default_eos_ids(path: Path, generation_config_class: Any) -> set[int]:
        ids: set[int] = set()
        try:
            eos = generation_config_class.from_pretrained(path).eos_token_id
        except OSError:
            eos = None
        if eos is None:
            from transformers import AutoConfig

            eos = AutoConfig.from_pretrained(path).eos_token_id
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(token) for token in eos)
        return ids

    # --- MoE routing capture -----------------------------------------------------------------------------

    def _install_router_hooks(self) -> list[Any]:
        """Forward hooks on every MoE router (module named ``gate`` inside a sparse-MoE block)."""
        text_config = self.model.config.get_text_config()
        top_k = getattr(text_config, "num_experts_per_tok", None)
        if not top_k:
            return []
        hooks = []
        for name, module in self.model.named_modules():
            is_router = name.endswith(".gate") and (".mlp." in name or ".block_sparse_moe." in name)
            if not is_router:
                continue
            hooks.append(module.register_forward_hook(self._make_router_hook(int(top_k))))
        return hooks

    def _make_router_hook(self, top_k: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if (
                isinstance(output, tuple)
                and isinstance(output[-1], torch.Tensor)
                and not output[-1].is_floating_point()
            ):
                indices = output[-1]  # (router_logits, scores, indices) routers
            else:
                logits = output[0] if isinstance(output, tuple) else output
                indices = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1).indices
            self._routing.append(indices.reshape(-1, indices.shape[-1]))

        return hook

    def _take_routing(self, num_rows: int, length: int) -> torch.Tensor | None:
        """The routing recorded during the last forward as [rows, length, layers, top_k] (None if no MoE)."""
        if not self._routing:
            return None
        stacked = torch.stack([r.reshape(num_rows, length, -1) for r in self._routing], dim=2)
        self._routing.clear()
        return stacked.cpu()

    # --- scheduler thread ----------------------------------------------------------------------------------

    async def _run_between_steps(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(run=fn, future=loop.create_future())
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._jobs.append(job)
            self._lock.notify()
        return await job.future

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
                    try:
                        _resolve(job.future, job.run())
                    except Exception as error:  # noqa: BLE001 - reported to the caller
                        _resolve(job.future, error)
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
        self._routing.clear()
        for request in requests:
            _resolve(request.future, error)

    def _abort_all(self) -> None:
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            jobs = list(self._jobs)
            self._jobs.clear()
        for request in [*self._running, *(self._prefill.requests if self._prefill else []), *waiting]:
            request.finish_reason = FinishReason.ABORT
            _resolve(request.future, request.result())
        for job in jobs:
            _resolve(job.future, EngineError("the engine is closed"))
        self._running, self._running_cache, self._prefill = [], None, None

    # --- admission and prefill -----------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start prefilling waiting requests when there is room (one prefill group at a time)."""
        if self._prefill is not None:
            return
        free = self.config.max_batch_size - len(self._running)
        group: list[_Request] = []
        with self._lock:
            while self._waiting and len(group) < free:
                candidate = self._waiting[0]
                if candidate.abandoned():
                    self._waiting.popleft()
                    continue
                if group and not self._worth_padding(group, candidate):
                    break
                group.append(self._waiting.popleft())
        if group:
            self._prefill = self._new_prefill_group(group, [r.prompt for r in group])

    def _worth_padding(self, group: list[_Request], candidate: _Request) -> bool:
        lengths = [len(r.prompt) for r in group] + [len(candidate.prompt)]
        padded = len(lengths) * max(lengths)
        return padded <= 2 * sum(lengths) or padded <= self.config.prefill_chunk_tokens

    def _new_prefill_group(self, requests: list[_Request], sequences: list[list[int]]) -> _PrefillGroup:
        length = max(len(s) for s in sequences)
        rows = len(sequences)
        padded = torch.full((rows, length), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros((rows, length), dtype=torch.bool)
        for row, sequence in enumerate(sequences):
            padded[row, length - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
            valid[row, length - len(sequence) :] = True
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
        return _PrefillGroup(
            requests=requests,
            sequences=sequences,
            cache=_BatchKVCache(rows, self.device),
            padded_ids=padded.to(self.device),
            row_valid=valid.to(self.device),
            positions=positions.to(self.device),
            chunk_length=max(16, self.config.prefill_chunk_tokens // rows),
        )

    def _prefill_chunk(self, group: _PrefillGroup) -> None:
        """Forward the next chunk of the group's positions (logits of the last position only)."""
        start, end = group.offset, min(group.offset + group.chunk_length, group.padded_ids.shape[1])
        rows = group.padded_ids.shape[0]
        chunk_valid = group.row_valid[:, start:end]
        cache = group.cache
        cache.valid = torch.cat([cache.valid, chunk_valid], dim=1)
        query = torch.arange(start, end, device=self.device)
        key = torch.arange(0, end, device=self.device)
        causal = key[None, :] <= query[:, None]  # [chunk, keys]
        mask = causal[None] & cache.valid[:, None, :]
        mask |= key[None, None, :] == query[None, :, None]  # a padding query attends to itself: no NaN rows
        output = self.model(
            input_ids=group.padded_ids[:, start:end],
            position_ids=group.positions[:, start:end],
            attention_mask=mask[:, None],
            **{self._cache_argument: cache.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        routing = self._take_routing(rows, end - start)
        if routing is not None:
            self._record_prefill_routing(group, routing, start, end)
        group.offset = end
        group.last_logits = output.logits[:, -1, :]

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
                position = column - first_real
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
            self._running_cache = _BatchKVCache.merge(self._running_cache, group.cache)
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
        pending = torch.tensor(
            [r.output_ids[-1] for r in self._running], dtype=torch.long, device=self.device
        )
        positions = torch.tensor(
            [r.num_forwarded for r in self._running], dtype=torch.long, device=self.device
        )
        cache.valid = torch.cat(
            [cache.valid, torch.ones((rows, 1), dtype=torch.bool, device=self.device)], dim=1
        )
        output = self.model(
            input_ids=pending[:, None],
            position_ids=positions[:, None],
            attention_mask=cache.valid[:, None, None, :],
            **{self._cache_argument: cache.cache},
            use_cache=True,
            logits_to_keep=1,
        )
        routing = self._take_routing(rows, 1)
        if routing is not None:
            for row, request in enumerate(self._running):
                if request.routed_experts is not None:
                    request.routed_experts.append(tuple(tuple(e) for e in routing[row, 0].tolist()))
        self._sample_and_append(self._running, output.logits[:, -1, :])
        finished = [r for r in self._running if r.finish_reason is not None]
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

    def _finish(self, requests: list[_Request]) -> None:
        for request in requests:
            _resolve(request.future, request.result())

    def _sample_and_append(self, requests: list[_Request], logits: torch.Tensor) -> None:
        """Sample one token per row, record its logprob and version, and decide whether the row is finished.

        Vectorised over rows: one log-softmax, one (batched) top-p truncation, and inverse-CDF sampling with one
        uniform number per row drawn from that request's own generator (so a seed reproduces a completion
        whatever else is in the batch)."""
        params = [r.params for r in requests]
        device = logits.device
        temperatures = torch.tensor(
            [p.temperature if p.temperature > 0 else 1.0 for p in params], device=device
        )
        logprobs = torch.log_softmax(logits.float() / temperatures[:, None], dim=-1)
        top_p_rows = [row for row, p in enumerate(params) if p.top_p < 1.0 and p.temperature > 0]
        if top_p_rows:
            index = torch.tensor(top_p_rows, device=device)
            top_ps = torch.tensor([params[row].top_p for row in top_p_rows], device=device)
            logprobs[index] = _top_p_logprobs(logprobs[index], top_ps)
        uniforms = torch.stack([torch.rand((), generator=r.generator, device=device) for r in requests])
        cumulative = logprobs.double().exp().cumsum(dim=-1)
        targets = (uniforms.double() * cumulative[:, -1])[:, None]
        sampled = torch.searchsorted(cumulative, targets, right=True)[:, 0].clamp_(max=logprobs.shape[-1] - 1)
        greedy = torch.tensor([p.temperature == 0 for p in params], device=device)
        tokens = torch.where(greedy, logprobs.argmax(dim=-1), sampled)
        chosen = logprobs.gather(1, tokens[:, None])[:, 0]
        for request, token, logprob in zip(requests, tokens.tolist(), chosen.tolist(), strict=True):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            request.weight_versions.append(self._weight_version)
            request.finish_reason = self._finish_reason(request, token)

    def _finish_reason(self, request: _Request, token: int) -> FinishReason | None:
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

    # --- control jobs (run between steps) --------------------------------------------------------------------

    def _apply_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        own = self.model.state_dict()
        for name, tensor in state_dict.items():
            own[name].copy_(tensor.detach().to(own[name].device))
        self._weight_version = int(version)
        if not self.config.recompute_kv_on_update:
            return
        if self._prefill is not None:  # restart: its KV so far came from the old weights
            group = self._prefill
            self._prefill = self._new_prefill_group(group.requests, group.sequences)
        if self._running:
            sequences = [r.prompt + r.output_ids[:-1] for r in self._running]
            group = self._new_prefill_group(list(self._running), sequences)
            while not group.done:
                self._prefill_chunk(group)
            self._running_cache = group.cache

    def _score(self, ids: list[int], start: int) -> tuple[float, ...]:
        output = self.model(
            input_ids=torch.tensor([ids], dtype=torch.long, device=self.device),
            use_cache=False,
            logits_to_keep=len(ids) - start + 1,
        )
        self._routing.clear()
        logprobs = torch.log_softmax(output.logits[0, :-1].float(), dim=-1)
        targets = torch.tensor(ids[start:], dtype=torch.long, device=self.device)
        return tuple(logprobs.gather(1, targets[:, None])[:, 0].tolist())


def _top_p_logprobs(logprobs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, keep the smallest set of most likely tokens whose mass reaches ``top_p``; renormalise over it
    (-inf elsewhere). ``logprobs`` is [rows, vocab], ``top_p`` is [rows]."""
    sorted_logprobs, order = torch.sort(logprobs, dim=-1, descending=True)
    sorted_probs = sorted_logprobs.exp()
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p[:, None]  # the tokens before this one already reach top_p
    drop_sorted[:, 0] = False
    kept = sorted_logprobs.masked_fill(drop_sorted, float("-inf"))
    kept = kept - torch.logsumexp(kept, dim=-1, keepdim=True)
    return torch.empty_like(logprobs).scatter_(1, order, kept)
