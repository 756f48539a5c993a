"""A local stand-in for an SGLang server (which needs a GPU), following SGLang's own request/response shapes
(``sglang/srt/managers/io_struct.py``, ``sglang/srt/entrypoints/http_server.py``) over real HTTP.

Generation is real: an ``EmbeddedEngine`` over the tiny model samples the tokens, so logprobs, stop handling
and weight updates mean something. Knobs on ``FakeSGLangState`` inject the failures the client must handle
(dropped or null logprobs, transient 503s, a server without per-token version spans).
"""

from __future__ import annotations

import asyncio
import base64
import pickle
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from components.engine.embedded import EmbeddedEngine
from components.protocols import FinishReason, SamplingParams


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
    paused: asyncio.Event | None = None  # set = running
    tasks: dict[str, asyncio.Task] = field(default_factory=dict)

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


def build_app(state: FakeSGLangState) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def record_and_fail(request: Request, call_next):
        body = await request.body()
        state.requests.append((request.url.path, body.decode() if body else None))
        if state.fail_next > 0:
            state.fail_next -= 1
            return Response("Service Unavailable", status_code=503)
        return await call_next(request)

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
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
        if len(input_ids) >= state.engine.context_window:
            message = (
                f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                f"({state.engine.context_window} tokens)."
            )
            return JSONResponse({"object": "error", "message": message, "code": 400}, 400)
        await state.paused.wait()
        params = SamplingParams(
            max_tokens=int(sampling.get("max_new_tokens", 128)),
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            stop_strings=tuple(sampling.get("stop") or ()),
            stop_token_ids=tuple(sampling.get("stop_token_ids") or ()),
            seed=sampling.get("sampling_seed"),
            return_routed_experts=bool(body.get("return_routed_experts", False)),
        )
        task = asyncio.ensure_future(state.engine.generate(input_ids, params))
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
            if task is not None:
                task.cancel()
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


def _engine_version(version: Any, state: FakeSGLangState) -> int:
    return state.version_int() if version is None else int(version)


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


class FakeSGLangServer:
    """Runs the fake on 127.0.0.1 (a free port) in a background thread; ``url`` and ``state`` for the tests."""

    def __init__(self, engine: EmbeddedEngine, model_path: str | Path) -> None:
        self.state = FakeSGLangState(engine=engine, model_path=str(model_path))
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
