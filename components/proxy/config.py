"""The proxy's one typed config (``rein proxy``'s flags are its fields: ``components/proxy/cli.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from components.config import option, require, require_positive
from components.proxy.auth import SessionKeys, generate_admin_key
from components.sampling import SamplingDistribution
from components.tito import TemplateFormats, TemplateFormatsConfig, TitoConfig


@dataclass(kw_only=True, frozen=True)
class ProxyConfig:
    """How the inference proxy serves and records sessions."""

    host: str = option("127.0.0.1", "bind address of the standalone server (default: loopback only)")
    port: int = option(8000, "port (0: any free port)")
    api_key: str | None = option(
        None,
        "shared-key mode, no isolation between sessions: every route needs `Authorization: Bearer KEY` or "
        "`x-api-key: KEY`; use admin_key instead wherever agents run untrusted code",
    )
    admin_key: str | None = option(
        None,
        "isolated mode (components/proxy/auth.py), the default: this key, which no sandbox ever sees, guards "
        "session control; each session's model routes take only its own token (POST /sessions returns it as "
        "api_key). None (and no api_key): a fresh random key is generated, readable only from this config",
        repr=False,
    )
    insecure_open_control_plane: bool = option(
        False,
        "INSECURE: no keys at all; anyone who reaches the port can open, read, finalize or discard any session "
        "and use its model routes (only for a proxy nobody else can reach; never where agents run)",
    )
    keepalive_interval_s: float = option(
        5.0, "streaming: a keep-alive frame this often while the engine works", flag="keepalive-s"
    )
    default_max_tokens: int = option(
        1024,
        "completion budget when a request sets none (still clamped to the context window)",
        flag="max-tokens",
    )
    max_completion_tokens: int | None = option(
        None, "upper bound on any one completion, whatever the request asks (agents ask for 32k); None: none"
    )
    served_model_name: str = option(
        "rein-policy", "the model id /v1/models lists (requests may name any model)"
    )
    run_dir: Path | None = option(
        None, "finalized trajectories go to RUN_DIR/trajectories; None: not written"
    )
    # Every request is sampled with it, whatever temperature / top_p / top_k the agent sends (an agent's own
    # settings would make the rollout's distribution differ from the one the trainer assumes).
    sampling: SamplingDistribution = option(
        SamplingDistribution(),
        "the run's sampling distribution: every request is sampled with it, whatever the agent sends; each "
        "segment records the distribution it was sampled with either way",
    )
    agent_sampling: bool = option(
        False, "sample with each agent's own temperature/top_p/top_k instead (recorded either way)"
    )
    record_routed_experts: bool = option(
        False,
        "MoE policies (R3): ask the engine for the experts each token was routed to and record them per segment",
    )
    # README "Model families"; a run's: its proxy brick (--proxy-tool-format, --proxy-reasoning-format) itself.
    formats: TemplateFormats = option(
        TemplateFormatsConfig(),
        "the model family's tool-call and reasoning formats (None: detected from the tokenizer's chat template)",
    )
    # What one request may send (components/proxy/limits.py): refused in the protocol's error shape before the
    # body is held (413 for the body, 400 for the rest). Real agents send far less: Claude Code's first request
    # is ~76 KB with ~20 tools; a 200k-token conversation is ~1 MB of JSON.
    max_request_body_bytes: int = option(
        16 * 1024 * 1024, "largest request body (Content-Length checked first, chunked bodies counted)"
    )
    max_discarded_body_bytes: int = option(
        256 * 1024 * 1024,
        "the rest of a refused body is read and dropped (never held) up to this, so the client gets its 413",
    )
    max_header_bytes: int = option(
        64 * 1024, "all request headers together (the HTTP parser stops reading a head at twice this)"
    )
    max_messages: int = option(4096, "messages (Responses: input items) in one request")
    max_tools: int = option(256, "tool definitions in one request")
    max_tool_bytes: int = option(64 * 1024, "one tool definition, as JSON")
    max_stream_duration_s: float = option(
        1800.0,
        "a streamed turn still unanswered after this long is cancelled and ends with an in-stream error",
    )
    # True when ``__post_init__`` generated ``admin_key`` (no key given): the host must be handed it.
    admin_key_generated: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(bool(self.host), "host", "must be a host name or address")
        require(0 <= self.port <= 65535, "port", f"must be in [0, 65535], got {self.port!r}")
        require(self.api_key is None or bool(self.api_key), "api_key", "must be None or a non-empty string")
        if self.insecure_open_control_plane:
            require(
                self.api_key is None and self.admin_key is None,
                "insecure_open_control_plane",
                "must be False when api_key or admin_key is set (one auth mode)",
            )
        elif self.api_key is None and self.admin_key is None:  # secure by default: closed control plane
            object.__setattr__(self, "admin_key", generate_admin_key())
            object.__setattr__(self, "admin_key_generated", True)
        if self.admin_key is not None:
            require(self.api_key is None, "api_key", "must be None when admin_key is set (one auth mode)")
            SessionKeys(admin_key=self.admin_key)  # validates the key's strength, naming the field
        require_positive(self.keepalive_interval_s, "keepalive_interval_s")
        require_positive(self.default_max_tokens, "default_max_tokens")
        if self.max_completion_tokens is not None:
            require_positive(self.max_completion_tokens, "max_completion_tokens")
        require(bool(self.served_model_name), "served_model_name", "must be non-empty")
        for name in (
            "max_request_body_bytes",
            "max_discarded_body_bytes",
            "max_header_bytes",
            "max_messages",
            "max_tools",
            "max_tool_bytes",
        ):
            require(
                isinstance(getattr(self, name), int) and getattr(self, name) > 0,
                name,
                "must be a positive int",
            )
        require_positive(self.max_stream_duration_s, "max_stream_duration_s")
        if self.run_dir is not None:
            object.__setattr__(self, "run_dir", Path(self.run_dir))
        require(isinstance(self.sampling, SamplingDistribution), "sampling", "must be a SamplingDistribution")
        self.tito_config()  # validates the format names, listing the registered ones

    def tito_config(self) -> TitoConfig:
        """How each session's TITO core renders and parses: with the formats this config holds."""
        return TitoConfig(formats=self.formats)

    @property
    def session_keys(self) -> SessionKeys | None:
        """The credentials of isolated mode; None in shared-key mode or with ``insecure_open_control_plane``."""
        return None if self.admin_key is None else SessionKeys(admin_key=self.admin_key)
