"""Pushing the trainer's new policy to the inference engine after a step.

Two ways, one call (``WeightSync.push(trainer, version)``):
- ``"memory"`` (embedded engine): rank 0's gathered full state dict travels through Ray's object store to
  ``engine.update_weights(state_dict, version)`` - any ``InferenceEngine``; an engine in another Ray process
  (``ObjectStoreWeightsEngine``, e.g. ``RayEngineClient``) gets the object ref itself
  (``update_weights_from_ref``), so the weights go rank 0 → engine actor without a detour through the driver.
  The engine applies it between two decode steps (its own pause/resume) and stamps later tokens with
  ``version``.
- ``"disk"`` (SGLang): the state dict is written as an HF folder (atomically, like a checkpoint) and the
  engine is asked to reload from it with ``engine.update_weights_from_disk(path, version)`` (SGLang's
  ``/update_weights_from_disk``, which pauses, loads, flushes the cache and resumes on its side).
- ``"distributed"`` (SGLang over NCCL): ``engine.update_weights_from_trainer(trainer, version)`` - the
  trainer's rank 0 broadcasts the weights to the servers' weight-update group; nothing is gathered here.

LoRA trainers (``trainer.config.lora.rank > 0``) send only the adapter (``components.lora.LoraAdapter``, a few
MB instead of the whole model): ``"memory"`` → ``engine.update_adapter(adapter, version)`` (``AdapterEngine``:
the embedded engine overwrites the adapter tensors in place, the base is untouched); ``"disk"`` → the adapter
is written as a PEFT folder ``weights_dir/<run>-v<version>`` and ``engine.load_lora_adapter(path, version)``
(``LoraServingEngine``: SGLang's ``/load_lora_adapter`` under a new name per version).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from components.config import require, require_one_of
from components.protocols import (
    AdapterEngine,
    DiskReloadingEngine,
    InferenceEngine,
    LoraServingEngine,
    ObjectStoreWeightsEngine,
    TrainerBroadcastEngine,
)
from components.training.checkpoint import save_hf_model

if TYPE_CHECKING:
    import torch
    from ray import ObjectRef

    from components.lora import LoraAdapter, LoraSettings

WeightSyncMode = Literal["memory", "disk", "distributed"]


class WeightSourceConfig(Protocol):
    """The trainer settings a push reads."""

    @property
    def lora(self) -> LoraSettings: ...

    @property
    def model_path(self) -> Path: ...

    @property
    def run_dir(self) -> Path: ...


class WeightSource(Protocol):
    """What a push reads from the trainer (``components.training.trainer.Trainer``): named by its methods, so the
    engine bricks that build a ``WeightSync`` never import the trainer (nor, through it, themselves)."""

    @property
    def config(self) -> WeightSourceConfig: ...

    def full_state_dict_ref(self) -> ObjectRef[dict[str, torch.Tensor]]: ...

    def adapter(self) -> LoraAdapter: ...


@dataclass(kw_only=True, frozen=True)
class WeightSyncConfig:
    """How new weights reach the engine."""

    mode: WeightSyncMode = "memory"
    weights_dir: Path | None = None  # "disk": where HF folders of pushed versions are written
    keep_last: int = 2  # "disk": newest pushed folders kept

    def __post_init__(self) -> None:
        require_one_of(self.mode, "mode", ("memory", "disk", "distributed"))
        require(
            self.mode != "disk" or self.weights_dir is not None,
            "weights_dir",
            "is required when mode is 'disk'",
        )
        require(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}")


class WeightSync:
    """Pushes a trainer's current policy to one engine with a new version."""

    def __init__(
        self,
        config: WeightSyncConfig,
        engine: InferenceEngine | ObjectStoreWeightsEngine | DiskReloadingEngine,
    ) -> None:
        if config.mode == "memory" and not isinstance(engine, InferenceEngine | ObjectStoreWeightsEngine):
            raise ValueError(
                "engine: 'memory' weight sync needs an engine with async update_weights(state_dict, version)"
            )
        if config.mode == "distributed" and not isinstance(engine, TrainerBroadcastEngine):
            raise ValueError(
                "engine: 'distributed' weight sync needs an engine with update_weights_from_trainer(trainer, version)"
            )
        if config.mode == "disk" and not isinstance(engine, DiskReloadingEngine | LoraServingEngine):
            raise ValueError(
                "engine: 'disk' weight sync needs an engine with update_weights_from_disk(path, version) "
                "(or, for a LoRA trainer, load_lora_adapter(lora_path, version))"
            )
        self.config = config
        self.engine = engine

    async def push(self, trainer: WeightSource, version: int) -> dict[str, float]:
        """Gather the trainer's full state dict and load it into the engine as ``version``; returns timings."""
        started = time.perf_counter()
        if trainer.config.lora.enabled:
            return await self._push_adapter(trainer, version, started)
        if self.config.mode == "distributed":
            metrics = await self.engine.update_weights_from_trainer(trainer, version)
            return {**(metrics or {}), "weight_sync/total_s": time.perf_counter() - started}
        reference = await asyncio.to_thread(trainer.full_state_dict_ref)
        gathered_s = time.perf_counter() - started
        if self.config.mode == "memory" and isinstance(self.engine, ObjectStoreWeightsEngine):
            await self.engine.update_weights_from_ref(reference, version)
        elif self.config.mode == "memory":
            await self.engine.update_weights(await reference, version)
        else:
            state_dict = await reference
            path = await asyncio.to_thread(
                self._write_weights, state_dict, version, trainer.config.model_path
            )
            await self.engine.update_weights_from_disk(str(path), version)
        return {"weight_sync/gather_s": gathered_s, "weight_sync/total_s": time.perf_counter() - started}

    async def _push_adapter(self, trainer: WeightSource, version: int, started: float) -> dict[str, float]:
        from components.lora import write_adapter_version

        if self.config.mode == "memory" and not isinstance(self.engine, AdapterEngine):
            raise ValueError("engine: a LoRA trainer's 'memory' sync needs update_adapter(adapter, version)")
        if self.config.mode == "disk" and not isinstance(self.engine, LoraServingEngine):
            raise ValueError(
                "engine: a LoRA trainer's 'disk' sync needs load_lora_adapter(lora_path, version)"
            )
        if self.config.mode == "distributed":
            raise ValueError("mode: 'distributed' broadcasts full weights; a LoRA trainer syncs with 'disk'")
        adapter = await asyncio.to_thread(trainer.adapter)
        gathered_s = time.perf_counter() - started
        if self.config.mode == "memory":
            await self.engine.update_adapter(adapter, version)
        else:
            name = f"{Path(trainer.config.run_dir).name}-v{version}"
            path = await asyncio.to_thread(
                write_adapter_version,
                Path(self.config.weights_dir),
                adapter,
                name,
                keep_last=self.config.keep_last,
            )
            await self.engine.load_lora_adapter(str(path), version)
        return {
            "weight_sync/gather_s": gathered_s,
            "weight_sync/total_s": time.perf_counter() - started,
            "weight_sync/bytes": float(adapter.num_bytes),
        }

    def _write_weights(self, state_dict: Mapping[str, torch.Tensor], version: int, model_path: Path) -> Path:
        from transformers import AutoConfig

        weights_dir = Path(self.config.weights_dir)
        weights_dir.mkdir(parents=True, exist_ok=True)
        final = weights_dir / f"version-{version:08d}"
        temp = weights_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        temp.mkdir()
        try:
            save_hf_model(
                temp,
                state_dict,
                model_config=AutoConfig.from_pretrained(model_path),
                tokenizer_source=model_path,
            )
            if final.exists():
                shutil.rmtree(final)
            os.replace(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        for old in sorted(weights_dir.glob("version-*"))[: -self.config.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final
