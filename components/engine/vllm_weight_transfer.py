"""New weights to a vLLM server over NCCL (GPU clusters), through vLLM's own weight-transfer API.

Written against vLLM 0.32's ``vllm/distributed/weight_transfer/nccl_engine.py`` and ``clients.py``; it needs
CUDA and vLLM installed in the trainer's process (``pip install vllm``), so it cannot run on the CPU machines
this project is tested on and is NOT exercised by any test here (the CPU path, a reload from a saved folder, is:
``VLLMEngine.load_weights_from_disk``). The round trip, as vLLM's trainer-side engine drives it:

1. once: ``POST /init_weight_transfer_engine`` ``{"init_info": {master_address, master_port, rank_offset: 1,
   world_size, packed...}}`` while the trainer opens NCCL rank 0 (``NCCLTrainerWeightTransferEngine.trainer_init``;
   ``world_size`` = 1 + the server's tensor-parallel ranks; the server needs ``--weight-transfer-config
   '{"backend": "nccl"}'``);
2. per update: ``POST /pause?mode=wait``, ``/start_weight_update``, ``/update_weights`` ``{"update_info":
   {names, dtype_names, shapes}}`` concurrently with the broadcast of every tensor, ``/finish_weight_update``;
   then ``POST /update_weight_version`` and ``/resume`` (``VLLMEngine``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from components.engine.vllm import VLLMEngine


class StateDictSource:
    """vLLM's ``WeightSource`` over a full state dict (rank 0's gathered weights)."""

    def __new__(cls, state_dict: Mapping[str, torch.Tensor]) -> Any:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        class _Source(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in state_dict.items()]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                return iter(state_dict.items())

        return _Source()


class VLLMNcclWeightSender:
    """Trainer rank 0's NCCL link to one vLLM server (``connect`` once, then ``push`` per version)."""

    def __init__(
        self, server: VLLMEngine, *, master_address: str, master_port: int, server_world_size: int
    ) -> None:
        self.server = server
        self.master_address, self.master_port = master_address, master_port
        self.world_size = 1 + server_world_size
        self._engine: Any = None
        self._source: dict[str, Any] = {}

    def connect(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        self._source = dict(state_dict)  # the engine iterates this dict's current tensors on every push
        self._engine = NCCLTrainerWeightTransferEngine.trainer_init(
            NCCLTrainerInitInfo(
                master_address=self.master_address, master_port=self.master_port, world_size=self.world_size
            ),
            client=HTTPVLLMWeightSyncClient(self.server.url),
            source=StateDictSource(self._source),
        )

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Paused: broadcast ``state_dict`` (same names and shapes as at ``connect``), label it ``version``."""
        import asyncio

        if self._engine is None:
            await asyncio.to_thread(self.connect, state_dict)
        self._source.update(state_dict)
        await self.server.pause_generation()
        try:
            await asyncio.to_thread(self._engine.send_weights)
            await self.server._request("POST", "/reset_prefix_cache")
            await self.server.update_weight_version(version)
        finally:
            await self.server.continue_generation()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
