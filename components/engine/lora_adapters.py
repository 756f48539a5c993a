"""LoRA adapters on the embedded engine's model, applied in place over the unchanged base weights.

``peft.inject_adapter_in_model`` wraps the targeted linear layers of the engine's own transformers model (the
object the scheduler already holds), and a new adapter version only overwrites the ``lora_A``/``lora_B``
tensors (copied in place into the injected ``lora_A``/``lora_B`` parameters, found once per adapter name): the
base is never reloaded or copied, and no state dict of the whole model is built per update. Several named adapters can
live side by side; a batch row picks its adapter through peft's mixed-batch forward (``adapter_names``, one
name per row; ``BASE_ADAPTER`` = the base model alone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from components.engine.policy_view import StreamingMultiPolicyEngine, StreamingPolicyView
from components.json_types import JsonObject, JsonValue
from components.lora import LoraAdapter, LoraError, injected_state_dict

if TYPE_CHECKING:
    import torch

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch
DEFAULT_ADAPTER = "default"


class EngineAdapters:
    """The named LoRA adapters injected into one model (used only on the scheduler thread)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._configs: dict[str, JsonObject] = {}
        self.versions: dict[str, int] = {}
        # adapter name → its parameters keyed as the adapter's tensors are (injected form, name dropped)
        self._parameters: dict[str, dict[str, torch.nn.Parameter]] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._configs)

    def apply(self, adapter: LoraAdapter, *, name: str, version: int) -> None:
        """Inject ``name`` on first use, then load ``adapter``'s tensors into it (base weights untouched)."""
        from peft import inject_adapter_in_model

        if not name or name == BASE_ADAPTER:
            raise LoraError(f"adapter name: {name!r} is reserved")
        settings = _structure(adapter.config)
        if name not in self._configs:
            inject_adapter_in_model(adapter.peft_config(), self.model, adapter_name=name)
            self.model.requires_grad_(False)
            self._configs[name] = settings
            self._parameters[name] = {
                key.replace(f".{name}.", "."): parameter
                for key, parameter in self.model.named_parameters()
                if f".{name}." in key and "lora_" in key
            }
            self._activate_all()
        elif self._configs[name] != settings:
            raise LoraError(
                f"adapter {name!r}: its structure changed ({self._configs[name]} -> {settings}); "
                "load it under a new name"
            )
        tensors = injected_state_dict(adapter)
        parameters = self._parameters[name]
        unexpected = sorted(set(tensors) - set(parameters))
        if unexpected:
            raise LoraError(
                f"adapter {name!r}: tensors for modules the model does not have: {unexpected[:3]}"
            )
        missing = sorted(set(parameters) - set(tensors))
        if missing:
            raise LoraError(f"adapter {name!r}: missing tensors {missing[:3]}")
        shapes = [k for k, t in tensors.items() if tuple(t.shape) != tuple(parameters[k].shape)]
        if shapes:
            raise LoraError(f"adapter {name!r}: shape mismatch for {shapes[:3]}")
        for key, tensor in tensors.items():  # checked above: no partial update
            parameters[key].data.copy_(tensor.detach())
        self.versions[name] = int(version)

    def _activate_all(self) -> None:
        """Only the "default" adapter is active for plain (unrouted) forwards: requests of no named policy get
        the engine-wide adapter, never a sum of several; named adapters are reached through ``routed``."""
        from peft.tuners.lora import LoraLayer

        active = [DEFAULT_ADAPTER] if DEFAULT_ADAPTER in self._configs else []
        for module in self.model.modules():
            if isinstance(module, LoraLayer):
                module.set_adapter(active, inference_mode=True)

    def row_name(self, adapter: str | None) -> str:
        """peft's per-row adapter name for a request of ``adapter`` (the base when it is not loaded yet: a
        fresh LoRA adapter is the identity, lora_B = 0)."""
        name = adapter if adapter is not None else DEFAULT_ADAPTER
        return name if name in self._configs else BASE_ADAPTER

    @contextlib.contextmanager
    def routed(self, adapter_names: Sequence[str] | None) -> Iterator[None]:
        """During the block, row i of every forward uses ``adapter_names[i]`` (peft's mixed-batch forward)."""
        if adapter_names is None or not self._configs:
            yield
            return
        from peft.tuners.lora import LoraLayer

        names = list(adapter_names)
        handles = []

        def pre_hook(
            _module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
        ) -> tuple[tuple[object, ...], dict[str, object]]:
            kwargs["adapter_names"] = names
            return args, kwargs

        for module in self.model.modules():
            if isinstance(module, LoraLayer):
                handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _structure(config: Mapping[str, JsonValue]) -> JsonObject:
    """What an adapter's tensors' shapes and placement depend on."""
    targets = config.get("target_modules")
    return {
        "r": config.get("r"),
        "target_modules": sorted(targets) if isinstance(targets, list | tuple | set) else targets,
        "lora_alpha": config.get("lora_alpha"),
    }


class AdapterHost(StreamingMultiPolicyEngine, Protocol):
    """A shared multi-LoRA engine a ``PolicyEngine`` views (``EmbeddedEngine``, ``RayEngineClient``): it takes
    each policy's adapter versions and scores under them."""

    async def update_adapter(self, adapter: LoraAdapter, version: int, *, name: str = ...) -> None: ...

    async def logprobs_of(
        self, input_ids: Sequence[int], start: int = 1, *, adapter: str | None = None
    ) -> tuple[float, ...]: ...


class PolicyEngine(StreamingPolicyView[AdapterHost]):
    """One policy's view of a shared multi-LoRA engine: an ``InferenceEngine`` + ``AdapterEngine`` whose
    requests run with the adapter ``name`` (batched with other policies' requests) and whose versions are that
    adapter's own. A proxy (and so every session it records) built over this view is bound to this policy;
    a ``WeightSync`` over it updates only this policy's adapter."""

    def __init__(self, engine: AdapterHost, name: str) -> None:
        if not name or name in (BASE_ADAPTER, DEFAULT_ADAPTER):
            raise LoraError(f"policy name: {name!r} is reserved")
        super().__init__(engine, name)

    async def update_adapter(self, adapter: LoraAdapter, version: int) -> None:
        await self.engine.update_adapter(adapter, version, name=self.name)

    async def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        raise LoraError(
            f"policy {self.name!r}: the base weights are shared by every policy; push this policy's adapter "
            "(a LoRA trainer's WeightSync calls update_adapter)"
        )

    async def logprobs_of(self, input_ids: Sequence[int], start: int = 1) -> tuple[float, ...]:
        return await self.engine.logprobs_of(input_ids, start, adapter=self.name)
