"""Crash-safe training checkpoints as HF folders under ``RUN_DIR/checkpoints/step-NNNNNNNN``.

A checkpoint holds ``model.safetensors`` + ``config.json`` + the tokenizer (loadable with
``from_pretrained``), the full optimizer state (``optimizer.pt``), the RNG state (``rng.pt``) and
``trainer_state.json`` (step, weight version, consumed shards: the data cursor). It is written into a hidden
temp folder, fsynced, and renamed into place; ``trainer_state.json`` is written last, so a folder without it
(or a leftover temp folder from a crash) is torn and ignored by ``latest_checkpoint``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import torch

from components.json_types import JsonValue

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "step-"
TEMP_PREFIX = ".tmp-"
STATE_FILE = "trainer_state.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


@dataclass(kw_only=True, frozen=True)
class TrainerState:
    """Where training stands: optimizer steps taken, the policy version they produced, the data consumed."""

    step: int = 0
    weight_version: int = 0
    consumed_shards: tuple[str, ...] = ()
    extra: Mapping[str, JsonValue] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "consumed_shards": list(self.consumed_shards)}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        data = json.loads(text)
        return cls(
            step=int(data["step"]),
            weight_version=int(data["weight_version"]),
            consumed_shards=tuple(data.get("consumed_shards", ())),
            extra=dict(data.get("extra", {})),
        )


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    path: Path
    state: TrainerState


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RngState(TypedDict):
    """This process's RNG states, as ``rng.pt`` holds them."""

    torch: torch.Tensor
    numpy: dict[str, object] | tuple[str, np.ndarray, int, int, float]  # np.random.get_state()
    python: tuple[object, ...]  # random.getstate()


def rng_state() -> RngState:
    """This process's torch / numpy / python RNG states."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_state(state: RngState) -> None:
    """Restore what ``rng_state`` captured."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_hf_model(
    directory: Path,
    model_state_dict: Mapping[str, torch.Tensor],
    *,
    model_config: PretrainedConfig,
    tokenizer_source: Path,
) -> None:
    """Write ``model.safetensors`` + ``config.json`` + tokenizer files into ``directory`` (an HF folder)."""
    from safetensors.torch import save_file

    tensors = {}
    for name, tensor in model_state_dict.items():
        if name == "lm_head.weight" and getattr(model_config, "tie_word_embeddings", False):
            continue  # tied to the input embeddings; from_pretrained re-ties it
        tensors[name] = tensor.detach().to("cpu").contiguous().clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    model_config.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        source = Path(tokenizer_source) / name
        if source.exists():
            shutil.copy2(source, directory / name)


def write_checkpoint(
    checkpoints_dir: Path,
    *,
    state: TrainerState,
    model_state_dict: Mapping[str, torch.Tensor] | None,
    optimizer_state_dict: Mapping[str, object] | None,
    model_config: PretrainedConfig,
    tokenizer_source: Path,
    keep_last: int = 0,
    write_model: Callable[[Path], None] | None = None,
) -> Path:
    """Write one complete checkpoint atomically; keep only the newest ``keep_last`` (0: keep all).
    ``write_model(folder)`` writes the policy instead of ``model_state_dict`` (LoRA: a PEFT adapter folder)."""
    checkpoints_dir = Path(checkpoints_dir)
    checkpoints_dir.mkdir(parents=True, exist_ok=True)
    final = checkpoints_dir / f"{CHECKPOINT_PREFIX}{state.step:08d}"
    temp = checkpoints_dir / f"{TEMP_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    try:
        if write_model is not None:
            write_model(temp)
        else:
            save_hf_model(
                temp, model_state_dict, model_config=model_config, tokenizer_source=tokenizer_source
            )
        if optimizer_state_dict is not None:
            torch.save(optimizer_state_dict, temp / "optimizer.pt")
        torch.save(rng_state(), temp / "rng.pt")
        (temp / STATE_FILE).write_text(state.to_json())
        _fsync_tree(temp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(temp, final)
        _fsync_tree(checkpoints_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if keep_last > 0:
        for old in complete_checkpoints(checkpoints_dir)[:-keep_last]:
            shutil.rmtree(old.path, ignore_errors=True)
    return final


def complete_checkpoints(checkpoints_dir: Path) -> list[Checkpoint]:
    """Every complete checkpoint, oldest first (torn or temp folders are skipped)."""
    checkpoints_dir = Path(checkpoints_dir)
    if not checkpoints_dir.exists():
        return []
    found = []
    for path in sorted(checkpoints_dir.glob(f"{CHECKPOINT_PREFIX}*")):
        has_policy = (path / "model.safetensors").exists() or (path / "adapter_model.safetensors").exists()
        if not (path / STATE_FILE).exists() or not has_policy:
            logger.warning("ignoring torn checkpoint %s", path)
            continue
        try:
            found.append(Checkpoint(path=path, state=TrainerState.from_json((path / STATE_FILE).read_text())))
        except (ValueError, KeyError) as error:
            logger.warning("ignoring checkpoint %s with unreadable state: %s", path, error)
    return sorted(found, key=lambda c: c.state.step)


def latest_checkpoint(checkpoints_dir: Path) -> Checkpoint | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def remove_temp_checkpoints(checkpoints_dir: Path) -> None:
    """Delete temp folders a crash left behind."""
    for path in Path(checkpoints_dir).glob(f"{TEMP_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)
