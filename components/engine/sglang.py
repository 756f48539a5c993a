"""``InferenceEngine`` over SGLang's native HTTP API (GPU clusters).

Request and response shapes follow SGLang's own ``sglang/srt/managers/io_struct.py`` (``GenerateReqInput``,
``UpdateWeightFromDiskReqInput``, ``UpdateWeightsFromTensorReqInput``, ``PauseGenerationReqInput``,
``AbortReq``, ``UpdateWeightVersionReqInput``) and ``sglang/srt/entrypoints/http_server.py``:

- ``POST /generate`` with ``input_ids``, ``sampling_params`` (``max_new_tokens``, ``temperature``, ``top_p``,
  ``stop``, ``stop_token_ids``, ``sampling_seed``), ``return_logprob: true``, ``logprob_start_len: -1``, ``rid``
  and optionally ``return_routed_experts``. The reply carries ``output_ids`` and ``meta_info`` with
  ``output_token_logprobs`` (``[logprob, token_id, text|null]`` per output token), ``finish_reason``
  (``{"type": "stop"|"length"|"abort", ...}``), ``prompt_tokens``, ``weight_version`` and, on newer servers,
  ``weight_versions`` (spans ``{"version", "start", "end"}`` over the output tokens), and ``routed_experts``
  (base64 of little-endian int32 ``[prompt + output - 1, num_moe_layers, top_k]``).
- Streaming (``generate_stream``), read in SGLang's ``python/sglang/srt/entrypoints/http_server.py``
  (``generate_request``) and ``managers/tokenizer_manager.py`` (``_handle_batch_output``, ``_wait_one_response``,
  ``_coalesce_streaming_chunks``, ``create_abort_task``) of its main branch (mid 2026, after 0.5.x; the same
  shapes back to 0.4): ``"stream": true`` answers ``text/event-stream`` with HTTP 200, one ``data: {...}``
  event per output step (``output_ids``, ``meta_info`` as above, ``finish_reason`` null until the last
  event), then ``data: [DONE]``. By default (``--incremental-streaming-output`` off) every event repeats the
  whole output so far: ``output_ids`` and ``meta_info.output_token_logprobs`` are cumulative, and a slow
  reader gets only the newest event. With the flag on both are deltas (queued deltas are concatenated), while
  ``completion_tokens`` and the ``weight_versions`` spans still cover the whole output so far; the client
  tells the two apart per event by ``completion_tokens``. A refused request (too long, unknown adapter)
  arrives as ``data: {"error": {"message": ...}}`` before ``[DONE]``; an abort carrying a ``status_code`` ends
  the stream as the last event's ``finish_reason``. When the stream ends or the client disconnects, the
  response's background task aborts the ``rid`` (2 s later); the client also sends ``/abort_request`` at once.
- Weight sync: ``/pause_generation`` (``mode``), ``/update_weights_from_disk`` (``model_path``,
  ``weight_version``, ``flush_cache``, ``abort_all_requests`` → ``{success, message, num_paused_requests}``),
  ``/update_weights_from_tensor``, ``/continue_generation``, ``/flush_cache``, ``/update_weight_version``.
- Logprobs (``sglang/srt/layers/sampler.py``, 0.5.x): ``output_token_logprobs`` are ``log_softmax(logits /
  temperature)`` of the whole vocabulary. Top-p / top-k truncation only shapes which token is drawn; the logprobs
  are never renormalised over the kept tokens, and no server flag or env var returns them renormalised
  (``SGLANG_RETURN_ORIGINAL_LOGPROB`` drops the temperature too; ``--rl-on-policy-target`` only changes the
  kernel). Under truncation they would miss Rein's sampling distribution (``components/sampling.py``) by
  ``log(kept mass)``, so this client refuses truncating settings (``TruncatedSamplingError``).
- ``/abort_request`` (``rid`` or ``abort_all``), ``/health``, ``/v1/models`` (``max_model_len``),
  ``/model_info`` (or the older ``/get_model_info``).
- NCCL weight sync (``InitWeightsUpdateGroupReqInput`` ...): ``/init_weights_update_group`` (``master_address``,
  ``master_port``, ``rank_offset``, ``world_size``, ``group_name``, ``backend``),
  ``/update_weights_from_distributed`` (``names``, ``dtypes`` such as ``"bfloat16"``, ``shapes``,
  ``group_name``, ``flush_cache``, ``weight_version``), ``/destroy_weights_update_group`` (``group_name``);
  all answer ``{success, message}`` (400 when ``success`` is false). See ``sglang_weight_transfer.py``.
- Colocated mode: ``/release_memory_occupation`` / ``/resume_memory_occupation`` (``tags``: ``"weights"``,
  ``"kv_cache"``; None = all).
- LoRA (server launched with ``--enable-lora --max-lora-rank R --lora-target-modules all
  --max-loras-per-batch N``): ``/load_lora_adapter`` (``lora_name``, ``lora_path``: a PEFT folder) and
  ``/unload_lora_adapter`` (``lora_name``) answer ``{success, error_message, loaded_adapters}`` (400 when
  ``success`` is false); a ``/generate`` body names its adapter with ``lora_path`` (the adapter's name). Each
  adapter version is loaded under a new name, so the version of a request's tokens is the one its name says.
  Several policies (multi-LoRA, ``SGLangEngine.policy(name)``): each policy's adapter versions are loaded under
  their own names side by side (``--max-loras-per-batch`` >= the number of policies + 1), each request carries
  its own policy's current name, and loading a policy's new version unloads only that policy's previous one.
- Auth (``sglang/srt/utils/auth.py``): ``--api-key`` guards ordinary endpoints, ``--admin-api-key`` the control
  endpoints (weights, pause, flush, memory, abort; when both are set the ordinary key no longer opens them);
  ``/health*`` is always open. Both travel as ``Authorization: Bearer KEY``.

The client holds only its config across processes: it is pickled into Ray actors (the proxy's session shards)
and opens its HTTP connections lazily in the process that uses it.

SGLang needs a GPU and cannot be installed beside the CPU stack, so the tests run this client over real HTTP
against ``tests/components/engine/fake_sglang.py``, a local server that follows the same shapes.

Per-token weight versions: taken from ``meta_info.weight_versions`` spans when the server sends them; an older
server sends one ``weight_version`` per request, which is then stamped on every token. ``update_weights``
therefore pauses generation in ``retract`` mode (running requests go back to the queue and their KV cache is
recomputed with the new weights), loads the new weights, flushes the prefix cache and continues.
Versions are integers on Rein's side and strings on SGLang's; a server still on its initial version
(``"default"``) maps to ``initial_weight_version``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from components.config import require, require_non_negative, require_one_of, require_positive
from components.engine.policy_view import StreamingPolicyView
from components.engine.providers import SGLangBrickConfig
from components.engine.server_client import HttpServerClient, json_object
from components.engine.server_fleet import ServerUnreachableError
from components.errors import ContextOverflowError, EngineError, MissingLogprobsError, ReinError
from components.json_types import JsonArray, JsonObject, JsonValue
from components.protocols import FinishReason, GenerationResult, SamplingParams, TokenChunk
from components.sampling import SamplingDistribution

if TYPE_CHECKING:
    import torch

_PAUSE_MODES = ("retract", "in_place", "abort")
# SGLang's ADMIN_OPTIONAL endpoints: with --admin-api-key set, only that key opens them.
CONTROL_PATHS = frozenset(
    {
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/update_weight_version",
        "/pause_generation",
        "/continue_generation",
        "/flush_cache",
        "/abort_request",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/load_lora_adapter",
        "/unload_lora_adapter",
    }
)


@dataclass(kw_only=True, frozen=True)
class SGLangEngineConfig:
    """How to reach and drive one SGLang server."""

    base_url: str  # e.g. "http://10.0.0.5:30000"
    # The --sglang-* flags' settings this client reads (API keys, start-up and request timeouts, context window:
    # 0 = the server's max_model_len from GET /v1/models): the run's brick config itself, never copied.
    # ``for_url``: a lone server's.
    settings: SGLangBrickConfig
    connect_timeout_s: float = 10.0
    max_retries: int = 3  # extra attempts after a transient connection error or 502/503/504
    retry_backoff_s: float = 0.5  # first wait; doubles per attempt
    # update_weights writes safetensors here (a path the server can read, e.g. a shared filesystem) and asks
    # the server to load them with /update_weights_from_disk. None: update_weights is refused.
    weight_sync_dir: str | Path | None = None
    # config.json / tokenizer files copied next to the synced weights (the server loads a full HF folder).
    base_model_path: str | Path | None = None
    keep_synced_versions: int = 2  # older synced weight folders are deleted
    pause_mode: str = "retract"  # how running requests wait during a weight update
    routed_experts_top_k: int | None = None  # experts per token, needed to decode routed_experts
    initial_weight_version: int = 0

    def __post_init__(self) -> None:
        require(
            self.base_url.startswith(("http://", "https://")),
            "base_url",
            f"must start with http:// or https://, got {self.base_url!r}",
        )
        require_positive(self.connect_timeout_s, "connect_timeout_s")
        require_non_negative(self.max_retries, "max_retries")
        require_non_negative(self.retry_backoff_s, "retry_backoff_s")
        require_positive(self.keep_synced_versions, "keep_synced_versions")
        require_one_of(self.pause_mode, "pause_mode", _PAUSE_MODES)
        if self.routed_experts_top_k is not None:
            require_positive(self.routed_experts_top_k, "routed_experts_top_k")

    @classmethod
    def for_url(cls, url: str, **settings: str | float) -> SGLangEngineConfig:
        """The client of the one server at ``url`` (tests, teachers): the ``--sglang-*`` defaults, ``settings``
        changed (e.g. ``api_key``)."""
        return cls(base_url=url, settings=SGLangBrickConfig(url=url, **settings))  # type: ignore[arg-type]


class SGLangUnreachableError(ServerUnreachableError):
    """The server could not be reached (refused, reset, gone) even after the retries: it is down."""


class TruncatedSamplingError(ReinError, ValueError):
    """Top-p / top-k sampling asked of SGLang, whose logprobs ignore the truncation (see the module doc):
    training on them would compute importance ratios against the wrong distribution."""


def require_untruncated_sampling(
    sampling: SamplingDistribution, *, source: str = "--top-p / --top-k"
) -> None:
    """Refuse a sampling distribution SGLang cannot record logprobs for (top-p < 1 or top-k > 0).

    ``source`` names where the settings came from, so the message says what to change."""
    if sampling.truncates:
        raise TruncatedSamplingError(
            f"{source}: top_p={sampling.top_p}, top_k={sampling.top_k} truncate the sampling distribution, but "
            "SGLang returns logprobs of the untruncated softmax(logits / temperature) (no renormalisation after "
            "top-p/top-k), so training would use wrong importance ratios; with the SGLang engine use "
            "--top-p 1 --top-k 0 (temperature is fine)"
        )


def experts_per_token(model_path: str | Path) -> int:
    """The MoE policy's experts per token (``num_experts_per_tok`` of its config.json), which decoding SGLang's
    flat ``routed_experts`` array needs (``SGLangEngineConfig.routed_experts_top_k``)."""
    from transformers import AutoConfig

    text_config = AutoConfig.from_pretrained(model_path).get_text_config()
    top_k = getattr(text_config, "num_experts_per_tok", None)
    require(
        bool(top_k), "record_routed_experts", f"{model_path} is not an MoE model (no num_experts_per_tok)"
    )
    return int(top_k)


class _PromptTooLongError(EngineError):
    """SGLang answered 400 because the prompt exceeds its context length."""


class SGLangEngine(HttpServerClient[SGLangEngineConfig]):
    """``InferenceEngine`` client of one SGLang server. Create with ``await SGLangEngine.connect(config)``."""

    server_name = "SGLang"
    unreachable_error = SGLangUnreachableError
    start_command = "python -m sglang.launch_server"
    startup_flag = "--sglang-startup-timeout-s"

    def __init__(self, config: SGLangEngineConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self._client: httpx.AsyncClient | None = client
        self._context_window = config.settings.context_window or None
        self._weight_version = config.initial_weight_version
        self._update_lock: asyncio.Lock | None = None
        # policy ("" = the engine-wide adapter) → (loaded name, version) of the adapter its requests are served with
        self._loras: dict[str, tuple[str, int]] = {}

    @classmethod
    async def connect(cls, config: SGLangEngineConfig) -> SGLangEngine:
        """A client whose context window and weight version were read from the server."""
        engine = cls(config)
        try:
            await engine.refresh()
        except BaseException:
            await engine.aclose()
            raise
        return engine

    async def refresh(self) -> None:
        """Read the context window (unless configured) and the current weight version from the server."""
        if not self.config.settings.context_window:
            data = (await self._request_object("GET", "/v1/models")).get("data")
            lengths = [
                m.get("max_model_len")
                for m in (data if isinstance(data, list) else [])
                if isinstance(m, dict) and m.get("max_model_len")
            ]
            if not lengths:
                raise EngineError(
                    "SGLang /v1/models reported no max_model_len; set context_window in the config"
                )
            self._context_window = int(lengths[0])
        info = await self._model_info()
        self._weight_version = self._parse_version(info.get("weight_version"))

    # --- InferenceEngine ---------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        if self._context_window is None:
            raise EngineError(
                "the context window is unknown: create the client with `await SGLangEngine.connect()`"
            )
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """One ``/generate`` call; the reply must carry a logprob for every output token. ``adapter``: the policy
        (``policy(name)``) whose adapter serves it; None: the engine-wide one."""
        prompt, lora = self._checked_request(input_ids, params, adapter)
        rid = uuid.uuid4().hex
        payload = self.generate_payload(prompt, params, rid=rid, lora_name=lora[0] if lora else None)
        try:
            reply = await self._request("POST", "/generate", json=payload)
        except asyncio.CancelledError:
            asyncio.get_running_loop().create_task(self._abort_quietly(rid))  # free the server's slot
            raise
        except _PromptTooLongError:  # the server's own limit (max_req_input_len) is below context_window
            raise ContextOverflowError(
                num_prompt_tokens=len(prompt), context_window=self.context_window
            ) from None
        result = self.parse_generate_reply(reply, prompt, params)
        if lora is not None:  # SGLang's weight_version is the base's; the adapter's name fixes its version
            result = replace(result, weight_versions=(lora[1],) * len(result.output_ids))
        return result

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """``generate`` as SGLang samples it (``StreamingEngine``): ``/generate`` with ``stream``, one SSE event
        per output step (see the module doc: ``output_ids`` and ``output_token_logprobs`` cumulative, or deltas
        under ``--incremental-streaming-output``, told apart by ``meta_info.completion_tokens``), then one
        ``GenerationResult`` equal to what ``generate`` returns. Closing the iterator closes the connection
        (SGLang aborts the request when its stream ends) and sends ``/abort_request`` for it at once."""
        prompt, lora = self._checked_request(input_ids, params, adapter)
        rid = uuid.uuid4().hex
        payload = {
            **self.generate_payload(prompt, params, rid=rid, lora_name=lora[0] if lora else None),
            "stream": True,
        }
        where = f"SGLang POST {self.url}/generate"
        output_ids: list[int] = []
        entries: list[JsonValue] = []
        final: JsonObject | None = None
        try:
            async with self.client.stream("POST", "/generate", json=payload) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise self.status_error("POST", "/generate", response)
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json_object(json.loads(line.removeprefix("data: ")), where)
                    if "error" in event and "output_ids" not in event:
                        raise self._stream_error(event["error"], where)
                    meta = event.get("meta_info")
                    ids = event.get("output_ids")
                    if not isinstance(meta, Mapping) or not isinstance(ids, list):
                        raise EngineError(
                            f"{where}: a stream event lacks output_ids/meta_info: keys {sorted(event)}"
                        )
                    new_ids, new_entries = self._stream_delta(meta, [int(t) for t in ids], output_ids, where)
                    output_ids.extend(new_ids)
                    entries.extend(new_entries)
                    finished = meta.get("finish_reason") is not None  # the last event ([DONE] follows)
                    if new_ids:  # the last event's tokens are a chunk too
                        yield self._stream_chunk(meta, new_ids, new_entries, len(output_ids), lora)
                    if finished:
                        whole = (
                            {**meta, "output_token_logprobs": entries}
                            if "output_token_logprobs" in meta
                            else meta
                        )
                        final = {**event, "output_ids": output_ids, "meta_info": whole}
        except httpx.TransportError as error:
            if isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout):
                raise EngineError(f"{where} timed out: {error!r}") from error
            raise self.unreachable_error(f"{where} failed: {error!r}") from error
        except _PromptTooLongError:
            raise ContextOverflowError(
                num_prompt_tokens=len(prompt), context_window=self.context_window
            ) from None
        except (asyncio.CancelledError, GeneratorExit):
            asyncio.get_running_loop().create_task(self._abort_quietly(rid))  # free the server's slot now
            raise
        if final is None:
            raise EngineError(f"{where}: the stream ended without a finish_reason")
        self._raise_for_abort_status(final["meta_info"]["finish_reason"], prompt)
        result = self.parse_generate_reply(final, prompt, params)
        if lora is not None:
            result = replace(result, weight_versions=(lora[1],) * len(result.output_ids))
        yield result

    def _checked_request(
        self, input_ids: Sequence[int], params: SamplingParams, adapter: str | None
    ) -> tuple[list[int], tuple[str, int] | None]:
        """The prompt as ids, and the LoRA adapter (name, version) that serves it, once the request is valid."""
        prompt = [int(token) for token in input_ids]
        require(len(prompt) > 0, "input_ids", "must not be empty")
        # Checked per request too: with agent-chosen sampling, an agent may ask for top-p / top-k.
        require_untruncated_sampling(
            SamplingDistribution(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k),
            source="sampling of this request",
        )
        if len(prompt) >= self.context_window:
            raise ContextOverflowError(num_prompt_tokens=len(prompt), context_window=self.context_window)
        return prompt, self._loras.get(adapter or "")  # the adapter named now serves the whole request

    @staticmethod
    def _stream_delta(
        meta: Mapping[str, JsonValue], ids: list[int], seen: list[int], where: str
    ) -> tuple[list[int], list[JsonValue]]:
        """The output ids (and their ``output_token_logprobs`` entries) that one stream event adds. SGLang's
        ``meta_info.completion_tokens`` counts the whole output so far in either mode, so an event whose
        ``output_ids`` are that long repeats the earlier ones (cumulative); one that adds exactly the rest
        is a delta (``--incremental-streaming-output``). After the first event only one of them can hold."""
        total = meta.get("completion_tokens")
        if not isinstance(total, int):
            raise EngineError(f"{where}: a stream event lacks meta_info.completion_tokens")
        logprobs = meta.get("output_token_logprobs")
        entries = list(logprobs) if isinstance(logprobs, list) else []
        if len(ids) == total and ids[: len(seen)] == seen:  # cumulative (the default)
            return ids[len(seen) :], entries[len(seen) :]
        if len(seen) + len(ids) == total:  # incremental
            return ids, entries
        raise EngineError(
            f"{where}: a stream event has {len(ids)} output ids, {total} completion tokens, after {len(seen)}"
        )

    def _stream_chunk(
        self,
        meta: Mapping[str, JsonValue],
        ids: list[int],
        entries: list[JsonValue],
        total: int,
        lora: tuple[str, int] | None,
    ) -> TokenChunk:
        """The ``TokenChunk`` of ``ids``: their logprobs as ``generate`` checks them, their versions from the
        event's spans (over the whole output so far) or its ``weight_version`` (or the adapter's version)."""
        logprobs = self._parse_logprobs({"output_token_logprobs": entries}, ids)
        if lora is not None:
            versions = (lora[1],) * len(ids)
        else:
            versions = self._parse_versions(meta, total)[total - len(ids) :]
        return TokenChunk(output_ids=tuple(ids), logprobs=logprobs, weight_versions=versions)

    @staticmethod
    def _stream_error(error: JsonValue, where: str) -> EngineError:
        """An ``{"error": {"message"}}`` event (SGLang's stream reports a refused request so, with HTTP 200)."""
        message = error.get("message") if isinstance(error, Mapping) else error
        if "context length" in str(message).lower():
            return _PromptTooLongError(f"SGLang refused the prompt as too long: {message}")
        return EngineError(f"{where} failed in its stream: {message!r}")

    def _raise_for_abort_status(self, finish_reason: JsonValue, prompt: list[int]) -> None:
        """A streamed abort with a ``status_code`` is the error a non-streamed request gets as its HTTP status
        (SGLang's ``_handle_abort_finish_reason``): raise it as ``generate`` would."""
        if not isinstance(finish_reason, Mapping) or finish_reason.get("type") != "abort":
            return
        status = finish_reason.get("status_code")
        if status is None:
            return
        message = str(finish_reason.get("message", ""))
        if "context length" in message.lower():
            raise ContextOverflowError(num_prompt_tokens=len(prompt), context_window=self.context_window)
        raise EngineError(f"SGLang /generate aborted the request (HTTP {status}): {message}")

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``state_dict`` under ``weight_sync_dir`` and load it: pause, load from disk, continue."""
        if self.config.weight_sync_dir is None:
            raise ValueError(
                "weight_sync_dir: SGLangEngine.update_weights needs a directory the server can read "
                "(or call update_weights_from_tensor with SGLang's serialized tensors)"
            )
        folder = await asyncio.to_thread(self._write_weights, state_dict, int(version))
        await self.update_weights_from_disk(folder, version)

    # --- SGLang's control endpoints ----------------------------------------------------------------------

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> JsonObject:
        """Pause (``pause_mode``), ``/update_weights_from_disk`` with the new version, continue."""
        body: JsonObject = {
            "model_path": str(model_path),
            "weight_version": str(int(version)),
            "flush_cache": True,
            "abort_all_requests": False,
        }
        return await self._paused_update("/update_weights_from_disk", body, version)

    async def update_weights_from_tensor(
        self, serialized_named_tensors: list[str], version: int, *, load_format: str | None = None
    ) -> JsonObject:
        """``/update_weights_from_tensor`` with SGLang's serialized named tensors (one entry per TP rank)."""
        body: JsonObject = {
            "serialized_named_tensors": serialized_named_tensors,
            "flush_cache": True,
            "abort_all_requests": False,
            "weight_version": str(int(version)),
        }
        if load_format is not None:
            body["load_format"] = load_format
        return await self._paused_update("/update_weights_from_tensor", body, version)

    async def pause_generation(self, mode: str | None = None) -> None:
        """``/pause_generation`` (``retract``: requests re-queued and recomputed; ``in_place``; ``abort``)."""
        mode = mode or self.config.pause_mode
        require_one_of(mode, "mode", _PAUSE_MODES)
        await self._request("POST", "/pause_generation", json={"mode": mode})

    async def continue_generation(self) -> None:
        """``/continue_generation``."""
        await self._request("POST", "/continue_generation", json={})

    async def flush_cache(self) -> None:
        """``/flush_cache`` (the server refuses while requests are running)."""
        await self._request("POST", "/flush_cache")

    async def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """``/abort_request`` for one request id, or every request."""
        require(rid is not None or abort_all, "rid", "give a request id or abort_all=True")
        await self._request("POST", "/abort_request", json={"rid": rid or "", "abort_all": abort_all})

    async def update_weight_version(self, version: int, *, abort_all_requests: bool = False) -> None:
        """``/update_weight_version`` without touching the weights."""
        body: JsonObject = {"new_version": str(int(version)), "abort_all_requests": abort_all_requests}
        self._checked_success(await self._request("POST", "/update_weight_version", json=body))
        self._weight_version = int(version)

    async def labelled(self) -> bool:
        """Whether the weights carry a version Rein set (``/model_info``; a restarted server says ``default``)."""
        return (await self._model_info()).get("weight_version") not in (None, "default")

    async def get_load(self) -> list[JsonValue]:
        """``GET /get_load``: per data-parallel rank ``num_reqs`` (running + waiting), ``num_waiting_reqs`` …"""
        load = await self._request("GET", "/get_load")
        return load if isinstance(load, list) else [load]

    async def num_requests(self) -> int:
        """``InferenceServer``: running + waiting requests over every data-parallel rank (``/get_load``)."""
        return sum(
            int(json_object(rank, "SGLang /get_load").get("num_reqs", 0)) for rank in await self.get_load()
        )

    async def load_weights_from_disk(self, model_path: str | Path, version: int) -> JsonObject:
        """``InferenceServer``: ``/update_weights_from_disk`` of an HF folder as ``version``, no pause around it
        (the fleet pauses every server first)."""
        body: JsonObject = {
            "model_path": str(model_path),
            "weight_version": str(int(version)),
            "flush_cache": True,
            "abort_all_requests": False,
        }
        return await self.post_update("/update_weights_from_disk", body, version)

    async def tensor_parallel_size(self) -> int:
        """The server's ``tp_size`` (``/get_server_info``, or the older ``/server_info``): its ranks in a
        weight-update group."""
        try:
            info = await self._request_object("GET", "/get_server_info")
        except SGLangUnreachableError:
            raise
        except EngineError:
            info = await self._request_object("GET", "/server_info")
        return int(info.get("tp_size", 1))

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """``/release_memory_occupation``: free the GPU memory of ``tags`` (``weights``, ``kv_cache``; None: all)
        while a colocated trainer uses the GPUs. Generation must be idle."""
        await self._request("POST", "/release_memory_occupation", json={"tags": _tags(tags)})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """``/resume_memory_occupation``: take the memory back (then load fresh weights before generating)."""
        await self._request("POST", "/resume_memory_occupation", json={"tags": _tags(tags)})

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        """``/init_weights_update_group``: the server's ranks join a torch.distributed group in which the
        trainer's rank 0 is rank 0 (returns once every member joined)."""
        body: JsonObject = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "group_name": group_name,
            "backend": backend,
        }
        self._checked_success(
            await self._request("POST", "/init_weights_update_group", json=body, accept_status=(400,))
        )

    async def update_weights_from_distributed(
        self,
        *,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str,
        version: int | None,
        flush_cache: bool,
    ) -> None:
        """``/update_weights_from_distributed``: the server receives one broadcast (from rank 0 of the group)
        per listed tensor, in order, and loads them. No pause here: the caller pauses around a whole sync."""
        body: JsonObject = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [[int(d) for d in shape] for shape in shapes],
            "group_name": group_name,
            "flush_cache": flush_cache,
            "abort_all_requests": False,
        }
        if version is not None:
            body["weight_version"] = str(int(version))
        self._checked_success(
            await self._request("POST", "/update_weights_from_distributed", json=body, accept_status=(400,))
        )
        if version is not None:
            self._weight_version = int(version)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """``/destroy_weights_update_group``."""
        self._checked_success(
            await self._request(
                "POST", "/destroy_weights_update_group", json={"group_name": group_name}, accept_status=(400,)
            )
        )

    async def load_lora_adapter(self, lora_path: str | Path, version: int, *, policy: str = "") -> JsonObject:
        """``LoraServingEngine``: ``/load_lora_adapter`` the PEFT folder ``lora_path`` under a new name (the
        folder's name), serve later requests of ``policy`` ("" = the engine-wide adapter) with it as
        ``version``, then ``/unload_lora_adapter`` that policy's previous one (SGLang lets requests already using
        it finish)."""
        name = Path(lora_path).name
        owners = [owner for owner, (loaded, _) in self._loras.items() if loaded == name and owner != policy]
        if owners:
            raise EngineError(
                f"adapter name {name!r} already serves policy {owners[0]!r}; load it under a new name"
            )
        async with self.update_lock:
            body: JsonObject = {"lora_name": name, "lora_path": str(lora_path)}
            reply = await self._request("POST", "/load_lora_adapter", json=body, accept_status=(400,))
            if not (isinstance(reply, dict) and reply.get("success")):
                message = reply.get("error_message") if isinstance(reply, dict) else reply
                raise EngineError(f"SGLang /load_lora_adapter {name!r} failed: {message}")
            previous = self._loras.get(policy)
            self._loras[policy] = (name, int(version))
            if not policy:
                self._weight_version = int(version)
            if previous is not None and previous[0] != name:
                await self.unload_lora_adapter(previous[0])
        return reply

    def policy(self, name: str) -> SGLangPolicy:
        """Multi-LoRA: the view of this server that serves policy ``name`` with its own adapter and versions."""
        return SGLangPolicy(self, name)

    def adapter_version(self, name: str) -> int:
        """The version of policy ``name``'s adapter (the initial version until its first load)."""
        loaded = self._loras.get(name)
        return loaded[1] if loaded is not None else self.config.initial_weight_version

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """``/unload_lora_adapter``; ``EngineError`` unless the server reports success."""
        body: JsonObject = {"lora_name": lora_name}
        reply = await self._request("POST", "/unload_lora_adapter", json=body, accept_status=(400,))
        if not (isinstance(reply, dict) and reply.get("success")):
            message = reply.get("error_message") if isinstance(reply, dict) else reply
            raise EngineError(f"SGLang /unload_lora_adapter {lora_name!r} failed: {message}")

    async def post_update(self, path: str, body: JsonObject, version: int) -> JsonObject:
        """One weight-loading call (no pause around it); ``EngineError`` unless it reports success."""
        reply = self._checked_success(await self._request("POST", path, json=body, accept_status=(400,)))
        self._weight_version = int(version)
        return reply

    # --- request / reply shapes (public so that the tests and the proxy can check them) -------------------

    def generate_payload(
        self, prompt: list[int], params: SamplingParams, *, rid: str, lora_name: str | None = None
    ) -> JsonObject:
        """The ``/generate`` body for one request; ``max_new_tokens`` is clamped to the room left;
        ``lora_name``: the loaded adapter that serves it (SGLang's ``lora_path`` field)."""
        sampling: JsonObject = {
            "max_new_tokens": min(params.max_tokens, self.context_window - len(prompt)),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k or -1,  # SGLang: -1 disables top-k (0 is rejected)
        }
        if params.stop_strings:
            sampling["stop"] = list(params.stop_strings)
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        payload: JsonObject = {
            "rid": rid,
            "input_ids": prompt,
            "sampling_params": sampling,
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": False,
        }
        if params.return_routed_experts:
            payload["return_routed_experts"] = True
        if lora_name is not None:
            payload["lora_path"] = lora_name
        return payload

    def parse_generate_reply(
        self, reply: JsonValue, prompt: list[int], params: SamplingParams
    ) -> GenerationResult:
        """A ``GenerationResult`` from a ``/generate`` reply, refusing anything that breaks the contract."""
        if isinstance(reply, list):
            if len(reply) != 1:
                raise EngineError(f"SGLang returned {len(reply)} results for one prompt")
            reply = reply[0]
        if "error" in reply and "output_ids" not in reply:
            raise EngineError(f"SGLang /generate failed: {reply['error']}")
        meta = reply.get("meta_info")
        output_ids = reply.get("output_ids")
        if not isinstance(meta, Mapping) or not isinstance(output_ids, list):
            raise EngineError(f"SGLang /generate reply lacks output_ids/meta_info: keys {sorted(reply)}")
        output_ids = [int(token) for token in output_ids]
        finish_reason = self._parse_finish_reason(meta.get("finish_reason"))
        logprobs = self._parse_logprobs(meta, output_ids)
        versions = self._parse_versions(meta, len(output_ids))
        routed = (
            self._parse_routed_experts(meta, len(prompt) + len(output_ids) - 1)
            if params.return_routed_experts
            else None
        )
        prompt_tokens = int(meta.get("prompt_tokens", len(prompt)))
        if prompt_tokens != len(prompt):
            raise EngineError(
                f"SGLang counted {prompt_tokens} prompt tokens for a {len(prompt)}-token prompt"
            )
        return GenerationResult(
            output_ids=tuple(output_ids),
            logprobs=logprobs,
            weight_versions=versions,
            finish_reason=finish_reason,
            num_prompt_tokens=len(prompt),
            routed_experts=routed,
        )

    @staticmethod
    def _parse_finish_reason(value: JsonValue) -> FinishReason:
        kind = value.get("type") if isinstance(value, Mapping) else value
        if kind == "stop":
            return FinishReason.STOP
        if kind == "length":
            return FinishReason.LENGTH
        if kind == "abort":
            return FinishReason.ABORT
        raise EngineError(f"SGLang reply has no usable meta_info.finish_reason: {value!r}")

    @staticmethod
    def _parse_logprobs(meta: Mapping[str, JsonValue], output_ids: list[int]) -> tuple[float, ...]:
        entries = meta.get("output_token_logprobs")
        if entries is None:
            if not output_ids:
                return ()
            raise MissingLogprobsError(
                f"SGLang returned {len(output_ids)} output ids without meta_info.output_token_logprobs although "
                "the request set return_logprob=true; the server (or a proxy in front of it) dropped them"
            )
        if len(entries) != len(output_ids):
            raise MissingLogprobsError(
                f"SGLang returned {len(entries)} output_token_logprobs for {len(output_ids)} output ids"
            )
        logprobs = []
        for index, (entry, token) in enumerate(zip(entries, output_ids, strict=True)):
            logprob, entry_token = entry[0], entry[1]
            if logprob is None:
                raise MissingLogprobsError(
                    f"SGLang returned a null logprob for output token {index} (id {token})"
                )
            if int(entry_token) != token:
                raise EngineError(
                    f"output_token_logprobs[{index}] is for id {entry_token}, output_ids has {token}"
                )
            logprobs.append(float(logprob))
        return tuple(logprobs)

    def _parse_versions(self, meta: Mapping[str, JsonValue], num_tokens: int) -> tuple[int, ...]:
        spans = meta.get("weight_versions")
        if spans:
            versions: list[int] = []
            for span in spans:
                start, end = int(span["start"]), int(span["end"])
                if start != len(versions) or end < start:
                    raise EngineError(f"SGLang weight_versions spans are not contiguous: {spans!r}")
                versions.extend([self._parse_version(span["version"])] * (end - start))
            if len(versions) != num_tokens:
                raise EngineError(
                    f"SGLang weight_versions cover {len(versions)} of {num_tokens} output tokens"
                )
            return tuple(versions)
        if "weight_version" not in meta:
            raise EngineError(
                "SGLang reply has no meta_info.weight_version: cannot stamp tokens with a version"
            )
        return (self._parse_version(meta["weight_version"]),) * num_tokens

    def _parse_version(self, value: JsonValue) -> int:
        if value is None or value == "default":
            return self.config.initial_weight_version
        try:
            return int(value)
        except (TypeError, ValueError):
            raise EngineError(
                f"SGLang weight version {value!r} is not an integer (Rein sets integer versions)"
            ) from None

    def _parse_routed_experts(self, meta: Mapping[str, JsonValue], num_positions: int) -> tuple:
        import numpy as np

        encoded = meta.get("routed_experts")
        if encoded is None:
            raise EngineError("return_routed_experts was requested but meta_info.routed_experts is missing")
        top_k = self.config.routed_experts_top_k
        if top_k is None:
            raise ValueError("routed_experts_top_k: set it in SGLangEngineConfig to decode routed experts")
        flat = np.frombuffer(base64.b64decode(encoded), dtype="<i4")
        if num_positions <= 0 or flat.size % (num_positions * top_k):
            raise EngineError(
                f"routed_experts has {flat.size} ids, not a multiple of {num_positions} x {top_k}"
            )
        table = flat.reshape(num_positions, -1, top_k)
        return tuple(tuple(tuple(int(e) for e in layer) for layer in position) for position in table)

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> tuple[float, ...]:
        """Teacher-forced log p(input_ids[i] | input_ids[:i]) for i in [start, len) (a distillation teacher,
        ``components/training/distillation.py``): ``/generate`` with ``max_new_tokens`` 0, ``return_logprob`` and
        ``logprob_start_len`` 0, whose ``meta_info.input_token_logprobs`` holds [logprob, id, text] for every
        prompt token (the first one's logprob null: nothing precedes it)."""
        ids = [int(token) for token in input_ids]
        require(1 <= start <= len(ids), "start", f"must be in [1, {len(ids)}], got {start}")
        if len(ids) >= self.context_window:
            raise ContextOverflowError(num_prompt_tokens=len(ids), context_window=self.context_window)
        payload: JsonObject = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        reply = await self._request("POST", "/generate", json=payload)
        try:
            entries = reply["meta_info"]["input_token_logprobs"]
            if [int(entries[i][1]) for i in range(start, len(ids))] != ids[start:]:
                raise ValueError("the scored ids are not the ids sent")
            return tuple(float(entries[i][0]) for i in range(start, len(ids)))
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise MissingLogprobsError(
                f"SGLang {self.url}: /generate returned no input logprob for every scored token ({error!r})"
            ) from None

    # --- plumbing ----------------------------------------------------------------------------------------

    async def _paused_update(self, path: str, body: JsonObject, version: int) -> JsonObject:
        async with self.update_lock:
            await self.pause_generation()
            try:
                reply = await self._request("POST", path, json=body, accept_status=(400,))
            finally:
                await self.continue_generation()
            checked = self._checked_success(reply)
            self._weight_version = int(version)
            return checked

    @staticmethod
    def _checked_success(reply: JsonValue) -> JsonObject:
        """``reply`` when it is an object reporting ``success``; ``EngineError`` with its message otherwise."""
        if not isinstance(reply, dict) or not reply.get("success", False):
            message = reply.get("message") if isinstance(reply, dict) else reply
            raise EngineError(f"SGLang refused the update: {message}")
        return reply

    async def _model_info(self) -> JsonObject:
        try:
            return await self._request_object("GET", "/model_info")
        except EngineError:
            return await self._request_object("GET", "/get_model_info")

    async def _abort_quietly(self, rid: str) -> None:
        try:
            await self.abort_request(rid)
        except (EngineError, httpx.HTTPError):
            pass

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: JsonValue = None,
        params: Mapping[str, str] | None = None,
        accept_status: tuple[int, ...] = (),
    ) -> JsonValue:
        """``HttpServerClient._request``, with the admin key on the control endpoints."""
        headers = None
        if path in CONTROL_PATHS and self.config.settings.admin_api_key:
            headers = {"Authorization": f"Bearer {self.config.settings.admin_api_key}"}
        return await super()._request(
            method, path, json=json, params=params, headers=headers, accept_status=accept_status
        )

    def status_error(self, method: str, path: str, response: httpx.Response) -> EngineError:
        detail = response.text[:500]
        if response.status_code == 400 and "context length" in detail.lower():
            return _PromptTooLongError(f"SGLang refused the prompt as too long: {detail}")
        return super().status_error(method, path, response)

    def _write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Path:
        """``weight_sync_dir/v<version>/`` = base model files + ``model.safetensors``, renamed into place."""
        from safetensors.torch import save_file

        root = Path(self.config.weight_sync_dir)  # type: ignore[arg-type]
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"v{version}"
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".v{version}-"))
        try:
            if self.config.base_model_path is not None:
                for source in Path(self.config.base_model_path).iterdir():
                    if source.is_file() and not source.name.endswith((".safetensors", ".bin", ".index.json")):
                        shutil.copy2(source, staging / source.name)
            tensors = {name: t.detach().contiguous().cpu() for name, t in state_dict.items()}
            save_file(_drop_shared(tensors), str(staging / "model.safetensors"))
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        synced = sorted((p for p in root.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
        for old in synced[: -self.config.keep_synced_versions]:
            shutil.rmtree(old, ignore_errors=True)
        return final


def _tags(tags: Sequence[str] | None) -> JsonArray | None:
    if tags is None:
        return None
    for tag in tags:
        require_one_of(tag, "tags", ("weights", "kv_cache", "cuda_graph"))
    return list(tags)


def _drop_shared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory: drop exact aliases (tied embeddings keep their first
    name, as HF checkpoints do) and copy any other view that shares a storage."""
    seen_alias: set[tuple] = set()
    seen_storage: set[int] = set()
    kept = {}
    for name, tensor in tensors.items():
        alias = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
        if alias in seen_alias:
            continue
        seen_alias.add(alias)
        storage = tensor.untyped_storage().data_ptr()
        kept[name] = tensor.clone() if storage in seen_storage else tensor
        seen_storage.add(storage)
    return kept


def serialize_named_tensors(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> str:
    """SGLang's ``MultiprocessingSerializer.serialize(..., output_str=True)``: base64 of a ForkingPickler dump.
    Tensors travel as shared-memory handles, so the server must run on the same machine (co-located)."""
    import io
    from multiprocessing.reduction import ForkingPickler

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(list(named_tensors))
    return base64.b64encode(buffer.getvalue()).decode("utf-8")


class SGLangPolicy(StreamingPolicyView[SGLangEngine]):
    """One policy's view of a multi-LoRA SGLang server: an ``InferenceEngine`` + ``LoraServingEngine`` whose
    requests carry this policy's adapter name (``lora_path``) and whose versions are that adapter's own. A proxy
    session bound to this view samples only with this policy; a disk ``WeightSync`` over it loads only this
    policy's adapter versions."""

    def __init__(self, engine: SGLangEngine, name: str) -> None:
        require(bool(name), "policy", "must be a non-empty name ('' is the engine-wide adapter)")
        super().__init__(engine, name)

    async def load_lora_adapter(self, lora_path: str | Path, version: int) -> JsonObject:
        return await self.engine.load_lora_adapter(lora_path, version, policy=self.name)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        raise EngineError(
            f"policy {self.name!r}: the base weights are shared by every policy; push this policy's adapter "
            "(a LoRA trainer's disk WeightSync calls load_lora_adapter)"
        )
