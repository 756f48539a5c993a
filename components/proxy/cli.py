"""``rein proxy``: the inference proxy standalone (uvicorn + the embedded engine or SGLang servers), for
debugging and local use.

    rein proxy --model tiny --port 8000 --run-dir runs/debug --admin-key-file runs/admin.key
    rein proxy --engine sglang --sglang-url http://GPU:30000 --model M   # M: the served model's tokenizer
    rein proxy --engine vllm --vllm-url http://GPU:8000 --model M       # one or several vLLM servers
    rein proxy --model tiny --temperature 0.7 --top-p 0.95 --top-k 50    # the run's sampling distribution
    curl -H "Authorization: Bearer $(cat runs/admin.key)" -X POST http://127.0.0.1:8000/sessions
        # → {"session_id": ..., "base_url": ".../s/ID", "api_key": TOKEN}
    ANTHROPIC_BASE_URL=http://127.0.0.1:8000/s/ID ANTHROPIC_API_KEY=TOKEN claude -p "hi"

The control plane is closed by default: without ``--admin-key`` a random admin key is generated and given to
the host only, written to ``--admin-key-file`` (mode 0600) or else printed once to stderr. Each session's model
routes take only that session's token. ``--insecure-open-control-plane`` opens every route to anyone who can
reach the port. Finalize a session with ``POST /s/ID/finalize`` (admin key) to write its trajectory to
``RUN_DIR/trajectories``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from components.engine.providers import StandaloneEngine
from components.errors import EngineError
from components.proxy.config import ProxyConfig
from components.proxy.providers import ProxyFormatsConfig
from components.registry import ENGINES
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
        help="this key (default $REIN_PROXY_ADMIN_KEY; none: a random one is generated) guards session control; "
        "each session's model routes take only its own token (POST /sessions returns it as api_key)",
    )
    parser.add_argument(
        "--admin-key-file",
        type=Path,
        default=None,
        help="write the admin key to this file (mode 0600) instead of printing a generated one to stderr",
    )
    parser.add_argument(
        "--insecure-open-control-plane",
        action="store_true",
        help="INSECURE: no keys at all; anyone who reaches the port can open, read, finalize or discard any "
        "session and use its model routes",
    )
    parser.add_argument(
        "--keepalive-s", type=float, default=5.0, help="keep-alive frame interval while streaming"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=1024, help="completion budget when a request sets none"
    )
    parser.add_argument("--max-completion-tokens", type=int, default=None, help="cap on any one completion")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the embedded engine")
    parser.add_argument(
        "--engine", choices=ENGINES.kinds(), default="embedded", help="who generates (an engine kind)"
    )
    parser.add_argument("--vllm-url", default="", help="vLLM server URL(s), comma-separated (--engine vllm)")
    parser.add_argument("--vllm-api-key", default=None, help="the vLLM servers' --api-key")
    parser.add_argument(
        "--vllm-startup-timeout-s", type=float, default=600.0, help="wait this long for every vLLM /health"
    )
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


def engine_brick(args: argparse.Namespace) -> StandaloneEngine:
    """The ``--engine`` kind's config (the engine registry), its fields from the flags of the same name: a
    field's own flag when this parser has it (``--vllm-url`` for ``url``), else its name (``--threads``,
    ``--context-window``); a flag left unset keeps the kind's default."""
    config_class = ENGINES.get(args.engine)
    values = {}
    for field in dataclasses.fields(config_class):
        flag = (field.metadata.get("flag") or field.name).replace("-", "_")
        value = getattr(args, flag if hasattr(args, flag) else field.name, None)
        if value is not None:
            values[field.name] = value
    brick = config_class(**values)
    if not isinstance(brick, StandaloneEngine):
        raise ValueError(f"--engine {args.engine}: this engine kind cannot serve `rein proxy` alone")
    return brick


async def _serve(args: argparse.Namespace, config: ProxyConfig) -> None:
    from components.models.registry import resolve_model
    from components.proxy.server import ProxyServer
    from components.proxy.sessions import LocalSessionRegistry

    model_path = resolve_model(args.model)
    engine, tokenizer = await engine_brick(args).start_standalone(
        model_path=model_path, sampling=config.sampling, record_routed_experts=args.record_routed_experts
    )
    try:
        server = ProxyServer(LocalSessionRegistry(engine, tokenizer, config), config)
        url = await server.start()
        backend = {"sglang": f"SGLang {args.sglang_url}", "vllm": f"vLLM {args.vllm_url}"}.get(
            args.engine, str(model_path)
        )
        auth = "" if config.session_keys is None else '-H "Authorization: Bearer ADMIN_KEY" '
        print(
            f"rein proxy: {backend} at {url} (context window {engine.context_window})\n"
            f"  create a session: curl {auth}-X POST {url}/sessions  → base_url {url}/s/SESSION_ID\n"
            f"  trajectories: {config.run_dir / 'trajectories' if config.run_dir else 'not written (no --run-dir)'}",
            flush=True,
        )
        await server.wait_closed()  # until Ctrl-C / SIGTERM
    finally:
        await engine.aclose()


def _hand_admin_key_to_host(config: ProxyConfig, args: argparse.Namespace) -> None:
    """Give the admin key to the host user only: into ``--admin-key-file`` (0600), or a generated one printed
    once to stderr (never to stdout, which logs collect; never into any sandbox)."""
    if config.insecure_open_control_plane:
        print(
            "rein proxy: WARNING --insecure-open-control-plane: anyone who can reach the port can open, read, "
            "finalize and discard any session",
            file=sys.stderr,
            flush=True,
        )
        return
    if config.admin_key is None:  # shared-key mode (--api-key)
        return
    if args.admin_key_file is not None:
        try:
            write_private_file(args.admin_key_file, config.admin_key)
        except OSError as error:
            raise ValueError(f"--admin-key-file {args.admin_key_file}: cannot write it ({error})") from None
        print(
            f"rein proxy: admin key written to {args.admin_key_file} (mode 0600)", file=sys.stderr, flush=True
        )
    elif args.admin_key is None:
        print(
            f"rein proxy: generated admin key (control routes): {config.admin_key}",
            file=sys.stderr,
            flush=True,
        )


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600, also when the file already existed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(
            descriptor, 0o600
        )  # before the key is written: an existing file keeps its old mode otherwise
        os.write(descriptor, text.encode() + b"\n")
    finally:
        os.close(descriptor)


def main(argv: list[str] | None = None) -> int:
    """Parse ``rein proxy`` arguments and serve until interrupted."""
    args = _parser().parse_args(argv)
    try:
        config = ProxyConfig(
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            admin_key=args.admin_key,
            insecure_open_control_plane=args.insecure_open_control_plane,
            keepalive_interval_s=args.keepalive_s,
            default_max_tokens=args.max_tokens,
            max_completion_tokens=args.max_completion_tokens,
            run_dir=args.run_dir,
            sampling=SamplingDistribution(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k),
            agent_sampling=args.agent_sampling,
            record_routed_experts=args.record_routed_experts,
            formats=ProxyFormatsConfig(tool_format=args.tool_format, reasoning_format=args.reasoning_format),
        )
        engine_brick(args)  # the engine's flags, checked before anything starts
        _hand_admin_key_to_host(config, args)
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
