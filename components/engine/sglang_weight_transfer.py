"""Pushing weights to SGLang servers over a torch.distributed group (NCCL on GPUs, gloo on CPU).

SGLang's side (``sglang/srt/model_executor/model_runner.py``): ``/init_weights_update_group`` makes each of a
server's tensor-parallel ranks join a *custom* process group - rendezvous at ``tcp://master_address:
master_port``, the store prefixed with ``group_name`` - as rank ``rank_offset + tp_rank``; rank 0 is the
trainer. ``/update_weights_from_distributed`` then allocates one empty tensor per listed ``(name, dtype,
shape)`` and receives each with ``broadcast(src=0)``, in the listed order, before loading them.

This side: ``DistributedWeightSender`` is rank 0. It joins the same group with the same store layout (so a real
server and this process meet), and for each bucket of tensors (``bucket_bytes``) posts the bucket's names,
dtypes and shapes to every server while it broadcasts those tensors. The weight version is sent with the last
bucket only, so no server claims the new version before it holds all of it (generation is paused around the
whole push by the caller, ``SGLangFleet``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from components.config import require, require_one_of, require_positive

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from components.engine.sglang import SGLangEngine

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class DistributedWeightSyncConfig:
    """Where the weight-update group meets and how tensors are batched."""

    master_address: str = (
        ""  # the sender's address as the servers reach it; "": its Ray node IP (or loopback)
    )
    master_port: int = 0  # 0: pick a free port
    group_name: str = "rein_weight_update"
    backend: str = "nccl"  # "gloo" for CPU tensors (tests)
    bucket_bytes: int = 512 * 1024 * 1024  # tensors per /update_weights_from_distributed call
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        require_one_of(self.backend, "backend", ("nccl", "gloo"))
        require(self.group_name != "", "group_name", "must not be empty (SGLang refuses it)")
        require(0 <= self.master_port < 65536, "master_port", f"must be a port, got {self.master_port}")
        require_positive(self.bucket_bytes, "bucket_bytes")
        require_positive(self.timeout_s, "timeout_s")


def init_custom_process_group(
    *, backend: str, init_method: str, world_size: int, rank: int, group_name: str, timeout: timedelta
) -> ProcessGroup:
    """A process group beside the default one, built exactly as SGLang's ``init_custom_process_group``
    (``rendezvous`` → ``PrefixStore(group_name)`` → ``_new_process_group_helper``), so both sides agree on
    the store keys."""
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
    _world.pg_group_ranks[group] = {index: index for index in range(world_size)}
    return group


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's spelling of a dtype (``getattr(torch, name)`` on its side): ``bfloat16``, ``float32`` …"""
    return str(dtype).removeprefix("torch.")


def buckets_of(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of tensors of at most ``bucket_bytes`` each (a larger tensor travels alone)."""
    buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, tensor))
        size += nbytes
    return [bucket for bucket in buckets if bucket]


class DistributedWeightSender:
    """Rank 0 of the weight-update group with a set of SGLang servers. Use ``await connect(servers)``,
    ``await push(named_tensors, version)`` any number of times, then ``await close()``."""

    def __init__(self, config: DistributedWeightSyncConfig) -> None:
        self.config = config
        self._group: ProcessGroup | None = None
        self._servers: list[SGLangEngine] = []
        self.world_size = 0

    @property
    def connected(self) -> bool:
        return self._group is not None

    async def connect(self, servers: Sequence[SGLangEngine], ranks_per_server: Sequence[int]) -> None:
        """Ask every server to join (``/init_weights_update_group``) while this process joins as rank 0."""
        require(len(servers) == len(ranks_per_server), "ranks_per_server", "needs one entry per server")
        port = self.config.master_port or _free_port()
        address = self.config.master_address or _node_ip()
        self.world_size = 1 + sum(ranks_per_server)
        offsets = [1 + sum(ranks_per_server[:index]) for index in range(len(servers))]
        timeout = timedelta(seconds=self.config.timeout_s)
        joins = [
            asyncio.ensure_future(
                server.init_weights_update_group(
                    master_address=address,
                    master_port=port,
                    rank_offset=offset,
                    world_size=self.world_size,
                    group_name=self.config.group_name,
                    backend=self.config.backend,
                )
            )
            for server, offset in zip(servers, offsets, strict=True)
        ]
        try:
            self._group = await asyncio.to_thread(
                init_custom_process_group,
                backend=self.config.backend,
                init_method=f"tcp://{address}:{port}",
                world_size=self.world_size,
                rank=0,
                group_name=self.config.group_name,
                timeout=timeout,
            )
            await asyncio.gather(*joins)
        except BaseException:
            for join in joins:
                join.cancel()
            await self._destroy_local()
            raise
        self._servers = list(servers)
        logger.info(
            "weight-update group %s: %d servers, world size %d, backend %s",
            self.config.group_name,
            len(servers),
            self.world_size,
            self.config.backend,
        )

    async def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Broadcast every tensor to every server, bucket by bucket; returns counts and bytes."""
        require(self.connected, "connect", "call connect(servers) before push")
        buckets = buckets_of(named_tensors, self.config.bucket_bytes)
        num_bytes = 0
        for index, bucket in enumerate(buckets):
            last = index == len(buckets) - 1
            requests = [
                asyncio.ensure_future(
                    server.update_weights_from_distributed(
                        names=[name for name, _ in bucket],
                        dtypes=[dtype_name(tensor.dtype) for _, tensor in bucket],
                        shapes=[list(tensor.shape) for _, tensor in bucket],
                        group_name=self.config.group_name,
                        version=version if last else None,
                        flush_cache=last,
                    )
                )
                for server in self._servers
            ]
            try:
                await asyncio.to_thread(self._broadcast, [tensor for _, tensor in bucket])
            except BaseException:
                for request in requests:
                    request.cancel()
                raise
            await asyncio.gather(*requests)
            num_bytes += sum(tensor.numel() * tensor.element_size() for _, tensor in bucket)
        return {"weight_sync/buckets": float(len(buckets)), "weight_sync/bytes": float(num_bytes)}

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        if self.config.backend == "nccl":  # NCCL moves device memory: a CPU state dict goes to this GPU first
            tensors = [tensor.to("cuda", non_blocking=True) for tensor in tensors]
        handles = [
            dist.broadcast(tensor.contiguous(), src=0, group=self._group, async_op=True) for tensor in tensors
        ]
        for handle in handles:
            handle.wait()

    async def close(self) -> None:
        """``/destroy_weights_update_group`` on every server, then leave the group here."""
        servers, self._servers = self._servers, []
        results = await asyncio.gather(
            *(server.destroy_weights_update_group(self.config.group_name) for server in servers),
            return_exceptions=True,
        )
        for server, result in zip(servers, results, strict=True):
            if isinstance(result, BaseException):
                logger.warning("could not destroy the weight-update group on %s: %s", server.url, result)
        await self._destroy_local()

    async def _destroy_local(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            import torch.distributed as dist

            await asyncio.to_thread(dist.destroy_process_group, group)


def _node_ip() -> str:
    """This process's node IP in a Ray cluster (where the trainer's rank 0 runs), else loopback."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


class RankZeroWeightBroadcaster:
    """Lives in the trainer's rank-0 worker: keeps the weight-update group with the servers across steps
    (re-forming it when the set of servers changes) and pushes each new policy from that process, so the
    weights go rank 0 → servers without passing through the driver. Synchronous (the worker's command loop
    is); its own event loop carries the HTTP calls."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._sender: DistributedWeightSender | None = None
        # the servers' URLs and the sync config the group was formed for (None: no group)
        self._members: tuple[tuple[str, ...], DistributedWeightSyncConfig] | None = None

    def push(
        self,
        servers: Sequence[SGLangEngine],
        config: DistributedWeightSyncConfig,
        state_dict: Mapping[str, torch.Tensor],
        version: int,
    ) -> dict[str, float]:
        """Broadcast ``state_dict`` as ``version`` to ``servers`` (joining or re-forming the group first)."""
        members = (tuple(server.url for server in servers), config)
        if self._sender is not None and self._members != members:
            self.close_group()
        if self._sender is None:
            sender = DistributedWeightSender(config)

            async def connect() -> None:
                ranks = [await server.tensor_parallel_size() for server in servers]
                await sender.connect(servers, ranks)

            self._loop.run_until_complete(connect())
            self._sender, self._members = sender, members
        try:
            return self._loop.run_until_complete(self._sender.push(list(state_dict.items()), version))
        except BaseException:
            self.close_group()  # a half-done broadcast leaves the group unusable
            raise

    def close_group(self) -> None:
        """Leave the weight-update group (``/destroy_weights_update_group`` on the servers)."""
        sender, self._sender, self._members = self._sender, None, None
        if sender is not None:
            try:
                self._loop.run_until_complete(sender.close())
            except Exception as error:  # the servers may be gone; the local group is destroyed either way
                logger.warning("closing the weight-update group failed: %s", error)

    def close(self) -> None:
        self.close_group()
        self._loop.close()
