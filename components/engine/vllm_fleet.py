"""``InferenceEngine`` over one or several vLLM servers: the engine-neutral ``ServerFleet`` (``server_fleet.py``:
router URLs expanded to their workers, session affinity by token prefix, least-loaded placement by ``GET /load``,
failover, one weight version on every server, pause → reload → resume) over vLLM's adapter (``VLLMEngine``).
New weights reach the servers from a saved folder (every server reloads it), or over NCCL
(``vllm_weight_transfer.py``, GPU clusters)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from components.config import require
from components.engine.server_fleet import (
    FleetRecoveryConfig,
    FleetRoutingConfig,
    StreamingServerFleet,
    expand_router_urls,
    parse_server_urls,
)
from components.engine.vllm import VLLMEngine, VLLMEngineConfig
from components.engine.vllm_weight_transfer import (
    VLLMNcclWeightSender,
    require_nccl_available,
)

if TYPE_CHECKING:
    import torch

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

    @property
    def weights_over_nccl(self) -> bool:
        """New weights broadcast over NCCL (``--vllm-weight-transfer nccl``), else reloaded from a saved folder."""
        return self.server is not None and self.server.settings.weight_transfer == "nccl"

    def server_config(self, url: str) -> VLLMEngineConfig:
        """The client config of the server at ``url``."""
        return replace(self.server, base_url=url) if self.server else VLLMEngineConfig.for_url(url)


def vllm_fleet_config(brick: VLLMBrickConfig, *, initial_weight_version: int) -> VLLMFleetConfig:
    """The fleet a run's ``vllm`` brick (``--vllm-*`` options) describes (``--vllm-url`` may list several)."""
    urls = parse_server_urls(brick.url, field="vllm.url")
    # API key, timeouts, context window, logprobs and pause modes
    server = VLLMEngineConfig(base_url=urls[0], settings=brick, initial_weight_version=initial_weight_version)
    return VLLMFleetConfig(urls=urls, server=server)


class VLLMFleet(StreamingServerFleet[VLLMEngine]):
    """``InferenceEngine`` over ``config.urls``. Create with ``await VLLMFleet.connect(config)``."""

    server_kind = "vLLM"
    return_timeout_flag = "--vllm-server-return-timeout-s"

    def __init__(self, config: VLLMFleetConfig) -> None:
        template = config.server or VLLMEngineConfig.for_url(config.urls[0])
        super().__init__(
            [VLLMEngine(config.server_config(url)) for url in config.urls],
            routing=config.routing,
            initial_weight_version=template.initial_weight_version,
            context_window=template.settings.context_window or None,
            server_return_timeout_s=template.settings.server_return_timeout_s,
            recovery=config.recovery,
        )
        self.config = config
        self._senders: dict[
            str, VLLMNcclWeightSender
        ] = {}  # server URL → its NCCL link (config.weights_over_nccl)

    def __getstate__(self) -> dict[str, object]:
        # The NCCL links belong to the process that opened them (the one that pushes the weights).
        state = super().__getstate__()
        state.update(_senders={})
        return state

    @classmethod
    async def connect(cls, config: VLLMFleetConfig) -> VLLMFleet:  # type: ignore[override]
        """Expand router URLs to their workers, wait for ``/health`` on every server, then read their context
        window, logprobs mode and version."""
        urls = await expand_router_urls(
            config.urls,
            lambda url: VLLMEngine(config.server_config(url)),
            server_kind="vLLM",
            field="vllm.url",
        )
        fleet = cls(replace(config, urls=urls))
        await fleet.start()
        return fleet

    async def aclose(self) -> None:
        """Close the NCCL links and every HTTP client."""
        senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            await asyncio.to_thread(sender.close)
        await super().aclose()

    def write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Path:
        return self.servers[0].write_weights(state_dict, version)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` as ``version`` on every live server, generation paused on all: broadcast over
        NCCL (``config.weights_over_nccl``), or written to one folder every server reloads."""
        if not self.config.weights_over_nccl:
            await super().update_weights(state_dict, version)
            return
        require_nccl_available()

        async def broadcast(live: list[int]) -> None:
            await self._on_each(
                live,
                lambda server: self.nccl_sender(server).push(state_dict, version),
                f"NCCL weight update to version {version}",
            )

        await self._paused_on_all(version, broadcast)

    def nccl_sender(self, server: VLLMEngine) -> VLLMNcclWeightSender:
        """The NCCL link to ``server`` (made on first use; ``config.weights_over_nccl`` must be set)."""
        if server.url not in self._senders:
            assert self.config.weights_over_nccl
            self._senders[server.url] = VLLMNcclWeightSender(server, server.config.settings)
        return self._senders[server.url]
