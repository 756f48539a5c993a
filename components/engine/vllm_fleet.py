"""``InferenceEngine`` over one or several vLLM servers: the engine-neutral ``ServerFleet`` (``server_fleet.py``:
session affinity by token prefix, least-loaded placement by ``GET /load``, failover, one weight version on
every server, pause → reload → resume) over vLLM's adapter (``VLLMEngine``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config import require
from components.engine.server_fleet import (
    FleetRecoveryConfig,
    FleetRoutingConfig,
    ServerFleet,
    parse_server_urls,
)
from components.engine.vllm import VLLMEngine, VLLMEngineConfig

if TYPE_CHECKING:
    from components.engine.providers import VLLMBrickConfig


@dataclass(kw_only=True, frozen=True)
class VLLMFleetConfig:
    """Several vLLM servers serving one policy."""

    urls: tuple[str, ...]
    server: VLLMEngineConfig | None = (
        None  # options shared by every server; each one's base_url replaces this
    )
    routing: FleetRoutingConfig = FleetRoutingConfig()
    recovery: FleetRecoveryConfig = FleetRecoveryConfig()

    def __post_init__(self) -> None:
        require(len(self.urls) > 0, "urls", "needs at least one vLLM server URL")
        require(len(set(self.urls)) == len(self.urls), "urls", f"lists a server twice: {self.urls}")

    def server_config(self, url: str) -> VLLMEngineConfig:
        """The client config of the server at ``url``."""
        return replace(self.server, base_url=url) if self.server else VLLMEngineConfig(base_url=url)


def vllm_fleet_config(brick: VLLMBrickConfig, *, initial_weight_version: int) -> VLLMFleetConfig:
    """The fleet a run's ``vllm`` brick (``--vllm-*`` options) describes (``--vllm-url`` may list several)."""
    urls = parse_server_urls(brick.url, field="vllm.url")
    server = VLLMEngineConfig(
        base_url=urls[0],
        api_key=brick.api_key or None,
        startup_timeout_s=brick.startup_timeout_s,
        request_timeout_s=brick.request_timeout_s,
        context_window=brick.context_window or None,
        logprobs_mode=brick.logprobs_mode or None,
        pause_mode=brick.pause_mode,
        initial_weight_version=initial_weight_version,
    )
    recovery = FleetRecoveryConfig(server_return_timeout_s=brick.server_return_timeout_s)
    return VLLMFleetConfig(urls=urls, server=server, recovery=recovery)


class VLLMFleet(ServerFleet):
    """``InferenceEngine`` over ``config.urls``. Create with ``await VLLMFleet.connect(config)``."""

    server_kind = "vLLM"
    return_timeout_flag = "--vllm-server-return-timeout-s"

    def __init__(self, config: VLLMFleetConfig) -> None:
        template = config.server or VLLMEngineConfig(base_url=config.urls[0])
        super().__init__(
            [VLLMEngine(config.server_config(url)) for url in config.urls],
            routing=config.routing,
            initial_weight_version=template.initial_weight_version,
            context_window=template.context_window,
            recovery=config.recovery,
        )
        self.config = config

    @classmethod
    async def connect(cls, config: VLLMFleetConfig) -> VLLMFleet:  # type: ignore[override]
        """Wait for ``/health`` on every server, then read their context window, logprobs mode and version."""
        fleet = cls(config)
        await fleet.start()
        return fleet

    def write_weights(self, state_dict: Any, version: int) -> Path:
        return self.servers[0].write_weights(state_dict, version)
