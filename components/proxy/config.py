"""The proxy's one typed config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from components.config import require, require_positive
from components.proxy.auth import SessionKeys, generate_admin_key
from components.proxy.providers import ProxyFormats, ProxyFormatsConfig, tito_config_of
from components.sampling import SamplingDistribution
from components.tito import TitoConfig


@dataclass(kw_only=True, frozen=True)
class ProxyConfig:
    """How the inference proxy serves and records sessions."""

    host: str = "127.0.0.1"  # bind address of the standalone server (loopback only by default)
    port: int = 8000  # 0: any free port
    # Shared-key mode (no isolation between sessions): when set, every route needs `Authorization: Bearer KEY`
    # or `x-api-key: KEY`. Use ``admin_key`` instead wherever agents run untrusted code.
    api_key: str | None = None
    # Isolated mode (components/proxy/auth.py), the default: control routes need this key, which no sandbox
    # ever sees; a session's model routes need that session's capability token (``SessionKeys.session_token``).
    # None (and no ``api_key``): a fresh random key is generated, readable only from this config on the host.
    admin_key: str | None = field(default=None, repr=False)
    # Opt-out of every check: anyone who reaches the port may open, read, finalize and discard any session and
    # use any session's model routes. Only for a proxy nobody else can reach; never where agents run.
    insecure_open_control_plane: bool = False
    keepalive_interval_s: float = 5.0  # streaming: a keep-alive frame this often while the engine works
    default_max_tokens: int = (
        1024  # completion budget when a request does not say (still clamped to the window)
    )
    # Upper bound on any one completion, whatever the request asks (agents ask for 32k); None: no bound.
    max_completion_tokens: int | None = None
    served_model_name: str = "rein-policy"  # the model id /v1/models lists (requests may name any model)
    run_dir: Path | None = None  # finalized trajectories go to RUN_DIR/trajectories; None: not written
    # The run's sampling distribution: every request is sampled with it, whatever temperature / top_p / top_k
    # the agent sends (an agent's own settings would make the rollout's distribution differ from the one
    # the trainer assumes). Each segment records the distribution it was sampled with either way.
    sampling: SamplingDistribution = field(default_factory=SamplingDistribution)
    agent_sampling: bool = False  # True: sample with the agent's own temperature / top_p / top_k instead
    # R3: ask the engine for the experts each position was routed to (MoE policies) and record them per segment
    record_routed_experts: bool = False
    # The model family's tool-call format (README "Model families": hermes, qwen3_coder, llama3_json, mistral,
    # deepseek_v3, glm45, kimi_k2, harmony) and reasoning format (think, harmony, none), None: detected from the
    # tokenizer's chat template; a run's: its proxy brick (--proxy-tool-format, --proxy-reasoning-format) itself.
    formats: ProxyFormats = ProxyFormatsConfig()
    # What one request may send (components/proxy/limits.py): refused in the protocol's error shape before the
    # body is held (413 for the body, 400 for the rest). Real agents send far less: Claude Code's first request
    # is ~76 KB with ~20 tools; a 200k-token conversation is ~1 MB of JSON.
    max_request_body_bytes: int = 16 * 1024 * 1024  # Content-Length checked first, chunked bodies counted
    # The rest of a refused body is read and dropped (never held) up to this, so the client gets its 413
    max_discarded_body_bytes: int = 256 * 1024 * 1024
    # All request headers together (ProxyServer's HTTP parser stops reading a head at twice this)
    max_header_bytes: int = 64 * 1024
    max_messages: int = 4096  # messages (Responses: input items) in one request
    max_tools: int = 256  # tool definitions in one request
    max_tool_bytes: int = 64 * 1024  # one tool definition, as JSON
    # A streamed turn still unanswered after this long is cancelled and ends with an in-stream error
    max_stream_duration_s: float = 1800.0

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
        """How each session's TITO core renders and parses (the formats this config names)."""
        return tito_config_of(self.formats)

    @property
    def session_keys(self) -> SessionKeys | None:
        """The credentials of isolated mode; None in shared-key mode or with ``insecure_open_control_plane``."""
        return None if self.admin_key is None else SessionKeys(admin_key=self.admin_key)
