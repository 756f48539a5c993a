"""``InferenceEngine`` over one or several SGLang servers: the engine-neutral ``StreamingServerFleet``
(``server_fleet.py``: session affinity, least-loaded placement, failover, one weight version on every server,
live streams)
over SGLang's adapter (``SGLangEngine``; router URLs expanded to their workers), plus what only SGLang offers here:

- *Load* is ``/get_load`` (``num_reqs`` per data-parallel rank), so every proxy shard's requests count.
- *Weight updates* from disk (``/update_weights_from_disk`` from one folder, generation paused with
  ``/pause_generation`` on every server), or one broadcast over the ``/init_weights_update_group`` group
  (``sglang_weight_transfer.py``); releasing GPU memory for a colocated trainer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from components.config import require, require_positive
from components.engine.server_fleet import (
    FailoverEvent,
    FleetRecoveryConfig,
    FleetRoutingConfig,
    StreamingServerFleet,
)
from components.engine.server_fleet import expand_router_urls as expand_fleet_router_urls
from components.engine.server_fleet import parse_server_urls as _parse_server_urls
from components.engine.sglang import (
    SGLangEngine,
    SGLangEngineConfig,
    experts_per_token,
)
from components.engine.sglang_weight_transfer import DistributedWeightSender, DistributedWeightSyncConfig
from components.errors import EngineError

if TYPE_CHECKING:
    import torch

    from components.engine.providers import SGLangBrickConfig
    from components.protocols import WeightBroadcaster

logger = logging.getLogger(__name__)


def parse_server_urls(text: str, *, field: str = "sglang_url") -> tuple[str, ...]:
    """``"http://a:30000,http://b:30000"`` → both URLs; a bad list fails naming ``field``."""
    return _parse_server_urls(text, field=field)


@dataclass(kw_only=True, frozen=True)
class SGLangFleetConfig:
    """Several SGLang servers serving one policy."""

    urls: tuple[str, ...]
    # Options shared by every server (API keys, timeouts, weight_sync_dir ...); each server's base_url
    # replaces this one's. None: defaults.
    server: SGLangEngineConfig | None = None
    # NCCL (gloo on CPU) weight sync through /update_weights_from_distributed; None: through disk
    # (server.weight_sync_dir, which every server must be able to read).
    distributed: DistributedWeightSyncConfig | None = None
    affinity_entries: int = 65536  # remembered sequences (one digest + length each)
    anchor_tokens: int = 64  # prompt prefix under which candidate sequence lengths are filed
    # New sessions go where the servers report the fewest requests (/get_load, one call per server and new
    # session; it counts every proxy shard's requests). False: this process's own requests in flight only.
    placement_by_server_load: bool = True
    recovery: FleetRecoveryConfig = FleetRecoveryConfig()  # how often to ask after a server that went down

    def __post_init__(self) -> None:
        require(len(self.urls) > 0, "urls", "needs at least one SGLang server URL")
        require(len(set(self.urls)) == len(self.urls), "urls", f"lists a server twice: {self.urls}")
        require_positive(self.affinity_entries, "affinity_entries")
        require_positive(self.anchor_tokens, "anchor_tokens")

    @property
    def routing(self) -> FleetRoutingConfig:
        return FleetRoutingConfig(
            affinity_entries=self.affinity_entries,
            anchor_tokens=self.anchor_tokens,
            placement_by_server_load=self.placement_by_server_load,
        )

    def server_config(self, url: str) -> SGLangEngineConfig:
        """The client config of the server at ``url``."""
        return replace(self.server, base_url=url) if self.server else SGLangEngineConfig.for_url(url)


def sglang_fleet_config(
    sglang: SGLangBrickConfig, *, model_path: Path, record_routed_experts: bool, initial_weight_version: int
) -> SGLangFleetConfig:
    """The fleet a run's ``--engine sglang`` brick (``--sglang-*`` options) describes (``--sglang-url`` may list
    several servers); ``model_path``: the policy the servers serve (its experts per token for R3)."""
    urls = parse_server_urls(sglang.url, field="engine.url")
    experts = experts_per_token(model_path) if record_routed_experts else None
    server = SGLangEngineConfig(
        base_url=urls[0],
        settings=sglang,  # API keys, timeouts, context window
        initial_weight_version=initial_weight_version,
        routed_experts_top_k=experts,  # R3: SGLang's routed experts are a flat id array, decoded with it
    )
    return SGLangFleetConfig(urls=urls, server=server, distributed=sglang.distributed_weight_sync)


async def expand_router_urls(config: SGLangFleetConfig) -> SGLangFleetConfig:
    """``config`` with every SGLang router URL replaced by the workers it lists (``server_fleet``'s)."""
    urls = await expand_fleet_router_urls(
        config.urls,
        lambda url: SGLangEngine(config.server_config(url)),
        server_kind="SGLang",
        field="sglang_url",
    )
    return replace(config, urls=urls)


class SGLangFleet(StreamingServerFleet[SGLangEngine]):
    """``InferenceEngine`` over ``config.urls``. Create with ``await SGLangFleet.connect(config)``."""

    server_kind = "SGLang"
    return_timeout_flag = "--sglang-server-return-timeout-s"

    def __init__(self, config: SGLangFleetConfig) -> None:
        template = config.server or SGLangEngineConfig.for_url(config.urls[0])
        super().__init__(
            [SGLangEngine(config.server_config(url)) for url in config.urls],
            routing=config.routing,
            initial_weight_version=template.initial_weight_version,
            context_window=template.settings.context_window or None,
            server_return_timeout_s=template.settings.server_return_timeout_s,
            recovery=config.recovery,
        )
        self.config = config
        self._sender: DistributedWeightSender | None = None
        self._sender_members: tuple[int, ...] = ()

    def __getstate__(self) -> dict[str, object]:
        # The weight-update group belongs to the process that made it.
        state = super().__getstate__()
        state.update(_sender=None, _sender_members=())
        return state

    @classmethod
    async def connect(cls, config: SGLangFleetConfig) -> SGLangFleet:  # type: ignore[override]
        """Expand router URLs to their workers, wait for ``/health`` on every server, then read the context
        window and the weight version."""
        fleet = cls(await expand_router_urls(config))
        await fleet.start()
        return fleet

    async def aclose(self) -> None:
        """Leave the weight-update group and close every HTTP client."""
        if self._sender is not None:
            sender, self._sender = self._sender, None
            await sender.close()
        await super().aclose()

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``state_dict`` as ``version`` on every live server: broadcast over the weight-update group
        (``config.distributed``), or one folder under ``weight_sync_dir`` read by all."""
        if self.config.distributed is not None:
            await self._paused_on_all(version, lambda live: self._push_distributed(live, state_dict, version))
            return
        await super().update_weights(state_dict, version)

    def write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Path:
        if self.servers[0].config.weight_sync_dir is None:
            raise ValueError(
                "weight_sync_dir: SGLang weight updates need a directory every server can read "
                "(or a distributed weight-sync config)"
            )
        return self.servers[0]._write_weights(state_dict, int(version))

    async def update_weights_from_trainer(self, trainer: WeightBroadcaster, version: int) -> dict[str, float]:
        """Generation paused on every live server, the trainer's rank 0 broadcasts its current policy to them
        over the weight-update group (``config.distributed``; ``Trainer.broadcast_weights``), generation
        continues. The weights never pass through this process."""
        require(self.config.distributed is not None, "distributed", "set a DistributedWeightSyncConfig")
        metrics: dict[str, float] = {}

        async def load(live: list[int]) -> None:
            servers = [self.servers[index] for index in live]
            try:
                metrics.update(
                    await asyncio.to_thread(
                        trainer.broadcast_weights, servers, self.config.distributed, version
                    )
                )
            except Exception as error:  # a half-done broadcast: none of these servers can be trusted
                for index in live:
                    self._take_out(index, f"weight broadcast of version {version} failed: {error}")
                raise EngineError(f"weight broadcast of version {version} failed: {error}") from error
            for server in servers:
                server._weight_version = int(version)

        await self._paused_on_all(version, load)
        return metrics

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Free the GPU memory of every live server (colocated trainer); resume before generating again."""
        await self._on_each(
            self._live(), lambda server: server.release_memory_occupation(tags), "memory release"
        )

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Take the GPU memory back on every live server."""
        await self._on_each(
            self._live(), lambda server: server.resume_memory_occupation(tags), "memory resume"
        )

    async def _push_distributed(
        self, live: list[int], state_dict: Mapping[str, torch.Tensor], version: int
    ) -> None:
        members = tuple(live)
        if self._sender is not None and self._sender_members != members:  # a server left: regroup
            sender, self._sender = self._sender, None
            await sender.close()
        if self._sender is None:
            sender = DistributedWeightSender(self.config.distributed)  # type: ignore[arg-type]
            servers = [self.servers[index] for index in members]
            ranks = [await server.tensor_parallel_size() for server in servers]
            await sender.connect(servers, ranks)
            self._sender, self._sender_members = sender, members
        try:
            await self._sender.push(list(state_dict.items()), version)
        except BaseException as error:
            # A failed broadcast leaves the servers partially updated: none of them can be trusted.
            for index in members:
                self._take_out(index, f"distributed weight update to version {version} failed: {error}")
            sender, self._sender = self._sender, None
            await sender.close()
            raise EngineError(f"distributed weight update to version {version} failed: {error}") from error


__all__ = [
    "FailoverEvent",
    "SGLangFleet",
    "SGLangFleetConfig",
    "expand_router_urls",
    "parse_server_urls",
    "sglang_fleet_config",
]
