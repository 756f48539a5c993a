"""``rein proxy``: the inference proxy standalone (uvicorn + the embedded engine or SGLang / vLLM servers), for
debugging and local use.

    rein proxy --model tiny --port 8000 --run-dir runs/debug --admin-key-file runs/admin.key
    rein proxy --engine sglang --sglang-url http://GPU:30000 --model M   # M: the served model's tokenizer
    rein proxy --engine vllm --vllm-url http://GPU:8000 --model M       # one or several vLLM servers
    rein proxy --model tiny --temperature 0.7 --top-p 0.95 --top-k 50    # the run's sampling distribution
    rein proxy --config proxy.yaml --port 0                              # fields from a file; flags win
    curl -H "Authorization: Bearer $(cat runs/admin.key)" -X POST http://127.0.0.1:8000/sessions
        # → {"session_id": ..., "base_url": ".../s/ID", "api_key": TOKEN}
    ANTHROPIC_BASE_URL=http://127.0.0.1:8000/s/ID ANTHROPIC_API_KEY=TOKEN claude -p "hi"

Its flags are the fields of one config tree, ``StandaloneProxyConfig`` (the proxy's ``ProxyConfig``, the model,
the engine brick, the admin key file), parsed as the recipes' are: ``--config FILE`` (YAML or JSON, nested like
the tree: ``engine: {kind: sglang, url: ...}``, ``sampling: {temperature: 0.7}``), flags override it.

The control plane is closed by default: without ``--admin-key`` (default: $REIN_PROXY_ADMIN_KEY) a random admin
key is generated and given to the host only, written to ``--admin-key-file`` (mode 0600) or else printed once to
stderr. Each session's model routes take only that session's token. ``--insecure-open-control-plane`` opens
every route to anyone who can reach the port. Finalize a session with ``POST /s/ID/finalize`` (admin key) to
write its trajectory to ``RUN_DIR/trajectories``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from components.config import option, require, slot
from components.engine.providers import EmbeddedEngineBrickConfig, EngineBrickConfig, StandaloneEngine
from components.errors import EngineError
from components.proxy.config import ProxyConfig
from components.recipe_config import parse_config
from components.registry import ENGINES

ADMIN_KEY_ENV = "REIN_PROXY_ADMIN_KEY"  # the admin key's default (a flag or --config FILE value overrides it)


@dataclass(kw_only=True, frozen=True)
class StandaloneProxyConfig(ProxyConfig):
    """``rein proxy``: the proxy's own fields (``ProxyConfig``: host, port, keys, sampling, formats, limits), the
    policy, the engine brick that generates, and where the host gets the admin key."""

    model: str = option("default", "'default' (the set-up policy), 'tiny', or an HF folder (its tokenizer)")
    engine: EngineBrickConfig = slot(
        ENGINES,
        EmbeddedEngineBrickConfig(),
        "who generates: the embedded torch engine in this process, or SGLang / vLLM servers",
    )
    admin_key_file: Path | None = option(
        None, "write the admin key to this file (mode 0600) instead of printing a generated one to stderr"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            isinstance(self.engine, StandaloneEngine),
            "engine",
            f"kind {ENGINES.name_of(self.engine)!r} cannot serve `rein proxy` alone",
        )
        self.engine.check_sampling(self.sampling)  # e.g. SGLang's logprobs ignore top-p / top-k
        if self.admin_key_file is not None:
            object.__setattr__(self, "admin_key_file", Path(self.admin_key_file))


def parse_proxy_config(argv: list[str]) -> StandaloneProxyConfig:
    """``rein proxy``'s arguments as its config tree (``SystemExit`` 2 on a bad flag or value, naming the field;
    0 after ``--help``); ``$REIN_PROXY_ADMIN_KEY`` stands for ``--admin-key`` given first."""
    environment_key = os.environ.get(ADMIN_KEY_ENV) or None
    return parse_config(
        StandaloneProxyConfig,
        [*(("--admin-key", environment_key) if environment_key else ()), *argv],
        description=__doc__ or "",
        prog="rein proxy",
    )


async def _serve(config: StandaloneProxyConfig) -> None:
    from components.models.registry import resolve_model
    from components.proxy.server import ProxyServer
    from components.proxy.sessions import LocalSessionRegistry

    model_path = resolve_model(config.model)
    assert isinstance(config.engine, StandaloneEngine)  # StandaloneProxyConfig checked it
    engine, tokenizer = await config.engine.start_standalone(
        model_path=model_path, sampling=config.sampling, record_routed_experts=config.record_routed_experts
    )
    try:
        server = ProxyServer(LocalSessionRegistry(engine, tokenizer, config), config)
        url = await server.start()
        auth = "" if config.session_keys is None else '-H "Authorization: Bearer ADMIN_KEY" '
        print(
            f"rein proxy: {config.engine.standalone_label(model_path)} at {url} "
            f"(context window {engine.context_window})\n"
            f"  create a session: curl {auth}-X POST {url}/sessions  → base_url {url}/s/SESSION_ID\n"
            f"  trajectories: {config.run_dir / 'trajectories' if config.run_dir else 'not written (no --run-dir)'}",
            flush=True,
        )
        await server.wait_closed()  # until Ctrl-C / SIGTERM
    finally:
        await engine.aclose()


def _hand_admin_key_to_host(config: StandaloneProxyConfig) -> None:
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
    if config.admin_key_file is not None:
        try:
            write_private_file(config.admin_key_file, config.admin_key)
        except OSError as error:
            raise ValueError(f"--admin-key-file {config.admin_key_file}: cannot write it ({error})") from None
        print(
            f"rein proxy: admin key written to {config.admin_key_file} (mode 0600)",
            file=sys.stderr,
            flush=True,
        )
    elif config.admin_key_generated:
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
    """Parse ``rein proxy`` arguments (``SystemExit`` 2 on a bad one) and serve until interrupted."""
    config = parse_proxy_config(list(sys.argv[1:] if argv is None else argv))
    try:
        _hand_admin_key_to_host(config)
        asyncio.run(_serve(config))
    except (ValueError, FileNotFoundError) as error:
        print(f"rein proxy: {error}", file=sys.stderr)
        return 2
    except EngineError as error:  # e.g. an SGLang server that never became healthy
        print(f"rein proxy: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
