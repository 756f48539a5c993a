"""A local stand-in for an SGLang server (which needs a GPU), following SGLang's own request/response shapes
(``sglang/srt/managers/io_struct.py``, ``sglang/srt/entrypoints/http_server.py``) over real HTTP.

Generation is real: an ``EmbeddedEngine`` over the tiny model samples the tokens, so logprobs, stop handling
and weight updates mean something. Knobs on ``FakeSGLangState`` inject the failures the client must handle
(dropped or null logprobs, transient 503s, a server without per-token version spans). Logprobs are SGLang's:
under top-p / top-k they stay those of the untruncated ``softmax(logits / temperature)``.

Also as SGLang does: ``--api-key`` / ``--admin-api-key`` with its auth levels (``sglang/srt/utils/auth.py``:
control endpoints are ADMIN_OPTIONAL, ``/health*`` always open); ``/health`` answers 503 while the server is
starting; ``/init_weights_update_group`` joins a torch.distributed group built like SGLang's
``init_custom_process_group`` (``backend`` as given: gloo on CPU) as rank ``rank_offset + tp_rank`` and
``/update_weights_from_distributed`` receives one ``broadcast(src=0)`` per listed tensor and loads them at
once; ``/release_memory_occupation`` / ``/resume_memory_occupation`` track the released tags.
``/_fake/received`` (fake only) reports SHA-256 digests of the tensors received over the group, so a test
can check they are exactly what the trainer sent.
LoRA (``enable_lora``, SGLang's ``--enable-lora``): ``/load_lora_adapter`` reads a PEFT folder into the engine,
``/unload_lora_adapter`` drops a name, ``/generate`` with ``lora_path`` must name a loaded adapter (400
otherwise, as SGLang). Every loaded name is its own adapter on the engine (``EmbeddedEngine``'s multi-LoRA),
so requests naming different adapters are served side by side, each with its own; an unloaded name's adapter
stays on the engine for requests already running with it (SGLang lets them finish) but new requests get 400.

Run it as its own process (``python -m tests.components.engine.fake_sglang --model-path DIR --port N``, or
``FakeSGLangProcess``) or in a thread of the test (``FakeSGLangServer``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import os
import pickle
import secrets
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from components.engine.embedded import EmbeddedEngine
from components.engine.scripted import ScriptedEngine
from components.protocols import FinishReason, GenerationResult, SamplingParams, StreamingEngine, TokenChunk


@dataclass
class FakeSGLangState:
    engine: EmbeddedEngine
    model_path: str
    weight_version: str = "default"  # SGLang's initial server_args.weight_version
    send_version_spans: bool = True  # newer SGLang: meta_info.weight_versions spans
    drop_logprobs: bool = False  # omit meta_info.output_token_logprobs
    null_logprob_at: int | None = None  # put a null logprob at this output index
    fail_next: int = 0  # answer the next N requests with 503
    requests: list[tuple[str, Any]] = field(default_factory=list)
    request_times: list[float] = field(default_factory=list)  # time.time() of each entry of ``requests``
    paused: asyncio.Event | None = None  # set = running
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    api_key: str | None = None  # SGLang's --api-key
    admin_api_key: str | None = None  # SGLang's --admin-api-key
    starting_until: float = 0.0  # time.monotonic() before which /health answers 503 (server starting)
    update_groups: dict[str, Any] = field(default_factory=dict)  # group_name → torch process group
    received: dict[str, str] = field(default_factory=dict)  # tensor name → sha256 of its received bytes
    released_tags: set[str] = field(default_factory=set)  # /release_memory_occupation
    tp_size: int = 1
    num_waiting: int = 0  # /generate requests held by a pause
    enable_lora: bool = False  # SGLang's --enable-lora
    loras: dict[str, str] = field(default_factory=dict)  # loaded adapter name → its lora_path, oldest first
    incremental_streaming_output: bool = False  # SGLang's --incremental-streaming-output (stream deltas)
    stream_abort_delay_s: float = 2.0  # SGLang aborts a stream's rid this long after the stream ends
    aborted: list[str] = field(default_factory=list)  # rids whose generation an abort stopped (fake only)

    def version_int(self) -> int:
        return 0 if self.weight_version == "default" else int(self.weight_version)


def _finish_reason(result, sampling: dict[str, Any], tokenizer) -> dict[str, Any]:
    if result.finish_reason is FinishReason.LENGTH:
        return {"type": "length", "length": len(result.output_ids)}
    if result.finish_reason is FinishReason.ABORT:
        return {"type": "abort", "message": "Abort before prefill" if not result.output_ids else "aborted"}
    last = result.output_ids[-1]
    for stop in sampling.get("stop") or []:
        if stop in tokenizer.decode(list(result.output_ids)):
            return {"type": "stop", "matched": stop}
    return {"type": "stop", "matched": last}


# SGLang's ADMIN_OPTIONAL endpoints (``@auth_level(AuthLevel.ADMIN_OPTIONAL)`` in http_server.py). Written out
# here, not imported from the client's ``CONTROL_PATHS``: the fake is an independent reading of SGLang, so a
# wrong list in the client fails against it instead of agreeing with it.
ADMIN_OPTIONAL_PATHS = frozenset(
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


def _bearer_matches(header: str | None, key: str) -> bool:
    if not header:
        return False
    parts = header.split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], key)


def request_allowed(state: FakeSGLangState, path: str, authorization: str | None) -> bool:
    """SGLang's ``decide_request_auth`` for NORMAL and ADMIN_OPTIONAL endpoints."""
    if path.startswith(("/health", "/metrics")):
        return True
    if path in ADMIN_OPTIONAL_PATHS:
        if state.admin_api_key:
            return _bearer_matches(authorization, state.admin_api_key)
        if state.api_key:
            return _bearer_matches(authorization, state.api_key)
        return True
    if state.api_key:
        return _bearer_matches(authorization, state.api_key)
    return True


def init_custom_process_group(*, backend, init_method, world_size, rank, group_name, timeout):
    """SGLang's ``init_custom_process_group`` (itself from PyTorch / OpenRLHF): a group beside the default one.
    The server's side, kept apart from the trainer's copy in ``sglang_weight_transfer`` on purpose (see above)."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def build_app(state: FakeSGLangState) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record_and_fail(request: Request, call_next):
        body = await request.body()
        state.requests.append((request.url.path, body.decode() if body else None))
        state.request_times.append(time.time())
        if not request_allowed(state, request.url.path, request.headers.get("authorization")):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if state.fail_next > 0:
            state.fail_next -= 1
            return Response("Service Unavailable", status_code=503)
        return await call_next(request)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        if time.monotonic() < state.starting_until:  # ServerStatus.Starting
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/get_load")
    async def get_load() -> list[dict[str, Any]]:
        waiting = state.num_waiting
        running = len(state.tasks)
        return [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting, "num_tokens": 0}]

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return {
            "model_path": state.model_path,
            "tp_size": state.tp_size,
            "dp_size": 1,
            "weight_version": state.weight_version,
            "version": "0.5.23-fake",
        }

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request):
        from datetime import timedelta

        body = await request.json()
        group_name = body.get("group_name", "weight_update_group")
        rank = int(body["rank_offset"]) + 0  # tp_rank 0: this fake has one tensor-parallel rank
        try:
            group = await asyncio.to_thread(
                init_custom_process_group,
                backend=body.get("backend", "nccl"),
                init_method=f"tcp://{body['master_address']}:{body['master_port']}",
                world_size=int(body["world_size"]),
                rank=rank,
                group_name=group_name,
                timeout=timedelta(seconds=120),
            )
        except Exception as error:  # SGLang answers success=false with the reason
            message = f"Failed to initialize custom process group: {error}."
            return JSONResponse({"success": False, "message": message}, 400)
        state.update_groups[group_name] = group
        return {"success": True, "message": "Succeeded to initialize custom process group."}

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request):
        import torch
        import torch.distributed as dist

        body = await request.json()
        group_name = body.get("group_name", "weight_update_group")
        group = state.update_groups.get(group_name)
        if group is None:
            message = f"Group {group_name} not in {list(state.update_groups)}. Call `init_weights_update_group` first."
            return JSONResponse({"success": False, "message": message}, 400)

        def receive() -> list[tuple[str, Any]]:
            weights, handles = [], []
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
                weight = torch.empty(shape, dtype=getattr(torch, dtype))
                handles.append(dist.broadcast(weight, src=0, group=group, async_op=True))
                weights.append((name, weight))
            for handle in handles:
                handle.wait()
            return weights

        try:
            weights = await asyncio.to_thread(receive)
            for name, weight in weights:
                state.received[name] = hashlib.sha256(
                    weight.contiguous().view(torch.uint8).numpy()
                ).hexdigest()
            merged = _load_weights(state.engine.model.state_dict(), dict(weights))
            version = _engine_version(body.get("weight_version"), state)
            await state.engine.update_weights(merged, version)
        except Exception as error:
            message = (
                f"Failed to update parameter online: {error}. The full weights of the ModelRunner are "
                "partially updated. Please discard the whole weights."
            )
            return JSONResponse({"success": False, "message": message}, 400)
        message = "Succeeded to update parameter online."
        if body.get("weight_version") is not None:
            state.weight_version = str(body["weight_version"])
            message += f" Weight version updated to {body['weight_version']}."
        return {"success": True, "message": message}

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request):
        import torch.distributed as dist

        body = await request.json()
        group = state.update_groups.pop(body.get("group_name", "weight_update_group"), None)
        if group is None:
            return JSONResponse(
                {"success": False, "message": "The group to be destroyed does not exist."}, 400
            )
        await asyncio.to_thread(dist.destroy_process_group, group)
        return {"success": True, "message": "Succeeded to destroy custom process group."}

    @app.get("/_fake/requests")
    async def fake_requests() -> list[dict[str, Any]]:
        log = []
        for (path, body), at in zip(list(state.requests), list(state.request_times), strict=False):
            entry: dict[str, Any] = {"path": path, "time": at}
            if path == "/generate" and body:
                entry["input_ids"] = json.loads(body).get("input_ids")
            log.append(entry)
        return log

    @app.get("/_fake/received")
    async def fake_received() -> dict[str, str]:
        return dict(state.received)

    @app.api_route("/release_memory_occupation", methods=["GET", "POST"])
    async def release_memory_occupation(request: Request):
        body = await request.json() if await request.body() else {}
        state.released_tags |= set(body.get("tags") or ("weights", "kv_cache"))
        return Response(status_code=200)

    @app.api_route("/resume_memory_occupation", methods=["GET", "POST"])
    async def resume_memory_occupation(request: Request):
        body = await request.json() if await request.body() else {}
        state.released_tags -= set(body.get("tags") or ("weights", "kv_cache"))
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": state.model_path, "object": "model", "root": state.model_path}
        return {"object": "list", "data": [{**card, "max_model_len": state.engine.context_window}]}

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": state.model_path,
            "tokenizer_path": state.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": state.weight_version,
        }

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await request.json()
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not all(isinstance(t, int) for t in input_ids):
            return JSONResponse(
                {"object": "error", "message": "input_ids must be a list of ints", "code": 400}, 400
            )
        sampling = body.get("sampling_params") or {}
        rid = body.get("rid") or f"rid-{time.time_ns()}"
        stream = bool(body.get("stream"))

        def refused(message: str) -> Response:
            # SGLang: the tokenizer manager's ValueError is a 400 reply, or in a stream an error event (HTTP 200)
            if stream:
                return StreamingResponse(
                    _sse([{"error": {"message": message}}]), media_type="text/event-stream"
                )
            return JSONResponse({"object": "error", "message": message, "code": 400}, 400)

        if len(input_ids) >= state.engine.context_window:
            message = (
                f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                f"({state.engine.context_window} tokens)."
            )
            return refused(message)
        if state.released_tags:  # the weights / KV cache are not on the GPU: nothing can run
            message = f"memory released ({sorted(state.released_tags)}): call /resume_memory_occupation"
            return refused(message)
        lora_name = body.get("lora_path")
        if lora_name is not None:
            if not state.enable_lora:
                message = "LoRA is not enabled. Please set `--enable-lora` to True."
                return refused(message)
            if lora_name not in state.loras:
                message = f"The following requested LoRA adapters are not loaded: {lora_name}"
                return refused(message)
        if int(sampling.get("max_new_tokens", 128)) == 0:  # prefill only: SGLang's way to score a prompt
            return await _prompt_scores(state, body, rid, input_ids)
        params = SamplingParams(
            max_tokens=int(sampling.get("max_new_tokens", 128)),
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=max(int(sampling.get("top_k", -1)), 0),  # SGLang's -1 (off) is our 0
            stop_strings=tuple(sampling.get("stop") or ()),
            stop_token_ids=tuple(sampling.get("stop_token_ids") or ()),
            seed=sampling.get("sampling_seed"),
            return_routed_experts=bool(body.get("return_routed_experts", False)),
        )
        adapter = {} if lora_name is None else {"adapter": engine_adapter_name(lora_name)}
        if stream:
            events = _stream_events(state, body, rid, input_ids, sampling, params, adapter)
            return StreamingResponse(_sse(events), media_type="text/event-stream")
        state.num_waiting += 1  # in SGLang's waiting queue until generation is not paused
        try:
            await state.paused.wait()
        finally:
            state.num_waiting -= 1
        task = asyncio.ensure_future(state.engine.generate(input_ids, params, **adapter))
        state.tasks[rid] = task
        try:
            result = await task
        except asyncio.CancelledError:
            return {
                "text": "",
                "output_ids": [],
                "meta_info": {
                    "id": rid,
                    "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
                    "prompt_tokens": len(input_ids),
                    "completion_tokens": 0,
                    "cached_tokens": 0,
                    "weight_version": state.weight_version,
                    "output_token_logprobs": [],
                },
            }
        finally:
            state.tasks.pop(rid, None)
        if params.temperature > 0 and (params.top_p < 1 or params.top_k > 0):
            result = await _as_sglang_logprobs(state.engine, input_ids, result, params.temperature)
        return _reply(state, body, rid, input_ids, sampling, result)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await request.json()
        from safetensors.torch import load_file

        path = Path(body.get("model_path", "")) / "model.safetensors"
        if not path.exists():
            content = {
                "success": False,
                "message": f"Failed to get weights iterator: {path}",
                "num_paused_requests": 0,
            }
            return JSONResponse(content, 400)
        try:
            await state.engine.update_weights(
                load_file(str(path)), _engine_version(body.get("weight_version"), state)
            )
        except ValueError as error:
            return JSONResponse({"success": False, "message": str(error), "num_paused_requests": 0}, 400)
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            state.weight_version = str(body["weight_version"])
            message += f" Weight version updated to {body['weight_version']}."
        return {"success": True, "message": message, "num_paused_requests": 0}

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        from components.lora import LoraError, read_adapter_folder

        body = await request.json()
        name, path = body.get("lora_name", ""), body.get("lora_path", "")

        def failed(message: str) -> JSONResponse:
            content = {"success": False, "error_message": message, "loaded_adapters": dict(state.loras)}
            return JSONResponse(content, 400)

        if not state.enable_lora:
            return failed("LoRA is not enabled. Please set `--enable-lora` to True.")
        if not name or not path:
            return failed("lora_name and lora_path are required")
        if name in state.loras:
            return failed(f"The LoRA adapter {name} is already loaded.")
        try:
            adapter = await asyncio.to_thread(read_adapter_folder, Path(path))
            await state.engine.update_adapter(adapter, state.version_int(), name=engine_adapter_name(name))
        except (LoraError, OSError, ValueError) as error:
            return failed(f"Failed to load LoRA adapter {name}: {error}")
        state.loras[name] = path
        return {"success": True, "error_message": None, "loaded_adapters": dict(state.loras)}

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        body = await request.json()
        name = body.get("lora_name", "")
        if name not in state.loras:
            content = {
                "success": False,
                "error_message": f"LoRA adapter {name} is not loaded.",
                "loaded_adapters": dict(state.loras),
            }
            return JSONResponse(content, 400)
        del state.loras[name]
        return {"success": True, "error_message": None, "loaded_adapters": dict(state.loras)}

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request):
        body = await request.json()
        try:
            named = pickle.loads(base64.b64decode(body["serialized_named_tensors"][0]))
            await state.engine.update_weights(dict(named), _engine_version(body.get("weight_version"), state))
        except (KeyError, ValueError, pickle.UnpicklingError) as error:
            return JSONResponse({"success": False, "message": str(error)}, 400)
        if body.get("weight_version") is not None:
            state.weight_version = str(body["weight_version"])
        return {"success": True, "message": "Succeeded to update model weights."}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await request.json() if await request.body() else {}
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return JSONResponse({"object": "error", "message": f"Invalid mode: {mode!r}", "code": 400}, 400)
        state.paused.clear()
        if mode == "abort":
            for task in list(state.tasks.values()):
                task.cancel()
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def continue_generation():
        state.paused.set()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache():
        return Response("Cache flushed.\nPlease check backend logs for more details.\n", status_code=200)

    @app.post("/abort_request")
    async def abort_request(request: Request):
        body = await request.json()
        targets = list(state.tasks) if body.get("abort_all") else [body.get("rid")]
        for rid in targets:
            task = state.tasks.get(rid)
            if task is not None and not task.done():
                task.cancel()
                state.aborted.append(rid)
        return Response(status_code=200)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        body = await request.json()
        state.weight_version = str(body["new_version"])
        state.engine._weight_version = state.version_int()  # the fake's engine stamps tokens with it
        return {
            "success": True,
            "message": f"Weight version updated to {body['new_version']}",
            "new_version": body["new_version"],
        }

    return app


def _load_weights(own: dict[str, Any], received: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ``model.load_weights``: the named tensors replace the model's, the others stay - and a tied
    parameter (lm_head sharing the embedding) follows the tensor it is tied to."""
    unknown = sorted(set(received) - set(own))
    if unknown:
        raise ValueError(f"the model has no parameters {unknown[:3]}")
    received_by_storage = {own[name].data_ptr(): name for name in received}
    merged = {}
    for name, tensor in own.items():
        if name in received:
            merged[name] = received[name]
        elif tensor.data_ptr() in received_by_storage:
            merged[name] = received[received_by_storage[tensor.data_ptr()]]
        else:
            merged[name] = tensor
    return merged


async def _as_sglang_logprobs(engine: EmbeddedEngine, input_ids: list[int], result, temperature: float):
    """``result`` with SGLang 0.5.x's logprobs: top-p / top-k shape which token is drawn, but the logprob
    returned is ``log_softmax(logits / temperature)`` of the whole vocabulary, never renormalised over the kept
    tokens (``sglang/srt/layers/sampler.py``: ``logprobs = torch.log(probs)`` of the untruncated ``probs``).
    The embedded engine renormalises, so the fake recomputes them teacher-forced."""
    import dataclasses

    import torch

    output_ids = list(result.output_ids)
    if not output_ids:
        return result

    def untruncated() -> tuple[float, ...]:
        ids = torch.tensor([input_ids + output_ids], dtype=torch.long, device=engine.model.device)
        with torch.no_grad():
            logits = engine.model(input_ids=ids, use_cache=False).logits[0, len(input_ids) - 1 : -1].float()
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        targets = torch.tensor(output_ids, dtype=torch.long, device=logprobs.device)
        return tuple(logprobs.gather(1, targets[:, None])[:, 0].tolist())

    return dataclasses.replace(result, logprobs=await asyncio.to_thread(untruncated))


def engine_adapter_name(lora_name: str) -> str:
    """The engine-side adapter a loaded SGLang LoRA name serves with (peft adapter names cannot hold dots)."""
    return "sglang_" + lora_name.replace(".", "_")


def _engine_version(version: Any, state: FakeSGLangState) -> int:
    return state.version_int() if version is None else int(version)


async def _prompt_scores(state: FakeSGLangState, body: dict, rid: str, input_ids: list[int]) -> dict:
    """A ``max_new_tokens`` 0 reply: with ``return_logprob`` and ``logprob_start_len`` L >= 0, SGLang's
    ``meta_info.input_token_logprobs`` of positions L.. as [logprob, id, text] (position 0's logprob null)."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": {"type": "length", "length": 0},
        "prompt_tokens": len(input_ids),
        "completion_tokens": 0,
        "cached_tokens": 0,
        "weight_version": state.weight_version,
    }
    start = int(body.get("logprob_start_len", -1))
    if body.get("return_logprob") and start >= 0 and not state.drop_logprobs:
        scored = await state.engine.logprobs_of(input_ids, 1) if len(input_ids) > 1 else ()
        values = [None, *scored]
        meta["input_token_logprobs"] = [[values[i], input_ids[i], None] for i in range(start, len(input_ids))]
        meta["output_token_logprobs"] = []
    return {"text": "", "output_ids": [], "meta_info": meta}


def _reply(
    state: FakeSGLangState, body: dict, rid: str, input_ids: list[int], sampling: dict, result
) -> dict:
    tokenizer = state.engine.tokenizer
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": _finish_reason(result, sampling, tokenizer),
        "prompt_tokens": len(input_ids),
        "completion_tokens": len(result.output_ids),
        "cached_tokens": 0,
        "weight_version": str(result.weight_versions[-1]) if result.weight_versions else state.weight_version,
    }
    if state.send_version_spans and result.weight_versions:
        spans: list[dict[str, Any]] = []
        for index, version in enumerate(result.weight_versions):
            if spans and spans[-1]["version"] == str(version):
                spans[-1]["end"] = index + 1
            else:
                spans.append({"version": str(version), "start": index, "end": index + 1})
        meta["weight_versions"] = spans
    if body.get("return_logprob") and not state.drop_logprobs:
        entries = [[lp, tok, None] for lp, tok in zip(result.logprobs, result.output_ids, strict=True)]
        if state.null_logprob_at is not None and state.null_logprob_at < len(entries):
            entries[state.null_logprob_at][0] = None
        meta["output_token_logprobs"] = entries
        meta["input_token_logprobs"] = [
            [None, input_ids[0], None]
        ]  # logprob_start_len=-1: last prompt token only
    if body.get("return_routed_experts") and result.routed_experts is not None:
        table = np.asarray(result.routed_experts, dtype="<i4")
        meta["routed_experts"] = base64.b64encode(table.tobytes()).decode("utf-8")
    return {
        "text": tokenizer.decode(list(result.output_ids)),
        "output_ids": list(result.output_ids),
        "meta_info": meta,
    }


async def _sse(events) -> Any:
    """SGLang's ``stream_results``: ``data: {json}`` per output, then ``data: [DONE]``."""
    if isinstance(events, list):
        for event in events:
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
    else:
        async for event in events:
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def _stream_events(
    state: FakeSGLangState,
    body: dict,
    rid: str,
    input_ids: list[int],
    sampling: dict,
    params: SamplingParams,
    adapter: dict[str, str],
) -> Any:
    """The events of a streamed ``/generate``, as SGLang's tokenizer manager builds them: the generation runs
    on (a task, SGLang's scheduler) whatever the reader does; each event carries the whole output so far
    (``output_ids``, ``output_token_logprobs``) or, with ``incremental_streaming_output``, only what is new
    since the last event (deltas queued for a slow reader are concatenated), while ``completion_tokens`` and the
    ``weight_versions`` spans cover the whole output. The finishing step's tokens come with the
    ``finish_reason``. When the stream ends (done or the client gone) the rid is aborted
    ``stream_abort_delay_s`` later (SGLang's ``create_abort_task``)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def generate() -> None:  # the scheduler's side: runs until done or aborted
        state.num_waiting += 1
        try:
            await state.paused.wait()
        finally:
            state.num_waiting -= 1
        if not isinstance(state.engine, StreamingEngine):  # a scripted policy: its reply in one step
            queue.put_nowait(await state.engine.generate(input_ids, params, **adapter))
            return
        items = state.engine.generate_stream(input_ids, params, **adapter)
        try:
            async for item in items:
                queue.put_nowait(item)
        finally:
            await items.aclose()

    task = asyncio.ensure_future(generate())
    state.tasks[rid] = task
    task.add_done_callback(queue.put_nowait)
    task.add_done_callback(lambda done: state.tasks.pop(rid) if state.tasks.get(rid) is done else None)

    async def abort_later() -> None:
        await asyncio.sleep(state.stream_abort_delay_s)
        if not task.done():
            task.cancel()
            state.aborted.append(rid)

    ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    sent = 0  # output ids already in an event (incremental mode)
    try:
        while True:
            item = await queue.get()
            held = [item]
            while not queue.empty() and not isinstance(held[-1], (GenerationResult, asyncio.Task)):
                held.append(queue.get_nowait())  # a slow reader: one event for everything queued
            final: GenerationResult | None = None
            for entry in held:
                if isinstance(entry, TokenChunk):
                    ids += entry.output_ids
                    logprobs += entry.logprobs
                    versions += entry.weight_versions
                elif isinstance(entry, GenerationResult):
                    final = entry
                elif isinstance(entry, asyncio.Task):  # ended without a result: aborted
                    if not entry.cancelled() and entry.exception() is not None:
                        yield {"error": {"message": repr(entry.exception())}}
                        return
                    final = GenerationResult(
                        output_ids=tuple(ids),
                        logprobs=tuple(logprobs),
                        weight_versions=tuple(versions),
                        finish_reason=FinishReason.ABORT,
                        num_prompt_tokens=len(input_ids),
                    )
            if final is not None:
                event = _reply(state, body, rid, input_ids, sampling, final)
            else:
                partial = GenerationResult(
                    output_ids=tuple(ids),
                    logprobs=tuple(logprobs),
                    weight_versions=tuple(versions),
                    finish_reason=FinishReason.LENGTH,
                    num_prompt_tokens=len(input_ids),
                )
                event = _reply(
                    state, {**body, "return_routed_experts": False}, rid, input_ids, sampling, partial
                )
                event["meta_info"]["finish_reason"] = None
            if state.incremental_streaming_output:
                meta = event["meta_info"]
                event["output_ids"] = event["output_ids"][sent:]
                if "output_token_logprobs" in meta:
                    meta["output_token_logprobs"] = meta["output_token_logprobs"][sent:]
                sent += len(event["output_ids"])
            yield event
            if final is not None:
                return
    finally:
        if not task.done():  # the client left early: the scheduler generates on until the abort
            asyncio.get_running_loop().create_task(abort_later())


class FakeSGLangServer:
    """Runs the fake on 127.0.0.1 (a free port) in a background thread; ``url`` and ``state`` for the tests."""

    def __init__(
        self,
        engine: EmbeddedEngine,
        model_path: str | Path,
        *,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        enable_lora: bool = False,
    ) -> None:
        self.state = FakeSGLangState(
            engine=engine,
            model_path=str(model_path),
            api_key=api_key,
            admin_api_key=admin_api_key,
            enable_lora=enable_lora,
        )
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.state), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.state.paused = asyncio.Event()
            self.state.paused.set()
            await self._server.serve(sockets=[self._socket])

        asyncio.run(serve())

    def __enter__(self) -> FakeSGLangServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake SGLang server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()


REPO_ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FakeSGLangProcess:
    """The fake as its own process on 127.0.0.1 (like ``python -m sglang.launch_server``); ``kill()`` it to
    simulate a server that dies."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        startup_delay_s: float = 0.0,
        context_window: int | None = None,
        no_eos: bool = False,
        scripted_policy: str = "",
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "tests.components.engine.fake_sglang"]
        self.command += ["--model-path", str(model_path), "--port", str(self.port)]
        self.command += ["--startup-delay-s", str(startup_delay_s)]
        if api_key:
            self.command += ["--api-key", api_key]
        if admin_api_key:
            self.command += ["--admin-api-key", admin_api_key]
        if context_window:
            self.command += ["--context-window", str(context_window)]
        if no_eos:
            self.command += ["--no-eos"]
        if scripted_policy:
            self.command += ["--scripted-policy", scripted_policy]
        self.process: subprocess.Popen | None = None

    def start(self) -> FakeSGLangProcess:
        """Start the process (returns at once; the server answers /health once it loaded the model)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, env=env)
        return self

    def wait_listening(self, timeout_s: float = 120.0) -> None:
        """Block until the port accepts connections."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process is not None and self.process.poll() is None, "fake SGLang process exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fake SGLang process on {self.url} did not start") from None
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-request, as a crashed SGLang would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def __enter__(self) -> FakeSGLangProcess:
        self.start()
        self.wait_listening()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class ScriptedSGLangEngine(ScriptedEngine):
    """A scripted policy as the stand-in's engine (which decodes with ``engine.tokenizer``)."""

    @property
    def tokenizer(self):
        return self._tokenizer


def scripted_engine(spec: str, model_path: str, context_window: int) -> ScriptedSGLangEngine:
    """A ``ScriptedSGLangEngine`` over the model's tokenizer, replying with ``MODULE:NAME`` (prompt → reply)."""
    import importlib

    from transformers import AutoTokenizer

    module, _, name = spec.partition(":")
    policy = getattr(importlib.import_module(module), name)
    return ScriptedSGLangEngine(
        AutoTokenizer.from_pretrained(model_path), policy, context_window=context_window
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.components.engine.fake_sglang --model-path DIR --port N``: serve until killed."""
    from components.engine.embedded import EmbeddedEngineConfig

    parser = argparse.ArgumentParser(description="A protocol-faithful stand-in for an SGLang server (CPU).")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--admin-api-key", default=None)
    parser.add_argument("--context-window", type=int, default=None)
    parser.add_argument("--no-eos", action="store_true", help="never stop on EOS (deterministic lengths)")
    parser.add_argument("--startup-delay-s", type=float, default=0.0, help="/health answers 503 this long")
    parser.add_argument(
        "--scripted-policy",
        default="",
        help="MODULE:NAME of a prompt → reply function: a ScriptedEngine samples its replies instead of the model",
    )
    args = parser.parse_args(argv)
    if args.scripted_policy:
        engine = scripted_engine(args.scripted_policy, args.model_path, args.context_window or 65536)
    else:
        options: dict[str, Any] = {"model_path": args.model_path}
        if args.context_window:
            options["context_window"] = args.context_window
        if args.no_eos:
            options["eos_token_ids"] = ()
        engine = EmbeddedEngine(EmbeddedEngineConfig(**options))
    state = FakeSGLangState(
        engine=engine,
        model_path=args.model_path,
        api_key=args.api_key,
        admin_api_key=args.admin_api_key,
        starting_until=time.monotonic() + args.startup_delay_s,
    )
    config = uvicorn.Config(
        build_app(state), host=args.host, port=args.port, log_level="warning", lifespan="off"
    )

    async def serve() -> None:
        state.paused = asyncio.Event()
        state.paused.set()
        await uvicorn.Server(config).serve()

    try:
        asyncio.run(serve())
    finally:
        engine.close()


if __name__ == "__main__":
    main()


class FakeSGLangRouter:
    """An sgl-model-gateway's worker registry only (``GET /workers``, ``GET /health``) in a thread: what Rein
    reads to find the workers behind a router URL."""

    def __init__(self, worker_urls: list[str]) -> None:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/workers")
        async def workers() -> dict[str, Any]:
            entries = [
                {
                    "id": f"worker-{i}",
                    "url": url,
                    "model_id": "policy",
                    "worker_type": "regular",
                    "is_healthy": True,
                }
                for i, url in enumerate(worker_urls)
            ]
            return {"workers": entries, "total": len(entries), "stats": {"regular_count": len(entries)}}

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._socket])), daemon=True
        )

    def __enter__(self) -> FakeSGLangRouter:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake SGLang router did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
