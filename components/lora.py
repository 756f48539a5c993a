"""LoRA adapters with the ``peft`` library: the settings a recipe gives, and the adapter record that travels from
the trainer to an engine after a step.

The trainer wraps its policy with ``peft.get_peft_model`` (only ``lora_A``/``lora_B`` are trainable), and an
adapter travels as ``LoraAdapter``: peft's own ``LoraConfig`` as a dict plus the tensors keyed exactly as
``PeftModel.save_pretrained`` writes them (``base_model.model.<module>.lora_A.weight``), so the same record is
a standard PEFT adapter folder on disk (``write_adapter_folder``: ``adapter_config.json`` +
``adapter_model.safetensors``) that plain ``peft`` / transformers / SGLang's ``/load_lora_adapter`` load.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from components.config import option, require, require_non_negative
from components.json_types import JsonObject, JsonValue

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftMixedModel, PeftModel

T = TypeVar("T")

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_MODEL_PREFIX = "base_model.model."  # PeftModel's key prefix in saved adapters


class LoraError(ValueError):
    """An adapter that does not fit the model it is applied to (unknown modules, wrong shapes)."""


@dataclass(kw_only=True, frozen=True)
class LoraSettings:
    """LoRA fine-tuning of the policy; ``rank`` 0 trains every weight (full fine-tuning)."""

    rank: int = option(0, "LoRA rank (peft adapter); 0 trains every weight", flag="lora-rank")
    alpha: float | None = option(None, "LoRA alpha; unset or 0 means 2 x rank (scale 2)", flag="lora-alpha")
    dropout: float = option(0.0, "LoRA dropout", flag="lora-dropout")
    target_modules: str | tuple[str, ...] = option(
        "all-linear",
        "LoRA target modules: all-linear (peft: every linear layer but the output head) or module names "
        "(q_proj,v_proj)",
        flag="lora-target",
    )

    def __post_init__(self) -> None:
        if self.alpha == 0:  # the command line's way of saying "unset"
            object.__setattr__(self, "alpha", None)
        if isinstance(self.target_modules, str) and self.target_modules != "all-linear":
            object.__setattr__(self, "target_modules", tuple(filter(None, self.target_modules.split(","))))
        require_non_negative(self.rank, "lora.rank")
        require(isinstance(self.rank, int), "lora.rank", f"must be an int, got {self.rank!r}")
        if self.alpha is not None:
            require(self.alpha > 0, "lora.alpha", f"must be > 0, got {self.alpha}")
        require(0.0 <= self.dropout < 1.0, "lora.dropout", f"must be in [0, 1), got {self.dropout}")
        if isinstance(self.target_modules, str):
            require(bool(self.target_modules), "lora.target_modules", "must not be empty")
        else:
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
            require(bool(self.target_modules), "lora.target_modules", "must name at least one module")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def peft_config(self, base_model_path: str | Path | None = None) -> LoraConfig:
        """peft's ``LoraConfig`` for these settings."""
        from peft import LoraConfig

        require(self.enabled, "lora.rank", "is 0: full fine-tuning has no adapter")
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha if self.alpha is not None else 2 * self.rank,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=str(base_model_path) if base_model_path is not None else None,
        )


@dataclass(kw_only=True, frozen=True)
class LoraAdapter:
    """One adapter version: peft's LoraConfig (as ``to_dict()``) and its tensors in saved-adapter key form."""

    config: Mapping[str, JsonValue]
    tensors: Mapping[str, torch.Tensor] = field(repr=False)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def peft_config(self) -> LoraConfig:
        from peft import LoraConfig

        values = {k: v for k, v in self.config.items() if k not in ("peft_type", "auto_mapping")}
        for key in ("target_modules", "exclude_modules"):  # to_dict() writes sets, which from_dict keeps
            value: object = values.get(key)
            if isinstance(value, set | frozenset | tuple):
                values[key] = sorted(value)
        return LoraConfig(**values)


def wrap_with_lora(
    model: torch.nn.Module, settings: LoraSettings, *, adapter_dir: Path | None = None, seed: int = 0
) -> PeftModel | PeftMixedModel:
    """``model`` as a trainable ``PeftModel``: a fresh adapter (seeded, so every FSDP rank starts from the same
    lora_A) or the adapter folder ``adapter_dir`` (resume). Only the adapter's parameters require grad."""
    import torch
    from peft import PeftModel, get_peft_model

    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    torch.manual_seed(seed)
    return get_peft_model(model, settings.peft_config(getattr(model, "name_or_path", None)))


def adapter_from_peft_model(
    model: PeftModel | PeftMixedModel, full_tensors: Mapping[str, torch.Tensor]
) -> LoraAdapter:
    """The adapter of a ``PeftModel`` from its gathered trainable tensors (named as ``named_parameters``)."""
    config = model.peft_config["default"]
    tensors = _plain_lora_tensors(config, full_tensors)
    if tensors is None:
        from peft import get_peft_model_state_dict

        tensors = get_peft_model_state_dict(model, state_dict=dict(full_tensors), save_embedding_layers=False)
    return LoraAdapter(config=_config_dict(config), tensors=tensors)


class AdapterGatherer:
    """Copies a ``PeftModel``'s adapter out after each step (the weight sync's gather). What does not change
    between steps is worked out once: the trainable parameters (a ``named_parameters`` walk over a peft model
    visits every module of the base, about 25,000 visits for SmolLM2-135M at rank 8, which cost more than the
    copy itself), their saved-adapter keys and the config as a dict; each ``gather`` only copies the tensors.
    Sharded (FSDP2) parameters are all-gathered: a collective every rank calls, in the same order."""

    def __init__(self, model: PeftModel | PeftMixedModel) -> None:
        self.model = model
        self.parameters = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        config = model.peft_config["default"]
        self.config = _config_dict(config)
        names = {name: name for name, _ in self.parameters}
        plain = _plain_lora_tensors(config, names)
        self.keys = list(plain) if plain is not None else None

    def gather(self) -> LoraAdapter:
        """The adapter's current tensors, copied to CPU, in saved-adapter key form."""
        from torch.distributed.tensor import DTensor

        full = {}
        for name, parameter in self.parameters:
            tensor = parameter.full_tensor() if isinstance(parameter, DTensor) else parameter
            full[name] = tensor.detach().to("cpu").clone()
        if self.keys is None:  # not a plain adapter: peft's own conversion
            return adapter_from_peft_model(self.model, full)
        return LoraAdapter(config=self.config, tensors=dict(zip(self.keys, full.values(), strict=True)))


def _plain_lora_tensors(config: LoraConfig, full_tensors: Mapping[str, T]) -> dict[str, T] | None:
    """peft's saved-adapter keys for a plain LoRA adapter (``lora_A``/``lora_B`` only, bias "none", no DoRA,
    no extra trained modules): the adapter name dropped, as ``get_peft_model_state_dict`` does, without its walk
    over the whole model's state dict (the sync's hot path). None: anything else, left to peft."""
    if config.bias != "none" or config.use_dora or config.modules_to_save:
        return None
    marker = ".default."
    tensors: dict[str, T] = {}
    for key, tensor in full_tensors.items():
        if marker not in key or not any(part in key for part in (".lora_A.default.", ".lora_B.default.")):
            return None
        tensors[key.replace(marker, ".")] = tensor
    return tensors


def _config_dict(config: LoraConfig) -> JsonObject:
    values = config.to_dict()
    for key, value in list(values.items()):
        if isinstance(value, set | frozenset):
            values[key] = sorted(value)
    return values


def write_adapter_folder(directory: Path, adapter: LoraAdapter) -> None:
    """Write ``adapter`` as a PEFT adapter folder into the existing ``directory``."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in adapter.tensors.items()}
    save_file(tensors, str(Path(directory) / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    (Path(directory) / ADAPTER_CONFIG_FILE).write_text(
        json.dumps(dict(adapter.config), indent=2, sort_keys=True)
    )


def write_adapter_version(adapters_dir: Path, adapter: LoraAdapter, name: str, *, keep_last: int) -> Path:
    """Write ``adapter`` atomically as ``adapters_dir/name`` (a PEFT folder) and keep the newest ``keep_last``."""
    adapters_dir = Path(adapters_dir)
    adapters_dir.mkdir(parents=True, exist_ok=True)
    final = adapters_dir / name
    temp = adapters_dir / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    temp.mkdir()
    try:
        write_adapter_folder(temp, adapter)
        if final.exists():
            shutil.rmtree(final)
        os.replace(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    folders = sorted(
        (p for p in adapters_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime_ns,
    )
    for old in folders[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_adapter_folder(directory: Path) -> LoraAdapter:
    """A PEFT adapter folder as a ``LoraAdapter``."""
    from safetensors.torch import load_file

    directory = Path(directory)
    if not (directory / ADAPTER_CONFIG_FILE).exists() or not (directory / ADAPTER_WEIGHTS_FILE).exists():
        raise LoraError(
            f"{directory} is not a PEFT adapter folder ({ADAPTER_CONFIG_FILE} + {ADAPTER_WEIGHTS_FILE})"
        )
    config = json.loads((directory / ADAPTER_CONFIG_FILE).read_text())
    return LoraAdapter(config=config, tensors=load_file(str(directory / ADAPTER_WEIGHTS_FILE)))


def injected_state_dict(adapter: LoraAdapter) -> dict[str, torch.Tensor]:
    """The adapter's tensors keyed for a plain transformers model with the adapter injected in place
    (``peft.inject_adapter_in_model``): peft's ``base_model.model.`` prefix dropped, as transformers'
    ``load_adapter`` does."""
    return {
        (k[len(PEFT_MODEL_PREFIX) :] if k.startswith(PEFT_MODEL_PREFIX) else k): v
        for k, v in adapter.tensors.items()
    }
