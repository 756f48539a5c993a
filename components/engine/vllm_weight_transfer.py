"""New weights to vLLM servers over NCCL (GPU clusters), through vLLM's own weight-transfer API
(``--vllm-weight-transfer nccl``: ``VLLMFleet.update_weights`` broadcasts from the process that runs the loop).

Written against vLLM 0.32's ``vllm/distributed/weight_transfer/nccl_engine.py`` and ``clients.py``; it needs
CUDA and vLLM installed in that process (``pip install vllm``), so it cannot run on the CPU machines this project
is tested on: the tests prove that the option builds this path, that it is refused without CUDA, and that
``connect`` makes its calls into the installed vLLM with the arguments vLLM's real classes require (run in vLLM's
own interpreter, only the CUDA rendezvous replaced); the broadcast is unrun (the CPU path, a reload from a saved
folder, runs for real: ``VLLMEngine.load_weights_from_disk``). The round trip, as
vLLM's trainer-side engine drives it:

1. once per server: ``POST /init_weight_transfer_engine`` ``{"init_info": {master_address, master_port,
   rank_offset: 1, world_size, packed...}}`` while this process opens NCCL rank 0
   (``NCCLTrainerWeightTransferEngine.trainer_init``; ``world_size`` = 1 + the server's GPU workers; the server
   needs ``--weight-transfer-config '{"backend": "nccl"}'``);
2. per update (generation paused on every server by the fleet): ``/start_weight_update``, ``/update_weights``
   ``{"update_info": {names, dtype_names, shapes}}`` concurrently with the broadcast of every tensor,
   ``/finish_weight_update``; then ``/reset_prefix_cache`` and ``/update_weight_version`` (``VLLMEngine``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from components.errors import EngineError

if TYPE_CHECKING:  # vLLM lives in the process that pushes (or in .vllm-venv for the tests), not in every one
    import torch
    from vllm.distributed.weight_transfer.base import WeightSource
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    from components.engine.providers import VLLMBrickConfig
    from components.engine.vllm import VLLMEngine


def require_nccl_available() -> None:
    """``ValueError`` naming the option when this process cannot broadcast over NCCL (no CUDA, or no vLLM)."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            "weight_transfer: 'nccl' (--vllm-weight-transfer nccl) broadcasts the weights from this process's GPU "
            "to the vLLM servers, but CUDA is not available here (torch.cuda.is_available() is False): run the "
            "loop on a GPU node with vLLM installed (`pip install vllm`), or use --vllm-weight-transfer disk"
        )
    try:
        import vllm.distributed.weight_transfer.nccl_engine  # noqa: F401
    except ImportError as error:
        raise ValueError(
            "weight_transfer: 'nccl' (--vllm-weight-transfer nccl) needs vLLM installed in the process that runs "
            f"the loop (`pip install vllm`): {error}; or use --vllm-weight-transfer disk"
        ) from error


class StateDictSource:
    """vLLM's ``WeightSource`` over a full state dict (rank 0's gathered weights), tensors moved to the GPU."""

    def __new__(cls, state_dict: Mapping[str, torch.Tensor]) -> WeightSource:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        class _Source(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in state_dict.items()]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                return ((name, t.to("cuda", non_blocking=True)) for name, t in state_dict.items())

        return _Source()


class VLLMNcclWeightSender:
    """Rank 0's NCCL link to one vLLM server (opened on the first ``push``, then reused per version)."""

    def __init__(self, server: VLLMEngine, settings: VLLMBrickConfig) -> None:
        """``settings``: the run's ``--vllm-*`` options (``nccl_address``, ``nccl_server_world_size``)."""
        self.server = server
        self.master_address = settings.nccl_address or socket.gethostbyname(socket.gethostname())
        self.world_size = 1 + settings.nccl_server_world_size
        self._engine: NCCLTrainerWeightTransferEngine | None = None
        self._source: dict[str, torch.Tensor] = {}

    def connect(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        with socket.socket() as probe:
            probe.bind(("", 0))
            master_port = int(probe.getsockname()[1])
        self._source = dict(state_dict)  # the engine iterates this dict's current tensors on every push
        self._engine = NCCLTrainerWeightTransferEngine.trainer_init(
            NCCLTrainerInitInfo(
                master_address=self.master_address,
                master_port=master_port,
                world_size=self.world_size,
                rank=0,  # the only trainer-side rank: this process holds the gathered weights and sends them
            ),
            client=HTTPVLLMWeightSyncClient(self.server.url),
            source=StateDictSource(self._source),
        )

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Broadcast ``state_dict`` (same names and shapes every time) and label it ``version``; the caller has
        paused generation. A failed broadcast is an ``EngineError`` (the fleet takes the server out)."""
        try:
            if self._engine is None:
                await asyncio.to_thread(self.connect, state_dict)
            self._source.update(state_dict)
            await asyncio.to_thread(self._engine.send_weights)
        except EngineError:
            raise
        except Exception as error:
            self.close()
            raise EngineError(f"NCCL weight transfer to vLLM {self.server.url} failed: {error!r}") from error
        await self.server._request("POST", "/reset_prefix_cache")
        await self.server.update_weight_version(version)

    def close(self) -> None:
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()
