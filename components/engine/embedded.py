"""The embedded inference engine: an in-process PyTorch / transformers model served with continuous batching.

This file holds the public face (config, ``EmbeddedEngine``: loading, validation, the ``InferenceEngine``
methods). The parts live next to it: ``scheduler.py`` (the thread that owns the model: admission, chunked
prefill, batched decode, weight updates between steps), ``kv_cache.py`` (the left-padded batch KV cache),
``sampler.py`` (temperature / top-p sampling and the logprobs it reports), ``moe_routing.py`` (router hooks),
``prefix_cache.py`` (the KV of finished sequences, reused by the next request sharing their prefix).

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
  A weight update also empties the prefix cache, and KV that mixes versions is never stored, so a reused prefix
  always comes from the weights that sample the new tokens.
- Prefix cache (``settings.kv_cache_gb``, least recently used entries evicted first): a request that starts with the ids of a recently finished sequence reuses
  that sequence's KV and prefills only the rest; its logprobs equal a cold run's up to float rounding (<= 1e-5).
- ``routed_experts`` (MoE models, ``return_routed_experts=True``): for every forwarded position, i.e. the
  prompt tokens followed by the output tokens except the last sampled one, one tuple per MoE layer (in layer
  order) of the top-k expert ids the router chose for that position, in router order. Same layout as
  SGLang's ``meta_info.routed_experts`` (``[num_positions, num_moe_layers, top_k]``). After a weight update with
  recomputation, positions carry the routing of the weights that computed their current KV entries.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from components.config import require, require_one_of, require_positive
from components.engine import attention
from components.engine.lora_adapters import BASE_ADAPTER, DEFAULT_ADAPTER, EngineAdapters, PolicyEngine
from components.engine.moe_routing import RouterCapture
from components.engine.providers import EmbeddedEngineBrickConfig
from components.engine.scheduler import BatchScheduler, Request
from components.errors import ContextOverflowError
from components.protocols import GenerationResult, SamplingParams, TokenChunk

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

    from components.lora import LoraAdapter

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(kw_only=True, frozen=True)
class EmbeddedEngineConfig:
    """Configuration of the in-process engine."""

    model_path: str | Path  # an HF causal-LM folder (config.json + weights + tokenizer)
    # The ``--engine-*`` flags' settings (threads, requests decoded together, prefix cache size, the actor's
    # resources): the run's brick config itself, never copied field by field.
    settings: EmbeddedEngineBrickConfig = EmbeddedEngineBrickConfig()
    context_window: int | None = None  # None: the model's max_position_embeddings
    dtype: str = "float32"  # "float32" | "bfloat16"
    device: str = "cpu"  # "cpu" | "cuda"
    prefill_chunk_tokens: int = 512  # prompt tokens (summed over rows) prefilled per scheduler iteration
    recompute_kv_on_update: bool = True  # re-prefill in-flight requests with new weights on update_weights
    initial_weight_version: int = 0
    # Ids that always end a completion. None: the model's EOS ids (generation config / config); () disables.
    eos_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        require(bool(str(self.model_path)), "model_path", "must name an HF model folder")
        if self.context_window is not None:
            require_positive(self.context_window, "context_window")
        require_one_of(self.dtype, "dtype", _DTYPES)
        require(
            self.device == "cpu" or self.device.startswith("cuda"),
            "device",
            f"must be 'cpu' or 'cuda[:N]', got {self.device!r}",
        )
        require(
            self.prefill_chunk_tokens >= 16,
            "prefill_chunk_tokens",
            f"must be >= 16, got {self.prefill_chunk_tokens}",
        )


class EmbeddedEngine:
    """In-process continuous-batching engine implementing ``components.protocols.InferenceEngine``."""

    def __init__(self, config: EmbeddedEngineConfig) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        self.config = config
        torch.set_num_threads(config.settings.threads)
        path = Path(config.model_path)
        if not (path / "config.json").exists():
            raise ValueError(f"model_path: {path} is not an HF model folder (no config.json)")
        self.device = torch.device(config.device)
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            path, dtype=_DTYPES[config.dtype], attn_implementation=attention.register()
        ).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
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
        self._router_capture = RouterCapture(self.model)
        self._adapters = EngineAdapters(self.model)  # LoRA adapters injected in place (update_adapter)
        self.num_moe_layers = self._router_capture.num_moe_layers
        self._scheduler = BatchScheduler(
            model=self.model,
            tokenizer=self.tokenizer,
            config=config,
            device=self.device,
            pad_token_id=self.pad_token_id,
            router_capture=self._router_capture,
        )
        self._scheduler.adapters = self._adapters

    # --- InferenceEngine ---------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._scheduler.weight_version

    @property
    def _weight_version(self) -> int:
        return self._scheduler.weight_version

    @_weight_version.setter
    def _weight_version(self, version: int) -> None:
        # The SGLang fake (tests) re-stamps versions without new weights, as SGLang's /update_weight_version does.
        self._scheduler.weight_version = int(version)

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """Sample one completion for ``input_ids`` (see the module docstring for what each field means);
        ``adapter``: the LoRA policy that serves it (multi-LoRA, see ``policy``)."""
        request = self._request(input_ids, params, adapter)
        self._scheduler.submit(request)
        return await request.future

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """``generate``, with the tokens of each decode step as they are sampled (``StreamingEngine``); closing
        the iterator early abandons the request, which the scheduler drops before its next step."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[tuple[int, float, int] | asyncio.Future[GenerationResult]] = asyncio.Queue()

        def on_token(token: int, logprob: float, version: int) -> None:  # the scheduler thread
            try:
                loop.call_soon_threadsafe(arrived.put_nowait, (token, logprob, version))
            except RuntimeError:  # the caller's loop is closed: nobody reads the stream any more
                pass

        request = self._request(input_ids, params, adapter, on_token=on_token)
        # the future settles after every token callback was queued (both go through call_soon_threadsafe)
        request.future.add_done_callback(arrived.put_nowait)
        self._scheduler.submit(request)
        try:
            while True:
                items = [await arrived.get()]
                while not arrived.empty():
                    items.append(arrived.get_nowait())
                tokens = [item for item in items if isinstance(item, tuple)]
                if tokens:
                    yield TokenChunk(
                        output_ids=tuple(t[0] for t in tokens),
                        logprobs=tuple(t[1] for t in tokens),
                        weight_versions=tuple(t[2] for t in tokens),
                    )
                if len(tokens) < len(items):
                    yield request.future.result()
                    return
        finally:
            if not request.future.done():
                request.future.cancel()  # abandoned: the scheduler drops it

    def _request(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        adapter: str | None,
        *,
        on_token: Callable[[int, float, int], None] | None = None,
    ) -> Request:
        prompt = self._validated_prompt(input_ids)
        require(adapter != BASE_ADAPTER, "adapter", f"{BASE_ADAPTER!r} is reserved")
        if params.return_routed_experts and not self.num_moe_layers:
            raise ValueError("return_routed_experts: the model has no MoE router layers")
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        return Request(
            prompt=prompt,
            params=params,
            max_new_tokens=min(params.max_tokens, self._context_window - len(prompt)),
            generator=torch.Generator(device=self.device).manual_seed(seed),
            future=asyncio.get_running_loop().create_future(),
            stop_ids=self.eos_token_ids | frozenset(params.stop_token_ids),
            routed_experts=[] if params.return_routed_experts else None,
            adapter=adapter,
            on_token=on_token,
        )

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` between two decode steps and stamp later tokens with ``version``."""
        self._check_state_dict(state_dict)
        await self._scheduler.run_between_steps(lambda: self._scheduler.apply_weights(state_dict, version))

    async def update_adapter(
        self, adapter: LoraAdapter, version: int, *, name: str = DEFAULT_ADAPTER
    ) -> None:
        """Apply a LoRA adapter version between two decode steps over the unchanged base weights (only the
        adapter's tensors are copied) and stamp later tokens with ``version``; as with ``update_weights``,
        in-flight KV is recomputed (``recompute_kv_on_update``) and the prefix cache is emptied."""

        def apply() -> None:
            self._adapters.apply(adapter, name=name, version=version)
            # the engine-wide adapter moves the engine's version; a policy's adapter only its own
            self._scheduler.apply_adapter_update(engine_version=version if name == DEFAULT_ADAPTER else None)

        await self._scheduler.run_between_steps(apply)

    def policy(self, name: str) -> PolicyEngine:
        """Multi-LoRA: the view of this engine that serves policy ``name`` with its own adapter and versions
        (requests of several policies are decoded in one batch, each row through its own adapter)."""
        return PolicyEngine(self, name)

    def adapter_version(self, name: str) -> int:
        """The version of policy ``name``'s adapter (the initial version until its first update)."""
        return self._scheduler.version_of(name)

    # --- extras ------------------------------------------------------------------------------------------

    async def logprobs_of(
        self, input_ids: Sequence[int], start: int = 1, *, adapter: str | None = None
    ) -> tuple[float, ...]:
        """Teacher-forced log p(input_ids[i] | input_ids[:i]) for i in [start, len), under the current weights
        (policy ``adapter``'s when named)."""
        ids = [int(token) for token in input_ids]
        require(1 <= start <= len(ids), "start", f"must be in [1, {len(ids)}], got {start}")
        require(len(ids) <= self._context_window, "input_ids", f"{len(ids)} tokens exceed the context window")
        return await self._scheduler.run_between_steps(lambda: self._scheduler.score(ids, start, adapter))

    def close(self) -> None:
        """Stop the scheduler; requests still in flight finish with ``FinishReason.ABORT``."""
        self._scheduler.close()
        self._router_capture.remove()

    async def aclose(self) -> None:
        """``close`` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def stats(self) -> dict[str, int]:
        """Queue lengths and counters (for monitoring and tests)."""
        return self._scheduler.stats()

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
    def _default_eos_ids(path: Path, generation_config_class: type[GenerationConfig]) -> set[int]:
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
