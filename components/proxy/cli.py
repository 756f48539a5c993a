"""``rein proxy``: the inference proxy standalone (uvicorn + the embedded engine or SGLang servers), for
debugging and local use.

    rein proxy --model tiny --port 8000 --run-dir runs/debug
    rein proxy --engine sglang --sglang-url http://GPU:30000 --model M   # M: the served model's tokenizer
    rein proxy --model tiny --temperature 0.7 --top-p 0.95 --top-k 50    # the run's sampling distribution
    curl -X POST http://127.0.0.1:8000/sessions      # → {"session_id": ..., "base_url": ".../s/ID"}
    ANTHROPIC_BASE_URL=http://127.0.0.1:8000/s/ID claude -p "hi"

Finalize a session with ``POST /s/ID/finalize`` to write its trajectory to ``RUN_DIR/trajectories``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from components.engine.sglang import require_untruncated_sampling
from components.errors import EngineError
from components.proxy.config import ProxyConfig
from components.sampling import SamplingDistribution


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rein proxy", description="Serve the policy behind OpenAI/Anthropic APIs."
    )
    parser.add_argument(
        "--model", default="default", help="'default' (set-up policy), 'tiny', or an HF folder"
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="finalized trajectories go to RUN_DIR/trajectories"
    )
    parser.add_argument(
        "--api-key", default=None, help="require this key (Authorization: Bearer / x-api-key)"
    )
    parser.add_argument(
        "--admin-key",
        default=os.environ.get("REIN_PROXY_ADMIN_KEY") or None,
        help="isolated mode: this key (default $REIN_PROXY_ADMIN_KEY) guards session control; each session's "
        "model routes take only its own token (POST /sessions returns it as api_key)",
    )
    parser.add_argument(
        "--keepalive-s", type=float, default=5.0, help="keep-alive frame interval while streaming"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=1024, help="completion budget when a request sets none"
    )
    parser.add_argument("--max-completion-tokens", type=int, default=None, help="cap on any one completion")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the embedded engine")
    parser.add_argument("--engine", choices=("embedded", "sglang"), default="embedded", help="who generates")
    parser.add_argument(
        "--sglang-url", default="", help="SGLang server URL(s), comma-separated (--engine sglang)"
    )
    parser.add_argument("--sglang-api-key", default=None, help="the servers' --api-key")
    parser.add_argument("--sglang-admin-api-key", default=None, help="the servers' --admin-api-key")
    parser.add_argument(
        "--sglang-startup-timeout-s", type=float, default=600.0, help="wait this long for every /health"
    )
    parser.add_argument(
        "--sglang-request-timeout-s", type=float, default=600.0, help="bound of one /generate call"
    )
    parser.add_argument(
        "--context-window", type=int, default=None, help="SGLang: tokens per sequence (default: /v1/models)"
    )
    # The run's sampling distribution (components/sampling.py): every request is sampled with it, whatever the
    # agent sends, and each segment records it, so the trainer recomputes logprobs under exactly it.
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass; 1: no truncation")
    parser.add_argument(
        "--top-k", type=int, default=0, help="keep the k most likely tokens; 0: no truncation"
    )
    parser.add_argument(
        "--agent-sampling",
        action="store_true",
        help="sample with each agent's own temperature/top_p/top_k instead (recorded either way)",
    )
    parser.add_argument(
        "--record-routed-experts",
        action="store_true",
        help="MoE policies: record the experts each token was routed to, for routing replay (R3)",
    )
    parser.add_argument(
        "--tool-format",
        default=None,
        help="the model family's tool-call format (hermes, qwen3_coder, llama3_json, mistral, deepseek_v3, "
        "glm45, kimi_k2, harmony; default: detected from the chat template)",
    )
    parser.add_argument(
        "--reasoning-format",
        default=None,
        help="how the model writes reasoning (think, harmony, none; default: detected from the chat template)",
    )
    return parser


async def _start_engine(args: argparse.Namespace, model_path: Path) -> tuple[Any, Any]:
    """The engine the arguments name and the tokenizer the proxy encodes with."""
    if args.engine == "embedded":
        from components.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig

        engine = EmbeddedEngine(EmbeddedEngineConfig(model_path=model_path, num_threads=args.threads))
        return engine, engine.tokenizer
    from transformers import AutoTokenizer

    from components.engine.sglang import SGLangEngineConfig, experts_per_token
    from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig, parse_server_urls

    urls = parse_server_urls(args.sglang_url)
    server = SGLangEngineConfig(
        base_url=urls[0],
        api_key=args.sglang_api_key,
        admin_api_key=args.sglang_admin_api_key,
        startup_timeout_s=args.sglang_startup_timeout_s,
        request_timeout_s=args.sglang_request_timeout_s,
        context_window=args.context_window,
        # SGLang sends routed experts as a flat id array: decoding it needs the experts per token.
        routed_experts_top_k=experts_per_token(model_path) if args.record_routed_experts else None,
    )
    engine = await SGLangFleet.connect(SGLangFleetConfig(urls=urls, server=server))
    return engine, AutoTokenizer.from_pretrained(model_path)


async def _serve(args: argparse.Namespace, config: ProxyConfig) -> None:
    from components.models.registry import resolve_model
    from components.proxy.server import ProxyServer
    from components.proxy.sessions import LocalSessionRegistry

    model_path = resolve_model(args.model)
    engine, tokenizer = await _start_engine(args, model_path)
    try:
        server = ProxyServer(LocalSessionRegistry(engine, tokenizer, config), config)
        url = await server.start()
        backend = f"SGLang {args.sglang_url}" if args.engine == "sglang" else str(model_path)
        print(
            f"rein proxy: {backend} at {url} (context window {engine.context_window})\n"
            f"  create a session: curl -X POST {url}/sessions  → base_url {url}/s/SESSION_ID\n"
            f"  trajectories: {config.run_dir / 'trajectories' if config.run_dir else 'not written (no --run-dir)'}",
            flush=True,
        )
        await server.wait_closed()  # until Ctrl-C / SIGTERM
    finally:
        await engine.aclose()


def main(argv: list[str] | None = None) -> int:
    """Parse ``rein proxy`` arguments and serve until interrupted."""
    args = _parser().parse_args(argv)
    try:
        config = ProxyConfig(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            admin_key=args.admin_key,
            keepalive_interval_s=args.keepalive_s,
            default_max_tokens=args.max_tokens,
            max_completion_tokens=args.max_completion_tokens,
            run_dir=args.run_dir,
            sampling=SamplingDistribution(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k),
            agent_sampling=args.agent_sampling,
            record_routed_experts=args.record_routed_experts,
            tool_format=args.tool_format,
            reasoning_format=args.reasoning_format,
        )
        if args.engine == "sglang":  # before any server is contacted
            require_untruncated_sampling(config.sampling)
        asyncio.run(_serve(args, config))
    except (ValueError, FileNotFoundError) as error:
        print(f"rein proxy: {error}", file=sys.stderr)
        return 2
    except EngineError as error:  # e.g. an SGLang server that never became healthy
        print(f"rein proxy: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
